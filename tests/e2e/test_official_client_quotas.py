"""Workspaces' slot quotas through Determined's official `det` 0.38.1 (`det workspace
resource-quota set`) and ours (`det workspace quota set|show|list|unset`), against a real
master with 8 slots in its default pool and a quota in its config. Every route and refusal
is tested on both databases in tests/api/test_quotas.py; this file adds the clients' wire
and what they print, and what `det job list` and `det task list` say of workspaces and
their quotas."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from cli.cluster import JOB_HEADERS, TASK_HEADERS
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
from tests.e2e.test_cluster_cli import rich_table
from tests.simulated import register_simulated_agents_sync

pytestmark = [pytest.mark.e2e, pytest.mark.official_client]

ADMIN = ("-u", "admin")  # the official client asks for the (empty) password on stdin
AS_ADMIN = {"DET_USER": "admin", "DET_PASS": ""}  # ours
CONFIGURED = unique("vision")  # the config's quota names it before it exists
POOLS = [
    {"pool_name": "default", "quotas": [{"workspace": CONFIGURED, "nominal_slots": 2}]},
    {"pool_name": "gpu"},
]


@pytest.fixture(scope="module", params=BACKENDS)
def master(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[MasterProcess]:
    """A master of this file's own: pools "default" (two simulated agents of 4 slots) and
    "gpu" (none), and a config quota for workspace CONFIGURED in "default"."""
    env = {"DET_MASTER_RESOURCE_POOLS": json.dumps(POOLS)}
    with running_master(request, tmp_path_factory, "quotas", env) as proc:
        register_simulated_agents_sync(
            proc.db_url, [("quota-a", 4), ("quota-b", 4)], data_dir=proc.data_dir
        )
        yield proc


@pytest.fixture(autouse=True)
def _official_client_installed() -> None:
    require(
        official_client_path() is not None,
        "official det client not installed: run `make official-client`",
    )


def shown(
    master: MasterProcess, workspace: str, env: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    result = ok(master.det("workspace", "quota", "show", workspace, "--json", env=env))
    quotas: list[dict[str, Any]] = json.loads(result.stdout)["quotas"]
    return quotas


def brief(quotas: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [
        (q["resourcePool"], q["nominalSlots"], q["borrowingLimit"], q["lendingLimit"], q["source"])
        for q in quotas
    ]


def test_determineds_resource_quota_then_ours(master: MasterProcess) -> None:
    name = unique("nlp")
    ok(master.official("workspace", "create", name))

    result = ok(
        master.official(*ADMIN, "workspace", "resource-quota", "set", name, "3", input="\n")
    )
    assert f"Resource quota 3 is set on workspace {name}" in result.stdout, describe_run(result)
    [quota] = shown(master, name)
    assert quota["workspaceName"] == name
    assert brief([quota]) == [("default", 3, None, None, "api")]
    assert (quota["heldSlots"], quota["borrowedSlots"]) == (0, 0)

    # Ours sets the limits; Determined's then changes the nominal and keeps them.
    ours = master.det(
        *("workspace", "quota", "set", name, "--pool", "default", "--nominal", "4"),
        *("--borrowing-limit", "2", "--lending-limit", "1", "--json"),
        env=AS_ADMIN,
    )
    assert json.loads(ok(ours).stdout)["quota"]["borrowingLimit"] == 2
    ok(master.official(*ADMIN, "workspace", "resource-quota", "set", name, "5", input="\n"))
    assert brief(shown(master, name)) == [("default", 5, 2, 1, "api")]
    # Omitted limits stay; "none" clears one.
    ok(
        master.det(
            *("workspace", "quota", "set", name, "--pool", "default", "--nominal", "6"),
            *("--borrowing-limit", "none"),
            env=AS_ADMIN,
        )
    )
    assert brief(shown(master, name)) == [("default", 6, None, 1, "api")]

    # Refusals name the field and change nothing.
    refused = master.official(*ADMIN, "workspace", "resource-quota", "set", name, "9", input="\n")
    assert refused.returncode != 0, describe_run(refused)
    assert "clusterQuotaPairs: 9 is above the size of pool 'default': 8 enabled slots" in (
        refused.stderr
    ), describe_run(refused)
    refused = master.official("workspace", "resource-quota", "set", name, "1")
    assert refused.returncode != 0, describe_run(refused)
    assert "setting workspace quotas is for admins" in refused.stderr, describe_run(refused)
    mine = master.det("workspace", "quota", "set", name, "--pool", "gpu", "--nominal", "1")
    assert mine.returncode == 1 and "Traceback" not in mine.stderr, describe_run(mine)
    assert "is for admins" in mine.stderr, describe_run(mine)
    mine = master.det(
        *("workspace", "quota", "set", name, "--pool", "gpu", "--nominal", "1"), env=AS_ADMIN
    )
    assert "pool 'gpu', which has no agents yet" in mine.stderr, describe_run(mine)
    assert brief(shown(master, name)) == [("default", 6, None, 1, "api")]

    table = ok(master.det("workspace", "quota", "show", name)).stdout
    assert "Nominal" in table and name in table and "none" in table, table
    ok(master.det("workspace", "quota", "unset", name, "--pool", "default", env=AS_ADMIN))
    assert shown(master, name) == []


def test_determineds_workspace_create_with_a_resource_quota(master: MasterProcess) -> None:
    name = unique("speech")
    created = master.official(
        *ADMIN, "workspace", "create", name, "--resource-quota", "2", input="\n"
    )
    ok(created)
    # The admin's workspace: determined holds no role there, so the admin looks.
    assert brief(shown(master, name, AS_ADMIN)) == [("default", 2, None, None, "api")]


def test_a_config_quota_is_shown_and_listed(master: MasterProcess) -> None:
    ok(master.det("workspace", "create", CONFIGURED))
    assert brief(shown(master, CONFIGURED)) == [("default", 2, None, None, "master config")]
    listed = json.loads(ok(master.det("workspace", "quota", "list", "--json")).stdout)["quotas"]
    assert ("default", 2, None, None, "master config") in brief(listed)
    unset = master.det("workspace", "quota", "unset", CONFIGURED, "--pool", "default", env=AS_ADMIN)
    assert unset.returncode == 1, describe_run(unset)
    assert "the master config's, changed only there" in unset.stderr, describe_run(unset)
    assert lines(unset.stdout) == []


def test_job_and_task_lists_name_each_workspace_and_show_the_quotas(master: MasterProcess) -> None:
    name = unique("tables")
    ok(master.det("workspace", "create", name))
    quota = ("workspace", "quota", "set", name, "--pool", "default", "--nominal", "3")
    ok(master.det(*quota, "--lending-limit", "1", env=AS_ADMIN))
    [workspace] = master.api("GET", "/api/v1/workspaces", params={"name": name})["workspaces"]
    body = {"name": "p", "workspaceId": workspace["id"]}
    project = master.api("POST", f"/api/v1/workspaces/{workspace['id']}/projects", json=body)
    config = (
        f"name: {name}\nentrypoint: python3 train.py\nresources: {{slots_per_trial: 2}}\n"
        "searcher: {name: single, metric: loss, max_length: 1}\n"
    )
    body = {"config": config, "activate": True, "projectId": project["project"]["id"]}
    experiment = master.api("POST", "/api/v1/experiments", json=body)["experiment"]["id"]
    # Placed on the simulated agents: it holds 2 of its workspace's 3.
    block = re.compile(
        rf"^  {re.escape(name)} +2/3  0 borrowed; borrowing limit none, lending limit 1$", re.M
    )

    def listed() -> str | None:
        text = ok(master.det("job", "list")).stdout
        return text if block.search(text) else None

    text = master.wait_for("the job's 2 slots counted in its quota", listed, 60)
    [job] = [r for r in rich_table(text, JOB_HEADERS) if r["Job Name"] == f"{name} ({experiment})"]
    assert job["Workspace"] == name, text
    assert "\nQuotas in pool default (held/nominal slots):\n" in text, text
    jobs = json.loads(ok(master.det("job", "list", "--json")).stdout)  # the wire's list, as before
    [mine] = [j for j in jobs if j["entityId"] == str(experiment)]
    assert (mine["workspaceId"], mine["workspaceName"]) == (workspace["id"], name)
    # Another pool's queue: none of default's quotas.
    assert "Quotas in pool" not in ok(master.det("job", "list", "-p", "gpu")).stdout

    text = ok(master.det("task", "list")).stdout
    rows = [r for r in rich_table(text, TASK_HEADERS) if f"Experiment {experiment}:" in r["Name"]]
    assert [r["Workspace"] for r in rows] == [name], text
    assert block.search(text), text
    as_csv = ok(master.det("task", "list", "--csv")).stdout
    assert "Quotas in pool" not in as_csv and ",Workspace," in as_csv.splitlines()[0]
