"""Simulated agents for tests and the benchmark, until the real agent lands.

They register and report exits through the SAME service functions that the agent protocol
calls (`master.services.agents.register_agent`, `master.services.release.release_allocation`),
writing straight into a running master's database. Nothing here talks to the scheduler: the
master's scheduler loop (a pass every <= 0.5 s) sees the change on its own, so tests poll the
API until the state they expect appears.

`db_url` is what was given to `det-master --db-url`: "" means SQLite at
<data_dir>/resolute.db, so pass the master's `data_dir` too in that case.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from master.db.session import create_engine, create_session_factory, session_scope
from master.services.agents import AgentRegistration, Device, register_agent
from master.services.allocations import ReleaseOutcome
from master.services.release import release_allocation
from master.settings import (
    DatabaseSettings,
    MasterSettings,
    ResourcePoolSettings,
    async_database_url,
)

T = TypeVar("T")

SIMULATED_BRAND = "simulated"
SIMULATED_VERSION = "sim"


def master_settings(
    db_url: str,
    data_dir: Path | str | None = None,
    resource_pools: Sequence[ResourcePoolSettings] | None = None,
) -> MasterSettings:
    """Settings equivalent to those of a `det-master` started with these flags and no config
    file: the default pools unless told otherwise. Explicit values, so DET_MASTER_* variables
    in the test environment (which the e2e fixture strips from the master) change nothing."""
    pools = list(resource_pools) if resource_pools else [ResourcePoolSettings(pool_name="default")]
    return MasterSettings(
        data_dir=Path(data_dir) if data_dir is not None else Path("data"),
        db=DatabaseSettings(url=db_url),
        resource_pools=pools,
        default_compute_pool=pools[0].pool_name,
        run_loops=False,
        migrate_on_start=False,
    )


def _url(db_url: str, data_dir: Path | str | None) -> str:
    if not db_url and data_dir is None:
        raise ValueError("db_url is empty (SQLite in the data dir): pass the master's data_dir")
    return async_database_url(db_url, Path(data_dir) if data_dir is not None else Path("data"))


def registration(
    agent_id: str, slots: int, pool: str = "default", device_type: str = "cpu"
) -> AgentRegistration:
    """What a simulated agent with `slots` devices would send when it connects."""
    return AgentRegistration(
        id=agent_id,
        resource_pool=pool,
        devices=tuple(
            Device(slot_id=i, type=device_type, brand=SIMULATED_BRAND) for i in range(slots)
        ),
        addresses=("127.0.0.1",),
        version=SIMULATED_VERSION,
        hostname=agent_id,
    )


async def register_simulated_agents(
    db_url: str,
    agents: Sequence[tuple[str, int]],
    pool: str = "default",
    device_type: str = "cpu",
    *,
    data_dir: Path | str | None = None,
    settings: MasterSettings | None = None,
) -> None:
    """Register (or re-register) agents `(id, slot count)` in one transaction."""
    settings = settings or master_settings(db_url, data_dir)
    engine = create_engine(_url(db_url, data_dir))
    try:
        factory = create_session_factory(engine)
        async with session_scope(factory) as session:
            for agent_id, slots in agents:
                await register_agent(
                    session, settings, registration(agent_id, slots, pool, device_type)
                )
    finally:
        await engine.dispose()


async def release(
    db_url: str,
    allocation_id: str,
    outcome: ReleaseOutcome | str = ReleaseOutcome.COMPLETED,
    message: str = "",
    *,
    data_dir: Path | str | None = None,
) -> None:
    """Every process of the allocation has exited with `outcome`, as its agent would report."""
    engine = create_engine(_url(db_url, data_dir))
    try:
        factory = create_session_factory(engine)
        async with session_scope(factory) as session:
            await release_allocation(session, allocation_id, ReleaseOutcome(outcome), message)
    finally:
        await engine.dispose()


def _run(coro: Coroutine[Any, Any, T]) -> T:
    # A thread of its own, so that this works whether or not the caller runs an event loop.
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coro).result()


def register_simulated_agents_sync(
    db_url: str,
    agents: Sequence[tuple[str, int]],
    pool: str = "default",
    device_type: str = "cpu",
    *,
    data_dir: Path | str | None = None,
    settings: MasterSettings | None = None,
) -> None:
    _run(
        register_simulated_agents(
            db_url, agents, pool, device_type, data_dir=data_dir, settings=settings
        )
    )


def release_sync(
    db_url: str,
    allocation_id: str,
    outcome: ReleaseOutcome | str = ReleaseOutcome.COMPLETED,
    message: str = "",
    *,
    data_dir: Path | str | None = None,
) -> None:
    _run(release(db_url, allocation_id, outcome, message, data_dir=data_dir))
