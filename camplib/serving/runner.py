"""The engine's own thread, next to the HTTP server's event loop.

The loop thread calls `engine.step()` while there is work and sleeps on a condition otherwise;
request handlers `submit` (a queue per request receives each token) and `abort`.
`stop(drain=True)` lets the running requests finish first (graceful shutdown).

The tokens of a step reach the event loop in one `call_soon_threadsafe` after the step, not one
per token: each such call writes to the loop's wake-up pipe (a system call and a wake-up of the
loop), 1.5% of the engine thread's time at 16 clients in a py-spy profile of the server.

Bursts: clients often send together (a wave of requests after the previous answers end). Woken
from idle by the first of them, the engine waits until no new request arrived for `burst_gap_s`
(at most `burst_s`) before its first step, so the burst is prefilled in one step instead of one
step for the first request while the others wait through it: a step streams all the weights
however few its tokens, so that first step delayed everyone else's first token by a whole step
(~200 ms of queue time per request at 16 clients on one loaded core, from the server's
vllm:request_queue_time_seconds). A lone request waits burst_gap_s (2 ms) more. The scheduler
(and its lesson) is unchanged: this is only when the engine thread starts.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time

from camplib.serving.engine import Engine
from camplib.serving.sequence import SamplingParams, Sequence

__all__ = ["EngineLoop"]

log = logging.getLogger("camplib.serving")
DONE = None   # what a request's queue gets after its last token


class EngineLoop:
    def __init__(self, engine: Engine, burst_s: float = 0.02, burst_gap_s: float = 0.002):
        self.engine = engine
        self.burst_s, self.burst_gap_s = burst_s, burst_gap_s
        self.wake = threading.Condition()
        self.stopping = False
        self.pending: dict[asyncio.AbstractEventLoop, list] = {}   # tokens of this step, per event loop
        self.thread = threading.Thread(target=self._run, name="camplib-engine", daemon=True)

    def start(self) -> "EngineLoop":
        self.thread.start()
        return self

    def submit(self, prompt: list[int], params: SamplingParams) -> tuple[Sequence, asyncio.Queue]:
        """Queue a request (raises ValueError / QueueFull); its tokens arrive on the queue, then DONE."""
        loop, queue = asyncio.get_running_loop(), asyncio.Queue()

        def on_token(seq: Sequence, token: int) -> None:   # the engine thread; sent after the step
            self.pending.setdefault(loop, []).append((queue, token, seq.finished))

        seq = self.engine.add(prompt, params, on_token)
        with self.wake:
            self.wake.notify()
        return seq, queue

    def abort(self, seq: Sequence) -> None:
        self.engine.abort(seq)

    def _run(self) -> None:
        while True:
            with self.wake:
                idle = not self.engine.has_work()
                while not self.engine.has_work() and not self.stopping:
                    self.wake.wait(0.5)
                if self.stopping and not self.engine.has_work():
                    return
            if idle and not self.stopping:
                self._rest_of_burst()
            try:
                self.engine.step()
            except Exception:   # a bug must not leave clients hanging: fail every request in flight
                log.exception("engine step failed; aborting the requests in flight")
                for seq in list(self.engine.scheduler.running) + list(self.engine.scheduler.waiting):
                    self.engine.abort(seq)
                    if seq.on_token is not None:
                        seq.on_token(seq, -1)
            finally:
                self._send()

    def _rest_of_burst(self) -> None:
        """Wait while requests keep arriving (a gap of burst_gap_s ends it), at most burst_s."""
        deadline, seen = time.monotonic() + self.burst_s, len(self.engine.scheduler.waiting)
        while time.monotonic() < deadline:
            time.sleep(self.burst_gap_s)
            now = len(self.engine.scheduler.waiting)
            if now == seen:
                return
            seen = now

    def _send(self) -> None:
        """Hand the step's tokens to their event loops, one call per loop."""
        pending, self.pending = self.pending, {}
        for loop, items in pending.items():
            try:
                loop.call_soon_threadsafe(_deliver, items)
            except RuntimeError:   # that loop is closed: its clients are gone
                pass

    def stop(self, timeout: float = 30.0) -> None:
        """Finish what is queued or running, then end the thread."""
        with self.wake:
            self.stopping = True
            self.wake.notify()
        self.thread.join(timeout)


def _deliver(items: list) -> None:
    """On the event loop: each token to its request's queue, DONE after a request's last."""
    for queue, token, finished in items:
        queue.put_nowait(token)
        if finished:
            queue.put_nowait(DONE)
