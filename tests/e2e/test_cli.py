"""Our `det` against a real `det-master` process, on SQLite and on PostgreSQL."""

from __future__ import annotations

import csv
import io
import json
import random
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.conftest import MasterProcess, describe_run, lines, ok, run_our_det, unique
from tests.factories import EXPERIMENT_YAML, TEMPLATE_CONFIG

pytestmark = pytest.mark.e2e

SEED_LINE = "experiment_seed: 1234"


def experiment_yaml(seed: int | None = None, extra: str = "") -> str:
    """The factory config with its own experiment seed (so tests never share trials)."""
    assert SEED_LINE in EXPERIMENT_YAML
    if seed is None:
        seed = random.randrange(1, 2**31 - 1)
    return EXPERIMENT_YAML.replace(SEED_LINE, f"experiment_seed: {seed}") + extra


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def parse_json(result: subprocess.CompletedProcess[str]) -> Any:
    """`--json` output: exit 0 and stdout is one JSON document, nothing else."""
    ok(result)
    try:
        return json.loads(result.stdout)
    except json.JSONDecodeError as exc:
        raise AssertionError(f"stdout is not pure JSON ({exc})\n{describe_run(result)}") from None


def created_id(result: subprocess.CompletedProcess[str]) -> int:
    ok(result)
    out = lines(result.stdout)
    assert len(out) == 1 and out[0].startswith("Created experiment "), describe_run(result)
    number = out[0].removeprefix("Created experiment ")
    assert number.isdigit(), describe_run(result)
    return int(number)


def describe(master: MasterProcess, experiment_id: int) -> dict[str, Any]:
    """`det e describe N --json`: the experiment and its trials."""
    data = parse_json(master.det("e", "describe", str(experiment_id), "--json"))
    assert set(data) >= {"experiment", "trials"}, data
    assert data["experiment"]["id"] == experiment_id
    return data  # type: ignore[no-any-return]


def stored(master: MasterProcess, experiment_id: int) -> dict[str, Any]:
    """What the master holds for an experiment, read over HTTP (fast, not under test)."""
    experiment: dict[str, Any] = master.api("GET", f"/api/v1/experiments/{experiment_id}")[
        "experiment"
    ]
    experiment["trials"] = master.api("GET", f"/api/v1/experiments/{experiment_id}/trials")[
        "trials"
    ]
    return experiment


def experiment_ids(master: MasterProcess) -> set[int]:
    """Every stored experiment's ID, read over HTTP."""
    return {e["id"] for e in master.api("GET", "/api/v1/experiments")["experiments"]}


def listed_states(master: MasterProcess) -> dict[int, str]:
    """`det e list --all --json`: ID -> state."""
    listed = parse_json(master.det("e", "list", "--all", "--json"))
    assert isinstance(listed, list), listed
    return {e["id"]: e["state"] for e in listed}


def set_template(master: MasterProcess, name: str, path: Path) -> None:
    result = ok(master.det("tpl", "set", name, str(path)))
    assert result.stdout == f"Set template {name}\n", describe_run(result)


# --- the walkthrough ---------------------------------------------------------------------


def test_template_to_experiment_walkthrough(
    master: MasterProcess, files: dict[str, Path], tmp_path: Path
) -> None:
    name = unique("walk")
    set_template(master, name, files["template"])

    listed = parse_json(master.det("tpl", "list", "--json"))
    mine = [t for t in listed if t["name"] == name]
    assert len(mine) == 1, listed
    assert mine[0]["config"] == TEMPLATE_CONFIG

    described = ok(master.det("tpl", "describe", name))
    assert yaml.safe_load(described.stdout) == TEMPLATE_CONFIG, describe_run(described)

    # The config adds a bind mount of its own: both lists survive the merge.
    own_mount = "bind_mounts:\n- host_path: /var\n  container_path: /var\n"
    config = write(tmp_path / "walk.yaml", experiment_yaml(seed=4321, extra=own_mount))
    experiment_id = created_id(
        master.det("e", "create", "--template", name, str(config), str(files["model_dir"]))
    )

    data = describe(master, experiment_id)
    experiment, trials = data["experiment"], data["trials"]
    merged = experiment["config"]
    assert experiment["name"] == "mnist-random"
    assert experiment["state"] == "STATE_ACTIVE"
    assert experiment["templateName"] == name
    # Template keys the config does not have arrive merged...
    assert merged["checkpoint_storage"]["type"] == "shared_fs"
    assert merged["checkpoint_storage"]["host_path"] == "/mnt/ckpt"
    assert merged["checkpoint_storage"]["storage_path"] == "runs"
    assert merged["resources"]["slots_per_trial"] == 2
    assert merged["resources"]["priority"] == 10
    assert merged["environment"]["environment_variables"] == ["FROM_TEMPLATE=1"]
    mounts = {m["container_path"]: m for m in merged["bind_mounts"]}
    assert set(mounts) == {"/usr", "/var"}, merged["bind_mounts"]
    assert mounts["/usr"]["host_path"] == "/usr" and mounts["/usr"]["read_only"] is True
    # ...while the config's own keys win, and the text sent is kept verbatim.
    assert merged["name"] == "mnist-random"
    assert merged["searcher"]["name"] == "random"
    assert experiment["originalConfig"] == config.read_text(encoding="utf-8")
    # Seeds: the experiment seed from the config, one seed and one sample per trial.
    assert experiment["experimentSeed"] == 4321
    assert merged["reproducibility"]["experiment_seed"] == 4321
    assert experiment["numTrials"] == 3 and len(trials) == 3
    for trial in trials:
        assert trial["experimentId"] == experiment_id
        assert trial["state"] == "STATE_QUEUED"
        assert isinstance(trial["seed"], int) and trial["seed"] >= 0
        hp = trial["hparams"]
        assert set(hp) == {"global_batch_size", "lr", "layers"}, hp
        assert hp["global_batch_size"] == 64
        assert 0.001 <= hp["lr"] <= 0.1
        assert hp["layers"] in (1, 2, 3, 4)
    assert len({t["seed"] for t in trials}) == 3, trials

    # The human-readable describe shows the seeds, and --config the merged config.
    table = ok(master.det("e", "describe", str(experiment_id), "--config"))
    assert "4321" in table.stdout and str(trials[0]["seed"]) in table.stdout
    assert "host_path: /mnt/ckpt" in table.stdout, describe_run(table)


def test_same_experiment_seed_gives_same_trials(master: MasterProcess, tmp_path: Path) -> None:
    seed = random.randrange(1, 2**31 - 2)
    config = write(tmp_path / "seeded.yaml", experiment_yaml(seed=seed))
    first = created_id(master.det("e", "create", str(config)))
    second = created_id(master.det("e", "create", str(config)))
    assert first != second

    def plan(experiment_id: int, expected_seed: int) -> list[tuple[int, dict[str, Any]]]:
        experiment = stored(master, experiment_id)
        assert experiment["experimentSeed"] == expected_seed
        return [(t["seed"], t["hparams"]) for t in experiment["trials"]]

    first_plan = plan(first, seed)
    assert len(first_plan) == 3
    assert plan(second, seed) == first_plan

    other = write(tmp_path / "other.yaml", experiment_yaml(seed=seed + 1))
    third = created_id(master.det("e", "create", str(other)))
    assert [s for s, _ in plan(third, seed + 1)] != [s for s, _ in first_plan]


def test_create_test_mode_prints_config_and_stores_nothing(
    master: MasterProcess, files: dict[str, Path], tmp_path: Path
) -> None:
    name = unique("dry")
    set_template(master, name, files["template"])
    config = write(tmp_path / "dry.yaml", experiment_yaml(seed=777))
    before = experiment_ids(master)

    result = ok(master.det("e", "create", "--test", "--template", name, str(config)))
    effective = yaml.safe_load(result.stdout)
    assert isinstance(effective, dict), describe_run(result)
    assert effective["name"] == "mnist-random"
    assert effective["checkpoint_storage"]["host_path"] == "/mnt/ckpt"
    assert effective["resources"]["slots_per_trial"] == 2
    assert effective["reproducibility"]["experiment_seed"] == 777
    assert "Created experiment" not in result.stdout

    assert experiment_ids(master) == before


def test_pause_activate_kill(master: MasterProcess, tmp_path: Path) -> None:
    config = write(tmp_path / "life.yaml", experiment_yaml())
    experiment_id = created_id(master.det("e", "create", str(config)))
    paused_id = created_id(master.det("e", "create", "--paused", str(config)))

    states = listed_states(master)
    assert states[experiment_id] == "STATE_ACTIVE"
    assert states[paused_id] == "STATE_PAUSED"
    for verb, past, expected in (
        ("pause", "Paused", "STATE_PAUSED"),
        ("activate", "Activated", "STATE_ACTIVE"),
        ("kill", "Killed", "STATE_CANCELED"),  # no agent ran a trial: nothing to wait for
    ):
        result = ok(master.det("e", verb, str(experiment_id)))
        assert result.stdout == f"{past} experiment {experiment_id}\n", describe_run(result)
        assert listed_states(master)[experiment_id] == expected, verb
    trials = stored(master, experiment_id)["trials"]
    assert {t["state"] for t in trials} == {"STATE_CANCELED"}, trials
    assert stored(master, paused_id)["state"] == "STATE_PAUSED"


def test_editing_template_later_leaves_experiment_alone(
    master: MasterProcess, files: dict[str, Path], tmp_path: Path
) -> None:
    name = unique("edit")
    set_template(master, name, files["template"])
    config = write(tmp_path / "edit.yaml", experiment_yaml())
    experiment_id = created_id(master.det("e", "create", "--template", name, str(config)))
    original = stored(master, experiment_id)["config"]
    assert original["resources"]["slots_per_trial"] == 2

    edited = dict(TEMPLATE_CONFIG)
    edited["checkpoint_storage"] = {"type": "shared_fs", "host_path": "/elsewhere"}
    edited["resources"] = {"slots_per_trial": 8}
    set_template(master, name, write(tmp_path / "edited.yaml", yaml.safe_dump(edited)))
    assert master.api("GET", f"/api/v1/templates/{name}")["template"]["config"] == edited

    after = describe(master, experiment_id)["experiment"]["config"]
    assert after == original
    assert after["checkpoint_storage"]["host_path"] == "/mnt/ckpt"

    # A new experiment picks the edit up; removing the template keeps both intact.
    newer = created_id(master.det("e", "create", "--template", name, str(config)))
    assert stored(master, newer)["config"]["resources"]["slots_per_trial"] == 8
    removed = ok(master.det("tpl", "remove", name))
    assert removed.stdout == f"Removed template {name}\n"
    assert stored(master, experiment_id)["config"] == original
    assert stored(master, newer)["config"]["checkpoint_storage"]["host_path"] == "/elsewhere"


# --- tables at a terminal's width ---------------------------------------------------------


def test_a_narrow_listing_cuts_long_names_never_ids_or_states(
    master: MasterProcess, tmp_path: Path
) -> None:
    """At 80 columns a long name ends in an ellipsis on its one line; the ID and the state
    stay whole beside it, and --csv and --json carry the whole name."""
    name = unique("a-long-experiment-name-that-describes-the-sweep-in-far-too-many-words")
    text = experiment_yaml().replace("name: mnist-random\n", f"name: {name}\n", 1)
    config = write(tmp_path / "long.yaml", text)
    experiment_id = created_id(master.det("e", "create", "--paused", str(config)))
    state = stored(master, experiment_id)["state"].removeprefix("STATE_")
    narrow = ok(master.det("e", "list", env={"COLUMNS": "80"}))
    header, *rows = lines(narrow.stdout)
    assert header.startswith("ID") and "Name" in header, describe_run(narrow)
    # Every row is one line starting with its ID: nothing wrapped onto a line of its own.
    assert all(re.match(r"^\d+\s", row) for row in rows), describe_run(narrow)
    (row,) = [r for r in rows if r.split()[0] == str(experiment_id)]
    assert name not in row and "…" in row and name[:12] in row, row
    assert re.search(rf"\s{state}\s", row), row

    as_csv = ok(master.det("e", "list", "--csv", env={"COLUMNS": "80"}))
    table = list(csv.reader(io.StringIO(as_csv.stdout)))
    assert table[0][:4] == ["ID", "Owner", "Name", "State"], describe_run(as_csv)
    assert [r[2:4] for r in table[1:] if r[0] == str(experiment_id)] == [[name, state]]
    listed = parse_json(master.det("e", "list", "--json"))
    assert [e["name"] for e in listed if e["id"] == experiment_id] == [name]


def test_labels_add_remove_list_describe(master: MasterProcess, tmp_path: Path) -> None:
    """`det e label add|remove` as in Determined's client; labels in list (last column,
    whole in --csv and --json) and describe; `det e list --label` keeps those with all."""
    config = write(tmp_path / "labelled.yaml", experiment_yaml(extra="labels: [cfg]\n"))
    experiment_id = created_id(master.det("e", "create", "--paused", str(config)))
    other_id = created_id(master.det("e", "create", "--paused", str(config)))
    odd = unique("team/vision ..%20")  # slashes, dots and a percent travel quoted
    for label in ("second", odd):
        added = ok(master.det("e", "label", "add", str(experiment_id), label))
        assert lines(added.stdout) == [f"Added label '{label}' to experiment {experiment_id}"]
    ok(master.det("e", "label", "add", str(experiment_id), "second"))  # once only
    assert stored(master, experiment_id)["labels"] == ["cfg", "second", odd]
    removed = ok(master.det("e", "label", "remove", str(experiment_id), "cfg"))
    assert lines(removed.stdout) == [f"Removed label 'cfg' from experiment {experiment_id}"]
    assert stored(master, experiment_id)["labels"] == ["second", odd]

    as_csv = ok(master.det("e", "list", "--csv"))
    table = list(csv.reader(io.StringIO(as_csv.stdout)))
    assert table[0][-1] == "Labels", describe_run(as_csv)
    rows = {int(r[0]): r[-1] for r in table[1:]}
    assert rows[experiment_id] == f"second, {odd}" and rows[other_id] == "cfg"
    filtered = parse_json(master.det("e", "list", "--json", "--label", odd, "-l", "second"))
    assert [e["id"] for e in filtered] == [experiment_id]
    assert filtered[0]["labels"] == ["second", odd]
    table_text = ok(master.det("e", "list", "--label", "cfg")).stdout
    assert str(other_id) in table_text and f"\n{experiment_id} " not in table_text

    described = ok(master.det("e", "describe", str(experiment_id)))
    assert re.search(rf"Labels\s+second, {re.escape(odd)}", described.stdout), described.stdout

    refused = master.det("e", "label", "add", str(experiment_id), "tab\there")
    assert_one_line_error(refused, "label: the label holds a control character (U+0009)")
    refused = master.det("e", "label", "add", "999999", "x")
    assert_one_line_error(refused, "experiment 999999 not found")
    assert stored(master, experiment_id)["labels"] == ["second", odd]


def test_set_name_and_description(master: MasterProcess, tmp_path: Path) -> None:
    """`det e set name|description`, Determined's verbs; a blank name changes nothing."""
    config = write(tmp_path / "named.yaml", experiment_yaml(extra="labels: [kept]\n"))
    experiment_id = created_id(master.det("e", "create", "--paused", str(config)))
    named = ok(master.det("e", "set", "name", str(experiment_id), "second try"))
    assert lines(named.stdout) == [f"Set name of experiment {experiment_id} to 'second try'"]
    ok(master.det("e", "set", "description", str(experiment_id), "lr halved"))
    found = stored(master, experiment_id)
    assert (found["name"], found["description"], found["labels"]) == (
        "second try",
        "lr halved",
        ["kept"],
    )
    assert found["config"]["name"] == "second try"
    refused = master.det("e", "set", "name", str(experiment_id), "  ")
    assert_one_line_error(refused, "name: must not be empty")
    assert stored(master, experiment_id)["name"] == "second try"


def test_set_priority_weight_max_slots_gc_policy_and_archive(
    master: MasterProcess, tmp_path: Path
) -> None:
    """Ours: `det e set priority|weight|max-slots|gc-policy`, `det e archive|unarchive`."""
    config = write(tmp_path / "settings.yaml", experiment_yaml())
    experiment_id = created_id(master.det("e", "create", "--paused", str(config)))
    eid = str(experiment_id)
    said = ok(master.det("e", "set", "priority", eid, "12"))
    assert lines(said.stdout) == [f"Set priority to 12 of experiment {experiment_id}"]
    ok(master.det("e", "set", "weight", eid, "0.5"))
    ok(master.det("e", "set", "max-slots", eid, "2"))
    policy = ("--save-experiment-best", "1", "--save-trial-best", "0", "--save-trial-latest", "1")
    # Without --yes it shows what would go and asks, as Determined's does: "no" changes nothing.
    before = stored(master, experiment_id)["config"]["checkpoint_storage"]
    asked = master.det("e", "set", "gc-policy", eid, *policy, input="n\n")
    said = lines(asked.stdout)
    assert said[0] == "This policy deletes no checkpoints.", describe_run(asked)
    assert said[-1].endswith("[y/N]: Aborting; nothing changed."), describe_run(asked)
    assert stored(master, experiment_id)["config"]["checkpoint_storage"] == before
    ok(master.det("e", "set", "gc-policy", eid, *policy, "--yes"))
    found = stored(master, experiment_id)["config"]
    resources, storage = found["resources"], found["checkpoint_storage"]
    assert (resources["priority"], resources["weight"], resources["max_slots"]) == (12, 0.5, 2)
    assert (storage["save_experiment_best"], storage["save_trial_best"]) == (1, 0)
    assert storage["save_trial_latest"] == 1
    assert_one_line_error(
        master.det("e", "set", "priority", eid, "0"),
        "body resources.priority: Input should be greater than or equal to 1",
    )
    assert_one_line_error(
        master.det("e", "archive", eid), "only an ended experiment can be archived"
    )
    ok(master.det("e", "kill", eid))
    archived = ok(master.det("e", "archive", eid))
    assert lines(archived.stdout) == [f"Archived experiment {experiment_id}"]
    mine = [e["id"] for e in parse_json(master.det("e", "list", "--json"))]
    everyone = [e["id"] for e in parse_json(master.det("e", "list", "--all", "--json"))]
    assert experiment_id not in mine and experiment_id in everyone
    ok(master.det("e", "unarchive", eid))
    assert experiment_id in [e["id"] for e in parse_json(master.det("e", "list", "--json"))]


def test_fork_takes_the_parents_config_with_changes(master: MasterProcess, tmp_path: Path) -> None:
    """`det e fork ID --config KEY=VALUE`: a new experiment from the parent's config and
    files, recording its parent."""
    config = write(tmp_path / "parent.yaml", experiment_yaml(extra="labels: [base]\n"))
    parent_id = created_id(master.det("e", "create", "--paused", str(config)))
    forked = ok(
        master.det(
            "e",
            "fork",
            str(parent_id),
            "--paused",
            "--config",
            "name=second",
            "--config",
            "labels=[forked]",
        )
    )
    fork_id = created_id(forked)
    found = stored(master, fork_id)
    assert found["forkedFrom"] == parent_id and found["name"] == "second"
    assert found["labels"] == ["forked"] and found["state"] == "STATE_PAUSED"
    assert found["config"]["entrypoint"] == stored(master, parent_id)["config"]["entrypoint"]
    assert_one_line_error(master.det("e", "fork", "999999"), "experiment 999999 not found")


def test_continue_queues_the_killed_trials_again(master: MasterProcess, tmp_path: Path) -> None:
    """Ours: `det e continue ID` (no agent: the killed trials are queued again)."""
    config = write(tmp_path / "continued.yaml", experiment_yaml())
    experiment_id = created_id(master.det("e", "create", str(config)))
    eid = str(experiment_id)
    assert_one_line_error(
        master.det("e", "continue", eid), "only an ended experiment can be continued"
    )
    ok(master.det("e", "kill", eid))
    # The factory's config is a random search: it takes no override.
    assert_one_line_error(
        master.det("e", "continue", eid, "--config", "max_restarts=9"),
        "overrideConfig: only a single-trial experiment takes an override config",
    )
    said = ok(master.det("e", "continue", eid))
    assert lines(said.stdout) == [f"Continued experiment {experiment_id}"]
    assert stored(master, experiment_id)["state"] == "STATE_ACTIVE"
    trials = master.api("GET", f"/api/v1/experiments/{experiment_id}/trials")["trials"]
    assert trials and {t["state"] for t in trials} == {"STATE_QUEUED"}


# --- errors: exit 1, one line on stderr naming the problem, nothing on stdout -----------

BAD_YAML = "name: bad\nentrypoint: python3 train.py\nsearcher: name: single\n"
UNKNOWN_KEY = EXPERIMENT_YAML + "resources:\n  slots_per_trail: 2\n"


def assert_one_line_error(result: subprocess.CompletedProcess[str], *expected: str) -> None:
    assert result.returncode != 0, describe_run(result)
    assert result.stdout == "", describe_run(result)
    assert "Traceback" not in result.stderr, describe_run(result)
    err = result.stderr.strip().splitlines()
    assert len(err) == 1, describe_run(result)
    for text in expected:
        assert text in err[0], describe_run(result)


@pytest.mark.parametrize("case", ["unknown-template", "malformed-yaml", "unknown-key"])
def test_master_side_errors(
    master: MasterProcess, files: dict[str, Path], tmp_path: Path, case: str
) -> None:
    """Rejected by the master: the message names the problem and nothing is stored."""
    if case == "unknown-template":
        missing = unique("no-such-tpl")
        args, expected = ["--template", missing, str(files["config"])], [missing, "not found"]
    elif case == "malformed-yaml":
        args, expected = [str(write(tmp_path / "bad.yaml", BAD_YAML))], ["line 3"]
    else:
        args = [str(write(tmp_path / "unknown.yaml", UNKNOWN_KEY))]
        expected = ["resources.slots_per_trail"]
    before = experiment_ids(master)
    assert_one_line_error(master.det("e", "create", *args), *expected)
    assert experiment_ids(master) == before


@pytest.mark.parametrize(
    "case", ["model-dir-is-file", "symlink-outside", "missing-config", "unreachable-master"]
)
def test_client_side_errors(files: dict[str, Path], tmp_path: Path, case: str) -> None:
    """Caught before any request: nothing listens at the master address given."""
    nowhere = "http://127.0.0.1:1"
    config = str(files["config"])
    if case == "model-dir-is-file":
        args, expected = ["e", "create", config, config], ["must be a directory"]
    elif case == "symlink-outside":
        model = files["model_dir"]
        (model / "secret.txt").symlink_to(write(tmp_path / "outside.txt", "secret\n"))
        args, expected = ["e", "create", config, str(model)], ["secret.txt", "outside"]
    elif case == "missing-config":
        args, expected = ["e", "create", str(tmp_path / "nope.yaml")], ["nope.yaml"]
    else:
        args, expected = ["e", "list", "--json"], ["127.0.0.1:1"]
    assert_one_line_error(run_our_det(nowhere, *args, cwd=tmp_path), *expected)
    # The -m option wins over DET_MASTER, as in Determined's client.
    if case == "unreachable-master":
        result = run_our_det("http://127.0.0.1:9", "-m", nowhere, "tpl", "list", cwd=tmp_path)
        assert_one_line_error(result, "127.0.0.1:1")


# --- det-master migrate ------------------------------------------------------------------


def test_migrate_is_idempotent(tmp_path: Path) -> None:
    data_dir = tmp_path / "fresh"
    db_url = f"sqlite:///{data_dir / 'migrated.db'}"
    command = [
        str(Path(sys.executable).parent / "det-master"),
        "migrate",
        "--db-url",
        db_url,
        "--data-dir",
        str(data_dir),
    ]
    for attempt in (1, 2):
        result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
        assert result.returncode == 0, f"attempt {attempt}\n{describe_run(result)}"
        assert "database is at the newest schema" in result.stdout, describe_run(result)
    assert (data_dir / "migrated.db").is_file()
