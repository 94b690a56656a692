"""Submit-time checks of an experiment's bind_mounts: targets that would cover the trial's
own files (master.core.mounts), and host paths that do not exist where the master can
see them. The agent checks the host paths again before anything of the trial runs."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from master.core import mounts
from master.core.errors import ConfigError, ConfigProblem
from master.db.models import AgentModel
from master.services.model_definitions import archive_paths


async def check_bind_mounts(
    session: AsyncSession, pool_name: str, effective: dict[str, Any], archive: bytes
) -> None:
    """Raises ConfigError naming each bind_mounts problem (every one at once)."""
    requested = mounts.requested_mounts(effective)
    if not requested:
        return
    storage = effective.get("checkpoint_storage") or {}
    problems = mounts.mount_problems(
        requested,
        await asyncio.to_thread(archive_paths, archive),
        shared_fs=isinstance(storage, dict) and storage.get("type") == "shared_fs",
    )
    if await _shares_host_with_pool(session, pool_name):
        problems += await asyncio.to_thread(_missing_host_paths, requested, pool_name)
    if problems:
        raise ConfigError(problems)


def _missing_host_paths(
    requested: Sequence[mounts.MountRequest], pool_name: str
) -> list[ConfigProblem]:
    return [
        ConfigProblem(
            f"bind_mounts.{index}.host_path",
            f"{mount.host_path} does not exist (checked on {socket.gethostname()}, the host "
            f"of the master and of every agent of resource pool {pool_name})",
        )
        for index, mount in enumerate(requested)
        if not os.path.exists(mount.host_path)
    ]


async def _shares_host_with_pool(session: AsyncSession, pool_name: str) -> bool:
    """True when the pool has connected agents and all of them run on the master's host
    (as in a local cluster): only then does the master's file system answer for theirs."""
    hostnames = set(
        await session.scalars(
            select(AgentModel.hostname).where(
                AgentModel.resource_pool == pool_name,
                AgentModel.connected.is_(True),
                AgentModel.revoked_at.is_(None),
            )
        )
    )
    return hostnames == {socket.gethostname()}
