"""Permission-check benchmark (issue 29): what reading isolation costs on the hot routes,
with 10,000 experiments in 100 workspaces.

    .venv/bin/python -m benchmarks.bench_permissions [--quick | --smoke] [--experiments N]
        [--rounds N] [--repeats N] [--postgres DSN] [--out FILE]

Prints one JSON document on stdout (progress goes to stderr): the machine, and for SQLite
(a file, WAL, as `det-master` runs by default) and PostgreSQL (skipped, and said so, when
the server at --postgres does not answer) the server-side time of each route over an
in-process ASGI client, in these modes, measured side by side in the same run:

- `basic_user`: a master with `security.authz.type: basic` (today's rule: every signed-in
  user reads everything), requests by the non-admin user `determined`;
- `rbac_viewer`: a master with `security.authz.type: rbac` (a user reads the workspaces
  they own or hold a viewing role in, and the built-in Uncategorized one), the same user,
  who holds Viewer (role 4) in 10 of the 100 workspaces (given through
  POST /api/v1/roles/add-assignments) and owns one of those 10;
- `rbac_admin`: the rbac master, requests by `admin`;
- `basic_user_again`: basic_user once more, a control: its ratio to basic_user is the run's
  noise floor (`noise_floor_worst_deviation`), what two identical modes read apart here.

The two masters are two apps of `master.app.create_app` on the same database, each built
from `MasterSettings()` with DET_MASTER_SECURITY__AUTHZ__TYPE set, as `det-master` reads
it. Where the master rejects that variable or ignores it (a master without the setting),
`authz` says so, the rbac_viewer mode is skipped, and the others run on masters built
without it (both then read as today's), so the harness itself still runs.

Routes:
- GET /api/v1/experiments: `first_page` (limit 200, by id: the first page `det experiment
  list --all` reads), `newest_50` (limit 50, newest first: the dashboard's default order),
  `mine_unarchived` (archived=false, users=determined, limit 200: `det experiment list`)
  and `one_project` (one project of a workspace the user may read, limit 200);
- what a rank sends with its task token (the allocation's token, here minted by
  `auth.issue_task_token` for the experiment's owner, as agent_launch does):
  POST /api/v1/trials/{id}/metrics with group training and with group validation (each at
  a new step), and POST /api/v1/trials/{id}/progress. Each mode reports to its own trial
  (the user's for basic_user and rbac_viewer, the admin's for rbac_admin), in the project
  of the workspace the user owns.

After a warm-up request per route and mode (not counted), each round sends every route
`--repeats` times per mode, the modes taking turns request by request in a rotated order, so
that the machine's load falls on all alike. Reported per route and mode: p50, p95, p99
(pooled), the requests per second of one client sending back to back, the rows and the
total the list answered, the median CPU time of this process per request (the master's
handler, SQLite's thread and the client; not the Postgres server's); per route, each mode's
ratio to basic_user of p50, of p95, the median of the per-request ratios of a turn
(`paired_median`) and the same of the CPU times (`cpu_paired_median`). The issue's target is
rbac_viewer/basic_user at most 1.10 (`target_met`, on the worst route's paired median of
wall and of CPU time): in the first full runs on a shared 2-core machine, two identical
modes read within 4-8% of each other by the wall paired median, 9-16% by pooled p50 and up
to 33% by p95; the CPU paired median is the steadiest where other work loads the machine.

Setup (not timed): 100 workspaces with 2 projects each, 10,000 experiments copied from one
made by the service (100 per workspace, one trial each, a tenth owned by `determined`, one
in fifty archived) in bulk inserts, and one more per mode for its rank. `--smoke` (200
experiments, one round of 2 requests, SQLite only) runs every path in seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI
from pydantic import ValidationError
from sqlalchemy import func, insert, select, text

from benchmarks import common
from benchmarks.bench_dashboard import DEFAULT_ADMIN_DSN, database, postgres_reachable
from benchmarks.common import host_facts, progress, seconds_since_start
from harness.figures import ms_percentiles, ms_summary, ratio
from master.app import create_app
from master.db.models import (
    ExperimentModel,
    ExperimentState,
    ProjectModel,
    TrialModel,
    TrialState,
    UserModel,
    WorkspaceModel,
)
from master.db.session import session_scope
from master.services import auth, experiments
from master.services.experiments import ExperimentRequest
from master.services.workspaces import DEFAULT_WORKSPACE
from master.settings import DatabaseSettings, MasterSettings

AUTHZ_ENV = "DET_MASTER_SECURITY__AUTHZ__TYPE"
VIEWER_ROLE_ID = 4
USER = "determined"  # a default user, not an admin
ADMIN = "admin"
WORKSPACES = 100
PROJECTS_PER_WORKSPACE = 2
VIEWED_WORKSPACES = 10  # Viewer given in every tenth workspace
TARGET_RATIO = 1.10
JUDGED_ON = ("paired_median", "cpu_paired_median")
INSERT_CHUNK = 1_000
# A long search: validations never end a trial, whatever step they report.
CONFIG = """\
name: bench-permissions
entrypoint: python3 train.py
hyperparameters:
  global_batch_size: 64
  lr: {type: log, minval: -4, maxval: -1}
searcher: {name: single, metric: validation_loss, max_length: {batches: 100000000}}
reproducibility: {experiment_seed: 7}
"""
STATES = [ExperimentState.COMPLETED] * 6 + [
    ExperimentState.CANCELED,
    ExperimentState.ERROR,
    ExperimentState.ACTIVE,
    ExperimentState.PAUSED,
]
MODES = {
    # mode: (the master's security.authz.type, who sends the requests)
    "basic_user": ("basic", USER),
    # The same as basic_user, measured as a mode of its own: its ratio to basic_user is
    # the run's noise floor, what a ratio of two identical modes reads on this machine.
    "basic_user_again": ("basic", USER),
    "rbac_viewer": ("rbac", USER),
    "rbac_admin": ("rbac", ADMIN),
}
LIST_ROUTES = ("first_page", "newest_50", "mine_unarchived", "one_project")
REPORT_ROUTES = ("report_training", "report_validation", "report_progress")


# -- the masters -----------------------------------------------------------------------------


def authz_type_of(settings: MasterSettings) -> str | None:
    """The settings' security.authz.type, under whatever attribute name or alias the
    setting has; None for a master without it."""
    section = settings.security.authz
    for dumped in (section.model_dump(mode="json", by_alias=True), section.model_dump()):
        value = dumped.get("type")
        if value is not None:
            return str(value)
    return None


def master_settings(authz: str | None, data_dir: Path, url: str) -> tuple[MasterSettings, str]:
    """Settings as `det-master` reads them with DET_MASTER_SECURITY__AUTHZ__TYPE=`authz`
    (None: unset), and what became of the variable: applied, ignored or rejected (then the
    settings are those without it)."""

    def build() -> MasterSettings:
        return MasterSettings(data_dir=data_dir, db=DatabaseSettings(url=url), run_loops=False)

    saved = os.environ.pop(AUTHZ_ENV, None)
    try:
        if authz is None:
            return build(), "unset"
        os.environ[AUTHZ_ENV] = authz
        try:
            settings = build()
        except ValidationError as exc:
            os.environ.pop(AUTHZ_ENV)
            first = str(exc).splitlines()[1:3]
            return build(), f"rejected: {' '.join(s.strip() for s in first)}"
        if authz_type_of(settings) == authz:
            return settings, "applied"
        return settings, "ignored (the settings have no security.authz.type)"
    finally:
        os.environ.pop(AUTHZ_ENV, None)
        if saved is not None:
            os.environ[AUTHZ_ENV] = saved


@asynccontextmanager
async def master_app(settings: MasterSettings) -> AsyncIterator[FastAPI]:
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        yield app


# -- the data --------------------------------------------------------------------------------


@dataclass
class Seeded:
    seed_seconds: float
    user_id: int
    admin_id: int
    workspace_ids: list[int]
    viewed_workspace_ids: list[int]
    own_workspace_id: int
    own_project_id: int
    readable_by_viewer: int  # experiments the user reads under rbac
    # mode -> the trial its rank reports for
    report_trials: dict[str, int] = field(default_factory=dict)


async def seed(app: FastAPI, count: int) -> Seeded:
    """Workspaces, projects and `count` experiments (one trial each) in bulk inserts."""
    started = time.perf_counter()
    factory = app.state.session_factory
    async with session_scope(factory) as session:
        users = {
            u.username: u
            for u in await session.scalars(
                select(UserModel).where(UserModel.username.in_([USER, ADMIN]))
            )
        }
        user, admin = users[USER], users[ADMIN]
        view, _prepared = await experiments.create_experiment(
            session, ExperimentRequest(config=CONFIG), user, app.state.settings
        )
        assert view is not None
        model = view.experiment
        user_id, admin_id = user.id, admin.id
    run = uuid.uuid4().hex[:4].upper()
    async with session_scope(factory) as session:
        workspace_ids = list(
            (
                await session.scalars(
                    insert(WorkspaceModel).returning(
                        WorkspaceModel.id, sort_by_parameter_order=True
                    ),
                    [
                        # The first viewed one is the user's own; admin made the rest.
                        {"name": f"bench-ws-{w:03d}", "user_id": user_id if w == 0 else admin_id}
                        for w in range(WORKSPACES)
                    ],
                )
            ).all()
        )
        project_ids = list(
            (
                await session.scalars(
                    insert(ProjectModel).returning(ProjectModel.id, sort_by_parameter_order=True),
                    [
                        {
                            "name": f"project-{p}",
                            "workspace_id": ws,
                            "user_id": user_id if w == 0 else admin_id,
                            "key": f"B{run}{w:03d}{p}",
                        }
                        for w, ws in enumerate(workspace_ids)
                        for p in range(PROJECTS_PER_WORKSPACE)
                    ],
                )
            ).all()
        )
    rng = random.Random(29)
    base = datetime(2026, 1, 1, tzinfo=UTC)

    def row(index: int, project_id: int, owner_id: int) -> dict[str, Any]:
        state = rng.choice(STATES)
        return {
            "name": f"{rng.choice(['mnist', 'cifar', 'bert', 'resnet'])}-{index:05d}",
            "description": "",
            "state": state.value,
            "config": model.config,
            "labels": [],
            "original_config": model.original_config,
            "template_name": None,
            "template_config": None,
            "experiment_seed": index,
            "searcher_type": model.searcher_type,
            "resource_pool": model.resource_pool,
            "priority": 42,
            "owner_id": owner_id,
            "project_id": project_id,
            "job_id": str(uuid.uuid4()),
            "archived": index % 50 == 7,
            "progress": 1.0 if state == ExperimentState.COMPLETED else rng.random(),
            "start_time": base + timedelta(minutes=index),
            "end_time": None,
            "best_metric": None,
        }

    async def insert_experiments(rows: list[dict[str, Any]]) -> list[int]:
        async with session_scope(factory) as session:
            ids = list(
                (
                    await session.scalars(
                        insert(ExperimentModel).returning(
                            ExperimentModel.id, sort_by_parameter_order=True
                        ),
                        rows,
                    )
                ).all()
            )
            trial_ids = (
                await session.scalars(
                    insert(TrialModel).returning(TrialModel.id, sort_by_parameter_order=True),
                    [
                        {
                            "experiment_id": experiment_id,
                            "request_id": str(uuid.uuid4()),
                            "state": TrialState.RUNNING.value,
                            "hparams": {"global_batch_size": 64, "lr": 0.01},
                            "seed": experiment_id,
                            "restarts": 0,
                            "run_id": 1,
                            "total_batches_processed": 0,
                            "runner_state": "",
                            "start_time": base,
                        }
                        for experiment_id in ids
                    ],
                )
            ).all()
        return list(trial_ids)

    # The experiments go round the workspaces' projects, so each workspace holds count/100.
    for first in range(1, count, INSERT_CHUNK):
        # A tenth owned by the user, the rest by admin.
        rows = [
            row(
                index,
                project_ids[index % len(project_ids)],
                user_id if rng.random() < 0.1 else admin_id,
            )
            for index in range(first, min(first + INSERT_CHUNK, count))
        ]
        await insert_experiments(rows)
    own_project = project_ids[0]
    # The ranks' trials, one per mode: the user's, and the admin's for rbac_admin, in the
    # project of the workspace the user owns.
    report_rows = [
        row(count + i, own_project, admin_id if who == ADMIN else user_id)
        for i, (_authz, who) in enumerate(MODES.values())
    ]
    for r in report_rows:
        r["state"], r["archived"] = ExperimentState.ACTIVE.value, False
    report_trials = await insert_experiments(report_rows)
    if app.state.engine.dialect.name == "postgresql":
        # As autovacuum would after a bulk load (see bench_dashboard).
        async with app.state.engine.begin() as conn:
            await conn.execute(text("ANALYZE"))
    step = WORKSPACES // VIEWED_WORKSPACES
    viewed = workspace_ids[::step][:VIEWED_WORKSPACES]
    async with session_scope(factory) as session:
        # What the user may read under rbac: the viewed workspaces' experiments, those of
        # the built-in one (the service's template experiment lives there) and their own
        # wherever they are (master.services.access).
        readable = await session.scalar(
            select(func.count())
            .select_from(ExperimentModel)
            .join(ProjectModel, ProjectModel.id == ExperimentModel.project_id)
            .join(WorkspaceModel, WorkspaceModel.id == ProjectModel.workspace_id)
            .where(
                WorkspaceModel.id.in_(viewed)
                | (WorkspaceModel.name == DEFAULT_WORKSPACE)
                | (ExperimentModel.owner_id == user_id)
            )
        )
    return Seeded(
        seed_seconds=round(time.perf_counter() - started, 2),
        user_id=user_id,
        admin_id=admin_id,
        workspace_ids=workspace_ids,
        viewed_workspace_ids=viewed,
        readable_by_viewer=readable or 0,
        own_workspace_id=workspace_ids[0],
        own_project_id=own_project,
        report_trials=dict(zip(MODES, report_trials, strict=True)),
    )


async def login(client: httpx.AsyncClient, username: str) -> str:
    reply = await client.post("/api/v1/auth/login", json={"username": username, "password": ""})
    assert reply.status_code == 200, (username, reply.status_code, reply.text[:300])
    token: str = reply.json()["token"]
    return token


async def give_viewer(client: httpx.AsyncClient, admin_token: str, seeded: Seeded) -> None:
    """Viewer for the user in the viewed workspaces, as an admin gives it."""
    body = {
        "userRoleAssignments": [
            {
                "userId": seeded.user_id,
                "roleAssignment": {
                    "role": {"roleId": VIEWER_ROLE_ID},
                    "scopeWorkspaceId": workspace_id,
                },
            }
            for workspace_id in seeded.viewed_workspace_ids
        ]
    }
    reply = await client.post(
        "/api/v1/roles/add-assignments",
        json=body,
        headers={"Authorization": f"Bearer {admin_token}"},
    )
    assert reply.status_code == 200, (reply.status_code, reply.text[:300])


async def task_token(app: FastAPI, user_id: int, trial_id: int) -> str:
    """The token a trial's ranks get (DET_SESSION_TOKEN), as agent_launch mints it."""
    async with session_scope(app.state.session_factory) as session:
        token, _session_id = await auth.issue_task_token(
            session, user_id, timedelta(hours=1), trial_id
        )
    return token


# -- the requests ----------------------------------------------------------------------------


@dataclass
class Mode:
    name: str
    client: httpx.AsyncClient
    token: str  # the person's login
    rank_token: str  # the task token of `trial`
    trial: int
    step: int = 0
    # route -> one list of latencies per round, and of the CPU time this process spent
    samples: dict[str, list[list[float]]] = field(default_factory=dict)
    cpu: dict[str, list[list[float]]] = field(default_factory=dict)
    rows: dict[str, int] = field(default_factory=dict)
    totals: dict[str, int] = field(default_factory=dict)


def list_paths(seeded: Seeded) -> dict[str, str]:
    return {
        "first_page": "/api/v1/experiments?limit=200",
        "newest_50": "/api/v1/experiments?limit=50&orderBy=ORDER_BY_DESC",
        "mine_unarchived": f"/api/v1/experiments?archived=false&users={USER}&limit=200",
        "one_project": f"/api/v1/experiments?projectId={seeded.own_project_id}&limit=200",
    }


async def timed(request: Awaitable[httpx.Response]) -> tuple[httpx.Response, float, float]:
    """The reply, the wall time and the CPU time of this process (every thread: the
    master's handler, SQLite's thread, the client) that the request took."""
    started, cpu = time.perf_counter(), time.process_time()
    reply = await request
    return reply, time.perf_counter() - started, time.process_time() - cpu


async def one_request(mode: Mode, route: str, paths: dict[str, str]) -> tuple[float, float]:
    """One timed request of `route` (wall and CPU seconds); checks its answer."""
    headers = {"Authorization": f"Bearer {mode.token}"}
    if route in LIST_ROUTES:
        reply, elapsed, cpu = await timed(mode.client.get(paths[route], headers=headers))
        assert reply.status_code == 200, (mode.name, route, reply.status_code, reply.text[:300])
        body = reply.json()
        mode.rows[route] = len(body["experiments"])
        mode.totals[route] = body["pagination"]["total"]
        return elapsed, cpu
    headers = {"Authorization": f"Bearer {mode.rank_token}"}
    if route == "report_progress":
        path = f"/api/v1/trials/{mode.trial}/progress"
        json_body: dict[str, Any] = {"progress": (mode.step % 100) / 100}
    else:
        mode.step += 1
        group = "training" if route == "report_training" else "validation"
        path = f"/api/v1/trials/{mode.trial}/metrics"
        json_body = {
            "group": group,
            "metrics": {
                "trialId": mode.trial,
                "trialRunId": 1,
                "stepsCompleted": mode.step * 100,
                "metrics": {
                    "avgMetrics": {"loss": 1 / mode.step, "validation_loss": 1 / mode.step},
                    "batchMetrics": None,
                },
                "reportTime": None,
            },
        }
    reply, elapsed, cpu = await timed(mode.client.post(path, json=json_body, headers=headers))
    assert reply.status_code == 200, (mode.name, route, reply.status_code, reply.text[:300])
    return elapsed, cpu


def flat(rounds: list[list[float]]) -> list[float]:
    return [s for round_ in rounds for s in round_]


def paired_median(mine: list[list[float]], basic: list[list[float]]) -> float | None:
    """The median of the ratios of requests sent in the same turn."""
    pairs = [m / b for m, b in zip(flat(mine), flat(basic), strict=True) if b > 0]
    return ratio(statistics.median(pairs), 1.0) if pairs else None


def route_figures(mode: Mode, route: str) -> dict[str, Any]:
    samples = flat(mode.samples[route])
    figures = ms_summary(samples, mean=True) | ms_percentiles(samples, (95,))
    figures["requests_per_s"] = round(len(samples) / sum(samples), 1) if samples else None
    cpu = sorted(flat(mode.cpu[route]))
    figures["cpu_p50_ms"] = round(statistics.median(cpu) * 1000, 2) if cpu else None
    if route in LIST_ROUTES:
        figures |= {"rows": mode.rows.get(route), "total": mode.totals.get(route)}
    return figures


async def measure(backend: str, args: argparse.Namespace) -> dict[str, Any]:
    async with database(backend, args.postgres, prefix="bench_permissions") as url:
        with tempfile.TemporaryDirectory(prefix="bench-permissions-") as scratch:
            return await measure_on(backend, url, Path(scratch), args)


async def measure_on(
    backend: str, url: str, scratch: Path, args: argparse.Namespace
) -> dict[str, Any]:
    basic_settings, basic_authz = master_settings("basic", scratch / "basic", url)
    rbac_settings, rbac_authz = master_settings("rbac", scratch / "rbac", url)
    authz = {"basic": basic_authz, "rbac": rbac_authz}
    # Without the setting, both masters are today's: the rbac_viewer mode would measure
    # the basic rule under another name, so it is left out.
    with_setting = basic_authz == "applied" and rbac_authz == "applied"
    modes = [m for m in MODES if with_setting or m != "rbac_viewer"]
    async with master_app(basic_settings) as basic, master_app(rbac_settings) as rbac:
        apps = {"basic": basic, "rbac": rbac}
        progress(f"{backend}: authz {authz}; seeding {args.experiments} experiments")
        seeded = await seed(basic, args.experiments)
        progress(f"{backend}: seeded in {seeded.seed_seconds} s; measuring {modes}")
        clients = {
            name: httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://master", timeout=120
            )
            for name, app in apps.items()
        }
        try:
            admin_token = await login(clients["basic"], ADMIN)
            await give_viewer(clients["basic"], admin_token, seeded)
            user_token = await login(clients["basic"], USER)
            state: dict[str, Mode] = {}
            for name in modes:
                authz_type, who = MODES[name]
                trial = seeded.report_trials[name]
                owner = seeded.admin_id if who == ADMIN else seeded.user_id
                state[name] = Mode(
                    name=name,
                    client=clients[authz_type],
                    token=admin_token if who == ADMIN else user_token,
                    rank_token=await task_token(apps[authz_type], owner, trial),
                    trial=trial,
                )
            paths = list_paths(seeded)
            routes = (*LIST_ROUTES, *REPORT_ROUTES)
            for mode in state.values():  # warm-up: statement caches, first-use imports
                for route in routes:
                    await one_request(mode, route, paths)
                    mode.samples[route], mode.cpu[route] = [], []
            for round_ in range(args.rounds):
                for mode in state.values():
                    for route in routes:
                        mode.samples[route].append([])
                        mode.cpu[route].append([])
                # Request by request, the modes take turns (in an order rotated each time),
                # so that a change in the machine's load falls on all of them alike.
                turn = 0
                for route in routes:
                    for _ in range(args.repeats):
                        for name in modes[turn:] + modes[:turn]:
                            mode = state[name]
                            elapsed, cpu = await one_request(mode, route, paths)
                            mode.samples[route][-1].append(elapsed)
                            mode.cpu[route][-1].append(cpu)
                        turn = (turn + 1) % len(modes)
                progress(
                    f"{backend}: round {round_ + 1}/{args.rounds}: "
                    + ", ".join(
                        f"{n} first_page p50 "
                        f"{statistics.median(state[n].samples['first_page'][-1]) * 1000:.1f} ms"
                        for n in modes
                    )
                )
        finally:
            for client in clients.values():
                await client.aclose()
    figures = {name: {r: route_figures(m, r) for r in routes} for name, m in state.items()}
    ratios: dict[str, Any] = {}
    for name in modes[1:]:  # modes[0] is basic_user
        ratios[f"{name}_over_basic_user"] = {
            route: {
                "p50": ratio(
                    figures[name][route]["p50_ms"], figures["basic_user"][route]["p50_ms"]
                ),
                "p95": ratio(
                    figures[name][route]["p95_ms"], figures["basic_user"][route]["p95_ms"]
                ),
                # The median of each request's time over basic_user's request of the same
                # turn (sent moments apart): what the machine's load moves least.
                "paired_median": paired_median(
                    state[name].samples[route], state["basic_user"].samples[route]
                ),
                # The same of the CPU time: what other processes on the machine move least
                # (on Postgres it leaves out the database server's share).
                "cpu_paired_median": paired_median(
                    state[name].cpu[route], state["basic_user"].cpu[route]
                ),
            }
            for route in routes
        }
    estimators = ("p50", "paired_median", "p95", "cpu_paired_median")
    viewer = ratios.get("rbac_viewer_over_basic_user")
    worst = {k: max((r[k] or 0.0) for r in viewer.values()) for k in estimators} if viewer else None
    # How far two identical modes read apart here: a ratio within this of 1.0 is noise.
    floor = ratios["basic_user_again_over_basic_user"]
    noise = {k: round(max(abs((r[k] or 0.0) - 1.0) for r in floor.values()), 3) for k in estimators}
    result: dict[str, Any] = {
        "authz": authz,
        "setting_present": with_setting,
        "setup": {
            "seed_seconds": seeded.seed_seconds,
            "viewed_workspace_ids": seeded.viewed_workspace_ids,
            "experiments_readable_by_viewer": seeded.readable_by_viewer,
            "own_workspace_id": seeded.own_workspace_id,
            "own_project_id": seeded.own_project_id,
            "report_trials": {n: seeded.report_trials[n] for n in modes},
        },
        "paths": paths,
        "modes": figures,
        "ratios": ratios,
        # The slowest route's ratio, by each estimator.
        "worst_rbac_viewer_over_basic_user": worst,
        # Judged on the paired medians, wall and CPU: the estimators two identical modes
        # agree best on.
        "target_met": {k: None if worst is None else worst[k] <= TARGET_RATIO for k in JUDGED_ON},
        "noise_floor_worst_deviation": noise,
        # The 10% target is told from noise where identical modes agree within 5%.
        "noise_below_half_the_margin": {k: noise[k] < (TARGET_RATIO - 1.0) / 2 for k in JUDGED_ON},
    }
    if not with_setting:
        result["skipped_modes"] = {
            "rbac_viewer": "the master has no security.authz.type setting: "
            f"basic {basic_authz}, rbac {rbac_authz}; both masters read as today's (basic)"
        }
    else:
        # The rule at work: under rbac the user's list counts what they may read, under
        # basic everything, and the admin everything.
        seen = {name: figures[name]["first_page"]["total"] for name in modes}
        result["isolation"] = {
            "first_page_total": seen,
            "expected_rbac_viewer_total": seeded.readable_by_viewer,
            "as_expected": seen["rbac_viewer"] == seeded.readable_by_viewer
            and seen["basic_user"] == seen["rbac_admin"] > seeded.readable_by_viewer,
        }
        if not result["isolation"]["as_expected"]:
            progress(
                f"{backend}: WARNING: rbac does not isolate as expected: {result['isolation']}"
            )
    return result


async def run(args: argparse.Namespace) -> dict[str, Any]:
    mode = common.mode_of(args)
    report: dict[str, Any] = {
        "benchmark": "resolute permission checks, issue 29 (read isolation on the hot routes)",
        "mode": mode,
        "command": " ".join(["python -m benchmarks.bench_permissions", *sys.argv[1:]]),
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": host_facts(["sqlalchemy", "aiosqlite", "asyncpg", "fastapi", "pydantic"]),
        "parameters": {
            "experiments": args.experiments,
            "workspaces": WORKSPACES,
            "projects_per_workspace": PROJECTS_PER_WORKSPACE,
            "viewer_role_in_workspaces": VIEWED_WORKSPACES,
            "rounds": args.rounds,
            "repeats_per_round": args.repeats,
            "target_ratio": TARGET_RATIO,
            "modes": {name: {"authz": a, "user": u} for name, (a, u) in MODES.items()},
        },
    }
    report["sqlite"] = await measure("sqlite", args)
    problem = (
        "the smoke runs SQLite only"
        if mode == "smoke"
        else await postgres_reachable(args.postgres)
        if args.postgres
        else "no --postgres"
    )
    if problem is None:
        report["machine"]["postgres"] = await common.postgres_facts(args.postgres)
        report["postgres"] = await measure("postgres", args)
    else:
        report["postgres"] = {"skipped": f"PostgreSQL at {args.postgres}: {problem}"}
    report["total_seconds"] = round(seconds_since_start(), 1)
    return report


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_permissions",
        description=__doc__.split("\n\n")[0] if __doc__ else "",
    )
    common.add_shape_flags(
        parser,
        quick="1,000 experiments, 4 rounds of 5 requests per route and mode",
        smoke="200 experiments, 1 round of 2 requests, SQLite only",
    )
    parser.add_argument("--experiments", type=int, default=None, help="default 10,000")
    parser.add_argument("--rounds", type=int, default=None, help="rounds (default 10)")
    parser.add_argument(
        "--repeats", type=int, default=None, help="requests per route and mode in a round (15)"
    )
    parser.add_argument("--postgres", default=DEFAULT_ADMIN_DSN, help="admin DSN ('' for none)")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = parser.parse_args(argv)
    experiments_count, rounds, repeats = {
        "full": (10_000, 10, 15),
        "quick": (1_000, 4, 5),
        "smoke": (200, 1, 2),
    }[common.mode_of(args)]
    args.experiments = experiments_count if args.experiments is None else args.experiments
    args.rounds = rounds if args.rounds is None else args.rounds
    args.repeats = repeats if args.repeats is None else args.repeats
    if args.experiments < WORKSPACES * PROJECTS_PER_WORKSPACE or args.rounds < 1:
        parser.error(f"--experiments must be at least {WORKSPACES * PROJECTS_PER_WORKSPACE}")
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    common.emit_report(asyncio.run(run(args)), args.out)


if __name__ == "__main__":
    main()
