"""Context parallelism (lab a05): `ring` (ring attention, zig-zag split, forward and
backward) and the runner `run`. Import from the modules: nothing is re-exported here
(a05's sandbox has no `ring`)."""
