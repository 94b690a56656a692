"""The model registry's dashboard pages, in process on both databases: the list, and a
model with its versions, their checkpoints and where those came from."""

from __future__ import annotations

import httpx

from tests.api.test_trial_reports import ok, report, save, submit
from tests.web.test_pages import bearer


async def test_models_list_and_a_models_versions_with_their_checkpoints(
    web: httpx.AsyncClient,
) -> None:
    await bearer(web)
    (trial,) = (await submit(web))[:1]
    await ok(report(web, trial, "validation", 5, {"loss": 0.375}))
    uuid = await save(web, trial, 5)
    await ok(web.post("/api/v1/models", json={"name": "digits", "description": "a CNN"}))
    await ok(web.post("/api/v1/models", json={"name": "old"}))
    await ok(web.post("/api/v1/models/old/archive"))
    await ok(
        web.post(
            "/api/v1/models/digits/versions",
            json={"checkpointUuid": uuid, "name": "first cut"},
        )
    )

    page = await web.get("/ui/models")
    assert page.status_code == 200, page.text
    assert 'data-model="digits"' in page.text and "a CNN" in page.text
    assert 'data-model="old"' not in page.text  # archived ones only when asked
    assert 'data-model="old"' in (await web.get("/ui/models?archived=true")).text
    assert 'data-model="digits"' not in (await web.get("/ui/models?name=zzz")).text

    model = await web.get("/ui/models/digits")
    assert model.status_code == 200, model.text
    assert 'data-version="1"' in model.text and uuid in model.text
    assert "first cut" in model.text and "loss=0.375" in model.text
    assert f'href="/ui/trials/{trial.id}"' in model.text
    assert f'href="/ui/experiments/{trial.experiment_id}"' in model.text

    missing = await web.get("/ui/models/nope")
    assert missing.status_code == 404 and "no model named" in missing.text
