"""Every ready lab through the real grader: the reference solution scores full marks, the blank
release scores 0, and a typical mistake loses exactly the points of its exercise with a message.
(b01 has its own, larger round trip in test_grade.py.)"""
import json

import pytest

from autograder.catalog import Catalog, repo_root
from autograder.course.labspec import LabSpec
from autograder.course.reference import (
    solution_cells,
    student_notebook,
    write_submission,
)
from autograder.grading.grade import GradeOptions, grade

ROOT = repo_root()

# a01: a loss scaler that backs off on inf/NaN but never grows again
SCALER_THAT_NEVER_GROWS = '''
class LossScaler:
    """Loss scaling that backs off on inf/NaN but forgets to grow again."""

    def __init__(self, init_scale=2.0 ** 16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
        self.scale_value = float(init_scale)
        self.backoff_factor = backoff_factor
        self.found_inf, self.unscaled = False, False

    def scale(self, loss):
        return loss * self.scale_value

    @torch.no_grad()
    def unscale_(self, optimizer):
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    if not torch.isfinite(p.grad).all():
                        self.found_inf = True
                    p.grad.mul_(1.0 / self.scale_value)
        self.unscaled = True

    def step(self, optimizer):
        if not self.unscaled:
            self.unscale_(optimizer)
        if not self.found_inf:
            optimizer.step()

    def update(self):
        if self.found_inf:
            self.scale_value *= self.backoff_factor
        self.found_inf, self.unscaled = False, False

    def get_scale(self):
        return float(self.scale_value)
'''

# a02: ZeRO-1 that all-gathers the shards before the optimizer step: the update never reaches the model
ZERO1_GATHER_BEFORE_STEP = '''class Zero1AdamW:
    """ZeRO stage 1 that all-gathers the parameters BEFORE the optimizer step (the update is lost)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
        self.params = [p for p in params if p.requires_grad]
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        numel = sum(p.numel() for p in self.params)
        self.shard_size = -(-numel // self.world_size)
        flat = self._flatten([p.detach() for p in self.params])
        lo = self.rank * self.shard_size
        self.shard = nn.Parameter(flat[lo:lo + self.shard_size].clone().float())
        self.optimizer = torch.optim.AdamW([self.shard], lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)

    def _flatten(self, tensors):
        flat = torch.cat([t.reshape(-1) for t in tensors])
        return torch.cat([flat, flat.new_zeros(self.shard_size * self.world_size - flat.numel())])

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self):
        grads = self._flatten([p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params])
        grad_shard = grads.new_empty(self.shard_size)
        dist.reduce_scatter_tensor(grad_shard, grads)
        self.shard.grad = (grad_shard / self.world_size).float()
        full = self.shard.new_empty(self.shard_size * self.world_size)
        dist.all_gather_into_tensor(full, self.shard.detach())
        offset = 0
        for p in self.params:
            p.copy_(full[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
        self.optimizer.step()
'''

# a02: every rank steps AdamW on all the parameters: the right numbers, and no memory saved
ZERO1_UNSHARDED = '''
class Zero1AdamW:
    """Every rank steps AdamW on all the parameters: right numbers, nothing sharded."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
        self.params = [p for p in params if p.requires_grad]
        self.world_size = dist.get_world_size()
        self.master = nn.Parameter(torch.cat([p.detach().reshape(-1) for p in self.params]).float())
        self.optimizer = torch.optim.AdamW([self.master], lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self):
        grads = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in self.params])
        dist.all_reduce(grads)
        self.master.grad = (grads / self.world_size).float()
        self.optimizer.step()
        offset = 0
        for p in self.params:
            p.copy_(self.master[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
'''

# a01: a "checkpoint" that keeps the whole graph of the block for backward: right gradients, no memory saved
CHECKPOINT_KEEPING_THE_GRAPH = '''
class Checkpoint(torch.autograd.Function):
    """Runs fn with autograd on in forward and keeps its graph for backward."""

    @staticmethod
    def forward(ctx, fn, *inputs):
        ctx.inputs = [t.detach().requires_grad_(True) for t in inputs]
        with torch.enable_grad():
            ctx.output = fn(*ctx.inputs)
        return ctx.output.detach()

    @staticmethod
    def backward(ctx, grad_output):
        torch.autograd.backward(ctx.output, grad_output)
        return (None, *(t.grad for t in ctx.inputs))


class CheckpointedModule(nn.Module):
    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module

    def forward(self, *inputs, **kwargs):
        return Checkpoint.apply(functools.partial(self.module, **kwargs), *inputs)
'''

# lab id -> [(solution grade_id, the mistaken cell's source (or a function making it from the reference
# solution), points it must lose, text in the message)]
MISTAKES: dict[str, list[tuple[str, str, float, str]]] = {
    "b06": [
        # averaging twice: the bucket is divided by N before the all-reduce and again after it
        ("data_parallel", lambda: solution_cells("b06")["data_parallel"].replace(
            "flat = torch.cat([p.grad.reshape(-1) for p in self.buckets[i]])",
            "flat = torch.cat([p.grad.reshape(-1) for p in self.buckets[i]]) / self.world_size"), 3, "averaged twice?"),
        # every rank keeps its own random initial weights
        ("data_parallel", lambda: solution_cells("b06")["data_parallel"].replace(
            "        broadcast_parameters(module)\n", ""), 3, "did you broadcast them?"),
    ],
    "a02": [("zero1", ZERO1_GATHER_BEFORE_STEP, 3, "All-gather the shards AFTER the optimizer step"),
            ("zero1", ZERO1_UNSHARDED, 3, "Shard the optimizer state")],
    "a01": [("loss_scaler", SCALER_THAT_NEVER_GROWS, 3, "get_scale() after update() of step 2 (clean)"),
            ("checkpoint", CHECKPOINT_KEEPING_THE_GRAPH, 3, "a checkpoint keeps only its inputs")],
    # top-p that drops the token crossing the threshold (> instead of >=)
    "b05": [("top_p", 'def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:\n    """Nucleus filtering: keep the smallest set of most likely tokens whose probabilities sum to\n    >= p (always at least the most likely one), set the other logits to -inf.\n    Raises ValueError unless 0 <= p <= 1."""\n    if not 0.0 <= p <= 1.0:\n        raise ValueError(f"top_p must be in [0, 1], got {p}")\n    if p >= 1.0:\n        return logits\n    sorted_logits, order = logits.sort(dim=-1, descending=True, stable=True)\n    probs = sorted_logits.float().softmax(dim=-1)\n    drop_sorted = probs.cumsum(dim=-1) > p\n    drop_sorted[..., 0] = False\n    drop = drop_sorted.scatter(-1, order, drop_sorted)\n    return logits.masked_fill(drop, float("-inf"))\n', 2, "the token that crosses p")],
    # BPE merges learned over the whole text, across pre-token (word) boundaries
    "b03": [("train_bpe", 'def train_bpe(text: str, vocab_size: int) -> list[tuple[int, int]]:\n    """Merges [(a, b), ...] learned from text (merge k creates id 256 + k), at most vocab_size - 256."""\n    words, freqs = [list(text.encode("utf-8"))], [1]\n    merges = []\n    while 256 + len(merges) < vocab_size:\n        counts = get_pair_counts(words, freqs)\n        if not counts:\n            break\n        a, b, _ = min(counts, key=lambda t: (-t[2], t[0], t[1]))\n        merges.append((a, b))\n        words = [merge_word(w, (a, b), 256 + len(merges) - 1) for w in words]\n    return merges\n', 3, "merges never cross a pre-token boundary")],
    # L2 regularisation (decay added to the gradient) instead of AdamW's decoupled weight decay
    "b04": [("adamw_class", '\nclass AdamW(torch.optim.Optimizer):\n    """Adam with L2 regularisation: weight decay added to the gradient (not decoupled)."""\n\n    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):\n        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))\n\n    @torch.no_grad()\n    def step(self, closure=None):\n        for group in self.param_groups:\n            beta1, beta2 = group["betas"]\n            for p in group["params"]:\n                if p.grad is None:\n                    continue\n                state = self.state[p]\n                if not state:\n                    state["step"] = 0\n                    state["exp_avg"] = torch.zeros_like(p)\n                    state["exp_avg_sq"] = torch.zeros_like(p)\n                state["step"] += 1\n                grad = p.grad + group["weight_decay"] * p\n                new_p, m, v = adamw_update(p, grad, state["exp_avg"], state["exp_avg_sq"], state["step"],\n                                           group["lr"], beta1, beta2, group["eps"], 0.0)\n                p.copy_(new_p)\n                state["exp_avg"].copy_(m)\n                state["exp_avg_sq"].copy_(v)\n', 2, "decoupled decay")],
    # interleaved (GPT-J style) RoPE instead of the half-split convention HF Llama uses
    "b02": [("rope", 'def apply_rope(x: torch.Tensor, positions: torch.Tensor, theta: float = 10000.0) -> torch.Tensor:\n    """Rotate x (..., T, d) to its positions (T,) with half-split RoPE; same shape and dtype."""\n    d = x.size(-1)\n    inv_freq = 1.0 / theta ** (torch.arange(0, d, 2, device=x.device).float() / d)\n    angles = positions.to(x.device).float()[:, None] * inv_freq[None, :]\n    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)\n    x1, x2 = x[..., 0::2], x[..., 1::2]\n    return torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2)\n', 2, "apply_rope(x, positions=0..4): max |difference|")],
}

LABS = [lab for lab in Catalog.load().ready() if lab.id in MISTAKES]


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("labs")
    subs = tmp / "submissions"
    for lab in LABS:
        write_submission(subs, f"ref_{lab.id}", lab.id, student_notebook(lab.id))
        write_submission(subs, f"blank_{lab.id}", lab.id, student_notebook(lab.id, solve=False))
        for i, (grade_id, source, _, _) in enumerate(MISTAKES[lab.id]):
            source = source() if callable(source) else source   # an edit of the reference solution
            assert source != solution_cells(lab.id)[grade_id], f"{lab.id} mistake {i} changes nothing"
            write_submission(subs, f"mistake{i}_{lab.id}", lab.id, student_notebook(lab.id, {grade_id: source}))
    out = tmp / "ws"
    rows = grade(subs, Catalog.load(), ROOT, out, None, GradeOptions(jobs=2))
    return out, {(r.student, r.lab): r for r in rows}


def test_every_ready_lab_has_a_mistake_case():
    missing = [lab.id for lab in Catalog.load().ready() if lab.id != "b01" and lab.id not in MISTAKES]
    assert missing == [], f"add a typical mistake for {missing} to MISTAKES"


@pytest.mark.slow
@pytest.mark.parametrize("lab", LABS, ids=[lab.id for lab in LABS])
def test_reference_full_blank_zero_mistake_partial(graded, lab):
    out, rows = graded
    spec = LabSpec.from_notebook(lab.source_path(ROOT))
    assert rows[(f"ref_{lab.id}", lab.id)].score == spec.max_score > 0, rows[(f"ref_{lab.id}", lab.id)]
    assert rows[(f"blank_{lab.id}", lab.id)].score == 0
    for i, (grade_id, _, lost, hint) in enumerate(MISTAKES[lab.id]):
        student = f"mistake{i}_{lab.id}"
        mistake = rows[(student, lab.id)]
        assert mistake.score == spec.max_score - lost, (grade_id, mistake)
        result = json.loads((out / "results" / lab.name / f"{student}.json").read_text())["result"]
        messages = " | ".join(t["message"] for t in result["tests"] if t["message"])
        assert hint in messages, (grade_id, messages)
