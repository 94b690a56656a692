"""Webhooks through Determined's SDK (0.38.1's bindings, unchanged) and our `det webhook`,
and deliveries that survive a master killed with SIGKILL: events queued while the receiver
was down arrive once the master is started again, each once by event id, signed with the
key the master kept in its data directory. One master for the file."""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.cluster import wait_until
from harness.webhook_receiver import Receiver, state_change_webhook
from tests.conftest import require
from tests.e2e.conftest import MasterProcess, official_client_path, ok
from tests.factories import EXPERIMENT_YAML, v1_file

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def master(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MasterProcess]:
    process = MasterProcess(
        tmp_path_factory.mktemp("webhooks") / "data",
        label="webhooks",
        env={
            "DET_MASTER_WEBHOOKS__RETRY_INITIAL_S": "0.2",
            "DET_MASTER_WEBHOOKS__RETRY_MAX_S": "0.5",
        },
    )
    process.start()
    try:
        yield process
    finally:
        process.stop()
        shutil.rmtree(process.scratch, ignore_errors=True)


# Runs in the official client's venv: the SDK's generated bindings for every webhook route.
SDK_SCRIPT = """
import json, sys
from determined.common.api import bindings
from determined.experimental import client

master, url = sys.argv[1:]
client.login(master=master, user="admin", password="")
session = client._determined._session
made = bindings.post_PostWebhook(session, body=bindings.v1Webhook(
    name="sdk", url=url, mode=bindings.v1WebhookMode.WORKSPACE,
    webhookType=bindings.v1WebhookType.SLACK,
    triggers=[bindings.v1Trigger(
        triggerType=bindings.v1TriggerType.EXPERIMENT_STATE_CHANGE,
        condition={"state": "COMPLETED"})],
)).webhook
tested = bindings.post_TestWebhook(session, id=made.id).completed
bindings.patch_PatchWebhook(session, id=made.id, body=bindings.v1PatchWebhook(url=url + "/2"))
listed = [(w.name, w.url, w.webhookType.value) for w in bindings.get_GetWebhooks(session).webhooks]
bindings.delete_DeleteWebhook(session, id=made.id)
left = len(bindings.get_GetWebhooks(session).webhooks)
print("RESULT " + json.dumps({"tested": tested, "listed": listed, "left": left}))
"""


def test_the_official_sdk_bindings_manage_webhooks(master: MasterProcess, tmp_path: Path) -> None:
    client = official_client_path()
    require(client is not None, "official det client not installed: run `make official-client`")
    assert client is not None
    receiver = Receiver()
    try:
        script = tmp_path / "sdk_webhooks.py"
        script.write_text(SDK_SCRIPT)
        env = {k: v for k, v in os.environ.items() if not k.startswith("DET_")}
        env.update(XDG_CONFIG_HOME=str(tmp_path / "xdg"))
        result = subprocess.run(
            [str(client.parent / "python"), str(script), master.url, receiver.url],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
            check=False,
        )
        found = re.findall(r"^RESULT (.*)$", result.stdout, re.M)
        assert result.returncode == 0 and found, result.stdout + result.stderr
        assert json.loads(found[0]) == {
            "tested": True,
            "listed": [["sdk", receiver.url + "/2", "WEBHOOK_TYPE_SLACK"]],
            "left": 0,
        }
        (test_delivery,) = receiver.received()
        assert test_delivery.json["blocks"][0]["text"]["text"] == "test"
    finally:
        receiver.close()


def test_our_det_webhook_verbs(master: MasterProcess) -> None:
    receiver = Receiver()
    env = {"DET_USER": "admin"}
    try:
        made = json.loads(
            ok(
                master.det(
                    *("webhook", "create", "ours", receiver.url, "--json"),
                    *("--trigger", "state:COMPLETED", "--trigger", "log:Traceback"),
                    env=env,
                )
            ).stdout
        )
        assert [t["condition"] for t in made["triggers"]] == [
            {"state": "COMPLETED"},
            {"regex": "Traceback"},
        ]
        table = ok(master.det("webhook", "list", env=env)).stdout
        assert "ours" in table and "state:COMPLETED, log:Traceback" in table
        ok(master.det("webhook", "test", str(made["id"]), env=env))
        assert len(receiver.received()) == 1
        refused = master.det(
            "webhook", "create", "bad", "ftp://x/y", "--trigger", "custom", env=env
        )
        assert refused.returncode != 0 and "url:" in refused.stderr, refused.stderr
        ok(master.det("webhook", "delete", str(made["id"]), env=env))
        assert json.loads(ok(master.det("webhook", "list", "--json", env=env)).stdout) == []
    finally:
        receiver.close()


def queued(master: MasterProcess) -> int:
    """Deliveries waiting in the master's database (looked at behind its back)."""
    with sqlite3.connect(master.data_dir / "resolute.db") as db:
        count: int = db.execute("SELECT count(*) FROM webhook_events").fetchone()[0]
        return count


def test_deliveries_pending_at_a_sigkill_arrive_after_the_restart(master: MasterProcess) -> None:
    receiver = Receiver()
    try:
        receiver.down()
        admin = master.client(master.login("admin"))
        reply = admin.post(
            "/api/v1/webhooks",
            json=state_change_webhook("ops", receiver.url, "PAUSED", "ACTIVE"),
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
