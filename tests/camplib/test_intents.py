"""camplib.intents: the a06 data set is deterministic, balanced, has the brief's size (>= 12
intents, >= 24 phrasings each), carries real users' noise, and its held-out split shares no
phrasing, product, time or extra clause with training (so held-out accuracy measures
generalisation, not memory)."""
import difflib
import random
import re

import pytest
import torch

from camplib.intents import INTENTS, add_noise, make_intent_dataset, phrasings
from camplib.intents import data as intent_data
from camplib.intents.more_phrasings import MORE_PHRASINGS, MORE_PRODUCTS, MORE_WHEN
from camplib.intents.templates import TEMPLATES


def _words(text):
    return set(re.findall(r"[a-z']+", text.lower().replace("{product}", "").replace("{order}", "").replace("{when}", "")))


def _char_counts(texts):
    """(len(texts), 256) counts of each character code (Latin-1) in each text."""
    counts = torch.zeros(len(texts), 256, dtype=torch.float64)
    for i, text in enumerate(texts):
        counts[i] += torch.bincount(torch.tensor(list(text.encode("latin-1"))), minlength=256)
    return counts


def _quick_ratios(text, counts):
    """difflib.SequenceMatcher(None, other, text).quick_ratio() for every row of `counts` (the
    characters both share, as a multiset, over their mean length), an upper bound on ratio()."""
    own = _char_counts([text])
    return 2 * torch.minimum(counts, own).sum(1) / (counts.sum(1) + own.sum())


def _pieces(template):
    """The fixed words of a template, between its slots (lower case)."""
    return [p.strip() for p in re.split(r"{\w+}", template.lower()) if len(p.strip()) > 3]


def test_deterministic_balanced_and_labelled():
    a, b = make_intent_dataset(10, 5, seed=3), make_intent_dataset(10, 5, seed=3)
    assert a == b, "same seed, different data"
    assert make_intent_dataset(10, 5, seed=4)["train"] != a["train"], "the seed changes nothing"
    assert a["intents"] == INTENTS
    for split, n in (("train", 10), ("test", 5)):
        texts, labels = a[split]
        assert len(texts) == len(labels) == n * len(INTENTS), (split, len(texts))
        assert all(labels.count(k) == n for k in range(len(INTENTS))), (split, labels)
        assert all(isinstance(t, str) and t.strip() for t in texts)


def test_the_briefs_size_and_distinct_phrasings():
    assert len(INTENTS) >= 12
    every = [t for ts in TEMPLATES.values() for t in ts]
    assert len(every) == len(set(t.lower() for t in every)), "a phrasing is written twice"
    for intent in INTENTS:
        train, held = phrasings(intent), phrasings(intent, held_out=True)
        assert len(train) + len(held) >= 24 and len(held) >= 6, (intent, len(train), len(held))
        assert not set(train) & set(held)
        for t in train + held:
            assert set(re.findall(r"{(\w+)}", t)) <= {"product", "order", "when"}, t     # p02 fills these three
        # a held-out phrasing is new wording, not a training one with a word swapped
        for h in held:
            closest = max(len(_words(h) & _words(t)) / len(_words(h) | _words(t)) for t in train)
            assert closest < 0.75, (intent, h, closest)


def test_held_out_shares_no_sentence_slot_value_or_clause_with_training():
    d = make_intent_dataset(48, 24, seed=0)
    train, test = d["train"][0], d["test"][0]
    assert not set(t.lower() for t in train) & set(t.lower() for t in test), "a held-out sentence is in training"
    train_products, test_products = intent_data._PRODUCTS
    assert not set(train_products) & set(test_products) and not set(intent_data._WHEN[0]) & set(intent_data._WHEN[1])
    low = [t.lower() for t in test]
    assert not any(p in t for t in low for p in train_products if not any(p in q for q in test_products)), \
        "a held-out sentence names a training product"
    assert any(p in t for t in low for p in test_products)
    # with no noise, each held-out request contains one held-out phrasing's fixed words and no training one's
    clean = make_intent_dataset(18, 6, seed=1, noise=0.0)
    for text, label in zip(*clean["test"]):
        fits = [t for t in phrasings(INTENTS[label], True) if all(p in text.lower() for p in _pieces(t))]
        assert fits, text
    for text, label in zip(*clean["train"]):
        assert not any(all(p in text.lower() for p in _pieces(t)) for t in phrasings(INTENTS[label], True)
                       if len(" ".join(_pieces(t))) > 12), text


def test_real_users_noise_is_there():
    d = make_intent_dataset(48, 24, seed=0)
    texts = d["train"][0] + d["test"][0]
    lower = sum(t == t.lower() and any(c.isalpha() for c in t) for t in texts) / len(texts)
    unpunctuated = sum(not re.search(r"[?!.,']", t) for t in texts) / len(texts)
    assert 0.1 < lower < 0.6 and unpunctuated > 0.1, (lower, unpunctuated)
    joined = [t for t in texts if any(j.strip(" ,.") and j in t for j in intent_data._JOIN[:2])]
    assert len(joined) > 0.02 * len(texts), len(joined)
    clean = make_intent_dataset(18, 6, seed=0, noise=0.0)
    assert not any(j in t for t in clean["train"][0] for j in (", and also ", ". oh and ")), "noise=0 still joins requests"
    rng = random.Random(0)
    typos = [add_noise("please refund the coffee machine yesterday", rng) for _ in range(200)]
    assert any(("refund" not in t and "refnud" in t) or "machnie" in t or "yesterady" in t or "pleas " in t
               or len(t.replace(" ", "")) != len("pleaserefundthecoffeemachineyesterday") for t in typos)


def test_bad_sizes_are_rejected():
    with pytest.raises(ValueError, match="n_train_per_intent"):
        make_intent_dataset(0, 5)
    with pytest.raises(ValueError, match="noise"):
        make_intent_dataset(5, 5, noise=1.5)
    with pytest.raises(ValueError, match="unknown intent"):
        phrasings("teleport")


def test_more_phrasings_widen_training_only_and_copy_no_held_out_wording():
    """camplib.intents.more_phrasings (a06's recipe trains on them): 48 new phrasings per intent,
    none a held-out phrasing of any intent, nor a near copy (word overlap or characters), nor
    naming a held-out product or time; the held-out split stays the same request for request."""
    held_words = [(h.lower(), _words(h)) for intent in INTENTS for h in phrasings(intent, held_out=True)]
    held_counts = _char_counts([h for h, _ in held_words])
    every = {t.lower() for ts in TEMPLATES.values() for t in ts}
    held_slots = [*intent_data._PRODUCTS[1], *intent_data._WHEN[1]]
    for intent in INTENTS:
        more = MORE_PHRASINGS[intent]
        assert len(more) == 48 and len({t.lower() for t in more}) == 48, intent
        assert phrasings(intent, held_out=True, more=True) == phrasings(intent, held_out=True)
        assert phrasings(intent, more=True) == phrasings(intent) + more
        for t in more:
            assert t.lower() not in every, t
            assert set(re.findall(r"{(\w+)}", t)) <= {"product", "order", "when"}, t
            assert not any(re.search(rf"\b{s.lower()}\b", t.lower()) for s in held_slots), t
            chars, words = difflib.SequenceMatcher(None, "", t.lower()), _words(t)   # t's counts made once
            bound = _quick_ratios(t.lower(), held_counts)                           # difflib's quick_ratio, all at once
            for (h, h_words), quick in zip(held_words, bound.tolist()):
                overlap = len(words & h_words) / len(words | h_words)
                chars.set_seq1(h)
                similar = quick >= 0.75 and chars.ratio() >= 0.75
                assert overlap < 0.5 and not similar, (t, h, round(overlap, 2), round(chars.ratio(), 2))
    for extra in (*MORE_PRODUCTS, *MORE_WHEN):                # its slot values: no held-out one, nor one inside
        assert not any(s.lower() in extra.lower() or extra.lower() in s.lower() for s in held_slots), extra
    plain, wide = make_intent_dataset(48, 24, seed=3), make_intent_dataset(48, 24, seed=3, more_phrasings=True)
    assert wide["test"] == plain["test"] and wide["train"] != plain["train"]
    assert any(p in " ".join(wide["train"][0]) for p in MORE_PRODUCTS)
    paired = make_intent_dataset(48, 24, seed=3, more_phrasings=True, two_requests=1.0)   # more second requests
    assert paired["test"] == plain["test"] and paired["train"] != wide["train"]
    clean = make_intent_dataset(42, 6, seed=1, noise=0.0, more_phrasings=True)
    pieces = {intent: [(t, _pieces(t)) for t in ts] for intent, ts in MORE_PHRASINGS.items()}
    used = {t for text, label in zip(*clean["train"]) for t, ps in pieces[INTENTS[label]]
            if ps and all(p in text.lower() for p in ps)}
    assert len(used) > 200, len(used)                          # the new wording is in training
    for text, label in zip(*clean["train"]):
        assert not any(all(p in text.lower() for p in _pieces(t)) for t in phrasings(INTENTS[label], True)
                       if len(" ".join(_pieces(t))) > 12), text
