"""Workspaces kept apart for reading (issue 29, item 3; security.authz.type rbac, the
default): what is in a workspace a user has no role in answers 404 exactly as something that
does not exist, on every route whose path names it, and lists leave it out; with `basic`
every signed-in user reads everything, as before."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import text

from master.db.models import CheckpointModel
from master.db.session import session_scope
from master.web.common import COOKIE
from tests.api.test_access import PASSWORD, create_user, refusal, sign_in
from tests.api.test_roles import assignment, ok

CONFIG = (
    "name: {name}\nentrypoint: python3 train.py\n"
    "searcher: {{name: single, metric: loss, max_length: {{batches: 10}}}}\n"
)
# What each path parameter is given: something of vision's, and something that is nowhere.
MISSING = {
    "experiment_id": "987654",
    "trial_id": "987654",
    "run_id": "987654",
    "task_id": "0f0f0f0f-0000-4000-8000-000000000000",
    "allocation_id": "987654.1.1",
    "uuid": "0f0f0f0f-0000-4000-8000-0000000000aa",
    "checkpoint_uuid": "0f0f0f0f-0000-4000-8000-0000000000aa",
    "workspace_id": "987654",
    "project_id": "987654",
    "model_name": "nobodys-model",
    "identifier": "nobodys-model",
    "name": "nobodys-template",
    "version": "1",
}


@dataclass
class Vision:
    """alice's work in her workspace vision, which bob holds no role in."""

    alice: httpx.AsyncClient
    bob: httpx.AsyncClient
    admin: httpx.AsyncClient
    bob_id: int
    workspace: int = 0
    project: int = 0
    experiment: int = 0
    trial: int = 0
    params: dict[str, str] = field(default_factory=dict)


@pytest.fixture
async def vision(app: FastAPI, admin: httpx.AsyncClient) -> AsyncIterator[Vision]:
    await create_user(admin, "alice")
    bob_id = await create_user(admin, "bob")
    async with sign_in(app, "alice", PASSWORD) as alice, sign_in(app, "bob", PASSWORD) as bob:
        v = Vision(alice, bob, admin, bob_id)
        v.workspace = (await ok(await alice.post("/api/v1/workspaces", json={"name": "vision"})))[
            "workspace"
        ]["id"]
        v.project = (
            await ok(
                await alice.post(f"/api/v1/workspaces/{v.workspace}/projects", json={"name": "p"})
            )
        )["project"]["id"]
        created = await alice.post(
            "/api/v1/experiments",
            json={"config": CONFIG.format(name="hers"), "projectId": v.project},
        )
        v.experiment = (await ok(created))["experiment"]["id"]
        trials = await ok(await alice.get(f"/api/v1/experiments/{v.experiment}/trials"))
        v.trial = trials["trials"][0]["id"]
        uuid = "5e1f0000-0000-4000-8000-0000000000b1"
        async with session_scope(app.state.session_factory) as session:
            session.add(
                CheckpointModel(
                    uuid=uuid, trial_id=v.trial, experiment_id=v.experiment, steps_completed=1
                )
            )
        command = await ok(
            await alice.post(
                "/api/v1/commands",
                json={"config": {"entrypoint": "true"}, "workspaceId": v.workspace},
            )
        )
        await ok(
            await alice.post("/api/v1/models", json={"name": "hers", "workspaceId": v.workspace})
        )
        template = await alice.post(
            "/api/v1/templates/hers",
            json={"name": "hers", "config": {"description": "x"}, "workspaceId": v.workspace},
        )
        assert template.status_code == 200, template.text
        v.params = {
            "experiment_id": str(v.experiment),
            "trial_id": str(v.trial),
            "run_id": str(v.trial),
            "task_id": command["command"]["id"],
            "uuid": uuid,
            "checkpoint_uuid": uuid,
            "workspace_id": str(v.workspace),
            "project_id": str(v.project),
            "model_name": "hers",
            "identifier": "hers",
            "name": "hers",
            "version": "1",
            "allocation_id": "",
        }
        yield v


def _get_routes(app: FastAPI) -> list[str]:
    """Every GET route of the API whose path names something (the dashboard's are below)."""
    paths = app.openapi()["paths"]
    return sorted(p for p, ops in paths.items() if "get" in ops and "{" in p)


def _fill(path: str, values: dict[str, str]) -> str | None:
    names = re.findall(r"\{(\w+)(?::\w+)?\}", path)
    if any(n not in values or not values[n] for n in names):
        return None
    return re.sub(r"\{(\w+)(?::\w+)?\}", lambda m: values[m.group(1)], path)


def _same_words(route: str, hidden: httpx.Response, missing: httpx.Response, v: Vision) -> None:
    """The two answers differ only in the names the path asked for, within their words
    (so an id like 5 is not taken for the body's "code": 5)."""
    names = re.findall(r"\{(\w+)(?::\w+)?\}", route)

    def words(text: str) -> str:
        for name in sorted(names, key=lambda n: -len(v.params[n])):
            whole = rf"(?<![\w-]){re.escape(v.params[name])}(?![\w-])"
            text = re.sub(whole, MISSING[name], text)
        return text

    said, expected = hidden.json(), missing.json()
    said["message"] = words(said["message"])
    said["error"]["error"] = words(said["error"]["error"])
    assert said == expected, route


async def test_every_route_answers_for_anothers_workspace_as_for_nothing(
    app: FastAPI, vision: Vision
) -> None:
    checked = []
    for route in _get_routes(app):
        hidden_path, missing_path = _fill(route, vision.params), _fill(route, MISSING)
        if hidden_path is None or missing_path is None:
            continue
        if "versions/{version}" in route or route.endswith("/versions"):
            continue  # the model has no version: both are 404 at the version
        owner = await vision.alice.get(hidden_path)
        hidden = await vision.bob.get(hidden_path)
        missing = await vision.bob.get(missing_path)
        # The owner reads it (or is told something else: no validation yet).
        assert owner.status_code != 404 or owner.text != hidden.text, (route, owner.text)
        assert hidden.status_code == missing.status_code == 404, (route, hidden.text)
        _same_words(route, hidden, missing, vision)
        checked.append(route)
    # Each kind of thing at least once: experiments, trials, checkpoints, tasks, workspaces,
    # projects, models, templates.
    for kind in ("experiment_id", "trial_id", "uuid", "task_id", "workspace_id", "project_id"):
        assert any("{" + kind + "}" in r for r in checked), kind
    assert "/api/v1/models/{model_name}" in checked
    assert "/api/v1/templates/{name}" in checked
    assert len(checked) >= 25, checked


async def test_the_dashboard_answers_404_for_anothers_workspace(
    app: FastAPI, vision: Vision
) -> None:
    pages = [
        f"/ui/experiments/{vision.experiment}",
        f"/ui/trials/{vision.trial}",
        f"/ui/workspaces/{vision.workspace}",
        f"/ui/tasks/{vision.params['task_id']}",
        "/ui/models/hers",
        "/ui/templates/hers",
    ]
    alice_token = vision.alice.headers["Authorization"].split()[1]
    bob_token = vision.bob.headers["Authorization"].split()[1]
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://master") as browser:
        for page in pages:
            browser.cookies.set(COOKIE, alice_token)
            assert (await browser.get(page)).status_code == 200, page
            browser.cookies.set(COOKIE, bob_token)
            reply = await browser.get(page)
            assert reply.status_code == 404, page
            assert "alice" not in reply.text, page


async def _listed(client: httpx.AsyncClient) -> dict[str, Any]:
    experiments = await ok(await client.get("/api/v1/experiments"))
    commands = await ok(await client.get("/api/v1/commands"))
    models = await ok(await client.get("/api/v1/models"))
    templates = await ok(await client.get("/api/v1/templates"))
    workspaces = await ok(await client.get("/api/v1/workspaces"))
    projects = await ok(await client.get("/api/v1/workspaces/0/projects"))
    tasks = await ok(await client.get("/api/v1/tasks"))
    labels = await ok(await client.get("/api/v1/experiment/labels"))
    return {
        "experiments": sorted(e["name"] for e in experiments["experiments"]),
        "commands": len(commands["commands"]),
        "models": [m["name"] for m in models["models"]],
        "templates": [t["name"] for t in templates["templates"]],
        "workspaces": sorted(w["name"] for w in workspaces["workspaces"]),
        "projects": sorted(p["name"] for p in projects["projects"]),
        "tasks": len(tasks["allocationIdToSummary"]),
        "labels": labels["labels"],
    }


async def test_lists_leave_out_what_a_user_may_not_read(app: FastAPI, vision: Vision) -> None:
    await ok(await vision.alice.put(f"/api/v1/experiments/{vision.experiment}/labels/secret"))
    # bob's own experiment, in the shared workspace everyone reads.
    await ok(
        await vision.bob.post("/api/v1/experiments", json={"config": CONFIG.format(name="his")})
    )
    everything = {
        "experiments": ["hers", "his"],
        "commands": 1,
        "models": ["hers"],
        "templates": ["hers"],
        "workspaces": ["Uncategorized", "vision"],
        "projects": ["Uncategorized", "p"],
        "tasks": 3,
        "labels": ["secret"],
    }
    assert await _listed(vision.alice) == everything
    assert await _listed(vision.admin) == everything
    assert await _listed(vision.bob) == {
        "experiments": ["his"],
        "commands": 0,
        "models": [],
        "templates": [],
        "workspaces": ["Uncategorized"],
        "projects": ["Uncategorized"],
        "tasks": 1,
        "labels": [],
    }
    # A Viewer in vision reads it all; a role elsewhere gives nothing here.
    body = assignment("Viewer", user=vision.bob_id, ws=vision.workspace)
    await ok(await vision.admin.post("/api/v1/roles/add-assignments", json=body))
    assert await _listed(vision.bob) == everything
    await ok(await vision.admin.post("/api/v1/roles/remove-assignments", json=body))
    # Determined's open-source rule, as a setting: everyone reads everything.
    settings = app.state.settings
    basic = settings.model_copy(deep=True)
    basic.security.authz.type = "basic"
    app.state.settings = basic
    try:
        assert await _listed(vision.bob) == everything
    finally:
        app.state.settings = settings


async def test_a_change_of_roles_made_anywhere_is_seen_at_the_next_request(
    app: FastAPI, vision: Vision
) -> None:
    """A master keeps each user's readable workspaces between requests (access.SightCache),
    valid while the database's access generation stands: a role given, a group joined or a
    workspace made by another master, a standby or plain SQL is seen at once. Plain SQL
    here, so that nothing in this master's own code could have told its cache."""
    experiment = f"/api/v1/experiments/{vision.experiment}"
    await _gone(vision.bob.get(experiment))
    await _gone(vision.bob.get(experiment))  # the second from what the master kept
    engine = app.state.engine

    async def sql(statement: str, **values: Any) -> Any:
        async with engine.begin() as conn:
            result = await conn.execute(text(statement), values)
            return result.scalar() if result.returns_rows else None

    viewer = await sql(
        "INSERT INTO role_assignments (role_id, workspace_id, user_id, created_at) "
        "VALUES (4, :ws, :user, CURRENT_TIMESTAMP) RETURNING id",
        ws=vision.workspace,
        user=vision.bob_id,
    )
    await ok(await vision.bob.get(experiment))
    await sql("DELETE FROM role_assignments WHERE id = :id", id=viewer)
    await _gone(vision.bob.get(experiment))
    # Through a group bob joins, and gone again when the group is.
    group = await sql(
        "INSERT INTO user_groups (name, created_at) VALUES ('seers', CURRENT_TIMESTAMP) "
        "RETURNING id"
    )
    await sql(
        "INSERT INTO role_assignments (role_id, workspace_id, group_id, created_at) "
        "VALUES (4, :ws, :group, CURRENT_TIMESTAMP)",
        ws=vision.workspace,
        group=group,
    )
    await _gone(vision.bob.get(experiment))  # not a member yet
    await sql(
        "INSERT INTO user_group_members (group_id, user_id) VALUES (:group, :user)",
        group=group,
        user=vision.bob_id,
    )
    await ok(await vision.bob.get(experiment))
    await sql("DELETE FROM user_groups WHERE id = :id", id=group)
    await _gone(vision.bob.get(experiment))
    # A workspace handed to bob is his to read.
    await sql(
        "UPDATE workspaces SET user_id = :user WHERE id = :ws",
        user=vision.bob_id,
        ws=vision.workspace,
    )
    await ok(await vision.bob.get(experiment))


async def _gone(request: Awaitable[httpx.Response]) -> None:
    reply = await request
    assert reply.status_code == 404, reply.text


async def test_the_job_queue_keeps_others_places_but_not_their_names(vision: Vision) -> None:
    queue = await ok(await vision.bob.get("/api/v1/job-queues-v2"))
    [job] = queue["jobs"]
    assert job["full"] is None
    assert job["limited"]["summary"] == {"state": "STATE_QUEUED", "jobsAhead": 0}
    # Determined's v1LimitedJob, which its client's `det job list` reads: these and no more.
    assert set(job["limited"]) == {
        "allocatedSlots",
        "isPreemptible",
        "jobId",
        "requestedSlots",
        "resourcePool",
        "type",
        "workspaceId",
        "priority",
        "progress",
        "summary",
        "weight",
    }
    assert (await ok(await vision.bob.get("/api/v1/job-queues")))["jobs"] == []
    [mine] = (await ok(await vision.alice.get("/api/v1/job-queues-v2")))["jobs"]
    assert mine["full"]["name"] == "hers"


async def test_what_a_request_names_in_its_body_is_checked_too(vision: Vision) -> None:
    """Forking, submitting into a project, starting from a checkpoint, killing by job: as
    for something that does not exist."""
    fork = {"config": CONFIG.format(name="fork"), "parentId": vision.experiment}
    hidden = refusal(await vision.bob.post("/api/v1/experiments", json=fork), 400)
    fork["parentId"] = 987654
    missing = refusal(await vision.bob.post("/api/v1/experiments", json=fork), 400)
    assert hidden == missing.replace("987654", str(vision.experiment))
    into = {"config": CONFIG.format(name="in"), "projectId": vision.project}
    hidden = refusal(await vision.bob.post("/api/v1/experiments", json=into), 400)
    assert hidden == f"projectId: project {vision.project} does not exist"
    from_checkpoint = CONFIG.format(name="from").replace(
        "max_length", f"source_checkpoint_uuid: {vision.params['uuid']}, max_length"
    )
    hidden = refusal(
        await vision.bob.post("/api/v1/experiments", json={"config": from_checkpoint}), 400
    )
    assert (
        hidden == f"searcher.source_checkpoint_uuid: checkpoint {vision.params['uuid']} not found"
    )
    with_template = {"config": CONFIG.format(name="t"), "template": "hers"}
    assert refusal(await vision.bob.post("/api/v1/experiments", json=with_template), 404) == (
        "template hers not found"
    )
    # A Viewer sees the project but may not add to it: refused naming the permission.
    body = assignment("Viewer", user=vision.bob_id, ws=vision.workspace)
    await ok(await vision.admin.post("/api/v1/roles/add-assignments", json=body))
    message = refusal(await vision.bob.post("/api/v1/experiments", json=into), 403)
    assert "PERMISSION_TYPE_CREATE_EXPERIMENT" in message and "'vision'" in message
    body = assignment("Editor", user=vision.bob_id, ws=vision.workspace)
    await ok(await vision.admin.post("/api/v1/roles/add-assignments", json=body))
    await ok(await vision.bob.post("/api/v1/experiments", json=into))


async def test_other_spellings_of_an_id_find_nothing_more(vision: Vision) -> None:
    """The routes read "7.0", "+7" and "007" as 7, an upper-case uuid as the stored one and
    "0003" as model 3: each spelling of something hidden answers as for nothing there."""
    e, t, w, uuid = vision.experiment, vision.trial, vision.workspace, vision.params["uuid"]
    for path, missing, named in (
        (f"/api/v1/experiments/{e}.0", "/api/v1/experiments/987654.0", e),
        (f"/api/v1/experiments/%2B{e}/model_def", "/api/v1/experiments/%2B987654/model_def", e),
        (f"/api/v1/trials/000{t}/logs", "/api/v1/trials/000987654/logs", t),
        (f"/api/v1/workspaces/{w}.0", "/api/v1/workspaces/987654.0", w),
    ):
        hidden = refusal(await vision.bob.get(path), 404)
        absent = refusal(await vision.bob.get(missing), 404)
        assert hidden == absent.replace("987654", str(named)), path
    for path in (f"/api/v1/checkpoints/{uuid.upper()}", f"/checkpoints/{uuid.upper()}"):
        assert (await vision.bob.get(path)).status_code == 404, path
    model_id = (await ok(await vision.alice.get("/api/v1/models/hers")))["model"]["id"]
    assert (await vision.bob.get(f"/api/v1/models/000{model_id}")).status_code == 404
    # Unicode digits are no id: refused by the route's validation, never a server error.
    for path in ("/api/v1/experiments/%C2%B2", "/api/v1/models/%C2%B2", "/api/v1/tasks/%C2%B2.1"):
        assert (await vision.bob.get(path)).status_code < 500, path


async def test_a_hidden_checkpoint_cannot_be_registered_or_deleted(vision: Vision) -> None:
    uuid = vision.params["uuid"]
    await ok(await vision.bob.post("/api/v1/models", json={"name": "bobs"}))
    for given in (uuid, "0f0f0f0f-0000-4000-8000-0000000000aa"):
        reply = await vision.bob.post(
            "/api/v1/models/bobs/versions", json={"checkpointUuid": given}
        )
        assert refusal(reply, 404) == f"checkpointUuid: no checkpoint {given}"
        reply = await vision.bob.request(
            "DELETE", "/api/v1/checkpoints", json={"checkpointUuids": [given]}
        )
        assert refusal(reply, 404) == f"checkpointUuids: no checkpoint {given}"
    # Nor moved into: bob's experiment does not go into alice's project.
    his = await ok(
        await vision.bob.post("/api/v1/experiments", json={"config": CONFIG.format(name="his")})
    )
    move = {"destinationProjectId": vision.project}
    reply = await vision.bob.post(f"/api/v1/experiments/{his['experiment']['id']}/move", json=move)
    assert refusal(reply, 400) == f"destinationProjectId: project {vision.project} does not exist"
