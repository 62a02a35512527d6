"""A labelled data set for intent classification of an online shop's help desk (lab a06).

Written by the project (no public intent data set installs offline): 12 intents, 24 hand-written
phrasings each (camplib.intents.templates) with slots (product, order number, time) filled at
random from a seeded generator. Real users do not type like templates, so most requests also get
some of the noise of real messages:

- case and punctuation: all lower case, no punctuation, a capital only at the start;
- typos: a letter swapped with its neighbour, dropped or doubled in one or two words;
- extra clauses: "sorry to bother you, ...", "... I need it before the weekend";
- two requests in one message, "... and also ...": the **first** request decides the label
  (the second is drawn from another intent).

The held-out split is honest: its phrasings (every fourth template of each intent), its slot
values (products, times) and its extra clauses never appear in training, so a model must
recognise the intent in new wording, not memorise sentences. Typos and case are drawn the same
way in both splits (they are noise, not wording).
"""
from __future__ import annotations

import random
import re

from camplib.intents.more_phrasings import MORE_PHRASINGS, MORE_PRODUCTS, MORE_WHEN
from camplib.intents.templates import TEMPLATES

__all__ = ["INTENTS", "make_intent_dataset", "phrasings", "products", "add_noise"]

INTENTS: list[str] = list(TEMPLATES)

_PRODUCTS = (["blender", "laptop", "jacket", "phone case", "coffee machine", "desk lamp", "backpack",
              "headphones", "sofa", "kettle", "toaster", "printer", "scarf", "camera"],
             ["tent", "monitor", "sneakers", "vacuum cleaner", "watch", "bicycle helmet", "air fryer"])
_WHEN = (["yesterday", "last week", "on Monday", "two days ago", "on Friday", "this weekend"],
         ["this morning", "last month", "on Tuesday", "three weeks ago"])
# extra clauses, split like the phrasings (every fourth held out)
_BEFORE = ["sorry to bother you, ", "quick question: ", "I've been a customer for years and ",
           "hi there, I hope you can help, ", "this is urgent: ", "my husband ordered it but ",
           "I already wrote twice, ", "good evening, ", "listen, ", "ok so ", "hello again, ",
           "I'm writing on behalf of my mum, "]
_AFTER = [", I need it before the weekend", " - this is really annoying", ", thanks in advance",
          " because I'm going on holiday", ", please answer quickly", ", it was a gift",
          " and I'm not happy about it", " (I ordered on the website)", ", can you help",
          " as soon as possible", ", this is the third time", " lol"]
_JOIN = [", and also ", ". also ", " and ", ". oh and ", ", plus ", ". by the way "]
_OPEN = ["", "", "", "hi, ", "hello, ", "hey, ", "good morning, "]
_CLOSE = ["", "", "", " thanks", " please", "!", "?", " asap"]


def _split(items: list, held_out: bool) -> list:
    return [t for i, t in enumerate(items) if (i % 4 == 3) == held_out]


def phrasings(intent: str, held_out: bool = False, more: bool = False) -> list[str]:
    """The request templates of `intent` ({product}, {order}, {when} slots) in one split: every
    fourth is held out. With `more`, the training side also gets camplib.intents.more_phrasings'
    24 (the held-out side never does). Public so that other data sets (p02's dialogues) reuse
    the wording."""
    if intent not in TEMPLATES:
        raise ValueError(f"unknown intent {intent!r}; known: {INTENTS}")
    return _split(TEMPLATES[intent], held_out) + (MORE_PHRASINGS[intent] if more and not held_out else [])


def products(held_out: bool = False) -> list[str]:
    """The product names of one split (held-out products never appear in training)."""
    return list(_PRODUCTS[1 if held_out else 0])


def _typo(word: str, rng: random.Random) -> str:
    i = rng.randrange(1, len(word) - 1)
    kind = rng.randrange(3)
    if kind == 0:                                              # swap with the next letter
        return word[:i] + word[i + 1] + word[i] + word[i + 2:]
    if kind == 1:                                              # drop a letter
        return word[:i] + word[i + 1:]
    return word[:i] + word[i] + word[i:]                       # double a letter


def add_noise(text: str, rng: random.Random) -> str:
    """Case, punctuation and typos as people type them (each with some probability)."""
    if rng.random() < 0.3:                                     # typos in one or two longer words
        words = text.split(" ")
        long = [i for i, w in enumerate(words) if len(w) >= 5 and w.isalpha()]
        for i in rng.sample(long, min(len(long), rng.choice([1, 2]))):
            words[i] = _typo(words[i], rng)
        text = " ".join(words)
    if rng.random() < 0.3:
        text = re.sub(r"[?!.,;:'()\-]", "", text)
        text = re.sub(r"\s+", " ", text).strip()
    roll = rng.random()
    if roll < 0.35:
        return text.lower()
    return text[:1].upper() + text[1:] if roll < 0.7 else text


def _fill(template: str, rng: random.Random, held_out: bool, more: bool = False) -> str:
    pick = 1 if held_out else 0
    wide = more and not held_out                               # more_phrasings' products and times: training only
    return template.format(product=rng.choice(_PRODUCTS[pick] + (MORE_PRODUCTS if wide else [])),
                           when=rng.choice(_WHEN[pick] + (MORE_WHEN if wide else [])),
                           order=f"#{rng.randrange(10000, 99999)}")


def _request(intent: str, template: str, rng: random.Random, held_out: bool, noise: float, more: bool = False,
             two: float = 0.3) -> str:
    text = _fill(template, rng, held_out, more)
    if rng.random() < noise:
        if rng.random() < two:                                 # two requests: the first decides
            other = rng.choice([i for i in INTENTS if i != intent])
            text += rng.choice(_JOIN) + _fill(rng.choice(phrasings(other, held_out, more)), rng, held_out, more)
        if rng.random() < 0.3:
            text = rng.choice(_split(_BEFORE, held_out)) + text
        if rng.random() < 0.3:
            text += rng.choice(_split(_AFTER, held_out))
        text = add_noise(text, rng)
    else:                                                      # tidy: a greeting or sign-off now and then
        text = rng.choice(_OPEN) + text + rng.choice(_CLOSE)
        text = text[:1].upper() + text[1:] if rng.random() < 0.5 else text
    return text


def make_intent_dataset(n_train_per_intent: int = 40, n_test_per_intent: int = 20, seed: int = 0,
                        noise: float = 0.5, more_phrasings: bool = False, two_requests: float = 0.3) -> dict:
    """{"train": (texts, labels), "test": (texts, labels), "intents": names}; labels are
    indices into `intents`. A fraction `noise` of the requests get real users' noise (module
    docstring). Deterministic for a given seed; train and test share no phrasing, slot value or
    extra clause. Each split cycles through its phrasings, so n_train_per_intent >= 18 uses every
    training phrasing and n_test_per_intent >= 6 every held-out one. `more_phrasings` draws the
    training requests from camplib.intents.more_phrasings' 48 per intent as well (66 phrasings, and
    its products and times);
    the held-out requests are those of `more_phrasings=False`, request for request.
    `two_requests`: the probability that a noisy request carries a second request (0.3: 15% of
    all requests at noise 0.5); a training set may ask for more, the held-out split keeps 0.3."""
    if n_train_per_intent < 1 or n_test_per_intent < 0:
        raise ValueError(f"need n_train_per_intent >= 1 and n_test_per_intent >= 0, "
                         f"got {n_train_per_intent}, {n_test_per_intent}")
    if not (0.0 <= noise <= 1.0 and 0.0 <= two_requests <= 1.0):
        raise ValueError(f"noise and two_requests are probabilities, got {noise}, {two_requests}")
    out = _draw(n_train_per_intent, n_test_per_intent, seed, noise, False)
    if more_phrasings or two_requests != 0.3:                  # the same held-out split, a wider training side
        out["train"] = _draw(n_train_per_intent, 0, seed, noise, more_phrasings, two_requests)["train"]
    return out


def _draw(n_train_per_intent: int, n_test_per_intent: int, seed: int, noise: float, more: bool,
          two: float = 0.3) -> dict:
    rng = random.Random(seed)
    splits = {"train": ([], []), "test": ([], [])}
    for label, intent in enumerate(INTENTS):
        for split, n in (("train", n_train_per_intent), ("test", n_test_per_intent)):
            held_out = split == "test"
            pool = phrasings(intent, held_out, more)
            start = rng.randrange(len(pool))                   # small sizes do not always get the first ones
            for k in range(n):
                splits[split][0].append(_request(intent, pool[(start + k) % len(pool)], rng, held_out, noise, more,
                                                   two if split == "train" else 0.3))
                splits[split][1].append(label)
    for texts, labels in splits.values():                     # shuffle each split, pairs together
        order = list(range(len(texts)))
        rng.shuffle(order)
        texts[:], labels[:] = [texts[i] for i in order], [labels[i] for i in order]
    return {"train": splits["train"], "test": splits["test"], "intents": list(INTENTS)}
