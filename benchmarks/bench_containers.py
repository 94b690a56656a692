"""What a container adds to an 8-rank gang's start: submit -> every rank started, with the
ranks in containers of an image against the same ranks as bare processes, in one run.

`det-master` on SQLite in a temporary directory and one `det-agent --artificial-slots 8
--container-runtime podman` on this machine. Each round posts one 8-slot experiment
(POST /api/v1/experiments) whose ranks print the wall clock at their start, waits for its
trial to end and reads the stamps from its logs; rounds alternate between a config with
`environment.image` (the suite's Debian image, already pulled) and the same config
without. The target (issue 31): containers add at most 1 s p50 over bare processes.

    python -m benchmarks.bench_containers [--rounds 10 | --smoke] [--out results.json]
"""

from __future__ import annotations

import argparse
import base64
import json
import re
import subprocess
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from benchmarks.common import emit_report, host_facts, progress
from harness import images
from harness.cluster import AgentProcess, MasterProcess, wait_until
from harness.figures import ms_summary

RANKS = 8
RANK_SCRIPT = b"""\
import os, time
print("STAMP %d %s" % (time.time_ns(), os.environ.get("RANK", "?")), flush=True)
"""
TERMINAL = ("COMPLETED", "ERROR", "CANCELED")


def body(image: str | None, index: int) -> dict[str, Any]:
    config: dict[str, Any] = {
        "name": f"{'container' if image else 'bare'}-{index}",
        "entrypoint": ["python3", "-S", "rank.py"],
        "resources": {"slots_per_trial": RANKS},
        "searcher": {"name": "single", "metric": "loss", "max_length": {"batches": 1}},
        "max_restarts": 0,
    }
    if image:
        config["environment"] = {"image": image}
    return {
        "config": yaml.safe_dump(config),
        "modelDefinition": [
            {
                "path": "rank.py",
                "type": 48,
                "content": base64.b64encode(RANK_SCRIPT).decode(),
                "mtime": str(int(time.time())),
                "mode": 0o644,
                "uid": 0,
                "gid": 0,
            }
        ],
        "activate": True,
    }


def one_round(master: MasterProcess, image: str | None, index: int) -> float:
    """Seconds from the POST to the last of the gang's ranks starting."""
    sent = time.time_ns()
    experiment = master.api("POST", "/api/v1/experiments", json=body(image, index))
    experiment_id = experiment["experiment"]["id"]

    def ended() -> dict[str, Any] | None:
        trials = master.api("GET", f"/api/v1/experiments/{experiment_id}/trials")["trials"]
        done = trials and trials[0]["state"].removeprefix("STATE_") in TERMINAL
        return trials[0] if done else None

    trial = wait_until(f"experiment {experiment_id} to end", ended, 120, 0.05)
    text = master.http("GET", f"/api/v1/trials/{trial['id']}/logs").text
    messages = "".join(json.loads(line)["result"]["message"] for line in text.splitlines() if line)
    stamps = [int(ns) for ns in re.findall(r"STAMP (\d+) ", messages)]
    if trial["state"].removeprefix("STATE_") != "COMPLETED" or len(stamps) != RANKS:
        raise RuntimeError(f"round {index}: {trial['state']}, {len(stamps)} stamps\n{text[-3000:]}")
    return (max(stamps) - sent) / 1e9


def podman_version() -> str:
    found = subprocess.run(["podman", "--version"], capture_output=True, text=True)
    return found.stdout.strip() or found.stderr.strip()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10, help="rounds of each kind")
    parser.add_argument("--smoke", action="store_true", help="one round of each, judged on nothing")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    rounds = 1 if args.smoke else args.rounds
    missing = images.missing_tools()
    if missing:
        raise SystemExit(f"bench_containers needs {' '.join(missing)}")
    image = images.base_image()
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    times: dict[str, list[float]] = {"bare": [], "container": []}
    with tempfile.TemporaryDirectory(prefix="bench-containers-") as scratch:
        work = Path(scratch)
        master = MasterProcess(work / "data", label="bench-containers")
        agent = AgentProcess(
            master, "bench", work / "agent", slots=RANKS, args=["--container-runtime", "podman"]
        )
        try:
            master.start()
            agent.start().wait_connected()
            one_round(master, image, -1)  # warm-up: the image's first start, page cache
            one_round(master, None, -1)
            for index in range(rounds):
                order = [("container", image), ("bare", None)]
                if index % 2:
                    order.reverse()
                for kind, chosen in order:
                    times[kind].append(one_round(master, chosen, index))
                    progress(f"round {index} {kind}: {times[kind][-1] * 1000:.0f} ms")
        finally:
            agent.stop()
            master.stop()
    bare = ms_summary(times["bare"])
    container = ms_summary(times["container"])
    added = round(container["p50_ms"] - bare["p50_ms"], 1)
    report = {
        "benchmark": "bench_containers",
        "started_at": started_at,
        "machine": {**host_facts([]), "runtime": podman_version()},
        "ranks": RANKS,
        "rounds_each": rounds,
        "image": image,
        "submit_to_every_rank_started": {"bare_processes": bare, "containers": container},
        "containers_add_p50_ms": added,
        "target": {
            "containers_add_p50_ms_at_most": 1000,
            "met": None if args.smoke else added <= 1000,
        },
    }
    emit_report(report, args.out)


if __name__ == "__main__":
    main()
