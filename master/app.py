"""The FastAPI application: start-up (migrate, seed), routes, error rendering."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import ipaddress
import logging
import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import grpc
from fastapi import FastAPI, Response
from fastapi.responses import RedirectResponse
from sqlalchemy.ext.asyncio import AsyncSession
from starlette.datastructures import State
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from master import web
from master.api.errors import error_response, install_error_handlers
from master.api.proxy import ProxyPool
from master.api.routes import (
    auth,
    cluster,
    commands,
    experiments,
    health,
    info,
    logs,
    model_registry,
    proxy,
    quotas,
    roles,
    templates,
    trial_sources,
    trials,
    user_groups,
    users,
    webhooks,
    workspaces,
)
from master.db.migrate import upgrade_to_head
from master.db.session import (
    DatabaseHealth,
    create_engine,
    create_session_factory,
    session_scope,
)
from master.grpc_server import start_server
from master.services import access, interactive
from master.services import allocations as allocation_service
from master.services import auth as auth_service
from master.services import workspaces as workspace_service
from master.services.agent_enrolment import read_or_create_join_token
from master.services.agent_link import AgentHub, HubLoop
from master.services.checkpoint_gc import CheckpointDeleter
from master.services.leadership import Leadership, install_fence
from master.services.log_retention import LogRetentionLoop
from master.services.loops import DatabaseWatch, Loop
from master.services.master_logs import MasterLogBuffer
from master.services.metrics import MetricsBuffer, MetricsLoop
from master.services.preemption import PreemptionSignals
from master.services.scheduler import SchedulerLoop
from master.services.webhooks import WebhookShipper
from master.settings import MasterSettings
from master.version import __version__
from master.web.common import COOKIE, PROXY_COOKIE

log = logging.getLogger(__name__)

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


class BodyLimitMiddleware:
    """Refuses request bodies over the limit before they are buffered in full."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(scope, receive, send)
            return
        seen = 0

        async def counting_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise _BodyTooLarge
            return message

        try:
            await self.app(scope, counting_receive, send)
        except _BodyTooLarge:
            await self._refuse(scope, receive, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        limit_mib = self.max_bytes / 2**20
        # Through the proxy it is an upload to a notebook, not an experiment's files.
        what = (
            "uploads through the proxy are limited to this"
            if scope["path"].startswith("/proxy/")
            else "the model definition is too large"
        )
        response = error_response(413, 8, f"request body is over {limit_mib:.0f} MiB; {what}", [])
        await response(scope, receive, send)


class _BodyTooLarge(Exception):
    pass


class StandbyRedirectsWrites:
    """A standby serves reads from the shared database and sends writes to the leader (307
    keeps the method and body), or answers 503 while none leads. Plain ASGI, not Starlette's
    BaseHTTPMiddleware: that one costs every request a task and a stream (issue 27)."""

    def __init__(self, app: ASGIApp, state: State) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        leadership: Leadership | None = getattr(self.state, "leadership", None)
        if (
            scope["type"] != "http"
            or leadership is None
            or leadership.leading
            or scope["method"] in SAFE_METHODS
        ):
            await self.app(scope, receive, send)
            return
        response: Response
        if leadership.leader_url:
            query = scope.get("query_string", b"").decode("latin-1")
            target = f"{leadership.leader_url}{scope['path']}{'?' + query if query else ''}"
            response = RedirectResponse(target, status_code=307)
        else:
            response = error_response(
                503, 14, "no master leads yet; retry shortly", [], {"Retry-After": "2"}
            )
        await response(scope, receive, send)


class JsonBodyMiddleware:
    """Reads every API request body as JSON whatever its Content-Type, as Determined's
    gateway does: its trial harness posts without one, and `curl -d` sends
    application/x-www-form-urlencoded. Multipart bodies are left as they are."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and scope["method"] in ("POST", "PUT", "PATCH")
            and scope["path"].startswith("/api/")
        ):
            headers = [(k, v) for k, v in scope["headers"] if k != b"content-type"]
            declared = dict(scope["headers"]).get(b"content-type", b"")
            if not declared.lower().startswith(b"multipart/"):
                scope = {**scope, "headers": [*headers, (b"content-type", b"application/json")]}
        await self.app(scope, receive, send)


def request_body_limit(settings: MasterSettings) -> int:
    # base64 makes the model definition 4/3 larger; leave room for the config and JSON framing.
    return int(settings.max_model_definition_bytes * 4 / 3) + 4 * 2**20


def create_app(settings: MasterSettings) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # From the first line on, what `det master logs` shows.
        master_logs: MasterLogBuffer = app.state.master_logs
        master_logs.attach(asyncio.get_running_loop())
        logging.getLogger().addHandler(master_logs)
        try:
            async with _serving(app) as served:
                yield served
        finally:
            logging.getLogger().removeHandler(master_logs)

    @asynccontextmanager
    async def _serving(app: FastAPI) -> AsyncIterator[None]:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        engine = create_engine(settings.database_url, echo=settings.db.echo)
        app.state.engine = engine
        app.state.session_factory = create_session_factory(engine)
        db_health = DatabaseHealth()
        app.state.db_health = db_health
        if settings.migrate_on_start:
            await upgrade_to_head(engine)
        leadership: Leadership | None = None
        if settings.ha.enabled:
            leadership = Leadership(
                app.state.session_factory,
                master_id=app.state.master_id,
                url=settings.master_url,
                lease_s=settings.ha.lease_s,
            )
            install_fence(app.state.session_factory, leadership)
        app.state.leadership = leadership

        async def prepare_the_database() -> None:
            async with session_scope(app.state.session_factory) as session:
                await auth_service.ensure_default_users(
                    session, settings.security.initial_user_password
                )
                await _refuse_open_default_users(session, settings)
                await workspace_service.ensure_defaults(session)
                await allocation_service.ensure_scheduler_state(session)
                await access.ensure_access_state(session)
                await allocation_service.enqueue_orphaned_trials(session)

        if leadership is None:
            try:
                await prepare_the_database()
            except EmptyPasswordsOnNetwork:
                # Said once above, without the server's traceback around it: a refusal,
                # not a crash. (Leaders check in lead() and exit through its failure path.)
                logging.shutdown()
                os._exit(EXIT_REFUSED)
        # Everything built so far lives as long as the process: keep it out of the
        # collector's full passes, which otherwise walk it all while a request waits.
        gc.freeze()
        scheduler = SchedulerLoop(app.state.session_factory, settings)
        app.state.scheduler = scheduler
        metrics = MetricsBuffer()
        app.state.metrics_buffer = metrics
        hub = AgentHub(
            app.state.session_factory,
            settings,
            master_id=app.state.master_id,
            cluster_id=app.state.cluster_id,
            join_token=read_or_create_join_token(settings),
            metrics=metrics,
            wake_scheduler=scheduler.wake,
            preemption=app.state.preemption,
            health=db_health,
            leadership=leadership,
        )
        app.state.agent_hub = hub
        # The tick stays as the safety net; placements and stop requests wake it at once.
        hub_loop = HubLoop(hub)
        app.state.hub_loop = hub_loop
        scheduler.after_commit = hub_loop.wake
        # Deliveries go out from their own task: a slow receiver never holds up a pass.
        webhook_shipper = WebhookShipper(app.state.session_factory, settings)
        webhook_shipper.scheduler_idle = scheduler.idle  # and it sends between passes
        app.state.webhook_shipper = webhook_shipper
        loops: list[Loop] = [
            DatabaseWatch(app.state.session_factory, db_health),
            scheduler,
            hub_loop,
            MetricsLoop(app.state.session_factory, metrics, settings),
            # Projects and workspaces being deleted go once their experiments have.
            CheckpointDeleter(
                app.state.session_factory,
                after_pass=workspace_service.finish_deletions,
                pending=workspace_service.deletions_pending,
            ),
            interactive.IdleLoop(
                app.state.session_factory, app.state.task_activity, settings.idle_check_interval_s
            ),
            LogRetentionLoop(
                app.state.session_factory,
                settings.retention_policy.log_retention_days,
                settings.retention_policy.interval_s(),
            ),
            webhook_shipper,
        ]
        for loop in loops:
            loop.health = db_health
        servers: list[grpc.aio.Server] = []

        async def lead() -> None:
            if leadership is not None:
                await prepare_the_database()  # a standby leaves all of it to the leader
            await hub.recover()
            server, app.state.agent_port = await start_server(hub, settings.agent_link)
            servers.append(server)
            hub.restart_absence_clocks()
            for loop in loops[1:]:
                loop.start()

        campaign: asyncio.Task[None] | None = None
        if settings.run_loops:
            loops[0].start()  # the database watch: standbys report readiness too
            if leadership is None:
                await lead()
            else:
                campaign = asyncio.create_task(leadership.campaign(lead), name="campaign")
        if settings.ha.enabled and not settings.webhooks.signing_key:
            log.warning(
                "ha.enabled without webhooks.signing_key: this master signs webhook "
                "deliveries with the key in its own data dir, so after a takeover receivers "
                "see another key; give every master the same webhooks.signing_key"
            )
        unapplied = settings.unapplied_container_defaults()
        if unapplied:
            log.warning(
                "task_container_defaults keys this master does not apply (Determined's "
                "others, or a misspelling): %s; docs/containers.md says which apply",
                ", ".join(unapplied),
            )
        if settings.host in ("0.0.0.0", "::") and not settings.external_url:
            log.warning(
                "listening on all addresses but external_url is unset: ranks are told the "
                "master is at %s, which agents on other machines cannot reach",
                settings.master_url,
            )
        log.info(
            "master %s ready on %s (database %s)",
            app.state.master_id,
            settings.port,
            engine.url.render_as_string(hide_password=True),
        )
        try:
            yield
        finally:
            # The loops first: a master whose agent port is closed must decide nothing more
            # (an agent takes the closed port for a master that cannot declare it lost).
            if campaign is not None:
                campaign.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await campaign
            for loop in loops:
                await loop.stop()
            for server in servers:
                await server.stop(grace=2.0)
            await app.state.proxy_pool.aclose()
            await engine.dispose()

    app = FastAPI(
        title="resolute master",
        version=__version__,
        lifespan=lifespan,
        # Determined's client posts JSON without a Content-Type header.
        strict_content_type=False,
        # A redirect would hide a bad path (an empty template name) behind a 307.
        redirect_slashes=False,
    )
    app.state.settings = settings
    app.state.master_id = str(uuid.uuid4())
    app.state.cluster_id = _cluster_id(settings)
    install_error_handlers(app)

    app.add_middleware(StandbyRedirectsWrites, state=app.state)
    app.add_middleware(BodyLimitMiddleware, max_bytes=request_body_limit(settings))
    app.add_middleware(JsonBodyMiddleware)
    app.state.preemption = PreemptionSignals()
    app.state.sights = access.SightCache()  # who reads which workspaces, per generation
    app.state.master_logs = MasterLogBuffer()
    # The proxy to notebooks, TensorBoards and shells; the sign-in cookies stay here.
    app.state.proxy_pool = ProxyPool(strip_cookies=frozenset({COOKIE, PROXY_COOKIE}))
    app.state.task_activity = interactive.ActivityLog()
    app.state.login_limiter = auth_service.LoginLimiter(
        settings.security.login_max_failures, settings.security.login_window_s
    )
    for module in (
        info,
        health,
        auth,
        users,
        user_groups,
        roles,
        workspaces,
        quotas,
        templates,
        experiments,
        trials,
        model_registry,
        trial_sources,
        webhooks,
        cluster,
        logs,
        commands,
        proxy,
    ):
        app.include_router(module.router)
    app.include_router(trials.download_router)
    app.include_router(experiments.legacy_router)
    web.mount_static(app)
    app.include_router(web.router)
    return app


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name other than localhost, or anything unexpected


async def _refuse_open_default_users(session: AsyncSession, settings: MasterSettings) -> None:
    """Anyone who reaches a non-loopback port could sign in as a default user with an
    empty password (Ray's CVE-2023-48022 was the same open door): refuse, unless told."""
    open_users = await auth_service.default_users_with_empty_password(session)
    if not open_users or is_loopback(settings.host):
        return
    if settings.security.allow_empty_passwords:
        log.warning(
            "listening on %s while users %s have empty passwords "
            "(security.allow_empty_passwords is set)",
            settings.host,
            ", ".join(open_users),
        )
        return
    message = (
        f"refusing to listen on {settings.host}: users {', '.join(open_users)} have empty "
        "passwords, so anyone who reaches the port could sign in. Set their passwords "
        "(det user change-password), or DET_MASTER_SECURITY__INITIAL_USER_PASSWORD before the "
        "first start, or listen on 127.0.0.1; security.allow_empty_passwords=true starts anyway"
    )
    log.critical(message)
    raise EmptyPasswordsOnNetwork(message)


EXIT_REFUSED = 2


class EmptyPasswordsOnNetwork(RuntimeError):
    """The master will not start: see _refuse_open_default_users."""


def _cluster_id(settings: MasterSettings) -> str:
    """Stable across restarts: kept in the data dir."""
    path = settings.data_dir / "cluster_id"
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        cluster_id = str(uuid.uuid4())
        path.write_text(cluster_id + "\n")
        return cluster_id
