"""Continuous batching decisions: new requests join between steps (not when the batch drains),
a full queue refuses, and running out of blocks preempts the newest sequence."""
import pytest

from camplib.serving.block_manager import BlockManager
from camplib.serving.scheduler import QueueFull, Scheduler
from camplib.serving.sequence import SamplingParams, Sequence, Status


def _seq(n_prompt, max_tokens=8):
    return Sequence(list(range(1, n_prompt + 1)), SamplingParams(max_tokens=max_tokens))


def _decode_one(sched, seqs):
    for s in seqs:  # what the engine does after a step: one token each
        s.output.append(0)


def test_a_request_joins_the_running_batch_at_the_next_step():
    sched = Scheduler(BlockManager(32, 4), max_batch=4)
    first = _seq(3)
    sched.add(first)
    prefill, decode = sched.schedule()
    assert prefill == [first] and decode == []
    _decode_one(sched, prefill)
    late = _seq(5)
    sched.add(late)
    prefill, decode = sched.schedule()
    assert prefill == [late], f"a request waiting while {first.id} runs was not admitted (prefill={prefill})"
    assert decode == [first] and sched.running == [first, late] and not sched.waiting


def test_batch_limit_and_finish_free_blocks():
    bm = BlockManager(32, 4)
    sched = Scheduler(bm, max_batch=2)
    seqs = [_seq(4) for _ in range(3)]
    for s in seqs:
        sched.add(s)
    prefill, _ = sched.schedule()
    assert prefill == seqs[:2] and list(sched.waiting) == seqs[2:]
    sched.finish(seqs[0], "stop")
    assert seqs[0].status is Status.FINISHED and seqs[0].id not in bm.tables
    _decode_one(sched, seqs[1:2])
    prefill, decode = sched.schedule()
    assert prefill == [seqs[2]] and decode == [seqs[1]]
    for s in seqs[1:]:
        sched.finish(s, "length")
    assert bm.blocks_in_use == 0 and not sched.has_work()


def test_queue_limit_refuses_with_queue_full_beyond_the_free_batch_slots():
    """A burst between two steps: the free batch slot's request is not queued (it is admitted at
    the next step); max_waiting more may wait; the next is refused, also once the slot is taken."""
    sched = Scheduler(BlockManager(64, 4), max_batch=1, max_waiting=2)
    sched.add(_seq(2)); sched.add(_seq(2)); sched.add(_seq(2))
    with pytest.raises(QueueFull, match="limit 2"):
        sched.add(_seq(2))
    sched.schedule()                      # admits one: the batch is full, two wait
    assert len(sched.running) == 1 and len(sched.waiting) == 2
    with pytest.raises(QueueFull, match="limit 2"):
        sched.add(_seq(2))
    with pytest.raises(ValueError, match="more KV blocks than the whole cache"):
        Scheduler(BlockManager(2, 4)).add(_seq(4, max_tokens=8))


def test_out_of_blocks_preempts_the_newest_and_requeues_it_first():
    bm = BlockManager(3, 2)
    sched = Scheduler(bm, max_batch=4)
    old, new = _seq(2, max_tokens=2), _seq(3, max_tokens=2)
    sched.add(old); sched.add(new)
    prefill, _ = sched.schedule()          # old: 1 block, new: 2 blocks -> pool full
    assert prefill == [old, new] and bm.num_free == 0
    _decode_one(sched, prefill)
    prefill, decode = sched.schedule()     # old needs a third token slot -> a new block
    assert decode == [old] and new.status is Status.WAITING and new.preemptions == 1
    assert list(sched.waiting) == [new] and new.id not in bm.tables
