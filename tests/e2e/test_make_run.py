"""`make run`'s cluster as a newcomer gets it: scripts/local-cluster.sh started from a
directory of its own with its relative DATA_DIR, and a Determined per_agent trial
(determined.launch.torch_distributed) submitted to it with Determined's official client
(issue 28: the agent handed its relative work dir to mount(8), and the trial died)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml

from harness.cluster import Process, free_port, wait_until
from tests.conftest import require
from tests.e2e.conftest import client_env, describe_run, official_client_path
from tests.e2e.test_determined_workloads import WORKLOADS, trial_venv

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
TRIAL_TIMEOUT_S = 240.0
ENDED = ("STATE_COMPLETED", "STATE_ERROR", "STATE_CANCELED")


def test_a_determined_per_agent_trial_completes_on_the_make_run_cluster(tmp_path: Path) -> None:
    venv = trial_venv()
    official = official_client_path()
    require(official is not None, "official det client not installed: run `make official-client`")
    assert official is not None
    port, agent_port = free_port(), free_port()
    cluster = Process(
        ["bash", str(ROOT / "scripts" / "local-cluster.sh")],
        tmp_path / "cluster.log",
        {
            "BIN": str(Path(sys.executable).parent),
            "PORT": str(port),
            "AGENT_PORT": str(agent_port),
            "DATA_DIR": "data",  # relative, as `make run` passes it
        },
        cwd=tmp_path,
    )
    model = tmp_path / "model"
    model.mkdir()
    (model / "torch_distributed.py").write_bytes((WORKLOADS / "torch_distributed.py").read_bytes())
    config = yaml.safe_load((WORKLOADS / "torch_distributed.yaml").read_text())
    config["resources"]["slots_per_trial"] = 2  # the agent's artificial slots: one per core
    config["environment"] = {
        "environment_variables": [f"PATH={venv}/bin:/usr/local/bin:/usr/bin:/bin"]
    }
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(config))
    url = f"http://127.0.0.1:{port}"
    cluster.launch()
    try:
        with httpx.Client(base_url=url, timeout=10) as http:

            def answers() -> bool:
                cluster.check_running("scripts/local-cluster.sh")
                try:
                    return http.get("/info").status_code == 200
                except httpx.HTTPError:
                    return False

            wait_until("make run's master to answer", answers, 60, 0.2, cluster.output)
            created = subprocess.run(
                [str(official), "experiment", "create", "exp.yaml", "model"],
                cwd=tmp_path,
                env=client_env(url, XDG_CONFIG_HOME=str(tmp_path / "det-config")),
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            found = re.findall(r"Created experiment (\d+)", created.stdout)
            assert created.returncode == 0 and len(found) == 1, describe_run(created)
            token = http.post("/api/v1/auth/login", json={"username": "determined", "password": ""})
            headers = {"Authorization": f"Bearer {token.json()['token']}"}

            def ended() -> str | None:
                reply = http.get(f"/api/v1/experiments/{found[0]}", headers=headers)
                state: str = reply.json()["experiment"]["state"]
                return state if state in ENDED else None

            state = wait_until("the experiment to end", ended, TRIAL_TIMEOUT_S, 0.5, cluster.output)
            trials = http.get(f"/api/v1/experiments/{found[0]}/trials", headers=headers).json()
            logs = http.get(f"/api/v1/trials/{trials['trials'][0]['id']}/logs", headers=headers)
            assert state == "STATE_COMPLETED", (
                f"{state}: {trials}\n{logs.text[-3000:]}\n{cluster.output(4000)}"
            )
    finally:
        cluster.stop()
