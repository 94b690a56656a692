"""Checkpoints: a fresh directory per checkpoint, stored in the experiment's checkpoint
storage (in place on a file system, uploaded to an object store), and a report to the master
once it is stored, so that the master can resume the trial from it (DET_LATEST_CHECKPOINT)."""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import uuid as uuidlib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from resolute._api import MasterError, Session
from resolute._metrics import check_steps
from resolute.storage import Storage, check_name, list_files

logger = logging.getLogger(__name__)


def list_resources(directory: Path) -> dict[str, str]:
    """Every file under `directory`, relative path (with /) to its size in bytes as a string."""
    return {path: str(size) for path, size in list_files(directory).items()}


class CheckpointContext:
    """`ctx.checkpoint`. In local mode checkpoints go to a local directory and nothing is
    reported."""

    def __init__(
        self,
        storage: Storage,
        *,
        session: Session | None,
        is_chief: bool,
        trial_id: int | None,
        task_id: str | None,
        allocation_id: str | None,
    ) -> None:
        self.storage = storage
        # Where checkpoints are written in place; None for an object store.
        self.directory = storage.local_directory()
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
        staging = None
        if self.directory is not None:
            path = self.directory / checkpoint_uuid
        else:
            staging = Path(tempfile.mkdtemp(prefix="resolute-checkpoint-"))
            path = staging / checkpoint_uuid
        path.mkdir(parents=True)
        try:
            try:
                yield path, checkpoint_uuid
            except BaseException:
                shutil.rmtree(path, ignore_errors=True)
                raise
            resources = list_resources(path)
            if staging is not None:
                self.storage.upload(path, checkpoint_uuid)
        finally:
            if staging is not None:
                shutil.rmtree(staging, ignore_errors=True)
        self._report(checkpoint_uuid, full_metadata, resources)
        where = self.storage.location(checkpoint_uuid)
        logger.info("checkpoint %s after %d steps stored in %s", checkpoint_uuid, steps, where)

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
        """Yield the directory of checkpoint `checkpoint_uuid`.

        On a file system the files are read in place: this experiment's storage first,
        then where the master says the checkpoint lives (one from another experiment, as
        with source_checkpoint_uuid). From an object store they are downloaded into a
        temporary directory, removed when the block ends."""
        check_name(checkpoint_uuid)
        if self.directory is not None:
            yield self._find(checkpoint_uuid, self.directory)
            return
        with tempfile.TemporaryDirectory(prefix="resolute-restore-") as scratch:
            self.storage.download(checkpoint_uuid, Path(scratch))
            yield Path(scratch)

    def _find(self, checkpoint_uuid: str, directory: Path) -> Path:
        path = directory / checkpoint_uuid
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
