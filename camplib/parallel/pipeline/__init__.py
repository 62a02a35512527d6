"""Pipeline parallelism (lab a04): `schedule` (GPipe, 1F1B, interleaved 1F1B as per-rank
action lists, a checker and a simulator), `stages` (camplib's GPT cut into stages and
the step loop), `comm` (tagged sends and receives), the runner `run` and `bubble`
(the bubble measured on real ranks). Import from the modules: nothing is re-exported here."""
