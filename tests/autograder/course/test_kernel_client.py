"""The kernel client of unattended runs waits in slices: a message that arrived while the
asyncio wake-up was lost is picked up by the next slice's real poll, not at the cell timeout."""
import asyncio
import time

import zmq

from autograder.course import kernel_client
from autograder.course.kernel_client import SLICE_S, SlicedWaitChannel


class LostWakeups:
    """A socket whose asyncio poll never wakes before its timeout (the lost wake-up), while a
    message is already waiting, as pyzmq returns it from the last real poll."""

    def __init__(self):
        self.polls = []

    async def poll(self, timeout_ms):
        self.polls.append(timeout_ms)
        await asyncio.sleep(timeout_ms / 1000)
        return zmq.POLLIN


def test_a_lost_wake_up_costs_one_slice_not_the_timeout():
    channel = SlicedWaitChannel.__new__(SlicedWaitChannel)
    channel.socket = LostWakeups()

    async def recv():
        return {"msg_type": "execute_reply"}

    channel._recv = recv
    start = time.monotonic()
    msg = asyncio.run(channel.get_msg(timeout=120))
    assert msg == {"msg_type": "execute_reply"}
    assert time.monotonic() - start < 2 * SLICE_S + 0.5
    assert channel.socket.polls == [int(SLICE_S * 1000)]


def test_nothing_arriving_still_times_out_at_the_deadline():
    class Silent:
        async def poll(self, timeout_ms):
            await asyncio.sleep(timeout_ms / 1000)
            return 0

    channel = SlicedWaitChannel.__new__(SlicedWaitChannel)
    channel.socket = Silent()
    start = time.monotonic()
    try:
        asyncio.run(channel.get_msg(timeout=1.2))
    except kernel_client.Empty:
        pass
    else:
        raise AssertionError("no message, yet get_msg returned")
    assert 1.2 <= time.monotonic() - start < 1.2 + SLICE_S + 0.5
