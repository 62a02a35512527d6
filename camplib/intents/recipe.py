"""a06's full-profile recipe: the settings that train the best intent classifier in a few CPU-minutes.

    clf, losses = train_recipe(train_texts, train_labels, intents)   # RECIPE's settings
    clf.predict(["cancel my order and also where is my invoice"])

Chosen on a validation split carved from the *training* side only (benchmarks/a06_lora_settings.py:
every sixth training phrasing, some training products, times and clauses held back), never on the
held-out split; the README quotes what it reaches on held-out requests. What each piece is for:

- `extra_per_intent` more requests drawn from the training side with another seed: new products,
  order numbers, noise and second requests, and, with `more_phrasings`, camplib.intents.more_phrasings'
  48 more phrasings per intent besides the data set's 18, and its 20 more products and 8 more times
  (no held-out wording or slot value: the test of tests/camplib/test_intents.py). Validation (seed 0):
  0.885 without them, 0.903 with the first 24 more phrasings, 0.917 with 48 and the products, 0.924
  with 192 extra requests instead of 96;
- `two_requests`: the probability that a noisy extra request carries a second request of another
  intent (the data set's is 0.3: 15% of requests). Two-request messages, where the first decides,
  were the validation split's weakest kind (0.755 of 53 against 0.953 for one request); at 1.0 (half
  of the extra requests) they reach 0.849 and validation 0.927 (0.903 with 96 extra requests);
- the top `top` layers' weights train, the ones below stay frozen (fine_tune runs them once per
  text, so a step costs the top layers only), after the linear probe (LP-FT);
- the pooling: the mean of the token states. Attention pooling (camplib.intents.pooling), which
  can learn where the deciding request is (with two requests in one message the first decides),
  was tried in its place: validation 0.878 against the mean's 0.885 (2 requests of 288, seed 0),
  so the mean stays; `pooling="attention"` runs it;
- label smoothing, warmup and cosine decay against memorising 2,880 requests (training loss
  would fall to 0.000 without them).
"""
from __future__ import annotations

from camplib.intents.classifier import IntentClassifier, fine_tune, fit_probe, load_minilm
from camplib.intents.data import make_intent_dataset

__all__ = ["RECIPE", "recipe_training_set", "train_recipe"]

RECIPE = {"extra_per_intent": 192, "more_phrasings": True, "top": 2, "pooling": "mean", "steps": 300, "batch_size": 32, "lr": 2e-4,
          "head_lr": 3e-3, "label_smoothing": 0.1, "warmup": 30, "cosine": True,
          "two_requests": 1.0}


def recipe_training_set(texts: list[str], labels: list[int], extra_per_intent: int, seed: int = 0,
                        more_phrasings: bool = False, two_requests: float = 0.3):
    """The training requests plus `extra_per_intent` more per intent from the training side of
    camplib.intents (seed + 1000: new slot values and noise, never a held-out phrasing; with
    `more_phrasings`, drawn from camplib.intents.more_phrasings' wording too)."""
    if extra_per_intent <= 0:
        return list(texts), list(labels)
    more_texts, more_labels = make_intent_dataset(extra_per_intent, 0, seed=seed + 1000,
                                                  more_phrasings=more_phrasings, two_requests=two_requests)["train"]
    return list(texts) + more_texts, list(labels) + more_labels


def train_recipe(texts: list[str], labels: list[int], intents: list[str], *, layers: int = 6, device: str = "cpu",
                 seed: int = 0, **overrides) -> tuple[IntentClassifier, list[float]]:
    """A MiniLM classifier (its first `layers` layers) trained with RECIPE (`overrides` replace its
    entries): probe, then the top layers, the pooling (if it learns) and the head; (classifier in eval mode,
    each step's loss)."""
    unknown = sorted(set(overrides) - set(RECIPE))
    if unknown:
        raise ValueError(f"not a setting of the recipe: {unknown}; it has {sorted(RECIPE)}")
    s = {**RECIPE, **overrides}
    texts, labels = recipe_training_set(texts, labels, s["extra_per_intent"], seed, s["more_phrasings"],
                                        s["two_requests"])
    clf = IntentClassifier(*load_minilm(layers, device), intents, pooling=s["pooling"])
    for p in clf.encoder.parameters():
        p.requires_grad_(False)
    fit_probe(clf, texts, labels, seed=seed)
    for p in clf.encoder.encoder.layer[max(0, layers - s["top"]):].parameters():
        p.requires_grad_(True)
    losses = fine_tune(clf, texts, labels, s["steps"], s["batch_size"], s["lr"], s["head_lr"], seed=seed,
                       label_smoothing=s["label_smoothing"], warmup=s["warmup"], cosine=s["cosine"])
    return clf.eval(), losses
