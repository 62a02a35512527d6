"""What a FIM LoRA adapter writes first in SPM order: the first token's top 3 and the truth's
probability, and p(end of text | a bare newline first), on held-out stdlib lines inside indented
blocks (the validation cuts of humaneval_passk.py --val-lines: fim_tune.validation_cuts; never
HumanEval). It showed why the SPM adapters wrote empty lines: the answer is
"\\n" + line + "\\n" + <|endoftext|>, and SmolLM2's BPE writes the first newline with the next
line's indentation as one token ("ĊĠĠĠ"), so a bare "Ċ" is only ever the answer's *last* token
in training and is followed by the end of text. An adapter that puts mass on "Ċ" at the end of
the prefix (where SPM's seamless prefix looks like the end of a written line) stops at once.

    python benchmarks/fim_first_token.py [--dir runs/humaneval_fim_spm_indented] [--lines 6] 0 30 100
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from camplib.codegen.corpus import load_corpus  # noqa: E402
from benchmarks.humaneval_passk import FIM_CORPUS  # noqa: E402
from camplib.codegen.fim_tune import fim_answer_ids, fim_prompt_ids, fim_tokens, validation_cuts  # noqa: E402
from camplib.gguf import load_gguf_llama, read_gguf, smollm2_path, tokenizer_from_gguf  # noqa: E402
from camplib.lora import load_adapter  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("steps", nargs="+", help="adapter budgets under --dir (0: the shipped model)")
    ap.add_argument("--dir", default="runs/humaneval_fim_spm_indented")
    ap.add_argument("--lines", type=int, default=6)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    f = read_gguf(smollm2_path())
    tok = tokenizer_from_gguf(f)
    cuts = validation_cuts(load_corpus(**FIM_CORPUS).val, args.lines)
    eot, bare = fim_tokens(tok)[3], tok.convert_tokens_to_ids("Ċ")
    for steps in args.steps:
        model = load_gguf_llama(f, device="cpu")
        if steps != "0":
            load_adapter(model, f"{args.dir}/steps_{steps}")
        model.eval()
        print(f"{'shipped model' if steps == '0' else f'{args.dir}/steps_{steps}'} (SPM prompt):")
        with torch.no_grad():
            for prefix, middle, suffix in cuts:
                ids = fim_prompt_ids(tok, prefix, suffix, order="spm")
                p = torch.softmax(model(torch.tensor([ids]))[0][0, -1].float(), -1)
                after = torch.softmax(model(torch.tensor([ids + [bare]]))[0][0, -1].float(), -1)[eot]
                truth = fim_answer_ids(tok, prefix, middle, order="spm", end="eot")[0]   # the trained answer's first token
                top = torch.topk(p, 3)
                print(f"  truth's first {tok.convert_ids_to_tokens(truth)!r} p {float(p[truth]):.2f}; top 3 "
                      + ", ".join(f"{tok.convert_ids_to_tokens(int(i))!r} {float(v):.2f}"
                                  for v, i in zip(top.values, top.indices))
                      + f"; p(end of text | bare 'Ċ' first) {float(after):.2f}", flush=True)


if __name__ == "__main__":
    main()
