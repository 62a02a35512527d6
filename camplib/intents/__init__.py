"""Intent classification for an online shop's help desk (lab a06, reused by p02 and a08).

- `camplib.intents.data`: the data set (`make_intent_dataset`, `INTENTS`, `phrasings`,
  `products`), written by the project, with a held-out split disjoint in wording and slot values;
- `camplib.intents.classifier`: `IntentClassifier` (MiniLM + mean pooling + a Linear head) with
  `predict(texts) -> [(intent, confidence)]`, `load_minilm`, `fit_probe`, `fine_tune`, `report`;
- `camplib.intents.grading`: the fine-tuning run a lab's outcome test hands a student's LoRA.

The data set's names are re-exported here; the classifier (torch, transformers) is imported
only when asked for.
"""
from camplib.intents.data import INTENTS, add_noise, make_intent_dataset, phrasings, products

__all__ = ["INTENTS", "add_noise", "make_intent_dataset", "phrasings", "products"]
