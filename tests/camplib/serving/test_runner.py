"""The engine thread's start after an idle wait: it lets the rest of a burst of requests arrive
(until a gap with none) so the burst is prefilled in one step; a lone request waits one gap."""
import threading
import time

import torch

from camplib.model import GPT, GPTConfig
from camplib.serving import Engine, SamplingParams
from camplib.serving.runner import EngineLoop


def test_a_burst_is_gathered_until_a_gap_and_a_lone_request_waits_one_gap():
    torch.manual_seed(0)
    engine = Engine(GPT(GPTConfig.llama_style(vocab_size=64, max_seq_len=32, n_layer=1, d_model=16, n_head=2)),
                    block_size=4, num_blocks=16, max_batch=8)
    loop = EngineLoop(engine, burst_s=5.0, burst_gap_s=0.1)   # wide margins: the test machine is shared

    def more():
        for _ in range(3):
            time.sleep(0.02)
            engine.add([1, 2, 3], SamplingParams(max_tokens=1))
    engine.add([1, 2, 3], SamplingParams(max_tokens=1))
    late = threading.Thread(target=more)
    start = time.monotonic()
    late.start()
    loop._rest_of_burst()
    waited = time.monotonic() - start
    late.join()
    assert len(engine.scheduler.waiting) == 4, f"the burst's 3 later requests should have been waited for, " \
                                               f"{len(engine.scheduler.waiting)} of 4 arrived"
    assert waited < 2.0, f"waited {waited:.2f} s: the gap of 0.1 s with no arrival should end the wait, not the 5 s cap"
    start = time.monotonic()
    loop._rest_of_burst()   # nothing more arrives: one gap
    assert time.monotonic() - start < 1.0
