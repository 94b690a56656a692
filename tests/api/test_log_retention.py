"""Log retention (`det experiment set log-retention`, issue 32) on Determined's route, on both
databases: the days are kept in the experiment's config, the leader's pass deletes the
logs of trials whose retention is over (and only those), and bad input changes nothing."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import update

from master.db.models import TrialModel, utcnow
from master.db.session import session_scope
from master.services import log_retention
from master.services.log_retention import LogRetentionLoop, delete_expired_logs
from tests.api.test_access import alice, refusal  # noqa: F401 - alice is a fixture
from tests.api.test_logs import Trial, append, line, messages, read, start_experiment
from tests.api.test_trial_reports import ok


async def logged_experiment(api: httpx.AsyncClient, app: FastAPI) -> list[Trial]:
    """Three trials with two lines each, ended by a kill."""
    trials = await start_experiment(api)
    await append(
        app, "agent-1", [line(t, f"trial {t.id} line {n}") for t in trials for n in (1, 2)]
    )
    await ok(api.post(f"/api/v1/experiments/{trials[0].experiment_id}/kill"))
    return trials


async def ended_days_ago(app: FastAPI, trial_ids: list[int], days: float) -> None:
    async with session_scope(app.state.session_factory) as session:
        await session.execute(
            update(TrialModel)
            .where(TrialModel.id.in_(trial_ids))
            .values(end_time=utcnow() - timedelta(days=days))
        )


async def lines_of(api: httpx.AsyncClient, trial: Trial) -> list[str]:
    return messages(await read(api, f"/api/v1/trials/{trial.id}/logs"))


async def retention_pass(app: FastAPI, default_days: int | None = None) -> int:
    # One trial per transaction: the batching is exercised whatever the number of trials.
    return await delete_expired_logs(
        app.state.session_factory, default_days, trials_per_transaction=1
    )


async def test_logs_go_once_their_trials_retention_is_over(
    api: httpx.AsyncClient, app: FastAPI
) -> None:
    trials = await logged_experiment(api, app)
    experiment_id = trials[0].experiment_id
    path = f"/api/v1/experiments/{experiment_id}/retain_logs"
    await ended_days_ago(app, [trials[0].id, trials[1].id], 10)
    await ended_days_ago(app, [trials[2].id], 3)
    # No retention anywhere: logs are kept forever.
    assert await retention_pass(app) == 0
    # What `det e set log-retention ID --days 5` sends.
    await ok(api.put(path, json={"experimentId": experiment_id, "numDays": 5}))
    config = (await ok(api.get(f"/api/v1/experiments/{experiment_id}")))["experiment"]["config"]
    assert config["retention_policy"] == {"log_retention_days": 5}
    assert await retention_pass(app) == 2
    assert await lines_of(api, trials[0]) == [] and await lines_of(api, trials[1]) == []
    assert await lines_of(api, trials[2]) == [f"trial {trials[2].id} line {n}" for n in (1, 2)]
    assert await retention_pass(app) == 0  # nothing left to do for the cleared ones
    # --forever (-1) keeps them whatever the master's default says.
    await ok(api.put(path, json={"experimentId": experiment_id, "numDays": -1}))
    assert await retention_pass(app, default_days=1) == 0
    assert len(await lines_of(api, trials[2])) == 2
    await ok(api.put(path, json={"experimentId": experiment_id, "numDays": 2}))
    assert await retention_pass(app) == 1
    assert await lines_of(api, trials[2]) == []


async def test_the_masters_default_applies_where_the_experiment_sets_none(
    api: httpx.AsyncClient, app: FastAPI
) -> None:
    trials = await logged_experiment(api, app)
    await ended_days_ago(app, [t.id for t in trials], 4)
    # The leader's loop, as the master runs it with retention_policy.log_retention_days.
    await LogRetentionLoop(app.state.session_factory, 7, interval=3600).run_once()
    assert all([await lines_of(api, t) for t in trials])
    await LogRetentionLoop(app.state.session_factory, 3, interval=3600).run_once()
    assert not any([await lines_of(api, t) for t in trials])


async def test_a_trial_that_runs_again_during_the_pass_keeps_its_logs(
    api: httpx.AsyncClient, app: FastAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pass deletes a few trials per transaction, asking again in each: a trial that
    `det e continue` started again after the pass listed it keeps its (new) logs."""
    trials = await logged_experiment(api, app)
    await ended_days_ago(app, [t.id for t in trials], 10)
    listing = log_retention.expired_trials

    async def list_then_continue(*args: Any, **kwargs: Any) -> list[int]:
        found = await listing(*args, **kwargs)
        if kwargs.get("among", args[3] if len(args) > 3 else None) is None:
            async with session_scope(app.state.session_factory) as session:
                await session.execute(  # as continuation.py starts a trial again
                    update(TrialModel).where(TrialModel.id == trials[0].id).values(end_time=None)
                )
        return found

    monkeypatch.setattr(log_retention, "expired_trials", list_then_continue)
    assert await retention_pass(app, default_days=1) == 2
    assert len(await lines_of(api, trials[0])) == 2
    assert await lines_of(api, trials[1]) == [] and await lines_of(api, trials[2]) == []


async def test_a_running_trial_keeps_its_logs(api: httpx.AsyncClient, app: FastAPI) -> None:
    trials = await start_experiment(api)
    await append(app, "agent-1", [line(trials[0], "still running")])
    path = f"/api/v1/experiments/{trials[0].experiment_id}/retain_logs"
    await ok(api.put(path, json={"numDays": 0}))
    assert await retention_pass(app, default_days=0) == 0
    assert await lines_of(api, trials[0]) == ["still running"]


@pytest.mark.parametrize(
    ("body", "status", "problem"),
    [
        ({"numDays": -2}, 400, "numDays: -2 is not a number of days from -1 (forever) to 32767"),
        ({"numDays": 32768}, 400, "numDays: 32768 is not a number of days"),
        ({"numDays": "many"}, 400, "numDays"),
        ({}, 400, "numDays"),
        ({"numDays": 3, "experimentId": 999}, 400, "experimentId: 999 is not the experiment"),
        ({"numDays": 3, "keep": True}, 400, "keep"),
    ],
)
async def test_bad_input_is_refused_naming_the_field_and_changes_nothing(
    api: httpx.AsyncClient, body: dict[str, object], status: int, problem: str
) -> None:
    trials = await start_experiment(api)
    path = f"/api/v1/experiments/{trials[0].experiment_id}"
    reply = await api.put(f"{path}/retain_logs", json=body)
    assert reply.status_code in (status, 422), reply.text
    assert problem in reply.text
    config = (await ok(api.get(path)))["experiment"]["config"]
    assert (config.get("retention_policy") or {}).get("log_retention_days") is None


async def test_only_the_owner_changes_it_and_unknown_experiments_are_404(
    api: httpx.AsyncClient,
    alice: httpx.AsyncClient,  # noqa: F811 - the fixture
) -> None:
    trials = await start_experiment(api)
    path = f"/api/v1/experiments/{trials[0].experiment_id}"
    reply = await alice.put(f"{path}/retain_logs", json={"numDays": 1})
    assert "only its owner or an admin may change its log retention" in refusal(reply, 403)
    config = (await ok(api.get(path)))["experiment"]["config"]
    assert (config.get("retention_policy") or {}).get("log_retention_days") is None
    missing = await api.put("/api/v1/experiments/99999/retain_logs", json={"numDays": 1})
    assert refusal(missing, 404) == "experiment 99999 not found"
