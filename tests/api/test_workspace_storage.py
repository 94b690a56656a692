"""A workspace's checkpoint storage (Determined's checkpointStorageConfig), on both
databases: its experiments that name no storage keep their checkpoints there, between
their own config's (a template's counts as their own) and the master's default; its
secrets are never shown, and one sent back masked keeps the stored value."""

from __future__ import annotations

import json
from typing import Any

import httpx
from fastapi import FastAPI

from master.db.models import ExperimentModel
from master.db.session import session_scope
from tests.api.test_access import alice, give_viewer, refusal  # noqa: F401 - alice is a fixture
from tests.api.test_workspaces import new_project, new_workspace, workspaces_of
from tests.factories import create_experiment

SINGLE = """\
name: stored
entrypoint: python3 train.py
searcher: {name: single, metric: loss, max_length: {batches: 10}}
"""
TEAM_BUCKET = {
    "type": "s3",
    "bucket": "vision-checkpoints",
    "access_key": "AKIAVISION",
    "secret_key": "vision-secret",
    "endpoint_url": "http://127.0.0.1:9000",
    "save_trial_latest": 2,
}


async def stored_storage(app: FastAPI, experiment_id: int) -> dict[str, Any]:
    """The checkpoint storage the master keeps for the experiment, secrets and all."""
    async with session_scope(app.state.session_factory) as session:
        experiment = await session.get(ExperimentModel, experiment_id)
        assert experiment is not None
        storage: dict[str, Any] = experiment.config["checkpoint_storage"]
        return storage


async def submit(api: httpx.AsyncClient, project_id: int, extra: str = "") -> int:
    reply = await create_experiment(api, SINGLE + extra, projectId=project_id)
    assert reply.status_code == 200, reply.text
    experiment_id: int = reply.json()["experiment"]["id"]
    return experiment_id


async def test_a_workspaces_storage_takes_its_experiments_that_name_none(
    app: FastAPI, api: httpx.AsyncClient
) -> None:
    reply = await api.post(
        "/api/v1/workspaces", json={"name": "vision", "checkpointStorageConfig": TEAM_BUCKET}
    )
    assert reply.status_code == 200, reply.text
    vision = reply.json()["workspace"]
    shown = vision["checkpointStorageConfig"]
    assert shown["bucket"] == "vision-checkpoints" and shown["secret_key"] == "********"
    assert "vision-secret" not in reply.text and "AKIAVISION" not in reply.text
    (listed,) = await workspaces_of(api, name="vision")
    assert listed["checkpointStorageConfig"]["secret_key"] == "********"

    in_vision = (await new_project(api, vision["id"], "detection"))["id"]
    plain = await submit(api, in_vision)
    assert TEAM_BUCKET.items() <= (await stored_storage(app, plain)).items()
    shown_config = (await api.get(f"/api/v1/experiments/{plain}")).json()["experiment"]["config"]
    assert shown_config["checkpoint_storage"]["secret_key"] == "********"

    # The experiment's own storage wins, and so does a template's.
    own = await submit(
        api, in_vision, "checkpoint_storage: {type: shared_fs, host_path: /tmp/own}\n"
    )
    assert (await stored_storage(app, own))["host_path"] == "/tmp/own"
    template = {"config": {"checkpoint_storage": {"type": "shared_fs", "host_path": "/tmp/tpl"}}}
    assert (await api.post("/api/v1/templates/team", json=template)).status_code == 200
    reply = await create_experiment(api, SINGLE, projectId=in_vision, template="team")
    assert reply.status_code == 200, reply.text
    by_template = reply.json()["experiment"]["id"]
    assert (await stored_storage(app, by_template))["host_path"] == "/tmp/tpl"

    # Another workspace, and the default one, still get the master's.
    other = await new_workspace(api, "nlp")
    in_nlp = (await new_project(api, other["id"], "p"))["id"]
    master_default = await stored_storage(app, await submit(api, in_nlp))
    assert master_default["type"] == "shared_fs"

    # Edited with its secrets sent back masked: the stored ones are kept.
    edited = {**shown, "bucket": "vision-v2"}
    reply = await api.patch(
        f"/api/v1/workspaces/{vision['id']}", json={"checkpointStorageConfig": edited}
    )
    assert reply.status_code == 200, reply.text
    after_edit = await stored_storage(app, await submit(api, in_vision))
    assert {**TEAM_BUCKET, "bucket": "vision-v2"}.items() <= after_edit.items()
    # The experiments already submitted keep the storage they were given.
    assert TEAM_BUCKET.items() <= (await stored_storage(app, plain)).items()
    # {} clears it: the master's default again.
    reply = await api.patch(
        f"/api/v1/workspaces/{vision['id']}", json={"checkpointStorageConfig": {}}
    )
    assert reply.status_code == 200 and reply.json()["workspace"]["checkpointStorageConfig"] is None
    assert await stored_storage(app, await submit(api, in_vision)) == master_default


async def test_bad_storage_is_refused_naming_the_field_and_changes_nothing(
    api: httpx.AsyncClient,
    admin: httpx.AsyncClient,
    alice: httpx.AsyncClient,  # noqa: F811 - the fixture
) -> None:
    for storage, problem in [
        ({"type": "shared_fs"}, "checkpoint_storage.host_path: required for shared_fs storage"),
        ({"type": "s3"}, "checkpoint_storage.bucket"),
        ({"type": "nfs", "host_path": "/x"}, "checkpoint_storage"),
        ({"bucket": "b"}, "checkpoint_storage.type"),
        ({**TEAM_BUCKET, "secret_key": "********"}, "******** is how the master shows a secret"),
        ("s3://bucket", "checkpointStorageConfig: must be a mapping"),
        ({"type": "shared_fs", "host_path": "/x", "colour": "red"}, "colour"),
    ]:
        body = json.dumps({"name": "refused", "checkpointStorageConfig": storage})
        reply = await api.post(
            "/api/v1/workspaces", content=body, headers={"content-type": "application/json"}
        )
        message = refusal(reply, 400)
        assert problem in message and "checkpointStorageConfig" in message, (storage, message)
        assert await workspaces_of(api, name="refused") == []

    mine = await new_workspace(api, "mine")
    reply = await api.patch(
        f"/api/v1/workspaces/{mine['id']}", json={"checkpointStorageConfig": {"type": "gcs"}}
    )
    assert "checkpoint_storage.bucket" in refusal(reply, 400)
    # Only its owner (or an admin) sets it: another user is refused as a Viewer, and as a
    # stranger does not see it at all.
    reply = await alice.patch(
        f"/api/v1/workspaces/{mine['id']}", json={"checkpointStorageConfig": TEAM_BUCKET}
    )
    refusal(reply, 404)
    await give_viewer(admin, alice, mine["id"])
    reply = await alice.patch(
        f"/api/v1/workspaces/{mine['id']}", json={"checkpointStorageConfig": TEAM_BUCKET}
    )
    refusal(reply, 403)
    (unchanged,) = await workspaces_of(api, name="mine")
    assert unchanged["checkpointStorageConfig"] is None
