"""What a TensorBoard task runs on its agent: event files from the master's stored metrics,
then TensorBoard over them, kept current while it runs.

    python3 -m resolute.tensorboard_task --port PORT --path-prefix /proxy/<task> \
        [EXP ...] [--trial TRIAL ...]

Whole experiments, and single trials of others (Determined's `det tensorboard start -t`).

It reads DET_MASTER and DET_SESSION_TOKEN (the task owner's access) and writes one run per
trial, `experiment_<e>/trial_<t>`, with tags `<group>/<metric>` (`training/loss`,
`validation/accuracy`). Event files a trial wrote itself into a shared_fs checkpoint store
(`<host_path>/<storage_path>/[<cluster id>/]tensorboard/experiment/<e>/trial/<t>/`) are
linked in as the run `experiment_<e>/trial_<t>/written`. Agents have no master code: this
needs only httpx and resolute.tfevents.

Three layers, so the first can be tested without a network or a TensorBoard: `LogDir`
(rows in, event files out, remembering what it wrote), `Master` (the three GETs), and
`serve` (the TensorBoard child, its signals and the refresh loop).
"""

from __future__ import annotations

import argparse
import datetime
import logging
import math
import os
import signal
import ssl
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

import httpx

from resolute._api import tls_context
from resolute.tfevents import EventFileWriter, report_scalars

log = logging.getLogger("resolute.tensorboard_task")

PAGE_SIZE = 500  # trials per page of /experiments/{id}/trials
# JSON has no NaN or infinity: the master stores and sends them as these strings.
_NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}

Point = tuple[str, float, int, float]  # tag, value, step, wall time


# --- rows to event files (no I/O but the files) -------------------------------------------


def report_time(value: str) -> float:
    """The master's `reportTime` (ISO 8601, UTC) as a Unix time; no zone means UTC."""
    moment = datetime.datetime.fromisoformat(value)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return moment.timestamp()


def row_points(row: Mapping[str, Any]) -> list[Point]:
    """One MetricRow's scalars: non-finite values come back as numbers, and what is not a
    number (text, lists, null) is left out by report_scalars."""
    metrics = {
        name: _NON_FINITE.get(value, value) if isinstance(value, str) else value
        for name, value in (row.get("metrics") or {}).items()
    }
    return report_scalars(
        str(row["group"]), int(row["stepsCompleted"]), report_time(str(row["reportTime"])), metrics
    )


class LogDir:
    """The trials' event files under `root`. It remembers each (trial, group, step) it has
    written, so fetching every row again and passing them all in appends only new ones;
    a restarted trial's second report of a step is not written twice."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._seen: set[tuple[int, str, int]] = set()
        # One open file per run, appended to: TensorBoard tails a run's newest file.
        self._writers: dict[tuple[int, int], EventFileWriter] = {}

    def run_dir(self, experiment_id: int, trial_id: int) -> Path:
        return self.root / f"experiment_{experiment_id}" / f"trial_{trial_id}"

    def new_rows(self, trial_id: int, rows: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
        """The rows not written yet (the first of duplicates within `rows`); marks nothing."""
        fresh: list[Mapping[str, Any]] = []
        keys: set[tuple[int, str, int]] = set()
        for row in rows:
            key = (trial_id, str(row["group"]), int(row["stepsCompleted"]))
            if key not in self._seen and key not in keys:
                keys.add(key)
                fresh.append(row)
        return fresh

    def add(self, experiment_id: int, trial_id: int, rows: Iterable[Mapping[str, Any]]) -> int:
        """Appends the new rows' scalars to the trial's run; returns how many were written.
        Rows are marked written only once they are in the file."""
        fresh = self.new_rows(trial_id, rows)
        points = [point for row in fresh for point in row_points(row)]
        if points:
            key = (experiment_id, trial_id)
            writer = self._writers.get(key)
            if writer is None:
                writer = self._writers[key] = EventFileWriter(self.run_dir(*key))
            writer.add_scalars(points)
            writer.flush()
        self._seen.update((trial_id, str(r["group"]), int(r["stepsCompleted"])) for r in fresh)
        return len(points)

    def link_written(self, experiment_id: int, trial_id: int, candidates: Sequence[Path]) -> bool:
        """Links the first existing directory of `candidates` as the run's `written`; True
        if the link is there. Absent directories are no error: the trial wrote none."""
        link = self.run_dir(experiment_id, trial_id) / "written"
        if link.is_symlink() or link.exists():
            return True
        for source in candidates:
            if source.is_dir():
                link.parent.mkdir(parents=True, exist_ok=True)
                link.symlink_to(source.resolve(), target_is_directory=True)
                return True
        return False

    def close(self) -> None:
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()


def written_by_trial(
    config: Mapping[str, Any], cluster_id: str, experiment_id: int, trial_id: int
) -> list[Path]:
    """Where a trial's own event files would be in a shared_fs store, most likely first:
    Determined's harness puts them under the cluster id, then the plain layout."""
    storage = config.get("checkpoint_storage")
    if not isinstance(storage, Mapping) or storage.get("type") != "shared_fs":
        return []
    host_path = storage.get("host_path")
    if not isinstance(host_path, str) or not host_path:
        return []
    # An absolute storage_path replaces host_path, as pathlib (and Determined) join them.
    base = Path(host_path) / str(storage.get("storage_path") or "")
    tail = Path("tensorboard", "experiment", str(experiment_id), "trial", str(trial_id))
    return ([base / cluster_id / tail] if cluster_id else []) + [base / tail]


# --- the master ---------------------------------------------------------------------------


class MasterError(Exception):
    """A GET failed: the master refused it (`status` set) or could not be reached."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class Master:
    """The three reads the task needs, as the task's owner (a bearer token)."""

    def __init__(
        self,
        url: str,
        token: str,
        *,
        verify: ssl.SSLContext | bool = True,
        server_name: str | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        self.url = url.rstrip("/") if "://" in url else f"http://{url.rstrip('/')}"
        self._extensions = {"sni_hostname": server_name} if server_name else None
        self._client = httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"Bearer {token}"},
            verify=verify,
            timeout=timeout_s,
        )

    def close(self) -> None:
        self._client.close()

    def get(self, path: str, params: Mapping[str, Any] | None = None) -> Any:
        try:
            reply = self._client.get(path, params=params, extensions=self._extensions)
        except httpx.HTTPError as exc:
            raise MasterError(f"cannot reach the master at {self.url}: {exc}") from None
        if reply.status_code != 200:
            try:
                body = reply.json()
            except ValueError:
                body = None
            message = body.get("message") if isinstance(body, dict) else None
            text = message if isinstance(message, str) else reply.text[:500]
            raise MasterError(
                f"GET {path}: the master answered {reply.status_code}: {text}", reply.status_code
            )
        try:
            return reply.json()
        except ValueError:
            raise MasterError(f"GET {path}: the master's answer is not JSON") from None

    def experiment_config(self, experiment_id: int) -> Mapping[str, Any]:
        config = self.get(f"/api/v1/experiments/{experiment_id}")["experiment"].get("config")
        return config if isinstance(config, Mapping) else {}

    def trial_ids(self, experiment_id: int) -> list[int]:
        """Every trial of the experiment, page by page."""
        ids: list[int] = []
        offset = 0
        while True:
            page = self.get(
                f"/api/v1/experiments/{experiment_id}/trials",
                {"offset": offset, "limit": PAGE_SIZE},
            )
            ids += [int(trial["id"]) for trial in page["trials"]]
            end = int(page["pagination"]["endIndex"])
            if not page["trials"] or end <= offset or end >= int(page["pagination"]["total"]):
                return ids
            offset = end

    def trial_experiment(self, trial_id: int) -> int:
        return int(self.get(f"/api/v1/trials/{trial_id}")["trial"]["experimentId"])

    def metric_rows(self, trial_id: int) -> list[Mapping[str, Any]]:
        rows: list[Mapping[str, Any]] = self.get(f"/api/v1/trials/{trial_id}/metrics")["metrics"]
        return rows


def sources(
    master: Master, experiment_ids: Sequence[int], trial_ids: Sequence[int]
) -> dict[int, set[int] | None]:
    """What to show, by experiment: None for all its trials, else the trials asked for."""
    shown: dict[int, set[int] | None] = dict.fromkeys(experiment_ids)
    for trial_id in dict.fromkeys(trial_ids):
        experiment_id = master.trial_experiment(trial_id)
        if experiment_id not in shown:
            shown[experiment_id] = set()
        picked = shown[experiment_id]
        if picked is not None:
            picked.add(trial_id)
    return shown


def sync_experiment(
    master: Master,
    logdir: LogDir,
    experiment_id: int,
    cluster_id: str = "",
    only: set[int] | None = None,
) -> tuple[int, int]:
    """The experiment's trials (or those in `only`) and new reports into `logdir`:
    (trials, points written)."""
    config = master.experiment_config(experiment_id)
    trial_ids = master.trial_ids(experiment_id) if only is None else sorted(only)
    points = 0
    for trial_id in trial_ids:
        points += logdir.add(experiment_id, trial_id, master.metric_rows(trial_id))
        logdir.link_written(
            experiment_id, trial_id, written_by_trial(config, cluster_id, experiment_id, trial_id)
        )
    return len(trial_ids), points


# --- the TensorBoard process --------------------------------------------------------------


def tensorboard_command(logdir: Path, port: int, path_prefix: str) -> list[str]:
    prefix = path_prefix.strip("/")
    return [
        sys.executable,
        "-m",
        "tensorboard.main",
        "--logdir",
        str(logdir),
        "--port",
        str(port),
        "--host",
        "0.0.0.0",
        "--path_prefix",
        f"/{prefix}" if prefix else "",
        "--reload_interval",
        "5",
    ]


def serve(command: Sequence[str], refresh: Callable[[], None], refresh_s: float) -> int:
    """Runs TensorBoard, calling `refresh` every `refresh_s` until it exits; SIGTERM and
    SIGINT go to it. Returns its exit code (128 + N if signal N killed it), 0 when it died
    of the signal it was asked to stop with: TensorBoard exits 0 on SIGTERM, but the agent
    signals the whole process group, so it may get a second one, forwarded, mid-exit."""
    board = subprocess.Popen(list(command))
    exited = threading.Event()
    asked: set[int] = set()

    def reap() -> None:
        board.wait()
        exited.set()

    def forward(signum: int, _frame: FrameType | None) -> None:
        asked.add(signum)
        if board.poll() is None:
            board.send_signal(signum)

    threading.Thread(target=reap, name="tensorboard-wait", daemon=True).start()
    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        while not exited.wait(refresh_s):
            try:
                refresh()
            except Exception as exc:  # a master away for a while must not stop TensorBoard
                log.warning("refresh failed, retrying in %g s: %s", refresh_s, exc)
        code = board.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if code < 0:
        return 0 if -code in asked else 128 - code
    return code


# --- entry point --------------------------------------------------------------------------


def _master_from_env() -> Master:
    """The master and token the agent gave the task; SystemExit(2) if it gave none."""
    url = os.environ.get("DET_MASTER", "").strip()
    token = os.environ.get("DET_SESSION_TOKEN", "").strip()
    missing = [name for name, v in (("DET_MASTER", url), ("DET_SESSION_TOKEN", token)) if not v]
    if missing:
        sys.stderr.write(f"tensorboard task: {' and '.join(missing)} not set in the environment\n")
        raise SystemExit(2)
    if not url.lower().startswith("https://"):
        return Master(url, token)  # a stale DET_MASTER_CERT_FILE must not break plain http
    try:
        context, server_name = tls_context()  # DET_MASTER_CERT_FILE, as the harness reads it
    except ValueError as exc:
        sys.stderr.write(f"tensorboard task: {exc}\n")
        raise SystemExit(2) from None
    return Master(url, token, verify=context, server_name=server_name)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python3 -m resolute.tensorboard_task",
        description="TensorBoard over experiments' and trials' metrics, read from the master "
        "(DET_MASTER, DET_SESSION_TOKEN, DET_MASTER_CERT_FILE).",
    )
    parser.add_argument("experiment_ids", type=int, nargs="*", metavar="EXPERIMENT_ID")
    parser.add_argument(
        "--trial", type=int, action="append", default=[], dest="trial_ids", metavar="TRIAL_ID"
    )
    parser.add_argument("--port", type=int, required=True, help="TensorBoard's port")
    parser.add_argument("--path-prefix", default="", help="URL prefix, e.g. /proxy/<task id>")
    parser.add_argument("--logdir", type=Path, default=Path("tensorboard"))
    parser.add_argument(
        "--refresh-s", type=float, default=10.0, help="seconds between metric refreshes"
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.refresh_s <= 0:
        sys.stderr.write("tensorboard task: --refresh-s must be positive\n")
        return 2
    if not args.experiment_ids and not args.trial_ids:
        sys.stderr.write("tensorboard task: name at least one experiment or --trial\n")
        return 2
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request otherwise
    master = _master_from_env()
    cluster_id = os.environ.get("DET_CLUSTER_ID", "")
    logdir = LogDir(args.logdir)
    try:
        try:
            shown = sources(master, args.experiment_ids, args.trial_ids)
        except MasterError as exc:
            sys.stderr.write(f"tensorboard task: {exc}\n")
            return 1
        for experiment_id, only in shown.items():
            try:
                trials, points = sync_experiment(master, logdir, experiment_id, cluster_id, only)
            except MasterError as exc:
                sys.stderr.write(f"tensorboard task: experiment {experiment_id}: {exc}\n")
                return 1
            log.info("experiment %d: %d trials, %d metric points", experiment_id, trials, points)

        def refresh() -> None:
            for experiment_id, only in shown.items():
                _, points = sync_experiment(master, logdir, experiment_id, cluster_id, only)
                if points:
                    log.info("experiment %d: %d new metric points", experiment_id, points)

        command = tensorboard_command(args.logdir, args.port, args.path_prefix)
        log.info("starting TensorBoard on port %d over %s", args.port, args.logdir)
        sys.stdout.flush()
        return serve(command, refresh, args.refresh_s)
    finally:
        logdir.close()
        master.close()


if __name__ == "__main__":
    sys.exit(main())
