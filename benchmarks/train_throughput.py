"""Training throughput (tokens/s) of camplib's GPT vs transformers' GPT2LMHeadModel and
LlamaForCausalLM, in every configuration of the default run, side by side in one run.

Configurations: model family (GPT-2 style vs GPT2LMHeadModel, Llama style vs LlamaForCausalLM)
x size (small, medium) x precision (fp32, bf16 autocast) x transformers' attention kernel
(eager, sdpa). camplib's GPT runs with its default attention backend ("auto": torch's fused
kernel, or explicit matmuls with torch's softmax kernel ("matmul") where camplib.attention_backend
measured them faster for this device and dtype; `--ours-attention math|matmul|sdpa` pins one). The run starts by printing the CPU it
ran on: torch's kernel level (get_cpu_capability), the CPU's vector / bf16 flags, and whether
oneDNN computes bf16 natively; each configuration then prints the attention kernel "auto" chose. Both models get the
same config and the same weights (ours is converted from the HF one), the same byte-level
batches of real text (the Python standard library's source), the same optimizer (torch's AdamW,
fused kernel by default on both sides: `--adamw single|foreach|fused`; the comparison is about
the model, not the optimizer) and the same loss computed the same way from the logits, so the
only difference is the model code. Both run eagerly (`--compile` compiles both). The two train side by side, the order alternating every
step (ours, HF, HF, ours...), so that load from other processes on a shared machine hits both
alike; tokens/s come from each side's median step time, and the table prints the ratio camplib /
transformers per configuration. Each configuration also profiles a few steps per side and prints
its share in matrix products and attention (aten mm, addmm, bmm, baddbmm and the
scaled-dot-product kernels, forward and backward: what nn.Linear and SDPA run; everything else,
element-wise work, norms, the loss, the optimizer and the Python between operators, counts
against it), the kernels both sides call alike, and the ceiling ratio / camplib's share: the
ratio camplib would reach if everything else cost nothing (a goal above it cannot be met by the
model's code on this machine). Eager on the CPU the share is CPU time, which other jobs on a
shared machine do not inflate: the products' CPU time in a profiled step (camplib.profiling.op_cpu_times)
over the CPU time of an unprofiled step of the same side run just before it (the median of these
per-step shares: the load of a shared machine changes from minute to minute, and a share whose two
halves were measured minutes apart moved by up to 0.05); compiled or on
CUDA it is torch.profiler's self time of those kernels over the profiled step's wall time
(profiler overhead included, so lower). After each row, camplib's costliest operators outside
the products (`--ops`), in CPU time (each includes ~10 us of the timer's own overhead per call;
views, which move no data, are left out of that list). The goals of issue 25 are printed
beside the lowest figures (and decide the exit status): ratio >= 1.0 in every configuration
(`--goal`) and camplib's share >= 0.90 (`--share-goal`). CUDA when present (synchronised
around timings; bf16 only where the GPU supports it), else the CPU, where bf16 is left out of the
default run, saying so, when the CPU has no bf16 instructions (`--precision fp32 bf16` runs it).
The machine's load average is printed before and after (a shared machine slows both sides alike,
step by step, but makes the profiled shares noisier).

    .venv/bin/python benchmarks/train_throughput.py [--threads 1] [--steps 20] [--clock process]
        [--family gpt2 llama] [--size small medium] [--precision fp32 bf16] [--attn eager sdpa] [--compile]
        [--adamw fused|foreach|single] [--ops 6] [--goal 1.0] [--share-goal 0.9]
"""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import sysconfig
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F

SIZES = {"small": dict(d=128, layers=2, heads=4), "medium": dict(d=256, layers=4, heads=8)}


def stdlib_bytes(n_bytes: int) -> torch.Tensor:
    """The first n_bytes of the standard library's .py files, as byte ids 0..255."""
    data = bytearray()
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        data += path.read_bytes()
        if len(data) >= n_bytes:
            break
    return torch.tensor(list(data[:n_bytes]), dtype=torch.long)


def batches(data: torch.Tensor, batch: int, seq: int, n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        starts = torch.randint(0, len(data) - seq - 1, (batch,), generator=g)
        chunk = torch.stack([data[s:s + seq + 1] for s in starts])
        yield chunk[:, :-1], chunk[:, 1:]


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


# the kernels both models call with the same shapes: matrix products and fused attention
SHARED_KERNELS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "scaled_dot_product")


# operators that only make a new view of a tensor (no data moved): listed by --ops they would show
# the timer's own overhead, ~10 us a call, not a cost of the model
METADATA_OPS = {"aten::view", "aten::_unsafe_view", "aten::t", "aten::transpose.int", "aten::as_strided",
                "aten::detach", "aten::expand", "aten::split.Tensor", "aten::split_with_sizes",
                "aten::unsqueeze", "aten::slice.Tensor", "aten::permute", "aten::select.int"}


class Side:
    """One side of the comparison: a model, how to get its logits, its AdamW and precision."""

    def __init__(self, model, logits_fn, device, precision, adamw: str = "fused"):
        self.params = list(model.parameters())
        self.logits_fn, self.device = logits_fn, device
        kernel = {"single": dict(foreach=False), "foreach": dict(foreach=True), "fused": dict(fused=True)}[adamw]
        self.opt = torch.optim.AdamW(self.params, lr=3e-4, weight_decay=0.1, **kernel)
        self.cast = ((lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if precision == "bf16"
                     else contextlib.nullcontext)

    def step(self, x, y) -> float:
        """One AdamW step on (x, y); returns the loss."""
        x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
        with self.cast():
            logits = self.logits_fn(x)
        loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        return loss.item()

    def timed_step(self, x, y, clock) -> tuple[float, float, float]:
        """(seconds by `clock`, this thread's CPU seconds, loss) of one step, synchronised on CUDA."""
        sync(self.device)
        start, cpu_start = clock(), time.thread_time()
        loss = self.step(x, y)
        sync(self.device)
        return clock() - start, time.thread_time() - cpu_start, loss

    def shared_ms(self, x, y, compiled: bool) -> tuple[float, float | None, list]:
        """(ms of one step in SHARED_KERNELS, the profiled step's ms or None, the other operators'
        rows; all operators' ms sum to less than the step: the rest is Python and autograd's engine
        between operators). Eager on the CPU: CPU time of this thread per operator (camplib.profiling.op_cpu_times),
        which the other jobs of a shared machine do not inflate, to be divided by the CPU time of an
        unprofiled step run just before (None here: Python between operators counts as not shared, the
        profiler's overhead does not). Compiled or on CUDA: torch.profiler's self times (device
        time on CUDA) over the profiled step's own wall time, profiler overhead included (a
        compiled function runs eagerly under a dispatch mode, so CPU time per operator cannot
        see it). camplib and transformers compute the same products and attention, so camplib's
        ratio can at most reach measured ratio / share (everything else made free): the ceiling
        the table prints."""
        from camplib.profiling import op_cpu_times, profile_step

        if self.device.type == "cpu" and not compiled:
            rows, _ = op_cpu_times(lambda: self.step(x, y), warmup=0)
            wall = None
        else:
            clock = {}

            def timed():
                sync(self.device)
                clock["start"] = time.perf_counter()
                self.step(x, y)
                sync(self.device)
                clock["end"] = time.perf_counter()

            rows = profile_step(timed, warmup=0, top=10**9, device=self.device)
            wall = (clock["end"] - clock["start"]) * 1e3
        shared = [r for r in rows if any(k in r.name for k in SHARED_KERNELS)]
        return sum(r.self_ms for r in shared), wall, [r for r in rows if r not in shared]


def hf_model(family: str, size: str, attn: str, seq: int):
    """A fresh transformers model of the family and size (seeded: every call, the same weights)."""
    import transformers

    s = SIZES[size]
    torch.manual_seed(0)
    if family == "gpt2":
        cfg = transformers.GPT2Config(vocab_size=256, n_positions=seq, n_embd=s["d"], n_layer=s["layers"],
                                      n_head=s["heads"], resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                      bos_token_id=None, eos_token_id=None, attn_implementation=attn)
        return transformers.GPT2LMHeadModel(cfg)
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=s["d"], intermediate_size=int(8 / 3 * s["d"]) // 16 * 16,
                                   num_hidden_layers=s["layers"], num_attention_heads=s["heads"],
                                   num_key_value_heads=s["heads"] // 2, max_position_embeddings=seq,
                                   bos_token_id=None, eos_token_id=None, pad_token_id=None, attn_implementation=attn)
    return transformers.LlamaForCausalLM(cfg)


def ours_from(hf, attention: str):
    """camplib's GPT with hf's weights and the chosen attention backend."""
    from camplib.hf import config_from_hf, from_hf
    from camplib.model import GPT

    model = GPT(replace(config_from_hf(hf.config), attention=attention)).to(next(hf.parameters()).device)
    model.load_state_dict(from_hf(hf).state_dict())
    return model


def run_config(family, size, precision, attn, data, args, device) -> dict:
    """Both models from the same weights, trained side by side on the same batches, the order
    alternating every step (ours first, then HF first...), so that load from other processes
    hits both alike; tokens/s from each side's median step time after the warm-up steps. Then
    `--profiled` steps of each, alternating, each under the profiler right after an unprofiled step
    of the same side: the median share, each profiled step's time in the products over its
    neighbour's (so a change of load between the timed and the profiled steps cannot move the
    share)."""
    hf = hf_model(family, size, attn, args.seq).to(device)
    models = {"camplib": ours_from(hf, args.ours_attention), "transformers": hf}
    sides = {}
    for name, model in models.items():
        model.train()
        fn = (lambda x, m=model: m(x)[0]) if name == "camplib" else (lambda x, m=model: m(input_ids=x).logits)
        sides[name] = Side(model, torch.compile(fn) if args.compile else fn, device, precision, args.adamw)
    clock = time.process_time if args.clock == "process" else time.perf_counter
    times, cpu = {name: [] for name in sides}, {name: [] for name in sides}
    losses, profiled = {}, {name: [] for name in sides}
    n = args.warmup + args.steps + (args.profiled if args.shares else 0)
    for i, (x, y) in enumerate(batches(data, args.batch, args.seq, n, seed=0)):
        for name in (list(sides) if i % 2 == 0 else list(sides)[::-1]):
            if i < args.warmup + args.steps:
                seconds, cpu_seconds, loss = sides[name].timed_step(x, y, clock)
                losses.setdefault(name, loss)                        # the first step's: equal weights, equal loss
                if i >= args.warmup:
                    times[name].append(seconds)
                    cpu[name].append(cpu_seconds * 1e3)
            else:
                # an unprofiled step just before the profiled one: its CPU time is the denominator
                # of this profiled step's share, measured at the same load (not minutes earlier)
                near_ms = sides[name].timed_step(x, y, clock)[1] * 1e3
                ms, wall, rest = sides[name].shared_ms(x, y, args.compile)
                share = ms / (near_ms if wall is None else wall)
                profiled[name].append(dict(share=share, shared_ms=ms, step_ms=near_ms, others=rest))
    tok_s = {name: args.batch * args.seq / statistics.median(t) for name, t in times.items()}
    # the profiled step with the median share (the lower middle one for an even count): its share,
    # and its parts for the breakdown printed under the row
    middle = {name: sorted(steps, key=lambda p: p["share"])[(len(steps) - 1) // 2]
              for name, steps in profiled.items() if steps}
    return dict(med=tok_s, losses=losses, shares={name: p["share"] for name, p in middle.items()},
                ratio=tok_s["camplib"] / tok_s["transformers"], step_ms=statistics.median(cpu["camplib"]),
                profiled=middle.get("camplib"), others=middle["camplib"]["others"] if "camplib" in middle else [])


def remainder(step: dict) -> str:
    """Where camplib's profiled step (the one with the median share) goes, in CPU ms: products and
    attention, every other operator (views apart) and the rest, the Python and autograd engine
    between operators, adding up to the unprofiled step run just before it."""
    ops = sum(r.self_ms for r in step["others"])
    views = sum(r.self_ms for r in step["others"] if r.name in METADATA_OPS)
    rest = step["step_ms"] - step["shared_ms"] - ops
    return (f"step {step['step_ms']:.1f} ms = mm+attn {step['shared_ms']:.1f} + other operators {ops - views:.1f} "
            f"+ views {views:.1f} + Python/autograd between operators {rest:.1f} (the rest; each operator's "
            f"time also carries some of the timer's overhead)")


def op_label(name: str) -> str:
    """A short name for an operator row: aten's prefix dropped, a compiled graph's hash too."""
    return "compiled graph" if name.startswith("## Call CompiledFxGraph") else name.removeprefix("aten::")


def load() -> str:
    """The machine's load average (1, 5, 15 minutes) and CPU count: how shared the run was."""
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:
        return "load average unknown"
    return f"load average {one:.1f} / {five:.1f} / {fifteen:.1f} on {os.cpu_count()} CPUs"


CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16")


def cpu_description() -> str:
    """The CPU flags this run had, as the kernels see them."""
    flags = set()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    from camplib.attention_backend import native_on_cpu
    present = [f for f in CPU_FLAGS if f in flags] or ["(flags unknown: no /proc/cpuinfo)"]
    return (f"CPU: torch kernels {torch.backends.cpu.get_cpu_capability()}, flags {' '.join(present)}, "
            f"native bf16 {native_on_cpu(torch.bfloat16)}, native fp16 {native_on_cpu(torch.float16)}, "
            f"{torch.get_num_threads()} thread(s)")


def attention_chosen(args, device, precision) -> str:
    """What camplib's attention runs on in this configuration."""
    if args.ours_attention != "auto":
        return args.ours_attention
    from camplib.attention_backend import choices
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    seen = [(key[2], got) for key, got in choices().items() if key[:2] == (device.type, dtype) and key[3]]
    if not seen:
        return "auto -> sdpa (not measured: fp32, CUDA, or no bf16 instructions)"
    return "auto -> " + "; ".join(f"{got['backend']} for {shape} (" + ", ".join(
        f"{b} {s * 1e3:.1f} ms" for b, s in got["seconds"].items()) + ")" for shape, got in seen)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per side (compilation happens here)")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per side, alternating")
    parser.add_argument("--profiled", type=int, default=5, help="profiled steps per side for the share")
    parser.add_argument("--adamw", default="fused", choices=["single", "foreach", "fused"],
                        help="torch.optim.AdamW's kernel, the same on both sides")
    parser.add_argument("--family", nargs="+", default=["gpt2", "llama"], choices=["gpt2", "llama"])
    parser.add_argument("--size", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--precision", nargs="+", default=None, choices=["fp32", "bf16"],
                        help="default: fp32 and bf16, bf16 only where the hardware has it")
    parser.add_argument("--attn", nargs="+", default=["eager", "sdpa"], choices=["eager", "sdpa"],
                        help="transformers' attention kernel(s)")
    parser.add_argument("--ours-attention", default="auto", choices=["auto", "math", "matmul", "flash", "sdpa"])
    parser.add_argument("--clock", default="wall", choices=["wall", "process"],
                        help="wall time, or this process's CPU time (CPU only, for shared machines)")
    parser.add_argument("--compile", action="store_true", help="torch.compile both models' forward")
    parser.add_argument("--no-shares", dest="shares", action="store_false",
                        help="skip the profiled steps that measure each side's share in matmuls + attention")
    parser.add_argument("--ops", type=int, default=6,
                        help="after each row, camplib's N costliest operators outside the matrix products and attention")
    parser.add_argument("--goal", type=float, default=1.0, help="exit 1 when a ratio is below (issue 25: 1.0)")
    parser.add_argument("--share-goal", type=float, default=0.9,
                        help="exit 1 when camplib's mm+attn share is below (issue 25: 0.90)")
    args = parser.parse_args()
    goal = args.goal
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    elif args.clock == "process":
        parser.error("--clock process measures CPU time: use it on the CPU only")
    native_bf16 = (torch.cuda.is_bf16_supported() if device.type == "cuda"
                   else torch.ops.mkldnn._is_mkldnn_bf16_supported())
    precisions = args.precision or (["fp32", "bf16"] if native_bf16 else ["fp32"])
    if device.type == "cuda" and not native_bf16 and "bf16" in precisions:
        print("note: this GPU has no bf16: bf16 left out")
        precisions = [p for p in precisions if p != "bf16"]
    data = stdlib_bytes(2_000_000)
    print(cpu_description() if device.type == "cpu" else f"GPU: {torch.cuda.get_device_name()}; {cpu_description()}")
    print(f"{device.type}, {args.threads if device.type == 'cpu' else 1} thread(s); batch {args.batch} x seq {args.seq}, "
          f"{args.warmup} warm-up + {args.steps} timed AdamW steps per side, alternating step by step, median step; "
          f"camplib attention {args.ours_attention!r}; {'torch.compile' if args.compile else 'eager'} on both sides; "
          f"torch AdamW ({args.adamw}) on both sides; {args.clock} clock; {load()}")
    if device.type == "cpu" and not native_bf16:
        print("  note: this CPU has no bf16 instructions (AVX512-BF16 / AMX): autocast's bf16 matrix products are "
              "emulated, many times slower than fp32, and fill nearly the whole step on both sides; "
              + ("measured as asked" if "bf16" in precisions else
                 "bf16 is left out of this run (--precision fp32 bf16 runs it)"))
    for size, s in SIZES.items():
        if size in args.size:
            print(f"  {size}: d_model {s['d']}, {s['layers']} layers, {s['heads']} heads (Llama: {s['heads'] // 2} kv heads)")
    print(f"{'model':<18} {'size':<7} {'prec':<5} {'HF attn':<8} {'camplib tok/s':>13} {'HF tok/s':>9} {'ratio':>6}"
          f"  {'mm+attn share':>13} {'ceiling':>7}  first losses")
    ratios, ceilings, our_shares = [], [], []
    for family in args.family:
        for size in args.size:
            for precision in precisions:
                for attn in args.attn:
                    res = run_config(family, size, precision, attn, data, args, device)
                    res["attention"] = attention_chosen(args, device, precision)
                    ratios.append(res["ratio"])
                    name = "GPT2LMHeadModel" if family == "gpt2" else "LlamaForCausalLM"
                    sh = res["shares"]
                    share = f"{sh['camplib']:.2f} / {sh['transformers']:.2f}" if sh else "-"
                    ceiling = f"{res['ratio'] / sh['camplib']:.2f}" if sh else "-"
                    if sh:
                        ceilings.append(res["ratio"] / sh["camplib"])
                        our_shares.append(sh["camplib"])
                    print(f"{name:<18} {size:<7} {precision:<5} {attn:<8} {res['med']['camplib']:13.0f} "
                          f"{res['med']['transformers']:9.0f} {res['ratio']:6.2f}  {share:>13} {ceiling:>7}  "
                          f"{res['losses']['camplib']:.4f} / {res['losses']['transformers']:.4f}  "
                          f"[camplib attention: {res['attention']}]", flush=True)
                    if args.ops and res["others"]:
                        top = sorted((r for r in res["others"] if r.name not in METADATA_OPS),
                                     key=lambda r: r.self_ms, reverse=True)[:args.ops]
                        how = ("profiler self time, wall clock; 'compiled graph': the fused kernels" if args.compile
                               or device.type != "cpu" else "CPU time")
                        print(f"    camplib outside mm+attn, of a {res['step_ms']:.1f} ms step (CPU time) ({how}): " + ", ".join(
                            f"{op_label(r.name)} {r.self_ms:.2f} ms" for r in top), flush=True)
                        if not args.compile and device.type == "cpu":
                            print("    " + remainder(res["profiled"]), flush=True)
    print(f"lowest ratio camplib / transformers: {min(ratios):.2f} (goal >= {goal}); {load()}")
    if ceilings:
        print(f"mm+attn share: the fraction of a profiled step in matrix products and attention (camplib / HF), "
              f"the same kernels on both sides; ceiling = ratio / camplib's share, the ratio if everything else "
              f"cost nothing. Lowest ceiling: {min(ceilings):.2f}")
        print(f"lowest camplib mm+attn share: {min(our_shares):.2f} (goal >= {args.share_goal})")
    met = min(ratios) >= goal and (not our_shares or min(our_shares) >= args.share_goal)
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
