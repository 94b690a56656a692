"""Reporting training and validation metrics and progress to the master."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

from resolute._api import MasterError, Session
from resolute._metrics import Shipper, ShippingError, check_steps, convert_metrics

logger = logging.getLogger(__name__)


class TrainContext:
    """`ctx.train`. Reports are queued and sent by a background thread; call them from any
    rank (only the chief's are sent, so every rank may run the same code). In local mode
    reports are only logged (logger `resolute.train`, level INFO)."""

    def __init__(
        self,
        *,
        shipper: Shipper | None,
        session: Session | None,
        trial_id: int | None,
        run_id: int | None,
        experiment_id: int | None,
        is_chief: bool,
    ) -> None:
        self._shipper = shipper
        self._session = session
        self._trial_id = trial_id
        self._run_id = run_id
        self._experiment_id = experiment_id
        self._is_chief = is_chief
        # A validation sent since the last settle_validation(): the searcher may have
        # decided on it, and should_preempt() should hear that decision at once.
        self._validation_unsettled = False

    def report_training_metrics(self, steps_completed: int, metrics: Mapping[str, Any]) -> None:
        self.report_metrics("training", steps_completed, metrics)

    def report_validation_metrics(self, steps_completed: int, metrics: Mapping[str, Any]) -> None:
        self.report_metrics("validation", steps_completed, metrics)

    def report_metrics(self, group: str, steps_completed: int, metrics: Mapping[str, Any]) -> None:
        """Metrics of `group` after `steps_completed` batches. A second report for the same
        group and steps replaces the first (as after a restart from a checkpoint)."""
        if not isinstance(group, str) or not group:
            raise ValueError(f"group must be a non-empty string, got {group!r}")
        steps = check_steps(steps_completed)
        converted = convert_metrics(metrics)
        if not self._is_chief:
            return
        if self._shipper is None:
            logger.info("%s metrics after %d steps: %s", group, steps, converted)
            return
        body = {
            "group": group,
            "metrics": {
                "trialId": self._trial_id,
                "trialRunId": self._run_id,
                "stepsCompleted": steps,
                "metrics": {"avgMetrics": converted, "batchMetrics": None},
                "reportTime": None,
            },
        }
        call = f"report {group} metrics after {steps} steps"
        self._shipper.submit("POST", f"/api/v1/trials/{self._trial_id}/metrics", body, call)
        if group == "validation":
            self._validation_unsettled = True

    def report_progress(self, progress: float) -> None:
        """The fraction of the trial done, 0..1, shown by the CLI and web UI."""
        value = float(progress)
        if not math.isfinite(value) or not 0.0 <= value <= 1.0:
            raise ValueError(f"progress must be between 0 and 1, got {progress!r}")
        if not self._is_chief:
            return
        if self._shipper is None:
            logger.info("progress: %.1f%%", value * 100)
            return
        body = {"progress": value, "is_raw": True}
        call = f"report progress {value:.3f}"
        self._shipper.submit("POST", f"/api/v1/trials/{self._trial_id}/progress", body, call)

    def set_status(self, status: str) -> None:
        """A short free-text state of the training code (the trial's runnerState)."""
        if not isinstance(status, str):
            raise TypeError(f"status must be a string, got {type(status).__name__}")
        if not self._is_chief or self._shipper is None:
            return
        path = f"/api/v1/trials/{self._trial_id}/runner/metadata"
        self._shipper.submit("POST", path, {"state": status}, f"set status {status!r}")

    def flush(self) -> None:
        """Block until every report so far has reached the master; raise if one failed."""
        if self._shipper is not None:
            self._shipper.flush()

    def settle_validation(self) -> bool:
        """When a validation was reported since the last call: wait until it reached the
        master (whose searcher decides on it in the same transaction) and return True."""
        if not self._validation_unsettled:
            return False
        self._validation_unsettled = False
        try:
            self.flush()
        except ShippingError:
            return False  # raised again by the next report or by close(), where it belongs
        return True

    def get_experiment_best_validation(self) -> float | None:
        """The experiment's best searcher metric so far, None if none yet (or local mode)."""
        if self._session is None:
            return None
        path = f"/api/v1/experiments/{self._experiment_id}/searcher/best_searcher_validation_metric"
        try:
            reply = self._session.request("GET", path, call="get the best validation metric")
        except MasterError as exc:
            if exc.status == 404:
                return None
            raise
        metric = reply.get("metric")
        return float(metric) if isinstance(metric, int | float) else None
