"""resolute's training library: what a rank of a trial needs from the cluster.

    import resolute

    with resolute.init() as ctx:
        ctx.train.report_training_metrics(steps_completed=100, metrics={"loss": 0.5})
        if ctx.preempt.should_preempt():
            ...

Inside a trial it reads the DET_* variables the master sets; without DET_TRIAL_ID it runs in
local mode (no master: metrics are logged, checkpoints go to a local directory). Importing it
imports neither torch nor numpy: start-up time matters.
"""

from __future__ import annotations

import logging
from pathlib import Path
from types import TracebackType
from typing import Any

from resolute import data
from resolute import storage as _storage
from resolute._api import MasterError, Session
from resolute._env import BadEnvironment, Environment, max_length_batches, read_environment
from resolute._metrics import Shipper, ShippingError
from resolute.checkpoint import CheckpointContext
from resolute.preempt import CLIENT_TIMEOUT_S, PreemptContext
from resolute.seeding import make_deterministic
from resolute.seeding import seed_everything as _seed_everything
from resolute.train import TrainContext

__all__ = [
    "BadEnvironment",
    "CheckpointContext",
    "Context",
    "MasterError",
    "PreemptContext",
    "ShippingError",
    "TrainContext",
    "data",
    "init",
]

logger = logging.getLogger(__name__)

DEFAULT_LOCAL_CHECKPOINTS = "checkpoints"


class Context:
    """One rank's view of its trial; made by init(). Close it (or use it as a context
    manager) so that queued reports are sent before the process exits."""

    def __init__(self, env: Environment, storage: _storage.Storage) -> None:
        self.env = env
        self.rank = env.rank
        self.local_rank = env.local_rank
        self.world_size = env.world_size
        self.local_world_size = env.local_world_size
        self.is_chief = env.rank == 0
        self.hparams = env.hparams
        self.trial_seed = env.trial_seed
        self.global_batch_size = env.global_batch_size
        self.per_slot_batch_size = env.per_slot_batch_size
        self.config = env.config
        self.max_length = max_length_batches(env.config)
        self.trial_id = env.trial_id
        self.experiment_id = env.experiment_id
        self.run_id = env.run_id
        self.allocation_id = env.allocation_id
        self.latest_checkpoint = env.latest_checkpoint
        self.steps_completed = env.steps_completed
        self._closed = False

        session: Session | None = None
        shipper: Shipper | None = None
        poller: Session | None = None
        if env.cluster:
            assert env.master_url is not None
            session = Session(env.master_url, env.session_token)
            if self.is_chief:
                shipper = Shipper(Session(env.master_url, env.session_token))
                poller = Session(env.master_url, env.session_token, timeout_s=CLIENT_TIMEOUT_S)
        self._session = session
        self._shipper = shipper
        self.train = TrainContext(
            shipper=shipper,
            session=session,
            trial_id=env.trial_id,
            run_id=env.run_id,
            experiment_id=env.experiment_id,
            is_chief=self.is_chief,
        )
        self.checkpoint = CheckpointContext(
            storage,
            session=session,
            is_chief=self.is_chief,
            trial_id=env.trial_id,
            task_id=env.task_id,
            allocation_id=env.allocation_id,
        )
        self.preempt = PreemptContext(
            poller,
            env.allocation_id,
            settle_validation=self.train.settle_validation,
            ask_session=session,
        )

    @property
    def local(self) -> bool:
        """True outside a cluster (no DET_TRIAL_ID)."""
        return not self.env.cluster

    def close(self) -> None:
        """Send every queued report and stop the background threads; raises ShippingError
        if a report could not be delivered. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self.preempt.close()
        try:
            if self._shipper is not None:
                self._shipper.close()
        finally:
            if self._session is not None:
                self._session.close()

    def __enter__(self) -> Context:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()
            return
        try:
            self.close()
        except Exception:  # the training code's own exception is the one to see
            logger.exception("while closing after an error")


def init(
    *,
    hparams: dict[str, Any] | None = None,
    seed: int = 0,
    config: dict[str, Any] | None = None,
    checkpoint_dir: str | Path | None = None,
    latest_checkpoint: str | None = None,
    seed_everything: bool = True,
    deterministic: bool | None = None,
) -> Context:
    """Read the trial's environment and start talking to the master.

    `hparams`, `seed`, `config`, `checkpoint_dir` and `latest_checkpoint` stand in for the
    master in local mode and are ignored inside a cluster. With `seed_everything`, random,
    numpy and torch are seeded with (trial seed + rank) mod 2**32. `deterministic` (default:
    the config's reproducibility.deterministic) also switches torch to deterministic kernels.
    """
    env = read_environment(
        hparams=hparams, seed=seed, config=config, latest_checkpoint=latest_checkpoint
    )
    storage = env.config.get("checkpoint_storage")
    if env.cluster:
        if not isinstance(storage, dict):
            raise BadEnvironment("DET_EXPERIMENT_CONFIG has no checkpoint_storage")
        store = _storage.from_config(storage)
    elif checkpoint_dir is not None:
        store = _storage.DirectoryStorage("directory", Path(checkpoint_dir).absolute())
    elif isinstance(storage, dict):
        store = _storage.from_config(storage)
    else:
        store = _storage.DirectoryStorage("directory", Path(DEFAULT_LOCAL_CHECKPOINTS).absolute())
    if deterministic is None:
        reproducibility = env.config.get("reproducibility")
        deterministic = isinstance(reproducibility, dict) and (
            reproducibility.get("deterministic") is True
        )
    if seed_everything:
        _seed_everything(env.trial_seed, env.rank)
    if deterministic:
        make_deterministic()
    return Context(env, store)
