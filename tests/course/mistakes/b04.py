"""Typical mistakes in lab b04: each must lose exactly its exercise's points, with a message
that helps (graded by tests/course/test_labs.py)."""
from tests.course.mistakes import Mistake

# L2 regularisation (decay added to the gradient) instead of AdamW's decoupled weight decay
MISTAKES = [
    Mistake("adamw_class", '\nclass AdamW(torch.optim.Optimizer):\n    """Adam with L2 regularisation: weight decay added to the gradient (not decoupled)."""\n\n    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):\n        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))\n\n    @torch.no_grad()\n    def step(self, closure=None):\n        for group in self.param_groups:\n            beta1, beta2 = group["betas"]\n            for p in group["params"]:\n                if p.grad is None:\n                    continue\n                state = self.state[p]\n                if not state:\n                    state["step"] = 0\n                    state["exp_avg"] = torch.zeros_like(p)\n                    state["exp_avg_sq"] = torch.zeros_like(p)\n                state["step"] += 1\n                grad = p.grad + group["weight_decay"] * p\n                new_p, m, v = adamw_update(p, grad, state["exp_avg"], state["exp_avg_sq"], state["step"],\n                                           group["lr"], beta1, beta2, group["eps"], 0.0)\n                p.copy_(new_p)\n                state["exp_avg"].copy_(m)\n                state["exp_avg_sq"].copy_(v)\n', 2, "decoupled decay"),
]
