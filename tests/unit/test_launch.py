"""The pure launch core: rank layout across a gang and the environment every rank gets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from master.core import launch
from master.core.launch import GangMember, LaunchError, Rendezvous, TrialInfo
from master.settings import MasterSettings

CONFIG = {
    "entrypoint": "python3 train.py --epochs 2",
    "resources": {"slots_per_trial": 4},
    "environment": {
        "environment_variables": ["MY_FLAG=1", "RANK=7", "MASTER_PORT=1", "NCCL_DEBUG=INFO"]
    },
}
TRIAL = TrialInfo(
    experiment_id=3,
    trial_id=9,
    run_id=2,
    task_id="3.abc",
    allocation_id="9.2",
    seed=1234,
    hparams={"global_batch_size": 64, "lr": 0.1},
    config=CONFIG,
    user="determined",
    session_token="tok",
)
RENDEZVOUS = Rendezvous(interface="fast0", chief_address="198.19.0.1", master_port=29500)


def launches(
    members: list[GangMember], config: dict[str, object] = CONFIG
) -> list[launch.AgentLaunch]:
    trial = TrialInfo(**{**TRIAL.__dict__, "config": config})
    return launch.build_launches(
        members,
        trial,
        RENDEZVOUS,
        master_url="http://198.18.0.1:8080",
        cluster_id="cluster",
        master_id="master",
        device_type="cpu",
    )


def test_ranks_are_numbered_agent_by_agent_in_id_order_with_the_chief_first() -> None:
    out = launches([GangMember("b", (3, 1)), GangMember("a", (0, 1))])
    assert [x.agent_id for x in out] == ["a", "b"]
    assert [(r.rank, r.local_rank, r.slot_ids) for r in out[0].ranks] == [
        (0, 0, (0,)),
        (1, 1, (1,)),
    ]
    assert [(r.rank, r.local_rank, r.slot_ids) for r in out[1].ranks] == [
        (2, 0, (1,)),
        (3, 1, (3,)),
    ]
    assert [x.env["GROUP_RANK"] for x in out] == ["0", "1"]
    assert {x.env["WORLD_SIZE"] for x in out} == {"4"}
    assert {x.env["GROUP_WORLD_SIZE"] for x in out} == {"2"}


def test_a_zero_slot_task_runs_one_rank() -> None:
    (only,) = launches([GangMember("a", ())])
    assert [(r.rank, r.slot_ids) for r in only.ranks] == [(0, ())]
    assert only.env["WORLD_SIZE"] == "1"


def test_every_rank_learns_the_rendezvous_the_trial_and_the_master() -> None:
    env = launches([GangMember("a", (0, 1)), GangMember("b", (0, 1))])[1].env
    assert env["MASTER_ADDR"] == env["DET_CHIEF_IP"] == "198.19.0.1"
    assert env["MASTER_PORT"] == "29500"
    assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == "fast0"
    assert env["DET_INTER_NODE_NETWORK_INTERFACE"] == "fast0"
    assert env["DET_MASTER"] == "http://198.18.0.1:8080"
    assert (env["DET_MASTER_HOST"], env["DET_MASTER_PORT"]) == ("198.18.0.1", "8080")
    assert env["DET_TRIAL_ID"] == "9" and env["DET_EXPERIMENT_ID"] == "3"
    assert env["DET_TRIAL_RUN_ID"] == "2" and env["DET_TRIAL_SEED"] == "1234"
    assert json.loads(env["DET_HPARAMS"]) == {"global_batch_size": 64, "lr": 0.1}
    assert json.loads(env["DET_EXPERIMENT_CONFIG"]) == CONFIG
    assert env["DET_SESSION_TOKEN"] == "tok" and env["DET_USER"] == "determined"
    assert env["DET_GLOBAL_BATCH_SIZE"] == "64" and env["DET_PER_SLOT_BATCH_SIZE"] == "16"


def test_config_variables_reach_ranks_but_cannot_break_the_rendezvous() -> None:
    env = launches([GangMember("a", (0,))])[0].env
    assert env["MY_FLAG"] == "1" and env["NCCL_DEBUG"] == "INFO"
    assert "RANK" not in env  # the agent sets it per rank; the config's 7 is dropped
    assert env["MASTER_PORT"] == "29500"


def test_a_user_chosen_socket_interface_wins() -> None:
    config = {**CONFIG, "environment": {"environment_variables": ["NCCL_SOCKET_IFNAME=ib0"]}}
    env = launches([GangMember("a", (0,))], config)[0].env
    assert env["NCCL_SOCKET_IFNAME"] == "ib0"
    assert env["GLOO_SOCKET_IFNAME"] == "fast0"


def test_per_device_variables_are_picked_for_the_slot_type() -> None:
    config = {
        **CONFIG,
        "environment": {"environment_variables": {"cpu": ["ON_CPU=1"], "cuda": ["ON_GPU=1"]}},
    }
    env = launches([GangMember("a", (0,))], config)[0].env
    assert env.get("ON_CPU") == "1" and "ON_GPU" not in env


@pytest.mark.parametrize(
    ("entrypoint", "argv"),
    [
        ("python3 train.py --lr '0.1 0.2'", ["python3", "train.py", "--lr", "0.1 0.2"]),
        (["python3", "-m", "pkg.train"], ["python3", "-m", "pkg.train"]),
    ],
)
def test_entrypoints_become_argv(entrypoint: object, argv: list[str]) -> None:
    assert launch.entrypoint_argv({"entrypoint": entrypoint}) == argv


@pytest.mark.parametrize(
    ("entrypoint", "message"),
    [
        ("model_def:MyTrial", "names a Trial class"),
        (None, "names no command"),
        ("   ", "names no command"),
        ("python3 'unclosed", "cannot be split"),
    ],
)
def test_entrypoints_that_cannot_run_are_refused_with_a_reason(
    entrypoint: object, message: str
) -> None:
    with pytest.raises(LaunchError, match=message):
        launch.entrypoint_argv({"entrypoint": entrypoint})


def test_the_example_deploy_config_is_valid(monkeypatch: pytest.MonkeyPatch) -> None:
    path = Path(__file__).resolve().parents[2] / "deploy" / "master.yaml"
    monkeypatch.setenv("DET_MASTER_CONFIG_FILE", str(path))
    settings = MasterSettings()
    assert settings.agent_link.port == yaml.safe_load(path.read_text())["agent_link"]["port"]


@pytest.mark.parametrize(
    ("url", "host", "port"),
    [
        ("https://master.example", "master.example", "443"),
        ("http://[fd00::1]:8080", "fd00::1", "8080"),
        ("http://10.0.0.1", "10.0.0.1", "80"),
    ],
)
def test_the_master_address_is_parsed_from_any_url(url: str, host: str, port: str) -> None:
    env = launch.build_launches(
        [GangMember("a", (0,))],
        TRIAL,
        RENDEZVOUS,
        master_url=url,
        cluster_id="c",
        master_id="m",
        device_type="cpu",
    )[0].env
    assert (env["DET_MASTER_HOST"], env["DET_MASTER_PORT"]) == (host, port)


DETERMINISTIC = {
    "PYTHONHASHSEED": "0",
    "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
    "NCCL_ALGO": "Ring",
    "NCCL_LAUNCH_MODE": "GROUP",
}


def test_deterministic_runs_get_the_variables_that_must_be_set_before_start() -> None:
    config: dict[str, object] = {
        **CONFIG,
        "reproducibility": {"deterministic": True, "experiment_seed": 1},
    }
    for env in (x.env for x in launches([GangMember("a", (0,)), GangMember("b", (0,))], config)):
        assert {k: env.get(k) for k in DETERMINISTIC} == DETERMINISTIC


@pytest.mark.parametrize("reproducibility", [None, {}, {"deterministic": False}])
def test_other_runs_get_none_of_them(reproducibility: object) -> None:
    config: dict[str, object] = {**CONFIG, "reproducibility": reproducibility}
    env = launches([GangMember("a", (0,))], config)[0].env
    assert not DETERMINISTIC.keys() & env.keys()


def test_the_users_own_variables_win_over_the_deterministic_ones() -> None:
    config: dict[str, object] = {
        **CONFIG,
        "reproducibility": {"deterministic": True},
        "environment": {"environment_variables": ["PYTHONHASHSEED=42", "NCCL_ALGO=Tree"]},
    }
    env = launches([GangMember("a", (0,))], config)[0].env
    assert (env["PYTHONHASHSEED"], env["NCCL_ALGO"]) == ("42", "Tree")
    assert env["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8" and env["NCCL_LAUNCH_MODE"] == "GROUP"


def test_a_fresh_run_names_no_checkpoint() -> None:
    for env in (x.env for x in launches([GangMember("a", (0,)), GangMember("b", (0,))])):
        assert "DET_LATEST_CHECKPOINT" not in env
        assert env["DET_STEPS_COMPLETED"] == "0"


def test_a_resumed_run_names_its_checkpoint_and_steps_on_every_agent() -> None:
    trial = TrialInfo(
        **{**TRIAL.__dict__, "latest_checkpoint": "0f5e3a1c-uuid", "steps_completed": 40}
    )
    out = launch.build_launches(
        [GangMember("a", (0,)), GangMember("b", (0,))],
        trial,
        RENDEZVOUS,
        master_url="http://198.18.0.1:8080",
        cluster_id="cluster",
        master_id="master",
        device_type="cpu",
    )
    for env in (x.env for x in out):
        assert env["DET_LATEST_CHECKPOINT"] == "0f5e3a1c-uuid"
        assert env["DET_STEPS_COMPLETED"] == "40"
