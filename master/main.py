"""`det-master`: run the master (default) or only migrate its database."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from pathlib import Path
from typing import Any

import typer
import uvicorn
from pydantic import ValidationError

from master.app import create_app
from master.db.migrate import upgrade_to_head
from master.db.session import create_engine
from master.settings import MasterSettings

app = typer.Typer(
    name="det-master",
    help="The resolute master.",
    no_args_is_help=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    add_completion=False,
)


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": self.formatTime(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def configure_logging(settings: MasterSettings) -> None:
    handler = logging.StreamHandler()
    if settings.log_format == "json":
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=settings.log_level, handlers=[handler], force=True)


def load_settings(**overrides: Any) -> MasterSettings:
    given = {k: v for k, v in overrides.items() if v is not None}
    try:
        return MasterSettings(**given)
    except ValidationError as exc:
        for err in exc.errors():
            where = ".".join(str(p) for p in err["loc"])
            typer.echo(f"det-master: setting {where}: {err['msg']}", err=True)
        raise typer.Exit(2) from None


def _overrides(
    port: int | None,
    db_url: str | None,
    data_dir: Path | None,
    host: str | None,
    agent_port: int | None = None,
) -> dict[str, Any]:
    out: dict[str, Any] = {"port": port, "data_dir": data_dir, "host": host}
    if db_url is not None:
        out["db"] = {"url": db_url}
    if agent_port is not None or host is not None:
        link: dict[str, Any] = {}
        if agent_port is not None:
            link["port"] = agent_port
        if host is not None:
            link["host"] = host
        out["agent_link"] = link
    return out


PortOpt = typer.Option(None, "--port", help="HTTP port (DET_MASTER_PORT, default 8080).")
DbOpt = typer.Option(None, "--db-url", help="Database URL (DET_MASTER_DB__URL); default SQLite.")
DataOpt = typer.Option(None, "--data-dir", help="Data directory (DET_MASTER_DATA_DIR).")
HostOpt = typer.Option(
    None,
    "--host",
    help="Listen address of both ports (DET_MASTER_HOST, DET_MASTER_AGENT_LINK__HOST).",
)
AgentPortOpt = typer.Option(
    None, "--agent-port", help="Agent gRPC port (DET_MASTER_AGENT_LINK__PORT, default 8090)."
)


@app.callback(invoke_without_command=True)
def run(
    ctx: typer.Context,
    port: int | None = PortOpt,
    db_url: str | None = DbOpt,
    data_dir: Path | None = DataOpt,
    host: str | None = HostOpt,
    agent_port: int | None = AgentPortOpt,
) -> None:
    """Start the master (HTTP API on --host:--port, agents on --host:--agent-port)."""
    if ctx.invoked_subcommand is not None:
        ctx.obj = _overrides(port, db_url, data_dir, host)
        return
    settings = load_settings(**_overrides(port, db_url, data_dir, host, agent_port))
    configure_logging(settings)
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_config=None,
        access_log=False,
        # Open log follow streams would otherwise hold a stopping master up forever.
        timeout_graceful_shutdown=5,
    )


@app.command()
def migrate(
    ctx: typer.Context,
    db_url: str | None = DbOpt,
    data_dir: Path | None = DataOpt,
) -> None:
    """Upgrade the database schema to the newest version and exit."""
    given = {k: v for k, v in (ctx.obj or {}).items() if v is not None}
    given.update(
        {k: v for k, v in _overrides(None, db_url, data_dir, None).items() if v is not None}
    )
    settings = load_settings(**given)
    configure_logging(settings)
    settings.data_dir.mkdir(parents=True, exist_ok=True)

    async def _run() -> None:
        engine = create_engine(settings.database_url)
        try:
            await upgrade_to_head(engine)
        finally:
            await engine.dispose()

    asyncio.run(_run())
    typer.echo("database is at the newest schema")


def main() -> None:
    sys.exit(app())
