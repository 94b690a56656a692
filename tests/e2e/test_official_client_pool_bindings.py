"""Resource pools bound to workspaces and a workspace's default compute pool through
Determined's official `det` 0.38.1 (`det resource-pool bindings ...`, `det workspace create
--default-compute-pool`, `det workspace edit --default-compute-pool`) and ours, against a
real master with three pools. Every route and refusal is tested on both databases in
tests/api/test_pool_bindings.py; this file adds the clients' wire and what they print."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

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
from tests.e2e.test_official_client_workspaces import table

pytestmark = [pytest.mark.e2e, pytest.mark.official_client]

ADMIN = ("-u", "admin")  # the official client asks for the (empty) password on stdin
POOLS = [{"pool_name": name} for name in ("default", "gpu", "cpu")]
SINGLE = """\
name: pooled
entrypoint: python3 train.py
searcher: {name: single, metric: loss, max_length: {batches: 10}}
"""


@pytest.fixture(scope="module", params=BACKENDS)
def master(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[MasterProcess]:
    """A master of this file's own with the pools "default", "gpu" and "cpu" and no agent."""
    env = {"DET_MASTER_RESOURCE_POOLS": json.dumps(POOLS)}
    with running_master(request, tmp_path_factory, "pool-bindings", env) as proc:
        yield proc


@pytest.fixture(autouse=True)
def _official_client_installed() -> None:
    require(
        official_client_path() is not None,
        "official det client not installed: run `make official-client`",
    )


def bound_to(master: MasterProcess, pool: str) -> list[int]:
    ids: list[int] = master.api("GET", f"/api/v1/resource-pools/{pool}/workspace-bindings")[
        "workspaceIds"
    ]
    return ids


def submit(master: MasterProcess, project_id: int) -> Any:
    return master.http(
        "POST", "/api/v1/experiments", json={"config": SINGLE, "projectId": project_id}
    )


def test_bindings_and_default_pools_with_both_clients(master: MasterProcess) -> None:
    a, b = unique("ws-a"), unique("ws-b")
    created = ok(master.official("workspace", "create", a, "--default-compute-pool", "cpu"))
    rows = table(created.stdout)
    header, row = rows[0], rows[1]
    assert row[header.index("Name")] == a, describe_run(created)
    assert row[header.index("Default Compute Pool")] == "cpu", describe_run(created)
    a_id = int(row[header.index("ID")])
    b_id = master.api("POST", "/api/v1/workspaces", json={"name": b})["workspace"]["id"]
    project = master.api("POST", f"/api/v1/workspaces/{a_id}/projects", json={"name": "p"})
    project_id = project["project"]["id"]
    reply = submit(master, project_id)
    assert reply.status_code == 200, reply.text
    assert reply.json()["experiment"]["resourcePool"] == "cpu"

    added = ok(master.official(*ADMIN, "rp", "bindings", "add", "gpu", a, b, input="\n"))
    assert 'added bindings between the resource pool "gpu"' in added.stdout, describe_run(added)
    assert bound_to(master, "gpu") == sorted([a_id, b_id])
    listed = ok(master.official("rp", "bindings", "list-workspaces", "gpu"))
    [header, row] = table(listed.stdout)
    assert header == ["resource pool", "workspaces"], describe_run(listed)
    assert row[0] == "gpu" and set(row[1].split(", ")) == {a, b}, describe_run(listed)

    # The official client edits with the *ResourcePool keys.
    edited = ok(master.official("workspace", "edit", a, "--default-compute-pool", "gpu", "--json"))
    assert json.loads(edited.stdout)["defaultComputePool"] == "gpu", describe_run(edited)
    assert submit(master, project_id).json()["experiment"]["resourcePool"] == "gpu"

    replaced = ok(master.official(*ADMIN, "rp", "bindings", "replace", "gpu", b, input="\n"))
    assert 'replaced bindings of the resource pool "gpu"' in replaced.stdout
    assert bound_to(master, "gpu") == [b_id]
    # Workspace a's default is bound away from it now: its submits are refused, naming both.
    reply = submit(master, project_id)
    assert reply.status_code == 400, reply.text
    assert f"pool 'gpu' is bound to other workspaces; workspace '{a}'" in reply.json()["message"]

    removed = ok(master.official(*ADMIN, "rp", "bindings", "remove", "gpu", b, input="\n"))
    assert 'removed bindings between the resource pool "gpu"' in removed.stdout
    assert bound_to(master, "gpu") == []
    assert submit(master, project_id).status_code == 200

    refused = master.official(*ADMIN, "rp", "bindings", "add", "nowhere", a, input="\n")
    assert refused.returncode != 0, describe_run(refused)
    assert "pool 'nowhere' does not exist" in refused.stderr, describe_run(refused)

    # Ours.
    as_admin = {"DET_USER": "admin", "DET_PASS": ""}
    ours = json.loads(
        ok(master.det("rp", "bindings", "add", "cpu", b, "--json", env=as_admin)).stdout
    )
    assert ours == {"resourcePool": "cpu", "workspaces": [{"id": b_id, "name": b}]}
    mine = ok(master.det("rp", "bindings", "list-workspaces", "cpu"))
    assert "cpu" in mine.stdout and b in mine.stdout, describe_run(mine)
    # Workspace a's default compute pool, cpu, is b's alone now.
    late = master.det("workspace", "edit", a, "--default-compute-pool", "cpu")
    assert late.returncode == 1 and "Traceback" not in late.stderr, describe_run(late)
    assert "pool 'cpu' is bound to other workspaces" in late.stderr, describe_run(late)
    assert lines(late.stdout) == []
