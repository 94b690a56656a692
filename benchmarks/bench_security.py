"""Security benchmark (issue 15): what TLS and the password check cost, against real
`det-master` processes on SQLite with free ports, each measure beside the plain way in the
same run (rounds alternate which goes first; figures are pooled percentiles and medians).

    .venv/bin/python -m benchmarks.bench_security [--quick] [--rounds N] [--login-clients N]
        [--out PATH]

Prints one JSON document on stdout (progress on stderr): the machine, the parameters, and

- `tls`: two masters, one plain and one with a certificate from `det-master certs`
  (security.tls), the client verifying it against that CA:
  - `kept_alive`: GET /api/v1/me (a bearer token, so the token's database lookup is in it)
    on one kept-alive connection, 2,000 requests per master (`--quick`: 200);
  - `fresh_connection`: the same request on a new connection each time (connect, TLS
    handshake, request, close), 200 per master (`--quick`: 40); Python's ssl module does not
    resume sessions on its own, so each one is a full handshake;
  - TLS / plain ratios of p50 and p99, and the milliseconds TLS adds at p50.
- `login_load`: GET /health/live latency (a kept-alive client probing 100 times a second)
  while N clients (8; `--quick`: 4) log in back to back with right passwords as 4 users made
  through the API, against the same probe on the idle master. The clients run in a process
  of their own (this module with `--login-worker`), so the probe's timings are not theirs.
  Three windows per round: idle; logins on our master (PBKDF2 on a pool of cores - 1
  threads, `_hashing` in master/services/auth.py); logins on the naive master: the same
  `det-master` with `auth._hashing` replaced in its process by a function that runs the
  check on the event loop, what a master that hashed in its handler would do. Reported:
  probe p50/p99/max, logins/s, login latency and the master's CPU in each window, and the
  loaded / idle ratios.

The run-token scope check (access.check_task_scope) is not measured here.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import psutil

from benchmarks import common
from benchmarks.common import (
    free_port,
    host_facts,
    log_tail,
    percentile,
    progress,
    ratio,
    seconds_since_start,
    stop_process,
)
from master.core.credentials import client_side_hash
from master.services.auth import PBKDF2_ITERATIONS, hash_password, password_matches

DET_MASTER_BIN = Path(sys.executable).parent / "det-master"
START_TIMEOUT_S = 30.0
USERS = 4
PASSWORD = "bench-security-password"
LOGIN_WARMUP_S = 0.3  # logins running before the probe's window opens

# The naive master: `det-master` with the password check on its event loop. Only the
# module's reference is replaced; the rest of the process is the shipped master.
NAIVE_MASTER = """
import sys
import master.services.auth as auth

async def inline(function, *args, **kwargs):
    return function(*args, **kwargs)

auth._hashing = inline
from master.entry import main
sys.argv[0] = "det-master"
main()
"""


@dataclass(frozen=True)
class Params:
    rounds: int
    kept_alive_requests: int  # per master, over all rounds
    fresh_requests: int  # per master, over all rounds
    login_clients: int
    window_s: float  # each login-load window
    probe_interval_s: float


FULL = Params(5, 2000, 200, 8, 5.0, 0.01)
QUICK = Params(2, 200, 40, 4, 1.5, 0.01)


def params_of(args: argparse.Namespace) -> Params:
    base = QUICK if args.quick else FULL
    return Params(
        rounds=args.rounds or base.rounds,
        kept_alive_requests=base.kept_alive_requests,
        fresh_requests=base.fresh_requests,
        login_clients=args.login_clients or base.login_clients,
        window_s=base.window_s,
        probe_interval_s=base.probe_interval_s,
    )


def ms_summary(seconds: Sequence[float]) -> dict[str, Any]:
    return common.ms_summary(seconds, digits=3, mean=True)


# --- the masters -------------------------------------------------------------------------


class Master:
    """One `det-master` subprocess on SQLite in its own directory, on free ports; TLS when
    `certs` (a `det-master certs` directory) is given, `naive` for the inline password check."""

    def __init__(self, work: Path, name: str, certs: Path | None = None, naive: bool = False):
        self.name = name
        self.data_dir = work / name
        self.log = work / f"{name}.log"
        self.port = free_port()
        self.agent_port = free_port()
        self.url = f"{'https' if certs else 'http'}://127.0.0.1:{self.port}"
        self.certs = certs
        self.naive = naive
        # The client checks the master's certificate against the CA, as DET_MASTER_CERT_FILE.
        self.verify: ssl.SSLContext | bool = (
            ssl.create_default_context(cafile=str(certs / "ca.crt")) if certs else True
        )
        self.proc: subprocess.Popen[bytes] | None = None
        self.token = ""

    def start(self) -> None:
        self.data_dir.mkdir(parents=True)
        program = [sys.executable, "-c", NAIVE_MASTER] if self.naive else [str(DET_MASTER_BIN)]
        command = [
            *program,
            *("--port", str(self.port), "--agent-port", str(self.agent_port)),
            *("--data-dir", str(self.data_dir), "--host", "127.0.0.1"),
        ]
        env = {k: v for k, v in os.environ.items() if not k.startswith("DET_")}
        if self.certs is not None:
            env["DET_MASTER_SECURITY__TLS__CERT_FILE"] = str(self.certs / "master.crt")
            env["DET_MASTER_SECURITY__TLS__KEY_FILE"] = str(self.certs / "master.key")
        with self.log.open("ab") as sink:
            self.proc = subprocess.Popen(
                command, stdout=sink, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} master exited:\n{log_tail(self.log)}")
            with contextlib.suppress(httpx.HTTPError):
                reply = httpx.get(f"{self.url}/info", verify=self.verify, timeout=1.0)
                if reply.status_code == 200:
                    self.token = self.login("admin", "")
                    return
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"{self.name} master not ready after {START_TIMEOUT_S:.0f} s")

    def login(self, username: str, password: str) -> str:
        reply = httpx.post(
            f"{self.url}/api/v1/auth/login",
            json={"username": username, "password": password},
            verify=self.verify,
            timeout=30,
        )
        reply.raise_for_status()
        token: str = reply.json()["token"]
        return token

    def client(self, **kwargs: Any) -> httpx.Client:
        return httpx.Client(
            base_url=self.url,
            verify=self.verify,
            timeout=30,
            headers={"Authorization": f"Bearer {self.token}"},
            **kwargs,
        )

    def cpu_seconds(self) -> float:
        assert self.proc is not None
        times = psutil.Process(self.proc.pid).cpu_times()
        return float(times.user + times.system)

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        stop_process(proc)


def make_certs(directory: Path) -> Path:
    subprocess.run(
        [str(DET_MASTER_BIN), "certs", "--out", str(directory), "--host", "127.0.0.1"],
        check=True,
        capture_output=True,
    )
    return directory


# --- 1. TLS against plain HTTP -----------------------------------------------------------


def timed_gets(client: httpx.Client, path: str, count: int) -> tuple[list[float], int, str]:
    """`count` timed GETs; the latencies, the TCP connections opened for them (httpcore's
    trace events: none on a kept-alive connection, one each when fresh) and the TLS in use."""
    samples: list[float] = []
    connects = 0
    protocol = "none"

    def trace(event: str, info: dict[str, Any]) -> None:
        nonlocal connects, protocol
        if event == "connection.connect_tcp.complete":
            connects += 1
        elif event == "connection.start_tls.complete":
            tls = info["return_value"].get_extra_info("ssl_object")
            protocol = f"{tls.version()} {tls.cipher()[0]}"

    for _ in range(count):
        started = time.perf_counter()
        reply = client.get(path, extensions={"trace": trace})
        samples.append(time.perf_counter() - started)
        if reply.status_code != 200:
            raise RuntimeError(f"GET {path}: {reply.status_code} {reply.text[:200]}")
    return samples, connects, protocol


def kept_alive(master: Master, count: int) -> tuple[list[float], dict[str, Any]]:
    with master.client() as client:
        # The connection and its handshake, outside the timing.
        _, _, protocol = timed_gets(client, "/api/v1/me", 1)
        samples, connects, _ = timed_gets(client, "/api/v1/me", count)
    return samples, {"connections_opened": connects, "tls": protocol}


def fresh_connections(master: Master, count: int) -> tuple[list[float], dict[str, Any]]:
    # No idle connection kept: each request connects (and handshakes) anew.
    with master.client(limits=httpx.Limits(max_keepalive_connections=0)) as client:
        samples, connects, protocol = timed_gets(client, "/api/v1/me", count)
    return samples, {"connections_opened": connects, "tls": protocol}


def compare_tls(results: dict[str, list[list[float]]]) -> dict[str, Any]:
    plain = [s for round_ in results["plain"] for s in round_]
    tls = [s for round_ in results["tls"] for s in round_]
    summary = {"plain": ms_summary(plain), "tls": ms_summary(tls)}
    for variant in ("plain", "tls"):
        per_round = [percentile(sorted(r), 50) * 1000 for r in results[variant]]
        summary[variant]["round_p50_ms"] = [round(v, 3) for v in per_round]
        summary[variant]["median_of_round_p50_ms"] = round(statistics.median(per_round), 3)
    p, t = summary["plain"], summary["tls"]
    summary["tls_over_plain"] = {
        "p50": ratio(t["p50_ms"], p["p50_ms"]),
        "p99": ratio(t["p99_ms"], p["p99_ms"]),
        "added_p50_ms": round(t["p50_ms"] - p["p50_ms"], 3),
    }
    return summary


def bench_tls(plain: Master, tls: Master, params: Params) -> dict[str, Any]:
    measures = {"kept_alive": kept_alive, "fresh_connection": fresh_connections}
    counts = {"kept_alive": params.kept_alive_requests, "fresh_connection": params.fresh_requests}
    samples: dict[str, dict[str, list[list[float]]]] = {
        m: {"plain": [], "tls": []} for m in measures
    }
    facts: dict[str, dict[str, Any]] = {m: {} for m in measures}
    for round_ in range(params.rounds):
        # Alternate who goes first, so a drift in the machine's load hits both.
        order = (("plain", plain), ("tls", tls))
        for variant, master in order if round_ % 2 == 0 else order[::-1]:
            for name, measure in measures.items():
                taken, seen = measure(master, max(1, counts[name] // params.rounds))
                samples[name][variant].append(taken)
                expected = 0 if name == "kept_alive" else len(taken)
                if seen["connections_opened"] != expected:
                    raise RuntimeError(
                        f"{name} {variant}: {seen['connections_opened']} connections opened "
                        f"for {len(taken)} requests, not {expected}"
                    )
                facts[name][variant] = seen
            progress(
                f"tls round {round_} {variant}: kept-alive p50 "
                f"{percentile(sorted(samples['kept_alive'][variant][-1]), 50) * 1000:.2f} ms, "
                f"fresh p50 "
                f"{percentile(sorted(samples['fresh_connection'][variant][-1]), 50) * 1000:.2f} ms"
            )
    report: dict[str, Any] = {}
    for name in measures:
        report[name] = compare_tls(samples[name])
        report[name]["requests_per_master"] = sum(len(r) for r in samples[name]["plain"])
        report[name]["connections_opened_in_last_round"] = {
            v: facts[name][v]["connections_opened"] for v in ("plain", "tls")
        }
    report["negotiated"] = facts["kept_alive"]["tls"]["tls"]
    return report


# --- 2. logins under load ----------------------------------------------------------------


def create_users(master: Master) -> list[str]:
    """USERS users with PASSWORD, made by the admin through the API."""
    names = [f"bench-login-{i}" for i in range(USERS)]
    with master.client() as client:
        for name in names:
            reply = client.post(
                "/api/v1/users",
                json={
                    "user": {"username": name},
                    "password": client_side_hash(PASSWORD),
                    "isHashed": True,
                },
            )
            if reply.status_code != 200:
                raise RuntimeError(f"POST /api/v1/users {name}: {reply.status_code} {reply.text}")
    return names


async def login_worker(config: dict[str, Any]) -> None:
    """Clients logging in back to back until a line (or EOF) on stdin; then one JSON line
    with every login's completion time (CLOCK_MONOTONIC, comparable across processes)."""
    done: list[float] = []
    latencies: list[float] = []
    failures: dict[str, int] = {}
    stopping = asyncio.Event()
    password = client_side_hash(PASSWORD)

    async def client(index: int, warm: asyncio.Event) -> None:
        body = {"username": config["users"][index % len(config["users"])]}
        body |= {"password": password, "isHashed": True}
        async with httpx.AsyncClient(base_url=config["url"], timeout=60) as http:
            while not stopping.is_set():
                started = time.monotonic()
                reply = await http.post("/api/v1/auth/login", json=body)
                now = time.monotonic()
                if reply.status_code == 200:
                    done.append(now)
                    latencies.append(now - started)
                else:
                    failures[str(reply.status_code)] = failures.get(str(reply.status_code), 0) + 1
                warm.set()

    warmed = [asyncio.Event() for _ in range(config["clients"])]
    tasks = [asyncio.create_task(client(i, w)) for i, w in enumerate(warmed)]
    await asyncio.gather(*(w.wait() for w in warmed))
    print("ready", flush=True)
    await asyncio.to_thread(sys.stdin.readline)
    stopping.set()
    await asyncio.gather(*tasks)
    times = psutil.Process().cpu_times()
    result = {
        "done": done,
        "latencies": latencies,
        "failures": failures,
        "cpu_s": times.user + times.system,
    }
    print(json.dumps(result), flush=True)


def probe(master: Master, seconds: float, interval: float) -> tuple[list[float], float, float]:
    """GET /health/live every `interval` for `seconds` on a kept-alive connection; a late
    probe is not made up for (no bursts). The latencies and the window (monotonic)."""
    samples: list[float] = []
    with master.client() as client:
        client.get("/health/live").raise_for_status()
        start = due = time.monotonic()
        end = start + seconds
        while (now := time.monotonic()) < end:
            if due > now:
                time.sleep(due - now)
            started = time.perf_counter()
            reply = client.get("/health/live")
            samples.append(time.perf_counter() - started)
            if reply.status_code != 200:
                raise RuntimeError(f"GET /health/live: {reply.status_code}")
            due = max(due + interval, time.monotonic())
    return samples, start, end


def window(master: Master, users: list[str] | None, params: Params) -> dict[str, Any]:
    """One probe window on `master`; with `users`, while the login clients run."""
    worker: subprocess.Popen[str] | None = None
    if users is not None:
        config = {"url": master.url, "users": users, "clients": params.login_clients}
        worker = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "benchmarks.bench_security",
                "--login-worker",
                json.dumps(config),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=Path(__file__).resolve().parent.parent,
        )
    try:
        if worker is not None:
            assert worker.stdout is not None
            if worker.stdout.readline().strip() != "ready":
                raise RuntimeError("the login worker did not start")
            time.sleep(LOGIN_WARMUP_S)
        cpu_before = master.cpu_seconds()
        samples, start, end = probe(master, params.window_s, params.probe_interval_s)
        cpu = master.cpu_seconds() - cpu_before
        figures: dict[str, Any] = {
            "probe": samples,
            "master_cpu_fraction_of_one_core": round(cpu / (end - start), 3),
        }
        if worker is not None:
            out, _ = worker.communicate("stop\n", timeout=120)
            logins = json.loads(out.strip().splitlines()[-1])
            in_window = [t for t in logins["done"] if start <= t < end]
            figures |= {
                "logins_per_s": round(len(in_window) / (end - start), 1),
                "login_latencies": logins["latencies"],
                "login_failures": logins["failures"],
                "logins_total": len(logins["done"]),
                "login_worker_cpu_s": round(logins["cpu_s"], 2),
            }
        return figures
    finally:
        if worker is not None and worker.poll() is None:
            worker.kill()
        if worker is not None:
            worker.wait()


def bench_logins(ours: Master, naive: Master, params: Params) -> dict[str, Any]:
    users = {"ours": create_users(ours), "naive": create_users(naive)}
    variants = {
        "idle": (ours, None),
        "logins_ours_pbkdf2_in_thread": (ours, users["ours"]),
        "logins_naive_pbkdf2_on_event_loop": (naive, users["naive"]),
    }
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    names = list(variants)
    for round_ in range(params.rounds):
        # Rotate the order, so no variant always follows the same one.
        for name in names[round_ % 3 :] + names[: round_ % 3]:
            master, login_as = variants[name]
            runs[name].append(window(master, login_as, params))
            last = runs[name][-1]
            ordered = sorted(last["probe"])
            progress(
                f"logins round {round_} {name}: probe p50 {percentile(ordered, 50) * 1000:.2f} "
                f"ms, p99 {percentile(ordered, 99) * 1000:.2f} ms"
                + (f", {last['logins_per_s']} logins/s" if "logins_per_s" in last else "")
            )
    report: dict[str, Any] = {}
    for name, windows in runs.items():
        probes = [s for w in windows for s in w["probe"]]
        entry: dict[str, Any] = {
            "probe_health_live": ms_summary(probes),
            "probe_round_p99_ms": [
                round(percentile(sorted(w["probe"]), 99) * 1000, 3) for w in windows
            ],
            "master_cpu_fraction_of_one_core_median": round(
                statistics.median(w["master_cpu_fraction_of_one_core"] for w in windows), 3
            ),
        }
        if name != "idle":
            entry |= {
                "logins_per_s_median": statistics.median(w["logins_per_s"] for w in windows),
                "logins_per_s_rounds": [w["logins_per_s"] for w in windows],
                "login_latency": ms_summary([s for w in windows for s in w["login_latencies"]]),
                "login_failures": sum(sum(w["login_failures"].values()) for w in windows),
                "login_worker_cpu_s": [w["login_worker_cpu_s"] for w in windows],
            }
        report[name] = entry
    idle = report["idle"]["probe_health_live"]
    for name in names[1:]:
        loaded = report[name]["probe_health_live"]
        report[name]["probe_over_idle"] = {
            "p50": ratio(loaded["p50_ms"], idle["p50_ms"]),
            "p99": ratio(loaded["p99_ms"], idle["p99_ms"]),
        }
    report["pbkdf2_check_ms_in_this_process"] = pbkdf2_ms()
    return report


def pbkdf2_ms() -> float:
    """One password check's CPU time here: how long the naive master's loop stops per login."""
    stored = hash_password(PASSWORD)
    times = []
    for _ in range(5):
        started = time.process_time()
        assert password_matches(stored, PASSWORD, is_hashed=False)
        times.append(time.process_time() - started)
    return round(statistics.median(times) * 1000, 2)


# --- the run -----------------------------------------------------------------------------


def run(args: argparse.Namespace) -> dict[str, Any]:
    params = params_of(args)
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    progress(f"{'quick' if args.quick else 'full'} run: {params}")
    report: dict[str, Any] = {
        "benchmark": "security: TLS against plain HTTP, and logins against an idle master",
        "mode": "quick" if args.quick else "full",
        "command": " ".join(["python -m benchmarks.bench_security", *sys.argv[1:]]),
        "started_at": started_at,
        "machine": host_facts(("httpx", "httpcore", "uvicorn", "fastapi", "cryptography")),
        "parameters": asdict(params)
        | {"users": USERS, "pbkdf2_iterations": PBKDF2_ITERATIONS, "openssl": ssl.OPENSSL_VERSION},
    }
    with tempfile.TemporaryDirectory(prefix="resolute-bench-security-") as scratch:
        work = Path(scratch)
        certs = make_certs(work / "certs")
        masters = [
            Master(work, "plain"),
            Master(work, "tls", certs=certs),
            Master(work, "naive", naive=True),
        ]
        try:
            for master in masters:
                progress(f"starting the {master.name} master ({master.url})")
                master.start()
            plain, tls, naive = masters
            report["tls"] = bench_tls(plain, tls, params)
            report["login_load"] = bench_logins(plain, naive, params)
        except BaseException:
            for master in masters:
                progress(f"{master.name} master log:\n{log_tail(master.log, 1200)}")
            raise
        finally:
            for master in masters:
                master.stop()
    report["total_seconds"] = round(seconds_since_start(), 1)
    report["notes"] = [
        "Each master is a det-master subprocess on SQLite (WAL) on this machine; the client "
        "shares the machine's cores with it.",
        "tls: the client verifies the master's certificate against the CA det-master certs "
        "made; fresh connections are full handshakes (no session resumption).",
        "login_load: the login clients run in a separate process; login 429s would count as "
        "failures (the rate limit counts only failed logins; none are expected). A late probe "
        "is not made up for, so a stalled event loop also shows as fewer probes (n).",
        "The run-token scope check (access.check_task_scope) is not measured here.",
    ]
    return report


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_security",
        description="Security benchmark (TLS, logins); prints one JSON document on stdout.",
    )
    parser.add_argument("--quick", action="store_true", help="a small run, under ~30 s")
    parser.add_argument("--rounds", type=int, help="alternating rounds (default 5; quick 2)")
    parser.add_argument("--login-clients", type=int, help="concurrent logins (default 8)")
    parser.add_argument("--out", type=Path, help="also write the JSON document here")
    # Internal: the login clients run this module in a process of their own.
    parser.add_argument("--login-worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for name in ("rounds", "login_clients"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, not {value}")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.login_worker is not None:
        asyncio.run(login_worker(json.loads(args.login_worker)))
        return
    common.emit_report(run(args), args.out, indent=1)


if __name__ == "__main__":
    main()
