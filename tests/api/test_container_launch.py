"""An experiment's or task's image reaches its agent (issue 31), on SQLite and Postgres: the
StartAllocation's container carries the image chosen for the slots' type, the pull's
credentials and the devices, while the registry password stays out of everything a user,
a dashboard page or the ranks can read, and comes back when a shown config is resubmitted.
Agents are the hub's own connections (as in test_agent_link); the runtime is the agent's
(tests/e2e)."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import pytest
import yaml
from fastapi import FastAPI
from pydantic import ValidationError
from sqlalchemy import select

from master.db.models import ExperimentModel, TemplateModel
from master.db.session import session_scope
from master.settings import ResourcePoolSettings, TaskContainerDefaults
from resolute_proto.agent.v1 import agent_pb2 as pb
from tests.api.test_access import refusal
from tests.api.test_agent_link import connect, hub_of, of_kind, sent
from tests.api.test_determined_launch import DET_SCRIPT, prepared, schedule, started
from tests.api.test_tasks import get as get_task
from tests.api.test_tasks import started as started_task
from tests.factories import create_experiment, create_template, row_counts, v1_file

PASSWORD = "s3cret-pw"
REGISTRY = "registry.example.com:5000"
CONFIG = f"""
name: in-a-container
entrypoint: python3 train.py
resources:
  slots_per_trial: 1
  devices:
    - {{host_path: /dev/fuse, container_path: /dev/fuse, mode: rw}}
environment:
  image:
    cpu: {REGISTRY}/team/trainer:cpu
    cuda: {REGISTRY}/team/trainer:cuda
  force_pull_image: true
  registry_auth: {{username: robot, password: {PASSWORD}, serveraddress: {REGISTRY}}}
searcher: {{name: single, metric: loss, max_length: 1}}
"""


async def submit(api: httpx.AsyncClient, config: str, **fields: Any) -> dict[str, Any]:
    reply = await create_experiment(
        api, config, modelDefinition=[v1_file("train.py", DET_SCRIPT)], **fields
    )
    assert reply.status_code == 200, reply.text
    assert PASSWORD not in reply.text  # not in the reply's config, nor its original text
    body: dict[str, Any] = reply.json()
    return body


async def launched(app: FastAPI) -> pb.StartAllocation:
    """The one submitted trial placed on a one-CPU-slot agent and started there."""
    hub = hub_of(app)
    agent = await connect(hub, "agent-a")
    await schedule(app)
    await hub.tick()
    (prepare,) = of_kind(sent(agent), "prepare")
    # Determined's script: the per_agent layout, which also writes trial.json.
    await hub.on_message(agent, prepared(prepare.allocation_id, 29500, [29501, 29502]))
    (start,) = of_kind(sent(agent), "start")
    await hub.on_message(agent, started(start.allocation_id))
    return start  # type: ignore[no-any-return]


def assert_ranks_never_see_the_password(start: pb.StartAllocation) -> None:
    for name, value in [*start.env.items(), *start.info_files.items()]:
        assert PASSWORD not in value, name
    config = json.loads(start.env["DET_EXPERIMENT_CONFIG"])
    assert "registry_auth" not in config["environment"]
    assert config["environment"]["image"]  # the rest of the environment as it was


async def test_an_experiments_image_credentials_and_devices_reach_its_agent(
    app: FastAPI, api: httpx.AsyncClient
) -> None:
    await submit(api, CONFIG)
    start = await launched(app)
    assert start.HasField("container")
    assert start.container == pb.Container(
        image=f"{REGISTRY}/team/trainer:cpu",  # the agent's slots are CPUs
        force_pull=True,
        registry_auth=pb.RegistryAuth(username="robot", password=PASSWORD, serveraddress=REGISTRY),
        devices=[
            pb.DeviceMapping(
                host_path="/dev/fuse", container_path="/dev/fuse", cgroup_permissions="rw"
            )
        ],
    )
    assert set(start.info_files) >= {"trial.json"}
    assert (
        "registry_auth" not in json.loads(start.info_files["trial.json"])["config"]["environment"]
    )
    assert_ranks_never_see_the_password(start)


async def test_no_image_for_the_slots_type_leaves_the_container_unset(
    app: FastAPI, api: httpx.AsyncClient
) -> None:
    cuda_only = CONFIG.replace(f"    cpu: {REGISTRY}/team/trainer:cpu\n", "")
    await submit(api, cuda_only)
    start = await launched(app)
    assert not start.HasField("container")  # the agent runs the processes on its host
    assert_ranks_never_see_the_password(start)


async def test_the_password_is_shown_masked_and_a_fork_of_the_shown_config_keeps_it(
    app: FastAPI, api: httpx.AsyncClient
) -> None:
    created = await submit(api, CONFIG)
    experiment_id = created["experiment"]["id"]
    assert created["config"]["environment"]["registry_auth"]["password"] == "********"
    got = await api.get(f"/api/v1/experiments/{experiment_id}")
    assert got.status_code == 200 and PASSWORD not in got.text
    shown = got.json()["experiment"]
    auth = shown["config"]["environment"]["registry_auth"]
    assert {key: value for key, value in auth.items() if value is not None} == {
        "username": "robot",
        "password": "********",
        "serveraddress": REGISTRY,
    }
    assert "password: '********'" in shown["originalConfig"]
    listed = await api.get("/api/v1/experiments")
    assert PASSWORD not in listed.text

    # The web UI's fork: the shown config sent back; the ******** is the parent's password.
    fork = await submit(api, yaml.safe_dump(shown["config"]), parentId=experiment_id)
    async with session_scope(app.state.session_factory) as session:
        stored = await session.get(ExperimentModel, fork["experiment"]["id"])
        assert stored is not None
        assert stored.config["environment"]["registry_auth"]["password"] == PASSWORD
    # Without a parent to take it from, ******** is refused: it is not a password.
    reply = await create_experiment(api, yaml.safe_dump(shown["config"]))
    assert refusal(reply, 400).startswith(
        "config: environment.registry_auth.password: ******** is how the master shows a secret"
    )


async def test_a_templates_password_is_shown_masked_kept_on_edit_and_used_at_launch(
    app: FastAPI, api: httpx.AsyncClient
) -> None:
    template = {
        "environment": {
            "image": "ubuntu:22.04",
            "registry_auth": {"username": "robot", "password": PASSWORD, "auth": "cm9ib3Q6eA=="},
        }
    }
    reply = await create_template(api, "registry", template)
    assert reply.status_code == 200 and PASSWORD not in reply.text
    got = await api.get("/api/v1/templates/registry")
    assert PASSWORD not in got.text
    shown = got.json()["template"]["config"]
    assert shown["environment"]["registry_auth"] == {
        "username": "robot",
        "password": "********",
        "auth": "********",
    }
    # Edited as shown: the secrets are the stored ones again.
    shown["environment"]["image"] = "ubuntu:24.04"
    edited = await api.patch("/api/v1/templates/registry", json=shown)
    assert edited.status_code == 200, edited.text
    async with session_scope(app.state.session_factory) as session:
        row = await session.scalar(select(TemplateModel).where(TemplateModel.name == "registry"))
        assert row is not None
        assert row.config["environment"]["registry_auth"]["password"] == PASSWORD
        assert row.config["environment"]["image"] == "ubuntu:24.04"

    config = "entrypoint: python3 train.py\nsearcher: {name: single, metric: loss, max_length: 1}\n"
    await submit(api, config, template="registry")
    start = await launched(app)
    assert start.container.image == "ubuntu:24.04"
    assert start.container.registry_auth == pb.RegistryAuth(
        username="robot", password=PASSWORD, auth="cm9ib3Q6eA=="
    )
    assert_ranks_never_see_the_password(start)


async def test_a_commands_container_gets_the_credentials_its_config_and_env_do_not(
    app: FastAPI, api: httpx.AsyncClient
) -> None:
    config = {
        "entrypoint": "nvidia-smi",
        "resources": {"slots": 1, "devices": [{"host_path": "/dev/fuse", "container_path": "/f"}]},
        "environment": {
            "image": "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04",
            "registry_auth": {"username": "$oauthtoken", "password": PASSWORD},
        },
    }
    _, _, task, start = await started_task(app, api, config=config)
    assert start.container == pb.Container(
        image="nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04",
        registry_auth=pb.RegistryAuth(username="$oauthtoken", password=PASSWORD),
        devices=[
            pb.DeviceMapping(host_path="/dev/fuse", container_path="/f", cgroup_permissions="mrw")
        ],
    )
    for name, value in [*start.env.items(), *start.info_files.items()]:
        assert PASSWORD not in value, name
    reply = await api.get(f"/api/v1/commands/{task['id']}")
    assert reply.status_code == 200 and PASSWORD not in reply.text
    assert reply.json()["config"]["environment"]["registry_auth"]["password"] == "********"
    assert (await get_task(api, task["id"]))["state"] == "STATE_RUNNING"
    # The shown config is no password: a task has no earlier one to take it from.
    again = await api.post("/api/v1/commands", json={"config": reply.json()["config"]})
    assert "environment.registry_auth.password: ******** is how the master shows" in refusal(
        again, 400
    )


async def test_dashboard_pages_never_show_the_password(
    app: FastAPI, api: httpx.AsyncClient
) -> None:
    experiment = (await submit(api, CONFIG))["experiment"]
    await create_template(
        api, "registry", {"environment": {"registry_auth": {"username": "r", "password": PASSWORD}}}
    )
    created = await api.post(
        "/api/v1/commands",
        json={
            "config": {
                "entrypoint": "true",
                "environment": {
                    "image": "ubuntu:22.04",
                    "registry_auth": {"username": "r", "password": PASSWORD},
                },
            }
        },
    )
    assert created.status_code == 200 and PASSWORD not in created.text  # its reply's config
    task = created.json()["command"]
    login = await api.post(
        "/ui/login",
        data={"username": "determined", "password": "", "next": "/ui/tasks"},
        headers={"Origin": "http://master"},
    )
    assert login.status_code == 303, login.text
    for page in (
        f"/ui/experiments/{experiment['id']}",
        "/ui/templates/registry",
        f"/ui/tasks/{task['id']}",
        "/ui/tasks",
    ):
        reply = await api.get(page)
        assert reply.status_code == 200, page
        assert PASSWORD not in reply.text, page


async def test_bad_container_keys_are_refused_naming_the_field_and_store_nothing(
    api: httpx.AsyncClient,
) -> None:
    cases = {
        CONFIG.replace("team/trainer:cpu", "Team/trainer:cpu"): (
            "environment.image.cpu: 'registry.example.com:5000/Team/trainer:cpu': repository "
            "name component 'Team' must be lowercase"
        ),
        CONFIG.replace(f"password: {PASSWORD}, ", ""): (
            "environment.registry_auth.password: required with a username"
        ),
        CONFIG.replace(f"serveraddress: {REGISTRY}", "serveraddress: 'ftp://r.io'"): (
            "environment.registry_auth.serveraddress: 'ftp://r.io' is not a registry address"
        ),
        CONFIG.replace("mode: rw", "mode: rwx"): "resources.devices.0.mode: 'rwx' is not a device",
        CONFIG.replace(
            "  force_pull", "  pod_spec: {spec: {nodeSelector: {gpu: a1}}}\n  force_pull"
        ): (
            "environment.pod_spec: refused: resolute runs no Kubernetes pods; use environment.image"
        ),
    }
    for config, expected in cases.items():
        reply = await create_experiment(api, config)
        assert expected in refusal(reply, 400), config
    assert await row_counts(api) == (0, 0)
    task = await api.post(
        "/api/v1/commands",
        json={"config": {"entrypoint": "true", "environment": {"pod_spec": {"metadata": {}}}}},
    )
    assert "environment.pod_spec: refused: resolute runs no Kubernetes pods" in refusal(task, 400)
    assert (await api.get("/api/v1/commands")).json()["commands"] == []


async def test_a_pool_that_requires_images_refuses_work_without_one(
    app: FastAPI, api: httpx.AsyncClient
) -> None:
    """resource_pools[].require_image: a config without an image is refused at submit,
    naming the pool, and stores nothing; one with an image goes in."""
    settings = app.state.settings
    app.state.settings = settings.model_copy(
        update={
            "resource_pools": [
                ResourcePoolSettings(pool_name="default"),
                ResourcePoolSettings(pool_name="images-only", require_image=True),
            ]
        }
    )
    try:
        bare = CONFIG.split("environment:")[0] + "resources: {resource_pool: images-only}\n"
        bare = bare.replace("resources:\n  slots_per_trial: 1\n", "").replace(
            "  devices:\n    - {host_path: /dev/fuse, container_path: /dev/fuse, mode: rw}\n", ""
        )
        bare += "searcher: {name: single, metric: loss, max_length: 1}\n"
        reply = await create_experiment(api, bare)
        assert (
            "environment.image: resource pool 'images-only' runs only images (require_image)"
            in refusal(reply, 400)
        )
        assert await row_counts(api) == (0, 0)
        command = await api.post(
            "/api/v1/commands",
            json={"config": {"entrypoint": "true", "resources": {"resource_pool": "images-only"}}},
        )
        assert "resource pool 'images-only' runs only images" in refusal(command, 400)
        assert (await api.get("/api/v1/commands")).json()["commands"] == []
        # With an image it is taken; the default pool still takes work without one.
        with_image = CONFIG.replace(
            "slots_per_trial: 1", "slots_per_trial: 1\n  resource_pool: images-only"
        )
        await submit(api, with_image)
        plain = await create_experiment(
            api, bare.replace("resources: {resource_pool: images-only}\n", "")
        )
        assert plain.status_code == 200, plain.text
    finally:
        app.state.settings = settings


async def test_the_masters_default_image_and_credentials_apply_to_work_that_names_none(
    app: FastAPI, api: httpx.AsyncClient, admin: httpx.AsyncClient
) -> None:
    """task_container_defaults.image (Determined's master key): written into the stored
    config of an experiment or task that names no image (so a pool that requires images
    takes it), and its registry_auth used for the pull but never stored or shown."""
    default_image = f"{REGISTRY}/team/base:1"
    defaults = TaskContainerDefaults(
        image={"cpu": default_image},
        registry_auth={"username": "robot", "password": PASSWORD, "serveraddress": REGISTRY},
    )
    settings = app.state.settings
    changed = settings.model_copy(
        update={
            "resource_pools": [
                ResourcePoolSettings(pool_name="default", require_image=True),
            ],
            "task_container_defaults": defaults,
        }
    )
    hub = hub_of(app)
    app.state.settings = hub.launches.settings = changed
    try:
        bare = (
            CONFIG.split("environment:")[0]
            + "searcher: {name: single, metric: loss, max_length: 1}\n"
        )
        body = await submit(api, bare)
        environment = body["config"]["environment"]
        assert environment["image"] == {"cpu": default_image}, environment
        assert "registry_auth" not in environment or not environment["registry_auth"]
        start = await launched(app)
        assert start.container.image == default_image
        assert start.container.registry_auth == pb.RegistryAuth(
            username="robot", password=PASSWORD, serveraddress=REGISTRY
        )
        assert_ranks_never_see_the_password(start)
        command = await api.post("/api/v1/commands", json={"config": {"entrypoint": "true"}})
        assert command.status_code == 200, command.text
        reply = await api.get(f"/api/v1/commands/{command.json()['command']['id']}")
        assert reply.json()["config"]["environment"]["image"] == {"cpu": default_image}
        assert PASSWORD not in reply.text
        master_config = (await admin.get("/api/v1/master/config")).json()["config"]
        assert master_config["task_container_defaults"]["registry_auth"]["password"] == "********"
    finally:
        app.state.settings = hub.launches.settings = settings


def test_bad_master_defaults_are_refused_naming_the_key() -> None:
    for defaults, words in [
        ({"image": "Team/UPPER"}, "image: 'Team/UPPER': repository name component 'Team' must be"),
        ({"image": {"tpu": "x"}}, "image.tpu: unknown key"),
        ({"registry_auth": {"username": "robot"}}, "registry_auth.password: required"),
        (
            {"registry_auth": {"username": "robot", "password": "pw"}},
            "registry_auth.serveraddress: required here",
        ),
    ]:
        with pytest.raises(ValidationError, match=re.escape(words)):
            TaskContainerDefaults.model_validate(defaults)
