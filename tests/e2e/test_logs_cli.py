"""`det trial logs` and `det task logs`, ours and Determined's official client, against a real
master whose log lines are written into its database through the service the agent link uses."""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import IO

import pytest

from master.db.session import create_engine, create_session_factory, session_scope
from master.services.logs import LogLine, append_logs
from master.settings import async_database_url
from tests.conftest import require
from tests.e2e.conftest import (
    OUR_DET,
    MasterProcess,
    client_env,
    describe_run,
    lines,
    official_client_path,
    ok,
)
from tests.factories import EXPERIMENT_YAML, v1_file

pytestmark = pytest.mark.e2e

T0 = datetime(2026, 11, 21, 10, 0, 0, tzinfo=UTC)
# (rank, stdtype, message) in the order the agent sends them.
LINES = [
    (0, "stdout", "epoch 1 loss 0.5\n"),
    (1, "stderr", "WARNING:root:slow step\n"),
    (0, "stderr", "ERROR:root:failed to save\n"),
    (1, "stdout", "epoch 2 loss 0.4\n"),
    (0, "stdout", "done\n"),
]
MESSAGES = [message for _, _, message in LINES]


@dataclass
class LoggedTrial:
    experiment_id: int
    trial_id: int
    task_id: str
    allocation_id: str


def write_logs(master: MasterProcess, agent_id: str, lines: Sequence[LogLine]) -> int:
    """Store lines in the master's database as its agent link would."""

    async def run() -> int:
        engine = create_engine(async_database_url(master.db_url, master.data_dir))
        try:
            async with session_scope(create_session_factory(engine)) as session:
                return await append_logs(session, agent_id, lines)
        finally:
            await engine.dispose()

    return asyncio.run(run())


def start_trial(master: MasterProcess) -> LoggedTrial:
    body = {"config": EXPERIMENT_YAML, "modelDefinition": [v1_file("train.py")]}
    experiment_id = master.api("POST", "/api/v1/experiments", json=body)["experiment"]["id"]
    tasks = master.api("GET", "/api/v1/tasks")["allocationIdToSummary"]
    mine = sorted(
        (t for t in tasks.values() if t["experimentId"] == experiment_id),
        key=lambda t: t["trialId"],
    )
    assert mine, tasks
    first = mine[0]
    return LoggedTrial(experiment_id, first["trialId"], first["taskId"], first["allocationId"])


def log_lines(
    trial: LoggedTrial, rows: Sequence[tuple[int, str, str]], start: int = 0
) -> list[LogLine]:
    return [
        LogLine(trial.allocation_id, rank, stdtype, T0 + timedelta(seconds=start + i), message)
        for i, (rank, stdtype, message) in enumerate(rows)
    ]


@pytest.fixture(scope="module")
def logged(master: MasterProcess) -> LoggedTrial:
    """A queued trial with LINES stored, from two agents."""
    trial = start_trial(master)
    assert write_logs(master, "agent-a", log_lines(trial, LINES[:2])) == 2
    assert write_logs(master, "agent-b", log_lines(trial, LINES[2:], start=2)) == 3
    return trial


# -- our det -------------------------------------------------------------------------------


def test_trial_logs_prints_raw_messages(master: MasterProcess, logged: LoggedTrial) -> None:
    result = ok(master.det("trial", "logs", str(logged.trial_id)))
    assert result.stdout == "".join(MESSAGES), describe_run(result)
    assert result.stderr == ""
    alias = ok(master.det("t", "logs", str(logged.trial_id)))
    assert alias.stdout == result.stdout


def test_trial_logs_head_tail_rank_level(master: MasterProcess, logged: LoggedTrial) -> None:
    trial = str(logged.trial_id)
    tail = ok(master.det("trial", "logs", trial, "--tail", "2"))
    assert tail.stdout == "".join(MESSAGES[-2:]), describe_run(tail)
    head = ok(master.det("trial", "logs", trial, "--head", "2"))
    assert head.stdout == "".join(MESSAGES[:2]), describe_run(head)
    rank = ok(master.det("trial", "logs", trial, "--rank", "1"))
    assert rank.stdout == MESSAGES[1] + MESSAGES[3], describe_run(rank)
    warning = ok(master.det("trial", "logs", trial, "--level", "warning"))
    assert warning.stdout == MESSAGES[1] + MESSAGES[2], describe_run(warning)


def test_trial_logs_json(master: MasterProcess, logged: LoggedTrial) -> None:
    result = ok(master.det("trial", "logs", str(logged.trial_id), "--json", "--tail", "3"))
    records = [json.loads(text) for text in result.stdout.splitlines()]
    assert [r["message"] for r in records] == MESSAGES[-3:], describe_run(result)
    assert [(r["rankId"], r["agentId"], r["level"]) for r in records] == [
        (0, "agent-b", "LOG_LEVEL_ERROR"),
        (1, "agent-b", "LOG_LEVEL_INFO"),
        (0, "agent-b", "LOG_LEVEL_INFO"),
    ]
    assert all(r["trialId"] == logged.trial_id for r in records)


def test_task_logs(master: MasterProcess, logged: LoggedTrial) -> None:
    result = ok(master.det("task", "logs", logged.task_id))
    assert result.stdout == "".join(MESSAGES), describe_run(result)
    tail = ok(master.det("task", "logs", logged.task_id, "--tail", "1"))
    assert tail.stdout == MESSAGES[-1], describe_run(tail)


def test_errors_are_one_line_on_stderr(master: MasterProcess, logged: LoggedTrial) -> None:
    cases = [
        (("trial", "logs", "999999"), "Error: trial 999999 not found"),
        (("task", "logs", "1.nope"), "Error: task 1.nope not found"),
        (
            ("trial", "logs", str(logged.trial_id), "--head", "1", "--tail", "1"),
            "Error: use at most one of --follow, --head and --tail",
        ),
        (
            ("trial", "logs", str(logged.trial_id), "--level", "LOUD"),
            "Error: --level: 'LOUD' is not one of TRACE, DEBUG, INFO, WARNING, ERROR, CRITICAL",
        ),
    ]
    for args, message in cases:
        result = master.det(*args)
        assert result.returncode == 1, describe_run(result)
        assert result.stdout == "" and lines(result.stderr) == [message], describe_run(result)


class Reader:
    """Collects what a stream gives, as it comes, on a thread of its own."""

    def __init__(self, stream: IO[str]) -> None:
        self._chunks: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: IO[str]) -> None:
        for line in iter(stream.readline, ""):
            self._chunks.append(line)

    @property
    def text(self) -> str:
        return "".join(self._chunks)

    def join(self, timeout: float) -> str:
        self._thread.join(timeout)
        return self.text


def test_follow_streams_until_the_trial_ends(master: MasterProcess) -> None:
    trial = start_trial(master)
    write_logs(master, "agent-a", log_lines(trial, LINES[:2]))
    follower = subprocess.Popen(
        [str(OUR_DET), "trial", "logs", "-f", str(trial.trial_id)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=client_env(master.url),
        cwd=master.scratch,
    )
    assert follower.stdout is not None and follower.stderr is not None
    out, err = Reader(follower.stdout), Reader(follower.stderr)

    def printed(messages: Sequence[str]) -> bool:
        assert follower.poll() is None or out.text == "".join(messages), (
            f"det trial logs -f ended (exit {follower.returncode}) while the trial was "
            f"queued\n--- stdout ---\n{out.text}\n--- stderr ---\n{err.text}"
        )
        return out.text == "".join(messages)

    try:
        # It prints what was there, then waits for more while the trial is queued ...
        master.wait_for("the lines stored so far", lambda: printed(MESSAGES[:2]), 120, 0.1)
        assert follower.poll() is None, "det trial logs -f ended while the trial was queued"
        write_logs(master, "agent-a", log_lines(trial, LINES[2:], start=2))
        # ... prints new lines as they come ...
        master.wait_for("the lines stored since", lambda: printed(MESSAGES), 120, 0.1)
        assert follower.poll() is None, "det trial logs -f ended while the trial was queued"
        # ... and ends once the trial does.
        master.api("POST", f"/api/v1/experiments/{trial.experiment_id}/kill")
        follower.wait(timeout=120)
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
    stdout, stderr = out.join(30), err.join(30)
    follower.stdout.close()
    follower.stderr.close()
    assert follower.returncode == 0, stderr
    assert stdout == "".join(MESSAGES), stderr


# -- Determined's official det -------------------------------------------------------------

ENDED = "Trial log stream ended. To reopen log stream, run: det trial logs -f {}"
TASK_ENDED = "Task log stream ended. To reopen log stream, run: det task logs -f {}"


def official(master: MasterProcess, *args: str) -> subprocess.CompletedProcess[str]:
    require(
        official_client_path() is not None,
        "official det client not installed: run `make official-client`",
    )
    result = ok(master.official(*args))
    assert "Traceback" not in result.stderr, describe_run(result)
    return result


def printed(result: subprocess.CompletedProcess[str]) -> list[str]:
    return result.stdout.splitlines()


def expected(messages: Sequence[str], ended: str) -> list[str]:
    return [m.rstrip("\n") for m in messages] + [ended]


@pytest.mark.official_client
def test_official_trial_logs(master: MasterProcess, logged: LoggedTrial) -> None:
    trial = str(logged.trial_id)
    result = official(master, "trial", "logs", trial)
    assert printed(result) == expected(MESSAGES, ENDED.format(trial)), describe_run(result)
    tail = official(master, "trial", "logs", trial, "--tail", "2")
    assert printed(tail) == expected(MESSAGES[-2:], ENDED.format(trial)), describe_run(tail)
    head = official(master, "trial", "logs", trial, "--head", "1")
    assert printed(head) == expected(MESSAGES[:1], ENDED.format(trial)), describe_run(head)
    level = official(master, "trial", "logs", trial, "--level", "ERROR")
    assert printed(level) == expected(MESSAGES[2:3], ENDED.format(trial)), describe_run(level)
    rank = official(master, "trial", "logs", trial, "--rank-id", "1")
    assert printed(rank) == expected(MESSAGES[1:4:2], ENDED.format(trial)), describe_run(rank)


@pytest.mark.official_client
def test_official_task_logs(master: MasterProcess, logged: LoggedTrial) -> None:
    result = official(master, "task", "logs", logged.task_id)
    ended = TASK_ENDED.format(logged.task_id)
    assert printed(result) == expected(MESSAGES, ended), describe_run(result)
    tail = official(master, "task", "logs", logged.task_id, "--tail", "2")
    assert printed(tail) == expected(MESSAGES[-2:], ended), describe_run(tail)
    as_json = official(master, "task", "logs", logged.task_id, "--json", "--head", "1")
    assert f'"taskId": "{logged.task_id}"' in as_json.stdout, describe_run(as_json)


@pytest.mark.official_client
def test_official_follow_and_experiment_logs_end_on_terminal_trial(
    master: MasterProcess,
) -> None:
    trial = start_trial(master)
    write_logs(master, "agent-a", log_lines(trial, LINES))
    master.api("POST", f"/api/v1/experiments/{trial.experiment_id}/kill")
    ended = ENDED.format(trial.trial_id)
    follow = official(master, "trial", "logs", "-f", str(trial.trial_id))
    assert printed(follow) == expected(MESSAGES, ended), describe_run(follow)
    experiment_logs = official(master, "experiment", "logs", str(trial.experiment_id))
    assert printed(experiment_logs) == expected(MESSAGES, ended), describe_run(experiment_logs)
