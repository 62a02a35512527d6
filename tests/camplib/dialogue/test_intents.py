"""camplib.dialogue.intents: the intent of a user turn scored by a dialogue model. Its scores are
the model's own log-probabilities of 'intent: <name>;' after the prompt (checked against the
whole answer tokenized at once and scored position by position), normalised over the intents."""
import pytest
import torch

from camplib.dialogue.base import load_base
from camplib.dialogue.data import INTENTS
from camplib.dialogue.intents import intent_scores, intents_per_turn, predict_intents
from camplib.dialogue.template import render


@pytest.fixture(scope="module")
def base():
    return load_base("tiny", pretrain_steps=0)


def test_scores_are_the_models_probabilities_of_each_whole_answer(base):
    model, tok = base.model, base.tokenizer
    history = [{"role": "user", "content": "where is my order 482?"}]
    prompt = render(history, add_generation_prompt=True)[0]
    logps = []
    for name in INTENTS:
        full = tok.encode(prompt + f"intent: {name};")
        n_prompt = len(tok.encode(prompt + "intent:"))
        assert full[:n_prompt] == tok.encode(prompt + "intent:"), "the name's tokens do not start a new word"
        with torch.no_grad():
            logp = model(torch.tensor([full]))[0].double().log_softmax(-1)[0]
        logps.append(sum(logp[t - 1, full[t]] for t in range(n_prompt, len(full))))
    want = torch.stack(logps).softmax(-1).float()
    got = intent_scores(model, tok, [history, history])
    torch.testing.assert_close(got, torch.stack([want, want]), atol=1e-5, rtol=1e-4)
    (intent, confidence), = predict_intents(model, tok, ["where is my order 482?"])
    assert intent == INTENTS[int(want.argmax())] and confidence == pytest.approx(float(want.max()), abs=1e-5)
    assert predict_intents(model, tok, []) == []
    with pytest.raises(TypeError):
        predict_intents(model, tok, "one string")


def test_intents_per_turn_keeps_the_models_answers(base):
    turns = intents_per_turn(base.model, base.tokenizer, ["where is my order?", "it's 482"], max_new_tokens=4)
    assert len(turns) == 2 and all(t["intent"] in INTENTS and 0 < t["confidence"] <= 1 for t in turns)
    assert all(isinstance(t["answer"], str) for t in turns)
