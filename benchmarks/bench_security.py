"""Security benchmark (issue 15): what TLS and the password check cost, against real
`det-master` processes on SQLite with free ports, each measure beside the plain way in the
same run (rounds alternate which goes first; figures are pooled percentiles and medians).

    .venv/bin/python -m benchmarks.bench_security [--quick | --smoke] [--rounds N]
        [--login-clients N] [--out PATH]

Prints one JSON document on stdout (progress on stderr): the machine, the parameters, and

- `tls`: two masters, one plain and one with a certificate from `det-master certs`
  (security.tls), the client verifying it against that CA:
  - `kept_alive`: GET /api/v1/me (a bearer token, so the token's database lookup is in it)
    on one kept-alive connection, 2,000 requests per master (`--quick`: 200; `--smoke`: 10);
  - `fresh_connection`: the same request on a new connection each time (connect, TLS
    handshake, request, close), 200 per master (`--quick`: 40; `--smoke`: 5); Python's ssl
    module does not resume sessions on its own, so each one is a full handshake;
  - TLS / plain ratios of p50 and p99, and the milliseconds TLS adds at p50.
- `login_load`: GET /health/live latency (a kept-alive client probing 100 times a second)
  while N clients (8; `--quick`: 4; `--smoke`: 2) log in back to back with right passwords
  as 4 users made through the API, against the same probe on the idle master. The clients
  run in a process of their own (this module with `--login-worker`), so the probe's timings
  are not theirs. Three windows per round: idle; logins on our master (PBKDF2 on a pool of
  cores - 1 threads, `_hashing` in master/services/auth.py); logins on the naive master:
  the same `det-master` with `auth._hashing` replaced in its process by a function that runs
  the check on the event loop, what a master that hashed in its handler would do.
  Reported: probe p50/p99/max, logins/s, login latency and the master's CPU in each window,
  and the loaded / idle ratios.

The run-token scope check (access.check_task_scope) is not measured here.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import psutil

from benchmarks import common
from benchmarks.common import host_facts, progress, seconds_since_start
from harness.cluster import START_TIMEOUT_S, MasterProcess
from harness.figures import ms_summary, percentile, ratio
from master.core.credentials import client_side_hash

# master.services.auth (and the database layer under it) is imported where it is used, not
# here: the login workers import this module, and start in a fraction of the time without it.

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
# The least that runs every path: one round, a few requests, two login clients; windows of
# 0.4 s, so that a loaded machine still completes logins inside each (a login under the
# suite's load: about 0.1 s).
SMOKE = Params(1, 10, 5, 2, 0.4, 0.01)


def params_of(args: argparse.Namespace) -> Params:
    base = {"full": FULL, "quick": QUICK, "smoke": SMOKE}[common.mode_of(args)]
    return Params(
        rounds=args.rounds or base.rounds,
        kept_alive_requests=base.kept_alive_requests,
        fresh_requests=base.fresh_requests,
        login_clients=args.login_clients or base.login_clients,
        window_s=base.window_s,
        probe_interval_s=base.probe_interval_s,
    )


# --- the masters -------------------------------------------------------------------------


class Master(MasterProcess):
    """One `det-master` subprocess on SQLite in its own directory, on free ports; TLS when
    `certs` (a `det-master certs` directory) is given, `naive` for the inline password check.
    Signed in as admin once started."""

    def __init__(self, work: Path, name: str, certs: Path | None = None, naive: bool = False):
        env = {}
        if certs is not None:
            env["DET_MASTER_SECURITY__TLS__CERT_FILE"] = str(certs / "master.crt")
            env["DET_MASTER_SECURITY__TLS__KEY_FILE"] = str(certs / "master.key")
        super().__init__(
            work / name,
            label=name,
            env=env,
            program=[sys.executable, "-c", NAIVE_MASTER] if naive else (),
            scheme="https" if certs else "http",
            # The client checks the master's certificate against the CA, as
            # DET_MASTER_CERT_FILE.
            verify=ssl.create_default_context(cafile=str(certs / "ca.crt")) if certs else True,
        )
        self.name = name
        self.token = ""

    def start(self, timeout: float = START_TIMEOUT_S) -> None:
        super().start(timeout)
        self.token = self.login("admin", "")

    def admin_client(self, **kwargs: Any) -> httpx.Client:
        """A client signed in as admin (the token start() got)."""
        return self.client(self.token, **kwargs)

    def cpu_seconds(self) -> float:
        times = psutil.Process(self.pid).cpu_times()
        return float(times.user + times.system)


def make_certs(directory: Path) -> Path:
    """What `det-master certs --out DIRECTORY --host 127.0.0.1` makes, made in this process
    (the command's own start-up would compete with the masters')."""
    from master import certs

    certs.generate(directory, ["127.0.0.1"])
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
    with master.admin_client() as client:
        # The connection and its handshake, outside the timing.
        _, _, protocol = timed_gets(client, "/api/v1/me", 1)
        samples, connects, _ = timed_gets(client, "/api/v1/me", count)
    return samples, {"connections_opened": connects, "tls": protocol}


def fresh_connections(master: Master, count: int) -> tuple[list[float], dict[str, Any]]:
    # No idle connection kept: each request connects (and handshakes) anew.
    with master.admin_client(limits=httpx.Limits(max_keepalive_connections=0)) as client:
        samples, connects, protocol = timed_gets(client, "/api/v1/me", count)
    return samples, {"connections_opened": connects, "tls": protocol}


def compare_tls(results: dict[str, list[list[float]]]) -> dict[str, Any]:
    plain = [s for round_ in results["plain"] for s in round_]
    tls = [s for round_ in results["tls"] for s in round_]
    summary = {
        "plain": ms_summary(plain, digits=3, mean=True),
        "tls": ms_summary(tls, digits=3, mean=True),
    }
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
    with master.admin_client() as client:
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
    with master.admin_client() as client:
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
    # Both masters hash the new users' passwords at once (setup, not timed).
    with ThreadPoolExecutor(2) as pool:
        made = {"ours": pool.submit(create_users, ours), "naive": pool.submit(create_users, naive)}
        users = {name: future.result() for name, future in made.items()}
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
            "probe_health_live": ms_summary(probes, digits=3, mean=True),
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
                "logins_total": sum(w["logins_total"] for w in windows),
                "login_latency": ms_summary(
                    [s for w in windows for s in w["login_latencies"]], digits=3, mean=True
                ),
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
    from master.services.auth import hash_password, password_matches

    stored = hash_password(PASSWORD)
    times = []
    for _ in range(5):
        started = time.process_time()
        assert password_matches(stored, PASSWORD, is_hashed=False)
        times.append(time.process_time() - started)
    return round(statistics.median(times) * 1000, 2)


# --- the run -----------------------------------------------------------------------------


def run(args: argparse.Namespace) -> dict[str, Any]:
    from master.services.auth import PBKDF2_ITERATIONS

    params = params_of(args)
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    progress(f"{common.mode_of(args)} run: {params}")
    report: dict[str, Any] = {
        "benchmark": "security: TLS against plain HTTP, and logins against an idle master",
        "mode": common.mode_of(args),
        "command": " ".join(["python -m benchmarks.bench_security", *sys.argv[1:]]),
        "started_at": started_at,
        "machine": host_facts(("httpx", "httpcore", "uvicorn", "fastapi", "cryptography")),
        "parameters": asdict(params)
        | {"users": USERS, "pbkdf2_iterations": PBKDF2_ITERATIONS, "openssl": ssl.OPENSSL_VERSION},
    }
    with tempfile.TemporaryDirectory(prefix="resolute-bench-security-") as scratch:
        work = Path(scratch)
        plain, naive = Master(work, "plain"), Master(work, "naive", naive=True)
        masters = [plain, naive]
        try:
            # The three start side by side: the plain and naive ones while the certificate
            # is made, then the TLS one.
            with ThreadPoolExecutor(len(masters) + 1) as pool:
                starting = [pool.submit(master.start) for master in masters]
                tls = Master(work, "tls", certs=make_certs(work / "certs"))
                masters.append(tls)
                starting.append(pool.submit(tls.start))
                progress("starting the masters: " + ", ".join(f"{m.name} {m.url}" for m in masters))
                for started in starting:
                    started.result()
            report["tls"] = bench_tls(plain, tls, params)
            report["login_load"] = bench_logins(plain, naive, params)
        except BaseException:
            for master in masters:
                progress(f"{master.name} master log:\n{master.output(1200)}")
            raise
        finally:
            # Side by side: each stop is a SIGTERM and a wait for the process to exit.
            with ThreadPoolExecutor(len(masters)) as pool:
                list(pool.map(lambda master: master.stop(), masters))
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
    common.add_shape_flags(
        parser,
        quick="a small run, under ~30 s",
        smoke="1 round of a few requests, 2 login clients, 0.4 s windows",
    )
    parser.add_argument(
        "--rounds", type=int, help="alternating rounds (default 5; quick 2; smoke 1)"
    )
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
