"""`det-agent`: offer this machine's GPUs (or CPU slots) to a master and run the ranks it sends."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import sys
from pathlib import Path
from typing import Any

import typer
from pydantic import ValidationError

from agent import bootstrap
from agent.devices import detect_devices
from agent.gpu import open_nvml
from agent.link import Agent, Refused
from agent.netif import list_interfaces
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
    }
    try:
        settings = AgentSettings(**{k: v for k, v in given.items() if v is not None})
    except ValidationError as exc:
        for err in exc.errors():
            where = ".".join(str(p) for p in err["loc"]) or "settings"
            typer.echo(f"det-agent: setting {where}: {err['msg']}", err=True)
        raise typer.Exit(2) from None
    _configure_logging(settings)
    if not settings.join_token:
        typer.echo(
            "det-agent: no join token: pass --join-token or --join-token-file "
            "(the master keeps it in <data_dir>/agent_join_token)",
            err=True,
        )
        raise typer.Exit(2)
    sys.exit(asyncio.run(_serve(settings)))


async def _serve(settings: AgentSettings) -> int:
    gpu = open_nvml()
    devices = detect_devices(settings.artificial_slots, gpu)
    settings.work_dir.mkdir(parents=True, exist_ok=True)
    agent = Agent(settings, devices, list_interfaces(), SystemSampler(gpu))
    agent.runner.namespace_problem = await asyncio.to_thread(
        bootstrap.probe_namespaces, settings.work_dir
    )
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


def main() -> None:
    app()
