"""The preemption long-poll's bookkeeping (master.services.preemption)."""

from __future__ import annotations

import asyncio

from master.services.preemption import PreemptionSignals


async def test_an_allocation_that_ends_while_its_chief_polls_answers_the_poll() -> None:
    # Seen in an e2e run: the allocation was released (forget) while the trial's
    # long-poll waited, and the poll then failed with a KeyError, a 500.
    signals = PreemptionSignals()
    poll = asyncio.create_task(signals.wait("7.1", timeout_s=0.2))
    await asyncio.sleep(0.05)
    assert signals.watched("7.1", within_s=1)
    signals.forget("7.1")
    assert await poll is False
    assert not signals.watched("7.1", within_s=60)  # nothing of it is left behind


async def test_a_raised_signal_wakes_every_poll() -> None:
    signals = PreemptionSignals()
    polls = [asyncio.create_task(signals.wait("8.1", timeout_s=5)) for _ in range(2)]
    await asyncio.sleep(0.05)
    signals.raise_signal("8.1")
    assert await asyncio.gather(*polls) == [True, True]
    assert signals.watched("8.1", within_s=1)


async def test_a_stopping_master_answers_every_poll_at_once_and_not_preempted() -> None:
    # A SIGTERM'd master waits for open requests before it stops: a 60 s poll must not
    # hold it up, nor tell the trial to stop (the next master decides that).
    signals = PreemptionSignals()
    polls = [asyncio.create_task(signals.wait(a, timeout_s=60)) for a in ("9.1", "9.2")]
    await asyncio.sleep(0.05)
    signals.close()
    assert await asyncio.wait_for(asyncio.gather(*polls), timeout=1) == [False, False]
    assert await asyncio.wait_for(signals.wait("9.3", timeout_s=60), timeout=1) is False
    signals.raise_signal("9.1")
    assert await signals.wait("9.1", timeout_s=60) is True  # a raised signal still says so
