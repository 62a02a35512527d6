"""FIM: the PSM layout, its inverse, the share of documents transformed, and the sentinels as single ids."""
import random

import pytest

from camplib.codegen.corpus import SPECIAL_TOKENS, train_tokenizer
from camplib.codegen.fim import FIM_MIDDLE, FIM_PREFIX, FIM_SUFFIX, apply_fim, fim_parts, fim_prompt, fim_split


def test_psm_order_and_inverse():
    text = "def add(a, b):\n    return a + b\n"
    out = fim_split(text, 15, 26)
    assert out == f"{FIM_PREFIX}def add(a, b):\n{FIM_SUFFIX}a + b\n{FIM_MIDDLE}    return ", out
    prefix, middle, suffix = fim_parts(out)
    assert (prefix, middle, suffix) == (text[:15], text[15:26], text[26:])
    assert fim_split(text, 0, 0) == f"{FIM_PREFIX}{FIM_SUFFIX}{text}{FIM_MIDDLE}"
    assert fim_prompt("a", "c") == f"{FIM_PREFIX}a{FIM_SUFFIX}c{FIM_MIDDLE}"


@pytest.mark.parametrize("start, end", [(-1, 2), (3, 2), (0, 99)])
def test_bad_cuts_are_refused(start, end):
    with pytest.raises(ValueError, match="start"):
        fim_split("abcdef", start, end)


@pytest.mark.parametrize("bad", ["plain text", f"{FIM_SUFFIX}a{FIM_PREFIX}b{FIM_MIDDLE}c",
                                 f"{FIM_PREFIX}a{FIM_MIDDLE}b{FIM_SUFFIX}c", f"{FIM_PREFIX}a{FIM_SUFFIX}{FIM_SUFFIX}b{FIM_MIDDLE}"])
def test_fim_parts_refuses_malformed_examples(bad):
    with pytest.raises(ValueError):
        fim_parts(bad)


def test_apply_fim_rate_determinism_and_round_trip():
    rng = random.Random(1)
    docs = ["".join(rng.choice("ab \n") for _ in range(rng.randint(0, 30))) for _ in range(2000)]
    out = apply_fim(docs, 0.5, seed=3)
    assert out == apply_fim(docs, 0.5, seed=3), "same seed, same output"
    transformed = [o for o in out if o.startswith(FIM_PREFIX)]
    assert 0.45 < len(transformed) / len(docs) < 0.55, len(transformed)   # binomial sd 0.011
    for doc, o in zip(docs, out):
        if o.startswith(FIM_PREFIX):
            p, m, s = fim_parts(o)
            assert p + m + s == doc
        else:
            assert o == doc
    assert apply_fim(docs, 0.0, 0) == docs
    assert all(o.startswith(FIM_PREFIX) for o in apply_fim(docs, 1.0, 0))
    with pytest.raises(ValueError, match="rate"):
        apply_fim(docs, 1.5, 0)


def test_sentinels_are_single_ids_never_merged_into_text():
    bpe = train_tokenizer(["def f(x):\n    return x\n" * 20, "import os\n"], 280)
    assert list(bpe.special_tokens) == list(SPECIAL_TOKENS) and bpe.vocab_size == 280
    ids = bpe.encode(fim_split("def f(x):\n    return x\n", 4, 9))
    assert [i for i in ids if i >= 280 - 4] == [bpe.special_tokens[t] for t in (FIM_PREFIX, FIM_SUFFIX, FIM_MIDDLE)]
    assert bpe.decode(ids) == fim_split("def f(x):\n    return x\n", 4, 9)
