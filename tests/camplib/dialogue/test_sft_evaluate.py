"""LoRA fine-tuning of the tiny base on the dialogue data, end to end: the masked loss falls,
held-out slot accuracy rises from 0, answers stop at <|im_end|>; the grading helper's LoRA
tensors rebuild the same model; scoring and the tokenizer conversion are exact."""
import copy
from dataclasses import asdict

import pytest
import torch

from camplib.dialogue.base import _tiny_bpe, load_base
from camplib.dialogue.chat_tokenizer import hf_from_bpe
from camplib.dialogue.data import SLOTS, make_dialogues
from camplib.dialogue.evaluate import assistant_turns, evaluate, score, score_turn
from camplib.dialogue.masking import encode_chat, masked_cross_entropy, pad_batch
from camplib.dialogue.sft import load_lora, sft_for_grading
from camplib.serving.loading import save_for_serving
from camplib.tokenizer import ByteBPE


def test_score_turn_and_per_turn_means():
    ref = "intent: refund; order: 12; product: sofa; address: -"
    assert score_turn(ref, ref) == {"exact": 1.0, "slots": 1.0, "right": dict.fromkeys(SLOTS, 1.0)}
    assert score_turn("intent: refund; order: 13; product: sofa; address: -", ref) == \
        {"exact": 0.0, "slots": 0.75, "right": {"intent": 1.0, "order": 0.0, "product": 1.0, "address": 1.0}}
    assert score_turn("nonsense", ref)["slots"] == 0.0
    turns = [{"turn": 1, "reference": ref, "conversation": 0}, {"turn": 2, "reference": ref, "conversation": 0}]
    s = score([{"text": ref, "stopped": True}, {"text": "x", "stopped": False}], turns)
    assert (s["exact_match"], s["slot_accuracy"], s["stopped"], s["intent_accuracy"]) == (0.5, 0.5, 0.5, 0.5)
    assert s["per_turn"] == {1: {"exact_match": 1.0, "slot_accuracy": 1.0, "intent_accuracy": 1.0, "n": 1},
                             2: {"exact_match": 0.0, "slot_accuracy": 0.0, "intent_accuracy": 0.0, "n": 1}}
    assert s["per_slot"] == dict.fromkeys(SLOTS, 0.5)
    assert s["breaks_at"] == {2: 1}, "the conversation's state first goes wrong in turn 2"
    wrong_intent = "intent: track_order; order: 12; product: sofa; address: -"
    s = score([{"text": wrong_intent, "stopped": True}, {"text": ref, "stopped": True}, {"text": ref, "stopped": True}],
              turns + [{"turn": 1, "reference": ref, "conversation": 1}])
    assert s["intent_accuracy"] == pytest.approx(2 / 3) and s["per_slot"]["order"] == 1.0
    assert s["breaks_at"] == {1: 1, "never": 1}
    with pytest.raises(ValueError):
        score([], [])


def test_assistant_turns_give_history_up_to_the_user():
    conv = make_dialogues(1, 0, seed=2)["train"][0]
    turns = assistant_turns([conv])
    assert [t["turn"] for t in turns] == list(range(1, len(conv) // 2 + 1))
    assert all(t["history"][-1]["role"] == "user" for t in turns)


@pytest.mark.parity
def test_hf_tokenizer_from_bpe_gives_the_same_ids():
    texts = [m["content"] for c in make_dialogues(30, 0, seed=1)["train"] for m in c] + ["x = {'a': 1}\n\tdef f(): pass  # é ✓"]
    bpe = ByteBPE.train(texts, 256 + 120, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    hf = hf_from_bpe(bpe)
    for t in texts + ["<|im_start|>user\nhi<|im_end|>\n"]:
        assert hf.encode(t, add_special_tokens=False) == bpe.encode(t), t
        assert hf.decode(bpe.encode(t)) == t


def test_load_base_from_a_camplib_checkpoint(tmp_path):
    base = load_base("tiny", pretrain_steps=0)
    path = save_for_serving(tmp_path / "p01.pt", base.model, _tiny_bpe(512, 20_000, 0, 300))   # p01's format
    loaded = load_base(str(path))
    x = torch.randint(0, base.tokenizer.vocab_size, (1, 12))
    assert torch.equal(loaded.model(x)[0], base.model(x)[0])
    assert loaded.tokenizer.encode("order 482<|im_end|>") == base.tokenizer.encode("order 482<|im_end|>")
    with pytest.raises(ValueError, match="tiny"):
        load_base("no/such/checkpoint.pt")


@pytest.mark.slow
def test_lora_sft_learns_the_task_and_stops_at_end_of_turn():
    base = load_base("tiny", pretrain_steps=10)
    tok = base.tokenizer
    data = make_dialogues(300, 30, seed=0)
    padded = pad_batch([encode_chat(c, tok.encode) for c in data["train"]], tok.pad_id)
    state = {k: v.clone() for k, v in base.model.state_dict().items()}
    args = dict(steps=100, batch_size=4, lr=1e-2, r=8, alpha=16.0, seed=0, train_embeddings=True)
    run = sft_for_grading(masked_cross_entropy, asdict(base.model.config), state, padded, **args)
    assert run["losses"][-1] < 0.3 * run["losses"][0], run["losses"]
    again = sft_for_grading(masked_cross_entropy, asdict(base.model.config), state, padded, **args)
    assert again["losses"] == run["losses"], "the same run is remembered"
    tuned = copy.deepcopy(base.model)
    load_lora(tuned, run["lora"], r=8, alpha=16.0)
    before = evaluate(base.model, tok, data["test"], max_new_tokens=32)
    after = evaluate(tuned, tok, data["test"], max_new_tokens=32)
    assert before["slot_accuracy"] == 0.0 and before["stopped"] == 0.0, before
    assert after["slot_accuracy"] >= 0.25, after["slot_accuracy"]
    assert after["stopped"] >= 0.9, after["stopped"]
    assert all(tok.decode([tok.eot_id]) not in p["text"] for p in after["predictions"])
    with pytest.raises(ValueError, match="do not fit"):
        load_lora(copy.deepcopy(base.model), {"x.lora_A": torch.zeros(1)}, r=8, alpha=16.0)
