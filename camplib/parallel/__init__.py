"""camplib.parallel: training one model on many ranks.

Library (what a finished lab leaves behind):
- `data_parallel`: `DataParallel` (broadcast rank 0's weights, all-reduce gradients in buckets
  launched from autograd hooks as they become ready, average once) and its timeline of compute
  vs communication (lab b06).
- `zero`, `zero_memory`: ZeRO stages 1-3 on flat buffers, and the bytes a rank holds: the
  paper's formula and a measurement (lab a02).
- `tensor`, `tensor_comm`, `tensor_model`: Megatron tensor and sequence parallelism (layers, the
  collectives in their own small file, camplib's GPT split over ranks: `TensorParallelGPT`) (lab a03).
- `pipeline_schedule`, `pipeline`, `pipeline_comm`: pipeline parallelism (GPipe, 1F1B and
  interleaved 1F1B as per-rank action lists with a checker and a simulator; camplib's GPT cut
  into stages and a step loop running any schedule; tagged sends and receives) (lab a04).
- `mesh`, `context`, `hybrid`: a named DP/PP/CP/TP process-group mesh; ring attention (context
  parallelism, zig-zag split, forward and backward); camplib's GPT trained on DP x PP x CP x TP,
  with sequence parallelism and tied embeddings across stages as options (lab a05).
- `compression`: fp16/int8 quantized ring all-reduce, top-k with error feedback (lab a02).
- `cost_model`: the alpha-beta model of ring and tree all-reduce, overlap with backward and
  data-parallel scaling efficiency, and a fit of alpha and beta to measured collectives (lab a02).
- `model_specs`: models described by plain dicts (MLP, GPT), rebuilt identically on every rank.
- `reference`: one process on the full batch, the answer N ranks must reproduce, and the one
  data format of every run ({"x": (steps, B, ...), "y": ...}).

Runners (tests, benchmarks, graders and lab demos; each a rank function plus one call of
camplib.dist.on_ranks; the library modules above never import them):
- `train_ranks`: `train_on_ranks` (a data-parallel wrapper on N ranks) and `run_on_module`.
- `zero_run`: `train_zero_on_ranks`, `train_optimizer_on_ranks`, `gradient_shards_on_ranks`.
- `compression_run`: `compression_loss_curves` (bytes counted per step, held-out loss, error
  feedback on and off).
- `scaling_run`: `time_all_reduces`, `time_steps`, `codec_seconds_per_value` (what the cost
  model is checked against).
- `tensor_run`: `run_split_gpt` (the split GPT's logits, loss and gradients, joined back).
- `context_run`: `run_ring_attention` (forward and backward, joined), `run_ring_forward` (lab a05).
- `hybrid_run`: `train_hybrid` (loss curve, joined dense parameters, bytes sent and held per
  rank, ZeRO stage 1-3), `train_on_mesh` (lab a05's run, plain data in and out).
- `pipeline_run`: `run_pipeline` / `run_pipeline_spec` (loss, gradients by dense name, peak
  micro-batches in flight and the recorded actions of a p-rank pipeline).
- `pipeline_bubble`: `measure_bubbles` (the bubble of `pipeline_step` on real ranks with sleeping,
  uniform stages, against (p-1)/(v*m+p-1)).

Nothing is defined here but the lazy re-export of `DataParallel` (the lab grader watches this
package's own names): import from the modules. Lazy, because a lab's sandbox leaves out the
modules the lab forbids (autograder.isolation.course_tree): b06's has no `data_parallel`, and
its runners (`train_ranks`) must still import this package.
"""

__all__ = ["DataParallel"]


def __getattr__(name: str):
    if name == "DataParallel":
        from .data_parallel import DataParallel
        return DataParallel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
