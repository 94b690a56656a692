"""Issue 32's last registry and retention routes, on both databases: the preview `det
experiment set gc-policy` shows before it asks (GET /experiments/{id}/preview_gc, outside
/api/v1 as in Determined), and moving a model to another workspace (POST
/api/v1/models/{name}/move)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.api.test_access import alice, refusal  # noqa: F401 - alice is a fixture
from tests.api.test_checkpoint_gc import checkpoint_with_files, config_for, states
from tests.api.test_trial_reports import ok, save, submit


async def test_the_preview_lists_what_a_policy_would_delete_and_changes_nothing(
    api: httpx.AsyncClient, tmp_path: Path
) -> None:
    storage = tmp_path / "checkpoints"
    (trial,) = await submit(api, config_for(storage, save_trial_latest=5))
    uuids = {}
    for steps, loss in ((1, 0.5), (2, 0.1), (3, 0.9), (4, None)):
        uuids[steps] = await checkpoint_with_files(api, storage, trial, steps, loss)
    path = f"/experiments/{trial.experiment_id}/preview_gc"
    # While the trial runs nothing is a candidate, as when the policy is applied.
    policy = {"save_experiment_best": 0, "save_trial_best": 1, "save_trial_latest": 0}
    assert (await ok(api.get(path, params=policy)))["checkpoints"] == []
    await ok(api.post(f"/api/v1/experiments/{trial.experiment_id}/kill"))
    preview = await ok(api.get(path, params=policy))
    assert preview["metric_name"] == "loss"
    doomed = {c["StepsCompleted"]: c for c in preview["checkpoints"]}
    assert sorted(doomed) == [1, 3, 4]  # the best validation (step 2) stays
    assert doomed[1]["UUID"] == uuids[1] and doomed[1]["TrialID"] == trial.id
    assert doomed[1]["ValidationMetrics"] == {"loss": 0.5}
    assert doomed[1]["step"] == {"validation": {"metrics": {"loss": 0.5}}}
    assert "step" not in doomed[4] and doomed[4]["ValidationMetrics"] == {}
    assert doomed[3]["State"] == "COMPLETED" and doomed[3]["ReportTime"].endswith("Z")
    # Nothing was deleted by looking; the experiment's own settings (latest 5) keep all.
    assert {s for s, _ in (await states(api, trial.experiment_id)).values()} == {"ACTIVE"}
    assert (await ok(api.get(path)))["checkpoints"] == []
    # One setting given, the others as the experiment has them (trial best 1): the best
    # (step 2) and the latest (step 4) stay.
    only_latest = await ok(api.get(path, params={"save_trial_latest": 1}))
    assert sorted(c["StepsCompleted"] for c in only_latest["checkpoints"]) == [1, 3]
    keep_none = {"save_experiment_best": 0, "save_trial_best": 0, "save_trial_latest": 1}
    kept_latest = await ok(api.get(path, params=keep_none))
    assert sorted(c["StepsCompleted"] for c in kept_latest["checkpoints"]) == [1, 2, 3]


@pytest.mark.parametrize(
    ("path", "params", "status", "problem"),
    [
        ("/experiments/99999/preview_gc", {}, 404, "experiment 99999 not found"),
        ("/experiments/{id}/preview_gc", {"save_trial_best": -1}, 400, "save_trial_best"),
        ("/experiments/{id}/preview_gc", {"save_trial_latest": "x"}, 400, "save_trial_latest"),
        (
            "/experiments/{id}/preview_gc",
            {"save_experiment_best": 2**31},
            400,
            "save_experiment_best",
        ),
    ],
)
async def test_bad_previews_are_refused_naming_the_parameter(
    api: httpx.AsyncClient, path: str, params: dict[str, Any], status: int, problem: str
) -> None:
    (trial,) = await submit(api)
    reply = await api.get(path.format(id=trial.experiment_id), params=params)
    assert reply.status_code in (status, 422), reply.text
    assert problem in reply.text


async def new_workspace(api: httpx.AsyncClient, name: str) -> int:
    workspace_id: int = (await ok(api.post("/api/v1/workspaces", json={"name": name})))[
        "workspace"
    ]["id"]
    return workspace_id


async def test_a_model_moves_to_another_workspace_with_its_versions(
    api: httpx.AsyncClient,
) -> None:
    (trial,) = await submit(api)
    uuid = await save(api, trial, 5)
    model = (await ok(api.post("/api/v1/models", json={"name": "digits"})))["model"]
    await ok(api.post("/api/v1/models/digits/versions", json={"checkpointUuid": uuid}))
    vision = await new_workspace(api, "vision")
    body = {"destinationWorkspaceId": vision, "modelName": "digits"}
    await ok(api.post("/api/v1/models/digits/move", json=body))
    moved = (await ok(api.get("/api/v1/models/digits")))["model"]
    assert moved["workspaceId"] == vision and moved["workspaceId"] != model["workspaceId"]
    listed = await ok(api.get("/api/v1/models", params={"workspaceIds": vision}))
    assert [m["name"] for m in listed["models"]] == ["digits"]
    versions = await ok(api.get("/api/v1/models/digits/versions"))
    assert [v["checkpoint"]["uuid"] for v in versions["modelVersions"]] == [uuid]
    # By id too, and to where it already is: nothing changes.
    await ok(api.post(f"/api/v1/models/{model['id']}/move", json=body))


async def test_bad_moves_are_refused_naming_the_field_and_change_nothing(
    api: httpx.AsyncClient,
    alice: httpx.AsyncClient,  # noqa: F811 - the fixture
) -> None:
    model = (await ok(api.post("/api/v1/models", json={"name": "digits"})))["model"]
    archived = await new_workspace(api, "old")
    await ok(api.post(f"/api/v1/workspaces/{archived}/archive"))
    vision = await new_workspace(api, "vision")
    cases = [
        (
            "digits",
            {"destinationWorkspaceId": 99999},
            404,
            "destinationWorkspaceId: no workspace 99999",
        ),
        ("digits", {"destinationWorkspaceId": 0}, 404, "destinationWorkspaceId: no workspace 0"),
        ("digits", {"destinationWorkspaceId": archived}, 400, "is archived"),
        ("digits", {"destinationWorkspaceId": -1}, 400, "destinationWorkspaceId"),
        ("digits", {}, 400, "destinationWorkspaceId"),
        ("nothing", {"destinationWorkspaceId": vision}, 404, "nothing"),
    ]
    for name, body, status, problem in cases:
        reply = await api.post(f"/api/v1/models/{name}/move", json=body)
        assert reply.status_code in (status, 422) and problem in reply.text, (body, reply.text)
    reply = await alice.post("/api/v1/models/digits/move", json={"destinationWorkspaceId": vision})
    assert "move it" in refusal(reply, 403)
    stored = (await ok(api.get("/api/v1/models/digits")))["model"]
    assert stored["workspaceId"] == model["workspaceId"]
