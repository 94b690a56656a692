"""Determined's official `det` 0.38.1, unchanged, against our master on SQLite and PostgreSQL."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import random
import re
import subprocess
import tarfile
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import require
from tests.e2e.conftest import (
    MasterProcess,
    client_env,
    describe_run,
    lines,
    official_client_path,
    ok,
    unique,
)
from tests.factories import EXPERIMENT_YAML, TEMPLATE_CONFIG

pytestmark = [pytest.mark.e2e, pytest.mark.official_client]

UPGRADE_HINTS = ("Consider upgrading", "Master not found")


@pytest.fixture(autouse=True)
def _official_client_installed() -> None:
    require(
        official_client_path() is not None,
        "official det client not installed: run `make official-client`",
    )


def no_version_warning(result: subprocess.CompletedProcess[str]) -> None:
    for hint in UPGRADE_HINTS:
        assert hint not in result.stderr, describe_run(result)


def test_version_matches_without_upgrade_hint(master: MasterProcess) -> None:
    for args in (("-m", master.url, "version"), ("version",)):  # -m, then DET_MASTER
        result = ok(master.official(*args))
        no_version_warning(result)
        info = yaml.safe_load(result.stdout)
        assert info["client"]["version"] == "0.38.1"
        assert info["master"]["version"] == "0.38.1", describe_run(result)
        assert info["master"]["cluster_id"] and info["master"]["master_id"]
        assert info["master_address"] == master.url


def test_template_set_list_describe_remove(master: MasterProcess, tmp_path: Path) -> None:
    name = unique("official-tpl")
    first = tmp_path / "first.yaml"
    first.write_text(yaml.safe_dump(TEMPLATE_CONFIG), encoding="utf-8")
    second_config = {**TEMPLATE_CONFIG, "resources": {"slots_per_trial": 4}}
    second = tmp_path / "second.yaml"
    second.write_text(yaml.safe_dump(second_config), encoding="utf-8")

    # First time: GET 404 -> POST. Second time: GET 200 -> PATCH with the bare config.
    for path in (first, second):
        result = ok(master.official("tpl", "set", name, str(path)))
        assert lines(result.stdout) == [f"Set template {name}"], describe_run(result)
        no_version_warning(result)

    listed = ok(master.official("tpl", "list"))
    rows = [line.split("|") for line in lines(listed.stdout)]
    assert [c.strip() for c in rows[0]] == ["Name", "Workspace"], describe_run(listed)
    assert [name, "Uncategorized"] in [[c.strip() for c in row] for row in rows], listed.stdout

    detailed = ok(master.official("tpl", "list", "-d"))
    assert "Config" in detailed.stdout and name in detailed.stdout, describe_run(detailed)
    assert "slots_per_trial: 4" in detailed.stdout, describe_run(detailed)
    assert "host_path: /mnt/ckpt" in detailed.stdout

    described = ok(master.official("tpl", "describe", name))
    assert yaml.safe_load(described.stdout) == second_config, describe_run(described)

    removed = ok(master.official("tpl", "remove", name))
    assert lines(removed.stdout) == [f"Removed template {name}"], describe_run(removed)
    gone = master.http("GET", f"/api/v1/templates/{name}")
    assert gone.status_code == 404, gone.text


def test_template_describe_missing(master: MasterProcess) -> None:
    result = master.official("tpl", "describe", "missing")
    assert result.returncode == 1, describe_run(result)
    assert "Traceback" not in result.stderr, describe_run(result)
    assert lines(result.stderr)[-1] == (
        "Failed to describe config template: template missing not found"
    ), describe_run(result)


def test_experiment_create_list_describe(
    master: MasterProcess, files: dict[str, Path], tmp_path: Path
) -> None:
    name = unique("official-exp")
    ok(master.official("tpl", "set", name, str(files["template"])))
    seed = random.randrange(1, 2**31 - 1)
    config_text = EXPERIMENT_YAML.replace("experiment_seed: 1234", f"experiment_seed: {seed}")
    config = tmp_path / "official.yaml"
    config.write_text(config_text, encoding="utf-8")

    created = ok(
        master.official(
            "experiment", "create", "--template", name, str(config), str(files["model_dir"])
        )
    )
    no_version_warning(created)
    # stdout also carries the \r-overwritten "Preparing files to send to master..." progress.
    found = [line for line in lines(created.stdout) if line.startswith("Created experiment ")]
    assert len(found) == 1, describe_run(created)
    assert lines(created.stdout)[-1] == found[0]
    experiment_id = int(found[0].removeprefix("Created experiment "))

    listed = ok(master.official("experiment", "list"))
    rows = [[c.strip() for c in line.split("|")] for line in lines(listed.stdout)]
    assert rows[0][:5] == ["ID", "Owner", "Name", "Parent ID", "State"], describe_run(listed)
    mine = [row for row in rows if row[0] == str(experiment_id)]
    assert len(mine) == 1, describe_run(listed)
    assert mine[0][1:3] == ["determined", "mnist-random"]
    assert mine[0][4] == "ACTIVE"

    described = ok(master.official("experiment", "describe", str(experiment_id), "--json"))
    data: list[dict[str, Any]] = json.loads(described.stdout)
    assert len(data) == 1, describe_run(described)
    experiment = data[0]["experiment"]
    assert experiment["id"] == experiment_id
    assert experiment["state"] == "STATE_ACTIVE"
    assert experiment["name"] == "mnist-random"
    assert experiment["username"] == "determined"
    assert experiment["numTrials"] == 3
    assert experiment["originalConfig"] == config_text
    merged = experiment["config"]
    assert merged["checkpoint_storage"]["host_path"] == "/mnt/ckpt"
    assert merged["resources"]["slots_per_trial"] == 2
    assert [m["container_path"] for m in merged["bind_mounts"]] == ["/usr"]
    assert merged["reproducibility"]["experiment_seed"] == seed

    # The table view walks trials and their workloads too.
    table = ok(master.official("experiment", "describe", str(experiment_id)))
    assert str(experiment_id) in table.stdout and "ACTIVE" in table.stdout, describe_run(table)
    assert "Traceback" not in table.stderr


def test_bad_config_error_is_one_readable_line(master: MasterProcess, tmp_path: Path) -> None:
    """A 400 reaches the official client's users as our message, not a JSON dump."""
    config = tmp_path / "bad.yaml"
    config.write_text(EXPERIMENT_YAML + "resources: {slots_per_trial: -1}\n", encoding="utf-8")
    before = master.api("GET", "/api/v1/experiments")["pagination"]["total"]
    result = master.official("experiment", "create", str(config))
    assert result.returncode == 1, describe_run(result)
    last = lines(result.stderr)[-1]
    assert last.startswith("Failed to create experiment: invalid config: "), describe_run(result)
    assert "resources.slots_per_trial" in last and '{"code"' not in last
    assert master.api("GET", "/api/v1/experiments")["pagination"]["total"] == before


LABELLED_YAML = """\
name: labelled
entrypoint: python3 train.py
searcher: {name: single, metric: loss, max_length: {batches: 10}}
labels: [from-config]
"""

# Runs in the official client's venv: the SDK's add_label/remove_label (PUT and DELETE of
# one label) and set_labels (a PATCH with the labels only).
SDK_LABELS_SCRIPT = """
import json, sys
from determined.experimental import client

master, experiment_id = sys.argv[1], int(sys.argv[2])
client.login(master=master, user="determined", password="")
exp = client.get_experiment(experiment_id)
exp.add_label("sdk/with slash")
after_add = sorted(exp.labels)
exp.remove_label("from-config")
after_remove = sorted(exp.labels)
exp.set_labels({"only"})
print("RESULT " + json.dumps([after_add, after_remove, sorted(exp.labels)]))
"""


def test_experiment_label_add_remove(master: MasterProcess) -> None:
    """`det experiment label add|remove`: the client reads the experiment, then PATCHes it
    with its labels changed; `describe` shows them."""
    created = master.api("POST", "/api/v1/experiments", json={"config": LABELLED_YAML})
    experiment_id = created["experiment"]["id"]

    def labels() -> list[str]:
        stored: list[str] = master.api("GET", f"/api/v1/experiments/{experiment_id}")["experiment"][
            "labels"
        ]
        return stored

    added = ok(master.official("experiment", "label", "add", str(experiment_id), "two words"))
    assert lines(added.stdout) == [f"Added label 'two words' to experiment {experiment_id}"]
    no_version_warning(added)
    assert labels() == ["from-config", "two words"]
    again = ok(master.official("e", "label", "add", str(experiment_id), "two words"))
    assert "Added label" in again.stdout and labels() == ["from-config", "two words"]

    table = ok(master.official("experiment", "describe", str(experiment_id)))
    assert "Labels" in table.stdout and "from-config, two words" in table.stdout, table.stdout

    removed = ok(
        master.official("experiment", "label", "remove", str(experiment_id), "from-config")
    )
    assert lines(removed.stdout) == [f"Removed label 'from-config' from experiment {experiment_id}"]
    assert labels() == ["two words"]
    listed = master.api("GET", "/api/v1/experiments", params={"labels": "two words"})
    assert [e["id"] for e in listed["experiments"]] == [experiment_id]

    refused = master.official("experiment", "label", "add", str(experiment_id), "x" * 256)
    assert refused.returncode == 1, describe_run(refused)
    assert "the label is 256 characters long; at most 255" in refused.stderr, describe_run(refused)
    assert "Traceback" not in refused.stderr
    assert labels() == ["two words"]


def test_experiment_set_name_and_description_config_and_list_trials(
    master: MasterProcess,
) -> None:
    """The daily verbs that read an experiment and PATCH it back, or only read it."""
    created = master.api("POST", "/api/v1/experiments", json={"config": LABELLED_YAML})
    experiment_id = str(created["experiment"]["id"])

    named = ok(master.official("experiment", "set", "name", experiment_id, "renamed"))
    assert lines(named.stdout) == [f"Set name of experiment {experiment_id} to 'renamed'"]
    described = ok(
        master.official("experiment", "set", "description", experiment_id, "a longer story")
    )
    assert "a longer story" in described.stdout
    stored = master.api("GET", f"/api/v1/experiments/{experiment_id}")["experiment"]
    assert (stored["name"], stored["description"]) == ("renamed", "a longer story")
    # The labels the client sent back with each patch are kept as they were.
    assert stored["labels"] == ["from-config"]

    config = yaml.safe_load(ok(master.official("experiment", "config", experiment_id)).stdout)
    assert config["name"] == "renamed" and config["entrypoint"] == "python3 train.py"

    trials = ok(master.official("experiment", "list-trials", experiment_id)).stdout
    trial_id = master.api("GET", f"/api/v1/experiments/{experiment_id}/trials")["trials"][0]["id"]
    assert "Trial ID" in trials and str(trial_id) in trials, trials

    refused = master.official("experiment", "set", "name", experiment_id, " ")
    assert refused.returncode == 1, describe_run(refused)
    assert "name: must not be empty" in refused.stderr, describe_run(refused)
    assert master.api("GET", f"/api/v1/experiments/{experiment_id}")["experiment"]["name"] == (
        "renamed"
    )


def test_experiment_set_resources_gc_policy_archive_and_unarchive(master: MasterProcess) -> None:
    """`det e set priority|weight|max-slots` and `set gc-policy --yes` PATCH the experiment;
    `det e archive|unarchive` take an ended one out of `det e list` and back."""
    created = master.api("POST", "/api/v1/experiments", json={"config": LABELLED_YAML})
    experiment_id = str(created["experiment"]["id"])
    for verb, value, key, shown in (
        ("priority", "9", "priority", "9"),
        ("weight", "3", "weight", "3.0"),  # the client reads a float
        ("max-slots", "4", "max_slots", "4"),
    ):
        said = ok(master.official("experiment", "set", verb, experiment_id, value))
        assert lines(said.stdout) == [f"Set `{key}` of experiment {experiment_id} to {shown}"]
        no_version_warning(said)
    policy = ("--save-experiment-best", "2", "--save-trial-best", "1", "--save-trial-latest", "0")
    ok(master.official("experiment", "set", "gc-policy", "--yes", experiment_id, *policy))
    config = master.api("GET", f"/api/v1/experiments/{experiment_id}")["experiment"]["config"]
    assert config["resources"]["priority"] == 9 and config["resources"]["weight"] == 3
    assert config["resources"]["max_slots"] == 4
    storage = config["checkpoint_storage"]
    assert (storage["save_experiment_best"], storage["save_trial_best"]) == (2, 1)
    assert storage["save_trial_latest"] == 0

    refused = master.official("experiment", "archive", experiment_id)
    assert refused.returncode == 1, describe_run(refused)
    assert "only an ended experiment can be archived" in refused.stderr, describe_run(refused)
    ok(master.official("experiment", "kill", experiment_id))
    archived = ok(master.official("experiment", "archive", experiment_id))
    assert lines(archived.stdout) == [f"Archived experiment {experiment_id}"]

    def listed_ids(*flags: str) -> list[str]:
        table = ok(master.official("experiment", "list", *flags)).stdout.splitlines()
        return [row.split("|")[0].strip() for row in table[2:] if "|" in row]

    assert experiment_id not in listed_ids()
    assert experiment_id in listed_ids("--all")
    unarchived = ok(master.official("experiment", "unarchive", experiment_id))
    assert lines(unarchived.stdout) == [f"Unarchived experiment {experiment_id}"]
    assert (
        master.api("GET", f"/api/v1/experiments/{experiment_id}")["experiment"]["archived"] is False
    )


def test_experiment_download_model_def(master: MasterProcess, tmp_path: Path) -> None:
    """`det experiment download-model-def ID`: the files the experiment was created with, as
    a .tgz."""
    model = tmp_path / "model"
    (model / "pkg").mkdir(parents=True)
    (model / "train.py").write_text("print('train')\n", encoding="utf-8")
    (model / "pkg" / "data.txt").write_text("42\n", encoding="utf-8")
    config = tmp_path / "labelled.yaml"
    config.write_text(LABELLED_YAML, encoding="utf-8")
    created = ok(master.official("experiment", "create", "--paused", str(config), str(model)))
    experiment_id = created.stdout.split("Created experiment ")[1].split()[0]
    out = tmp_path / "out"
    out.mkdir()
    ok(master.official("experiment", "download-model-def", experiment_id, "--output-dir", str(out)))
    archive = out / f"experiment_{experiment_id}_model_def.tgz"
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if m.isfile()]
        files = {m.name: tar.extractfile(m).read() for m in members}  # type: ignore[union-attr]
    assert files == {"train.py": b"print('train')\n", "pkg/data.txt": b"42\n"}


def test_master_config_and_logs(master: MasterProcess) -> None:
    """`det master config` (as admin; secrets hidden) and `det master logs --tail N`, then
    `-f`, which shows a line the master logs after it started following."""
    admin = ("-u", "admin")
    refused = master.official("master", "config")  # as `determined`, not an admin
    assert refused.returncode != 0 and "is for admins" in refused.stderr, describe_run(refused)
    # `-u admin` asks for the password (empty) on stdin.
    shown = yaml.safe_load(ok(master.official(*admin, "master", "config", input="\n")).stdout)
    assert "agent_link" in shown and "scheduler_interval_s" in shown, shown
    tail = ok(master.official(*admin, "master", "logs", "--tail", "3", input="\n")).stdout
    assert len(tail.splitlines()) == 3 and tail.count("]: ") == 3, tail
    # Ours: the same, and JSON on asking.
    refused = master.det("master", "config")
    assert refused.returncode != 0 and "is for admins" in refused.stderr, describe_run(refused)
    ours = json.loads(ok(master.det(*admin, "master", "config", "--json")).stdout)
    assert ours["agent_link"] == shown["agent_link"], ours
    assert yaml.safe_load(ok(master.det(*admin, "master", "config")).stdout) == ours
    tail = ok(master.det(*admin, "master", "logs", "--tail", "3")).stdout
    assert len(tail.splitlines()) == 3, tail
    assert all(re.match(r"^\[\S+\] \[[A-Z]+\]: ", line) for line in tail.splitlines()), tail
    env = client_env(master.url, XDG_CONFIG_HOME=str(master.scratch))
    with subprocess.Popen(
        [str(official_client_path()), *admin, "master", "logs", "-f", "--tail", "1"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    ) as follower:
        assert follower.stdin is not None and follower.stdout is not None
        follower.stdin.write("\n")  # the password
        follower.stdin.close()
        seen: queue.Queue[str] = queue.Queue()
        reader = threading.Thread(
            target=lambda: [seen.put(line) for line in follower.stdout or ()], daemon=True
        )
        reader.start()
        try:
            # The client reads the stream in 512-byte chunks: submit until the lines
            # logged after it began following have filled one and reached it.
            # Two creates seen: at most one line can come from --tail 1, so the other
            # reached the client through -f (the client starts while this one creates).
            created: set[int] = set()
            shown: set[int] = set()
            for _ in range(60):
                reply = master.api("POST", "/api/v1/experiments", json={"config": LABELLED_YAML})
                created.add(reply["experiment"]["id"])
                with contextlib.suppress(queue.Empty):
                    while True:
                        line = seen.get(timeout=0.5)
                        assert "]: " in line, line
                        said = re.search(r"\[INFO\]: \S+: created experiment (\d+) ", line)
                        if said:
                            shown.add(int(said.group(1)))
                if len(shown & created) >= 2:
                    break
            assert len(shown & created) >= 2, (sorted(shown), sorted(created))
        finally:
            follower.kill()


TWO_TRIALS_YAML = """\
name: two-trials
entrypoint: python3 train.py
hyperparameters: {lr: {type: double, minval: 0.1, maxval: 0.2}}
searcher: {name: random, metric: loss, max_trials: 2, max_length: {batches: 10}}
"""


def test_trial_kill_with_both_clients(master: MasterProcess) -> None:
    """`det trial kill ID` (Determined's and ours) ends that trial only; once every trial
    is killed, the experiment is CANCELED. No agent here: the trials are queued, so each
    ends at once (the running case stops through its agent as an experiment's kill does)."""
    created = master.api("POST", "/api/v1/experiments", json={"config": TWO_TRIALS_YAML})
    experiment_id = created["experiment"]["id"]
    path = f"/api/v1/experiments/{experiment_id}"

    def states() -> list[str]:
        return [t["state"] for t in master.api("GET", f"{path}/trials")["trials"]]

    first, second = (t["id"] for t in master.api("GET", f"{path}/trials")["trials"])
    killed = ok(master.official("trial", "kill", str(first)))
    assert lines(killed.stdout) == [f"Killed trial {first}"]
    assert states() == ["STATE_CANCELED", "STATE_QUEUED"]
    assert master.api("GET", path)["experiment"]["state"] == "STATE_ACTIVE"

    ours = ok(master.det("trial", "kill", str(second)))
    assert lines(ours.stdout) == [f"Killed trial {second}"]
    assert states() == ["STATE_CANCELED", "STATE_CANCELED"]
    assert master.api("GET", path)["experiment"]["state"] == "STATE_CANCELED"

    missing = master.det("trial", "kill", "999999")
    assert missing.returncode == 1 and "trial 999999 not found" in missing.stderr


def test_sdk_labels(master: MasterProcess, tmp_path: Path) -> None:
    client_path = official_client_path()
    assert client_path is not None
    created = master.api("POST", "/api/v1/experiments", json={"config": LABELLED_YAML})
    experiment_id = created["experiment"]["id"]
    # A token cache of its own, and nothing that would log in as someone else.
    env = {k: v for k, v in os.environ.items() if not k.startswith("DET_")}
    env.update(XDG_CONFIG_HOME=str(tmp_path / "xdg"), PYTHONUNBUFFERED="1")
    result = subprocess.run(
        [
            str(client_path.parent / "python"),
            "-c",
            SDK_LABELS_SCRIPT,
            master.url,
            str(experiment_id),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, describe_run(result)
    [line] = [line for line in lines(result.stdout) if line.startswith("RESULT ")]
    after_add, after_remove, after_set = json.loads(line.removeprefix("RESULT "))
    assert after_add == ["from-config", "sdk/with slash"]
    assert after_remove == ["sdk/with slash"]
    assert after_set == ["only"]
    stored = master.api("GET", f"/api/v1/experiments/{experiment_id}")["experiment"]
    assert stored["labels"] == ["only"]
