"""The grading workers: `jobs` processes, started before the class is unpacked and the labs are
registered, so that their start-up overlaps with that work instead of delaying the first result.

A worker's start-up is most of a small class's grading time: importing torch, the test engine,
torch's compiler stack (torch.optim's constructors import it) and what the labs' setup cells
import (matplotlib, ipywidgets, transformers) costs 5-10 s, where
one b01 submission then takes about 3 s. So workers come from a fork server that has imported
all of that once: `--jobs 2` pays it once, not twice, and a worker exits without the
interpreter's teardown (os._exit, as every fork-server child). The fork server runs no torch
operation (forking after one could inherit OpenMP's threads) and holds no student data; each
worker then does its first-use work (canary plan, setup cells) for the labs it grades.
"""
from __future__ import annotations

import ast
import json
import multiprocessing
import os
import threading
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from .results import SubmissionResult, TestOutcome

# torch._dynamo: the tests' reference computations build torch.optim optimizers, whose constructor
# imports it on first use (2-5 s); imported once here, no worker pays it again
ENGINE_MODULES = ["autograder.grading.worker", "torch._dynamo", "IPython.core.interactiveshell"]
WORKER_DIED = "grader worker failed"   # a result's message when its worker process died (a retry result)


def preload_modules(sources: list[str]) -> list[str]:
    """The grading engine's modules and every module the labs' setup cells import (read from the
    course's own notebooks, never a submission's; plain JSON, so that this is quick)."""
    names = list(ENGINE_MODULES)
    for source in sources:
        try:
            cells = json.loads(Path(source).read_text(encoding="utf-8"))["cells"]
            setup = ["".join(c["source"]) if isinstance(c["source"], list) else c["source"] for c in cells
                     if c.get("cell_type") == "code" and "setup" in c.get("metadata", {}).get("tags", [])]
        except Exception:
            continue
        for cell in setup:
            try:
                tree = ast.parse(cell)
            except SyntaxError:
                continue
            for node in tree.body:
                if isinstance(node, ast.Import):
                    names += [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    names.append(node.module)
    return list(dict.fromkeys(names))


def start_fork_server(sources: list[str]) -> None:
    """Start the fork server the workers come from, with `sources`' imports preloaded; returns at
    once (the server imports in its own process). Call it as early as possible (`camp grade`
    does, before its own imports); later calls, and their preload lists, change nothing."""
    from multiprocessing import forkserver

    multiprocessing.get_context("forkserver").set_forkserver_preload(preload_modules(sources))
    # The fork server imports pyplot: never a display. Only its environment says so: the
    # caller's (a pytest worker, a notebook kernel starting Jupyter) must keep its backend.
    saved = os.environ.get("MPLBACKEND")
    os.environ["MPLBACKEND"] = "Agg"
    try:
        forkserver.ensure_running()
    finally:
        if saved is None:
            os.environ.pop("MPLBACKEND", None)
        else:
            os.environ["MPLBACKEND"] = saved


class GradingPool:
    """`n` warm workers; `warm` lists (source notebook, forbidden APIs) of the labs to grade."""

    def __init__(self, n: int, isolation: str, threads: int, warm: list[tuple[str, list[str]]]):
        from .worker import init_worker, ready

        start_fork_server([source for source, _ in warm])
        ctx = multiprocessing.get_context("forkserver")
        self._pool = ProcessPoolExecutor(max_workers=n, mp_context=ctx, initializer=init_worker,
                                         initargs=(isolation, threads, warm))
        # One task each makes the executor start every worker now. A worker's start waits for
        # the fork server to finish importing, so it happens in a thread, beside the caller.
        self._starting = threading.Thread(target=lambda: [self._pool.submit(ready) for _ in range(n)],
                                          name="camp-grading-pool-start", daemon=True)
        self._starting.start()

    def run(self, jobs: list[dict]):
        """Yield (job, result, starved) as submissions finish; each worker leases its own sandbox
        uid for its life (autograder.isolation.uids)."""
        from .worker import grade_job

        self._starting.join()
        futures = {self._pool.submit(grade_job, job): job for job in jobs}
        for future in as_completed(futures):
            job = futures[future]
            try:
                outcome = future.result()
                yield job, SubmissionResult.from_dict(outcome["result"]), outcome["starved"]
            except Exception as exc:  # the worker itself died: report, don't save, retry next run
                from ..course.labspec import LabSpec
                spec = LabSpec.from_notebook(Path(job["source"]))
                tests = [TestOutcome(t.grade_id, t.points, 0.0, "not graded") for t in spec.tests]
                yield job, SubmissionResult(job["student"], job["lab"], "error", max_score=spec.max_score,
                                            message=f"{WORKER_DIED} ({type(exc).__name__}); run again to retry",
                                            retry=True, tests=tests), False

    def close(self) -> None:
        self._starting.join()
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> "GradingPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
