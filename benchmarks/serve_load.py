"""Continuous batching against one-request-at-a-time serving, over HTTP, in one run.

Two servers (`python -m camplib.serving --demo`, a random byte-level GPT) start on loopback:
one with --max-batch 64 (continuous batching), one with --max-batch 1 (each request alone:
plain unbatched greedy decoding). For 1, 4, 16 and 64 concurrent clients, each client streams
greedy completions (SSE) one after another; we report generated tokens per second, p50/p99
end-to-end latency and time to first token, the batched/sequential throughput ratio, and check
that both servers return the same text for every prompt. Goal: >= 3x at 16 clients on CPU.
Everything stays on 127.0.0.1 and is bounded (requests per level, max_tokens, timeouts).

    .venv/bin/python benchmarks/serve_load.py [--max-tokens 32] [--requests-per-client 2] [--out serve_load.png]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

LEVELS = (1, 4, 16, 64)
DEMO = '{"d_model": 128, "n_layer": 2, "n_head": 4, "n_kv_head": 2, "max_seq_len": 128}'


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(max_batch: int) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "camplib.serving", "--demo", "--demo-config", DEMO,
                             "--host", "127.0.0.1", "--port", str(port), "--max-batch", str(max_batch),
                             "--max-waiting", "1024", "--block-size", "16"],
                            env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    return proc, f"http://127.0.0.1:{port}"


def wait_up(base: str, proc: subprocess.Popen, timeout: float = 90, log: Path | None = None) -> None:
    """Until `base`/health answers 200; the server's exit or the timeout ends the run (with the
    tail of its `log` where there is one)."""
    tail = lambda: f"; its log ({log}):\n{log.read_text()[-3000:]}" if log is not None and log.exists() else ""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server {base} exited with {proc.returncode}{tail()}")
        try:
            if httpx.get(base + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"server {base} not up after {timeout} s{tail()}")


async def one_request(client: httpx.AsyncClient, base: str, prompt: str, max_tokens: int,
                      model: str = "camp-demo") -> dict:
    """One greedy streamed completion (SSE): its text, tokens, time to first token and latency."""
    start, first, text, tokens = time.perf_counter(), None, [], 0
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    async with client.stream("POST", base + "/v1/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            for c in chunk["choices"]:
                first = first or time.perf_counter()
                text.append(c["text"])
    end = time.perf_counter()
    return {"prompt": prompt, "text": "".join(text), "tokens": tokens, "ttft": first - start, "latency": end - start}


def demo_prompts(clients: int, per_client: int) -> list[str]:
    return [f"client {w} request {i}: the" for i in range(per_client) for w in range(clients)]


async def level(base: str, clients: int, prompts: list[str], max_tokens: int, model: str = "camp-demo") -> dict:
    """`clients` concurrent clients; client w sends prompts w, w + clients, ... one after another."""
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=clients)) as client:
        async def worker(w):
            return [await one_request(client, base, p, max_tokens, model) for p in prompts[w::clients]]
        start = time.perf_counter()
        results = [r for rs in await asyncio.gather(*(worker(w) for w in range(clients))) for r in rs]
        wall = time.perf_counter() - start
    lat = sorted(r["latency"] for r in results)
    ttft = sorted(r["ttft"] for r in results)

    def pct(xs, q):
        return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]
    return {"clients": clients, "requests": len(results), "tok_per_s": sum(r["tokens"] for r in results) / wall, "wall": wall,
            "p50": statistics.median(lat), "p99": pct(lat, 0.99), "ttft50": statistics.median(ttft),
            "ttft99": pct(ttft, 0.99), "texts": {r["prompt"]: r["text"] for r in results}}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--requests-per-client", type=int, default=1)
    ap.add_argument("--levels", default=",".join(map(str, LEVELS)))
    ap.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "serve_load.png"))
    args = ap.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    servers = {"batched": start_server(64), "one at a time": start_server(1)}
    try:
        for proc, base in servers.values():
            wait_up(base, proc)
            asyncio.run(level(base, 4, demo_prompts(4, 1), 4))   # warm-up: the first forward passes are slower
        rows = {name: [asyncio.run(level(base, c, demo_prompts(c, args.requests_per_client), args.max_tokens)) for c in levels]
                for name, (proc, base) in servers.items()}
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
    print(f"{'clients':>7} {'mode':>14} {'tok/s':>8} {'p50 s':>7} {'p99 s':>7} {'TTFT p50':>9} {'TTFT p99':>9}")
    for i, c in enumerate(levels):
        for name in servers:
            r = rows[name][i]
            print(f"{c:>7} {name:>14} {r['tok_per_s']:>8.0f} {r['p50']:>7.3f} {r['p99']:>7.3f} "
                  f"{r['ttft50']:>9.3f} {r['ttft99']:>9.3f}")
        ratio = rows["batched"][i]["tok_per_s"] / rows["one at a time"][i]["tok_per_s"]
        same = rows["batched"][i]["texts"] == rows["one at a time"][i]["texts"]
        print(f"{c:>7} {'ratio':>14} {ratio:>7.1f}x   outputs identical to one-at-a-time greedy: {same}")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
        for name in servers:
            a.plot(levels, [r["tok_per_s"] for r in rows[name]], "o-", label=name)
            b.plot(levels, [r["p50"] for r in rows[name]], "o-", label=f"{name} p50")
            b.plot(levels, [r["ttft50"] for r in rows[name]], "x--", label=f"{name} TTFT p50")
        for ax, title in ((a, "generated tokens / s"), (b, "seconds")):
            ax.set_xscale("log", base=2); ax.set_xlabel("concurrent clients"); ax.set_title(title); ax.legend()
        fig.tight_layout(); fig.savefig(args.out)
        print(f"plot: {args.out}")
    except ImportError:
        pass


if __name__ == "__main__":
    main()
