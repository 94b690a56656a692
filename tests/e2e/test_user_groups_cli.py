"""User groups through Determined's official `det user-group` 0.38.1, unchanged, and through
ours, against a real master. The official client runs these verbs only where the master
says RBAC is on, so this file's master sets security.authz.rbac_ui_enabled."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from master.core.credentials import client_side_hash
from tests.conftest import require
from tests.e2e.conftest import (
    BACKENDS,
    MasterProcess,
    describe_run,
    lines,
    official_client_path,
    ok,
    running_master,
    unique,
)

pytestmark = [pytest.mark.e2e]

ADMIN = ("-u", "admin")  # the official client asks for the (empty) password on stdin
AS_ADMIN = {"DET_USER": "admin", "DET_PASS": ""}  # ours


@pytest.fixture(scope="module", params=BACKENDS)
def master(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[MasterProcess]:
    env = {"DET_MASTER_SECURITY__AUTHZ__RBAC_UI_ENABLED": "true"}
    with running_master(request, tmp_path_factory, "user-groups", env=env) as proc:
        yield proc


def new_users(master: MasterProcess, *prefixes: str) -> list[str]:
    """Users made through the API as admin: the clients under test are not the point here."""
    token = master.login("admin")
    names = [unique(prefix) for prefix in prefixes]
    for name in names:
        body = {
            "user": {"username": name, "active": True},
            "password": client_side_hash("Correct-Horse-9"),
            "isHashed": True,
        }
        headers = {"Authorization": f"Bearer {token}"}
        reply = master.session.post("/api/v1/users", json=body, headers=headers)
        assert reply.status_code == 200, reply.text
    return names


def table(text: str) -> list[list[str]]:
    """A tabulate table's rows (header first), cells stripped, rules dropped."""
    return [
        [cell.strip() for cell in line.split("|")]
        for line in lines(text)
        if "|" in line and not set(line) <= set("-+| ")
    ]


def members(master: MasterProcess, group_id: int) -> list[str]:
    group = master.api("GET", f"/api/v1/groups/{group_id}")["group"]
    return [u["username"] for u in group["users"]]


def refused(result: subprocess.CompletedProcess[str], message: str) -> None:
    assert result.returncode != 0, describe_run(result)
    assert "Traceback" not in result.stderr + result.stdout, describe_run(result)
    assert message in result.stderr, describe_run(result)


@pytest.mark.official_client
def test_official_client_manages_user_groups(master: MasterProcess) -> None:
    require(
        official_client_path() is not None,
        "official det client not installed: run `make official-client`",
    )
    u1, u2, u3 = new_users(master, "u1", "u2", "u3")
    name = unique("g")

    def admin(*args: str) -> subprocess.CompletedProcess[str]:
        return ok(master.official(*ADMIN, "user-group", *args, input="\n"))

    created = admin("create", name, "--add-user", u1)
    [group] = master.api("POST", "/api/v1/groups/search", json={"name": name, "limit": 1})["groups"]
    group_id = group["group"]["groupId"]
    assert lines(created.stdout)[-2:] == [
        f"user group with name {name} and ID {group_id} created",
        f"{u1} was added to the group",
    ], describe_run(created)

    listed = ok(master.official("user-group", "list"))
    rows = table(listed.stdout)
    assert rows[0] == ["Groupid", "Name", "Nummembers"], describe_run(listed)
    assert [str(group_id), name, "1"] in rows[1:], describe_run(listed)

    added = admin("add-user", name, f"{u2},{u3}")
    assert f"user added to group with username {u3} and ID" in added.stdout, describe_run(added)
    removed = admin("remove-user", name, u1)
    assert f"user removed from the group with username {u1}" in removed.stdout
    assert members(master, group_id) == [u2, u3]

    described = ok(master.official("user-group", "describe", name))
    assert lines(described.stdout)[0] == f"group ID {group_id} group name {name} with users added"
    described_rows = table(described.stdout)
    assert described_rows[0][:2] == ["Id", "Username"], describe_run(described)
    assert [row[1] for row in described_rows[1:]] == [u2, u3], describe_run(described)

    # The groups a user is in (Determined's client has no list-members verb; describe lists
    # the members, this the other way round).
    belongs = ok(master.official("user-group", "list", "--groups-user-belongs-to", u3, "--json"))
    assert [
        (g["group"]["name"], g["numMembers"]) for g in json.loads(belongs.stdout)["groups"]
    ] == [(name, 2)], describe_run(belongs)

    # `determined` is no admin: refused, with the master's reason.
    refused(master.official("user-group", "delete", name, "--yes"), "is for admins")
    deleted = admin("delete", name, "--yes")
    assert lines(deleted.stdout)[-1] == f"user group with name {name} and ID {group_id} deleted"
    assert master.http("GET", f"/api/v1/groups/{group_id}").status_code == 404


def test_our_det_manages_user_groups(master: MasterProcess) -> None:
    u1, u2 = new_users(master, "ours1", "ours2")
    name, renamed = unique("ours"), unique("renamed")

    def as_admin(*args: str) -> Any:
        return json.loads(ok(master.det("user-group", *args, "--json", env=AS_ADMIN)).stdout)

    created = as_admin("create", name, "--add-user", u1, "--add-user", u2)
    group_id = created["groupId"]
    assert [u["username"] for u in created["users"]] == [u1, u2], created
    removed = as_admin("remove-user", name, u1)
    assert [u["username"] for u in removed["users"]] == [u2], removed
    assert as_admin("change-name", name, renamed)["name"] == renamed
    added = as_admin("add-user", renamed, u1)
    assert [u["username"] for u in added["users"]] == [u1, u2], added

    listed = json.loads(ok(master.det("user-group", "list", "--json")).stdout)
    assert {"groupId": group_id, "name": renamed, "numMembers": 2} in listed, listed
    table_out = ok(master.det("user-group", "describe", renamed)).stdout
    assert lines(table_out)[0] == f"User group {renamed} (ID {group_id})", table_out
    assert u1 in table_out and u2 in table_out

    # Refusals name what is wrong and change nothing.
    missing = unique("nobody")
    refused(
        master.det("user-group", "add-user", renamed, missing, env=AS_ADMIN),
        missing,
    )
    refused(
        master.det("user-group", "remove-user", renamed, "admin", env=AS_ADMIN),
        f"removeUsers: not in user group '{renamed}'",
    )
    refused(master.det("user-group", "delete", renamed, "--yes"), "is for admins")
    assert members(master, group_id) == [u1, u2]

    deleted = as_admin("delete", renamed, "--yes")
    assert deleted == {"groupId": group_id, "name": renamed, "deleted": True}
    refused(master.det("user-group", "describe", renamed), f"user group '{renamed}' not found")
