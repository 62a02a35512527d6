"""The kernel client of unattended runs waits in slices: a message that arrived while the
asyncio wake-up was lost is picked up by the next slice's real poll, not at the cell timeout."""
import asyncio
import time

import zmq

from autograder.course import kernel_client
from autograder.course.kernel_client import SLICE_S, SlicedWaitChannel


class LostWakeups:
    """A socket whose asyncio poll never wakes before its timeout (the lost wake-up), while a
    message is already waiting, as pyzmq returns it from the last real poll."""

    def __init__(self):
        self.polls = []

    async def poll(self, timeout_ms):
        self.polls.append(timeout_ms)
        await asyncio.sleep(timeout_ms / 1000)
        return zmq.POLLIN


def test_a_lost_wake_up_costs_one_slice_not_the_timeout():
    channel = SlicedWaitChannel.__new__(SlicedWaitChannel)
    channel.socket = LostWakeups()

    async def recv():
        return {"msg_type": "execute_reply"}

    channel._recv = recv
    start = time.monotonic()
    msg = asyncio.run(channel.get_msg(timeout=120))
    assert msg == {"msg_type": "execute_reply"}
    assert time.monotonic() - start < 2 * SLICE_S + 0.5
    assert channel.socket.polls == [int(SLICE_S * 1000)]


def test_nothing_arriving_still_times_out_at_the_deadline():
    class Silent:
        async def poll(self, timeout_ms):
            await asyncio.sleep(timeout_ms / 1000)
            return 0

    channel = SlicedWaitChannel.__new__(SlicedWaitChannel)
    channel.socket = Silent()
    start = time.monotonic()
    try:
        asyncio.run(channel.get_msg(timeout=1.2))
    except kernel_client.Empty:
        pass
    else:
        raise AssertionError("no message, yet get_msg returned")
    assert 1.2 <= time.monotonic() - start < 1.2 + SLICE_S + 0.5


def test_the_kernel_talks_over_private_unix_sockets_and_prints_nothing(tmp_path):
    """ipykernel 7 printed "Kernel is running over TCP without encryption" on stderr for every lab
    `camp run` executed (seen on every row of the GPU suite). The manager's kernel uses ipc
    sockets in a 0700 folder of its own (not "kernel-ipc-N" files in the cwd), removed at shutdown."""
    import os
    import subprocess
    import sys
    cell = ("import os; from ipykernel.kernelapp import IPKernelApp; app = IPKernelApp.instance(); "
            "print(app.transport, os.path.dirname(app.ip), oct(os.stat(os.path.dirname(app.ip)).st_mode & 0o777))")
    code = ("import nbformat\n"
            "from nbclient import NotebookClient\n"
            "from autograder.course.kernel_client import SlicedWaitKernelManager\n"
            f"nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell({cell!r})])\n"
            "NotebookClient(nb, kernel_name='python3', kernel_manager_class=SlicedWaitKernelManager).execute()\n"
            "print(nb.cells[0].outputs[0]['text'].strip())\n")
    work = tmp_path / "work"
    work.mkdir()
    env = dict(os.environ, TMPDIR=str(tmp_path))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=work, timeout=120)
    assert proc.returncode == 0, proc.stderr
    transport, folder, mode = proc.stdout.split()
    assert (transport, mode) == ("ipc", "0o700") and folder.startswith(str(tmp_path / "camp-kernel-")), proc.stdout
    assert not os.path.exists(folder), "the socket folder outlived the kernel"
    assert list(work.iterdir()) == [], "sockets in the working folder"
    assert "TCP" not in proc.stderr and "WARNING" not in proc.stderr, proc.stderr
