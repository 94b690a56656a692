"""Preemption: whether the master wants this trial to stop (pause, scheduler preemption,
kill), so that training code can checkpoint and exit 0 instead of being killed."""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable
from typing import Any

from resolute._api import MasterError, Session

logger = logging.getLogger(__name__)

POLL_TIMEOUT_S = 60
CLIENT_TIMEOUT_S = 70.0
ERROR_PAUSE_S = 5.0


class PreemptContext:
    """`ctx.preempt`. The chief's daemon thread long-polls the master and latches the answer;
    should_preempt() reads the latch (plus one all-reduce when distributed). After a
    validation it first asks the master once itself: a searcher's stop decided on that
    validation is then heard at this check, not at the one after it (the long-poll's answer
    may still be on its way)."""

    def __init__(
        self,
        session: Session | None,
        allocation_id: str | None,
        settle_validation: Callable[[], bool] | None = None,
        ask_session: Session | None = None,
    ) -> None:
        self._flag = threading.Event()
        self._stop = threading.Event()
        self._session = session
        self._allocation_id = allocation_id
        self._settle_validation = settle_validation
        self._ask_session = ask_session
        self._thread: threading.Thread | None = None
        if session is not None and allocation_id:
            self._thread = threading.Thread(
                target=self._watch, name="resolute-preemption", daemon=True
            )
            self._thread.start()

    def should_preempt(self) -> bool:
        """True once the master asked this trial to stop; it stays True.

        When torch.distributed is initialized with more than one rank, the chief's answer is
        all-reduced so every rank gets the same one: it is then a collective, and every rank
        must call it at the same point of the loop (or the ranks hang)."""
        flag = self._flag.is_set()
        if not flag and self._settle_validation is not None and self._settle_validation():
            flag = self._ask_once()
        dist = _initialized_distributed()
        if dist is None or dist.get_world_size() <= 1:
            return flag
        import torch

        device = torch.device("cpu")
        if dist.get_backend() == "nccl":
            device = torch.device("cuda", torch.cuda.current_device())
        tensor = torch.tensor([1 if flag else 0], dtype=torch.int32, device=device)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return bool(tensor.item())

    def close(self) -> None:
        """Stop watching; closing the session wakes a thread blocked in a long-poll."""
        self._stop.set()
        if self._session is not None:
            self._session.close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _watch(self) -> None:
        assert self._session is not None
        path = f"/api/v1/allocations/{self._allocation_id}/signals/preemption"
        timeout = 0  # the first poll answers at once: a trial started while being preempted
        failed_before = False
        while not self._stop.is_set():
            try:
                reply = self._session.request(
                    "GET", f"{path}?timeout_seconds={timeout}", call="poll for preemption"
                )
            except MasterError as exc:
                if self._stop.is_set():
                    return
                # Keep watching: the master may come back, and training must not die of it.
                log = logger.debug if failed_before else logger.warning
                log("preemption watcher: %s; trying again in %.0f s", exc, ERROR_PAUSE_S)
                failed_before = True
                self._stop.wait(ERROR_PAUSE_S)
                continue
            failed_before = False
            timeout = POLL_TIMEOUT_S
            if isinstance(reply, dict) and reply.get("preempt") is True:
                logger.info("the master asked this trial to stop (preemption)")
                # Acknowledged before the flag is raised: a trial that sees the flag may
                # checkpoint and close the session at once, which would cut off the ack.
                self._acknowledge()
                self._flag.set()
                return

    def _ask_once(self) -> bool:
        """One poll that answers at once; the watcher thread keeps its own long-poll."""
        if self._ask_session is None or self._session is None or not self._allocation_id:
            return False  # not the chief, or local mode
        path = f"/api/v1/allocations/{self._allocation_id}/signals/preemption?timeout_seconds=0"
        try:
            reply = self._ask_session.request("GET", path, call="poll for preemption")
        except MasterError as exc:
            logger.debug("preemption check after a validation: %s", exc)
            return False
        if not (isinstance(reply, dict) and reply.get("preempt") is True):
            return False
        logger.info("the master asked this trial to stop (preemption)")
        self._acknowledge(self._ask_session)  # the poller is busy with its long-poll
        self._flag.set()
        return True

    def _acknowledge(self, session: Session | None = None) -> None:
        session = session or self._session
        assert session is not None
        path = f"/api/v1/allocations/{self._allocation_id}/signals/ack_preemption"
        try:
            session.request("POST", path, call="acknowledge preemption")
        except MasterError as exc:
            logger.warning("preemption watcher: %s", exc)


def _initialized_distributed() -> Any:
    """torch.distributed when the user's code imported and initialized it; never imports
    torch itself (a trial without torch must not pay for it)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    return dist
