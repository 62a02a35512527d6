"""Megatron tensor and sequence parallelism (lab a03): `layers` (column/row-parallel
linears, attention, MLP, vocab-parallel embedding and loss), `comm` (the differentiable
collectives), `model` (TensorParallelGPT) and the runner `run`. Import from the modules:
nothing is re-exported here (a03's sandbox has no `layers`, `comm`, `model`)."""
