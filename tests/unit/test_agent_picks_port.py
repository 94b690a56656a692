"""An agent given a whole gang with pick_master_port reserves the rendezvous port itself,
hands it to every rank as MASTER_PORT and tells the master which one it picked."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

from agent.runner import Runner
from resolute_proto.agent.v1 import agent_pb2 as pb

# Each rank writes what it was given, then waits to be stopped.
RANK = (
    "import json, os, sys, time\n"
    "open(sys.argv[1] + os.environ['RANK'], 'w').write(json.dumps("
    "{k: os.environ.get(k) for k in ('MASTER_PORT', 'RANK', 'WORLD_SIZE')}))\n"
    "time.sleep(60)\n"
)


def written(out: Path, ranks: range) -> list[dict[str, str]] | None:
    """What each rank wrote, once every one has."""
    files = [Path(f"{out}{r}") for r in ranks]
    if not all(f.exists() for f in files):
        return None
    return [json.loads(f.read_text()) for f in files]


async def wait_written(out: Path, ranks: range) -> list[dict[str, str]]:
    deadline = time.monotonic() + 60
    while (seen := written(out, ranks)) is None:
        assert time.monotonic() < deadline, "the ranks did not start"
        await asyncio.sleep(0.05)
    return seen


async def test_the_agent_picks_a_free_port_for_the_ranks_and_reports_it(tmp_path: Path) -> None:
    emitted: list[pb.AgentMessage] = []
    devices = [pb.Device(slot_id=s, type="cpu", index=-1) for s in (0, 1)]
    runner = Runner("agent-a", tmp_path / "work", devices, emitted.append, lambda _: None)
    out = tmp_path / "rank"
    start = pb.StartAllocation(
        allocation_id="5.1",
        trial_id=5,
        experiment_id=2,
        ranks=[pb.RankSpec(rank=r, local_rank=r, slot_ids=[r]) for r in (0, 1)],
        argv=[sys.executable, "-c", RANK, str(out)],
        env={"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "0", "WORLD_SIZE": "2"},
        stop_grace_s=1.0,
        pick_master_port=True,
    )
    await runner.start(start)
    try:
        (started,) = [m.started for m in emitted if m.WhichOneof("body") == "started"]
        assert started.allocation_id == "5.1" and 1024 <= started.master_port <= 65535
        seen = await wait_written(out, range(2))
        assert {s["MASTER_PORT"] for s in seen} == {str(started.master_port)}
        assert [s["RANK"] for s in seen] == ["0", "1"]
    finally:
        await runner.stop("5.1", "test over", 1.0)
        await asyncio.gather(*runner.runs["5.1"].tasks, return_exceptions=True)
    exits = [m.exited for m in emitted if m.WhichOneof("body") == "exited"]
    assert [e.kind for e in exits] == [pb.EXIT_KIND_STOPPED]
    assert "5.1" not in runner.ports  # the reservation went with the run


async def test_without_pick_master_port_the_masters_port_is_kept(tmp_path: Path) -> None:
    emitted: list[pb.AgentMessage] = []
    devices = [pb.Device(slot_id=0, type="cpu", index=-1)]
    runner = Runner("agent-a", tmp_path / "work", devices, emitted.append, lambda _: None)
    out = tmp_path / "rank"
    start = pb.StartAllocation(
        allocation_id="6.1",
        ranks=[pb.RankSpec(rank=0, local_rank=0, slot_ids=[0])],
        argv=[sys.executable, "-c", RANK, str(out)],
        env={"MASTER_PORT": "29555", "WORLD_SIZE": "1"},
        stop_grace_s=1.0,
    )
    await runner.start(start)
    try:
        (started,) = [m.started for m in emitted if m.WhichOneof("body") == "started"]
        assert started.master_port == 0
        (seen,) = await wait_written(out, range(1))
        assert seen["MASTER_PORT"] == "29555"
    finally:
        await runner.stop("6.1", "test over", 1.0)
        await asyncio.gather(*runner.runs["6.1"].tasks, return_exceptions=True)
