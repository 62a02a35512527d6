"""ZeRO stages 1-3 (lab a02): `optimizer` (ZeroAdamW on flat buffers), `memory` (bytes a
rank holds: the paper's formula and a measurement) and the runner `run`. Import from the
modules: nothing is re-exported here (a02's sandbox has no `optimizer`)."""
