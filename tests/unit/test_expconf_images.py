"""A config's image, registry credentials, devices and pod_spec are checked at submit, for
experiments and tasks alike, each problem at its own path (issue 31)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from master.core.errors import ConfigError
from master.core.expconf import config_warnings, validate_config
from master.core.task_config import validate_task_config

MINIMAL: dict[str, Any] = {
    "entrypoint": "python3 train.py",
    "searcher": {"name": "single", "metric": "loss", "max_length": {"batches": 10}},
    "checkpoint_storage": {"type": "shared_fs", "host_path": "/tmp/ckpt"},
}


def _problems(config: dict[str, Any], *, complete: bool = True) -> dict[str, str]:
    with pytest.raises(ConfigError) as caught:
        validate_config(config, complete=complete)
    return {p.path: p.message for p in caught.value.problems}


def _task_problems(config: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(ConfigError) as caught:
        validate_task_config(config, "COMMAND")
    return {p.path: p.message for p in caught.value.problems}


def _with(section: str, value: dict[str, Any]) -> dict[str, Any]:
    return {**copy.deepcopy(MINIMAL), section: value}


def test_a_malformed_image_name_is_refused_at_its_path_saying_why() -> None:
    assert _problems(_with("environment", {"image": "PyTorch:latest"})) == {
        "environment.image": "'PyTorch:latest': repository name component 'PyTorch' must "
        "be lowercase"
    }
    problems = _problems(
        _with("environment", {"image": {"cpu": "trainer:cpu", "cuda": "trainer:", "gpu": "a b"}})
    )
    assert problems == {
        "environment.image.cuda": "'trainer:': the tag after ':' is empty",
        "environment.image.gpu": "'a b' is not an image name: it contains whitespace",
    }


def test_good_image_names_submit() -> None:
    for image in (
        "determinedai/pytorch-ngc:0.38.1",
        "registry.example.com:5000/team/trainer@sha256:" + "a" * 64,
        {"cpu": "ubuntu:22.04", "rocm": "rocm/pytorch:latest"},
    ):
        validate_config(_with("environment", {"image": image}), complete=True)


def test_a_username_without_password_or_auth_is_refused() -> None:
    config = _with("environment", {"image": "t:1", "registry_auth": {"username": "robot"}})
    assert _problems(config) == {
        "environment.registry_auth.password": "required with a username (or give `auth`, "
        "base64 of username:password)"
    }
    lone = _with("environment", {"registry_auth": {"password": "s3cret"}})
    assert list(_problems(lone)) == ["environment.registry_auth.username"]
    # A template may hold the username and the experiment its password: partial configs pass.
    validate_config(config, complete=False)
    for auth in (
        {"username": "robot", "password": "s3cret"},
        {"auth": "cm9ib3Q6czNjcmV0"},
        {"username": "robot", "identitytoken": "tok"},
        {"serveraddress": "registry.example.com"},
    ):
        validate_config(_with("environment", {"registry_auth": auth}), complete=True)


@pytest.mark.parametrize(
    "address",
    ["registry.example.com", "registry.example.com:5000", "https://index.docker.io/v1/", "[::1]"],
)
def test_a_registry_address_is_a_host_or_https_url(address: str) -> None:
    auth = {"username": "robot", "password": "s3cret", "serveraddress": address}
    validate_config(_with("environment", {"registry_auth": auth}), complete=True)


@pytest.mark.parametrize(
    "address",
    ["http://registry.example.com", "ftp://r.io", "registry example", "r.io:70000", "r.io/v2"],
)
def test_a_registry_address_that_is_no_host_is_refused(address: str) -> None:
    auth = {"username": "robot", "password": "s3cret", "serveraddress": address}
    problems = _problems(_with("environment", {"registry_auth": auth}))
    assert problems == {
        "environment.registry_auth.serveraddress": f"{address!r} is not a registry address: "
        "give the host (registry.example.com:5000) or an https:// URL"
    }


def test_pod_spec_is_refused_naming_what_to_use_instead() -> None:
    problems = _problems(_with("environment", {"pod_spec": {"spec": {"nodeSelector": {}}}}))
    message = problems["environment.pod_spec"]
    assert message.startswith("refused: resolute runs no Kubernetes pods")
    for instead in ("environment.image", "bind_mounts", "resources.devices"):
        assert instead in message
    validate_config(_with("environment", {"pod_spec": None}), complete=True)  # null: unset


def test_bad_devices_are_refused_each_at_its_path() -> None:
    devices = [
        {"host_path": "dev/fuse", "container_path": "/dev/fuse"},
        {"host_path": "/dev/fuse", "container_path": "fuse"},
        {"host_path": "/dev/fuse", "container_path": "/dev/fuse", "mode": "rwx"},
        {"host_path": "/dev/fuse", "container_path": "/dev/fuse", "mode": "rr"},
        {"host_path": "/dev/fuse", "container_path": "/dev/fuse", "mode": ""},
    ]
    problems = _problems(_with("resources", {"devices": devices}))
    assert problems == {
        "resources.devices.0.host_path": "must be an absolute path such as /dev/fuse",
        "resources.devices.1.container_path": "must be an absolute path such as /dev/fuse",
        "resources.devices.2.mode": "'rwx' is not a device mode: use r, w and m, each at most "
        "once (rwm)",
        "resources.devices.3.mode": "'rr' is not a device mode: use r, w and m, each at most "
        "once (rwm)",
        "resources.devices.4.mode": "'' is not a device mode: use r, w and m, each at most "
        "once (rwm)",
    }
    good = [{"host_path": "/dev/fuse", "container_path": "/dev/fuse", "mode": "rw"}]
    validate_config(_with("resources", {"devices": good}), complete=True)


def test_a_tasks_config_is_checked_the_same_way() -> None:
    config = {
        "entrypoint": "nvidia-smi",
        "environment": {
            "image": {"cuda": "Trainer"},
            "registry_auth": {"serveraddress": "http://r.io"},
            "pod_spec": {"metadata": {}},
        },
        "resources": {"devices": [{"host_path": "/dev/fuse", "container_path": "fuse"}]},
    }
    problems = _task_problems(config)
    assert set(problems) == {
        "environment.image.cuda",
        "environment.registry_auth.serveraddress",
        "environment.pod_spec",
        "resources.devices.0.container_path",
    }
    assert _task_problems(
        {"entrypoint": "true", "environment": {"registry_auth": {"username": "robot"}}}
    ) == {
        "environment.registry_auth.password": "required with a username (or give `auth`, "
        "base64 of username:password)"
    }
    # Before a template merge ("" type) the password may still come from the template.
    validate_task_config({"environment": {"registry_auth": {"username": "robot"}}}, "")
    ok = {
        "entrypoint": "true",
        "environment": {
            "image": "ubuntu:22.04",
            "registry_auth": {"username": "robot", "password": "s3cret"},
        },
    }
    assert validate_task_config(ok, "COMMAND").environment.image == "ubuntu:22.04"


def test_devices_are_said_to_apply_only_in_containers() -> None:
    devices = [{"host_path": "/dev/fuse", "container_path": "/dev/fuse"}]
    warnings = config_warnings(
        validate_config(_with("resources", {"devices": devices}), complete=True)
    )
    assert warnings == [
        "resources.devices (/dev/fuse) apply only in containers: where environment.image "
        "runs on agents started with --container-runtime podman|docker; a trial run on the "
        "host sees the host's devices as the agent's user may open them"
    ]


def test_a_value_with_a_line_break_is_said_to_end_a_containers_start() -> None:
    """Known at submit only as a warning: whether an agent runs a runtime is not."""
    environment = {
        "image": {"cuda": "team/trainer:1"},
        "environment_variables": {"cuda": ["TEAM_KEY=line one\nline two", "PLAIN=1"]},
    }
    warnings = config_warnings(validate_config(_with("environment", environment), complete=True))
    (said,) = [w for w in warnings if "line break" in w]
    assert said.startswith("environment.environment_variables TEAM_KEY: a value with a line")
    without_image = {"environment_variables": ["TEAM_KEY=line one\nline two"]}
    warnings = config_warnings(validate_config(_with("environment", without_image), complete=True))
    assert not [w for w in warnings if "line break" in w]  # processes on the host take it
