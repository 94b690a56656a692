"""Trial source infos on both databases: a batch-inference trial says which model version
(or checkpoint) it used, and its metrics are then read back from that version and that
checkpoint, as Determined's SDK reads them (`ModelVersion.iter_metrics()`,
`Checkpoint.get_metrics()`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.api.test_access import (
    alice,  # noqa: F401  (a fixture)
    refusal,
)
from tests.api.test_model_registry import a_trial, create, register
from tests.api.test_trial_reports import Trial, ok, report, save

INFERENCE = "TRIAL_SOURCE_INFO_TYPE_INFERENCE"
FINE_TUNING = "TRIAL_SOURCE_INFO_TYPE_FINE_TUNING"


@pytest.fixture
def storage(tmp_path: Path) -> Path:
    return tmp_path / "checkpoints"


def source(trial: Trial, uuid: str, kind: str = INFERENCE, **version: Any) -> dict[str, Any]:
    return {
        "trialSourceInfo": {
            "trialId": trial.id,
            "checkpointUuid": uuid,
            "trialSourceInfoType": kind,
            **version,
        }
    }


async def version_metrics(
    api: httpx.AsyncClient, model: str, number: int, **params: str
) -> list[dict[str, Any]]:
    body = await ok(api.get(f"/api/v1/models/{model}/versions/{number}/metrics", params=params))
    reports: list[dict[str, Any]] = body["metrics"]
    return reports


async def test_an_inference_trials_metrics_are_read_from_the_version_and_the_checkpoint(
    api: httpx.AsyncClient, storage: Path
) -> None:
    trainer = await a_trial(api, storage)
    uuid = await save(api, trainer, 100)
    model = await create(api, "classifier")
    version = await register(api, "classifier", uuid)
    other_uuid = await save(api, trainer, 200)
    await register(api, "classifier", other_uuid)

    inference, unrelated = await a_trial(api, storage), await a_trial(api, storage)
    by_version = {"modelId": model["id"], "modelVersion": version["version"]}
    reply = await ok(
        api.post("/api/v1/trial-source-info", json=source(inference, uuid, **by_version))
    )
    assert reply == {"trialId": inference.id, "checkpointUuid": uuid}
    # Reported again (a restarted trial does): still one link, the metrics listed once.
    await ok(api.post("/api/v1/trial-source-info", json=source(inference, uuid, **by_version)))
    await ok(report(api, inference, "inference", 10, {"latency_ms": 3.5}))
    await ok(report(api, inference, "validation", 10, {"accuracy": 0.75}))
    await ok(report(api, unrelated, "inference", 10, {"latency_ms": 99}))

    everything = await version_metrics(api, "classifier", 1)
    assert [(m["trialId"], m["group"], m["totalBatches"]) for m in everything] == [
        (inference.id, "inference", 10),
        (inference.id, "validation", 10),
    ]
    first = everything[0]
    assert first["metrics"] == {"avg_metrics": {"latency_ms": 3.5}}
    assert everything[1]["metrics"] == {"validation_metrics": {"accuracy": 0.75}}
    assert first["trialRunId"] == inference.run_id and first["archived"] is False
    assert first["endTime"] and isinstance(first["id"], int)

    # Filtered by group and by kind, by the model's id as well as its name.
    assert [
        m["group"] for m in await version_metrics(api, "classifier", 1, metricGroup="inference")
    ] == ["inference"]
    assert await version_metrics(api, str(model["id"]), 1, trialSourceInfoType=FINE_TUNING) == []
    assert len(await version_metrics(api, "classifier", 1, trialSourceInfoType=INFERENCE)) == 2
    # The other version was used by no one.
    assert await version_metrics(api, "classifier", 2) == []

    by_checkpoint = await ok(
        api.get(f"/api/v1/checkpoints/{uuid}/metrics", params={"trialSourceInfoType": INFERENCE})
    )
    assert by_checkpoint["metrics"] == everything
    nothing = await ok(api.get(f"/api/v1/checkpoints/{other_uuid}/metrics"))
    assert nothing == {"metrics": []}

    # A deleted version leaves the checkpoint's link: its metrics are still the checkpoint's.
    await ok(api.delete("/api/v1/models/classifier/versions/1"))
    after = await ok(api.get(f"/api/v1/checkpoints/{uuid}/metrics"))
    assert after["metrics"] == everything


async def test_a_trial_may_report_a_checkpoint_alone(api: httpx.AsyncClient, storage: Path) -> None:
    trainer = await a_trial(api, storage)
    uuid = await save(api, trainer, 100)
    tuner = await a_trial(api, storage)
    await ok(api.post("/api/v1/trial-source-info", json=source(tuner, uuid, FINE_TUNING)))
    await ok(report(api, tuner, "training", 5, {"loss": 0.5}))
    reports = (await ok(api.get(f"/api/v1/checkpoints/{uuid}/metrics")))["metrics"]
    assert [(m["trialId"], m["metrics"]) for m in reports] == [
        (tuner.id, {"avg_metrics": {"loss": 0.5}})
    ]
    only_inference = await ok(
        api.get(f"/api/v1/checkpoints/{uuid}/metrics", params={"trialSourceInfoType": INFERENCE})
    )
    assert only_inference == {"metrics": []}


async def test_bad_reports_are_refused_naming_the_field_and_change_nothing(
    api: httpx.AsyncClient,
    alice: httpx.AsyncClient,  # noqa: F811  (the fixture)
    storage: Path,
) -> None:
    trainer = await a_trial(api, storage)
    uuid, other = await save(api, trainer, 100), await save(api, trainer, 200)
    model = await create(api, "refusals")
    await register(api, "refusals", uuid)
    user = await a_trial(api, storage)

    def post(body: dict[str, Any]) -> Any:
        return api.post("/api/v1/trial-source-info", json=body)

    message = refusal(await post(source(user, uuid, "TRIAL_SOURCE_INFO_TYPE_UNSPECIFIED")), 400)
    assert message.startswith("trialSourceInfo.trialSourceInfoType: ")
    assert "TRIAL_SOURCE_INFO_TYPE_INFERENCE" in message
    message = refusal(await post(source(user, "no-such-checkpoint")), 404)
    assert message.startswith("trialSourceInfo.checkpointUuid: ")
    message = refusal(await post(source(user, uuid, modelId=model["id"])), 400)
    assert message == "trialSourceInfo.modelVersion: give modelId and modelVersion together"
    message = refusal(await post(source(user, uuid, modelId=model["id"], modelVersion=7)), 404)
    assert message == f"trialSourceInfo.modelVersion: model {model['id']} has no version 7"
    message = refusal(await post(source(user, other, modelId=model["id"], modelVersion=1)), 400)
    assert message == (
        f"trialSourceInfo.checkpointUuid: version 1 of model {model['id']} holds checkpoint "
        f"{uuid}, not {other}"
    )
    refusal(await post({"trialSourceInfo": {**source(user, uuid)["trialSourceInfo"], "x": 1}}), 400)
    refusal(await post(source(Trial(987654, 1, "", "", 0), uuid)), 404)
    # Only the trial's owner (or an admin) says what it used.
    refusal(await alice.post("/api/v1/trial-source-info", json=source(user, uuid)), 403)
    # Nothing was recorded by any of them.
    await ok(report(api, user, "inference", 1, {"latency_ms": 1}))
    assert (await ok(api.get(f"/api/v1/checkpoints/{uuid}/metrics")))["metrics"] == []

    message = refusal(
        await api.get(f"/api/v1/checkpoints/{uuid}/metrics", params={"trialSourceInfoType": "X"}),
        400,
    )
    assert message.startswith("trialSourceInfoType: 'X' is not one of")
    refusal(await api.get("/api/v1/models/refusals/versions/9/metrics"), 404)
    refusal(await api.get("/api/v1/models/no-such-model/versions/1/metrics"), 404)
    refusal(await api.get("/api/v1/checkpoints/no-such-checkpoint/metrics"), 404)
