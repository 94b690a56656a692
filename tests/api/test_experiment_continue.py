"""Continuing an ended experiment (issue 32): Determined's POST /api/v1/experiments/continue,
on both databases. What runs again, with which config, and every refusal changing nothing.
(A trial resuming from its checkpoint on a real agent: tests/e2e/test_official_client.py.)"""

from __future__ import annotations

from typing import Any

import httpx
from fastapi import FastAPI
from sqlalchemy import update

from master.db.models import TrialModel
from master.db.session import session_scope
from tests.api.test_access import alice, refusal  # noqa: F401 - alice is a fixture
from tests.api.test_trial_reports import ok
from tests.factories import create_experiment

SINGLE = """\
name: one
entrypoint: python3 train.py
max_restarts: 2
searcher: {name: single, metric: loss, max_length: {batches: 10}}
"""
RANDOM = """\
name: three
entrypoint: python3 train.py
hyperparameters: {lr: {type: double, minval: 0.1, maxval: 0.2}}
searcher: {name: random, metric: loss, max_trials: 3, max_length: {batches: 10}}
"""
ASHA = """\
name: asha
entrypoint: python3 train.py
hyperparameters: {lr: {type: double, minval: 0.1, maxval: 0.2}}
searcher: {name: adaptive_asha, metric: loss, max_trials: 4, max_length: {batches: 16}}
"""


async def ended(api: httpx.AsyncClient, config: str) -> int:
    reply = await create_experiment(api, config)
    assert reply.status_code == 200, reply.text
    experiment_id: int = reply.json()["experiment"]["id"]
    await ok(api.post(f"/api/v1/experiments/{experiment_id}/kill"))
    return experiment_id


async def trials(api: httpx.AsyncClient, experiment_id: int) -> list[dict[str, Any]]:
    body = await ok(api.get(f"/api/v1/experiments/{experiment_id}/trials"))
    found: list[dict[str, Any]] = body["trials"]
    return found


async def pending(api: httpx.AsyncClient) -> set[str]:
    tasks = (await ok(api.get("/api/v1/tasks")))["allocationIdToSummary"]
    return {a for a, t in tasks.items() if t["state"] == "STATE_PENDING"}


def continuing(experiment_id: int, override: str | None = None) -> dict[str, Any]:
    return {"id": experiment_id, "overrideConfig": override}


async def test_a_single_trial_runs_again_with_the_override(api: httpx.AsyncClient) -> None:
    experiment_id = await ended(api, SINGLE)
    (trial,) = await trials(api, experiment_id)
    assert trial["state"] == "STATE_CANCELED"
    override = "searcher: {max_length: {batches: 40}}\nmax_restarts: 7\n"
    reply = await ok(
        api.post("/api/v1/experiments/continue", json=continuing(experiment_id, override))
    )
    experiment = reply["experiment"]
    assert experiment["state"] == "STATE_ACTIVE" and experiment["endTime"] is None
    assert experiment["config"]["searcher"]["max_length"] == {"batches": 40}
    assert experiment["config"]["max_restarts"] == 7
    # The rest of the config, and the seed, are as they were.
    assert experiment["config"]["entrypoint"] == "python3 train.py"
    (again,) = await trials(api, experiment_id)
    assert again["id"] == trial["id"] and again["state"] == "STATE_QUEUED"
    assert again["restarts"] == 0 and again["hparams"] == trial["hparams"]
    # A new run: its own allocation, queued.
    assert f"{trial['id']}.2" in await pending(api)


async def test_a_search_runs_again_only_the_trials_that_did_not_complete(
    app: FastAPI, api: httpx.AsyncClient
) -> None:
    experiment_id = await ended(api, RANDOM)
    first, second, third = await trials(api, experiment_id)
    async with session_scope(app.state.session_factory) as session:
        await session.execute(
            update(TrialModel).where(TrialModel.id == first["id"]).values(state="COMPLETED")
        )
    reply = await api.post("/api/v1/experiments/continue", json=continuing(experiment_id))
    assert reply.status_code == 200, reply.text
    states = {t["id"]: t["state"] for t in await trials(api, experiment_id)}
    assert states == {
        first["id"]: "STATE_COMPLETED",
        second["id"]: "STATE_QUEUED",
        third["id"]: "STATE_QUEUED",
    }
    # An override is for a single trial only.
    await ok(api.post(f"/api/v1/experiments/{experiment_id}/kill"))
    reply = await api.post(
        "/api/v1/experiments/continue", json=continuing(experiment_id, "max_restarts: 1\n")
    )
    assert refusal(reply, 400) == (
        "overrideConfig: only a single-trial experiment takes an override config; this one "
        "is searched by random"
    )


async def test_a_search_whose_every_trial_completed_has_nothing_to_continue(
    app: FastAPI, api: httpx.AsyncClient
) -> None:
    experiment_id = await ended(api, RANDOM)
    async with session_scope(app.state.session_factory) as session:
        await session.execute(
            update(TrialModel)
            .where(TrialModel.experiment_id == experiment_id)
            .values(state="COMPLETED")
        )
    reply = await api.post("/api/v1/experiments/continue", json=continuing(experiment_id))
    assert "completed every trial; there is nothing to continue" in refusal(reply, 409)


async def test_refusals_name_the_problem_and_change_nothing(
    api: httpx.AsyncClient,
    alice: httpx.AsyncClient,  # noqa: F811 - the fixture
) -> None:
    running = (await create_experiment(api, SINGLE)).json()["experiment"]["id"]
    reply = await api.post("/api/v1/experiments/continue", json=continuing(running))
    assert refusal(reply, 409) == (
        f"experiment {running} is ACTIVE: only an ended experiment can be continued"
    )
    asha = await ended(api, ASHA)
    reply = await api.post("/api/v1/experiments/continue", json=continuing(asha))
    assert "searcher: an experiment searched by adaptive_asha cannot be continued" in refusal(
        reply, 400
    )
    single = await ended(api, SINGLE)
    before = await trials(api, single)
    for override, says in (
        ("project: elsewhere\n", "overrideConfig.project: a continue runs where the experiment"),
        (
            "searcher: {name: random, max_trials: 2}\n",
            "overrideConfig.searcher.name: a single-trial experiment stays single",
        ),
        ("searcher: {name: random}\n", "searcher.max_trials: required by the random searcher"),
        ("max_restart: 3\n", "overrideConfig: max_restart: unknown key"),
        ("max_restarts: [\n", "overrideConfig: invalid YAML at line 2"),
        ("- a list\n", "overrideConfig: the config must be a YAML mapping"),
        ("labels: ['']\n", "overrideConfig.labels[0]: the label is empty"),
    ):
        reply = await api.post("/api/v1/experiments/continue", json=continuing(single, override))
        assert says in refusal(reply, 400), (override, reply.text)
    reply = await alice.post("/api/v1/experiments/continue", json=continuing(single))
    assert "only its owner or an admin may continue it" in refusal(reply, 403)
    reply = await api.post("/api/v1/experiments/continue", json=continuing(999999))
    assert refusal(reply, 404) == "experiment 999999 not found"
    assert await trials(api, single) == before
    experiment = (await ok(api.get(f"/api/v1/experiments/{single}")))["experiment"]
    assert experiment["state"] == "STATE_CANCELED"
    assert experiment["config"]["searcher"]["max_length"] == {"batches": 10}
