"""The master's `retention_policy` (how long task logs outlive their trial, and how often
the leader looks) and the durations it and the cluster message take."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from pydantic import ValidationError

from master.core.durations import parse_duration
from master.settings import MasterSettings


@pytest.mark.parametrize(
    ("text", "span"),
    [
        ("24h", timedelta(hours=24)),
        ("1h30m", timedelta(minutes=90)),
        ("90s", timedelta(seconds=90)),
        ("1.5h", timedelta(minutes=90)),
        ("5d", timedelta(days=5)),
        ("2w", timedelta(weeks=2)),
        ("250ms", timedelta(milliseconds=250)),
    ],
)
def test_durations_as_determined_users_write_them(text: str, span: timedelta) -> None:
    assert parse_duration(text, "duration") == span


@pytest.mark.parametrize("text", ["", "h", "5", "5x", "1h 30m", "-1h", "0 0 * * *", "0s"])
def test_other_text_is_refused_naming_the_field(text: str) -> None:
    with pytest.raises(ValueError, match=r"^schedule: "):
        parse_duration(text, "schedule")


def test_retention_defaults_keep_logs_and_look_hourly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DET_MASTER_CONFIG_FILE", raising=False)
    policy = MasterSettings().retention_policy
    assert policy.log_retention_days is None and policy.interval_s() == 3600


def test_retention_settings_are_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DET_MASTER_CONFIG_FILE", raising=False)
    policy = MasterSettings(retention_policy={"log_retention_days": 30, "schedule": "6h"})
    assert policy.retention_policy.interval_s() == 6 * 3600
    with pytest.raises(ValidationError, match=re.escape("retention_policy.schedule: '0 0 * * *'")):
        MasterSettings(retention_policy={"schedule": "0 0 * * *"})
    with pytest.raises(ValidationError, match="log_retention_days"):
        MasterSettings(retention_policy={"log_retention_days": -2})
    with pytest.raises(ValidationError, match=re.escape("schedule: '1ms' is shorter than 1m")):
        MasterSettings(retention_policy={"schedule": "1ms"})
    assert MasterSettings(retention_policy={"schedule": "1m"}).retention_policy.interval_s() == 60
