"""The completers' stopping rules, token healing, and the n-gram's greedy step (the brute-force
argmax over the whole vocabulary)."""
import torch

from camplib.codegen.baselines import NgramModel
from camplib.codegen.completers import _heal, bpe_completer, finished, ngram_completer
from camplib.codegen.sentinels import SPECIAL_TOKENS
from camplib.model import GPT, GPTConfig
from camplib.tokenizer import ByteBPE


def test_finished():
    assert finished("    return x\n", line=True) and not finished("    return x", line=True)
    assert not finished("    x = 1\n\n    return x\n", line=False)
    assert finished("    return x\ndef g", line=False) and finished("    return x\n\nprint(", line=False)


def test_heal_moves_the_final_newline():
    prompt, healed = _heal("def f():\n")
    assert prompt == "def f():" and healed("\n    return 1") == "    return 1" and healed("x") == "x"
    prompt, healed = _heal("x = ")
    assert prompt == "x = " and healed("\n1") == "\n1"


def test_ngram_greedy_is_the_argmax():
    g = torch.Generator().manual_seed(0)
    streams = [torch.randint(0, 12, (60,), generator=g).tolist() for _ in range(6)]
    model = NgramModel(3, vocab_size=16).fit(streams)
    for context in ([], [3], [3, 5], [15, 15], [1, 2, 3, 4]):
        best = max(range(16), key=lambda t: (model.prob(context, t), -t))
        assert model.prob(context, model.most_likely(context)) == model.prob(context, best), context


def test_completers_stop_where_they_should():
    bpe = ByteBPE.train(["def f(x):\n    return x + 1\n" * 20], 300, special_tokens=SPECIAL_TOKENS)
    torch.manual_seed(0)
    model = GPT(GPTConfig.llama_style(vocab_size=bpe.vocab_size, d_model=32, n_layer=1, n_head=2, n_kv_head=1,
                                      max_seq_len=256)).eval()
    ngram = NgramModel(3, bpe.vocab_size).fit([bpe.encode("def f(x):\n    return x + 1\n" * 20)])
    for complete in (bpe_completer(model, bpe), ngram_completer(ngram, bpe)):
        for suffix in (None, "\n"):   # left to right, FIM
            line = complete("def f(x):\n", suffix, line=True, max_new_tokens=30)
            assert "\n" not in line, repr(line)
    body = ngram_completer(ngram, bpe)("def f(x):\n", line=False, max_new_tokens=40)
    assert body.startswith("    return x + 1\n"), repr(body)


def test_batched_completions_equal_one_by_one():
    """complete.many pads prompts of different lengths on the left, in batches: each text must be
    the one the prompt gets alone (FIM and left to right, line and function mode)."""
    text = "def f(x):\n    y = x * 2\n    return y + 1\n\n\ndef g(a, b):\n    return a - b\n" * 6
    bpe = ByteBPE.train([text], 320, special_tokens=SPECIAL_TOKENS)
    torch.manual_seed(1)
    model = GPT(GPTConfig.llama_style(vocab_size=bpe.vocab_size, d_model=32, n_layer=2, n_head=2, n_kv_head=1,
                                      max_seq_len=256)).eval()
    complete = bpe_completer(model, bpe)
    items = [("def f(x):\n", "\n    return y + 1\n"), ("def g(a, b):\n    return", None), ("x", "\n"),
             ("def f(x):\n    y = x * 2\n", None), ("def g(a, b):\n", "\n"), ("d", None)]
    for line in (True, False):
        alone = [complete(p, s, line=line, max_new_tokens=12) for p, s in items]
        assert complete.many(items, line=line, max_new_tokens=12, batch_size=4) == alone, line
    assert len({complete(p, s, line=False, max_new_tokens=12) for p, s in items}) > 1   # not all the same text
