"""Eight clients submit a burst of experiments; the master is SIGKILLed in the middle of it.

Each client posts its share of 1,000 experiments, in order, on its own connection; once 120
submits have been acknowledged the master is killed with SIGKILL, and every client stops
at its first failed request (a refused connection, a reset, a reply cut off). The master
then starts again on the same database. What a user must find:

- every acknowledged submit is there exactly once, under the id it was acknowledged with;
- a submit that was not acknowledged (in flight at the kill) is either wholly there or not
  at all: no experiment without its trial, its queued allocation or its model definition;
- nothing else (no duplicate names, no experiment nobody sent).

Both backends: whether a commit survives a SIGKILL is the database's business (SQLite's
WAL, Postgres's), and a master answering before its commit would show on either.
"""

from __future__ import annotations

import base64
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from harness.cluster import wait_until
from tests.conftest import PostgresServer
from tests.e2e.conftest import MasterProcess

pytestmark = pytest.mark.e2e

CLIENTS = 8
BURST = 1000
KILL_AFTER_ACKS = 120
# A request to a master under a burst on a loaded machine: seconds; this is far beyond it.
REQUEST_TIMEOUT_S = 60.0

TRAIN = b"print('never runs: no agent in this test')\n"


def submit_body(name: str) -> dict[str, Any]:
    config = {
        "name": name,
        "entrypoint": "python3 train.py",
        "resources": {"slots_per_trial": 1},
        "searcher": {"name": "single", "metric": "loss", "max_length": 1},
    }
    model = [
        {
            "path": "train.py",
            "type": 48,
            "content": base64.b64encode(TRAIN).decode(),
            "mtime": "0",
            "mode": 0o644,
            "uid": 0,
            "gid": 0,
        }
    ]
    return {"config": yaml.safe_dump(config), "modelDefinition": model, "activate": True}


class Burst:
    """The clients' record: name -> acknowledged id, and the names in flight at the kill."""

    def __init__(self, names: list[str]) -> None:
        self.names = names
        self.acked: dict[str, int] = {}
        self.in_flight: set[str] = set()
        self.refused: list[str] = []  # replies that were neither 200 nor a cut connection
        self.lock = threading.Lock()

    def run_client(self, url: str, token: str, offset: int) -> None:
        headers = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=url, headers=headers, timeout=REQUEST_TIMEOUT_S) as client:
            for name in self.names[offset::CLIENTS]:
                try:
                    reply = client.post("/api/v1/experiments", json=submit_body(name))
                except httpx.TransportError:
                    with self.lock:
                        self.in_flight.add(name)
                    return  # the master is gone: this client stops, as a script would
                with self.lock:
                    if reply.status_code == 200:
                        self.acked[name] = reply.json()["experiment"]["id"]
                    else:
                        self.refused.append(f"{name}: {reply.status_code} {reply.text[:200]}")
                        return


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def master(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MasterProcess]:
    db_url = ""
    if request.param == "postgres":
        server: PostgresServer = request.getfixturevalue("postgres")
        db_url = server.new_database()
    process = MasterProcess(tmp_path / "data", db_url, label=f"burst-{request.param}")
    try:
        yield process
    finally:
        process.stop()
        shutil.rmtree(process.scratch, ignore_errors=True)


def test_a_master_killed_mid_burst_keeps_every_acknowledged_submit_once_and_no_half(
    master: MasterProcess,
) -> None:
    master.start()
    token = master.login("determined")
    names = [f"burst-{i:04d}" for i in range(BURST)]
    burst = Burst(names)
    clients = [
        threading.Thread(target=burst.run_client, args=(master.url, token, i), daemon=True)
        for i in range(CLIENTS)
    ]
    for client in clients:
        client.start()

    def enough_acked() -> bool:
        with burst.lock:
            assert not burst.refused, burst.refused
            return len(burst.acked) >= KILL_AFTER_ACKS

    wait_until(f"{KILL_AFTER_ACKS} acknowledged submits", enough_acked, 300, 0.01)
    master.kill()
    killed_at = time.monotonic()
    for client in clients:
        client.join(REQUEST_TIMEOUT_S)
        assert not client.is_alive(), "a client still waits on the killed master"
    assert not burst.refused, burst.refused
    acked = dict(burst.acked)
    # Clients blocked on the killed master's socket all fail at once; some were mid-request.
    assert burst.in_flight, "no request was cut off by the kill: it came after the burst"
    assert len(acked) < BURST

    master.start()
    listed = master.api("GET", "/api/v1/experiments", params={"limit": 0})["experiments"]
    by_name: dict[str, list[int]] = {}
    for experiment in listed:
        by_name.setdefault(experiment["name"], []).append(experiment["id"])
    duplicates = {name: ids for name, ids in by_name.items() if len(ids) > 1}
    assert not duplicates, f"submitted once, stored more than once: {duplicates}"
    unknown = set(by_name) - set(names)
    assert not unknown, f"experiments nobody submitted: {sorted(unknown)}"
    missing = {name: i for name, i in acked.items() if by_name.get(name) != [i]}
    assert not missing, f"acknowledged but not there under their ids: {missing}"
    stray = set(by_name) - set(acked) - burst.in_flight
    assert not stray, f"never sent, yet stored: {sorted(stray)}"

    # Wholly there: each stored experiment (acknowledged or caught in flight) is active
    # with its one queued trial, that trial's pending allocation and its model definition.
    tasks = master.api("GET", "/api/v1/tasks")["allocationIdToSummary"].values()
    pending_by_experiment: dict[int, int] = {}
    for task in tasks:
        experiment_id = int(task["taskId"].split(".")[0])
        assert task["state"] == "STATE_PENDING", task
        pending_by_experiment[experiment_id] = pending_by_experiment.get(experiment_id, 0) + 1
    half: list[str] = []
    for name, (experiment_id,) in by_name.items():
        experiment = next(e for e in listed if e["id"] == experiment_id)
        trials = master.api("GET", f"/api/v1/experiments/{experiment_id}/trials")["trials"]
        model = master.api("GET", f"/api/v1/experiments/{experiment_id}/model_def")
        if (
            experiment["state"] != "STATE_ACTIVE"
            or [t["state"] for t in trials] != ["STATE_QUEUED"]
            or pending_by_experiment.get(experiment_id) != 1
            or not model.get("b64Tgz")
        ):
            half.append(
                f"{name} ({experiment_id}): {experiment['state']}, trials "
                f"{[t['state'] for t in trials]}, pending allocations "
                f"{pending_by_experiment.get(experiment_id, 0)}, model {bool(model.get('b64Tgz'))}"
            )
    assert not half, "stored but not whole:\n" + "\n".join(half)
    print(
        {
            "acknowledged": len(acked),
            "in_flight_at_kill": len(burst.in_flight),
            "in_flight_found_whole": len(burst.in_flight & set(by_name)),
            "stored": len(by_name),
            "restart_and_checks_s": round(time.monotonic() - killed_at, 1),
        }
    )
