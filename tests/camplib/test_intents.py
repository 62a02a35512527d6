"""camplib.intents: the a06 data set is deterministic, balanced, and its held-out split shares
no phrasing or product with training (so held-out accuracy measures generalisation)."""
import pytest

from camplib.intents import _PRODUCTS, INTENTS, make_intent_dataset


def test_deterministic_balanced_and_labelled():
    a, b = make_intent_dataset(10, 5, seed=3), make_intent_dataset(10, 5, seed=3)
    assert a == b, "same seed, different data"
    assert make_intent_dataset(10, 5, seed=4)["train"] != a["train"], "the seed changes nothing"
    assert a["intents"] == INTENTS and len(INTENTS) == 8
    for split, n in (("train", 10), ("test", 5)):
        texts, labels = a[split]
        assert len(texts) == len(labels) == n * len(INTENTS), (split, len(texts))
        assert sorted(set(labels)) == list(range(len(INTENTS))), split
        assert all(labels.count(k) == n for k in range(len(INTENTS))), (split, labels)
        assert all(isinstance(t, str) and t.strip() for t in texts)


def test_held_out_shares_no_sentence_or_product_with_training():
    d = make_intent_dataset(40, 20, seed=0)
    train, test = d["train"][0], d["test"][0]
    assert not set(t.lower() for t in train) & set(t.lower() for t in test), "a held-out sentence is in training"
    train_products, test_products = _PRODUCTS
    assert not any(p in t for t in test for p in train_products if p not in " ".join(test_products)), \
        "a held-out sentence names a training product"
    assert any(p in t for t in test for p in test_products)


def test_bad_sizes_are_rejected():
    with pytest.raises(ValueError, match="n_train_per_intent"):
        make_intent_dataset(0, 5)
