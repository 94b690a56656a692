"""The model registry on Determined's routes, on both databases: models and versions, the
checkpoints they hold (kept from retention, refused to deletes), refusals and owners."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from master.db.models import CheckpointModel
from master.db.session import session_scope
from master.services.checkpoint_gc import mark_deleting
from tests.api.test_access import (
    alice,  # noqa: F401  (a fixture)
    refusal,
)
from tests.api.test_checkpoint_gc import checkpoint_with_files, config_for, deleter_pass, states
from tests.api.test_no_server_errors import scalars
from tests.api.test_trial_reports import Trial, ok, save, submit

# Every key Determined's client indexes in a v1Model and a v1ModelVersion.
MODEL_KEYS = {
    "archived",
    "creationTime",
    "id",
    "lastUpdatedTime",
    "metadata",
    "name",
    "numVersions",
    "userId",
    "username",
    "workspaceId",
}
VERSION_KEYS = {"checkpoint", "creationTime", "id", "lastUpdatedTime", "model", "version"}
CHECKPOINT_KEYS = {"uuid", "taskId", "allocationId", "reportTime", "state", "resources"}


@pytest.fixture
def storage(tmp_path: Path) -> Path:
    return tmp_path / "checkpoints"


async def a_trial(api: httpx.AsyncClient, storage: Path) -> Trial:
    (trial,) = await submit(api, config_for(storage))
    return trial


async def create(api: httpx.AsyncClient, name: str, **fields: Any) -> dict[str, Any]:
    model: dict[str, Any] = (await ok(api.post("/api/v1/models", json={"name": name, **fields})))[
        "model"
    ]
    return model


async def register(
    api: httpx.AsyncClient, model: str | int, uuid: str, **fields: Any
) -> dict[str, Any]:
    body = {"checkpointUuid": uuid, "modelName": str(model), **fields}
    version: dict[str, Any] = (await ok(api.post(f"/api/v1/models/{model}/versions", json=body)))[
        "modelVersion"
    ]
    return version


async def model_names(api: httpx.AsyncClient, **params: Any) -> list[str]:
    body = await ok(api.get("/api/v1/models", params=params))
    return [m["name"] for m in body["models"]]


async def test_a_model_is_created_read_by_name_or_id_listed_changed_and_deleted(
    api: httpx.AsyncClient,
) -> None:
    model = await create(
        api,
        "mnist-cnn",
        description="digits",
        labels=["vision", "prod"],
        metadata={"framework": "torch", "layers": [1, 2]},
        notes=None,
        workspaceName=None,
    )
    assert model.keys() >= MODEL_KEYS
    assert model["name"] == "mnist-cnn" and model["description"] == "digits"
    assert model["labels"] == ["vision", "prod"] and model["numVersions"] == 0
    assert model["metadata"] == {"framework": "torch", "layers": [1, 2]}
    assert model["username"] == "determined" and model["archived"] is False
    assert model["workspaceId"] >= 1

    by_name = (await ok(api.get("/api/v1/models/mnist-cnn")))["model"]
    by_id = (await ok(api.get(f"/api/v1/models/{model['id']}")))["model"]
    assert by_name == by_id == model

    await create(api, "bert-base", description="text")
    listed = await ok(api.get("/api/v1/models", params={"sortBy": "SORT_BY_NAME"}))
    assert [m["name"] for m in listed["models"]] == ["bert-base", "mnist-cnn"]
    assert listed["pagination"]["total"] == 2 and listed["pagination"]["endIndex"] == 2
    desc = {"sortBy": "SORT_BY_NAME", "orderBy": "ORDER_BY_DESC"}
    assert await model_names(api, **desc) == ["mnist-cnn", "bert-base"]
    assert await model_names(api, name="MNIST") == ["mnist-cnn"]
    assert await model_names(api, labels=["vision"]) == ["mnist-cnn"]
    assert await model_names(api, id=model["id"]) == ["mnist-cnn"]
    assert await model_names(api, users="determined", sortBy="SORT_BY_NAME") == [
        "bert-base",
        "mnist-cnn",
    ]
    page = await ok(api.get("/api/v1/models", params={"limit": 1, "sortBy": "SORT_BY_NAME"}))
    assert [m["name"] for m in page["models"]] == ["bert-base"]
    assert page["pagination"]["endIndex"] == 1 and page["pagination"]["total"] == 2

    patched = (
        await ok(
            api.patch(
                "/api/v1/models/mnist-cnn",
                json={"description": "handwritten digits", "metadata": {"framework": "jax"}},
            )
        )
    )["model"]
    assert patched["description"] == "handwritten digits"
    assert patched["metadata"] == {"framework": "jax"} and patched["labels"] == ["vision", "prod"]
    renamed = (await ok(api.patch("/api/v1/models/mnist-cnn", json={"name": "mnist"})))["model"]
    assert renamed["name"] == "mnist" and renamed["id"] == model["id"]

    await ok(api.post("/api/v1/models/mnist/archive"))
    assert (await ok(api.get("/api/v1/models/mnist")))["model"]["archived"] is True
    assert await model_names(api, archived="false") == ["bert-base"]
    await ok(api.post("/api/v1/models/mnist/unarchive"))
    assert (await ok(api.get("/api/v1/models/mnist")))["model"]["archived"] is False
    assert (await ok(api.get("/api/v1/model/labels")))["labels"] == ["prod", "vision"]

    await ok(api.delete("/api/v1/models/mnist"))
    assert "no model named 'mnist'" in refusal(await api.get("/api/v1/models/mnist"), 404)
    assert await model_names(api) == ["bert-base"]


async def test_versions_are_numbered_per_model_and_carry_their_checkpoint(
    api: httpx.AsyncClient, storage: Path
) -> None:
    trial = await a_trial(api, storage)
    first = await checkpoint_with_files(api, storage, trial, 1, 0.5)
    second = await checkpoint_with_files(api, storage, trial, 2, 0.25)
    model = await create(api, "resnet")
    await create(api, "other")

    v1 = await register(api, "resnet", first, name="baseline", comment="c", metadata={"a": 1})
    assert v1.keys() >= VERSION_KEYS and v1["version"] == 1
    assert v1["name"] == "baseline" and v1["comment"] == "c" and v1["metadata"] == {"a": 1}
    assert v1["model"]["name"] == "resnet" and v1["model"]["numVersions"] == 1
    checkpoint = v1["checkpoint"]
    assert checkpoint.keys() >= CHECKPOINT_KEYS and checkpoint["uuid"] == first
    assert checkpoint["state"] == "STATE_COMPLETED"
    assert checkpoint["training"]["trialId"] == trial.id
    assert checkpoint["training"]["experimentId"] == trial.experiment_id
    assert checkpoint["training"]["validationMetrics"]["avgMetrics"] == {"loss": 0.5}
    assert checkpoint["metadata"]["steps_completed"] == 1
    # By id in the path, as `det model register-version --json` sends it; and the same
    # checkpoint may be a version of two models.
    v2 = await register(api, model["id"], second)
    assert v2["version"] == 2
    assert (await register(api, "other", second))["version"] == 1

    listed = await ok(
        api.get("/api/v1/models/resnet/versions", params={"orderBy": "ORDER_BY_DESC"})
    )
    assert [v["version"] for v in listed["modelVersions"]] == [2, 1]
    assert listed["model"]["numVersions"] == 2 and listed["pagination"]["total"] == 2
    latest = await ok(
        api.get(
            "/api/v1/models/resnet/versions",
            params={"limit": 1, "sortBy": "SORT_BY_VERSION", "orderBy": "ORDER_BY_DESC"},
        )
    )
    assert [v["checkpoint"]["uuid"] for v in latest["modelVersions"]] == [second]

    one = (await ok(api.get("/api/v1/models/resnet/versions/1")))["modelVersion"]
    assert one["checkpoint"]["uuid"] == first and one["name"] == "baseline"
    patched = (
        await ok(
            api.patch(
                "/api/v1/models/resnet/versions/1",
                json={"name": "v-one", "notes": "# readme", "labels": ["best"]},
            )
        )
    )["modelVersion"]
    assert patched["name"] == "v-one" and patched["notes"] == "# readme"
    assert patched["labels"] == ["best"] and patched["comment"] == "c"

    await ok(api.delete("/api/v1/models/resnet/versions/2"))
    message = refusal(await api.get("/api/v1/models/resnet/versions/2"), 404)
    assert "modelVersionNum" in message and "no version 2" in message
    # The next number follows the highest one left.
    assert (await register(api, "resnet", second))["version"] == 2


async def test_retention_keeps_a_registered_checkpoint(
    api: httpx.AsyncClient, storage: Path
) -> None:
    trial = await a_trial(api, storage)  # keeps the best and the latest
    uuids = {
        steps: await checkpoint_with_files(api, storage, trial, steps, loss)
        for steps, loss in ((1, 0.5), (2, 0.1), (3, 0.9), (4, None))
    }
    await create(api, "kept")
    await register(api, "kept", uuids[3])
    await ok(api.post(f"/api/v1/experiments/{trial.experiment_id}/kill"))
    assert await states(api, trial.experiment_id) == {
        1: ("DELETING", "STATE_PARTIALLY_DELETED"),
        2: ("ACTIVE", "STATE_COMPLETED"),
        3: ("ACTIVE", "STATE_COMPLETED"),  # not the best nor the latest, but registered
        4: ("ACTIVE", "STATE_COMPLETED"),
    }
    assert (storage / uuids[3] / "model.pt").is_file()


async def test_deleting_a_registered_checkpoint_is_refused_until_its_version_goes(
    app: FastAPI, api: httpx.AsyncClient, storage: Path
) -> None:
    trial = await a_trial(api, storage)
    uuid = await checkpoint_with_files(api, storage, trial, 1, 0.5)
    await create(api, "held")
    await register(api, "held", uuid)
    body = {"checkpointUuids": [uuid]}
    message = refusal(await api.request("DELETE", "/api/v1/checkpoints", json=body), 409)
    assert uuid in message and "version 1 of model 'held'" in message
    await ok(api.post(f"/api/v1/experiments/{trial.experiment_id}/kill"))
    message = refusal(await api.delete(f"/api/v1/experiments/{trial.experiment_id}"), 409)
    assert "version 1 of model 'held'" in message
    experiment = (await ok(api.get(f"/api/v1/experiments/{trial.experiment_id}")))["experiment"]
    assert experiment["state"] != "STATE_DELETING"
    assert (await states(api, trial.experiment_id))[1] == ("ACTIVE", "STATE_COMPLETED")

    await ok(api.delete("/api/v1/models/held/versions/1"))
    await ok(api.request("DELETE", "/api/v1/checkpoints", json=body))
    await deleter_pass(app)
    assert (await states(api, trial.experiment_id))[1] == ("DELETED", "STATE_DELETED")
    assert not (storage / uuid).exists()


async def test_a_deletion_that_raced_a_registration_is_undone_before_any_file_goes(
    app: FastAPI, api: httpx.AsyncClient, storage: Path
) -> None:
    """Retention and a registration decided at once, both committed: the deleter finds
    the version and keeps the checkpoint, saying why."""
    trial = await a_trial(api, storage)
    uuid = await checkpoint_with_files(api, storage, trial, 1, 0.5)
    await create(api, "raced")
    await register(api, "raced", uuid)
    async with session_scope(app.state.session_factory) as session:
        checkpoint = await session.get(CheckpointModel, uuid)
        assert checkpoint is not None
        mark_deleting([checkpoint], "retention: decided beside the registration")
    assert (await states(api, trial.experiment_id))[1][0] == "DELETING"
    await deleter_pass(app)
    found = (await ok(api.get(f"/api/v1/checkpoints/{uuid}")))["checkpoint"]
    assert found["storageState"] == "ACTIVE"
    assert found["stateReason"] == "kept: version 1 of model 'raced'"
    assert (storage / uuid / "model.pt").is_file()


async def test_deleting_a_model_lets_its_checkpoints_go(
    api: httpx.AsyncClient, storage: Path
) -> None:
    trial = await a_trial(api, storage)
    uuid = await checkpoint_with_files(api, storage, trial, 1, 0.5)
    await save(api, trial, 2)  # the latest, which the queued trial would resume from
    await create(api, "gone")
    await register(api, "gone", uuid)
    await ok(api.delete("/api/v1/models/gone"))
    await ok(api.request("DELETE", "/api/v1/checkpoints", json={"checkpointUuids": [uuid]}))
    assert (await states(api, trial.experiment_id))[1][0] == "DELETING"


async def test_bad_models_are_refused_naming_the_field_and_nothing_changes(
    api: httpx.AsyncClient,
) -> None:
    await create(api, "taken", metadata={"k": "v"})
    before = await ok(api.get("/api/v1/models"))
    cases: list[tuple[dict[str, Any], int, str]] = [
        ({"name": "taken"}, 409, "name: a model named 'taken' already exists"),
        ({"name": ""}, 400, "name: a model needs a name"),
        ({"name": "   "}, 400, "name: a model needs a name"),
        ({}, 400, "name: a model needs a name"),
        ({"name": "1234"}, 400, "name: '1234' is only digits"),
        ({"name": "a/b"}, 400, "name:"),
        ({"name": "m", "metadata": [1, 2]}, 400, "metadata: must be a JSON object"),
        ({"name": "m", "metadata": "text"}, 400, "metadata: must be a JSON object"),
        ({"name": "m", "labels": "one"}, 400, "labels: must be a list of strings"),
        ({"name": "m", "description": 5}, 400, "description: must be a string"),
        ({"name": "m", "workspaceName": "nowhere"}, 404, "workspaceName: no workspace"),
        ({"name": "m", "workspaceId": 2**40}, 400, "body workspaceId:"),
        ({"name": "m\u0000"}, 400, "name: holds a NUL character"),
        ({"name": "m", "description": "a\u0000b"}, 400, "description: holds a NUL character"),
        ({"name": "m", "metadata": {"k": ["\u0000"]}}, 400, "metadata: holds a NUL character"),
    ]
    for body, status, expected in cases:
        message = refusal(await api.post("/api/v1/models", json=body), status)
        assert message.startswith(expected), (body, message)
    # A lone surrogate, escaped as a client may send it (httpx will not encode one).
    reply = await api.post("/api/v1/models", content=b'{"name": "m", "labels": ["\\ud800"]}')
    assert refusal(reply, 400).startswith("labels: a label holds a NUL character")
    patches: list[tuple[dict[str, Any], int, str]] = [
        ({"metadata": [1]}, 400, "metadata: must be a JSON object"),
        ({"metadata": 3}, 400, "metadata: must be a JSON object"),
        ({"name": ""}, 400, "name: a model needs a name"),
        ({"labels": [1]}, 400, "labels: must be a list of strings"),
    ]
    for body, status, expected in patches:
        message = refusal(await api.patch("/api/v1/models/taken", json=body), status)
        assert message.startswith(expected), (body, message)
    await create(api, "second")
    message = refusal(await api.patch("/api/v1/models/second", json={"name": "taken"}), 409)
    assert message.startswith("name: a model named 'taken' already exists")
    await ok(api.delete("/api/v1/models/second"))
    assert await ok(api.get("/api/v1/models")) == before

    for path in ("/api/v1/models/nope", "/api/v1/models/nope/versions", "/api/v1/models/999999"):
        assert refusal(await api.get(path), 404).startswith("modelName: no model named")
    for method in ("PATCH", "DELETE"):
        reply = await api.request(method, "/api/v1/models/nope", json={"description": "x"})
        assert refusal(reply, 404).startswith("modelName:")
    assert refusal(await api.post("/api/v1/models/nope/archive"), 404).startswith("modelName:")
    assert refusal(await api.get("/api/v1/models/a%00b"), 404).startswith("modelName:")
    reply = await api.get("/api/v1/models", params={"name": "a\x00"})
    assert refusal(reply, 400).startswith("name: holds a NUL character")
    reply = await api.get("/api/v1/models", params={"userIds": 2**40})
    assert refusal(reply, 400).startswith("query userIds")
    reply = await api.get("/api/v1/models", params={"sortBy": "SORT_BY_COLOUR"})
    assert refusal(reply, 400).startswith("sortBy:")


async def test_bad_versions_are_refused_naming_the_field_and_nothing_changes(
    app: FastAPI, api: httpx.AsyncClient, storage: Path
) -> None:
    trial = await a_trial(api, storage)
    good = await checkpoint_with_files(api, storage, trial, 1, 0.5)
    deleting = await checkpoint_with_files(api, storage, trial, 2, 0.4)
    deleted = await save(api, trial, 3)
    await save(api, trial, 4)  # the latest, which the queued trial would resume from
    await ok(api.request("DELETE", "/api/v1/checkpoints", json={"checkpointUuids": [deleted]}))
    await deleter_pass(app)
    await ok(api.request("DELETE", "/api/v1/checkpoints", json={"checkpointUuids": [deleting]}))
    await create(api, "strict")
    await register(api, "strict", good)
    missing = "5f0e1a9c-0000-4000-8000-000000000000"
    cases: list[tuple[dict[str, Any], int, str]] = [
        ({"checkpointUuid": missing}, 404, f"checkpointUuid: no checkpoint {missing}"),
        ({"checkpointUuid": "not-a-uuid"}, 404, "checkpointUuid: no checkpoint not-a-uuid"),
        ({"checkpointUuid": ""}, 400, "checkpointUuid: give the uuid"),
        ({}, 400, "checkpointUuid: give the uuid"),
        ({"checkpointUuid": deleted}, 400, f"checkpointUuid: checkpoint {deleted} is DELETED"),
        ({"checkpointUuid": deleting}, 400, f"checkpointUuid: checkpoint {deleting} is being"),
        ({"checkpointUuid": good, "metadata": [1]}, 400, "metadata: must be a JSON object"),
        ({"checkpointUuid": good, "labels": {}}, 400, "labels: must be a list of strings"),
    ]
    for body, status, expected in cases:
        reply = await api.post("/api/v1/models/strict/versions", json=body)
        assert refusal(reply, status).startswith(expected), (body, reply.text)
    reply = await api.post("/api/v1/models/absent/versions", json={"checkpointUuid": good})
    assert refusal(reply, 404).startswith("modelName: no model named 'absent'")
    reply = await api.patch("/api/v1/models/strict/versions/1", json={"metadata": "x"})
    assert refusal(reply, 400).startswith("metadata: must be a JSON object")
    for method in ("GET", "PATCH", "DELETE"):
        reply = await api.request(method, "/api/v1/models/strict/versions/7", json={})
        assert refusal(reply, 404).startswith("modelVersionNum: model 'strict' has no version 7")
    reply = await api.get("/api/v1/models/strict/versions/seven")
    assert refusal(reply, 400).startswith("path version: Input should be a valid integer")

    await ok(api.post("/api/v1/models/strict/archive"))
    reply = await api.post("/api/v1/models/strict/versions", json={"checkpointUuid": good})
    assert "is archived" in refusal(reply, 400)
    versions = await ok(api.get("/api/v1/models/strict/versions"))
    assert [(v["version"], v["checkpoint"]["uuid"]) for v in versions["modelVersions"]] == [
        (1, good)
    ]
    assert versions["modelVersions"][0]["metadata"] == {}


async def test_only_the_owner_or_an_admin_changes_a_model(
    api: httpx.AsyncClient,
    admin: httpx.AsyncClient,
    alice: httpx.AsyncClient,  # noqa: F811
    storage: Path,
) -> None:
    trial = await a_trial(api, storage)
    uuid = await checkpoint_with_files(api, storage, trial, 1, 0.5)
    await create(api, "mine")
    theirs = await create(alice, "alices", description="hers")
    assert theirs["username"] == "alice"
    # Anyone signed in reads every model, and may register anyone's checkpoint in their own.
    assert (await ok(alice.get("/api/v1/models/mine")))["model"]["username"] == "determined"
    assert (await register(alice, "alices", uuid))["version"] == 1

    for method, path, body in (
        ("PATCH", "/api/v1/models/mine", {"description": "x"}),
        ("POST", "/api/v1/models/mine/archive", None),
        ("POST", "/api/v1/models/mine/versions", {"checkpointUuid": uuid}),
        ("DELETE", "/api/v1/models/mine", None),
    ):
        reply = await alice.request(method, path, json=body)
        message = refusal(reply, 403)
        assert "model 'mine' belongs to determined" in message, (method, path, message)
    assert (await ok(api.get("/api/v1/models/mine")))["model"]["description"] == ""
    await ok(admin.patch("/api/v1/models/alices", json={"description": "checked"}))
    await ok(admin.delete("/api/v1/models/alices/versions/1"))
    await ok(api.delete("/api/v1/models/mine"))
    assert await model_names(api) == ["alices"]


async def test_a_body_without_content_type_registers(api: httpx.AsyncClient) -> None:
    """Determined's client sends JSON bodies without a Content-Type header."""
    reply = await api.post("/api/v1/models", content=b'{"name": "bare", "metadata": {"x": 1}}')
    assert reply.status_code == 200, reply.text
    assert reply.json()["model"]["metadata"] == {"x": 1}


FIELDS = st.sampled_from(
    [
        "name",
        "description",
        "notes",
        "labels",
        "metadata",
        "workspaceId",
        "workspaceName",
        "checkpointUuid",
        "modelName",
        "comment",
        "checkpoint",
        "uuid",
    ]
)
BODIES = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(FIELDS, children, max_size=4),
    max_leaves=10,
)
REGISTRY_ROUTES = [
    ("POST", "/api/v1/models"),
    ("PATCH", "/api/v1/models/{m}"),
    ("POST", "/api/v1/models/{m}/versions"),
    ("PATCH", "/api/v1/models/{m}/versions/{v}"),
    ("GET", "/api/v1/models"),
    ("GET", "/api/v1/models/{m}/versions"),
]


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
async def test_random_registry_requests_never_fail_the_server(
    api: httpx.AsyncClient, data: st.DataObject
) -> None:
    """Random bodies and query values on the registry's routes: a 200 or the client's 4xx."""
    if (await api.get("/api/v1/models/fuzzed")).status_code == 404:
        await create(api, "fuzzed")
    method, template = data.draw(st.sampled_from(REGISTRY_ROUTES))
    model = data.draw(st.sampled_from(["fuzzed", "1", "nope", "x y"]))
    path = template.replace("{m}", model).replace("{v}", str(data.draw(st.integers(0, 3))))
    params = data.draw(
        st.dictionaries(
            st.sampled_from(["sortBy", "orderBy", "labels", "users", "archived", "id", "limit"]),
            scalars.map(str),
            max_size=2,
        )
    )
    reply = await api.request(method, path, json=data.draw(BODIES), params=params)
    assert reply.status_code < 500, (method, path, reply.text)
    if reply.status_code != 200:
        assert reply.json()["message"]
