"""Determined's v1TrialLogsResponse and v1TaskLogsResponse, one per NDJSON line."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from master.db.models import TaskLogModel
from master.schemas.common import WireModel
from master.services.logs import SOURCE_OF_STDTYPE


class _LogLine(WireModel):
    # Required by the official client: id (a string, as grpc-gateway renders int64),
    # timestamp, level and message (printed with end="", so it keeps its newline).
    id: str
    timestamp: datetime
    level: str
    message: str
    agent_id: str | None
    container_id: str | None = None
    rank_id: int | None
    source: str
    stdtype: str
    log: str


def _fields(row: TaskLogModel) -> dict[str, Any]:
    return {
        "id": str(row.id),
        "timestamp": row.timestamp,
        "level": row.level,
        "message": row.message,
        "agent_id": row.agent_id or None,
        "rank_id": row.rank,
        "source": SOURCE_OF_STDTYPE.get(row.stdtype, "container"),
        "stdtype": row.stdtype,
        "log": row.message,
    }


class TrialLog(_LogLine):
    trial_id: int

    @classmethod
    def of(cls, row: TaskLogModel) -> TrialLog:
        return cls(trial_id=row.trial_id or 0, **_fields(row))


class TaskLog(_LogLine):
    task_id: str
    allocation_id: str

    @classmethod
    def of(cls, row: TaskLogModel) -> TaskLog:
        return cls(task_id=row.task_id, allocation_id=row.allocation_id, **_fields(row))
