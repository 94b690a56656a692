"""Concurrent submits (issue 27): each acknowledged one is stored once with its trials, their
state records and their queued allocations, written with a few Core statements per submit;
an experiment without a name is named after its own id. Both backends."""

from __future__ import annotations

import asyncio

import httpx
from fastapi import FastAPI
from sqlalchemy import ColumnElement, func, select

from master.db.models import AllocationModel, Base, StateChangeModel, TrialModel
from master.db.session import session_scope
from tests.factories import EXPERIMENT_YAML, create_experiment

SUBMITS = 24


async def count(app: FastAPI, model: type[Base], *where: ColumnElement[bool]) -> int:
    async with session_scope(app.state.session_factory) as session:
        query = select(func.count()).select_from(model).where(*where)
        return int(await session.scalar(query) or 0)


async def test_concurrent_submits_are_each_stored_once_with_their_trials(
    api: httpx.AsyncClient, app: FastAPI
) -> None:
    replies = await asyncio.gather(*(create_experiment(api) for _ in range(SUBMITS)))
    assert [r.status_code for r in replies] == [200] * SUBMITS, replies[0].text
    ids = [r.json()["experiment"]["id"] for r in replies]
    assert len(set(ids)) == SUBMITS, "every caller got its own experiment"
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
    assert await count(app, StateChangeModel, StateChangeModel.entity == "trial") == planned


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
