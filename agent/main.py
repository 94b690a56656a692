"""`det-agent`: offer this machine's GPUs (or CPU slots) to a master and run the ranks it sends."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

import typer
from pydantic import ValidationError

from agent import bootstrap, containers, ports
from agent.devices import detect_devices
from agent.gpu import open_nvml
from agent.link import Agent, Refused
from agent.netif import list_interfaces
from agent.rank_user import (
    DEFAULT_BLOCK,
    DEFAULT_UID_SPACE,
    SETPRIV,
    RankUser,
    UidPool,
    default_uid_range,
    for_agent,
    for_range,
    lookup,
    parse_uid_range,
    range_user,
    reach_problem,
    run_problem,
)
from agent.sampler import SystemSampler
from agent.settings import AgentSettings

log = logging.getLogger("agent")

EXIT_REFUSED = 3

app = typer.Typer(
    name="det-agent",
    help="The resolute agent.",
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(
            {
                "time": self.formatTime(record),
                "level": record.levelname,
                "logger": record.name,
                "message": record.getMessage(),
            }
        )


def _configure_logging(settings: AgentSettings) -> None:
    handler = logging.StreamHandler()
    if settings.log_format == "json":
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(
            logging.Formatter(f"%(asctime)s %(levelname)s [{settings.id}] %(name)s: %(message)s")
        )
    logging.basicConfig(level=settings.log_level, handlers=[handler], force=True)


@app.command()
def run(
    master: str | None = typer.Option(
        None, "--master", help="Master agent port HOST:PORT (DET_AGENT_MASTER)."
    ),
    agent_id: str | None = typer.Option(None, "--id", help="Agent id (DET_AGENT_ID)."),
    resource_pool: str | None = typer.Option(
        None, "--resource-pool", help="Resource pool (DET_AGENT_RESOURCE_POOL)."
    ),
    artificial_slots: int | None = typer.Option(
        None, "--artificial-slots", help="Offer N CPU slots (DET_AGENT_ARTIFICIAL_SLOTS)."
    ),
    work_dir: Path | None = typer.Option(
        None, "--work-dir", help="Per-allocation directories (DET_AGENT_WORK_DIR)."
    ),
    join_token: str | None = typer.Option(
        None, "--join-token", help="The master's join token (DET_AGENT_JOIN_TOKEN)."
    ),
    join_token_file: Path | None = typer.Option(
        None, "--join-token-file", help="Read the join token from a file."
    ),
    rank_user: str | None = typer.Option(
        None,
        "--rank-user",
        help="Run every rank as this user instead of a uid of its own per allocation; "
        "`root` keeps ranks as root, warned about at start (DET_AGENT_RANK_USER).",
    ),
    rank_group: str | None = typer.Option(
        None, "--rank-group", help="The ranks' group (DET_AGENT_RANK_GROUP)."
    ),
    rank_uid_range: str | None = typer.Option(
        None,
        "--rank-uid-range",
        help="START-END: run each allocation's ranks as a uid of their own from this range; "
        f"an agent running as root without --rank-user uses a block of {DEFAULT_BLOCK} "
        f"of {DEFAULT_UID_SPACE} picked by its id "
        "(DET_AGENT_RANK_UID_RANGE).",
    ),
    port_range: str | None = typer.Option(
        None,
        "--port-range",
        help="START-END: ports for a trial's rendezvous, outside the kernel's ephemeral "
        "range (DET_AGENT_PORT_RANGE).",
    ),
    master_cert_file: Path | None = typer.Option(
        None,
        "--master-cert",
        help="CA file to verify the master's certificate with; dials with TLS "
        "(DET_AGENT_MASTER_CERT_FILE).",
    ),
    master_cert_name: str | None = typer.Option(
        None,
        "--master-cert-name",
        help="Name to verify on the master's certificate instead of its host "
        "(DET_AGENT_MASTER_CERT_NAME).",
    ),
    container_runtime: str | None = typer.Option(
        None,
        "--container-runtime",
        help="podman, docker or none: run launches that name environment.image in "
        "containers (DET_AGENT_CONTAINER_RUNTIME).",
    ),
    insecure_registry: list[str] | None = typer.Option(
        None,
        "--insecure-registry",
        help="HOST[:PORT] podman pulls from without TLS verification; repeatable "
        "(DET_AGENT_INSECURE_REGISTRIES).",
    ),
) -> None:
    """Connect to the master and serve until stopped (SIGTERM or Ctrl-C)."""
    given: dict[str, Any] = {
        "master": master,
        "id": agent_id,
        "resource_pool": resource_pool,
        "artificial_slots": artificial_slots,
        "work_dir": work_dir,
        "join_token": join_token,
        "join_token_file": join_token_file,
        "rank_user": rank_user,
        "rank_group": rank_group,
        "rank_uid_range": rank_uid_range,
        "port_range": port_range,
        "master_cert_file": master_cert_file,
        "master_cert_name": master_cert_name,
        "container_runtime": container_runtime,
        "insecure_registries": insecure_registry or None,
    }
    try:
        settings = AgentSettings(**{k: v for k, v in given.items() if v is not None})
    except ValidationError as exc:
        for err in exc.errors():
            where = ".".join(str(p) for p in err["loc"]) or "settings"
            typer.echo(f"det-agent: setting {where}: {err['msg']}", err=True)
        raise typer.Exit(2) from None
    _configure_logging(settings)
    if not settings.join_token and not settings.credential_path.exists():
        typer.echo(
            "det-agent: no join token and no credential yet: pass --join-token-file "
            "(the master keeps it in <data_dir>/agent_join_token) for the first start",
            err=True,
        )
        raise typer.Exit(2)
    if join_token:
        log.warning(
            "--join-token is readable by every process of this machine in /proc/<pid>/cmdline, "
            "ranks included: use --join-token-file or DET_AGENT_JOIN_TOKEN"
        )
    if settings.master_cert_file is None and not _all_loopback(settings.master):
        log.warning(
            "the link to master %s is not encrypted: its join token and this agent's "
            "credential cross the network in the clear; give the master a certificate "
            "(security.tls) and this agent --master-cert",
            settings.master,
        )
    # As root, ranks get a uid of their own per allocation unless the admin names their user
    # (root included, explicitly): the safe way is the default.
    by_default = os.geteuid() == 0 and not settings.rank_user and not settings.rank_uid_range
    try:
        if settings.rank_uid_range or by_default:
            uids, rank = _rank_uids(settings, by_default), None
        else:
            uids, rank = None, _rank_user(settings)
    except ValueError as exc:
        field = "rank_user" if settings.rank_user else "rank_uid_range"
        typer.echo(f"det-agent: setting {field}: {exc}", err=True)
        if by_default:
            typer.echo(
                f"det-agent: as root, this agent runs each allocation's ranks as a uid of "
                f"their own from {DEFAULT_UID_SPACE} unless told otherwise: fix the above, "
                "set --rank-uid-range or --rank-user, or pass --rank-user root to keep ranks "
                "as root (they can then read the agent's secrets and every trial's files)",
                err=True,
            )
        raise typer.Exit(2) from None
    sys.exit(asyncio.run(_serve(settings, rank, uids)))


def _rank_user(settings: AgentSettings) -> RankUser | None:
    """Whom the ranks run as (None: the agent's user); ValueError says why the agent
    must not start. Warns once about what stays readable to the ranks."""
    try:
        wanted = lookup(settings.rank_user, settings.rank_group) if settings.rank_user else None
    except LookupError as exc:
        raise ValueError(str(exc)) from None
    rank, warnings = for_agent(
        wanted,
        euid=os.geteuid(),
        egid=os.getegid(),
        setpriv=SETPRIV,
        join_token_file=settings.join_token_file,
    )
    for warning in warnings:
        log.warning("%s", warning)
    if rank is not None and SETPRIV is not None:
        _check_reach(settings, rank, SETPRIV)
        log.info("ranks run as user %s (uid %d, gid %d)", rank.name, rank.uid, rank.gid)
    return rank


def _rank_uids(settings: AgentSettings, by_default: bool = False) -> UidPool:
    """The uids each allocation's ranks take one of (rank_uid_range, or the agent's block
    of DEFAULT_UID_SPACE `by_default`); ValueError says why the agent must not start."""
    if settings.rank_uid_range:
        pool = UidPool(*parse_uid_range(settings.rank_uid_range))
    else:
        pool = UidPool(*default_uid_range(settings.id))
    warnings = for_range(
        pool, euid=os.geteuid(), setpriv=SETPRIV, join_token_file=settings.join_token_file
    )
    for warning in warnings:
        log.warning("%s", warning)
    assert SETPRIV is not None  # for_range refuses without it
    # Every uid of the range is "other" to the work dir: the first stands for them all.
    _check_reach(settings, range_user(pool.first), SETPRIV)
    log.info(
        "ranks run as a uid of their own per allocation, from %s%s, in their owner's group",
        pool,
        " (the default for an agent running as root)" if by_default else "",
    )
    return pool


def _check_reach(settings: AgentSettings, rank: RankUser, setpriv: str) -> None:
    settings.work_dir.mkdir(parents=True, exist_ok=True)
    problem = reach_problem(rank, settings.work_dir, setpriv)
    if problem:
        raise ValueError(problem)
    problem = run_problem(rank, sys.executable, setpriv)
    if problem:  # an entrypoint may name another interpreter: warn, don't refuse
        log.warning("%s", problem)


async def _serve(
    settings: AgentSettings, rank: RankUser | None = None, uids: UidPool | None = None
) -> int:
    gpu = open_nvml()
    devices = detect_devices(settings.artificial_slots, gpu)
    settings.work_dir.mkdir(parents=True, exist_ok=True)
    agent = Agent(settings, devices, list_interfaces(), SystemSampler(gpu))
    agent.runner.master_cert_file = settings.master_cert_file
    agent.runner.master_cert_name = settings.master_cert_name
    agent.runner.rank_user = rank
    agent.runner.rank_uids = uids
    agent.runner.withheld = (settings.join_token,)
    warning = ports.overlap_warning(
        ports.parse_port_range(settings.port_range), ports.ephemeral_range()
    )
    if warning:
        log.warning("%s", warning)
    agent.runner.namespace_problem = await asyncio.to_thread(
        bootstrap.probe_namespaces, settings.work_dir
    )
    if settings.container_runtime != "none":
        try:
            runtime = await asyncio.to_thread(
                containers.find_runtime, settings.container_runtime, settings.insecure_registries
            )
        except ValueError as exc:
            log.error("%s", exc)
            return 2
        # What this agent's id left running when it was last killed: its trials were
        # placed again elsewhere by now (or will be), so none of it may run on.
        left = await asyncio.to_thread(containers.remove_leftovers, runtime, settings.id)
        if left:
            log.warning(
                "removed %d container(s) an earlier run left: %s", len(left), " ".join(left)
            )
        agent.runner.use_runtime(runtime)
        log.info("launches that name an image run in containers (%s)", runtime.binary)
    if agent.runner.namespace_problem:
        # Said once, here; every Determined-style launch is then refused with it.
        log.warning(
            "Determined-style (per-agent) launches are disabled on this agent: %s",
            agent.runner.namespace_problem,
        )
    log.info(
        "agent %s: %d %s slot(s), master %s",
        settings.id,
        len(devices),
        devices[0].type if devices else "no",
        settings.master,
    )
    try:
        return await _run(agent)
    finally:
        agent.fence.close()  # closing its stdin ends it, once no rank is left to guard


async def _run(agent: Agent) -> int:
    serving = asyncio.create_task(agent.run())
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    waiting = asyncio.create_task(stopping.wait())
    await asyncio.wait([serving, waiting], return_when=asyncio.FIRST_COMPLETED)
    waiting.cancel()
    if serving.done():
        try:
            serving.result()
        except Refused as exc:
            log.error("the master refused this agent: %s", exc)
            return EXIT_REFUSED
        return 0
    # Stop the ranks while the link is up, so the master hears how they ended instead of
    # waiting out the lost-agent window.
    log.info("stopping: stopping every rank")
    with contextlib.suppress(Exception):
        await agent.runner.shutdown()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(agent.drained(), timeout=3.0)
    serving.cancel()
    with contextlib.suppress(asyncio.CancelledError, Refused):
        await serving
    return 0


def _all_loopback(masters: str) -> bool:
    for address in masters.split(","):
        host = address.strip().rpartition(":")[0].strip("[]")
        if host == "localhost":
            continue
        try:
            if not ipaddress.ip_address(host).is_loopback:
                return False
        except ValueError:
            return False  # a host name: somewhere on the network
    return True


def main() -> None:
    app()
