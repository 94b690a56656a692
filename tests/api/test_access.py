"""Users, roles and tokens (issue 15): who may change what, access tokens with expiry and
revocation, the login rate limit, a run's token kept to its own trial, /metrics behind a
token, and the refusal to serve default users with empty passwords on the network."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import update

from master.app import EmptyPasswordsOnNetwork, _refuse_open_default_users
from master.core.credentials import client_side_hash
from master.db.models import CheckpointModel, TemplateModel, UserSessionModel
from master.db.session import session_scope
from master.errors import TooManyRequests
from master.services import auth
from master.web.common import COOKIE
from tests.api.test_core_api_contract import Rank, running
from tests.api.test_trial_reports import checkpoint_body, metrics_body

PASSWORD = "Sekret-Passw0rd"
EXPERIMENT = """
name: mine
entrypoint: python3 train.py
searcher: {name: single, metric: loss, max_length: {batches: 10}}
resources: {slots_per_trial: 1}
"""

# What a refusal adds: who else may change someone's experiment (master.core.roles).
EDITORS = (
    ", or whoever holds PERMISSION_TYPE_UPDATE_EXPERIMENT in its workspace (WorkspaceAdmin, "
    "Editor, EditorRestricted, EditorProjectRestricted)"
)


@contextlib.asynccontextmanager
async def sign_in(
    app: FastAPI, username: str, password: str = ""
) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://master") as client:
        reply = await client.post(
            "/api/v1/auth/login",
            json={"username": username, "password": client_side_hash(password), "isHashed": True},
        )
        assert reply.status_code == 200, reply.text
        client.headers["Authorization"] = f"Bearer {reply.json()['token']}"
        yield client


async def create_user(admin: httpx.AsyncClient, username: str, **fields: object) -> int:
    reply = await admin.post(
        "/api/v1/users",
        json={
            "user": {"username": username, **fields},
            "password": client_side_hash(PASSWORD),
            "isHashed": True,
        },
    )
    assert reply.status_code == 200, reply.text
    user_id: int = reply.json()["user"]["id"]
    return user_id


@pytest.fixture
async def alice(app: FastAPI, admin: httpx.AsyncClient) -> AsyncIterator[httpx.AsyncClient]:
    """A second, ordinary user beside `determined`."""
    await create_user(admin, "alice")
    async with sign_in(app, "alice", PASSWORD) as client:
        yield client


async def give_viewer(admin: httpx.AsyncClient, client: httpx.AsyncClient, workspace: int) -> None:
    """The Viewer role in a workspace for the client's user: it sees the workspace's work
    (workspaces are kept apart for reading) but changes nothing there."""
    user_id = (await client.get("/api/v1/me")).json()["user"]["id"]
    scope = {"role": {"roleId": 4}, "scopeWorkspaceId": workspace}
    body = {"userRoleAssignments": [{"userId": user_id, "roleAssignment": scope}]}
    reply = await admin.post("/api/v1/roles/add-assignments", json=body)
    assert reply.status_code == 200, reply.text


def refusal(reply: httpx.Response, status: int) -> str:
    assert reply.status_code == status, reply.text
    message: str = reply.json()["message"]
    return message


# -- users ----------------------------------------------------------------------------------


async def test_only_admins_create_users_and_each_is_checked(
    app: FastAPI, api: httpx.AsyncClient, admin: httpx.AsyncClient
) -> None:
    body = {"user": {"username": "bob"}, "password": client_side_hash(PASSWORD), "isHashed": True}
    assert "for admins" in refusal(await api.post("/api/v1/users", json=body), 403)
    await create_user(admin, "bob")
    assert "already exists" in refusal(await admin.post("/api/v1/users", json=body), 409)
    bad = {**body, "user": {"username": "no spaces"}}
    assert refusal(await admin.post("/api/v1/users", json=bad), 400).startswith("username:")
    remote = {**body, "user": {"username": "carol", "remote": True}}
    assert refusal(await admin.post("/api/v1/users", json=remote), 400).startswith("remote:")
    names = [u["username"] for u in (await api.get("/api/v1/users")).json()["users"]]
    assert names == ["admin", "determined", "bob"]
    bob_id = (await api.get("/api/v1/users/bob/by-username")).json()["user"]["id"]
    assert (await admin.patch(f"/api/v1/users/{bob_id}", json={"active": False})).status_code == 200
    # Determined's `det user list` asks for active users only.
    active = (await api.get("/api/v1/users", params={"active": "true"})).json()["users"]
    assert [u["username"] for u in active] == ["admin", "determined"]
    admins = (await api.get("/api/v1/users", params={"admin": "true"})).json()["users"]
    assert [u["username"] for u in admins] == ["admin"]
    assert (await admin.patch(f"/api/v1/users/{bob_id}", json={"active": True})).status_code == 200
    async with sign_in(app, "bob", PASSWORD) as bob:
        me = (await bob.get("/api/v1/me")).json()["user"]
        assert (me["username"], me["admin"], me["active"]) == ("bob", False, True)


async def test_deactivation_and_new_passwords_end_logins(
    app: FastAPI, admin: httpx.AsyncClient, alice: httpx.AsyncClient
) -> None:
    alice_id = (await alice.get("/api/v1/me")).json()["user"]["id"]
    # A user may change their own password but not their role or state.
    refused = await alice.patch(f"/api/v1/users/{alice_id}", json={"admin": True})
    assert "only an admin" in refusal(refused, 403)
    new = client_side_hash("An0ther-Password")
    reply = await alice.post(f"/api/v1/users/{alice_id}/password", json=new)
    assert reply.status_code == 200, reply.text
    # Her login ended with the old password; the old password no longer opens a new one.
    assert (await alice.get("/api/v1/me")).status_code == 401
    old = await alice.post(
        "/api/v1/auth/login",
        json={"username": "alice", "password": client_side_hash(PASSWORD), "isHashed": True},
    )
    assert old.status_code == 401
    async with sign_in(app, "alice", "An0ther-Password") as again:
        assert (await again.get("/api/v1/me")).status_code == 200
        reply = await admin.patch(f"/api/v1/users/{alice_id}", json={"active": False})
        assert reply.json()["user"]["active"] is False
        assert (await again.get("/api/v1/me")).status_code == 401
    admin_id = (await admin.get("/api/v1/me")).json()["user"]["id"]
    demote = await admin.patch(f"/api/v1/users/{admin_id}", json={"admin": False})
    assert "cannot deactivate or demote themselves" in refusal(demote, 400)


# -- owners ---------------------------------------------------------------------------------


async def test_users_change_only_their_own_experiments(
    api: httpx.AsyncClient, admin: httpx.AsyncClient, alice: httpx.AsyncClient
) -> None:
    created = await api.post("/api/v1/experiments", json={"config": EXPERIMENT})
    experiment = created.json()["experiment"]
    path = f"/api/v1/experiments/{experiment['id']}"
    for verb in ("pause", "activate", "kill"):
        message = refusal(await alice.post(f"{path}/{verb}"), 403)
        assert message == (
            f"experiment {experiment['id']} belongs to determined; only its owner or an "
            f"admin may {verb} it{EDITORS}"
        )
    assert "belongs to determined" in refusal(await alice.delete(path), 403)
    trials = (await api.get(f"{path}/trials")).json()["trials"]
    refused = refusal(await alice.post(f"/api/v1/trials/{trials[0]['id']}/kill"), 403)
    assert refused.endswith(f"only its owner or an admin may kill its trials{EDITORS}"), refused
    jobs = {"updates": [{"jobId": experiment["jobId"], "priority": 5}]}
    assert "belongs to determined" in refusal(
        await alice.post("/api/v1/job-queues", json=jobs), 403
    )
    state = (await api.get(path)).json()["experiment"]["state"]
    assert state == "STATE_ACTIVE"  # nothing the refused calls asked for happened
    # Reading stays open to every user, as in Determined.
    assert (await alice.get(path)).status_code == 200
    assert (await admin.post(f"{path}/pause")).status_code == 200
    assert (await api.post(f"{path}/kill")).status_code == 200


async def test_templates_belong_to_whoever_made_them(
    app: FastAPI, api: httpx.AsyncClient, admin: httpx.AsyncClient, alice: httpx.AsyncClient
) -> None:
    body = {"config": {"description": "alice's"}}
    assert (await alice.post("/api/v1/templates/hers", json=body)).status_code == 200
    theirs = {"config": {"description": "changed"}}
    message = refusal(await api.put("/api/v1/templates/hers", json=theirs), 403)
    assert message == (
        "template 'hers' belongs to alice; only its owner or an admin may replace it, or "
        "whoever holds PERMISSION_TYPE_UPDATE_TEMPLATES in its workspace (WorkspaceAdmin, "
        "Editor, EditorRestricted, EditorProjectRestricted)"
    )
    assert refusal(await api.patch("/api/v1/templates/hers", json={"x": 1}), 403)
    assert refusal(await api.delete("/api/v1/templates/hers"), 403)
    rename = {"oldName": "hers", "newName": "mine"}
    assert refusal(await api.patch("/api/v1/template/rename", json=rename), 403)
    stored = (await api.get("/api/v1/templates/hers")).json()["template"]["config"]
    assert stored == {"description": "alice's"}
    assert (await alice.put("/api/v1/templates/hers", json=theirs)).status_code == 200
    assert (await admin.delete("/api/v1/templates/hers")).status_code == 200
    # A template from before owners were kept is the admins' to change.
    assert (await api.post("/api/v1/templates/old", json=body)).status_code == 200
    async with session_scope(app.state.session_factory) as session:
        await session.execute(update(TemplateModel).values(owner_id=None))
    assert "belongs to nobody" in refusal(await api.delete("/api/v1/templates/old"), 403)
    assert (await admin.delete("/api/v1/templates/old")).status_code == 200


async def test_cluster_changes_are_for_admins(api: httpx.AsyncClient) -> None:
    for path in (
        "/api/v1/agents/a1/enable",
        "/api/v1/agents/a1/disable",
        "/api/v1/agents/a1/revoke",
    ):
        assert "for admins" in refusal(await api.post(path), 403), path


# -- access tokens --------------------------------------------------------------------------


async def test_access_tokens_open_the_api_until_revoked_or_expired(
    app: FastAPI, api: httpx.AsyncClient, admin: httpx.AsyncClient, alice: httpx.AsyncClient
) -> None:
    alice_id = (await alice.get("/api/v1/me")).json()["user"]["id"]
    made = await alice.post(
        "/api/v1/tokens", json={"userId": alice_id, "lifespan": "48h", "description": "ci"}
    )
    assert made.status_code == 200, made.text
    token, token_id = made.json()["token"], made.json()["tokenId"]
    bearer = {"Authorization": f"Bearer {token}"}
    me = await api.get("/api/v1/me", headers=bearer)
    assert me.json()["user"]["username"] == "alice"
    # Another user may not mint, see or revoke alice's tokens; an admin may.
    assert "another user" in refusal(
        await api.post("/api/v1/tokens", json={"userId": alice_id}), 403
    )
    assert (await api.get("/api/v1/tokens")).json()["tokenInfo"] == []
    listed = (await alice.get("/api/v1/tokens")).json()["tokenInfo"]
    assert [(t["id"], t["description"], t["revoked"]) for t in listed] == [(token_id, "ci", False)]
    expiry = datetime.fromisoformat(listed[0]["expiry"])
    assert timedelta(hours=47) < expiry - datetime.now(UTC) <= timedelta(hours=48)
    assert refusal(await api.patch(f"/api/v1/tokens/{token_id}", json={"setRevoked": True}), 403)
    assert [t["id"] for t in (await admin.get("/api/v1/tokens")).json()["tokenInfo"]] == [token_id]
    for bad in ("forever", "0h", "99999d"):
        reply = await alice.post("/api/v1/tokens", json={"userId": alice_id, "lifespan": bad})
        assert refusal(reply, 400).startswith("lifespan:"), bad
    # A logout with an access token does not end it; a revocation does.
    assert (await api.post("/api/v1/auth/logout", headers=bearer)).status_code == 200
    assert (await api.get("/api/v1/me", headers=bearer)).status_code == 200
    revoked = await alice.patch(f"/api/v1/tokens/{token_id}", json={"setRevoked": True})
    assert revoked.json()["tokenInfo"]["revoked"] is True
    assert "revoked" in refusal(await api.get("/api/v1/me", headers=bearer), 401)
    assert (await alice.get("/api/v1/tokens")).json()["tokenInfo"] == []
    shown = (await alice.get("/api/v1/tokens", params={"showInactive": "true"})).json()
    assert [t["revoked"] for t in shown["tokenInfo"]] == [True]
    # An expired token is refused like a wrong one.
    second = (await alice.post("/api/v1/tokens", json={"userId": alice_id})).json()
    async with session_scope(app.state.session_factory) as session:
        await session.execute(
            update(UserSessionModel)
            .where(UserSessionModel.id == second["tokenId"])
            .values(expires_at=datetime.now(UTC) - timedelta(seconds=1))
        )
    expired = await api.get("/api/v1/me", headers={"Authorization": f"Bearer {second['token']}"})
    assert "expired" in refusal(expired, 401)


# -- the login rate limit -------------------------------------------------------------------


async def test_failed_logins_are_slowed_down(app: FastAPI, anon: httpx.AsyncClient) -> None:
    wrong = {"username": "determined", "password": "guess", "isHashed": False}
    for _ in range(10):
        assert (await anon.post("/api/v1/auth/login", json=wrong)).status_code == 401
    limited = await anon.post("/api/v1/auth/login", json=wrong)
    assert limited.status_code == 429, limited.text
    assert 1 <= int(limited.headers["Retry-After"]) <= 60
    assert "too many failed logins" in limited.json()["message"]
    # Even the right password waits out the window: the guesser cannot tell.
    right = {"username": "determined", "password": ""}
    assert (await anon.post("/api/v1/auth/login", json=right)).status_code == 429


def test_the_limiter_counts_names_and_addresses_within_a_window() -> None:
    limiter = auth.LoginLimiter(max_failures=2, window_s=0.05)
    limiter.failed("alice", "10.0.0.1")
    limiter.failed("bob", "10.0.0.1")
    with pytest.raises(TooManyRequests, match=r"address '10\.0\.0\.1'"):
        limiter.check("carol", "10.0.0.1")
    limiter.check("carol", "10.0.0.2")  # another address, another name: not limited
    limiter.failed("alice", "10.0.0.3")
    with pytest.raises(TooManyRequests, match=r"user 'alice'"):
        limiter.check("alice", "10.0.0.4")
    limiter.succeeded("alice")
    limiter.check("alice", "10.0.0.4")


# -- a run's token opens its own trial only -------------------------------------------------


async def checkpoint_of_another_user(app: FastAPI, admin: httpx.AsyncClient) -> str:
    """A checkpoint row of an experiment the admin owns (written straight to the database:
    the admin runs no trial here)."""
    created = await admin.post("/api/v1/experiments", json={"config": EXPERIMENT})
    experiment_id = created.json()["experiment"]["id"]
    trials = await admin.get(f"/api/v1/experiments/{experiment_id}/trials")
    trial_id = trials.json()["trials"][0]["id"]
    uuid = "5e1f0000-0000-4000-8000-00000000a11c"
    async with session_scope(app.state.session_factory) as session:
        session.add(
            CheckpointModel(
                uuid=uuid, trial_id=trial_id, experiment_id=experiment_id, steps_completed=1
            )
        )
    return uuid


async def test_a_runs_token_opens_only_its_own_trial(
    app: FastAPI, api: httpx.AsyncClient, admin: httpx.AsyncClient
) -> None:
    first: Rank = await running(app, api)
    async with first.client:
        created = await api.post("/api/v1/experiments", json={"config": EXPERIMENT})
        trials = await api.get(f"/api/v1/experiments/{created.json()['experiment']['id']}/trials")
        (other,) = [t["id"] for t in trials.json()["trials"]]
        own = first.trial.id
        assert (await first.get(f"/api/v1/trials/{own}")).status_code == 200
        assert (await first.get("/api/v1/me")).status_code == 200
        for method, path in (
            ("GET", f"/api/v1/trials/{other}"),
            ("GET", "/api/v1/experiments"),
            ("GET", "/api/v1/templates"),
            ("POST", "/api/v1/experiments"),
            ("GET", "/api/v1/agents"),
            ("POST", f"/api/v1/trials/{other}/progress"),
            ("GET", "/api/v1/users"),
            ("POST", "/api/v1/tokens"),
            # Its own experiment it may read, not change: nor the other trials with it.
            ("POST", f"/api/v1/experiments/{first.trial.experiment_id}/pause"),
            ("POST", f"/api/v1/experiments/{first.trial.experiment_id}/kill"),
            ("DELETE", f"/api/v1/experiments/{first.trial.experiment_id}"),
            ("GET", "/metrics"),
        ):
            reply = await first.client.request(method, path, json={})
            assert reply.status_code == 403, (method, path, reply.text)
            message = reply.json()["message"]
            assert f"trial {own}" in message or "its own trial's routes" in message, message
        # A report that names another trial in its body is refused too.
        body = metrics_body(first.trial, "training", 1, {"loss": 1.0}, trial_id=other)
        assert (await first.post(f"/api/v1/trials/{own}/metrics", body)).status_code in (400, 403)
        checkpoint = {
            "uuid": "0b4f7c1e-0000-4000-8000-000000000001",
            "state": "STATE_COMPLETED",
            "metadata": {"steps_completed": 1},
            "resources": {},
            "training": {"trialId": other},
        }
        assert (await first.post("/api/v1/checkpoints", checkpoint)).status_code == 403
        # It reads its own owner's checkpoints (a restore from another experiment), never
        # another user's.
        mine = checkpoint_body(first.trial, 1)
        assert (await first.post("/api/v1/checkpoints", mine)).status_code == 200
        assert (await first.get(f"/api/v1/checkpoints/{mine['uuid']}")).status_code == 200
        theirs = await checkpoint_of_another_user(app, admin)
        reply = await first.get(f"/api/v1/checkpoints/{theirs}")
        assert reply.status_code == 403, reply.text
        # Nor does it open the dashboard.
        token = first.client.headers["Grpc-Metadata-x-allocation-token"].split()[1]
        first.client.cookies.set(COOKIE, token)
        dashboard = await first.client.get("/ui/experiments")
        assert dashboard.status_code in (302, 303, 307), dashboard.text


# -- /metrics -------------------------------------------------------------------------------


async def test_metrics_need_a_token(app: FastAPI, anon: httpx.AsyncClient) -> None:
    assert (await anon.get("/metrics")).status_code == 401
    assert (await anon.get("/health/live")).status_code == 200  # probes stay open
    async with sign_in(app, "determined") as user:
        assert (await user.get("/metrics")).status_code == 200
    security = app.state.settings.security
    security.metrics_token = "scrape-me"
    try:
        bearer = {"Authorization": "Bearer scrape-me"}
        reply = await anon.get("/metrics", headers=bearer)
        assert reply.status_code == 200 and "resolute_" in reply.text
        wrong = await anon.get("/metrics", headers={"Authorization": "Bearer nope"})
        assert "metrics_token" in refusal(wrong, 401)
    finally:
        security.metrics_token = ""


# -- no default user with an empty password on the network ---------------------------------


async def test_empty_default_passwords_keep_the_master_off_the_network(
    app: FastAPI, api: httpx.AsyncClient, admin: httpx.AsyncClient
) -> None:
    settings = app.state.settings.model_copy(deep=True)
    factory = app.state.session_factory
    settings.host = "0.0.0.0"
    async with session_scope(factory) as session:
        with pytest.raises(EmptyPasswordsOnNetwork, match="users admin, determined have empty"):
            await _refuse_open_default_users(session, settings)
    settings.security.allow_empty_passwords = True
    async with session_scope(factory) as session:
        await _refuse_open_default_users(session, settings)  # told explicitly: starts
    settings.security.allow_empty_passwords = False
    for host in ("127.0.0.1", "localhost", "::1"):
        settings.host = host
        async with session_scope(factory) as session:
            await _refuse_open_default_users(session, settings)
    settings.host = "198.18.0.1"
    me = (await admin.get("/api/v1/me")).json()["user"]["id"]
    users = (await admin.get("/api/v1/users")).json()["users"]
    determined = next(u["id"] for u in users if u["username"] == "determined")
    for user_id in (determined, me):  # a new password ends admin's own login: last
        reply = await admin.patch(
            f"/api/v1/users/{user_id}",
            json={"password": client_side_hash(PASSWORD), "isHashed": True},
        )
        assert reply.status_code == 200, reply.text
    async with session_scope(factory) as session:
        await _refuse_open_default_users(session, settings)


async def test_checkpoints_and_preemption_signals_are_their_owners(
    app: FastAPI, admin: httpx.AsyncClient, alice: httpx.AsyncClient
) -> None:
    uuid = await checkpoint_of_another_user(app, admin)
    body = {"checkpointUuids": [uuid]}
    message = refusal(await alice.request("DELETE", "/api/v1/checkpoints", json=body), 403)
    assert "belongs to admin" in message
    assert (await alice.get(f"/api/v1/checkpoints/{uuid}")).json()["checkpoint"]["state"] == (
        "STATE_COMPLETED"
    )
    trials = (await admin.get("/api/v1/experiments")).json()["experiments"]
    experiment_id = trials[0]["id"]
    trial_id = (await admin.get(f"/api/v1/experiments/{experiment_id}/trials")).json()["trials"][0][
        "id"
    ]
    allocation = f"{trial_id}.1"
    for path in (
        f"/api/v1/allocations/{allocation}/signals/ack_preemption",
        f"/api/v1/allocations/{allocation}/signals/preemption",
    ):
        reply = await alice.request("POST" if "ack" in path else "GET", path)
        assert "belongs to admin" in refusal(reply, 403), path
    # The admin passes the owner check (the service may still refuse for its own reasons:
    # the checkpoint's experiment is active here).
    allowed = await admin.request("DELETE", "/api/v1/checkpoints", json=body)
    assert allowed.status_code != 403, allowed.text
