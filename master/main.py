"""`det-master`: run the master (default) or only migrate its database."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import ssl
import sys
from pathlib import Path
from typing import Any

import typer
import uvicorn
from pydantic import ValidationError
from uvicorn.config import STARTUP_FAILURE

from master import certs
from master.app import create_app
from master.db.migrate import upgrade_to_head
from master.db.session import create_engine
from master.settings import MasterSettings

log = logging.getLogger("master")

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
    # httpx logs every request at INFO: one line per webhook delivery and object-store call.
    # The webhook shipper logs what matters (failures, give-ups) itself.
    if logging.getLogger().getEffectiveLevel() > logging.DEBUG:
        logging.getLogger("httpx").setLevel(logging.WARNING)


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
    tls = settings.security.tls
    announce_transport(settings)
    application = create_app(settings)
    config = uvicorn.Config(
        application,
        host=settings.host,
        port=settings.port,
        log_config=None,
        access_log=False,
        # Open log follow streams would otherwise hold a stopping master up forever.
        timeout_graceful_shutdown=5,
        # A PROTOCOL_TLS_SERVER context refuses anything older than TLS 1.2 (Python 3.10+).
        ssl_certfile=tls.cert_file,
        ssl_keyfile=tls.key_file,
        ssl_version=ssl.PROTOCOL_TLS_SERVER,
    )
    server = _Server(config, application)
    with contextlib.suppress(KeyboardInterrupt):
        server.run()
    if not server.started:  # as uvicorn.run ends: the port taken, the app's start failed
        sys.exit(STARTUP_FAILURE)


class _Server(uvicorn.Server):
    """uvicorn's server, which on SIGTERM/SIGINT also ends the trials' preemption long
    polls (up to 60 s each): uvicorn waits for open requests before the app's shutdown, and
    a stopping master should not wait out its grace period on polls that mean nothing."""

    def __init__(self, config: uvicorn.Config, application: Any) -> None:
        super().__init__(config)
        self.application = application

    def handle_exit(self, sig: int, frame: Any) -> None:
        super().handle_exit(sig, frame)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # not serving yet
            return
        # A signal handler runs between two bytecodes of the loop's thread: hand the
        # wake-up to the loop rather than touch its events from here.
        loop.call_soon_threadsafe(self.application.state.preemption.close)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def announce_transport(settings: MasterSettings) -> None:
    """One line at start saying whether the ports speak TLS; plain text reachable from other
    machines is a warning."""
    tls = settings.security.tls
    http = f"{settings.host}:{settings.port}"
    agents = f"{settings.agent_link.host}:{settings.agent_link.port}"
    if tls.enabled:
        assert tls.key_file is not None
        if tls.key_file.stat().st_mode & 0o077:
            log.warning(
                "security.tls.key_file %s is readable by other users; chmod 600 it", tls.key_file
            )
        log.info(
            "TLS on: https on %s and the agent port %s present %s", http, agents, tls.cert_file
        )
        return
    exposed = not (_loopback(settings.host) and _loopback(settings.agent_link.host))
    log.log(
        logging.WARNING if exposed else logging.INFO,
        "TLS off: plain HTTP on %s and plain gRPC on the agent port %s%s; set "
        "security.tls.cert_file and key_file (`det-master certs` makes a pair)",
        http,
        agents,
        ": passwords, tokens and the join token cross the network in the clear"
        if exposed
        else " (loopback only: fine for development)",
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


@app.command("certs")
def make_certs(
    out: Path = typer.Option(
        ..., "--out", help="Directory for ca.crt, ca.key, master.crt, master.key."
    ),
    hosts: list[str] | None = typer.Option(
        None,
        "--host",
        help="A name or IP address clients and agents use for the master (repeatable; "
        "default: localhost, 127.0.0.1 and this machine's host name).",
    ),
    force: bool = typer.Option(False, "--force", help="Replace files that exist."),
) -> None:
    """Make a self-signed CA and a master certificate it signs, for a quick start with TLS."""
    names = hosts or certs.default_hosts()
    try:
        files = certs.generate(out, names, force=force)
    except certs.CertError as exc:
        typer.echo(f"det-master certs: {exc}", err=True)
        raise typer.Exit(2) from None
    typer.echo(certs.usage(files, names))


def main() -> None:
    sys.exit(app())
