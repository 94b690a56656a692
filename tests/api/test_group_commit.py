"""Group commit (issue 27): concurrent submits share transactions, every acknowledged one is
stored once with its trials and allocations, one caller's bad write fails only that caller,
and a caller that gave up before its batch began leaves nothing behind. Both backends."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import ColumnElement, Table, func, insert, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from master.db.models import AllocationModel, Base, StateChangeModel, TrialModel
from master.db.session import session_scope
from master.services.group_commit import GroupCommit
from tests.factories import EXPERIMENT_YAML, create_experiment

SUBMITS = 24


async def count(app: FastAPI, model: type[Base], *where: ColumnElement[bool]) -> int:
    async with session_scope(app.state.session_factory) as session:
        query = select(func.count()).select_from(model).where(*where)
        return int(await session.scalar(query) or 0)


async def test_concurrent_submits_share_transactions_and_each_is_stored_once(
    api: httpx.AsyncClient, app: FastAPI
) -> None:
    writes: GroupCommit[object, object] = app.state.experiment_writes
    transactions, items = writes.transactions, writes.items
    replies = await asyncio.gather(*(create_experiment(api) for _ in range(SUBMITS)))
    assert [r.status_code for r in replies] == [200] * SUBMITS, replies[0].text
    ids = [r.json()["experiment"]["id"] for r in replies]
    assert len(set(ids)) == SUBMITS, "every caller got its own experiment"
    assert writes.items - items == SUBMITS
    # Submits that arrive while a transaction is in flight go together in the next one.
    assert writes.transactions - transactions < SUBMITS
    listed = (await api.get("/api/v1/experiments")).json()["experiments"]
    assert sorted(e["id"] for e in listed) == sorted(ids)
    planned = 0
    for reply in replies:
        experiment = reply.json()["experiment"]
        planned += experiment["numTrials"]
        trials = (await api.get(f"/api/v1/experiments/{experiment['id']}/trials")).json()
        states = [t["state"] for t in trials["trials"]]
        assert states == ["STATE_QUEUED"] * experiment["numTrials"] and states
    assert await count(app, TrialModel) == planned
    assert await count(app, AllocationModel) == planned
    assert await count(app, StateChangeModel, StateChangeModel.entity == "experiment") == SUBMITS


def state_change_writer(
    app: FastAPI, started: asyncio.Event | None = None, go: asyncio.Event | None = None
) -> GroupCommit[int | None, int]:
    """A GroupCommit that records one state change per item (an entity id; None is refused
    by the database's NOT NULL). With `started`/`go`, its first transaction waits for `go`."""

    async def write(session: AsyncSession, items: Sequence[int | None]) -> list[int]:
        if started is not None and go is not None and not started.is_set():
            started.set()
            await go.wait()
        rows = [
            {"entity": "probe", "entity_id": item, "from_state": None, "to_state": "X"}
            for item in items
        ]
        await session.execute(insert(_table()), rows)
        return [item or 0 for item in items]

    return GroupCommit(app.state.session_factory, write, name="probe")


def _table() -> Table:
    table = StateChangeModel.__table__
    assert isinstance(table, Table)
    return table


async def stored_probes(app: FastAPI) -> list[int]:
    async with session_scope(app.state.session_factory) as session:
        rows = await session.scalars(
            select(StateChangeModel.entity_id)
            .where(StateChangeModel.entity == "probe")
            .order_by(StateChangeModel.entity_id)
        )
        return list(rows.all())


async def test_a_bad_item_fails_only_its_caller(app: FastAPI, api: httpx.AsyncClient) -> None:
    started, go = asyncio.Event(), asyncio.Event()
    writer = state_change_writer(app, started, go)
    first = asyncio.create_task(writer.write(1))
    await started.wait()  # the first transaction is in flight: the rest wait together
    rest = [asyncio.create_task(writer.write(item)) for item in (2, None, 3, 4)]
    go.set()
    results = await asyncio.gather(first, *rest, return_exceptions=True)
    assert results[:2] == [1, 2] and results[3:] == [3, 4]
    assert isinstance(results[2], IntegrityError)
    assert await stored_probes(app) == [1, 2, 3, 4]
    # The first alone; the batch of four failed, then each of the four alone.
    assert writer.transactions == 4 and writer.items == 4


async def test_a_caller_that_gave_up_before_its_batch_leaves_nothing(
    app: FastAPI, api: httpx.AsyncClient
) -> None:
    started, go = asyncio.Event(), asyncio.Event()
    writer = state_change_writer(app, started, go)
    first = asyncio.create_task(writer.write(1))
    await started.wait()
    gave_up = asyncio.create_task(writer.write(2))
    kept = asyncio.create_task(writer.write(3))
    await asyncio.sleep(0)
    gave_up.cancel()
    go.set()
    assert await first == 1 and await kept == 3
    with pytest.raises(asyncio.CancelledError):
        await gave_up
    assert await stored_probes(app) == [1, 3]


async def test_experiments_without_a_name_are_named_after_their_own_id(
    api: httpx.AsyncClient,
) -> None:
    nameless = EXPERIMENT_YAML.replace("name: mnist-random\n", "")
    replies = await asyncio.gather(*(create_experiment(api, nameless) for _ in range(4)))
    for reply in replies:
        assert reply.status_code == 200, reply.text
        experiment = reply.json()["experiment"]
        assert experiment["name"] == f"Experiment {experiment['id']}"
        stored = (await api.get(f"/api/v1/experiments/{experiment['id']}")).json()
        assert stored["experiment"]["name"] == experiment["name"]
        assert stored["experiment"]["config"]["name"] == experiment["name"]


async def test_concurrent_kills_share_transactions_and_each_experiment_ends(
    api: httpx.AsyncClient, app: FastAPI
) -> None:
    replies = [await create_experiment(api) for _ in range(8)]
    ids = [r.json()["experiment"]["id"] for r in replies]
    kills: GroupCommit[object, object] = app.state.experiment_kills
    transactions, items = kills.transactions, kills.items
    answers = await asyncio.gather(*(api.post(f"/api/v1/experiments/{i}/kill") for i in ids))
    assert [a.status_code for a in answers] == [200] * len(ids), answers[0].text
    assert kills.items - items == len(ids)
    assert kills.transactions - transactions < len(ids)
    for experiment_id in ids:
        experiment = (await api.get(f"/api/v1/experiments/{experiment_id}")).json()["experiment"]
        assert experiment["state"] == "STATE_CANCELED"
        trials = (await api.get(f"/api/v1/experiments/{experiment_id}/trials")).json()["trials"]
        assert {t["state"] for t in trials} == {"STATE_CANCELED"}
    assert await count(app, AllocationModel, AllocationModel.state == "PENDING") == 0
    # Killing a missing experiment is refused before anything is handed over.
    missing = await api.post("/api/v1/experiments/999999/kill")
    assert missing.status_code == 404 and kills.items - items == len(ids)
