"""Scheduler benchmark (issue 3): S1 and S2 on PostgreSQL with fsync on.

    .venv/bin/python -m benchmarks.bench_scheduler [--quick | --smoke] [--postgres DSN]
        [--seed N]

Prints one JSON document on stdout (progress goes to stderr): the machine it ran on and

- S1, 10,000 one-slot trials onto 1,000 eight-slot agents:
  (a) committed placements per second of the batched pass (one transaction per pass);
  (b) the pass at 10,000 pending x 1,000 agents: the pure placement core alone, the
      whole database pass (load + core + write + commit) on a full cluster, and the same
      pass on the scheduler loop's in-memory view (lock + core + commit);
  (c) a lone submit on an idle cluster, through the API, until the master's own scheduler
      loop has assigned it;
  (d) the same placements with one transaction per placement (Determined's pattern).
- S2, 500 gangs of 16/32/64 slots mixed with 5,000 one-slot trials on a half-occupied
  1,000-agent cluster with releases streaming in: gang placements per second, partial gangs
  (checked in the database after every pass), head-of-queue starvation, and the same
  workload with one transaction per placement.

Every measurement runs on a database of its own on the server behind --postgres, created
with CREATE DATABASE on the admin DSN and dropped when the run ends, each a copy (CREATE DATABASE
... TEMPLATE) of one that a master migrated and seeded once; a scenario's setup is built
once, through a running master, and measurements run on copies of it, so that the batched
and the naive variant start from the same rows. Simulated
agents register through master.services.agents.register_agent and exit through
master.services.release.release_allocation, the functions the agent protocol calls;
trials come from master.services.experiments.create_experiment; the batched variant is
master.services.scheduler.run_pass, what the scheduler loop runs. Setup (registering agents,
creating trials, the releases between S2 passes, the checks) is timed and printed but
excluded from the figures. `--quick` shrinks every workload 10x; `--smoke` runs every path
on 16 agents and a few hundred trials in seconds (the smoke test's shape, no figures).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import math
import os
import random
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import httpx
from fastapi import FastAPI
from sqlalchemy import func, insert, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from benchmarks import common
from benchmarks.common import host_facts, progress, seconds_since_start
from harness.figures import ms_summary, percentile, ratio
from master.app import create_app
from master.core import fair_share, placement
from master.core.cluster_view import ClusterView
from master.db.models import (
    AllocationModel,
    AllocationSlotModel,
    AllocationState,
    ExperimentModel,
    SlotModel,
    TrialModel,
    TrialState,
    UserModel,
    utcnow,
)
from master.db.session import session_scope
from master.services import scheduler, states
from master.services.agents import AgentRegistration, Device, register_agent
from master.services.allocations import HELD_STATES, ReleaseOutcome, watch_commits
from master.services.experiments import ExperimentRequest, activate_experiment, create_experiment
from master.services.release import release_allocation
from master.settings import DatabaseSettings, MasterSettings, ResourcePoolSettings

DEFAULT_ADMIN_DSN = (
    os.environ.get("RESOLUTE_BENCH_POSTGRES")
    or os.environ.get("RESOLUTE_TEST_POSTGRES")
    or "postgresql://postgres@127.0.0.1:5432/postgres"
)
POOL = "default"
GANG_SIZES = (16, 32, 64)
GANGS_PER_BLOCK = 5  # S2 queues gang experiments of 5 trials between one-slot experiments
S2_MAX_PASSES = 2_000
ASSIGNED_POLL_S = 0.002
ASSIGNED_TIMEOUT_S = 10.0
TARGETS = {
    "s1_committed_placements_per_s_min": 5_000,
    "s1_pass_p99_ms_max": 50,
    "s1_lone_submit_s_max": 0.6,
    "s2_gang_placements_per_s_min": 1_000,
    "s2_partial_gangs": 0,
}


# --- workload sizes ------------------------------------------------------------------------


@dataclass(frozen=True)
class Scale:
    agents: int
    slots_per_agent: int
    s1_trials: int
    s1_trials_per_experiment: int
    core_repetitions: int
    db_pass_repetitions: int
    submit_samples: int
    s2_gangs: int
    s2_singles: int
    s2_fill_trials_per_experiment: int
    s1_placement_repetitions: int = 3  # S1 (a), each on a fresh copy of the setup
    s2_release_fraction: float = 0.05  # of the running allocations, released after each pass

    @classmethod
    def full(cls) -> Scale:
        return cls(
            agents=1_000,
            slots_per_agent=8,
            s1_trials=10_000,
            s1_trials_per_experiment=2_500,
            core_repetitions=50,
            db_pass_repetitions=20,
            submit_samples=10,
            s2_gangs=500,
            s2_singles=5_000,
            s2_fill_trials_per_experiment=100,
        )

    @classmethod
    def quick(cls) -> Scale:
        return cls(
            agents=100,
            slots_per_agent=8,
            s1_trials=1_000,
            s1_trials_per_experiment=250,
            core_repetitions=20,
            db_pass_repetitions=10,
            submit_samples=5,
            s2_gangs=50,
            s2_singles=500,
            s2_fill_trials_per_experiment=100,
        )

    @classmethod
    def smoke(cls) -> Scale:
        """The least that runs every path: S1 more trials than slots (so the cluster fills
        and the top-up stays pending), placed once; S2 half of 16 agents filled (8 idle ones
        fit a 64-slot gang), one experiment of gangs of each size, half of the running
        released after each pass (so it drains in a few passes)."""
        return cls(
            agents=16,
            slots_per_agent=8,
            s1_trials=160,
            s1_trials_per_experiment=80,
            core_repetitions=2,
            db_pass_repetitions=2,
            submit_samples=1,
            s2_gangs=3 * GANGS_PER_BLOCK,
            s2_singles=30,
            s2_fill_trials_per_experiment=64,
            s1_placement_repetitions=1,
            s2_release_fraction=0.5,
        )


# --- statistics ----------------------------------------------------------------------------


def ms_figures(seconds: Sequence[float]) -> dict[str, float]:
    """ms_summary's figures to the microsecond, with the mean and the fastest."""
    fastest = {"min_ms": round(min(seconds) * 1000, 3)} if seconds else {}
    return ms_summary(seconds, digits=3, mean=True) | fastest


def rate(count: int, seconds: float) -> float:
    return round(count / seconds, 1) if seconds > 0 else 0.0


# --- the machine ---------------------------------------------------------------------------


# --- databases and masters -----------------------------------------------------------------


async def _admin(admin_dsn: str, sql: str) -> None:
    conn = await asyncpg.connect(admin_dsn, timeout=10)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


# Databases used and done with, dropped together when the run ends (drop_databases): under
# load a DROP DATABASE can wait over a second on the server, and none is measured.
FINISHED_DATABASES: list[str] = []


async def drop_databases(admin_dsn: str) -> None:
    names = list(FINISHED_DATABASES)
    FINISHED_DATABASES.clear()
    await asyncio.gather(
        *(_admin(admin_dsn, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)') for name in names)
    )


@asynccontextmanager
async def database(admin_dsn: str, label: str, template: str | None = None) -> AsyncIterator[str]:
    """A new database (a copy of `template`'s URL if given), unused after the block and
    dropped by drop_databases."""
    name = f"resolute_bench_{os.getpid()}_{label}_{uuid.uuid4().hex[:6]}"
    create = f'CREATE DATABASE "{name}"'
    if template is not None:
        create += f' TEMPLATE "{template.rsplit("/", 1)[1]}"'
    for attempt in range(50):
        try:
            await _admin(admin_dsn, create)
            break
        except asyncpg.ObjectInUseError:  # the template's last connections are still closing
            if attempt == 49:
                raise
            await asyncio.sleep(0.1)
    try:
        yield f"{admin_dsn.rsplit('/', 1)[0]}/{name}"
    finally:
        FINISHED_DATABASES.append(name)


@asynccontextmanager
async def master(url: str, *, run_loops: bool = False) -> AsyncIterator[FastAPI]:
    """A master app on `url`, started (migrate + seed) as det-master starts it; its engine is
    disposed on the way out."""
    with tempfile.TemporaryDirectory(prefix="resolute-bench-") as data_dir:
        settings = MasterSettings(
            data_dir=Path(data_dir),
            db=DatabaseSettings(url=url),
            resource_pools=[ResourcePoolSettings(pool_name=POOL)],
            default_compute_pool=POOL,
            run_loops=run_loops,
            migrate_on_start=True,
        )
        app = create_app(settings)
        async with app.router.lifespan_context(app):
            yield app


def factory_of(app: FastAPI) -> async_sessionmaker[AsyncSession]:
    factory: async_sessionmaker[AsyncSession] = app.state.session_factory
    return factory


def settings_of(app: FastAPI) -> MasterSettings:
    settings: MasterSettings = app.state.settings
    return settings


# --- setup: agents and trials --------------------------------------------------------------


def agent_id(index: int) -> str:
    return f"sim-{index:04d}"


async def register_agents(app: FastAPI, count: int, slots: int) -> float:
    """Simulated agents register in one session through the agent protocol's function."""
    started = time.perf_counter()
    async with session_scope(factory_of(app)) as session:
        for i in range(count):
            registration = AgentRegistration(
                id=agent_id(i),
                resource_pool=POOL,
                devices=tuple(
                    Device(slot_id=s, type="cuda", brand="simulated") for s in range(slots)
                ),
                addresses=("127.0.0.1",),
                version="bench",
                hostname=agent_id(i),
            )
            await register_agent(session, settings_of(app), registration)
    return time.perf_counter() - started


def experiment_config(name: str, slots: int, trials: int) -> str:
    if trials == 1:
        searcher = "{name: single, metric: loss, max_length: 10}"
    else:
        searcher = f"{{name: random, metric: loss, max_length: 10, max_trials: {trials}}}"
    return (
        f"name: {name}\n"
        "entrypoint: python3 train.py\n"
        f"resources: {{slots_per_trial: {slots}}}\n"
        f"searcher: {searcher}\n"
    )


async def create_experiments(
    app: FastAPI, shapes: Sequence[tuple[int, int]], name: str, *, activate: bool = True
) -> list[int]:
    """Experiments of (slots_per_trial, trials) in this queue order, in one transaction."""
    ids: list[int] = []
    async with session_scope(factory_of(app)) as session:
        owner = await session.scalar(select(UserModel).where(UserModel.username == "determined"))
        assert owner is not None, "the master seeds the user determined"
        for n, (slots, trials) in enumerate(shapes):
            request = ExperimentRequest(
                config=experiment_config(f"{name}-{n}", slots, trials), activate=activate
            )
            view, _ = await create_experiment(session, request, owner, settings_of(app))
            assert view is not None
            ids.append(view.experiment.id)
    return ids


def split(total: int, per_experiment: int) -> list[int]:
    sizes = [per_experiment] * (total // per_experiment)
    if total % per_experiment:
        sizes.append(total % per_experiment)
    return sizes


# --- passes --------------------------------------------------------------------------------


async def batched_pass(
    app: FastAPI, view: ClusterView | None = None
) -> tuple[scheduler.PassStats, float]:
    """A pass from the first query to the end of the commit: on the database alone, or
    with `view`, the in-memory view the scheduler loop keeps (loaded when it is not exact)."""
    started = time.perf_counter()
    async with session_scope(factory_of(app)) as session:
        stats = await scheduler.run_pass(session, settings_of(app), view)
    wall = time.perf_counter() - started
    if stats.skipped:
        raise RuntimeError("the scheduling pass was skipped: another master holds the lock")
    return stats, wall


@dataclass
class Snapshot:
    """One pool's queue, agents and running work, loaded by the scheduler's own loaders."""

    policy: placement.PoolPolicy
    agents: list[placement.AgentState]
    requests: list[placement.Request]
    running: list[placement.Running]
    trial_of: dict[str, int]

    def schedule(self) -> placement.Plan:
        # In the fair order, as the scheduler's pass runs it (no usage recorded yet).
        return placement.schedule(
            self.policy, self.agents, self.requests, self.running, share=fair_share.FairShare()
        )


async def load_snapshot(app: FastAPI) -> Snapshot:
    pool = settings_of(app).pool(POOL)
    assert pool is not None
    async with factory_of(app)() as session:
        pending = await scheduler._load_pending(session)
        agents = await scheduler.load_agent_states(session)
        held = await scheduler._load_held(session)
    running = [h.running for h in held if h.pool == POOL]
    assert {row.pool for row in pending} <= {POOL} and set(agents) <= {POOL}
    requests = [row.request() for row in pending]
    return Snapshot(
        policy=scheduler.policy_of(pool),
        agents=agents.get(POOL, []),
        requests=requests,
        running=running,
        trial_of={row.id: row.trial_id or 0 for row in pending},
    )


def time_core(snapshot: Snapshot, repetitions: int, *, collect: bool) -> tuple[list[float], int]:
    """The pure placement core on one snapshot, `repetitions` times; returns times, placed.

    With collect=False the garbage collector is off during each call, as timeit does: the
    difference to collect=True is the collector's pauses, which a real master also takes.
    """
    times: list[float] = []
    placed = 0
    for _ in range(repetitions):
        if not collect:
            gc.disable()
        try:
            started = time.perf_counter()
            plan = snapshot.schedule()
            times.append(time.perf_counter() - started)
        finally:
            gc.enable()
        placed = len(plan.assignments)
    return times, placed


async def commit_one_placement(
    factory: async_sessionmaker[AsyncSession], assignment: placement.Assignment, trial_id: int
) -> None:
    """Determined's pattern: each placement its own transaction, with the same statements the
    batched pass issues for it (slot rows, allocation row, trial state and its audit row)."""
    async with session_scope(factory) as session:
        rows = [
            {"agent_id": agent, "slot_id": slot, "allocation_id": assignment.request_id}
            for agent, slots in assignment.slots
            for slot in slots
        ]
        if rows:
            await session.execute(insert(AllocationSlotModel), rows)
        result = await session.execute(
            update(AllocationModel)
            .where(
                AllocationModel.id == assignment.request_id,
                AllocationModel.state == AllocationState.PENDING,
            )
            .values(
                state=AllocationState.ASSIGNED,
                assigned_at=utcnow(),
                pending_code="",
                pending_reason="",
                blocking_job=None,
            )
            .returning(AllocationModel.id)
            .execution_options(synchronize_session=False)
        )
        if result.scalar_one_or_none() is None:
            raise RuntimeError(f"allocation {assignment.request_id} left the queue")
        await states.set_trial_states(
            session,
            [trial_id],
            TrialState.QUEUED,
            TrialState.STARTING,
            "resources assigned by the scheduler",
        )


@dataclass
class NaivePass:
    placed: int
    seconds: float
    load_seconds: float
    core_seconds: float
    write_seconds: float


async def naive_pass(app: FastAPI) -> NaivePass:
    """Load and plan as the batched pass does, then commit each placement on its own.

    Pending reasons are not written: Determined keeps them in memory only."""
    started = time.perf_counter()
    snapshot = await load_snapshot(app)
    core_started = time.perf_counter()
    plan = snapshot.schedule()
    write_started = time.perf_counter()
    factory = factory_of(app)
    for assignment in plan.assignments:
        await commit_one_placement(factory, assignment, snapshot.trial_of[assignment.request_id])
    done = time.perf_counter()
    return NaivePass(
        placed=len(plan.assignments),
        seconds=done - started,
        load_seconds=core_started - started,
        core_seconds=write_started - core_started,
        write_seconds=done - write_started,
    )


# --- database checks -----------------------------------------------------------------------


async def count_slot_rows(app: FastAPI) -> int:
    query = select(func.count()).select_from(AllocationSlotModel)
    async with factory_of(app)() as session:
        return (await session.scalar(query)) or 0


async def pending_ids(app: FastAPI) -> set[str]:
    query = select(AllocationModel.id).where(AllocationModel.state == AllocationState.PENDING)
    async with factory_of(app)() as session:
        return set((await session.scalars(query)).all())


async def queue_order(app: FastAPI) -> list[tuple[str, int]]:
    """Pending allocations (id, slots) in the scheduler's queue order."""
    query = (
        select(AllocationModel.id, AllocationModel.slots_needed)
        .join(ExperimentModel, ExperimentModel.id == AllocationModel.experiment_id)
        .where(AllocationModel.state == AllocationState.PENDING)
        .order_by(
            ExperimentModel.priority,
            AllocationModel.registered_at,
            AllocationModel.trial_id,
            AllocationModel.id,
        )
    )
    async with factory_of(app)() as session:
        return [(r.id, r.slots_needed) for r in (await session.execute(query)).all()]


async def partial_gang_violations(app: FastAPI) -> list[str]:
    """Straight from the tables: every held allocation holds exactly slots_needed slots; one
    spanning agents holds every slot of each of its agents, all of one size; nothing else
    holds a slot."""
    held_query = select(AllocationModel.id, AllocationModel.slots_needed).where(
        AllocationModel.state.in_(HELD_STATES)
    )
    slots_query = select(SlotModel.agent_id, SlotModel.slot_id)
    holding_query = select(
        AllocationSlotModel.allocation_id, AllocationSlotModel.agent_id, AllocationSlotModel.slot_id
    )
    async with factory_of(app)() as session:
        held = {r.id: r.slots_needed for r in (await session.execute(held_query)).all()}
        agent_slots: dict[str, set[int]] = defaultdict(set)
        for agent, slot in (await session.execute(slots_query)).all():
            agent_slots[agent].add(slot)
        holding: dict[str, dict[str, set[int]]] = defaultdict(lambda: defaultdict(set))
        for allocation, agent, slot in (await session.execute(holding_query)).all():
            holding[allocation][agent].add(slot)
    violations = [f"{a} holds slots but is not held" for a in holding if a not in held]
    for allocation, needed in held.items():
        by_agent = holding.get(allocation, {})
        got = sum(len(slots) for slots in by_agent.values())
        if got != needed:
            violations.append(f"{allocation} holds {got} slots, needs {needed}")
        if len(by_agent) > 1:
            sizes = {len(agent_slots[agent]) for agent in by_agent}
            if len(sizes) != 1:
                violations.append(f"{allocation} spans agents of sizes {sorted(sizes)}")
            for agent, slots in by_agent.items():
                if slots != agent_slots[agent]:
                    violations.append(
                        f"{allocation} holds {len(slots)} of {len(agent_slots[agent])} slots "
                        f"of agent {agent}"
                    )
    return violations


async def release_random(app: FastAPI, rng: random.Random, fraction: float) -> int:
    """Simulated agents report ~fraction of the running allocations done, in one session.

    The rows release_allocation reads are loaded first in three queries, so that its
    session.get calls find them in the identity map; it still does all of its own work."""
    async with session_scope(factory_of(app)) as session:
        held_query = select(AllocationModel.id).where(AllocationModel.state.in_(HELD_STATES))
        held = sorted((await session.scalars(held_query)).all())
        chosen = rng.sample(held, max(1, round(len(held) * fraction))) if held else []
        allocations = (
            await session.scalars(select(AllocationModel).where(AllocationModel.id.in_(chosen)))
        ).all()
        trial_ids = {a.trial_id for a in allocations}
        experiment_ids = {a.experiment_id for a in allocations}
        await session.scalars(select(TrialModel).where(TrialModel.id.in_(trial_ids)))
        await session.scalars(select(ExperimentModel).where(ExperimentModel.id.in_(experiment_ids)))
        for allocation in chosen:
            await release_allocation(session, allocation, ReleaseOutcome.COMPLETED)
    return len(chosen)


# --- S1 ------------------------------------------------------------------------------------


async def s1(admin_dsn: str, base_url: str, scale: Scale, seed: int) -> dict[str, Any]:
    async with database(admin_dsn, "s1setup", template=base_url) as setup_url:
        async with master(setup_url) as app:
            progress(f"S1 setup: {scale.s1_trials} one-slot trials, {scale.agents} agents")
            started = time.perf_counter()
            shapes = [(1, n) for n in split(scale.s1_trials, scale.s1_trials_per_experiment)]
            await create_experiments(app, shapes, "s1")
            trials_s = time.perf_counter() - started
            agents_s = await register_agents(app, scale.agents, scale.slots_per_agent)
        result = await s1_batched(admin_dsn, setup_url, scale)
        result["setup_seconds"] = {
            "create_trials": round(trials_s, 2),
            "register_agents": round(agents_s, 2),
            **result["setup_seconds"],
        }
        result["c_lone_submit"] = await s1_lone_submit(admin_dsn, base_url, scale, seed)
        result["d_naive_one_transaction_per_placement"] = naive = await s1_naive(
            admin_dsn, setup_url, scale
        )
    result["ratio_batched_over_naive_placements_per_s"] = ratio(
        result["a_committed_placements"]["placements_per_s"], naive["placements_per_s"]
    )
    return result


async def _placing_passes(app: FastAPI) -> tuple[list[dict[str, Any]], int, float]:
    """Batched passes until one places nothing; that last one is not counted."""
    passes: list[dict[str, Any]] = []
    placed = 0
    wall_total = 0.0
    while True:
        stats, wall = await batched_pass(app)
        if stats.placed == 0:
            return passes, placed, wall_total
        placed += stats.placed
        wall_total += wall
        passes.append(
            {
                "pending_before": stats.pending,
                "placed": stats.placed,
                "wall_ms_incl_commit": round(wall * 1000, 1),
                "run_pass_ms_before_commit": round(stats.seconds * 1000, 1),
                "core_ms": round(stats.core_seconds * 1000, 1),
                "reasons_written": stats.reasons_written,
            }
        )


async def _placement_repetition(app: FastAPI, expected: int) -> dict[str, Any]:
    passes, placed, wall = await _placing_passes(app)
    assert placed == expected == await count_slot_rows(app), (placed, expected)
    return {
        "placed": placed,
        "wall_seconds": round(wall, 4),
        "db_check_violations": len(await partial_gang_violations(app)),
        "passes": passes,
    }


async def s1_batched(admin_dsn: str, setup_url: str, scale: Scale) -> dict[str, Any]:
    """(a) committed placements per second, on copies of the setup, and (b) pass latency."""
    capacity = scale.agents * scale.slots_per_agent
    expected = min(capacity, scale.s1_trials)
    repetitions: list[dict[str, Any]] = []
    for rep in range(scale.s1_placement_repetitions - 1):
        async with database(admin_dsn, f"s1a{rep}", template=setup_url) as url, master(url) as app:
            progress(f"S1 (a) {rep + 1}/{scale.s1_placement_repetitions}: batched passes")
            repetitions.append(await _placement_repetition(app, expected))

    # The last copy also gives (b): the core before placing, the database pass once full.
    async with database(admin_dsn, "s1b", template=setup_url) as url, master(url) as app:
        progress("S1 (b): the placement core on the idle-cluster snapshot")
        idle = await load_snapshot(app)
        idle_core, idle_placed = time_core(idle, scale.core_repetitions, collect=True)
        idle_core_nogc, _ = time_core(idle, scale.core_repetitions, collect=False)
        idle_pending = len(idle.requests)
        del idle
        last = scale.s1_placement_repetitions
        progress(f"S1 (a) {last}/{last}: batched passes")
        repetitions.append(await _placement_repetition(app, expected))
        progress(f"S1 (b): queueing {expected} more trials; the database pass on a full cluster")
        started = time.perf_counter()
        more = split(expected, scale.s1_trials_per_experiment)  # back to s1_trials pending
        await create_experiments(app, [(1, n) for n in more], "s1-more")
        top_up_s = time.perf_counter() - started
        warm, _ = await batched_pass(app)  # writes the new trials' first pending reasons
        assert warm.placed == 0 and warm.pending == scale.s1_trials, warm
        full = await load_snapshot(app)
        full_core, full_placed = time_core(full, scale.core_repetitions, collect=True)
        full_pending = len(full.requests)
        del full
        db_walls: list[float] = []
        db_run_pass: list[float] = []
        db_core: list[float] = []
        for _ in range(scale.db_pass_repetitions):
            stats, wall = await batched_pass(app)
            assert stats.placed == 0 and stats.pending == scale.s1_trials, stats
            db_walls.append(wall)
            db_run_pass.append(stats.seconds)
            db_core.append(stats.core_seconds)
        progress("S1 (b): the same pass on the scheduler loop's in-memory view")
        view = ClusterView()
        watch_commits(app.state.engine, view)
        loading, loading_wall = await batched_pass(app, view)  # the first one loads it
        assert loading.loaded_view and loading.pending == scale.s1_trials, loading
        view_walls: list[float] = []
        view_core: list[float] = []
        for _ in range(scale.db_pass_repetitions):
            stats, wall = await batched_pass(app, view)
            assert not stats.loaded_view, "the view was loaded again: nothing changed"
            assert stats.placed == 0 and stats.pending == scale.s1_trials, stats
            view_walls.append(wall)
            view_core.append(stats.core_seconds)

    placed_total = sum(r["placed"] for r in repetitions)
    wall_total = sum(r["wall_seconds"] for r in repetitions)
    rep_rates = sorted(rate(r["placed"], r["wall_seconds"]) for r in repetitions)
    headline = rate(placed_total, wall_total)
    core = ms_figures(idle_core)
    db = ms_figures(db_walls)
    in_memory = ms_figures(view_walls)
    p99_target = TARGETS["s1_pass_p99_ms_max"]
    return {
        "setup_seconds": {"queue_more_trials_for_b": round(top_up_s, 2)},
        "a_committed_placements": {
            "what": (
                f"{scale.s1_trials} pending one-slot trials on {scale.agents} idle "
                f"{scale.slots_per_agent}-slot agents ({capacity} slots), placed by batched "
                "passes until one places nothing; placed / wall time of the placing passes, "
                "each from its first query to the end of its commit (one transaction per "
                f"pass); {scale.s1_placement_repetitions} repetitions, each on a fresh copy of the "
                "same database"
            ),
            "placed_per_repetition": expected,
            "placements_per_s": headline,
            "placements_per_s_by_repetition": rep_rates,
            "target_min_per_s": TARGETS["s1_committed_placements_per_s_min"],
            "target_met": headline >= TARGETS["s1_committed_placements_per_s_min"],
            "repetitions": repetitions,
            "db_check_violations": sum(r["db_check_violations"] for r in repetitions),
        },
        "b_scheduling_pass": {
            "target_p99_ms": p99_target,
            "target_applies_to": "core_idle_cluster",
            "why": (
                "the issue asks for a pass at 10,000 pending x 1,000 agents and makes the "
                "placement core pure so that it can be benchmarked alone; the target is read "
                "as that core's time. The whole database pass is reported next to it against "
                "the same number, so that nobody mistakes one for the other"
            ),
            "core_idle_cluster": {
                "what": (
                    "master.core.placement.schedule alone on the snapshot the first pass "
                    f"loads: {idle_pending} pending x {scale.agents} idle "
                    f"agents (places {idle_placed}, explains the rest); garbage collector on"
                ),
                **core,
                "target_met": core["p99_ms"] < p99_target,
                "gc_off_during_each_call": ms_figures(idle_core_nogc),
            },
            "core_full_cluster": {
                "what": (
                    f"the core alone on {full_pending} pending x {scale.agents} full agents "
                    f"(places {full_placed}); garbage collector on"
                ),
                **ms_figures(full_core),
            },
            "db_pass_full_cluster": {
                "what": (
                    "the whole pass as the loop runs it (load + core + write reasons + "
                    f"commit) with {scale.s1_trials} pending on {scale.agents} full agents, "
                    "nothing placeable, pending reasons already current"
                ),
                **db,
                "run_pass_before_commit": ms_figures(db_run_pass),
                "core_inside_pass": ms_figures(db_core),
                "target_met": db["p99_ms"] < p99_target,
            },
            "view_pass_full_cluster": {
                "what": (
                    "the same pass as the scheduler loop runs it now: on its in-memory view "
                    "(master.core.cluster_view), exact at the locked epoch, so the pass reads "
                    "nothing but the lock row (lock + core + commit); the first pass, which "
                    "loads the view, is reported apart"
                ),
                **in_memory,
                "core_inside_pass": ms_figures(view_core),
                "first_pass_loading_the_view_ms": round(loading_wall * 1000, 1),
                "over_db_pass_p50": ratio(in_memory["p50_ms"], db["p50_ms"]),
                "target_met": in_memory["p99_ms"] < p99_target,
            },
        },
    }


async def s1_lone_submit(admin_dsn: str, base_url: str, scale: Scale, seed: int) -> dict[str, Any]:
    """(c) submit through the API with the master's scheduler loop running; time until the
    allocation is ASSIGNED, as seen in the database."""
    rng = random.Random(seed)
    async with (
        database(admin_dsn, "s1c", template=base_url) as url,
        master(url, run_loops=True) as app,
    ):
        progress(f"S1 (c): {scale.agents} agents register, the scheduler loop running")
        agents_s = await register_agents(app, scale.agents, scale.slots_per_agent)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://master") as client:
            reply = await client.post(
                "/api/v1/auth/login", json={"username": "determined", "password": ""}
            )
            reply.raise_for_status()
            client.headers["Authorization"] = f"Bearer {reply.json()['token']}"
            samples: list[tuple[float, float]] = []
            progress(f"S1 (c): {scale.submit_samples} lone submits (and one to warm up)")
            for n in range(scale.submit_samples + 1):
                # A random phase against the loop's 500 ms timer: only the wake-up may help.
                await asyncio.sleep(rng.uniform(0.05, 0.45))
                samples.append(await _one_submit(app, client, n))
    warm_up, counted = samples[0], samples[1:]
    assigned = sorted(s[1] for s in counted)
    return {
        "what": (
            "POST /api/v1/experiments (one one-slot trial) through httpx.ASGITransport after "
            "logging in as determined, with the app's SchedulerLoop running (run_loops=True; "
            f"the API wakes it after its commit), on {scale.agents} idle "
            f"{scale.slots_per_agent}-slot agents; from sending the request to the "
            f"allocation ASSIGNED in the database (polled every {ASSIGNED_POLL_S * 1000:.0f} "
            "ms); each is released before the next, after a random 50-450 ms pause"
        ),
        "setup_seconds": {"register_agents": round(agents_s, 2)},
        "n": len(assigned),
        "p50_s": round(percentile(assigned, 50), 4),
        "max_s": round(assigned[-1], 4),
        "samples_s": [round(s[1], 4) for s in counted],
        "post_reply_p50_s": round(percentile(sorted(s[0] for s in counted), 50), 4),
        "warm_up_sample_s": round(warm_up[1], 4),
        "target_max_s": TARGETS["s1_lone_submit_s_max"],
        "target_met": assigned[-1] <= TARGETS["s1_lone_submit_s_max"],
    }


async def _one_submit(app: FastAPI, client: httpx.AsyncClient, n: int) -> tuple[float, float]:
    """(seconds to the API's reply, seconds to ASSIGNED)."""
    started = time.perf_counter()
    reply = await client.post(
        "/api/v1/experiments",
        json={"config": experiment_config(f"lone-{n}", 1, 1), "activate": True},
    )
    replied = time.perf_counter() - started
    reply.raise_for_status()
    experiment_id = reply.json()["experiment"]["id"]
    query = select(AllocationModel.id, AllocationModel.state).where(
        AllocationModel.experiment_id == experiment_id
    )
    while True:
        async with factory_of(app)() as session:
            row = (await session.execute(query)).first()
        if row is not None and row.state == AllocationState.ASSIGNED:
            assigned = time.perf_counter() - started
            break
        if time.perf_counter() - started > ASSIGNED_TIMEOUT_S:
            raise RuntimeError(f"experiment {experiment_id} not assigned in {ASSIGNED_TIMEOUT_S}s")
        await asyncio.sleep(ASSIGNED_POLL_S)
    async with session_scope(factory_of(app)) as session:
        await release_allocation(session, row.id, ReleaseOutcome.COMPLETED)
    return replied, assigned


async def s1_naive(admin_dsn: str, setup_url: str, scale: Scale) -> dict[str, Any]:
    """(d) the S1 placements with one transaction per placement, on a fresh copy."""
    async with database(admin_dsn, "s1d", template=setup_url) as url, master(url) as app:
        progress("S1 (d): one transaction per placement")
        passes: list[NaivePass] = []
        while True:
            result = await naive_pass(app)
            if result.placed == 0:
                break
            passes.append(result)
        placed = sum(p.placed for p in passes)
        wall = sum(p.seconds for p in passes)
        assert placed == await count_slot_rows(app), placed
        violations = await partial_gang_violations(app)
    return {
        "what": (
            "the S1 placements done Determined's way on a fresh copy of the same database: "
            "the same load and placement core, then for each placement its own session and "
            "transaction (insert its allocation_slots rows, update its allocation, update "
            "its trial's state and write its audit row, commit), one after another; "
            "placements / wall time from the first load to the last commit"
        ),
        "placed": placed,
        "passes": len(passes),
        "wall_seconds": round(wall, 3),
        "load_seconds": round(sum(p.load_seconds for p in passes), 3),
        "core_seconds": round(sum(p.core_seconds for p in passes), 3),
        "per_placement_commits_seconds": round(sum(p.write_seconds for p in passes), 3),
        "placements_per_s": rate(placed, wall),
        "db_check_violations": len(violations),
    }


# --- S2 ------------------------------------------------------------------------------------


@dataclass
class S2Run:
    """One variant's S2 run: what each pass placed and how long the passes took."""

    variant: str
    pass_seconds: list[float] = field(default_factory=list)
    core_seconds: list[float] = field(default_factory=list)
    placed_per_pass: list[list[str]] = field(default_factory=list)
    gangs_per_pass: list[int] = field(default_factory=list)
    reasons_written: int = 0
    violations: list[str] = field(default_factory=list)
    released: int = 0
    stuck: bool = False
    unplaced: int = 0
    gangs_total: int = 0
    singles_total: int = 0
    first_gang: tuple[str, int] = ("", 0)
    gang_waits: dict[str, int] = field(default_factory=dict)  # id -> passes it waited
    head_waits: dict[str, int] = field(default_factory=dict)  # id -> passes it waited as head
    unmeasured_seconds: float = 0.0


def s2_queue_shapes(scale: Scale) -> list[tuple[int, int]]:
    """Gang experiments of GANGS_PER_BLOCK trials, sizes cycling 16/32/64, each followed by a
    one-slot experiment, so that gangs and one-slot trials alternate in queue order."""
    blocks = max(1, scale.s2_gangs // GANGS_PER_BLOCK)
    singles = split(scale.s2_singles, math.ceil(scale.s2_singles / blocks))
    shapes: list[tuple[int, int]] = []
    for b in range(blocks):
        shapes.append((GANG_SIZES[b % len(GANG_SIZES)], GANGS_PER_BLOCK))
        if b < len(singles):
            shapes.append((1, singles[b]))
    return shapes


async def s2_setup(app: FastAPI, scale: Scale) -> dict[str, float]:
    """Half the agents full of one-slot trials, then the gangs and one-slot trials queued.

    Experiments are created before the agents register: the submit-time capacity check then
    has no agents to load, which makes the 200 submits quick. The queued ones are created
    paused and activated in order after the fill has been placed, so that their allocations
    enter the queue in that order behind a half-occupied cluster."""
    timings: dict[str, float] = {}
    fill = scale.agents // 2 * scale.slots_per_agent
    shapes = s2_queue_shapes(scale)
    started = time.perf_counter()
    fill_shapes = [(1, n) for n in split(fill, scale.s2_fill_trials_per_experiment)]
    await create_experiments(app, fill_shapes, "fill")
    queued = await create_experiments(app, shapes, "s2", activate=False)
    timings["create_trials"] = round(time.perf_counter() - started, 2)
    timings["register_agents"] = round(
        await register_agents(app, scale.agents, scale.slots_per_agent), 2
    )
    started = time.perf_counter()
    stats, _ = await batched_pass(app)
    assert stats.placed == stats.pending == fill, stats
    timings["fill_pass"] = round(time.perf_counter() - started, 2)
    query = select(AllocationSlotModel.agent_id, func.count()).group_by(
        AllocationSlotModel.agent_id
    )
    async with factory_of(app)() as session:
        per_agent = {agent: n for agent, n in (await session.execute(query)).all()}
    assert len(per_agent) == scale.agents // 2, "half the agents full, the other half idle"
    assert set(per_agent.values()) == {scale.slots_per_agent}, per_agent
    started = time.perf_counter()
    async with session_scope(factory_of(app)) as session:
        for experiment_id in queued:
            await activate_experiment(session, experiment_id, "bench")
    timings["activate_queued"] = round(time.perf_counter() - started, 2)
    return timings


async def s2_run(
    admin_dsn: str, setup_url: str, seed: int, release_fraction: float, *, naive: bool
) -> S2Run:
    run = S2Run("naive" if naive else "batched")
    label = f"S2 {run.variant}"
    async with (
        database(admin_dsn, f"s2{run.variant[0]}", template=setup_url) as url,
        master(url) as app,
    ):
        order = await queue_order(app)
        slots_of = dict(order)
        gangs = [a for a, slots in order if slots > 1]
        run.first_gang = (gangs[0], slots_of[gangs[0]])
        placed_at: dict[str, int] = {}
        rng = random.Random(seed)
        head_index = 0
        pending = {a for a, _ in order}
        progress(f"{label}: passes, {release_fraction:.0%} of the running released after each")
        for number in range(1, S2_MAX_PASSES + 1):
            while head_index < len(order) and order[head_index][0] in placed_at:
                head_index += 1
            head = order[head_index][0] if head_index < len(order) else None
            if naive:
                result = await naive_pass(app)
                run.pass_seconds.append(result.seconds)
                run.core_seconds.append(result.core_seconds)
            else:
                stats, wall = await batched_pass(app)
                run.pass_seconds.append(wall)
                run.core_seconds.append(stats.core_seconds)
                run.reasons_written += stats.reasons_written
            unmeasured = time.perf_counter()
            # Releases end allocations as COMPLETED, so the queue only loses what passes place.
            after = await pending_ids(app)
            placed = sorted(pending - after)
            pending = after
            run.placed_per_pass.append(placed)
            run.gangs_per_pass.append(sum(1 for a in placed if slots_of[a] > 1))
            for allocation in placed:
                placed_at[allocation] = number
            if head is not None and head not in placed_at:
                run.head_waits[head] = run.head_waits.get(head, 0) + 1
            problems = await partial_gang_violations(app)
            run.violations.extend(f"pass {number}: {p}" for p in problems)
            if number % 10 == 0 or not pending:
                progress(
                    f"{label}: pass {number}: {len(pending)} pending, "
                    f"{sum(run.gangs_per_pass)} gangs placed"
                )
            released = await release_random(app, rng, release_fraction) if pending else 0
            run.released += released
            run.unmeasured_seconds += time.perf_counter() - unmeasured
            if not pending:
                break
            if not placed and released == 0:
                run.stuck = True
                break
    run.unplaced = len(pending)
    run.gangs_total = sum(1 for a in gangs if a in placed_at)
    run.singles_total = sum(1 for a in placed_at if slots_of[a] == 1)
    # Passes a gang ran through unplaced; one never placed counts every pass.
    run.gang_waits = {a: placed_at.get(a, len(run.pass_seconds) + 1) - 1 for a in gangs}
    return run


def s2_report(run: S2Run) -> dict[str, Any]:
    pass_wall = sum(run.pass_seconds)
    placed = sum(len(p) for p in run.placed_per_pass)
    first_wall = run.pass_seconds[0]
    waits = sorted(run.gang_waits.values())
    head_gangs = {a: n for a, n in run.head_waits.items() if a in run.gang_waits}
    worst = max(head_gangs.items(), key=lambda item: item[1], default=("", 0))
    report: dict[str, Any] = {
        "passes": len(run.pass_seconds),
        "pass_wall_seconds": round(pass_wall, 3),
        "gangs_placed": run.gangs_total,
        "one_slot_placed": run.singles_total,
        "unplaced": run.unplaced,
        "stuck": run.stuck,
        "gang_placements_per_s": rate(run.gangs_total, pass_wall),
        "all_placements_per_s": rate(placed, pass_wall),
        "pass": ms_figures(run.pass_seconds),
        "core_inside_pass": ms_figures(run.core_seconds),
        "gang_placements_per_s_of_core_time_only": rate(run.gangs_total, sum(run.core_seconds)),
        "first_pass": {
            "placed": len(run.placed_per_pass[0]),
            "gangs_placed": run.gangs_per_pass[0],
            "wall_ms": round(first_wall * 1000, 1),
            "gang_placements_per_s": rate(run.gangs_per_pass[0], first_wall),
        },
        "releases": run.released,
        "partial_gangs": {
            "violations": len(run.violations),
            "first_violations": run.violations[:10],
            "checked_after_passes": len(run.pass_seconds),
        },
        "head_of_queue": {
            "first_gang_in_queue_order": {
                "allocation": run.first_gang[0],
                "slots": run.first_gang[1],
                "passes_waited_before_placement": run.gang_waits.get(run.first_gang[0]),
            },
            "gangs_that_waited_at_the_head": len(head_gangs),
            "max_passes_a_gang_waited_at_the_head": worst[1],
            "that_gang": worst[0] or None,
            "max_passes_any_request_waited_at_the_head": max(run.head_waits.values(), default=0),
            "passes_each_gang_waited_from_the_first_pass": {
                "p50": percentile(waits, 50),
                "p99": percentile(waits, 99),
                "max": waits[-1],
            },
        },
        "unmeasured_release_and_check_seconds": round(run.unmeasured_seconds, 2),
    }
    if run.variant == "batched":
        report["pending_reasons_written"] = run.reasons_written
    return report


async def s2(admin_dsn: str, base_url: str, scale: Scale, seed: int) -> dict[str, Any]:
    async with database(admin_dsn, "s2setup", template=base_url) as setup_url:
        async with master(setup_url) as app:
            progress(
                f"S2 setup: {scale.agents} agents, half filled; {scale.s2_gangs} gangs and "
                f"{scale.s2_singles} one-slot trials queued"
            )
            setup = await s2_setup(app, scale)
        fraction = scale.s2_release_fraction
        batched = await s2_run(admin_dsn, setup_url, seed, fraction, naive=False)
        naive = await s2_run(admin_dsn, setup_url, seed, fraction, naive=True)
    batched_report = s2_report(batched)
    naive_report = s2_report(naive)
    violations = len(batched.violations) + len(naive.violations)
    gang_rate = batched_report["gang_placements_per_s"]
    head = batched_report["head_of_queue"]
    return {
        "what": (
            f"{scale.agents} agents x {scale.slots_per_agent} slots, {scale.agents // 2} of "
            f"them full of one-slot trials; queued: {scale.s2_gangs} gangs of "
            f"{'/'.join(map(str, GANG_SIZES))} slots (experiments of {GANGS_PER_BLOCK} gang "
            "trials, sizes cycling) alternating in queue order with experiments of one-slot "
            f"trials ({scale.s2_singles} in all). After every pass a seeded random "
            f"{scale.s2_release_fraction:.0%} of the running allocations are released (COMPLETED) "
            "through release_allocation in one session, until the queue is empty. Rates are "
            "placements / summed wall time of the passes (load + core + writes + commits); "
            "releases and checks are excluded. Both variants start from copies of one "
            "database. Past the first pass the workload is release-bound: a pass can only "
            "place what the releases before it freed. The two variants may place in a "
            "different order: the fair order weighs the usage of running work, which grows "
            "with the time each variant takes."
        ),
        "seed": seed,
        "setup_seconds": setup,
        "batched": batched_report,
        "naive_one_transaction_per_placement": naive_report,
        "same_placements_in_both_variants": batched.placed_per_pass == naive.placed_per_pass,
        "ratio_batched_over_naive_gang_placements_per_s": ratio(
            gang_rate, naive_report["gang_placements_per_s"]
        ),
        "ratio_batched_over_naive_first_pass_wall": ratio(
            naive_report["first_pass"]["wall_ms"], batched_report["first_pass"]["wall_ms"]
        ),
        "targets": {
            "gang_placements_per_s_min": TARGETS["s2_gang_placements_per_s_min"],
            "gang_placements_per_s_met": gang_rate >= TARGETS["s2_gang_placements_per_s_min"],
            "partial_gangs": violations,
            "partial_gangs_met": violations == TARGETS["s2_partial_gangs"],
            "every_gang_placed": batched.unplaced == 0 and not batched.stuck,
            "max_passes_a_gang_waited_at_the_head": head["max_passes_a_gang_waited_at_the_head"],
        },
    }


# --- main ----------------------------------------------------------------------------------


async def run(args: argparse.Namespace) -> dict[str, Any]:
    mode = common.mode_of(args)
    scale = {"full": Scale.full, "quick": Scale.quick, "smoke": Scale.smoke}[mode]()
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    progress(f"{mode} run against {args.postgres}")
    facts = host_facts(("sqlalchemy", "asyncpg", "fastapi", "httpx", "pydantic"))
    try:
        facts["postgres"] = await common.postgres_facts(args.postgres)
    except (OSError, asyncpg.PostgresError) as exc:
        raise SystemExit(f"cannot use PostgreSQL at {args.postgres}: {exc}") from exc
    if facts["postgres"]["fsync"] != "on":
        raise SystemExit(f"PostgreSQL has fsync={facts['postgres']['fsync']}; it must be on")
    try:
        async with database(args.postgres, "base") as base_url:
            async with master(base_url):
                pass  # migrated and seeded once, as a new det-master leaves a database
            s1_result = await s1(args.postgres, base_url, scale, args.seed)
            s2_result = await s2(args.postgres, base_url, scale, args.seed)
    finally:
        await drop_databases(args.postgres)
    return {
        "benchmark": "resolute scheduler, issue 3 (S1, S2)",
        "mode": mode,
        "command": " ".join(["python -m benchmarks.bench_scheduler", *sys.argv[1:]]),
        "started_at": started_at,
        "total_seconds": round(seconds_since_start(), 1),
        "machine": facts,
        "scale": asdict(scale),
        "s1": s1_result,
        "s2": s2_result,
    }


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_scheduler",
        description="Scheduler benchmark (issue 3); prints one JSON document on stdout.",
    )
    common.add_shape_flags(
        parser,
        quick="every workload 10x smaller",
        smoke="16 agents, a few hundred trials: seconds, for the smoke test",
    )
    parser.add_argument(
        "--postgres",
        default=DEFAULT_ADMIN_DSN,
        help="admin DSN: a database is created and dropped per measurement (default: "
        "%(default)s, or RESOLUTE_BENCH_POSTGRES / RESOLUTE_TEST_POSTGRES)",
    )
    parser.add_argument("--seed", type=int, default=3, help="seeds the S2 releases")
    parser.add_argument("--out", type=Path, help="also write the JSON document here")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    # The master logs every state change at INFO; only its warnings reach stderr here.
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    common.emit_report(asyncio.run(run(args)), args.out)


if __name__ == "__main__":
    main()
