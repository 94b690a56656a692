"""bind_mounts at submit, on both databases: targets over the trial's own files refused
naming the field, a missing host path refused naming it when the master shares its
agents' host, nothing stored either way; an accepted config stores its mounts unwarned."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from master.db.session import session_scope
from master.services import agents as agent_service
from tests.factories import create_experiment, row_counts, v1_file

CONFIG: dict[str, Any] = {
    "name": "mounts",
    "entrypoint": "python3 train.py",
    "searcher": {"name": "single", "metric": "loss", "max_length": 10},
}


def _config(*mounts: dict[str, Any], **extra: Any) -> str:
    return yaml.safe_dump({**CONFIG, "bind_mounts": list(mounts), **extra})


async def register_agent(app: Any, agent_id: str, hostname: str) -> None:
    registration = agent_service.AgentRegistration(
        id=agent_id,
        resource_pool="default",
        devices=(agent_service.Device(slot_id=0),),
        hostname=hostname,
    )
    async with session_scope(app.state.session_factory) as session:
        await agent_service.register_agent(session, app.state.settings, registration)


async def _refused(api: httpx.AsyncClient, config: str, **fields: Any) -> dict[str, str]:
    before = await row_counts(api)
    reply = await create_experiment(api, config, **fields)
    assert reply.status_code == 400, reply.text
    assert await row_counts(api) == before
    return {d["path"]: d["message"] for d in reply.json()["details"]}


@pytest.mark.parametrize(
    ("container_path", "why"),
    [
        ("/run/determined", "/run/determined"),
        ("/run/determined/train/model", "/run/determined"),
        ("/run", "/run/determined"),
        ("/", "root"),
        ("train.py", "'train.py'"),
        ("lib", "'lib'"),
        ("../up", "leaves the working directory"),
        ("/dev/shm", "the trial's own"),
    ],
)
async def test_a_mount_over_the_trials_own_files_is_refused(
    api: httpx.AsyncClient, tmp_path: Path, container_path: str, why: str
) -> None:
    config = _config({"host_path": str(tmp_path), "container_path": container_path})
    model = [v1_file("train.py"), v1_file("lib/util.py")]
    problems = await _refused(api, config, modelDefinition=model)
    assert list(problems) == ["bind_mounts.0.container_path"], problems
    assert why in problems["bind_mounts.0.container_path"]


async def test_shared_fs_storage_keeps_its_mount_point(
    api: httpx.AsyncClient, tmp_path: Path
) -> None:
    config = _config(
        {"host_path": str(tmp_path), "container_path": "/determined_shared_fs/extra"},
        checkpoint_storage={"type": "shared_fs", "host_path": str(tmp_path)},
    )
    problems = await _refused(api, config)
    assert "shared_fs" in problems["bind_mounts.0.container_path"]


async def test_a_missing_host_path_is_refused_when_the_master_shares_the_agents_host(
    api: httpx.AsyncClient, app: Any, tmp_path: Path
) -> None:
    missing = tmp_path / "not-there"
    config = _config(
        {"host_path": str(tmp_path), "container_path": "/data"},
        {"host_path": str(missing), "container_path": "/more", "read_only": True},
    )
    # An agent elsewhere: the master's file system says nothing of its host's, so accepted.
    await register_agent(app, "remote", "some-other-host")
    reply = await create_experiment(api, config)
    assert reply.status_code == 200, reply.text

    # Every agent of the pool on the master's host (a local cluster): refused, naming it.
    async with session_scope(app.state.session_factory) as session:
        await agent_service.register_agent(
            session,
            app.state.settings,
            agent_service.AgentRegistration(
                id="remote",
                resource_pool="default",
                devices=(agent_service.Device(slot_id=0),),
                hostname=socket.gethostname(),
            ),
        )
    problems = await _refused(api, config)
    assert list(problems) == ["bind_mounts.1.host_path"], problems
    assert str(missing) in problems["bind_mounts.1.host_path"]
    assert "does not exist" in problems["bind_mounts.1.host_path"]


async def test_good_mounts_and_shm_size_are_stored_without_a_warning(
    api: httpx.AsyncClient, app: Any, tmp_path: Path
) -> None:
    await register_agent(app, "local", socket.gethostname())
    config = _config(
        {"host_path": str(tmp_path), "container_path": "data", "read_only": True},
        {"host_path": str(tmp_path), "container_path": "/datasets"},
        resources={"shm_size": "256M"},
    )
    reply = await create_experiment(api, config)
    assert reply.status_code == 200, reply.text
    body = reply.json()
    stored = body["experiment"]["config"]
    assert [m["container_path"] for m in stored["bind_mounts"]] == ["data", "/datasets"]
    assert stored["bind_mounts"][0]["read_only"] is True
    assert stored["resources"]["shm_size"] == "256M"
    assert body["warningMessages"] == []


async def test_bad_shm_size_and_propagation_are_refused_naming_the_field(
    api: httpx.AsyncClient, tmp_path: Path
) -> None:
    config = _config(
        {"host_path": str(tmp_path), "container_path": "/x", "propagation": "sideways"},
        resources={"shm_size": "lots"},
    )
    problems = await _refused(api, config)
    assert set(problems) == {"bind_mounts.0.propagation", "resources.shm_size"}, problems


async def test_a_continue_cannot_mount_over_the_trials_files(
    api: httpx.AsyncClient, tmp_path: Path
) -> None:
    reply = await create_experiment(api, yaml.safe_dump(CONFIG))
    assert reply.status_code == 200, reply.text
    experiment_id = reply.json()["experiment"]["id"]
    killed = await api.post(f"/api/v1/experiments/{experiment_id}/kill")
    assert killed.status_code == 200, killed.text
    override = yaml.safe_dump(
        {"bind_mounts": [{"host_path": str(tmp_path), "container_path": "/run/determined"}]}
    )
    reply = await api.post(
        "/api/v1/experiments/continue", json={"id": experiment_id, "overrideConfig": override}
    )
    assert reply.status_code == 400, reply.text
    assert [d["path"] for d in reply.json()["details"]] == ["bind_mounts.0.container_path"]
    stored = (await api.get(f"/api/v1/experiments/{experiment_id}")).json()["experiment"]
    assert stored["state"] == "STATE_CANCELED"
    assert not stored["config"].get("bind_mounts")
