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
