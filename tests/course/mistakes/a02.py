"""Typical mistakes in lab a02: each must lose exactly its exercise's points, with a message
that helps (graded by tests/course/test_labs.py)."""
import functools

from tests.course.mistakes import Mistake, solution_edit

_edit = functools.partial(solution_edit, "a02")

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

MISTAKES = [
    Mistake("zero1", ZERO1_GATHER_BEFORE_STEP, 3, "All-gather the shards AFTER the optimizer step"),
    Mistake("zero1", ZERO1_UNSHARDED, 3, "Shard the optimizer state"),
    # the ring's hops each carry the whole message instead of S/N: a tree's bandwidth term in a ring
    Mistake("cost_model", _edit("cost_model", "2 * (n - 1) / n * nbytes * beta", "2 * (n - 1) * nbytes * beta"), 3,
            "all_reduce_seconds("),
]
