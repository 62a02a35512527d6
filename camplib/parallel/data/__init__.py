"""Data parallelism (lab b06): `wrapper` (DataParallel: broadcast, bucketed all-reduce
from autograd hooks, timeline), `compression` (quantized and top-k all-reduce, lab a02),
`cost_model` (the alpha-beta model of a data-parallel step, lab a02), and their runners `run`,
`compression_run` and `scaling_run`. Import from the modules: nothing is
re-exported here, so a lab's sandbox can leave out a module it forbids."""
