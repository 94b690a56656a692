"""The pure core of commands, notebooks, shells and TensorBoards: config, durations, argv."""

from __future__ import annotations

import pytest

from master.core import launch, task_config
from master.core.errors import ConfigError


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30m", 1800.0),
        ("1h30m", 5400.0),
        ("90s", 90.0),
        ("1.5h", 5400.0),
        (45, 45.0),
        ("2d", 172800.0),
    ],
)
def test_durations_read_as_determined_writes_them(text: object, seconds: float) -> None:
    assert task_config.parse_duration(text, "idle_timeout") == seconds


@pytest.mark.parametrize("text", ["soon", "30 m", "m30", "", "-5s", True, 0, "0s", "400d"])
def test_bad_durations_name_the_field(text: object) -> None:
    with pytest.raises(ConfigError, match="idle_timeout"):
        task_config.parse_duration(text, "idle_timeout")


def test_a_one_word_command_runs_through_the_shell_and_a_list_as_it_is() -> None:
    assert task_config.command_argv("echo a; echo b") == ["sh", "-c", "echo a; echo b"]
    assert task_config.command_argv(["echo hi"]) == ["sh", "-c", "echo hi"]
    assert task_config.command_argv(["echo", "-n", "x"]) == ["echo", "-n", "x"]
    assert task_config.command_argv(" ") == []


def test_every_problem_is_reported_with_its_path() -> None:
    with pytest.raises(ConfigError) as caught:
        task_config.validate_task_config(
            {"entrypoint": "x", "resources": {"slots": "two"}, "idle_timeout": "never"}, "NOTEBOOK"
        )
    paths = {p.path for p in caught.value.problems}
    assert {"resources.slots", "idle_timeout"} <= paths
    with pytest.raises(ConfigError, match="entrypoint"):
        task_config.validate_task_config({}, "COMMAND")
    with pytest.raises(ConfigError, match="notebook_idle_type"):
        task_config.validate_task_config({"notebook_idle_type": "sometimes"}, "NOTEBOOK")


def test_idle_timeout_applies_to_interactive_tasks_only_and_falls_back_to_the_pool() -> None:
    config = task_config.validate_task_config({"entrypoint": "x", "idle_timeout": "1m"}, "COMMAND")
    assert task_config.idle_timeout_s(config, "COMMAND", 600.0) is None
    assert task_config.idle_timeout_s(config, "NOTEBOOK", 600.0) == 60.0
    bare = task_config.validate_task_config({}, "SHELL")
    assert task_config.idle_timeout_s(bare, "SHELL", 600.0) == 600.0
    assert task_config.idle_timeout_s(bare, "SHELL", None) is None


def test_servers_listen_on_the_reserved_port_under_the_proxy_prefix() -> None:
    config = task_config.validate_task_config({}, "NOTEBOOK")
    argv = task_config.task_argv("NOTEBOOK", config, task_uuid="abc", port=4321)
    assert "--ServerApp.base_url=/proxy/abc/" in argv and "--ServerApp.port=4321" in argv
    shell = task_config.task_argv("SHELL", config, task_uuid="abc", port=4321)
    assert shell[-2:] == ["--port", "4321"]
    board = task_config.task_argv(
        "TENSORBOARD", config, task_uuid="abc", port=4321, experiment_ids=(3, 5)
    )
    assert board[-4:] == ["--path-prefix", "/proxy/abc", "3", "5"]
    trials = task_config.task_argv(
        "TENSORBOARD", config, task_uuid="abc", port=1, experiment_ids=(3,), trial_ids=(7, 9)
    )
    assert trials[-5:] == ["3", "--trial", "7", "--trial", "9"]


def test_descriptions_follow_determined() -> None:
    command = task_config.validate_task_config({"entrypoint": ["echo", "hi"]}, "COMMAND")
    assert task_config.describe("COMMAND", command) == "Command (echo hi)"
    config = task_config.validate_task_config({}, "TENSORBOARD")
    assert task_config.describe("TENSORBOARD", config, (1, 2)) == "TensorBoard (Experiments 1, 2)"
    assert task_config.describe("TENSORBOARD", config, (), (7,)) == "TensorBoard (Trial 7)"
    both = task_config.describe("TENSORBOARD", config, (1,), (7, 9))
    assert both == "TensorBoard (Experiment 1; Trials 7, 9)"
    named = task_config.validate_task_config({"description": "mine"}, "SHELL")
    assert task_config.describe("SHELL", named) == "mine"


def test_a_task_gets_determined_variables_all_its_slots_and_no_reserved_overrides() -> None:
    info = launch.TaskInfo(
        task_id="abc",
        task_type="COMMAND",
        allocation_id="abc.1",
        config={"environment": {"environment_variables": ["A=1", "RANK=7"]}},
        argv=("true",),
        port=4321,
        secret="s3cret",
        user="ann",
        session_token="tok",
    )
    built = launch.build_task_launch(
        launch.GangMember("agent-1", (3, 1)),
        info,
        master_url="https://master:8443",
        cluster_id="c",
        master_id="m",
        device_type="cuda",
    )
    assert built.agent_id == "agent-1"
    (rank,) = built.ranks
    assert rank.slot_ids == (1, 3)
    assert built.env["A"] == "1" and "RANK" not in built.env
    assert built.env["DET_MASTER_PORT"] == "8443" and built.env["DET_TASK_PORT"] == "4321"
    assert built.env["DET_USER"] == "ann" and built.env["RESOLUTE_TASK_SECRET"] == "s3cret"
    assert "JUPYTER_TOKEN" not in built.env


def test_a_tensorboard_takes_no_slot_unless_its_config_asks_for_some() -> None:
    """Determined's default: on `make run`'s two slots a TensorBoard must not keep a trial
    waiting (issue 28). Every other task type keeps one slot by default."""
    assert task_config.validate_task_config({}, "TENSORBOARD").resources.slots == 0
    asked = {"resources": {"slots": 2}}
    assert task_config.validate_task_config(asked, "TENSORBOARD").resources.slots == 2
    pool_only = {"resources": {"resource_pool": "gpu"}}
    assert task_config.validate_task_config(pool_only, "TENSORBOARD").resources.slots == 0
    for kind in ("NOTEBOOK", "SHELL"):
        assert task_config.validate_task_config({}, kind).resources.slots == 1
    command = {"entrypoint": "true"}
    assert task_config.validate_task_config(command, "COMMAND").resources.slots == 1
