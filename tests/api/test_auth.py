"""Login protocol of Determined's client, tokens, and the auth wall around /api/v1."""

from __future__ import annotations

import hashlib

import httpx
import pytest
from fastapi import FastAPI

from master.core.credentials import CLIENT_SALT


async def test_info_is_public_and_reports_compatible_version(anon: httpx.AsyncClient) -> None:
    reply = await anon.get("/info")
    assert reply.status_code == 200
    body = reply.json()
    assert body["version"] == "0.38.1"
    assert body["cluster_id"] and body["master_id"]


async def test_default_user_logs_in_with_empty_password(anon: httpx.AsyncClient) -> None:
    # Determined's client sends an empty password unhashed, with isHashed true.
    reply = await anon.post(
        "/api/v1/auth/login", json={"username": "determined", "password": "", "isHashed": True}
    )
    assert reply.status_code == 200
    body = reply.json()
    assert body["user"] == body["user"] | {"username": "determined", "admin": False, "active": True}
    me = await anon.get("/api/v1/me", headers={"Authorization": f"Bearer {body['token']}"})
    assert me.status_code == 200
    assert me.json()["user"]["username"] == "determined"


async def test_admin_exists_and_is_admin(anon: httpx.AsyncClient) -> None:
    reply = await anon.post("/api/v1/auth/login", json={"username": "admin", "password": ""})
    assert reply.status_code == 200
    assert reply.json()["user"]["admin"] is True


async def test_wrong_password_is_refused(anon: httpx.AsyncClient) -> None:
    hashed = hashlib.sha512((CLIENT_SALT + "nope").encode()).hexdigest()
    reply = await anon.post(
        "/api/v1/auth/login", json={"username": "determined", "password": hashed, "isHashed": True}
    )
    assert reply.status_code == 401
    body = reply.json()
    assert (body["code"], body["message"], body["details"]) == (16, "invalid credentials", [])
    # The copy Determined's client prints for errors other than 404.
    assert body["error"]["error"] == "invalid credentials"


async def test_unknown_user_gets_the_same_answer(anon: httpx.AsyncClient) -> None:
    reply = await anon.post("/api/v1/auth/login", json={"username": "mallory", "password": ""})
    assert reply.status_code == 401
    assert reply.json()["message"] == "invalid credentials"


@pytest.mark.parametrize(
    "method,path",
    [
        ("GET", "/api/v1/me"),
        ("GET", "/api/v1/workspaces"),
        ("GET", "/api/v1/templates"),
        ("GET", "/api/v1/templates/x"),
        ("POST", "/api/v1/templates/x"),
        ("PATCH", "/api/v1/templates/x"),
        ("DELETE", "/api/v1/templates/x"),
        ("GET", "/api/v1/experiments"),
        ("POST", "/api/v1/experiments"),
        ("GET", "/api/v1/experiments/1"),
        ("GET", "/api/v1/experiments/1/trials"),
        ("POST", "/api/v1/experiments/1/kill"),
    ],
)
async def test_every_api_route_needs_a_token(
    anon: httpx.AsyncClient, method: str, path: str
) -> None:
    reply = await anon.request(method, path, json={})
    assert reply.status_code == 401, reply.text
    assert reply.json()["code"] == 16
    forged = await anon.request(method, path, headers={"Authorization": "Bearer forged"}, json={})
    assert forged.status_code == 401


async def test_master_info_is_open_without_its_message(
    app: FastAPI, admin: httpx.AsyncClient
) -> None:
    """Determined's client reads rbacEnabled without a token before `det user-group`; the
    cluster message stays for signed-in users, and a bad token is still refused."""
    set_message = await admin.put("/api/v1/master/cluster_message", json={"message": "hi"})
    assert set_message.status_code == 200, set_message.text
    assert (await admin.get("/api/v1/master")).json()["clusterMessage"]["message"] == "hi"
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://master") as nobody:
        reply = await nobody.get("/api/v1/master")
        assert reply.status_code == 200, reply.text
        assert reply.json()["clusterMessage"] is None
        assert reply.json()["rbacEnabled"] is False  # security.authz.rbac_ui_enabled's default
        forged = await nobody.get("/api/v1/master", headers={"Authorization": "Bearer forged"})
        assert forged.status_code == 401


async def test_logout_revokes_the_token(api: httpx.AsyncClient) -> None:
    assert (await api.post("/api/v1/auth/logout")).status_code == 200
    assert (await api.get("/api/v1/me")).status_code == 401


async def test_login_body_without_content_type(anon: httpx.AsyncClient) -> None:
    """Determined's client posts JSON without a Content-Type header (wire contract 2.6)."""
    request = anon.build_request(
        "POST",
        "/api/v1/auth/login",
        content=b'{"username": "determined", "password": "", "isHashed": true}',
    )
    assert "content-type" not in request.headers
    reply = await anon.send(request)
    assert reply.status_code == 200, reply.text
    token = reply.json()["token"]
    create = anon.build_request(
        "POST",
        "/api/v1/templates/no-content-type",
        content=b'{"name": "no-content-type", "config": {"max_restarts": 1}, "workspaceId": 0}',
        headers={"Authorization": f"Bearer {token}"},
    )
    assert "content-type" not in create.headers
    created = await anon.send(create)
    assert created.status_code == 200, created.text


async def test_openapi_docs_are_served(anon: httpx.AsyncClient) -> None:
    spec = await anon.get("/openapi.json")
    assert spec.status_code == 200
    assert "/api/v1/experiments" in spec.json()["paths"]
    assert (await anon.get("/docs")).status_code == 200
