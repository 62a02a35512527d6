"""camplib.parallel: training one model on many ranks.

- `data_parallel`: `DataParallel` (broadcast rank 0's weights, all-reduce gradients in buckets
  launched from autograd hooks as they become ready, average once), its timeline of compute vs
  communication, and `train_on_ranks` (train on N ranks, compare with one process).
- `model_specs`: models described by plain dicts (MLP, GPT), rebuilt identically on every rank.
- `train_ranks`: the single-process reference behind `train_on_ranks`, and `run_on_module`
  (call a function on every rank's own model: a broadcast, say).
- `zero`, `zero_memory`, `zero_run`: ZeRO stages 1-3 (lab a02).
- `tensor`, `tensor_comm`, `tensor_model`: Megatron tensor and sequence parallelism, camplib's GPT split over ranks (lab a03).
- `compression`: fp16/int8 quantized ring all-reduce, top-k with error feedback (lab a02).

No functions are defined here (the lab grader watches this package's own names): import from
the modules.
"""
from .data_parallel import DataParallel, train_on_ranks, train_reference

__all__ = ["DataParallel", "train_on_ranks", "train_reference"]
