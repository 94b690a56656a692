"""Shared fixtures: both databases, an in-process API client, real master processes."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AsyncExitStack
from pathlib import Path

import httpx
import pytest
import pytest_asyncio
from fastapi import FastAPI

from harness.cluster import MasterProcess
from master.app import create_app
from master.db.models import Base
from master.db.session import session_scope
from master.services import access as access_service
from master.services import allocations as allocation_service
from master.services import auth as auth_service
from master.services import webhooks as webhook_service
from master.services import workspaces as workspace_service
from master.services.preemption import PreemptionSignals
from master.settings import DatabaseSettings, MasterSettings
from tests.object_stores import StoreServer, start_server

IN_CI = os.environ.get("CI", "").lower() == "true"
POSTGRES_ADMIN_DSN = os.environ.get(
    "RESOLUTE_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres"
)


# `make test` runs the suite on three pytest-xdist workers, a file at a time (--dist loadfile,
# so a module's cluster starts once), handed out in the order below (--no-loadscope-reorder:
# xdist would otherwise start the files with the most tests first, which left the long
# e2e files of one to three tests to the end of the run). Longest first: the files that
# took longest in a `--durations=0` run (20-200 s each), then the rest of the e2e, web and
# deploy files, then the many short ones, which even out the workers' ends.
_LONGEST_FIRST = (
    "tests/e2e/test_determined_workloads.py",
    "tests/e2e/test_fencing.py",
    "tests/e2e/test_training_e2e.py",
    "tests/e2e/test_readme_walkthroughs.py",
    "tests/e2e/test_object_store_checkpoints.py",
    "tests/e2e/test_official_client_workspaces.py",
    "tests/e2e/test_model_registry.py",
    "tests/e2e/test_interactive_tasks.py",
    "tests/test_benchmark_smoke.py",
    "tests/e2e/test_users_cli.py",
    "tests/e2e/test_asha_search.py",
    "tests/e2e/test_bind_mounts.py",
    # About 90 s; not first: on a fresh machine it waits for make test's image build.
    "tests/e2e/test_containers.py",
    "tests/e2e/test_containers_docker.py",
    "tests/e2e/test_webhooks.py",
    "tests/e2e/test_master_kills.py",
    "tests/e2e/test_cli_workspaces.py",
    "tests/e2e/test_submit_burst_kill.py",
    "tests/e2e/test_database_outage.py",
    "tests/e2e/test_agent.py",
    "tests/web/test_browser.py",
    "tests/e2e/test_standby_master.py",
    "tests/deploy/test_install.py",
)
_THEN = ("tests/e2e/", "tests/web/", "tests/deploy/")


@pytest.hookimpl(trylast=True)  # after pytest's own grouping by parametrized fixtures
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        path = item.nodeid.split("::", 1)[0]
        if path in _LONGEST_FIRST:
            return _LONGEST_FIRST.index(path)
        starts = [i for i, prefix in enumerate(_THEN) if path.startswith(prefix)]
        return len(_LONGEST_FIRST) + (starts[0] if starts else len(_THEN))

    items.sort(key=rank)  # stable: each file keeps its own order


def require(condition: bool, reason: str) -> None:
    """Skip outside CI; in CI a missing prerequisite is a failure, never a silent skip."""
    if condition:
        return
    if IN_CI:
        pytest.fail(f"required in CI: {reason}")
    pytest.skip(reason)


def _admin_execute(sql: str) -> None:
    """Run one statement on the admin database, from sync or async code alike."""
    import asyncpg

    async def run() -> None:
        conn = await asyncpg.connect(POSTGRES_ADMIN_DSN, timeout=5)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    # A thread of its own, because fixtures may call this while an event loop runs.
    with ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(asyncio.run, run()).result()


class PostgresServer:
    """Creates throwaway databases on the shared server and drops them at the end of the run."""

    def __init__(self) -> None:
        self.created: list[str] = []
        self.error: str | None = None
        try:
            _admin_execute("SELECT 1")
        except Exception as exc:  # any failure means "no usable server"
            self.error = f"PostgreSQL at {POSTGRES_ADMIN_DSN} is not reachable: {exc}"

    def new_database(self) -> str:
        require(self.error is None, self.error or "")
        name = f"resolute_test_{os.getpid()}_{uuid.uuid4().hex[:8]}"
        _admin_execute(f'CREATE DATABASE "{name}"')
        self.created.append(name)
        base = POSTGRES_ADMIN_DSN.rsplit("/", 1)[0]
        return f"{base}/{name}"

    def drop_all(self) -> None:
        for name in self.created:
            _admin_execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session", autouse=True)
def _masters_start_from_a_migrated_schema(tmp_path_factory: pytest.TempPathFactory) -> None:
    """New SQLite masters copy a schema migrated once per worker, not each its own (a second
    of CPU per master); tests/test_migrations.py and `det-master migrate` test the migrations."""
    MasterProcess.sqlite_schema_dir = tmp_path_factory.mktemp("sqlite-schema")


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    server = PostgresServer()
    yield server
    server.drop_all()


@pytest.fixture(scope="session")
def database_url_factory(
    postgres: PostgresServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[object]:
    def make(backend: str) -> str:
        if backend == "postgres":
            return postgres.new_database()
        path = tmp_path_factory.mktemp("sqlite") / "resolute.db"
        return f"sqlite:///{path}"

    yield make


BACKENDS = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
]


@pytest.fixture(scope="session", params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    value: str = request.param
    return value


@pytest_asyncio.fixture(scope="session")
async def _apps(
    database_url_factory: object, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Callable[[str], Awaitable[FastAPI]]]:
    """The migrated master apps of this run, one per backend, made when first asked for and
    kept to the end: under pytest-xdist a worker's files alternate between the backends,
    and a parametrized session fixture would be built again at each switch."""
    made: dict[str, FastAPI] = {}
    async with AsyncExitStack() as stack:

        async def get(backend: str) -> FastAPI:
            if backend not in made:
                url = database_url_factory(backend)  # type: ignore[operator]
                settings = MasterSettings(
                    data_dir=tmp_path_factory.mktemp(f"data-{backend}"),
                    db=DatabaseSettings(url=url),
                    max_model_definition_mb=1.0,
                    # Tests drive scheduling passes themselves, so rows never change under them.
                    run_loops=False,
                )
                application = create_app(settings)
                await stack.enter_async_context(application.router.lifespan_context(application))
                made[backend] = application
            return made[backend]

        yield get


@pytest_asyncio.fixture(scope="session")
async def app(backend: str, _apps: Callable[[str], Awaitable[FastAPI]]) -> FastAPI:
    """One migrated master app per backend for the whole run; rows are cleared per test."""
    return await _apps(backend)


async def reset_database(application: FastAPI) -> None:
    engine = application.state.engine
    async with engine.begin() as conn:
        for table in reversed(Base.metadata.sorted_tables):
            await conn.execute(table.delete())
    async with session_scope(application.state.session_factory) as session:
        # Few PBKDF2 iterations for the default users that every test starts with, so that
        # the reset and the fixtures' sign-ins cost microseconds, not ~100 ms of hashing
        # each; users a test makes itself are hashed as in production.
        await auth_service.ensure_default_users(session, "", iterations=1_000)
        await workspace_service.ensure_defaults(session)
        await allocation_service.ensure_scheduler_state(session)
        await access_service.ensure_access_state(session)
    # In-memory preemption signals belong to the cleared rows, and SQLite reuses their
    # allocation ids: an earlier test's signal must not reach this one.
    signals = PreemptionSignals()
    application.state.preemption = application.state.agent_hub.preemption = signals
    # The access generation starts again with its row: what was read under it went too.
    application.state.sights = access_service.SightCache()
    # Failed logins of an earlier test must not slow this one's down.
    application.state.login_limiter = auth_service.LoginLimiter()
    # The webhook triggers known for this database went with its rows.
    async with session_scope(application.state.session_factory) as session:
        webhook_service.forget_triggers(session)


@pytest_asyncio.fixture
async def anon(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """A client with a clean database and no token."""
    await reset_database(app)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://master") as client:
        yield client


@pytest_asyncio.fixture
async def api(anon: httpx.AsyncClient) -> httpx.AsyncClient:
    """A client signed in as the default user `determined`."""
    reply = await anon.post("/api/v1/auth/login", json={"username": "determined", "password": ""})
    assert reply.status_code == 200, reply.text
    anon.headers["Authorization"] = f"Bearer {reply.json()['token']}"
    return anon


@pytest_asyncio.fixture
async def admin(app: FastAPI, api: httpx.AsyncClient) -> AsyncIterator[httpx.AsyncClient]:
    """Beside `api` (whose clean database it shares): a client signed in as `admin`."""
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://master") as client:
        reply = await client.post("/api/v1/auth/login", json={"username": "admin", "password": ""})
        assert reply.status_code == 200, reply.text
        client.headers["Authorization"] = f"Bearer {reply.json()['token']}"
        yield client


@pytest.fixture
def repo_root() -> Path:
    return Path(__file__).resolve().parent.parent


# --- object stores ---------------------------------------------------------------------------


@pytest.fixture(scope="session")
def store_servers(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, StoreServer | str]]:
    """The object-store servers started so far in this session (or why one could not be)."""
    started: dict[str, StoreServer | str] = {}
    yield started
    for server in started.values():
        if isinstance(server, StoreServer):
            server.stop()


def store_server(
    kind: str, servers: dict[str, StoreServer | str], tmp_path_factory: pytest.TempPathFactory
) -> StoreServer:
    if kind not in servers:
        servers[kind] = start_server(kind, tmp_path_factory.mktemp(f"{kind}-server"))
    server = servers[kind]
    require(isinstance(server, StoreServer), str(server))
    assert isinstance(server, StoreServer)
    if kind == "gcs":
        # google-cloud-storage (ours and Determined's) finds the emulator through this.
        os.environ["STORAGE_EMULATOR_HOST"] = server.url
    return server


@pytest.fixture(params=["s3", "gcs", "azure"])
def object_store(
    request: pytest.FixtureRequest,
    store_servers: dict[str, StoreServer | str],
    tmp_path_factory: pytest.TempPathFactory,
) -> StoreServer:
    """A running server of each object store in turn (moto for S3, gcp-storage-emulator,
    Azurite), shared by the whole session; each test makes its own bucket."""
    return store_server(str(request.param), store_servers, tmp_path_factory)
