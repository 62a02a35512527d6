"""4D hybrid parallelism (lab a05): `trainer` (camplib's GPT on a DP x PP x CP x TP mesh)
and the runner `run` (`train_hybrid`, also a torchrun script). Import from the modules."""
