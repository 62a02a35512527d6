"""A real HTTP server for the tests: the app `python -m camplib.serving CHECKPOINT ...` builds
(its own argument parsing and checkpoint loading), run by uvicorn on 127.0.0.1 port 0 in a
thread of the test process (a subprocess would pay torch's import again, seconds on a busy
machine), serving a tiny checkpoint written here. Every wait is bounded, and the fixture stops
the server when its tests are done."""
from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest
import uvicorn

from camplib.serving.__main__ import build, parse_args
from camplib.serving.loading import EOS, demo_model, save_for_serving
from camplib.tokenizer import ByteBPE

MODEL = "tiny"


class RunningServer:
    def __init__(self, checkpoint, *extra: str, start_timeout: float = 30.0):
        """checkpoint: a path, or None when `extra` names the model (--smollm2, --demo)."""
        source = [] if checkpoint is None else [str(checkpoint)]
        app = build(parse_args([*source, "--model-name", MODEL, *extra]))
        self.uvicorn = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning",
                                                     timeout_graceful_shutdown=30))
        self.thread = threading.Thread(target=lambda: asyncio.run(self.uvicorn.serve()), daemon=True)
        self.thread.start()
        deadline = time.monotonic() + start_timeout
        while not self.uvicorn.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"server not up after {start_timeout} s")
            time.sleep(0.05)
        port = self.uvicorn.servers[0].sockets[0].getsockname()[1]
        self.base = f"http://127.0.0.1:{port}"
        self.engine = app.state.engine

    def health(self) -> dict:
        return httpx.get(self.base + "/health", timeout=5).json()

    def metric(self, name: str) -> float:
        """The sum of a metric's samples whose line starts with `name` (labels included)."""
        text = httpx.get(self.base + "/metrics", timeout=5).text
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))

    def close(self, timeout: float = 30.0):
        self.uvicorn.should_exit = True
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"the server did not stop within {timeout} s"


@pytest.fixture(scope="session")
def served_checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("serve") / "tiny.pt"
    served = demo_model(seed=0, max_seq_len=256)
    save_for_serving(path, served.model, ByteBPE([], [EOS]))
    return path


@pytest.fixture(scope="module")
def server(served_checkpoint):
    running = RunningServer(served_checkpoint, "--max-batch", "4", "--max-waiting", "4", "--block-size", "8")
    try:
        yield running
    finally:
        running.close()
