"""Everything in the course that needs a CUDA GPU, checked in one run (aimed at < 8 minutes on
one GPU): run it on a machine with at least one CUDA GPU and the course installed with a CUDA
build of torch.

    .venv/bin/python benchmarks/gpu_suite.py [--peak-tflops 989] [--budget 480] [--skip labs] [--labs b02 a09]

Checks, each in its own Python process (so one crash, hang or CUDA error cannot take the
others down, and `camplib.dist.launch` can fork NCCL ranks from a process that has not touched
CUDA yet), each with a timeout:
- lab:<id>     `camp run <id> --profile gpu` for every ready lab (course/labs.toml);
- triton       the FlashAttention Triton forward compiled (fp32, fp16, bf16 where supported),
               equal to F.scaled_dot_product_attention, timed against it and against the
               PyTorch tiled version (torch.cuda.synchronize around every timing);
- mfu          bf16-autocast training of camplib's GPT: tokens/s and model flops utilisation
               (camplib.profiling: 6N + 12 L d T flops per token) against the GPU's peak;
- a01-memory   tests/camplib/test_memory.py's CUDA allocator test (must pass, not skip);
- triton-test  tests/camplib/kernels/test_triton_flash.py's compiled-kernel tests;
- nccl         camplib.dist.launch with backend "nccl", one rank per visible GPU: an
               all_reduce whose sum every rank checks.
The five checks above run first, then the labs, each started only while the suite has spent
less than --budget seconds: a lab left out for time is a row "NOT RUN" with the reason, and the
last line counts them (never a silent pass). Prints one table (check, ok/FAILED/NOT RUN, seconds,
detail) and exits 1 on any failure; exits 2 at once, saying so, when no CUDA device is present.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULT = "GPU_SUITE_RESULT "   # the line a child prints: this prefix, then JSON {"ok": bool, "detail": str}

# dense bf16 peak tensor-core flops/s by device name (vendor datasheets, no sparsity)
PEAK_BF16 = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "L4": 121e12, "A10": 125e12,
             "RTX 4090": 165e12, "RTX 3090": 71e12, "V100": 125e12}


# -- checks, run in a child process (python gpu_suite.py --one NAME) -------------------------
def _timed(fn, repeats=10):
    """Median seconds of fn() on the GPU, synchronised before and after each run, after 3 warm-ups."""
    import torch
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def check_triton(args) -> tuple[bool, str]:
    import torch
    import torch.nn.functional as F

    from camplib.kernels.flash import flash_attention
    from camplib.kernels.triton_flash import interpreted, triton_available, triton_flash_attention
    if not triton_available():
        return False, "triton is not installed"
    if interpreted():
        return False, "TRITON_INTERPRET is set: unset it to test the compiled kernel"
    dtypes = [torch.float32, torch.float16] + ([torch.bfloat16] if torch.cuda.is_bf16_supported() else [])
    tol = {torch.float32: 2e-4, torch.float16: 2e-2, torch.bfloat16: 3e-2}
    details, ok = [], True
    g = torch.Generator(device="cuda").manual_seed(0)
    for dtype in dtypes:
        q, k, v = (torch.randn(4, 16, 2048, 64, generator=g, device="cuda", dtype=dtype) for _ in range(3))
        out = triton_flash_attention(q, k, v, is_causal=True)
        ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
        err = (out.float() - ref).abs().max().item()
        ok &= err <= tol[dtype]
        t_triton = _timed(lambda: triton_flash_attention(q, k, v, is_causal=True))
        t_sdpa = _timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
        t_torch = _timed(lambda: flash_attention(q, k, v, is_causal=True, block_q=128, block_k=128), repeats=3)
        details.append(f"{str(dtype)[6:]}: err {err:.1e} (tol {tol[dtype]}), {t_triton * 1e3:.2f} ms, "
                       f"x{t_triton / t_sdpa:.2f} SDPA, x{t_triton / t_torch:.3f} tiled PyTorch")
    return ok, "; ".join(details)


def check_mfu(args) -> tuple[bool, str]:
    import torch

    from camplib.model import GPT, GPTConfig
    from camplib.profiling import flops_per_token, mfu
    if not torch.cuda.is_bf16_supported():
        return False, f"{torch.cuda.get_device_name()} has no bf16"
    cfg = GPTConfig.gpt2_style(vocab_size=50304, n_layer=12, n_head=12, d_model=768, max_seq_len=1024)
    model = GPT(cfg).cuda().train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
    B, T = 8, 1024
    x = torch.randint(0, cfg.vocab_size, (B, T + 1), device="cuda")

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            _, loss = model(x[:, :-1], x[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    seconds = _timed(step, repeats=10)
    tok_s = B * T / seconds
    per_token = flops_per_token(model.num_parameters(exclude_embeddings=True), cfg.n_layer, cfg.d_model, T)
    name = torch.cuda.get_device_name()
    peak = args.peak_tflops * 1e12 if args.peak_tflops else next((p for n, p in PEAK_BF16.items() if n in name), None)
    if peak is None:
        return True, f"{tok_s:,.0f} tokens/s on {name}; MFU unknown (give --peak-tflops)"
    return True, f"{tok_s:,.0f} tokens/s, MFU {mfu(tok_s, per_token, peak):.1%} of {peak / 1e12:.0f} TFLOP/s ({name}, GPT-2 124M, bf16)"


def _pytest(node: str, expect: int) -> tuple[bool, str]:
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", node],
                          cwd=ROOT, capture_output=True, text=True)
    last = (proc.stdout.strip().splitlines() or ["no output"])[-1]
    passed = f"{expect} passed" in last and "skipped" not in last and proc.returncode == 0
    return passed, last if passed else last + " | " + proc.stdout[-400:].replace("\n", " ")


def check_a01_memory(args):
    return _pytest("tests/camplib/test_memory.py::test_accounting_matches_cuda_allocations", 1)


def check_triton_test(args):
    return _pytest("tests/camplib/kernels/test_triton_flash.py::test_compiled_on_gpu", 2)


def _nccl_rank(rank, world_size):
    import torch
    import torch.distributed as dist
    t = torch.full((1024,), float(rank + 1), device=f"cuda:{rank}")
    dist.all_reduce(t)
    torch.cuda.synchronize()
    return float(t[0].item()), str(t.device)


def check_nccl(args):
    import torch
    import torch.distributed as dist

    from camplib.dist import launch
    if not dist.is_nccl_available():
        return False, "this torch build has no NCCL"
    n = torch.cuda.device_count()
    expected = n * (n + 1) / 2
    results = launch(_nccl_rank, n, backend="nccl", timeout=60, run_timeout=120)
    ok = all(value == expected for value, _ in results)
    return ok, f"{n} rank(s), all_reduce sums {[v for v, _ in results]} (expected {expected}) on {[d for _, d in results]}"


CHECKS = {"triton": check_triton, "mfu": check_mfu, "a01-memory": check_a01_memory,
          "triton-test": check_triton_test, "nccl": check_nccl}
TIMEOUTS = {"triton": 120, "mfu": 120, "a01-memory": 90, "triton-test": 120, "nccl": 150}


def run_one(name, args) -> int:
    try:
        ok, detail = CHECKS[name](args)
    except Exception as exc:  # report, never crash the table
        ok, detail = False, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:400]
    print(RESULT + json.dumps({"ok": bool(ok), "detail": detail}), flush=True)
    return 0


# -- the parent: spawn each check, collect one row each --------------------------------------
def _child(cmd, timeout, env=None) -> tuple[bool, float, str, str]:
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return False, time.perf_counter() - start, f"timed out after {timeout} s", ""
    return proc.returncode == 0, time.perf_counter() - start, proc.stdout, proc.stderr


def ready_labs() -> list[str]:
    sys.path.insert(0, str(ROOT))
    from autograder.catalog import Catalog
    return [lab.id for lab in Catalog.load().ready()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--one", choices=list(CHECKS), help=argparse.SUPPRESS)
    parser.add_argument("--peak-tflops", type=float, default=None, help="the GPU's dense bf16 peak (default: by name)")
    parser.add_argument("--skip", nargs="*", default=[], help="checks to leave out: labs, " + ", ".join(CHECKS))
    parser.add_argument("--labs", nargs="*", default=None, help="lab ids to run (default: every ready lab)")
    parser.add_argument("--budget", type=float, default=None,
                        help="seconds after which no further lab is started (the rest are reported NOT RUN)")
    parser.add_argument("--lab-timeout", type=int, default=300,
                        help="seconds per lab's gpu run (a07, a08 and p02 load SmolLM2-135M; a08 compiles and "
                             "exports it: none of this has been timed on a GPU yet)")
    args = parser.parse_args()
    if args.one:
        return run_one(args.one, args)

    probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.device_count(), torch.version.cuda)"],
                           capture_output=True, text=True)
    count, _, cuda_version = probe.stdout.strip().partition(" ")
    if probe.returncode != 0 or not count.isdigit() or int(count) == 0:
        print(f"gpu_suite: no CUDA device visible to torch (torch.cuda.device_count() = {count or '?'}, "
              f"CUDA build {cuda_version or '?'}; {probe.stderr.strip()[-200:]}). This suite checks what needs a GPU: "
              "run it on a machine with one, with a CUDA build of torch (see README: TORCH_SPEC).", file=sys.stderr)
        return 2

    rows, env = [], dict(os.environ)
    env.pop("TRITON_INTERPRET", None)   # compiled Triton, not the interpreter
    # CUDA checks by NVML, which does not initialise CUDA: a process that initialised it cannot
    # fork NCCL ranks (camplib.dist.launch forks)
    env["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
    camp_script = Path(sys.executable).parent / "camp"   # installed by `make setup`; else the module
    camp = [str(camp_script)] if camp_script.exists() else [sys.executable, "-m", "autograder.cli"]
    suite_start = time.perf_counter()
    for name in CHECKS:
        if name in args.skip:
            continue
        cmd = [sys.executable, str(Path(__file__).resolve()), "--one", name]
        if args.peak_tflops:
            cmd += ["--peak-tflops", str(args.peak_tflops)]
        ok, secs, stdout, stderr = _child(cmd, TIMEOUTS[name], env)
        line = next((l for l in stdout.splitlines() if l.startswith(RESULT)), None)
        if line is None:
            rows.append((name, False, secs, (stdout if stdout.startswith("timed out") else
                                             "no result: " + " ".join((stderr or stdout).split())[-300:])))
        else:
            result = json.loads(line[len(RESULT):])
            rows.append((name, ok and result["ok"], secs, result["detail"]))

    if "labs" not in args.skip:
        with tempfile.TemporaryDirectory() as out:
            for lab in (args.labs if args.labs is not None else ready_labs()):
                spent = time.perf_counter() - suite_start
                if args.budget is not None and spent >= args.budget:
                    rows.append((f"lab:{lab}", None, 0.0, f"not run: the suite's budget of {args.budget:.0f} s was spent"))
                    continue
                ok, secs, stdout, stderr = _child(camp + ["run", lab, "--profile", "gpu", "--out", out],
                                                  args.lab_timeout, env)
                row = next((l for l in stdout.splitlines() if l.split()[:1] == [lab]), "")   # camp run's table row
                tail = row if ok else (row + " " + (stderr or stdout).strip()[-300:])
                rows.append((f"lab:{lab}", ok, secs, " ".join(tail.split())))
    if not rows:
        print("gpu_suite: every check was skipped: nothing checked", file=sys.stderr)
        return 1
    width = max(len(r[0]) for r in rows)
    print(f"{'check':<{width}}  {'result':<7}  {'seconds':>7}  detail")
    for name, ok, secs, detail in rows:
        print(f"{name:<{width}}  {'NOT RUN' if ok is None else 'ok' if ok else 'FAILED':<7}  {secs:7.1f}  {detail}")
    failed = [r[0] for r in rows if r[1] is False]
    not_run = [r[0] for r in rows if r[1] is None]
    print(f"{sum(1 for r in rows if r[1])}/{len(rows)} ok in {time.perf_counter() - suite_start:.0f} s"
          + (f"; FAILED: {', '.join(failed)}" if failed else "")
          + (f"; NOT RUN (budget): {', '.join(not_run)}" if not_run else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
