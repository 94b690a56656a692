"""Webhook deliveries survive a master killed with SIGKILL: events queued while the receiver
was down arrive once the master is started again, each once by event id, signed with the
key the master kept in its data directory."""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.cluster import wait_until
from harness.webhook_receiver import Receiver
from tests.e2e.conftest import MasterProcess
from tests.factories import EXPERIMENT_YAML, v1_file

pytestmark = pytest.mark.e2e


@pytest.fixture
def master(tmp_path: Path) -> Iterator[MasterProcess]:
    process = MasterProcess(
        tmp_path / "data",
        label="webhooks",
        env={
            "DET_MASTER_WEBHOOKS__RETRY_INITIAL_S": "0.2",
            "DET_MASTER_WEBHOOKS__RETRY_MAX_S": "0.5",
        },
    )
    try:
        yield process
    finally:
        process.stop()
        shutil.rmtree(process.scratch, ignore_errors=True)


def queued(master: MasterProcess) -> int:
    """Deliveries waiting in the master's database (looked at behind its back)."""
    with sqlite3.connect(master.data_dir / "resolute.db") as db:
        count: int = db.execute("SELECT count(*) FROM webhook_events").fetchone()[0]
        return count


def test_deliveries_pending_at_a_sigkill_arrive_after_the_restart(master: MasterProcess) -> None:
    receiver = Receiver()
    try:
        receiver.down()
        master.start()
        admin = master.client(master.login("admin"))
        reply = admin.post(
            "/api/v1/webhooks",
            json={
                "name": "ops",
                "url": receiver.url,
                "webhookType": "WEBHOOK_TYPE_DEFAULT",
                "mode": "WEBHOOK_MODE_WORKSPACE",
                "triggers": [
                    {
                        "triggerType": "TRIGGER_TYPE_EXPERIMENT_STATE_CHANGE",
                        "condition": {"state": state},
                    }
                    for state in ("PAUSED", "ACTIVE")
                ],
            },
        )
        assert reply.status_code == 200, reply.text
        experiment = master.api(
            "POST",
            "/api/v1/experiments",
            json={
                "activate": True,
                "config": EXPERIMENT_YAML,
                "modelDefinition": [v1_file("train.py")],
            },
        )["experiment"]
        for _ in range(3):
            master.api("POST", f"/api/v1/experiments/{experiment['id']}/pause")
            master.api("POST", f"/api/v1/experiments/{experiment['id']}/activate")
        wait_until("6 queued deliveries", lambda: queued(master) >= 6, 20)
        admin.close()
        master.kill()

        receiver.up()
        master.start()
        wait_until(
            "6 deliveries after the restart",
            lambda: len(receiver.received()) >= 6,
            30,
            diagnostics=master.output,
        )
        wait_until("an empty queue", lambda: queued(master) == 0, 20)
        deliveries = receiver.received()
        assert len({d.event_id for d in deliveries}) == len(deliveries) == 6
        key = (master.data_dir / "webhook_signing_key").read_text().strip().encode()
        assert all(d.signed_with(key) for d in deliveries)
        states = [d.json["condition"]["state"] for d in deliveries]
        assert sorted(states) == ["ACTIVE"] * 3 + ["PAUSED"] * 3
    finally:
        receiver.close()
