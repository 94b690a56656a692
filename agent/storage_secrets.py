"""Keep a trial's S3 keys out of its ranks' environment: the agent writes them to a
credentials file only the ranks' user can read, removes them from the experiment config
the ranks see (DET_EXPERIMENT_CONFIG and Determined's trial.json), and points boto3's
standard chain at the file (AWS_SHARED_CREDENTIALS_FILE). Both Determined's storage code
and resolute's then find them there, as they would on a machine with ~/.aws/credentials.

Azure connection strings stay in the config: Determined's harness reads them from nowhere
else.
"""

from __future__ import annotations

import json
import os
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

from agent.rank_user import RankUser

CONFIG_VARIABLE = "DET_EXPERIMENT_CONFIG"
CREDENTIALS_VARIABLE = "AWS_SHARED_CREDENTIALS_FILE"
KEYS = ("access_key", "secret_key")


def _without_keys(config: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]] | None:
    storage = config.get("checkpoint_storage")
    if not isinstance(storage, dict) or storage.get("type") != "s3":
        return None
    keys = {k: storage.get(k) for k in KEYS}
    if not all(isinstance(v, str) and v for v in keys.values()):
        return None
    scrubbed = {k: v for k, v in storage.items() if k not in KEYS}
    return {**config, "checkpoint_storage": scrubbed}, {k: str(v) for k, v in keys.items()}


def move_s3_keys(
    env: MutableMapping[str, str],
    info_files: MutableMapping[str, str],
    secrets_dir: Path,
    owner: RankUser | None = None,
) -> Path | None:
    """Move the S3 keys of the config in `env` into `secrets_dir/aws-credentials` (0600);
    returns the file, or None when the config holds no keys. With `owner` (the ranks'
    user, when it is not the agent's) the directory and the file are that user's."""
    try:
        config = json.loads(env.get(CONFIG_VARIABLE, ""))
    except ValueError:
        return None
    if not isinstance(config, dict):
        return None
    moved = _without_keys(config)
    if moved is None:
        return None
    scrubbed, keys = moved
    secrets_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    if owner is not None:
        # The ranks pass through the parent to their own directory; nobody lists it.
        secrets_dir.parent.chmod(0o711)
        os.chown(secrets_dir, owner.uid, owner.gid)
    path = secrets_dir / "aws-credentials"
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    if owner is not None:
        os.fchown(descriptor, owner.uid, owner.gid)
    with os.fdopen(descriptor, "w") as out:
        out.write(
            "[default]\n"
            f"aws_access_key_id = {keys['access_key']}\n"
            f"aws_secret_access_key = {keys['secret_key']}\n"
        )
    env[CONFIG_VARIABLE] = json.dumps(scrubbed, sort_keys=True)
    env[CREDENTIALS_VARIABLE] = str(path)
    trial_info = info_files.get("trial.json")
    if trial_info:
        info = json.loads(trial_info)
        inner = _without_keys(info["config"]) if isinstance(info.get("config"), dict) else None
        if inner is not None:
            info["config"] = inner[0]
            info_files["trial.json"] = json.dumps(info, sort_keys=True)
    return path
