"""Typical mistakes in lab p03: each must lose exactly its exercise's points, with a message
that helps (graded by tests/course/test_labs.py)."""
import functools

from tests.course.mistakes import Mistake, solution_edit


_edit = functools.partial(solution_edit, "p03")


MISTAKES = [
    # off by one in the blocks a sequence needs: one block too many whenever the length is a
    # multiple of the block size (n // block_size + 1 instead of the ceiling)
    Mistake("block_manager", _edit("block_manager", "return -(-n_tokens // self.block_size)",
                                   "return n_tokens // self.block_size + 1"), 4, "ceil("),
    # static batching: waiting requests are admitted only when the running batch is empty
    Mistake("scheduler", _edit("scheduler", "while self.waiting and len(self.running) < self.max_batch and budget > 0:",
                               "batch_was_empty = not self.running\n"
                               "        while self.waiting and batch_was_empty and len(self.running) < self.max_batch "
                               "and budget > 0:"),
            6, "not when the batch is empty"),
    # finished (and disconnected) sequences leave the batch but keep their KV blocks
    Mistake("scheduler", _edit("scheduler", "        self.blocks.free(seq.id)\n        seq.status, seq.finish_reason",
                               "        seq.status, seq.finish_reason"), 6, "KV blocks still in use"),
]
