"""Typical mistakes in lab a01: each must lose exactly its exercise's points, with a message
that helps (graded by tests/course/test_labs.py)."""
from tests.course.mistakes import Mistake

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

MISTAKES = [
    Mistake("loss_scaler", SCALER_THAT_NEVER_GROWS, 3, "get_scale() after update() of step 2 (clean)"),
    Mistake("checkpoint", CHECKPOINT_KEEPING_THE_GRAPH, 3, "a checkpoint keeps only its inputs"),
]
