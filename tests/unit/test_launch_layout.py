"""Which launch layout an experiment gets, and what a per-agent (Determined) launch is given:
its environment and the /run/determined/info files Determined 0.38.1's harness reads."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from agent import bootstrap
from master.core import launch
from master.core.launch import PER_AGENT, PER_SLOT, GangMember, Rendezvous, TrialInfo
from tests.conftest import require

DET_SCRIPT = "import determined as det\n\nwith det.core.init() as core_context:\n    pass\n"
RESOLUTE_SCRIPT = "import resolute\n\nresolute.init()\n"
TORCH_SCRIPT = "import torch.distributed as dist\n\ndist.init_process_group('gloo')\n"


@pytest.mark.parametrize(
    ("entrypoint", "source", "layout", "reason"),
    [
        # Determined's Core API tutorial shapes.
        ("python3 1_metrics.py", DET_SCRIPT, PER_AGENT, "1_metrics.py imports determined"),
        (
            "python3 4_distributed.py launcher",
            DET_SCRIPT,
            PER_AGENT,
            "4_distributed.py imports determined",
        ),
        # A Determined launcher wins even over a script that never imports determined.
        (
            "python3 -m determined.launch.torch_distributed python3 train.py --epochs 1",
            TORCH_SCRIPT,
            PER_AGENT,
            "launcher determined.launch.torch_distributed",
        ),
        (
            "python3 -m determined.launch.deepspeed --trial model_def:MyTrial",
            None,
            PER_AGENT,
            "launcher determined.launch.deepspeed",
        ),
        ("python3 train.py", RESOLUTE_SCRIPT, PER_SLOT, "train.py does not import determined"),
        (
            "python3 train.py",
            "from determined.experimental import client\n",
            PER_AGENT,
            "train.py imports determined",
        ),
        (["python3", "train.py", "--lr", "0.1"], DET_SCRIPT, PER_AGENT, "train.py imports"),
        ("./train.py", DET_SCRIPT, PER_AGENT, "train.py imports determined"),
        ("python3 -m mypkg.train", DET_SCRIPT, PER_AGENT, "mypkg/train.py imports determined"),
        ("python3 train.py", None, PER_SLOT, "train.py is not in the model definition"),
        ("sh run.sh", None, PER_SLOT, "names no Python script"),
    ],
)
def test_the_layout_follows_the_entrypoint_and_its_script(
    entrypoint: object, source: str | None, layout: str, reason: str
) -> None:
    choice = launch.choose_layout({"entrypoint": entrypoint}, source)
    assert (choice.layout, reason in choice.reason) == (layout, True), choice.reason


@pytest.mark.parametrize(
    ("explicit", "entrypoint", "source"),
    [
        (PER_SLOT, "python3 -m determined.launch.torch_distributed python3 train.py", None),
        (PER_SLOT, "python3 train.py", DET_SCRIPT),
        (PER_AGENT, "python3 train.py", RESOLUTE_SCRIPT),
        (PER_AGENT, None, None),  # wins before the entrypoint is even read
    ],
)
def test_an_explicit_launch_layout_wins_over_everything(
    explicit: str, entrypoint: object, source: str | None
) -> None:
    choice = launch.choose_layout({"launch_layout": explicit, "entrypoint": entrypoint}, source)
    assert choice.layout == explicit
    assert "launch_layout" in choice.reason


def test_auto_decides_as_if_nothing_was_set() -> None:
    config = {"launch_layout": "auto", "entrypoint": "python3 train.py"}
    assert launch.choose_layout(config, DET_SCRIPT).layout == PER_AGENT
    assert launch.choose_layout(config, RESOLUTE_SCRIPT).layout == PER_SLOT


@pytest.mark.parametrize(
    ("source", "imports"),
    [
        ("import determined as det\n", True),
        ("from determined.experimental import client\n", True),
        ("import os, determined.core\n", True),
        ("def main():\n    import determined\n", True),  # at any depth
        ('"""A port of a script that did `import determined as det`."""\nimport torch\n', False),
        ("# import determined as det\nimport torch\n", False),
        ("import determined_ext\nfrom .determined import x\n", False),
        # Not Python 3: the line match decides.
        ("print 'old'\nimport determined as det\n", True),
        ("print 'old'\nimport torch\n", False),
    ],
)
def test_what_counts_as_importing_determined(source: str, imports: bool) -> None:
    assert launch.imports_determined(source) is imports


@pytest.mark.parametrize(
    ("argv", "script"),
    [
        (["python3", "-u", "train.py", "--config", "other.py"], "train.py"),
        (["./train.py"], "train.py"),
        (["python3", "-m", "mypkg.train"], "mypkg/train.py"),
        (["python3", "-m", "determined.launch.torch_distributed", "python3", "t.py"], "t.py"),
        (
            ["python3", "-m", "determined.launch.torch_distributed", "--", "python3", "-m", "p.m"],
            "p/m.py",
        ),
        (["python3", "-m", "determined.launch.deepspeed", "--trial", "model_def:T"], None),
        (["bash", "run.sh"], None),
    ],
)
def test_the_entry_script_is_found_past_any_launcher(argv: list[str], script: str | None) -> None:
    assert launch.entry_script(argv) == script


def test_the_summaries_say_how_many_processes_run() -> None:
    assert "once per agent" in launch.layout_summary(PER_AGENT)
    assert "once per slot" in launch.layout_summary(PER_SLOT)


@pytest.mark.parametrize(
    ("storage", "host_path"),
    [
        ({"type": "shared_fs", "host_path": "/mnt/checkpoints"}, "/mnt/checkpoints"),
        ({"type": "s3", "bucket": "b"}, ""),
        (None, ""),
    ],
)
def test_the_shared_fs_host_path_is_what_determined_mounts(
    storage: dict[str, str] | None, host_path: str
) -> None:
    assert launch.shared_fs_host_path({"checkpoint_storage": storage}) == host_path


# -- per_agent launches ------------------------------------------------------------------------

# The exact parameters of Determined 0.38.1's constructors (determined/_info.py), which the
# harness calls as cls(**json.load(f)): a missing or an extra key is a TypeError there.
CLUSTER_KEYS = {
    "master_url",
    "cluster_id",
    "agent_id",
    "slot_ids",
    "task_id",
    "allocation_id",
    "session_token",
    "task_type",
    "master_cert_name",
    "master_cert_file",
    "latest_checkpoint",
}
TRIAL_KEYS = {
    "trial_id",
    "experiment_id",
    "trial_seed",
    "hparams",
    "config",
    "steps_completed",
    "trial_run_id",
    "debug",
    "inter_node_network_interface",
}
RENDEZVOUS_KEYS = {"container_addrs", "container_rank", "container_slot_counts"}

CONFIG: dict[str, Any] = {
    "entrypoint": "python3 -m determined.launch.torch_distributed python3 train.py",
    "resources": {"slots_per_trial": 4},
    "environment": {"environment_variables": ["RANK=7", "WORLD_SIZE=9", "MY_FLAG=1"]},
}
TRIAL = TrialInfo(
    experiment_id=3,
    trial_id=9,
    run_id=2,
    task_id="3.abc",
    allocation_id="3.abc.2",
    seed=1234,
    hparams={"global_batch_size": 64, "lr": 0.1},
    config=CONFIG,
    user="determined",
    session_token="tok",
)
RENDEZVOUS = Rendezvous(
    interface="fast0",
    chief_address="198.19.0.1",
    master_port=29400,
    addresses=("198.19.0.1", "198.19.0.2"),  # gang order: agent a (the chief), then b
    comm_ports=(12360, 12365),
)
# Given out of order: the gang orders agents by id and slots ascending.
GANG = [GangMember("b", (3, 1)), GangMember("a", (0, 1))]


def build(
    layout: str,
    trial: TrialInfo = TRIAL,
    rendezvous: Rendezvous = RENDEZVOUS,
    members: list[GangMember] = GANG,
) -> list[launch.AgentLaunch]:
    return launch.build_launches(
        members,
        trial,
        rendezvous,
        master_url="http://198.18.0.1:8080",
        cluster_id="cluster",
        master_id="master",
        device_type="cpu",
        layout=layout,
    )


def info(agent: launch.AgentLaunch) -> dict[str, dict[str, Any]]:
    return {name.removesuffix(".json"): json.loads(text) for name, text in agent.info_files.items()}


def test_per_agent_runs_one_process_per_agent_with_all_its_slots() -> None:
    out = build(PER_AGENT)
    assert [a.agent_id for a in out] == ["a", "b"]
    assert [[(r.rank, r.slot_ids) for r in a.ranks] for a in out] == [
        [(0, (0, 1))],
        [(1, (1, 3))],
    ]


def test_per_agent_leaves_ranks_to_the_launcher_and_gives_it_the_ports() -> None:
    a, b = build(PER_AGENT)
    assert a.env == b.env  # what differs between agents is in the info files
    env = a.env
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT"):
        assert name not in env, name  # the config's RANK=7 and WORLD_SIZE=9 included
    assert env["C10D_PORT"] == "29400"
    assert env["INTER_TRAIN_PROCESS_COMM_PORT_1"] == "12360"
    assert env["INTER_TRAIN_PROCESS_COMM_PORT_2"] == "12365"
    assert env["DET_CHIEF_IP"] == "198.19.0.1" and env["MY_FLAG"] == "1"
    assert "DET_LATEST_CHECKPOINT" not in env


def test_the_info_files_have_exactly_the_keys_determineds_classes_take() -> None:
    for agent in build(PER_AGENT):
        assert set(agent.info_files) == {"cluster.json", "trial.json", "rendezvous.json"}
        files = info(agent)
        assert set(files["cluster"]) == CLUSTER_KEYS
        assert set(files["trial"]) == TRIAL_KEYS
        assert set(files["rendezvous"]) == RENDEZVOUS_KEYS


def test_each_agent_learns_its_place_in_the_gang_with_the_chief_first() -> None:
    a, b = (info(x) for x in build(PER_AGENT))
    for files in (a, b):
        assert files["rendezvous"]["container_addrs"] == ["198.19.0.1", "198.19.0.2"]
        assert files["rendezvous"]["container_slot_counts"] == [2, 2]
    assert [x["rendezvous"]["container_rank"] for x in (a, b)] == [0, 1]
    assert [x["cluster"]["agent_id"] for x in (a, b)] == ["a", "b"]
    assert [x["cluster"]["slot_ids"] for x in (a, b)] == [[0, 1], [1, 3]]
    cluster, trial = a["cluster"], a["trial"]
    assert cluster["master_url"] == "http://198.18.0.1:8080"
    assert (cluster["task_id"], cluster["allocation_id"]) == ("3.abc", "3.abc.2")
    assert (cluster["task_type"], cluster["session_token"]) == ("TRIAL", "tok")
    assert cluster["latest_checkpoint"] is None
    assert (trial["trial_id"], trial["experiment_id"], trial["trial_run_id"]) == (9, 3, 2)
    assert (trial["trial_seed"], trial["hparams"]) == (1234, TRIAL.hparams)
    assert trial["config"] == CONFIG and trial["inter_node_network_interface"] == "fast0"


def test_a_single_agent_rendezvous_names_its_own_address() -> None:
    alone = Rendezvous(interface="lo", chief_address="127.0.0.1", master_port=29400)
    (only,) = build(PER_AGENT, rendezvous=alone, members=[GangMember("a", (0,))])
    assert info(only)["rendezvous"] == {
        "container_addrs": ["127.0.0.1"],
        "container_rank": 0,
        "container_slot_counts": [1],
    }


def test_a_resumed_per_agent_run_names_its_checkpoint_in_env_and_files() -> None:
    resumed = TrialInfo(**{**TRIAL.__dict__, "latest_checkpoint": "ck-uuid", "steps_completed": 40})
    for agent in build(PER_AGENT, trial=resumed):
        assert agent.env["DET_LATEST_CHECKPOINT"] == "ck-uuid"
        assert info(agent)["cluster"]["latest_checkpoint"] == "ck-uuid"
        assert info(agent)["trial"]["steps_completed"] == 40


def test_per_slot_is_unchanged_one_rank_per_slot_and_no_info_files() -> None:
    out = build(PER_SLOT)
    default = launch.build_launches(
        GANG,
        TRIAL,
        RENDEZVOUS,
        master_url="http://198.18.0.1:8080",
        cluster_id="cluster",
        master_id="master",
        device_type="cpu",
    )
    assert out == default
    assert [[(r.rank, r.slot_ids) for r in a.ranks] for a in out] == [
        [(0, (0,)), (1, (1,))],
        [(2, (1,)), (3, (3,))],
    ]
    assert {a.env["WORLD_SIZE"] for a in out} == {"4"}
    assert {a.env["MASTER_PORT"] for a in out} == {"29400"}
    assert all(not a.info_files and "C10D_PORT" not in a.env for a in out)


# -- read back by Determined itself -----------------------------------------------------------

LOAD_WITH_DETERMINED = """
import json, sys
from determined import _info

d = sys.argv[1]
cluster = _info.ClusterInfo._from_file(d + "/cluster.json")
# _from_file reads the other three from /run/determined/info; read ours from d instead.
cluster._trial_info = _info.TrialInfo._from_file(d + "/trial.json")
cluster._rendezvous_info = _info.RendezvousInfo._from_file(d + "/rendezvous.json")
cluster._resources_info = _info.ResourcesInfo._from_file(d + "/resources.json")
print(json.dumps({
    "master_url": cluster.master_url,
    "agent_id": cluster.agent_id,
    "slot_ids": cluster.slot_ids,
    "latest_checkpoint": cluster.latest_checkpoint,
    "trial_id": cluster.trial.trial_id,
    "hparams": cluster.trial.hparams,
    "container_addrs": cluster.container_addrs,
    "container_rank": cluster.container_rank,
    "container_slot_counts": cluster.container_slot_counts,
    "gpu_uuids": cluster.gpu_uuids,
}))
"""


def trial_venv_python() -> str:
    venv = os.environ.get("DET_TRIAL_VENV", "")
    python = Path(venv) / "bin" / "python"
    require(
        bool(venv) and python.exists(),
        f"DET_TRIAL_VENV ({venv or 'unset'}) names no venv with bin/python and Determined 0.38.1",
    )
    return str(python)


def test_determineds_own_classes_load_the_info_files(tmp_path: Path) -> None:
    python = trial_venv_python()
    resumed = TrialInfo(**{**TRIAL.__dict__, "latest_checkpoint": "ck-uuid"})
    seen = []
    for agent in build(PER_AGENT, trial=resumed):
        run_dir = tmp_path / agent.agent_id
        bootstrap.write_info(run_dir, agent.info_files, ["GPU-1", "GPU-2"])
        loaded = subprocess.run(
            [python, "-c", LOAD_WITH_DETERMINED, str(run_dir / "info")],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert loaded.returncode == 0, loaded.stderr
        seen.append(json.loads(loaded.stdout))
    assert [(s["agent_id"], s["slot_ids"], s["container_rank"]) for s in seen] == [
        ("a", [0, 1], 0),
        ("b", [1, 3], 1),
    ]
    for s in seen:
        assert s["master_url"] == "http://198.18.0.1:8080"
        assert (s["latest_checkpoint"], s["trial_id"]) == ("ck-uuid", 9)
        assert s["hparams"] == TRIAL.hparams and s["gpu_uuids"] == ["GPU-1", "GPU-2"]
        assert s["container_addrs"] == ["198.19.0.1", "198.19.0.2"]
        assert s["container_slot_counts"] == [2, 2]
