"""`det experiment create --config KEY=VALUE` (cli/config_overrides.py): what the user's
config becomes, as Determined 0.38.1's CLI makes it; and one run of our `det` against a
real master, to see the override reach the stored config."""

from __future__ import annotations

import copy
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from cli.config_overrides import (
    ConfigOverrideError,
    apply_config_overrides,
    parse_config_override,
)
from tests.e2e.conftest import MasterProcess, describe_run, running_master, unique

CONFIG: dict[str, Any] = {
    "name": "mnist",
    "entrypoint": "python3 train.py",
    "hyperparameters": {"global_batch_size": 64, "lr": 0.01},
    "resources": {"slots_per_trial": 1, "priority": 10},
    "searcher": {"name": "single", "metric": "loss", "max_length": {"batches": 10}},
    "bind_mounts": [{"host_path": "/data", "container_path": "/data"}],
}


def applied(*overrides: str, config: dict[str, Any] | None = None) -> dict[str, Any]:
    return apply_config_overrides(CONFIG if config is None else config, overrides)


# --- paths -------------------------------------------------------------------------------------


def test_dotted_path_sets_a_nested_key_and_keeps_its_siblings() -> None:
    out = applied("resources.slots_per_trial=4", "searcher.max_length.batches=100")
    assert out["resources"] == {"slots_per_trial": 4, "priority": 10}
    assert out["searcher"] == {"name": "single", "metric": "loss", "max_length": {"batches": 100}}


def test_missing_and_null_mappings_on_the_path_are_created() -> None:
    out = applied("reproducibility.experiment_seed=7", "environment.ports.tb=6006")
    assert out["reproducibility"] == {"experiment_seed": 7}
    assert out["environment"] == {"ports": {"tb": 6006}}
    out = applied("resources.slots_per_trial=2", config={"resources": None})
    assert out == {"resources": {"slots_per_trial": 2}}


def test_a_mapping_value_merges_into_the_mapping_there() -> None:
    out = applied("resources={slots_per_trial: 8, max_slots: 16}")
    assert out["resources"] == {"slots_per_trial": 8, "priority": 10, "max_slots": 16}
    out = applied("searcher={max_length: {epochs: 2}}")
    assert out["searcher"]["max_length"] == {"batches": 10, "epochs": 2}


def test_other_values_replace_what_was_there() -> None:
    out = applied("hyperparameters.lr={type: log, minval: -4, maxval: -1}")
    assert out["hyperparameters"]["lr"] == {"type": "log", "minval": -4, "maxval": -1}
    assert applied("searcher.max_length=100")["searcher"]["max_length"] == 100
    assert applied("resources=null")["resources"] is None


def test_overrides_apply_in_order_and_the_input_is_left_alone() -> None:
    original = copy.deepcopy(CONFIG)
    out = applied("resources.slots_per_trial=2", "resources.slots_per_trial=3", "name=b")
    assert (out["resources"]["slots_per_trial"], out["name"]) == (3, "b")
    assert original == CONFIG


# --- values ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("0.1", 0.1),
        ("1e-4", 0.0001),  # YAML 1.2, as Determined's client reads it (1.1 would say "1e-4")
        ("4", 4),
        ("017", 17),
        ("0o17", 15),
        ("true", True),
        ("yes", "yes"),  # a string in YAML 1.2, not a boolean
        ("null", None),
        ("", None),
        ("adam", "adam"),
        ("'0.1'", "0.1"),
        ("2024-01-01", "2024-01-01"),  # dates stay strings, as the master keeps them
        ("[64, 128]", [64, 128]),
        ("{b1: 0.9, b2: 0.999}", {"b1": 0.9, "b2": 0.999}),
    ],
)
def test_value_is_yaml(text: str, value: Any) -> None:
    assert parse_config_override(f"hyperparameters.x={text}") == (["hyperparameters", "x"], value)
    out = applied(f"hyperparameters.x={text}")["hyperparameters"]["x"]
    assert out == value and type(out) is type(value)


def test_commas_make_a_list_unless_the_value_is_bracketed() -> None:
    assert applied("labels=vision,baseline")["labels"] == ["vision", "baseline"]
    assert applied("hyperparameters.sizes=1,2.5,x")["hyperparameters"]["sizes"] == [1, 2.5, "x"]
    assert applied("data={a: 1, b: 2}")["data"] == {"a": 1, "b": 2}


def test_only_the_first_equals_sign_splits() -> None:
    out = applied("entrypoint=python3 train.py --lr=0.1")
    assert out["entrypoint"] == "python3 train.py --lr=0.1"
    out = applied("environment.environment_variables=[NCCL_DEBUG=INFO]")
    assert out["environment"]["environment_variables"] == ["NCCL_DEBUG=INFO"]


def test_bind_mounts_are_always_a_list() -> None:
    mount = {"host_path": "/a", "container_path": "/b"}
    assert applied("bind_mounts=[{host_path: /a, container_path: /b}]")["bind_mounts"] == [mount]
    assert applied("bind_mounts={host_path: /a, container_path: /b}")["bind_mounts"] == [mount]
    assert applied("bind_mounts=[]")["bind_mounts"] == []


# --- bad input ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argument", "message"),
    [
        ("resources.slots_per_trial", "expected KEY=VALUE"),
        ("=4", "the key before '=' is empty"),
        ("resources..slots_per_trial=4", "has an empty part"),
        (".name=x", "has an empty part"),
        ("name.=x", "has an empty part"),
        (
            "resources.slots_per_trial.count=4",
            "resources.slots_per_trial is a number (1), not a mapping, so it has no key 'count'",
        ),
        ("name.first=x", "name is a string ('mnist'), not a mapping, so it has no key 'first'"),
        ("bind_mounts.0.read_only=true", "bind_mounts is a list, not a mapping"),
        ("hyperparameters.lr=[1, 2", "the value is not valid YAML"),
        ("hyperparameters.lr={a: 1", "the value is not valid YAML"),
        ("name=a: b: c", "the value is not valid YAML"),
    ],
)
def test_bad_overrides_name_the_argument_and_change_nothing(argument: str, message: str) -> None:
    original = copy.deepcopy(CONFIG)
    with pytest.raises(ConfigOverrideError) as info:
        apply_config_overrides(CONFIG, ["resources.priority=1", argument])
    assert str(info.value).startswith(f"--config {argument!r}: ")
    assert message in str(info.value)
    assert original == CONFIG


def test_a_path_through_a_list_says_to_give_the_whole_list() -> None:
    with pytest.raises(ConfigOverrideError, match=r"--config 'bind_mounts=\[\.\.\.\]'"):
        applied("bind_mounts.0.read_only=true")


# --- our det against a master ------------------------------------------------------------------


@pytest.fixture(scope="module", params=[pytest.param("sqlite", id="sqlite")])
def master(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[MasterProcess]:
    with running_master(request, tmp_path_factory, "overrides") as proc:
        yield proc


EXPERIMENT = """\
name: {name}
entrypoint: python3 train.py
hyperparameters:
  global_batch_size: 64
  lr: 0.01
searcher: {{name: single, metric: loss, max_length: {{batches: 10}}}}
environment:
  image: {{cpu: determinedai/pytorch-ngc:0.38.1, cuda: determinedai/pytorch-ngc:0.38.1}}
  environment_variables: [OMP_NUM_THREADS=1]
  ports: {{"[/tb]": 6006}}
"""


def stored_names(master: MasterProcess) -> list[str]:
    return [e["name"] for e in master.api("GET", "/api/v1/experiments")["experiments"]]


@pytest.mark.e2e
def test_det_create_with_config_overrides(master: MasterProcess, tmp_path: Path) -> None:
    name = unique("overrides")
    config = tmp_path / "exp.yaml"
    config.write_text(EXPERIMENT.format(name=name), encoding="utf-8")
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "train.py").write_text("print('train')\n", encoding="utf-8")
    template = tmp_path / "tpl.yaml"
    template.write_text(
        "resources: {slots_per_trial: 1, priority: 7}\n"
        "bind_mounts: [{host_path: /tpl, container_path: /tpl}]\n",
        encoding="utf-8",
    )
    tpl = unique("tpl")
    result = master.det("tpl", "set", tpl, str(template))
    assert result.returncode == 0, describe_run(result)
    args = [
        "e",
        "create",
        str(config),
        str(tmp_path / "model"),
        "--template",
        tpl,
        "--config",
        "resources.slots_per_trial=2",
        "--config",
        "hyperparameters.lr=1e-4",
        "--config",
        "bind_mounts=[{host_path: /a, container_path: /b}]",
    ]

    # --test prints the effective config and stores nothing.
    result = master.det(*args, "--test")
    assert result.returncode == 0, describe_run(result)
    printed = yaml.safe_load(result.stdout)
    assert printed["resources"]["slots_per_trial"] == 2  # the override beat the template
    assert printed["resources"]["priority"] == 7  # the template's key is kept
    assert name not in stored_names(master)

    result = master.det(*args)
    assert result.returncode == 0, describe_run(result)
    experiment_id = int(result.stdout.strip().removeprefix("Created experiment "))
    # The Docker-only key is accepted and the user is told it does not apply.
    assert "environment.image (cpu: determinedai/pytorch-ngc:0.38.1" in result.stderr
    assert "does not apply" in result.stderr
    # The user's text is printed as it is, never read as terminal markup.
    assert "environment.ports ([/tb]: 6006) does not apply" in result.stderr
    stored = master.api("GET", f"/api/v1/experiments/{experiment_id}")["experiment"]
    assert stored["config"]["resources"]["slots_per_trial"] == 2
    assert stored["config"]["resources"]["priority"] == 7
    assert stored["config"]["hyperparameters"]["lr"] == {"type": "const", "val": 0.0001}
    assert [m["host_path"] for m in stored["config"]["bind_mounts"]] == ["/tpl", "/a"]
    assert stored["config"]["environment"]["image"]["cpu"] == "determinedai/pytorch-ngc:0.38.1"
    original = yaml.safe_load(stored["originalConfig"])
    assert original["resources"] == {"slots_per_trial": 2}
    assert original["environment"]["environment_variables"] == ["OMP_NUM_THREADS=1"]


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("argument", "message"),
    [
        ("resources.slots_per_trial", "expected KEY=VALUE"),
        ("name.first=x", "not a mapping"),
        ("hyperparameters.lr=[0.1", "not valid YAML"),
    ],
)
def test_det_create_refuses_a_bad_override(
    master: MasterProcess, tmp_path: Path, argument: str, message: str
) -> None:
    name = unique("bad-override")
    config = tmp_path / "exp.yaml"
    config.write_text(EXPERIMENT.format(name=name), encoding="utf-8")
    result: subprocess.CompletedProcess[str] = master.det(
        "e", "create", str(config), "--config", argument
    )
    assert result.returncode == 1, describe_run(result)
    assert result.stderr.startswith(f"Error: --config {argument!r}: "), describe_run(result)
    assert message in result.stderr
    assert result.stdout == ""
    assert name not in stored_names(master)
