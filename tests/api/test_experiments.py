"""Experiment creation through the REST API: merge, seeds, trials, lifecycle and bad input."""

from __future__ import annotations

import base64
import io
import tarfile
from typing import Any

import httpx
import numpy as np
import pytest
import yaml
from sqlalchemy import select

from master.db.models import ModelDefinitionModel
from master.db.session import session_scope
from master.services import agents as agent_service
from tests.factories import EXPERIMENT_YAML, create_experiment, create_template, row_counts, v1_file

REQUIRED_EXPERIMENT_KEYS = {
    "id",
    "name",
    "archived",
    "config",
    "originalConfig",
    "jobId",
    "numTrials",
    "projectId",
    "projectOwnerId",
    "searcherType",
    "startTime",
    "state",
    "username",
}
REQUIRED_TRIAL_KEYS = {
    "id",
    "experimentId",
    "hparams",
    "restarts",
    "startTime",
    "state",
    "totalBatchesProcessed",
}

SINGLE_YAML = """\
name: single
entrypoint: python3 train.py
hyperparameters:
  global_batch_size: 32
searcher: {name: single, metric: loss, max_length: 10}
"""


async def trials_of(api: httpx.AsyncClient, experiment_id: int) -> list[dict[str, Any]]:
    reply = await api.get(f"/api/v1/experiments/{experiment_id}/trials")
    assert reply.status_code == 200, reply.text
    trials: list[dict[str, Any]] = reply.json()["trials"]
    return trials


async def test_create_returns_what_the_official_client_needs(api: httpx.AsyncClient) -> None:
    reply = await create_experiment(api)
    assert reply.status_code == 200, reply.text
    body = reply.json()
    experiment = body["experiment"]
    assert experiment.keys() >= REQUIRED_EXPERIMENT_KEYS
    assert experiment["state"] == "STATE_ACTIVE"
    assert experiment["numTrials"] == 3
    assert experiment["username"] == "determined"
    assert experiment["originalConfig"] == EXPERIMENT_YAML
    assert body["config"]["reproducibility"]["experiment_seed"] == 1234

    trials = await trials_of(api, experiment["id"])
    assert len(trials) == 3
    for trial in trials:
        assert trial.keys() >= REQUIRED_TRIAL_KEYS
        assert trial["state"] == "STATE_QUEUED"
        assert 0.001 <= trial["hparams"]["lr"] <= 0.1
        assert trial["hparams"]["global_batch_size"] == 64


async def test_trial_seeds_follow_numpy_legacy_random_state(api: httpx.AsyncClient) -> None:
    """Only const hyperparameters: trial 1 gets the 5th 31-bit draw, as in Determined."""
    config = SINGLE_YAML + "reproducibility: {experiment_seed: 777}\n"
    experiment = (await create_experiment(api, config)).json()["experiment"]
    [trial] = await trials_of(api, experiment["id"])
    expected = int(np.random.RandomState(777).randint(0, 2**31, size=5)[4])
    assert trial["seed"] == expected


async def test_same_seed_gives_identical_trials(api: httpx.AsyncClient) -> None:
    first = (await create_experiment(api)).json()["experiment"]["id"]
    second = (await create_experiment(api)).json()["experiment"]["id"]
    a, b = await trials_of(api, first), await trials_of(api, second)
    assert [(t["seed"], t["hparams"]) for t in a] == [(t["seed"], t["hparams"]) for t in b]
    assert len({t["seed"] for t in a}) == 3  # and the trials differ among themselves


async def test_missing_seed_is_assigned_and_stored(api: httpx.AsyncClient) -> None:
    reply = await create_experiment(api, SINGLE_YAML)
    experiment = reply.json()["experiment"]
    seed = experiment["config"]["reproducibility"]["experiment_seed"]
    assert isinstance(seed, int) and 0 <= seed <= 2**31 - 1
    assert experiment["experimentSeed"] == seed
    again = (await api.get(f"/api/v1/experiments/{experiment['id']}")).json()["experiment"]
    assert again["config"]["reproducibility"]["experiment_seed"] == seed


async def test_template_merge_and_isolation_from_later_edits(api: httpx.AsyncClient) -> None:
    await create_template(api, "tpl")
    config = SINGLE_YAML + (
        "resources: {slots_per_trial: 4}\n"
        "bind_mounts:\n"
        "  - {host_path: /scratch, container_path: /usr}\n"
        "  - {host_path: /home, container_path: /home}\n"
        "environment: {environment_variables: [FROM_CONFIG=1]}\n"
    )
    reply = await create_experiment(api, config, template="tpl")
    assert reply.status_code == 200, reply.text
    effective = reply.json()["config"]
    # Scalars: the config wins; keys only in the template are kept.
    assert effective["resources"]["slots_per_trial"] == 4
    assert effective["resources"]["priority"] == 10
    assert effective["checkpoint_storage"]["host_path"] == "/mnt/ckpt"
    # Lists concatenate template then config ...
    assert effective["environment"]["environment_variables"] == ["FROM_TEMPLATE=1", "FROM_CONFIG=1"]
    # ... except bind mounts on the same container_path, where the config's entry wins.
    mounts = [(m["host_path"], m["container_path"]) for m in effective["bind_mounts"]]
    assert mounts == [("/scratch", "/usr"), ("/home", "/home")]

    experiment_id = reply.json()["experiment"]["id"]
    await api.patch("/api/v1/templates/tpl", json={"resources": {"priority": 99}})
    stored = (await api.get(f"/api/v1/experiments/{experiment_id}")).json()["experiment"]
    assert stored["config"] == effective
    assert stored["templateName"] == "tpl"
    assert stored["originalConfig"] == config


async def test_validate_only_stores_nothing(api: httpx.AsyncClient) -> None:
    reply = await create_experiment(api, validateOnly=True)
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["experiment"] is None
    assert body["config"]["resources"]["slots_per_trial"] == 1
    assert await row_counts(api) == (0, 0)


async def test_indivisible_global_batch_size_warns(api: httpx.AsyncClient) -> None:
    config = SINGLE_YAML.replace("global_batch_size: 32", "global_batch_size: 30")
    config += "resources: {slots_per_trial: 4}\n"
    reply = await create_experiment(api, config)
    assert reply.status_code == 200, reply.text
    [warning] = [w for w in reply.json()["warningMessages"] if "global_batch_size" in w]
    assert "7" in warning and "2" in warning
    assert "global_batch_size" in warning and "slots_per_trial" in warning


async def test_paused_creation(api: httpx.AsyncClient) -> None:
    experiment = (await create_experiment(api, activate=False)).json()["experiment"]
    assert experiment["state"] == "STATE_PAUSED"
    assert {t["state"] for t in await trials_of(api, experiment["id"])} == {"STATE_PAUSED"}


async def test_pause_activate_kill(api: httpx.AsyncClient) -> None:
    experiment_id = (await create_experiment(api)).json()["experiment"]["id"]
    url = f"/api/v1/experiments/{experiment_id}"

    assert (await api.post(f"{url}/pause")).status_code == 200
    assert (await api.get(url)).json()["experiment"]["state"] == "STATE_PAUSED"
    assert {t["state"] for t in await trials_of(api, experiment_id)} == {"STATE_PAUSED"}

    assert (await api.post(f"{url}/activate")).status_code == 200
    assert (await api.get(url)).json()["experiment"]["state"] == "STATE_ACTIVE"
    assert {t["state"] for t in await trials_of(api, experiment_id)} == {"STATE_QUEUED"}

    assert (await api.post(f"{url}/kill")).status_code == 200
    killed = (await api.get(url)).json()["experiment"]
    assert killed["state"] == "STATE_CANCELED"
    assert killed["endTime"] is not None
    assert {t["state"] for t in await trials_of(api, experiment_id)} == {"STATE_CANCELED"}

    # Killing again is harmless; pausing or activating a finished experiment is refused.
    assert (await api.post(f"{url}/kill")).status_code == 200
    refused = await api.post(f"{url}/activate")
    assert refused.status_code == 409
    assert "CANCELED" in refused.json()["message"]


async def test_list_filters_and_paginates(api: httpx.AsyncClient) -> None:
    ids = [(await create_experiment(api, SINGLE_YAML)).json()["experiment"]["id"] for _ in range(3)]
    page = (await api.get("/api/v1/experiments", params={"limit": 2, "offset": 0})).json()
    assert [e["id"] for e in page["experiments"]] == ids[:2]
    assert page["pagination"]["endIndex"] == 2 and page["pagination"]["total"] == 3
    mine = await api.get(
        "/api/v1/experiments", params={"archived": "false", "users": "determined", "limit": 200}
    )
    assert mine.json()["pagination"]["total"] == 3
    others = await api.get("/api/v1/experiments", params={"users": "admin"})
    assert others.json()["experiments"] == []
    newest = await api.get("/api/v1/experiments", params={"orderBy": "ORDER_BY_DESC"})
    assert newest.json()["experiments"][0]["id"] == ids[-1]


async def test_model_definition_is_stored_as_tar_gz(api: httpx.AsyncClient, app: Any) -> None:
    files = [
        v1_file("pkg", b"", kind=53),
        v1_file("pkg/model.py", b"x = 1\n"),
        v1_file("train.py", b"import pkg\n"),
    ]
    reply = await create_experiment(api, SINGLE_YAML, modelDefinition=files)
    assert reply.status_code == 200, reply.text
    experiment_id = reply.json()["experiment"]["id"]
    async with app.state.session_factory() as session:
        row = await session.scalar(
            select(ModelDefinitionModel).where(ModelDefinitionModel.experiment_id == experiment_id)
        )
    assert row is not None
    with tarfile.open(fileobj=io.BytesIO(row.archive), mode="r:gz") as tar:
        names = sorted(tar.getnames())
        assert tar.extractfile("pkg/model.py").read() == b"x = 1\n"  # type: ignore[union-attr]
    assert names == ["pkg", "pkg/model.py", "train.py"]


def _config_with(**top: Any) -> str:
    data = yaml.safe_load(SINGLE_YAML)
    data.update(top)
    return yaml.safe_dump(data)


BAD_CONFIGS = [
    pytest.param("name: [unclosed\n", "line", id="malformed-yaml"),
    pytest.param("- a\n- b\n", "mapping", id="yaml-not-a-mapping"),
    pytest.param(SINGLE_YAML + "bogus_key: 1\n", "bogus_key", id="unknown-key"),
    pytest.param(
        SINGLE_YAML + "resources: {slots_per_trial: -2}\n",
        "resources.slots_per_trial",
        id="neg-slots",
    ),
    pytest.param(
        SINGLE_YAML + "resources: {slots_per_trial: two}\n", "resources.slots_per_trial", id="type"
    ),
    pytest.param(
        _config_with(reproducibility={"experiment_seed": -1}),
        "reproducibility.experiment_seed",
        id="seed-negative",
    ),
    pytest.param(
        _config_with(reproducibility={"experiment_seed": 2**31}),
        "reproducibility.experiment_seed",
        id="seed-too-large",
    ),
    pytest.param("name: x\nentrypoint: a\n", "searcher", id="missing-searcher"),
    pytest.param(SINGLE_YAML + "template: other\n", "template", id="config-names-a-template"),
    pytest.param(
        SINGLE_YAML + "resources: {slots_per_trial: 3000000000}\n",
        "resources.slots_per_trial",
        id="slots-beyond-32-bit",
    ),
    pytest.param(
        SINGLE_YAML.replace("name: single", "name: " + "n" * 600), "name", id="name-too-long"
    ),
]


@pytest.mark.parametrize("config,needle", BAD_CONFIGS)
async def test_bad_config_is_refused_and_nothing_stored(
    api: httpx.AsyncClient, config: str, needle: str
) -> None:
    reply = await create_experiment(api, config)
    assert reply.status_code == 400, reply.text
    body = reply.json()
    assert body["code"] == 3
    assert needle in body["message"]
    assert await row_counts(api) == (0, 0)


async def test_unknown_template(api: httpx.AsyncClient) -> None:
    reply = await create_experiment(api, template="nope")
    assert reply.status_code == 404
    assert reply.json()["message"] == "template nope not found"
    assert await row_counts(api) == (0, 0)


async def test_template_error_after_merge_names_the_path(api: httpx.AsyncClient) -> None:
    # Valid alone, but the merged config lacks a searcher: say so, after the merge.
    await create_template(api, "partial", {"max_restarts": 1})
    reply = await create_experiment(api, "name: x\nentrypoint: python3 a.py\n", template="partial")
    assert reply.status_code == 400
    assert "searcher" in reply.json()["message"]
    assert await row_counts(api) == (0, 1)


BAD_FILES = [
    pytest.param([v1_file("/etc/passwd")], "absolute", id="absolute-path"),
    pytest.param([v1_file("../escape.py")], "'..'", id="dotdot"),
    pytest.param([v1_file("a/../../b.py")], "'..'", id="dotdot-inside"),
    pytest.param([v1_file("link", b"../../etc/passwd", kind=50)], "outside", id="link-outside"),
    pytest.param([v1_file("link", b"/etc/passwd", kind=50)], "absolute", id="link-absolute"),
    pytest.param([v1_file("a.py"), v1_file("a.py")], "twice", id="duplicate"),
    pytest.param([{"path": "a.py", "type": 48, "content": "%%%"}], "base64", id="bad-base64"),
    pytest.param([v1_file("dev", kind=51)], "not supported", id="device-file"),
    pytest.param(
        [v1_file("a/l", b"..", kind=50), v1_file("b", b"a/l/..", kind=50)],
        "through another link",
        id="link-through-a-link",
    ),
    pytest.param(
        [v1_file("b", b"a", kind=50), v1_file("a", b"", kind=53), v1_file("b/evil.py")],
        "inside the link",
        id="file-under-a-link",
    ),
    pytest.param(
        [{"path": "a.py", "type": 48, "content": "", "mtime": "inf"}], "mtime", id="mtime-inf"
    ),
]


@pytest.mark.parametrize("files,needle", BAD_FILES)
async def test_unsafe_model_definition_is_refused(
    api: httpx.AsyncClient, files: list[dict[str, Any]], needle: str
) -> None:
    reply = await create_experiment(api, SINGLE_YAML, modelDefinition=files)
    assert reply.status_code == 400, reply.text
    assert needle in reply.json()["message"]
    assert reply.json()["message"].startswith("modelDefinition")
    assert await row_counts(api) == (0, 0)


async def test_link_inside_the_model_dir_is_kept(api: httpx.AsyncClient) -> None:
    files = [v1_file("a/real.py"), v1_file("a/alias.py", b"real.py", kind=50)]
    reply = await create_experiment(api, SINGLE_YAML, modelDefinition=files)
    assert reply.status_code == 200, reply.text


async def test_model_definition_over_the_limit(api: httpx.AsyncClient) -> None:
    # The test master's limit is 1 MiB.
    big = [v1_file("weights.bin", b"\0" * (1024 * 1024 + 1))]
    reply = await create_experiment(api, SINGLE_YAML, modelDefinition=big)
    assert reply.status_code == 413
    assert "limit" in reply.json()["message"]
    assert await row_counts(api) == (0, 0)


async def test_request_body_over_the_limit_is_refused_early(api: httpx.AsyncClient) -> None:
    huge = base64.b64encode(b"\0" * (3 * 1024 * 1024)).decode()
    reply = await create_experiment(
        api, SINGLE_YAML, modelDefinition=[{"path": "x", "type": 48, "content": huge}]
    )
    assert reply.status_code == 413
    assert await row_counts(api) == (0, 0)


async def test_unknown_ids_are_404(api: httpx.AsyncClient) -> None:
    for path in ("/api/v1/experiments/999999", "/api/v1/experiments/999999/trials"):
        reply = await api.get(path)
        assert reply.status_code == 404
        assert reply.json()["message"] == "experiment 999999 not found"
    assert (await api.post("/api/v1/experiments/999999/kill")).status_code == 404


async def test_malformed_requests_get_400_not_500(api: httpx.AsyncClient) -> None:
    cases = [
        await api.post("/api/v1/experiments", content=b"{not json"),
        await api.post("/api/v1/experiments", json={"config": SINGLE_YAML, "surprise": 1}),
        await api.post("/api/v1/experiments", json={"config": 42}),
        await api.get("/api/v1/experiments", params={"limit": -1}),
        await api.get("/api/v1/experiments", params={"orderBy": "SIDEWAYS"}),
        await api.get("/api/v1/experiments", params={"states": "STATE_BOGUS"}),
        await api.get("/api/v1/experiments/abc"),
        await api.get("/api/v1/experiments/3000000000"),
        await api.get("/api/v1/experiments/99999999999999999999999"),
        await api.get("/api/v1/trials/3000000000"),
        await api.get("/api/v1/experiments", params={"offset": 2**63}),
        await api.post("/api/v1/experiments", json={"config": SINGLE_YAML, "projectId": 2**40}),
    ]
    for reply in cases:
        assert reply.status_code == 400, reply.text
        body = reply.json()
        assert body["code"] == 3 and body["message"]


# --- what resolute's agents cannot run: refused at submit, nothing stored ---------------------


async def register_agent(app: Any, agent_id: str, slots: int) -> None:
    """As the agent link registers one (tests/api/test_scheduling.py does the same)."""
    registration = agent_service.AgentRegistration(
        id=agent_id,
        resource_pool="default",
        devices=tuple(agent_service.Device(slot_id=i) for i in range(slots)),
    )
    async with session_scope(app.state.session_factory) as session:
        await agent_service.register_agent(session, app.state.settings, registration)


def _with_entrypoint(entrypoint: Any, slots: int = 1) -> str:
    data = yaml.safe_load(SINGLE_YAML)
    data["entrypoint"] = entrypoint
    data["resources"] = {"slots_per_trial": slots}
    return yaml.safe_dump(data, sort_keys=False)


@pytest.mark.parametrize(
    ("entrypoint", "shown"),
    [
        ("model_def:MyTrial", "model_def:MyTrial"),
        ("module.sub:Class", "module.sub:Class"),
        (["model_def:MyTrial"], "model_def:MyTrial"),
    ],
)
async def test_trial_class_entrypoint_is_refused(
    api: httpx.AsyncClient, entrypoint: Any, shown: str
) -> None:
    reply = await create_experiment(api, _with_entrypoint(entrypoint))
    assert reply.status_code == 400, reply.text
    body = reply.json()
    assert body["message"].startswith(
        f"invalid config: entrypoint: {shown!r} names a Trial class (Determined's legacy API), "
        "which resolute does not run; port it to the PyTorch Trainer and use `python3 -m "
        "determined.launch.torch_distributed python3 train.py`"
    )
    assert [d["path"] for d in body["details"]] == ["entrypoint"]
    assert await row_counts(api) == (0, 0)


async def test_trial_class_entrypoint_in_a_template_is_refused(api: httpx.AsyncClient) -> None:
    reply = await create_template(api, "legacy", {"entrypoint": "model_def:MyTrial"})
    assert reply.status_code == 400, reply.text
    assert "entrypoint: 'model_def:MyTrial' names a Trial class" in reply.json()["message"]
    assert await row_counts(api) == (0, 0)


async def test_horovod_launcher_is_refused(api: httpx.AsyncClient) -> None:
    entrypoint = "python3 -m determined.launch.horovod --autohorovod python3 train.py"
    reply = await create_experiment(api, _with_entrypoint(entrypoint))
    assert reply.status_code == 400, reply.text
    message = reply.json()["message"]
    assert message.startswith("invalid config: entrypoint: runs determined.launch.horovod")
    assert "Horovod needs sshd between containers" in message
    assert "use determined.launch.torch_distributed" in message
    assert await row_counts(api) == (0, 0)


DEEPSPEED = "python3 -m determined.launch.deepspeed python3 train.py --deepspeed ds.json"


async def test_deepspeed_beyond_one_agent_is_refused(api: httpx.AsyncClient, app: Any) -> None:
    await register_agent(app, "gpu-a", 8)
    await register_agent(app, "gpu-b", 4)
    reply = await create_experiment(api, _with_entrypoint(DEEPSPEED, slots=16))
    assert reply.status_code == 400, reply.text
    body = reply.json()
    assert body["message"].startswith(
        "resources.slots_per_trial: 16 slots per trial fit on no agent of resource pool "
        "default (the largest has 8), and determined.launch.deepspeed across agents needs "
        "sshd between containers"
    )
    assert [d["path"] for d in body["details"]] == ["resources.slots_per_trial"]
    assert await row_counts(api) == (0, 0)

    # What fits on one agent is accepted; other launchers may span agents.
    reply = await create_experiment(api, _with_entrypoint(DEEPSPEED, slots=8))
    assert reply.status_code == 200, reply.text
    assert reply.json()["config"]["resources"]["slots_per_trial"] == 8
    torch = "python3 -m determined.launch.torch_distributed python3 train.py"
    reply = await create_experiment(api, _with_entrypoint(torch, slots=16))
    assert reply.status_code == 200, reply.text
    assert await row_counts(api) == (2, 0)


async def test_deepspeed_with_no_agents_known_is_accepted(api: httpx.AsyncClient) -> None:
    reply = await create_experiment(api, _with_entrypoint(DEEPSPEED, slots=16))
    assert reply.status_code == 200, reply.text
    assert reply.json()["experiment"]["config"]["entrypoint"] == DEEPSPEED
    assert await row_counts(api) == (1, 0)


# --- container keys: the image applies on agents with a runtime; Docker-only keys warn -------

# Shaped like Determined's examples: an image per accelerator, a forced pull, capabilities.
DOCKER_ENVIRONMENT_YAML = (
    SINGLE_YAML
    + """\
environment:
  image:
    cpu: determinedai/pytorch-ngc:0.38.1
    cuda: determinedai/pytorch-ngc:0.38.1
  environment_variables:
    - NCCL_DEBUG=INFO
  force_pull_image: true
  registry_auth: {username: robot, password: s3cret}
  add_capabilities: [IPC_LOCK]
  ports: {tensorboard: 6006}
"""
)


async def test_container_keys_are_accepted_and_docker_only_ones_said_not_to_apply(
    api: httpx.AsyncClient,
) -> None:
    reply = await create_experiment(api, DOCKER_ENVIRONMENT_YAML)
    assert reply.status_code == 200, reply.text
    body = reply.json()
    docker = [w for w in body["warningMessages"] if w.startswith("environment.")]
    assert [w.split(" ", 1)[0] for w in docker] == [
        "environment.image",
        "environment.add_capabilities",
        "environment.ports",
    ]
    assert docker[0] == (
        "environment.image (cpu: determinedai/pytorch-ngc:0.38.1, cuda: "
        "determinedai/pytorch-ngc:0.38.1) is used on agents started with --container-runtime "
        "podman|docker; agents without a runtime run the trial's processes on the host, "
        "where PATH in environment.environment_variables chooses the interpreter"
    )
    assert not any("s3cret" in w for w in body["warningMessages"])
    experiment = body["experiment"]
    # The text as submitted, but for the registry password, which is shown masked.
    assert "s3cret" not in experiment["originalConfig"]
    assert yaml.safe_load(experiment["originalConfig"]) == {
        **yaml.safe_load(DOCKER_ENVIRONMENT_YAML),
        "environment": {
            **yaml.safe_load(DOCKER_ENVIRONMENT_YAML)["environment"],
            "registry_auth": {"username": "robot", "password": "********"},
        },
    }
    stored = (await api.get(f"/api/v1/experiments/{experiment['id']}")).json()["experiment"]
    environment = stored["config"]["environment"]
    assert environment["image"]["cuda"] == "determinedai/pytorch-ngc:0.38.1"
    assert environment["ports"] == {"tensorboard": 6006}
    assert environment["environment_variables"] == ["NCCL_DEBUG=INFO"]
