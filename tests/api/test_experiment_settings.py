"""`det experiment set priority|weight|max-slots|gc-policy` and archive/unarchive (issue 32)
through Determined's routes, on both databases: what each changes, the rules each keeps,
and refusals that change nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from tests.api.test_access import alice, refusal  # noqa: F401 - alice is a fixture
from tests.api.test_checkpoint_gc import checkpoint_with_files, config_for, states
from tests.api.test_trial_reports import ok, submit
from tests.factories import create_experiment

SINGLE = """\
name: settings
entrypoint: python3 train.py
searcher: {name: single, metric: loss, max_length: {batches: 10}}
"""


async def new_experiment(api: httpx.AsyncClient, config: str = SINGLE) -> dict[str, Any]:
    reply = await create_experiment(api, config)
    assert reply.status_code == 200, reply.text
    experiment: dict[str, Any] = reply.json()["experiment"]
    return experiment


async def experiment_of(api: httpx.AsyncClient, experiment_id: int) -> dict[str, Any]:
    body = await ok(api.get(f"/api/v1/experiments/{experiment_id}"))
    experiment: dict[str, Any] = body["experiment"]
    return experiment


async def test_priority_weight_and_max_slots_as_the_official_client_sends_them(
    api: httpx.AsyncClient,
) -> None:
    experiment = await new_experiment(api)
    path = f"/api/v1/experiments/{experiment['id']}"
    # `det e set priority|weight|max-slots` each send the id and one `resources` key.
    for resources in ({"priority": 7}, {"weight": 2.5}, {"maxSlots": 4}):
        await ok(api.patch(path, json={"id": experiment["id"], "resources": resources}))
    stored = await experiment_of(api, experiment["id"])
    assert stored["config"]["resources"]["priority"] == 7
    assert stored["config"]["resources"]["weight"] == 2.5
    assert stored["config"]["resources"]["max_slots"] == 4
    # The job queue orders by the new priority, as after `det job update --priority`.
    jobs = (await ok(api.get("/api/v1/job-queues")))["jobs"]
    (job,) = [j for j in jobs if j["entityId"] == str(experiment["id"])]
    assert job["priority"] == 7


async def test_an_ended_experiments_priority_is_final(api: httpx.AsyncClient) -> None:
    experiment = await new_experiment(api)
    path = f"/api/v1/experiments/{experiment['id']}"
    await ok(api.post(f"{path}/kill"))
    reply = await api.patch(path, json={"resources": {"priority": 3, "weight": 9}})
    assert refusal(reply, 409) == (
        f"experiment {experiment['id']} has ended (CANCELED); its priority is final"
    )
    resources = (await experiment_of(api, experiment["id"]))["config"]["resources"]
    assert resources.get("priority") != 3 and resources.get("weight") != 9


async def test_a_gc_policy_applies_at_once_to_the_checkpoints_of_ended_trials(
    api: httpx.AsyncClient, tmp_path: Path
) -> None:
    storage = tmp_path / "checkpoints"
    # Keep everything while it runs: five latest, so nothing is deleted at its end.
    (trial,) = await submit(api, config_for(storage, save_trial_latest=5))
    for steps, loss in ((1, 0.5), (2, 0.1), (3, 0.9), (4, None)):
        await checkpoint_with_files(api, storage, trial, steps, loss)
    path = f"/api/v1/experiments/{trial.experiment_id}"
    await ok(api.post(f"{path}/kill"))
    assert {s for s, _ in (await states(api, trial.experiment_id)).values()} == {"ACTIVE"}
    policy = {"saveExperimentBest": 0, "saveTrialBest": 1, "saveTrialLatest": 0}
    await ok(api.patch(path, json={"id": trial.experiment_id, "checkpointStorage": policy}))
    assert await states(api, trial.experiment_id) == {
        1: ("DELETING", "STATE_PARTIALLY_DELETED"),
        2: ("ACTIVE", "STATE_COMPLETED"),  # the best validation loss
        3: ("DELETING", "STATE_PARTIALLY_DELETED"),
        4: ("DELETING", "STATE_PARTIALLY_DELETED"),
    }
    stored = (await experiment_of(api, trial.experiment_id))["config"]["checkpoint_storage"]
    assert (stored["save_trial_best"], stored["save_trial_latest"]) == (1, 0)
    assert stored["host_path"] == str(storage)  # the rest of the storage is as it was


async def test_archive_takes_an_ended_experiment_out_of_the_default_list(
    api: httpx.AsyncClient,
) -> None:
    experiment = await new_experiment(api)
    path = f"/api/v1/experiments/{experiment['id']}"
    message = refusal(await api.post(f"{path}/archive"), 409)
    assert message == (
        f"experiment {experiment['id']} is ACTIVE: only an ended experiment can be archived "
        "(kill it or wait for it to end)"
    )
    assert (await experiment_of(api, experiment["id"]))["archived"] is False
    await ok(api.post(f"{path}/kill"))
    await ok(api.post(f"{path}/archive"))
    await ok(api.post(f"{path}/archive"))  # again: nothing changes
    assert (await experiment_of(api, experiment["id"]))["archived"] is True

    def ids(body: dict[str, Any]) -> list[int]:
        return [e["id"] for e in body["experiments"]]

    # What `det experiment list` asks (archived=false) leaves it out; --all shows it.
    assert experiment["id"] not in ids(
        await ok(api.get("/api/v1/experiments", params={"archived": "false"}))
    )
    assert experiment["id"] in ids(await ok(api.get("/api/v1/experiments")))
    await ok(api.post(f"{path}/unarchive"))
    assert experiment["id"] in ids(
        await ok(api.get("/api/v1/experiments", params={"archived": "false"}))
    )


async def test_only_the_owner_changes_settings_or_archives(
    api: httpx.AsyncClient,
    alice: httpx.AsyncClient,  # noqa: F811 - the fixture
) -> None:
    experiment = await new_experiment(api)
    path = f"/api/v1/experiments/{experiment['id']}"
    await ok(api.post(f"{path}/kill"))
    for verb in ("archive", "unarchive"):
        assert "only its owner or an admin" in refusal(await alice.post(f"{path}/{verb}"), 403)
    reply = await alice.patch(path, json={"resources": {"weight": 3}})
    assert "only its owner or an admin may change it" in refusal(reply, 403)
    stored = await experiment_of(api, experiment["id"])
    assert stored["archived"] is False and stored["config"]["resources"]["weight"] == 1.0


async def test_unknown_experiments_are_404(api: httpx.AsyncClient) -> None:
    for verb in ("archive", "unarchive"):
        reply = await api.post(f"/api/v1/experiments/999999/{verb}")
        assert refusal(reply, 404) == "experiment 999999 not found"
    reply = await api.patch("/api/v1/experiments/999999", json={"resources": {"priority": 5}})
    assert refusal(reply, 404) == "experiment 999999 not found"
