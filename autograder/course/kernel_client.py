"""A Jupyter kernel client for unattended runs (papermill in `camp run`, nbclient in `camp check`)
that never sleeps through a message that has already arrived.

pyzmq's asyncio integration wakes on an edge-triggered file descriptor, and a wake-up can be
lost (pyzmq issues #1558 and #2173; nbclient #312: "when cell contains ipywidget, execute cell
will sometimes block"). The poll then returns only at its timeout, where a last real poll finds
the message: nbclient waits for a cell's reply with the whole cell timeout, so a lost wake-up
stalls a cell for exactly that long (seen twice: b01 in CI and a03 locally, each 120 s, the
labs' cell timeout, then finishing normally). Here every wait is cut into slices of at most
`SLICE_S`, each ending in a real poll, so a lost wake-up costs at most one slice.

The kernel talks to it over Unix sockets in a private folder (transport "ipc"), not TCP on
loopback: ipykernel 7 warns on stderr ("Kernel is running over TCP without encryption ...") for
every TCP kernel without CurveZMQ keys, which `camp run` and `camp check` then printed for every
lab, and any local user could connect to the ports. The sockets live in a 0700 folder of their
own, removed when the manager goes.
"""
from __future__ import annotations

import shutil
import tempfile
import time
import typing as t
from queue import Empty

from jupyter_client import AsyncKernelManager
from jupyter_client.asynchronous import AsyncKernelClient
from jupyter_client.channels import AsyncZMQSocketChannel
from traitlets import CaselessStrEnum, DottedObjectName, Type

SLICE_S = 0.5


class SlicedWaitChannel(AsyncZMQSocketChannel):
    async def get_msg(self, timeout: float | None = None) -> dict[str, t.Any]:  # type:ignore[override]
        assert self.socket is not None
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = SLICE_S if deadline is None else min(SLICE_S, max(0.0, deadline - time.monotonic()))
            if await self.socket.poll(int(left * 1000)):
                return await self._recv()
            if deadline is not None and time.monotonic() >= deadline:
                raise Empty


class SlicedWaitClient(AsyncKernelClient):
    shell_channel_class = Type(SlicedWaitChannel)    # type:ignore[assignment]
    iopub_channel_class = Type(SlicedWaitChannel)    # type:ignore[assignment]
    control_channel_class = Type(SlicedWaitChannel)  # type:ignore[assignment]


class SlicedWaitKernelManager(AsyncKernelManager):
    """Pass as nbclient's / papermill's `kernel_manager_class`."""

    client_class = DottedObjectName("autograder.course.kernel_client.SlicedWaitClient")
    client_factory = Type(klass="autograder.course.kernel_client.SlicedWaitClient")
    transport = CaselessStrEnum(["tcp", "ipc"], default_value="ipc", config=True)

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        if self.transport == "ipc" and "ip" not in kwargs:   # else "kernel-ipc-N" files in the cwd
            self._socket_dir = tempfile.mkdtemp(prefix="camp-kernel-")   # 0700
            self.ip = f"{self._socket_dir}/kernel"

    async def _async_cleanup_resources(self, restart: bool = False) -> None:
        await super()._async_cleanup_resources(restart=restart)
        if not restart and getattr(self, "_socket_dir", None):
            shutil.rmtree(self._socket_dir, ignore_errors=True)
