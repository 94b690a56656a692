"""Master settings: YAML file first, environment variables over it, explicit flags over both."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from master.settings import MasterSettings, async_database_url


def test_defaults_are_embedded_sqlite_on_8080(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DET_MASTER_CONFIG_FILE", raising=False)
    settings = MasterSettings()
    assert settings.port == 8080
    assert settings.database_url.startswith("sqlite+aiosqlite:///")
    assert settings.database_url.endswith("/data/resolute.db")
    assert settings.max_model_definition_bytes == 96 * 2**20


def test_env_overrides_yaml_and_flags_override_env(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config = tmp_path / "master.yaml"
    config.write_text("port: 9000\ndb: {url: 'postgresql://u@h/db'}\nlog_level: debug\n")
    monkeypatch.setenv("DET_MASTER_CONFIG_FILE", str(config))
    assert MasterSettings().port == 9000
    monkeypatch.setenv("DET_MASTER_PORT", "9100")
    settings = MasterSettings()
    assert settings.port == 9100
    assert settings.log_level == "DEBUG"
    assert settings.database_url == "postgresql+asyncpg://u@h/db"
    assert MasterSettings(port=9200).port == 9200


def test_unknown_and_bad_settings_are_errors(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config = tmp_path / "master.yaml"
    config.write_text("prot: 9000\n")
    monkeypatch.setenv("DET_MASTER_CONFIG_FILE", str(config))
    with pytest.raises(ValidationError, match="prot"):
        MasterSettings()
    monkeypatch.delenv("DET_MASTER_CONFIG_FILE")
    with pytest.raises(ValidationError, match="log_level"):
        MasterSettings(log_level="chatty")
    with pytest.raises(ValidationError, match="port"):
        MasterSettings(port=70000)


@pytest.mark.parametrize(
    "url,expected",
    [
        ("postgres://u@h:5432/d", "postgresql+asyncpg://u@h:5432/d"),
        ("postgresql://u@h/d", "postgresql+asyncpg://u@h/d"),
        ("sqlite:////tmp/x.db", "sqlite+aiosqlite:////tmp/x.db"),
        ("postgresql+asyncpg://u@h/d", "postgresql+asyncpg://u@h/d"),
    ],
)
def test_driver_is_chosen_for_the_user(url: str, expected: str) -> None:
    assert async_database_url(url, Path("unused")) == expected
