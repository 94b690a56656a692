"""Two det-master processes on one PostgreSQL database: one leads, the other stands by.

A trial's rank appends a line every 50 ms (CLOCK_MONOTONIC, pid). The leader is killed
with SIGKILL: the standby takes over within the lease + 3 s and the agent reattaches; the
killed master comes back as a standby; then the new leader is frozen with SIGSTOP: the
standby takes over again, and the frozen one, woken, exits without committing anything.
Through both the rank runs on: one pid, no pause of a second.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import httpx
import pytest

from harness.cluster import AgentProcess, wait_until
from harness.webhook_receiver import Receiver, state_change_webhook
from tests.conftest import PostgresServer
from tests.e2e.agents import (
    TICK_UNTIL_SCRIPT,
    create_experiment,
    longest_gap,
    tick_rows,
    trial_logs,
    wait_trial_state,
    write_experiment,
)
from tests.e2e.conftest import MasterProcess, run_our_det
from tests.factories import EXPERIMENT_YAML, v1_file

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

LEASE_S = 2.0
# A standby looks at the lease every 0.5 s: it leads at most lease + 0.5 s after the leader's
# last renewal, plus a transaction and our poll (2.6 s seen under the suite's own load). The
# margin leaves a loaded machine room and still tells a takeover on the lease's expiry from
# one on anything slower (the lost-agent window is 10 s).
TAKEOVER_S = LEASE_S + 3
JOIN_TOKEN = "standby-test-token"
SIGNING_KEY = "standby-webhook-key"


def leading(master: MasterProcess) -> bool:
    try:
        reply = master.session.get("/health/ready", timeout=2)
    except httpx.HTTPError:
        return False
    return reply.status_code == 200 and reply.json()["reason"] == "ready"


def standing_by(master: MasterProcess) -> bool:
    """Whether `master` is a standby that has looked at the lease and knows the leader."""
    try:
        reply = master.session.get("/health/ready", timeout=2)
    except httpx.HTTPError:
        return False
    reason: str = reply.json().get("reason", "")
    return reply.status_code == 200 and reason.startswith("standing by; the leader is")


@pytest.fixture
def masters(postgres: PostgresServer, tmp_path: Path) -> Iterator[list[MasterProcess]]:
    url = postgres.new_database()
    env = {
        "DET_MASTER_HA__ENABLED": "true",
        "DET_MASTER_HA__LEASE_S": str(LEASE_S),
        "DET_MASTER_AGENT_LINK__JOIN_TOKEN": JOIN_TOKEN,
        # Masters sharing a database sign deliveries with one key (else each its own).
        "DET_MASTER_WEBHOOKS__SIGNING_KEY": SIGNING_KEY,
        "DET_MASTER_WEBHOOKS__RETRY_INITIAL_S": "0.2",
        "DET_MASTER_WEBHOOKS__RETRY_MAX_S": "0.5",
    }
    pair = [
        MasterProcess(tmp_path / f"data-{name}", db_url=url, label=name, env=env)
        for name in ("one", "two")
    ]
    try:
        yield pair
    finally:
        for master in pair:
            if master.proc is not None and master.proc.poll() is None:
                os.kill(master.proc.pid, signal.SIGCONT)
            master.stop()
            shutil.rmtree(master.scratch, ignore_errors=True)


def test_a_standby_takes_over_and_the_trial_runs_on(
    masters: list[MasterProcess], tmp_path: Path
) -> None:
    one, two = masters
    one.start()
    one.wait_for("the first master to lead", lambda: leading(one), 60)
    two.start()
    assert not leading(two)
    address = ",".join(m.agent_address for m in masters)
    agent = AgentProcess(
        one,
        "standby-agent",
        tmp_path / "agent",
        slots=1,
        master_address=address,
        join_token=JOIN_TOKEN,
    )
    try:
        agent.start().wait_connected()
        _fail_over_twice(one, two, agent, tmp_path)
    finally:
        agent.stop()


def _fail_over_twice(
    one: MasterProcess, two: MasterProcess, agent: AgentProcess, tmp_path: Path
) -> None:
    # A standby serves reads and sends writes (a login too) to the leader.
    token = one.api("POST", "/api/v1/auth/login", json={"username": "determined", "password": ""})
    two._token = token["token"]
    assert two.api("GET", "/api/v1/experiments")["experiments"] == []
    redirect = httpx.post(
        f"{two.url}/api/v1/templates/from-standby",
        json={"name": "from-standby", "config": {}},
        headers={"Authorization": f"Bearer {token['token']}"},
        timeout=60,
    )
    assert redirect.status_code == 307, redirect.text
    assert redirect.headers["location"] == f"{one.url}/api/v1/templates/from-standby"

    ticks, stop = tmp_path / "ticks", tmp_path / "stop"
    config, model = write_experiment(
        tmp_path / "trial",
        TICK_UNTIL_SCRIPT % {"ticks": str(ticks), "stop": str(stop), "max_s": 300},
    )
    experiment_id = create_experiment(one, config, model)
    one.wait_for("the rank to tick", lambda: ticks.exists() and ticks.stat().st_size, 120)
    # The leader has recorded the rank's start: the allocation is running when it dies.
    wait_trial_state(one, experiment_id, {"RUNNING"})

    # 1. The leader is killed.
    killed_at = time.monotonic()
    one.kill()  # SIGKILL, reaped
    two.wait_for("the standby to lead", lambda: leading(two), TAKEOVER_S + 30, 0.05)
    takeover_after_kill_s = time.monotonic() - killed_at
    two.wait_for(
        "the agent to reattach",
        lambda: two.api("GET", f"/api/v1/agents/{agent.id}")["agent"]["connected"],
        60,
    )

    # Our CLI, given both masters, finds the one that answers (the first is dead).
    listed = run_our_det(f"{one.url},{two.url}", "experiment", "list", cwd=two.scratch)
    assert listed.returncode == 0 and str(experiment_id) in listed.stdout, listed.stderr

    # The killed master comes back, as a standby.
    one.start()
    assert not leading(one)
    one.wait_for("the restarted master to stand by", lambda: standing_by(one), 60)

    # 2. The leader freezes.
    assert two.proc is not None
    frozen = two.proc
    os.kill(frozen.pid, signal.SIGSTOP)
    frozen_at = time.monotonic()
    one.wait_for("the standby to lead again", lambda: leading(one), TAKEOVER_S + 30, 0.05)
    takeover_after_freeze_s = time.monotonic() - frozen_at
    time.sleep(2)  # the frozen leader stays frozen while the new one leads: the fault
    os.kill(frozen.pid, signal.SIGCONT)
    woke_at = time.monotonic()
    code = frozen.wait(timeout=60)
    exited_after_waking_s = time.monotonic() - woke_at
    assert code == 3, two.output()
    assert "lost the leadership" in two.output()

    # The rank ran on through both takeovers; it may end now.
    stop.touch()
    trial = wait_trial_state(one, experiment_id, {"COMPLETED", "ERROR", "CANCELED"})
    logs = trial_logs(one, trial["id"])
    rows = tick_rows(ticks)
    figures = {
        "lease_s": LEASE_S,
        "takeover_after_sigkill_s": round(takeover_after_kill_s, 3),
        "takeover_after_sigstop_s": round(takeover_after_freeze_s, 3),
        "frozen_leader_exited_after_waking_s": round(exited_after_waking_s, 3),
        "rank_processes": len({pid for _, pid in rows}),
        "longest_gap_in_rank_output_s": round(longest_gap(rows), 3),
        "restarts": trial["restarts"],
    }
    print(json.dumps(figures))
    assert trial["state"] == "COMPLETED" and trial["restarts"] == 0, f"{trial}\n{logs}"
    assert takeover_after_kill_s < TAKEOVER_S, figures
    assert takeover_after_freeze_s < TAKEOVER_S, figures
    assert figures["rank_processes"] == 1, figures
    assert figures["longest_gap_in_rank_output_s"] < 1.0, figures


def _queued_deliveries(db_url: str) -> int:
    """Deliveries waiting in the cluster's database (looked at behind the masters' backs)."""

    async def count() -> int:
        conn = await asyncpg.connect(db_url, timeout=10)
        try:
            return int(await conn.fetchval("SELECT count(*) FROM webhook_events"))
        finally:
            await conn.close()

    return asyncio.run(count())


def test_a_standby_delivers_what_the_killed_leader_had_queued(
    masters: list[MasterProcess],
) -> None:
    """Webhook deliveries are queued in the database: the leader dies with six undelivered
    (its receiver was down), and the standby that takes over delivers each once, signed."""
    one, two = masters
    one.start()
    one.wait_for("the first master to lead", lambda: leading(one), 60)
    two.start()
    receiver = Receiver()
    try:
        receiver.down()
        with one.client(one.login("admin")) as admin:
            made = admin.post(
                "/api/v1/webhooks",
                json=state_change_webhook("ops", receiver.url, "PAUSED", "ACTIVE"),
            )
            assert made.status_code == 200, made.text
        experiment = one.api(
            "POST",
            "/api/v1/experiments",
            json={
                "activate": True,
                "config": EXPERIMENT_YAML,
                "modelDefinition": [v1_file("train.py")],
            },
        )["experiment"]
        for _ in range(3):
            one.api("POST", f"/api/v1/experiments/{experiment['id']}/pause")
            one.api("POST", f"/api/v1/experiments/{experiment['id']}/activate")
        wait_until("6 queued deliveries", lambda: _queued_deliveries(one.db_url) >= 6, 30)
        one.kill()

        receiver.up()
        two.wait_for("the standby to lead", lambda: leading(two), TAKEOVER_S + 30, 0.05)
        wait_until(
            "6 deliveries from the new leader",
            lambda: len(receiver.received()) >= 6,
            30,
            diagnostics=two.output,
        )
        wait_until("an empty queue", lambda: _queued_deliveries(two.db_url) == 0, 20)
        deliveries = receiver.received()
        assert len({d.event_id for d in deliveries}) == len(deliveries) == 6
        assert all(d.signed_with(SIGNING_KEY.encode()) for d in deliveries)
        states = sorted(d.json["condition"]["state"] for d in deliveries)
        assert states == ["ACTIVE"] * 3 + ["PAUSED"] * 3
    finally:
        receiver.close()
