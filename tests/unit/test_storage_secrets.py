"""The agent keeps a trial's S3 keys out of its ranks' environment (agent.storage_secrets)."""

from __future__ import annotations

import json
import stat
from pathlib import Path

from agent.storage_secrets import CONFIG_VARIABLE, CREDENTIALS_VARIABLE, move_s3_keys

S3 = {"type": "s3", "bucket": "b", "access_key": "AKIA123", "secret_key": "s3cr3t"}


def test_s3_keys_move_to_an_owner_only_file(tmp_path: Path) -> None:
    config = {"checkpoint_storage": S3, "entrypoint": "python3 train.py"}
    env = {CONFIG_VARIABLE: json.dumps(config)}
    info = {"trial.json": json.dumps({"trial_id": 1, "config": config})}
    path = move_s3_keys(env, info, tmp_path / "secrets")
    assert path is not None and env[CREDENTIALS_VARIABLE] == str(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert path.read_text() == (
        "[default]\naws_access_key_id = AKIA123\naws_secret_access_key = s3cr3t\n"
    )
    for text in (env[CONFIG_VARIABLE], info["trial.json"]):
        assert "AKIA123" not in text and "s3cr3t" not in text
    seen = json.loads(env[CONFIG_VARIABLE])
    assert seen["checkpoint_storage"] == {"type": "s3", "bucket": "b"}
    assert seen["entrypoint"] == "python3 train.py"
    assert json.loads(info["trial.json"])["trial_id"] == 1


def test_configs_without_s3_keys_are_left_alone(tmp_path: Path) -> None:
    for storage in (
        {"type": "s3", "bucket": "b"},  # the standard chain: nothing to move
        {"type": "shared_fs", "host_path": "/data"},
        {"type": "azure", "container": "c", "connection_string": "x"},
    ):
        env = {CONFIG_VARIABLE: json.dumps({"checkpoint_storage": storage})}
        before = dict(env)
        assert move_s3_keys(env, {}, tmp_path / "secrets") is None
        assert env == before
    assert move_s3_keys({CONFIG_VARIABLE: "not json"}, {}, tmp_path) is None
    assert move_s3_keys({}, {}, tmp_path) is None
    assert not (tmp_path / "secrets").exists()
