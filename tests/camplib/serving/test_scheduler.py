"""Continuous batching decisions: new requests join between steps (not when the batch drains),
a full queue refuses, running out of blocks preempts the newest sequence, and the step's token
budget cuts prompts into chunks after the decode rows."""
import pytest

from camplib.serving.block_manager import BlockManager
from camplib.serving.scheduler import QueueFull, Scheduler
from camplib.serving.sequence import SamplingParams, Sequence, Status


def _seq(n_prompt, max_tokens=8):
    return Sequence(list(range(1, n_prompt + 1)), SamplingParams(max_tokens=max_tokens))


def _run(rows):
    """What the engine does after a step: each row's tokens are cached; a row that reaches its
    sequence's end gets one token."""
    for s, n in rows:
        s.num_cached += n
        if s.num_cached == len(s):
            s.output.append(0)


def test_a_request_joins_the_running_batch_at_the_next_step():
    sched = Scheduler(BlockManager(32, 4), max_batch=4)
    first = _seq(3)
    sched.add(first)
    rows = sched.schedule()
    assert rows == [(first, 3)]
    _run(rows)
    late = _seq(5)
    sched.add(late)
    rows = sched.schedule()
    assert rows == [(first, 1), (late, 5)], f"a request waiting while {first.id} runs was not admitted ({rows})"
    assert sched.running == [first, late] and not sched.waiting


def test_batch_limit_and_finish_free_blocks():
    bm = BlockManager(32, 4)
    sched = Scheduler(bm, max_batch=2)
    seqs = [_seq(4) for _ in range(3)]
    for s in seqs:
        sched.add(s)
    rows = sched.schedule()
    assert [s for s, _ in rows] == seqs[:2] and list(sched.waiting) == seqs[2:]
    _run(rows)
    sched.finish(seqs[0], "stop")
    assert seqs[0].status is Status.FINISHED and seqs[0].id not in bm.tables
    assert sched.schedule() == [(seqs[1], 1), (seqs[2], 4)]
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
    rows = sched.schedule()                # old: 1 block, new: 2 blocks -> pool full
    assert rows == [(old, 2), (new, 3)] and bm.num_free == 0
    _run(rows)
    rows = sched.schedule()                # old needs a third token slot -> a new block
    assert rows == [(old, 1)] and new.status is Status.WAITING and new.preemptions == 1
    assert list(sched.waiting) == [new] and new.id not in bm.tables and new.num_cached == 0


def test_token_budget_serves_decode_rows_first_and_cuts_prompts_into_chunks():
    """Budget 6: the decoding sequence's one token, then 5 of a 12-token prompt; the next steps
    go on where the cache ends (5 more, then the last 2 with the next prompt's first 3); a
    sequence is a decode row again once its whole prompt is cached."""
    bm = BlockManager(32, 4)
    sched = Scheduler(bm, max_batch=4, max_step_tokens=6)
    first, long, short = _seq(2), _seq(12), _seq(4)
    sched.add(first)
    _run(sched.schedule())
    sched.add(long)
    rows = sched.schedule()
    assert rows == [(first, 1), (long, 5)], rows
    assert bm.lengths[long.id] == 12, "the whole prompt's slots are reserved at admission"
    _run(rows)
    assert long.output == [] and long.num_cached == 5, "a cut prompt gets no token yet"
    sched.add(short)
    rows = sched.schedule()
    assert rows == [(first, 1), (long, 5)], rows
    _run(rows)
    rows = sched.schedule()
    assert rows == [(first, 1), (long, 2), (short, 3)], rows
    _run(rows)
    assert len(long.output) == 1 and short.num_cached == 3 and short.output == []
    assert sched.schedule() == [(first, 1), (long, 1), (short, 1)]
