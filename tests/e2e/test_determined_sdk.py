"""Determined's Python SDK (`determined.experimental.client` 0.38.1, unchanged) against our
master and agent: log in, create an experiment whose trial trains with our `resolute`
library, wait for it, then read back its trials, metrics, code and best checkpoint, and
download that checkpoint from shared_fs storage, as a user's notebook would."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.cluster import AgentProcess
from tests.conftest import require
from tests.e2e.agents import trial_logs
from tests.e2e.conftest import BACKENDS, MasterProcess, official_client_path, running_master

pytestmark = [pytest.mark.e2e, pytest.mark.official_client]

SDK_TIMEOUT_S = 240

# Validation losses by step: the best (smallest) checkpoint is neither the first nor the last.
VALIDATION_LOSS = {10: 0.5, 20: 0.125, 30: 0.25}
# Another metric, whose best (largest) is at step 10: top_checkpoint(sort_by="accuracy").
ACCURACY = {10: 0.875, 20: 0.5, 30: 0.75}

TRAIN_SCRIPT = f"""
import json
import resolute

VALIDATION_LOSS = {VALIDATION_LOSS!r}
ACCURACY = {ACCURACY!r}

with resolute.init() as ctx:
    for step in range(1, 31):
        ctx.train.report_training_metrics(steps_completed=step, metrics={{"loss": 1.0 / step}})
        if step in VALIDATION_LOSS:
            metrics = {{"validation_loss": VALIDATION_LOSS[step], "accuracy": ACCURACY[step]}}
            ctx.train.report_validation_metrics(steps_completed=step, metrics=metrics)
            with ctx.checkpoint.store_path(step, {{"lr": ctx.hparams["lr"]}}) as (path, uuid):
                (path / "state.json").write_text(json.dumps({{"step": step}}))
                (path / "weights").mkdir()
                (path / "weights" / "w.bin").write_bytes(bytes([step]) * 64)
            print(f"CHECKPOINT {{uuid}} step={{step}}", flush=True)
"""

# Runs in the official client's venv; prints one RESULT line of JSON for the test to read.
SDK_SCRIPT = """
import base64, json, sys, tarfile, warnings
from pathlib import Path

from determined.experimental import client

master, config, model_dir, out = sys.argv[1:]
warnings.simplefilter("ignore", FutureWarning)  # top_checkpoint() is deprecated, not gone

client.login(master=master, user="determined", password="")
exp = client.create_experiment(config=config, model_dir=model_dir)
state = exp.wait(interval=0.5)
trials = exp.list_trials()
top = exp.top_checkpoint()
by_accuracy = exp.top_checkpoint(sort_by="accuracy", smaller_is_better=False)
downloaded = Path(top.download(str(Path(out) / "checkpoint")))
code = Path(exp.download_code(str(Path(out) / "code")))
with tarfile.open(code) as archive:
    code_files = {m.name: archive.extractfile(m).read().decode() for m in archive if m.isfile()}
result = {
    "experiment_id": exp.id,
    "state": state.value,
    "trials": [
        {"id": t.id, "state": t.state.value, "hparams": t.hparams} for t in trials
    ],
    "top": {
        "uuid": top.uuid,
        "trial_id": top.training.trial_id,
        "metadata": top.metadata,
        "validation_metrics": top.training.validation_metrics,
    },
    "top_by_accuracy": by_accuracy.uuid,
    "downloaded": str(downloaded),
    "files": {
        str(p.relative_to(downloaded)): base64.b64encode(p.read_bytes()).decode()
        for p in sorted(downloaded.rglob("*")) if p.is_file()
    },
    "validation": [
        (m.steps_completed, m.metrics) for m in trials[0].iter_metrics("validation")
    ],
    "training_steps": [m.steps_completed for m in trials[0].iter_metrics("training")],
    "code_files": code_files,
}
print("RESULT " + json.dumps(result))
"""


@pytest.fixture(autouse=True)
def _official_client_installed() -> None:
    require(
        official_client_path() is not None,
        "official det client not installed: run `make official-client`",
    )


@pytest.fixture(params=BACKENDS)
def master(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[MasterProcess]:
    with running_master(request, tmp_path_factory, "sdk") as proc:
        yield proc


@pytest.fixture
def agent(master: MasterProcess, tmp_path: Path) -> Iterator[AgentProcess]:
    proc = AgentProcess(master, "sdk-agent", tmp_path / "sdk-agent", slots=2).start()
    proc.wait_connected()
    yield proc
    proc.stop()


def run_sdk(master: MasterProcess, work: Path, *args: str) -> dict[str, Any]:
    client = official_client_path()
    assert client is not None
    script = work / "sdk_driver.py"
    script.write_text(SDK_SCRIPT, encoding="utf-8")
    # A token cache of its own, and nothing that would log in as someone else.
    env = {k: v for k, v in os.environ.items() if not k.startswith("DET_")}
    env.update(XDG_CONFIG_HOME=str(work / "xdg"), PYTHONUNBUFFERED="1")
    result = subprocess.run(
        [str(client.parent / "python"), str(script), master.url, *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=work,
        timeout=SDK_TIMEOUT_S,
        check=False,
    )
    found = re.findall(r"^RESULT (.*)$", result.stdout, re.M)
    assert result.returncode == 0 and len(found) == 1, (
        f"SDK script exit {result.returncode}\n--- stdout ---\n{result.stdout}\n"
        f"--- stderr ---\n{result.stderr}\n--- master log ---\n{master.output()}"
    )
    parsed: dict[str, Any] = json.loads(found[0])
    return parsed


def test_the_sdk_creates_waits_and_downloads_the_best_checkpoint(
    master: MasterProcess, agent: AgentProcess, tmp_path: Path
) -> None:
    model = tmp_path / "model"
    model.mkdir()
    train_py = textwrap.dedent(TRAIN_SCRIPT)
    (model / "train.py").write_text(train_py, encoding="utf-8")
    storage = tmp_path / "checkpoints"
    config = {
        "name": "sdk-e2e",
        "entrypoint": "python3 train.py",
        "hyperparameters": {"lr": 0.25},
        "searcher": {"name": "single", "metric": "validation_loss", "smaller_is_better": True},
        # All three checkpoints kept (retention would delete the best-by-accuracy one,
        # which the SDK is asked for below).
        "checkpoint_storage": {
            "type": "shared_fs",
            "host_path": str(storage),
            "save_trial_latest": 3,
        },
        "max_restarts": 0,
    }
    config_path = tmp_path / "config.yaml"
    config_path.write_text(yaml.safe_dump(config), encoding="utf-8")
    out = tmp_path / "out"

    result = run_sdk(master, tmp_path, str(config_path), str(model), str(out))

    # The experiment ran to the end, with the one trial a single searcher makes.
    assert result["state"] == "STATE_COMPLETED", master.output()
    (trial,) = result["trials"]
    assert trial["state"] == "STATE_COMPLETED"
    assert trial["hparams"] == {"lr": 0.25}

    # The top checkpoint is the one the trial wrote at its best validation (step 20).
    logs = trial_logs(master, trial["id"])
    written = {int(step): uuid for uuid, step in re.findall(r"CHECKPOINT (\S+) step=(\d+)", logs)}
    assert sorted(written) == [10, 20, 30], logs
    best_step = min(VALIDATION_LOSS, key=VALIDATION_LOSS.__getitem__)
    top = result["top"]
    assert top["uuid"] == written[best_step]
    assert top["trial_id"] == trial["id"]
    assert top["metadata"] == {"lr": 0.25, "steps_completed": best_step}
    assert top["validation_metrics"]["avgMetrics"] == {"validation_loss": 0.125, "accuracy": 0.5}
    assert result["top_by_accuracy"] == written[max(ACCURACY, key=ACCURACY.__getitem__)]

    # Downloaded from shared_fs: the files the trial wrote, plus the SDK's metadata.json.
    assert result["downloaded"] == str(out / "checkpoint")
    files = {name: base64.b64decode(data) for name, data in result["files"].items()}
    assert files == {
        "state.json": json.dumps({"step": best_step}).encode(),
        "weights/w.bin": bytes([best_step]) * 64,
        "metadata.json": json.dumps(top["metadata"], indent=2).encode(),
    }
    assert (storage / top["uuid"] / "state.json").is_file()

    # The metrics and the code, read back through the SDK.
    assert [(s, m) for s, m in result["validation"]] == [
        (step, {"validation_loss": loss, "accuracy": ACCURACY[step]})
        for step, loss in sorted(VALIDATION_LOSS.items())
    ]
    assert result["training_steps"] == list(range(1, 31))
    assert result["code_files"] == {"train.py": train_py}
