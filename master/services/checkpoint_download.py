"""A checkpoint's files as a tar.gz stream, fetched from its store one file at a time
(Determined's `GET /api/v1/checkpoints/{uuid}` with `Accept: application/gzip`, which its
SDK and `det checkpoint download --mode master` use).

The store's clients block, so a worker thread fetches and compresses; it hands chunks to
the response through a small bounded queue, so a slow client slows the fetch instead of
filling the master's memory, and a client that goes away stops it.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import tarfile
import threading
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from master.errors import NotFound, Unavailable
from master.services import checkpoint_gc, experiments, trial_reports
from resolute.storage import StorageError, from_config

CHUNK = 1024 * 1024
QUEUE_CHUNKS = 8
_DONE = object()


class _Cancelled(Exception):
    pass


class _QueueWriter:
    """A file object for tarfile that hands its bytes to the response in chunks."""

    def __init__(self, out: queue.Queue[object], cancelled: threading.Event) -> None:
        self._out = out
        self._cancelled = cancelled
        self._buffer = bytearray()

    def write(self, data: bytes) -> int:
        self._buffer += data
        while len(self._buffer) >= CHUNK:
            self.put(bytes(self._buffer[:CHUNK]))
            del self._buffer[:CHUNK]
        return len(data)

    def flush(self) -> None:
        if self._buffer:
            self.put(bytes(self._buffer))
            self._buffer.clear()

    def put(self, chunk: object) -> None:
        while True:
            if self._cancelled.is_set():
                raise _Cancelled
            with contextlib.suppress(queue.Full):
                self._out.put(chunk, timeout=0.5)
                return


def _produce(
    files: Iterator[tuple[str, int, Any]], writer: _QueueWriter, out: queue.Queue[object]
) -> None:
    try:
        with tarfile.open(fileobj=writer, mode="w|gz") as tar:  # type: ignore[call-overload]
            for rel, size, path in files:
                info = tarfile.TarInfo(rel)
                info.size = size
                info.mode = 0o644
                with open(path, "rb") as data:
                    tar.addfile(info, data)
        writer.flush()
    except _Cancelled:
        return
    except Exception as exc:  # the response is under way: all we can do is end it short
        out.put(exc)
        return
    with contextlib.suppress(_Cancelled):
        writer.put(_DONE)


async def tar_stream(storage: Mapping[str, Any], uuid: str) -> AsyncIterator[bytes]:
    """Check the store answers (else 503, before any byte is sent), then stream."""

    try:
        files = await asyncio.to_thread(lambda: from_config(storage).files(uuid))
        # Listing happens on the first step; do it here so an outage is a 503.
        first = await asyncio.to_thread(next, files, None)
    except (StorageError, ValueError) as exc:
        raise Unavailable(f"checkpoint {uuid}: its storage cannot be read now: {exc}") from None

    def everything() -> Iterator[tuple[str, int, Any]]:
        if first is not None:
            yield first
        yield from files

    out: queue.Queue[object] = queue.Queue(maxsize=QUEUE_CHUNKS)
    cancelled = threading.Event()
    writer = _QueueWriter(out, cancelled)
    worker = threading.Thread(target=_produce, args=(everything(), writer, out), daemon=True)
    worker.start()

    async def chunks() -> AsyncIterator[bytes]:
        try:
            while True:
                item = await asyncio.to_thread(out.get)
                if item is _DONE:
                    return
                if isinstance(item, Exception):
                    raise item
                assert isinstance(item, bytes)
                yield item
        finally:
            cancelled.set()

    return chunks()


async def checkpoint_archive(session: AsyncSession, uuid: str) -> tuple[str, AsyncIterator[bytes]]:
    """A stored checkpoint's file name and tar.gz stream (the API's download and the
    dashboard's link); 404 once its files are being deleted."""
    row = await trial_reports.get_checkpoint(session, uuid)
    if row.state != checkpoint_gc.ACTIVE:
        shown = checkpoint_gc.SHOWN.get(row.state, row.state)
        raise NotFound(f"checkpoint {row.uuid} is {shown}: its files are (being) deleted")
    experiment = (await experiments.get_experiment(session, row.experiment_id)).experiment
    stream = await tar_stream(experiment.config.get("checkpoint_storage") or {}, row.uuid)
    return f"{row.uuid}.tar.gz", stream
