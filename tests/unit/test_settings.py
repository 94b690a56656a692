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


# -- task_container_defaults.environment_variables ------------------------------------------
# What every trial's processes get beneath the experiment's own variables (Determined's
# key): PATH there chooses the `python3` that runs Determined's scripts.

from master.core.launch import runtime_variables  # noqa: E402  (appended section)


def test_default_variables_as_a_list_apply_to_every_device_type(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config = tmp_path / "master.yaml"
    config.write_text(
        "task_container_defaults:\n"
        "  environment_variables:\n"
        "    - PATH=/opt/det/bin:/usr/bin:/bin\n"
        "    - NCCL_DEBUG=INFO\n"
        "    - OPTS=a=b\n"  # only the first '=' splits
    )
    monkeypatch.setenv("DET_MASTER_CONFIG_FILE", str(config))
    monkeypatch.delenv("DET_MASTER_TASK_CONTAINER_DEFAULTS__ENVIRONMENT_VARIABLES", raising=False)
    variables = MasterSettings().task_container_defaults.environment_variables
    expected = {"PATH": "/opt/det/bin:/usr/bin:/bin", "NCCL_DEBUG": "INFO", "OPTS": "a=b"}
    for device in ("cpu", "cuda", "rocm"):
        assert runtime_variables(variables, device) == expected


def test_default_variables_per_device_type(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DET_MASTER_CONFIG_FILE", raising=False)
    settings = MasterSettings(
        task_container_defaults={
            "environment_variables": {"cpu": ["PATH=/cpu/bin"], "cuda": ["PATH=/cuda/bin"]}
        }
    )
    variables = settings.task_container_defaults.environment_variables
    assert runtime_variables(variables, "cpu") == {"PATH": "/cpu/bin"}
    assert runtime_variables(variables, "cuda") == {"PATH": "/cuda/bin"}
    assert runtime_variables(variables, "rocm") == {}
    # `gpu` is Determined's older name for cuda.
    legacy = MasterSettings(
        task_container_defaults={"environment_variables": {"gpu": ["NCCL_DEBUG=WARN"]}}
    ).task_container_defaults.environment_variables
    assert runtime_variables(legacy, "cuda") == {"NCCL_DEBUG": "WARN"}
    assert runtime_variables(legacy, "cpu") == {}


def test_default_variables_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DET_MASTER_CONFIG_FILE", raising=False)
    name = "DET_MASTER_TASK_CONTAINER_DEFAULTS__ENVIRONMENT_VARIABLES"
    monkeypatch.setenv(name, '["PATH=/x/bin:/usr/bin"]')
    variables = MasterSettings().task_container_defaults.environment_variables
    assert runtime_variables(variables, "cpu") == {"PATH": "/x/bin:/usr/bin"}
    monkeypatch.setenv(name, '{"cuda": ["PATH=/cuda/bin"]}')
    variables = MasterSettings().task_container_defaults.environment_variables
    assert runtime_variables(variables, "cuda") == {"PATH": "/cuda/bin"}
    assert runtime_variables(variables, "cpu") == {}


def test_a_pool_has_its_own_defaults_and_the_others_keep_the_masters(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config = tmp_path / "master.yaml"
    config.write_text(
        "task_container_defaults: {environment_variables: [PATH=/master/bin]}\n"
        "resource_pools:\n"
        "  - pool_name: default\n"
        "  - pool_name: det\n"
        "    task_container_defaults:\n"
        "      environment_variables: {cpu: [PATH=/det/bin, DET_ONLY=1]}\n"
    )
    monkeypatch.setenv("DET_MASTER_CONFIG_FILE", str(config))
    monkeypatch.delenv("DET_MASTER_TASK_CONTAINER_DEFAULTS__ENVIRONMENT_VARIABLES", raising=False)
    settings = MasterSettings()
    det = settings.pool("det")
    default = settings.pool("default")
    assert det is not None and det.task_container_defaults is not None
    assert runtime_variables(det.task_container_defaults.environment_variables, "cpu") == {
        "PATH": "/det/bin",
        "DET_ONLY": "1",
    }
    assert default is not None and default.task_container_defaults is None  # the master's
    assert runtime_variables(settings.task_container_defaults.environment_variables, "cpu") == {
        "PATH": "/master/bin"
    }


@pytest.mark.parametrize(
    ("defaults", "item"),
    [
        ({"environment_variables": ["PATH=/x", "NOPE"]}, "'NOPE' is not KEY=VALUE"),
        ({"environment_variables": ["=value"]}, "'=value' is not KEY=VALUE"),
        ({"environment_variables": {"cuda": ["A=1", "BARE"]}}, "'BARE' is not KEY=VALUE"),
        ({"environment_variables": {"tpu": ["A=1"]}}, "'cpu', 'cuda', 'rocm' or 'gpu'"),
    ],
)
def test_a_default_variable_that_is_not_key_value_is_refused_naming_the_field(
    monkeypatch: pytest.MonkeyPatch, defaults: dict[str, object], item: str
) -> None:
    monkeypatch.delenv("DET_MASTER_CONFIG_FILE", raising=False)
    with pytest.raises(ValidationError) as master_error:
        MasterSettings(task_container_defaults=defaults)
    text = str(master_error.value)
    assert "task_container_defaults.environment_variables" in text, text
    assert item in text, text
    with pytest.raises(ValidationError) as pool_error:
        MasterSettings(
            resource_pools=[{"pool_name": "default", "task_container_defaults": defaults}]
        )
    assert "resource_pools.0.task_container_defaults.environment_variables" in str(pool_error.value)


def test_a_bad_default_variable_in_the_environment_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("DET_MASTER_CONFIG_FILE", raising=False)
    name = "DET_MASTER_TASK_CONTAINER_DEFAULTS__ENVIRONMENT_VARIABLES"
    monkeypatch.setenv(name, '["PATH=/x/bin", "oops"]')
    with pytest.raises(ValidationError, match="'oops' is not KEY=VALUE"):
        MasterSettings()


def test_relative_paths_become_absolute_against_the_start_directory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`make run` passes `--work-dir data/agent-work`: the agent hands the path to mount(8)
    and to ranks that run in other directories, so it must be absolute (issue 28)."""
    from agent.settings import AgentSettings

    monkeypatch.delenv("DET_MASTER_CONFIG_FILE", raising=False)
    monkeypatch.chdir(tmp_path)
    agent = AgentSettings(work_dir=Path("data/agent-work"), join_token="t", credential_file="c")
    assert agent.work_dir == tmp_path / "data" / "agent-work"
    assert agent.credential_path == tmp_path / "c"
    assert AgentSettings(join_token="t").work_dir == tmp_path / "agent-work"
    master = MasterSettings(data_dir=Path("data"))
    assert master.data_dir == tmp_path / "data"
    assert MasterSettings().data_dir == tmp_path / "data"
    assert master.default_checkpoint_storage()["host_path"] == str(tmp_path / "data/checkpoints")
    # Absolute ones are kept as given.
    assert AgentSettings(work_dir=tmp_path / "w", join_token="t").work_dir == tmp_path / "w"


def test_a_determined_master_yaml_starts_and_its_unapplied_defaults_are_named(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Determined's other task_container_defaults keys (and misspellings) are kept, so its
    master.yaml starts, and named at start as not applied, never dropped unsaid."""
    config = tmp_path / "master.yaml"
    config.write_text(
        "task_container_defaults:\n"
        "  image: {cpu: registry.example.com/team/base:1}\n"
        "  shm_size_bytes: 4294967296\n"
        "  network_mode: host\n"
        "resource_pools:\n"
        "  - pool_name: default\n"
        "  - pool_name: gpu\n"
        "    task_container_defaults: {bind_mounts: []}\n"
    )
    monkeypatch.setenv("DET_MASTER_CONFIG_FILE", str(config))
    settings = MasterSettings()
    assert settings.task_container_defaults.image == {"cpu": "registry.example.com/team/base:1"}
    assert settings.unapplied_container_defaults() == [
        "task_container_defaults.shm_size_bytes",
        "task_container_defaults.network_mode",
        "resource_pools[gpu].task_container_defaults.bind_mounts",
    ]
    monkeypatch.delenv("DET_MASTER_CONFIG_FILE")
    assert MasterSettings().unapplied_container_defaults() == []
