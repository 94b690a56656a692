"""Checkpoints: a fresh directory per checkpoint in the experiment's checkpoint storage, and
a report to the master once the training code has written it, so that the master can resume
the trial from it (DET_LATEST_CHECKPOINT)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import uuid as uuidlib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from resolute._api import MasterError, Session
from resolute._metrics import check_steps

logger = logging.getLogger(__name__)

SUPPORTED_STORAGE = ("shared_fs", "directory")


def storage_directory(storage: Mapping[str, Any]) -> Path:
    """The directory the checkpoints of `checkpoint_storage` live in, the same rule as the
    master's: shared_fs host_path, joined with storage_path when that is relative (an
    absolute storage_path stands alone); directory container_path."""
    kind = storage.get("type")
    if kind == "shared_fs":
        host = storage.get("host_path")
        if not isinstance(host, str) or not host:
            raise ValueError("checkpoint_storage.host_path: required for shared_fs storage")
        sub = storage.get("storage_path")
        if sub is None or sub == "":
            return Path(host)
        if not isinstance(sub, str):
            raise ValueError("checkpoint_storage.storage_path: must be a string")
        return Path(host) / sub  # an absolute `sub` replaces `host`
    if kind == "directory":
        path = storage.get("container_path")
        if not isinstance(path, str) or not path:
            raise ValueError("checkpoint_storage.container_path: required for directory storage")
        return Path(path)
    raise ValueError(
        f"checkpoint_storage.type: {kind!r} is not supported by resolute; "
        f"use {' or '.join(SUPPORTED_STORAGE)}"
    )


def list_resources(directory: Path) -> dict[str, str]:
    """Every file under `directory`, relative path (with /) to its size in bytes as a string."""
    return {
        path.relative_to(directory).as_posix(): str(path.stat().st_size)
        for path in sorted(directory.rglob("*"))
        if path.is_file()
    }


class CheckpointContext:
    """`ctx.checkpoint`. In local mode checkpoints go to a local directory and nothing is
    reported."""

    def __init__(
        self,
        directory: Path,
        *,
        session: Session | None,
        is_chief: bool,
        trial_id: int | None,
        task_id: str | None,
        allocation_id: str | None,
    ) -> None:
        self.directory = directory
        self._session = session
        self._is_chief = is_chief
        self._trial_id = trial_id
        self._task_id = task_id
        self._allocation_id = allocation_id

    @contextmanager
    def store_path(
        self, steps_completed: int, metadata: Mapping[str, Any] | None = None
    ) -> Iterator[tuple[Path, str]]:
        """Yield `(path, uuid)` of a new, empty directory to write the checkpoint into.

        When the block finishes, the checkpoint is reported to the master (before this
        returns), with `metadata` plus `steps_completed`. If the block raises, the directory
        is removed and nothing is reported. Only the chief (rank 0) stores checkpoints."""
        if not self._is_chief:
            raise RuntimeError(
                "store_path() is for the chief (rank 0) only; other ranks should wait for it "
                "(for example with torch.distributed.barrier())"
            )
        steps = check_steps(steps_completed)
        full_metadata = {**(metadata or {}), "steps_completed": steps}
        try:
            json.dumps(full_metadata, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"checkpoint metadata must be JSON-serializable: {exc}") from None
        checkpoint_uuid = str(uuidlib.uuid4())
        path = self.directory / checkpoint_uuid
        path.mkdir(parents=True)
        try:
            yield path, checkpoint_uuid
        except BaseException:
            shutil.rmtree(path, ignore_errors=True)
            raise
        resources = list_resources(path)
        self._report(checkpoint_uuid, full_metadata, resources)
        logger.info("checkpoint %s after %d steps stored in %s", checkpoint_uuid, steps, path)

    def _report(self, checkpoint_uuid: str, metadata: dict[str, Any], resources: Any) -> None:
        if self._session is None:
            return
        body = {
            "uuid": checkpoint_uuid,
            "state": "STATE_COMPLETED",
            "metadata": metadata,
            "resources": resources,
            "training": {"trialId": self._trial_id},
            "taskId": self._task_id or "",
            "allocationId": self._allocation_id or "",
            "reportTime": datetime.now(UTC).isoformat(),
            "storageId": None,
        }
        call = f"report checkpoint {checkpoint_uuid}"
        self._session.request("POST", "/api/v1/checkpoints", body, call=call)

    @contextmanager
    def restore_path(self, checkpoint_uuid: str) -> Iterator[Path]:
        """Yield the directory of checkpoint `checkpoint_uuid` (files are read in place).

        Looks in this experiment's storage first, then asks the master where the
        checkpoint lives (one from another experiment, as with source_checkpoint_uuid)."""
        yield self._find(checkpoint_uuid)

    def _find(self, checkpoint_uuid: str) -> Path:
        if not isinstance(checkpoint_uuid, str) or not checkpoint_uuid:
            raise ValueError(f"checkpoint uuid must be a non-empty string, got {checkpoint_uuid!r}")
        if os.sep in checkpoint_uuid or checkpoint_uuid in (".", ".."):
            raise ValueError(f"{checkpoint_uuid!r} is not a checkpoint uuid")
        path = self.directory / checkpoint_uuid
        if path.is_dir():
            return path
        where = [str(path)]
        if self._session is not None:
            try:
                reply = self._session.request(
                    "GET", f"/api/v1/checkpoints/{checkpoint_uuid}", call="look up a checkpoint"
                )
            except MasterError as exc:
                if exc.status != 404:
                    raise
            else:
                stored = reply.get("checkpoint", {}).get("storagePath")
                if isinstance(stored, str) and stored:
                    if Path(stored).is_dir():
                        return Path(stored)
                    where.append(stored)
        raise FileNotFoundError(
            f"checkpoint {checkpoint_uuid} not found (looked in {', '.join(where)})"
        )
