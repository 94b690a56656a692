"""A workspace's checkpoint storage (Determined's `checkpointStorageConfig` of a workspace,
`det workspace create|edit --checkpoint-storage-config`): where its experiments keep their
checkpoints when their config (a template's included) names no `checkpoint_storage`. It
stands between the experiment's own storage and the master's default.

Kept whole, secrets included, as the experiments' own configs are; shown with its secrets
masked, and a secret sent back masked keeps the stored value."""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from master.core.expconf import validate_config
from master.errors import InvalidArgument
from master.services.configs import config_errors_as_invalid_argument
from master.services.templates import refuse_hidden_secrets
from master.services.workspaces import get_workspace
from resolute.storage import keep_hidden_secrets

log = logging.getLogger(__name__)

FIELD = "checkpointStorageConfig"
# A complete experiment config around the storage: the storage's own checks (a bucket for
# s3, a host_path for shared_fs...) are those of an experiment's checkpoint_storage.
_AROUND = {
    "entrypoint": "python3 train.py",
    "searcher": {"name": "single", "metric": "loss", "max_length": {"batches": 1}},
}


def checked_storage(value: Any, previous: dict[str, Any] | None) -> dict[str, Any] | None:
    """The storage to keep, or None to clear it (null or {}); a 400 naming the field when
    it is not a complete checkpoint storage."""
    if value is None or value == {}:
        return None
    if not isinstance(value, dict):
        raise InvalidArgument(f"{FIELD}: must be a mapping, a checkpoint_storage section")
    config = keep_hidden_secrets(
        {"checkpoint_storage": value},
        {"checkpoint_storage": previous} if previous is not None else None,
    )
    with config_errors_as_invalid_argument(FIELD):
        validate_config({**_AROUND, **config}, complete=True)
    refuse_hidden_secrets(config, FIELD)
    storage: dict[str, Any] = config["checkpoint_storage"]
    return storage


async def set_storage(session: AsyncSession, workspace_id: int, value: Any) -> None:
    workspace = await get_workspace(session, workspace_id)
    storage = checked_storage(value, workspace.checkpoint_storage)
    workspace.checkpoint_storage = storage
    await session.flush()
    kind = storage["type"] if storage is not None else "none (the master's default)"
    log.info("workspace %s (%d): checkpoint storage %s", workspace.name, workspace.id, kind)
