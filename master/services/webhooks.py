"""Webhooks: who may manage them, what happens that they hear of, and their delivery.

Events are written to `webhook_outbox` in the transaction that makes them happen (a state
change, a log batch, a trial's alert), so none is lost to a crash and none is announced
for a change that rolled back. The leader's WebhookShipper turns outbox rows into one queued
delivery per webhook reached (`webhook_events`, with a fixed payload and event id), sends
them with a timeout outside any transaction, and deletes each once its receiver answered 2xx;
a failure waits (doubling, capped) and is sent again with the same bytes. A master killed
between sending and deleting sends it again after the restart: at least once, and the
receiver can drop the second copy by its event id.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import secrets
import time
import uuid
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, cast

import httpx
import re2
from sqlalchemy import Table, bindparam, delete, func, or_, select, update
from sqlalchemy import event as orm_events
from sqlalchemy.engine import Engine
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from master.core import roles
from master.core import webhooks as core
from master.db.models import (
    ExperimentModel,
    ProjectModel,
    TrialModel,
    WebhookEventModel,
    WebhookLogMatchModel,
    WebhookModel,
    WebhookOutboxModel,
    WebhookTriggerModel,
    WorkspaceModel,
    utcnow,
)
from master.db.session import session_scope
from master.errors import InvalidArgument, NotFound, PermissionDenied
from master.services import access
from master.services.access import Actor
from master.services.loops import Loop
from master.settings import MasterSettings

log = logging.getLogger(__name__)

KEY_FILE = "webhook_signing_key"
STATE, TASK_LOG, CUSTOM = "state", "task_log", "custom"
# session.info key: the request recorded an event, so its commit wakes the shipper.
WAKE_SHIPPER = "wake_webhook_shipper"


def signing_key(settings: MasterSettings) -> bytes:
    """The configured key, else one made once and kept in the data dir."""
    if settings.webhooks.signing_key:
        return settings.webhooks.signing_key.encode()
    path = settings.data_dir / KEY_FILE
    try:
        return path.read_text().strip().encode()
    except FileNotFoundError:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        key = secrets.token_hex(32)
        path.write_text(key + "\n")
        path.chmod(0o600)
        return key.encode()


# -- managing webhooks ----------------------------------------------------------------------


@dataclass
class WebhookView:
    row: WebhookModel
    triggers: list[WebhookTriggerModel]


def _input(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except core.WebhookInputError as exc:
        raise InvalidArgument(str(exc)) from None


async def _require_editor(session: AsyncSession, actor: Actor, workspace_id: int | None) -> None:
    """An admin, or for a workspace's webhook its owner or a holder of EDIT_WEBHOOKS there
    (Editor, WorkspaceAdmin)."""
    if actor.admin:
        return
    if workspace_id is None:
        raise PermissionDenied(
            f"webhooks for every workspace are for admins; user {actor.username} is not one"
        )
    ws = await session.get(WorkspaceModel, workspace_id)
    if ws is not None and ws.user_id == actor.user_id:
        return
    if ws is not None and await access.may(session, actor, roles.EDIT_WEBHOOKS, workspace_id):
        return
    raise PermissionDenied(
        f"only workspace {workspace_id}'s owner or an admin may manage its webhooks"
        + access.holders(roles.EDIT_WEBHOOKS, "there")
    )


async def create_webhook(
    session: AsyncSession,
    actor: Actor,
    *,
    name: object,
    url: object,
    webhook_type: object,
    mode: object,
    workspace_id: int | None,
    triggers: object,
) -> WebhookView:
    checked_name = _input(core.checked_name, name)
    checked_url = _input(core.checked_url, url)
    checked_type = _input(core.checked_type, webhook_type)
    checked_mode = _input(core.checked_mode, mode)
    specs = _input(core.checked_triggers, triggers, checked_mode)
    scope = workspace_id or None  # Determined's 0: every workspace
    if scope is not None and (
        await session.get(WorkspaceModel, scope) is None
        or await access.hidden(session, actor, "workspace_id", str(scope))
    ):
        raise NotFound(f"workspaceId: workspace {scope} not found")
    await _require_editor(session, actor, scope)
    row = WebhookModel(
        name=checked_name,
        url=checked_url,
        webhook_type=checked_type,
        mode=checked_mode,
        workspace_id=scope,
    )
    session.add(row)
    await session.flush()
    trigger_rows = [
        WebhookTriggerModel(webhook_id=row.id, trigger_type=s.trigger_type, condition=s.condition)
        for s in specs
    ]
    session.add_all(trigger_rows)
    await session.flush()
    forget_triggers(session)
    log.info("webhook %d %r created by %s: %s", row.id, row.name, actor.username, row.url)
    return WebhookView(row, trigger_rows)


async def _views(session: AsyncSession, rows: Sequence[WebhookModel]) -> list[WebhookView]:
    ids = [r.id for r in rows]
    triggers = (
        await session.scalars(
            select(WebhookTriggerModel)
            .where(WebhookTriggerModel.webhook_id.in_(ids))
            .order_by(WebhookTriggerModel.id)
        )
    ).all()
    by_webhook: dict[int, list[WebhookTriggerModel]] = {i: [] for i in ids}
    for t in triggers:
        by_webhook[t.webhook_id].append(t)
    return [WebhookView(r, by_webhook[r.id]) for r in rows]


async def list_webhooks(session: AsyncSession, actor: Actor) -> list[WebhookView]:
    """Admins see all; others those of workspaces they own or hold VIEW_WEBHOOKS in (a
    Viewer, an Editor). A webhook's URL is often its credential (a Slack incoming webhook's
    is), so the global ones, which only admins manage, are not shown to everyone."""
    query = select(WebhookModel).order_by(WebhookModel.id)
    if not actor.admin:
        grants = await access.grants_of(session, actor.user_id)
        if roles.holds(grants, roles.VIEW_WEBHOOKS, None):  # held across the cluster
            query = query.where(WebhookModel.workspace_id.is_not(None))
        else:
            viewed = {
                g.workspace_id
                for g in grants
                if roles.holds([g], roles.VIEW_WEBHOOKS, g.workspace_id)
            }
            owned = select(WorkspaceModel.id).where(WorkspaceModel.user_id == actor.user_id)
            query = query.where(
                or_(
                    WebhookModel.workspace_id.in_(owned),
                    WebhookModel.workspace_id.in_(sorted(w for w in viewed if w is not None)),
                )
            )
    return await _views(session, (await session.scalars(query)).all())


async def _get(session: AsyncSession, webhook_id: int) -> WebhookModel:
    row = await session.get(WebhookModel, webhook_id)
    if row is None:
        raise NotFound(f"webhook {webhook_id} not found")
    return row


async def delete_webhook(session: AsyncSession, actor: Actor, webhook_id: int) -> None:
    """Its queued deliveries go with it."""
    row = await _get(session, webhook_id)
    await _require_editor(session, actor, row.workspace_id)
    await session.execute(delete(WebhookEventModel).where(WebhookEventModel.webhook_id == row.id))
    trigger_ids = select(WebhookTriggerModel.id).where(WebhookTriggerModel.webhook_id == row.id)
    await session.execute(
        delete(WebhookLogMatchModel).where(WebhookLogMatchModel.trigger_id.in_(trigger_ids))
    )
    await session.execute(
        delete(WebhookTriggerModel).where(WebhookTriggerModel.webhook_id == row.id)
    )
    await session.delete(row)
    forget_triggers(session)
    log.info("webhook %d %r deleted by %s", row.id, row.name, actor.username)


async def patch_webhook(session: AsyncSession, actor: Actor, webhook_id: int, url: object) -> None:
    """Determined lets only the URL change; deliveries still queued go to the new one."""
    row = await _get(session, webhook_id)
    await _require_editor(session, actor, row.workspace_id)
    row.url = _input(core.checked_url, url)
    await session.execute(
        update(WebhookEventModel).where(WebhookEventModel.webhook_id == row.id).values(url=row.url)
    )


async def test_target(session: AsyncSession, actor: Actor, webhook_id: int) -> tuple[str, bytes]:
    """The URL and body of a test delivery (Determined's: a COMPLETED event with data
    "test", or a Slack message saying "test")."""
    row = await _get(session, webhook_id)
    await _require_editor(session, actor, row.workspace_id)
    if row.webhook_type == core.SLACK:
        body: dict[str, Any] = {
            "blocks": [{"type": "section", "text": {"type": "plain_text", "text": "test"}}]
        }
    else:
        body = core.default_payload(
            str(uuid.uuid4()),
            core.STATE_CHANGE,
            int(time.time()),
            {"state": "COMPLETED"},
            {"data": "test"},
        )
    return row.url, json.dumps(body).encode()


async def send_test(settings: MasterSettings, url: str, body: bytes) -> None:
    """Sent now rather than queued, so the caller learns whether the receiver answers."""
    try:
        async with httpx.AsyncClient(timeout=settings.webhooks.timeout_s) as client:
            reply = await client.post(
                url, content=body, headers=_headers(signing_key(settings), body, None)
            )
    except httpx.HTTPError as exc:
        raise InvalidArgument(f"url: sending the test to {url} failed: {exc!r}") from None
    if reply.status_code >= 400:
        raise InvalidArgument(f"url: {url} answered the test with HTTP {reply.status_code}")


# -- what happened: outbox rows, in the caller's transaction --------------------------------


def record_state_change(session: AsyncSession, experiment_id: int, state: str) -> None:
    known = _known_triggers(session)
    if known is not None and state not in known.states:
        # Nobody listens for this state: no outbox row and no shipper pass on the path
        # every experiment takes (submit, finish, kill).
        return
    session.add(WebhookOutboxModel(kind=STATE, experiment_id=experiment_id, data={"state": state}))
    session.info[WAKE_SHIPPER] = True


def record_custom(
    session: AsyncSession,
    experiment_id: int,
    trial_id: int | None,
    title: str,
    description: str,
    level: str,
) -> None:
    session.add(
        WebhookOutboxModel(
            kind=CUSTOM,
            experiment_id=experiment_id,
            trial_id=trial_id,
            data={"title": title, "description": description, "level": level},
        )
    )
    session.info[WAKE_SHIPPER] = True


@dataclass
class _Triggers:
    patterns: list[tuple[int, core.LogPattern]]  # the TASK_LOG triggers' regexes
    states: frozenset[str]  # the experiment states some STATE_CHANGE trigger names
    loaded_at: float


# Per database: the triggers, reloaded every few seconds (by the leader's shipper on each
# look, and by log batches), so that neither a log batch nor a state change queries them.
# Creating or deleting a webhook forgets them, in its transaction and again once it has
# committed; a load stores what it read only if nothing was forgotten meanwhile, so a load
# that raced the commit cannot keep the old triggers. Not knowing them means "write".
_TRIGGERS: weakref.WeakKeyDictionary[Engine, _Triggers] = weakref.WeakKeyDictionary()
_FORGOTTEN: weakref.WeakKeyDictionary[Engine, int] = weakref.WeakKeyDictionary()
_TRIGGERS_TTL_S = 2.0
_WARNED_REGEXES: set[int] = set()


def _forget(engine: Engine) -> None:
    _TRIGGERS.pop(engine, None)
    _FORGOTTEN[engine] = _FORGOTTEN.get(engine, 0) + 1


def forget_triggers(session: AsyncSession) -> None:
    engine = session.get_bind().engine
    _forget(engine)
    orm_events.listen(session.sync_session, "after_commit", lambda _: _forget(engine), once=True)


def _known_triggers(session: AsyncSession) -> _Triggers | None:
    cached = _TRIGGERS.get(session.get_bind().engine)
    if cached is None or time.monotonic() - cached.loaded_at >= _TRIGGERS_TTL_S:
        return None
    return cached


async def _triggers(session: AsyncSession) -> _Triggers:
    cached = _known_triggers(session)
    if cached is not None:
        return cached
    engine = session.get_bind().engine
    generation = _FORGOTTEN.get(engine, 0)
    rows = (
        await session.execute(
            select(
                WebhookTriggerModel.id,
                WebhookTriggerModel.trigger_type,
                WebhookTriggerModel.condition,
            ).where(WebhookTriggerModel.trigger_type.in_((core.TASK_LOG, core.STATE_CHANGE)))
        )
    ).all()
    patterns = []
    states = set()
    for trigger_id, trigger_type, condition in rows:
        condition = condition or {}
        if trigger_type == core.STATE_CHANGE:
            states.add(str(condition.get("state", "")))
            continue
        try:
            patterns.append((trigger_id, core.log_pattern(str(condition.get("regex", "")))))
        except re2.error:
            # Checked at creation; one stored before the master matched with RE2 (a
            # look-around, a back-reference) never fires: said once, not at every reload.
            if trigger_id not in _WARNED_REGEXES:
                _WARNED_REGEXES.add(trigger_id)
                log.warning(
                    "webhook trigger %d: its regex is not RE2 (Determined's syntax) and never "
                    "fires; delete the webhook and make it again with an RE2 regex",
                    trigger_id,
                )
    loaded = _Triggers(patterns, frozenset(states), time.monotonic())
    if _FORGOTTEN.get(engine, 0) == generation:
        _TRIGGERS[engine] = loaded
    return loaded


async def record_log_matches(session: AsyncSession, rows: Sequence[dict[str, Any]]) -> None:
    """Lines of a batch being stored that match a TASK_LOG trigger: the first per task and
    trigger goes to the outbox (a trigger fires once per task, as Determined's does)."""
    patterns = (await _triggers(session)).patterns
    if not patterns:
        return
    seen: set[tuple[str, int]] = set()
    for row in rows:
        # Matched without its line ending: RE2's `$` is the end of the text, as in Go.
        message = str(row["message"]).rstrip("\r\n")
        for trigger_id, pattern in patterns:
            key = (row["task_id"], trigger_id)
            if key in seen or not pattern.search(message):
                continue
            seen.add(key)
            session.add(
                WebhookOutboxModel(
                    kind=TASK_LOG,
                    task_id=row["task_id"],
                    trial_id=row.get("trial_id"),
                    data={
                        "trigger_id": trigger_id,
                        "line": message,
                        "node": row.get("agent_id") or "",
                    },
                )
            )


# -- turning the outbox into deliveries (leader only) ---------------------------------------


@dataclass
class _Experiment:
    facts: core.ExperimentFacts
    workspace_id: int
    config: core.ExperimentWebhookConfig


async def _experiment(session: AsyncSession, experiment_id: int) -> _Experiment | None:
    found = (
        await session.execute(
            select(ExperimentModel, ProjectModel.name, WorkspaceModel.id, WorkspaceModel.name)
            .join(ProjectModel, ProjectModel.id == ExperimentModel.project_id)
            .join(WorkspaceModel, WorkspaceModel.id == ProjectModel.workspace_id)
            .where(ExperimentModel.id == experiment_id)
        )
    ).first()
    if found is None:
        return None
    exp, project, workspace_id, workspace = found
    end = exp.end_time or utcnow()
    resources = (exp.config or {}).get("resources") or {}
    facts = core.ExperimentFacts(
        id=exp.id,
        state=str(exp.state),
        name=exp.name,
        duration_s=max(0, int((end - exp.start_time).total_seconds())),
        resource_pool=exp.resource_pool,
        slots_per_trial=int(resources.get("slots_per_trial") or 1),
        workspace=workspace,
        project=project,
    )
    return _Experiment(facts, workspace_id, core.ExperimentWebhookConfig.of(exp.config))


def _reaches(webhook: WebhookModel, exp: _Experiment | None) -> bool:
    return core.reaches(
        webhook.id,
        webhook.name,
        webhook.mode,
        webhook.workspace_id,
        exp.workspace_id if exp else None,
        exp.config if exp else core.ExperimentWebhookConfig(),
        exp is not None,
    )


def _queue(session: AsyncSession, webhook: WebhookModel, event_id: str, body: Any) -> None:
    session.add(
        WebhookEventModel(
            event_id=event_id,
            webhook_id=webhook.id,
            url=webhook.url,
            payload=json.dumps(body, separators=(",", ":")),
        )
    )


class _Lookups:
    """What one pass over the outbox reads, read once: the triggers of each type and the
    experiments its rows name."""

    def __init__(self, session: AsyncSession) -> None:
        self.session = session
        self._triggers: dict[str, list[tuple[WebhookTriggerModel, WebhookModel]]] = {}
        self._experiments: dict[int, _Experiment | None] = {}
        # (task, trigger) pairs that fired in this pass: not yet written, so not yet in the
        # table a later row of the pass would look in.
        self.log_matches: set[tuple[str, int]] = set()

    async def triggered(self, trigger_type: str) -> list[tuple[WebhookTriggerModel, WebhookModel]]:
        if trigger_type not in self._triggers:
            rows = await self.session.execute(
                select(WebhookTriggerModel, WebhookModel)
                .join(WebhookModel, WebhookModel.id == WebhookTriggerModel.webhook_id)
                .where(WebhookTriggerModel.trigger_type == trigger_type)
                .order_by(WebhookTriggerModel.id)
            )
            self._triggers[trigger_type] = [(t, w) for t, w in rows.all()]
        return self._triggers[trigger_type]

    async def experiment(self, experiment_id: int) -> _Experiment | None:
        if experiment_id not in self._experiments:
            self._experiments[experiment_id] = await _experiment(self.session, experiment_id)
        return self._experiments[experiment_id]


async def _expand(
    session: AsyncSession, lookups: _Lookups, row: WebhookOutboxModel, base_url: str
) -> int:
    now = int(time.time())
    queued = 0
    if row.kind == STATE and row.experiment_id is not None:
        state = str(row.data.get("state", ""))
        hits = [
            (t, w)
            for t, w in await lookups.triggered(core.STATE_CHANGE)
            if (t.condition or {}).get("state") == state
        ]
        exp = await lookups.experiment(row.experiment_id) if hits else None
        if exp is None:
            return 0
        facts = dataclasses.replace(exp.facts, state=state)
        for _trigger, webhook in hits:
            if not _reaches(webhook, exp):
                continue
            event_id = str(uuid.uuid4())
            body = (
                core.slack_experiment_message(facts, base_url)
                if webhook.webhook_type == core.SLACK
                else core.default_payload(
                    event_id,
                    core.STATE_CHANGE,
                    now,
                    {"state": state},
                    {"experiment": core.experiment_data(facts)},
                )
            )
            _queue(session, webhook, event_id, body)
            queued += 1
    elif row.kind == CUSTOM and row.experiment_id is not None:
        exp = await lookups.experiment(row.experiment_id)
        if exp is None:
            return 0
        done: set[int] = set()
        for _trigger, webhook in await lookups.triggered(core.CUSTOM):
            if webhook.id in done or not _reaches(webhook, exp):
                continue
            done.add(webhook.id)
            event_id = str(uuid.uuid4())
            custom = {k: str(row.data.get(k, "")) for k in ("title", "description", "level")}
            body = (
                core.slack_experiment_message(exp.facts, base_url, custom, row.trial_id)
                if webhook.webhook_type == core.SLACK
                else core.default_payload(
                    event_id,
                    core.CUSTOM,
                    now,
                    {"state": exp.facts.state},
                    {
                        "experiment": core.experiment_data(exp.facts, row.trial_id),
                        "custom_data": custom,
                    },
                )
            )
            _queue(session, webhook, event_id, body)
            queued += 1
    elif row.kind == TASK_LOG and row.task_id is not None:
        trigger_id = int(row.data.get("trigger_id", 0))
        found = (
            await session.execute(
                select(WebhookTriggerModel, WebhookModel)
                .join(WebhookModel, WebhookModel.id == WebhookTriggerModel.webhook_id)
                .where(WebhookTriggerModel.id == trigger_id)
            )
        ).first()
        if found is None:
            return 0
        trigger, webhook = found
        key = (row.task_id, trigger.id)
        if key in lookups.log_matches or await session.get(WebhookLogMatchModel, key) is not None:
            return 0  # this task already fired this trigger
        experiment_id = (
            await session.scalar(
                select(TrialModel.experiment_id).where(TrialModel.id == row.trial_id)
            )
            if row.trial_id is not None
            else None
        )
        exp = await lookups.experiment(experiment_id) if experiment_id is not None else None
        if not _reaches(webhook, exp):
            return 0
        session.add(WebhookLogMatchModel(task_id=row.task_id, trigger_id=trigger.id))
        lookups.log_matches.add(key)
        regex = str((trigger.condition or {}).get("regex", ""))
        line, node = str(row.data.get("line", "")), str(row.data.get("node", ""))
        event_id = str(uuid.uuid4())
        body = (
            core.slack_log_message(
                row.task_id, node, line, regex, experiment_id, row.trial_id, base_url
            )
            if webhook.webhook_type == core.SLACK
            else core.default_payload(
                event_id,
                core.TASK_LOG,
                now,
                {"regex": regex},
                {"task_log": {"task_id": row.task_id, "node_name": node, "triggering_log": line}},
            )
        )
        _queue(session, webhook, event_id, body)
        queued = 1
    return queued


async def expand_outbox(session: AsyncSession, base_url: str, limit: int = 200) -> int:
    """Outbox rows into deliveries, in one transaction; returns how many rows were taken.

    Everything is read first and written at the commit (the session does not autoflush),
    so on SQLite the write lock is held for one flush, not for the whole pass."""
    rows = (
        await session.scalars(
            select(WebhookOutboxModel).order_by(WebhookOutboxModel.id).limit(limit)
        )
    ).all()
    lookups = _Lookups(session)
    for row in rows:
        await _expand(session, lookups, row, base_url)
    if rows:
        await session.execute(
            delete(WebhookOutboxModel).where(WebhookOutboxModel.id.in_([r.id for r in rows]))
        )
    return len(rows)


# -- delivery -------------------------------------------------------------------------------


def _headers(key: bytes, body: bytes, event_id: str | None) -> dict[str, str]:
    stamp = int(time.time())
    headers = {
        "Content-Type": "application/json; charset=UTF-8",
        core.TIMESTAMP_HEADER: str(stamp),
        core.SIGNATURE_HEADER: core.signature(key, stamp, body),
    }
    if event_id is not None:
        headers[core.EVENT_ID_HEADER] = event_id
    return headers


@dataclass
class _Due:
    id: int
    event_id: str
    url: str
    payload: str
    attempts: int
    created_at: Any


class WebhookShipper(Loop):
    """The leader's background sender: never inside a scheduling pass or a request."""

    name = "webhook-shipper"
    batch = 128
    settle_s = 0.2
    SEND_AT_ONCE = 16

    def __init__(self, factory: async_sessionmaker[AsyncSession], settings: MasterSettings) -> None:
        super().__init__(interval=settings.webhooks.poll_interval_s)
        self.factory = factory
        self.settings = settings
        self._client: httpx.AsyncClient | None = None
        self._key = signing_key(settings)
        # The scheduler's: set while no pass runs (master.services.scheduler.SchedulerLoop).
        self.scheduler_idle: asyncio.Event | None = None

    async def stop(self) -> None:
        await super().stop()
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def run_once(self) -> None:
        async with session_scope(self.factory) as session:
            await _triggers(session)  # kept known, so state changes nobody hears skip the outbox
            taken = await expand_outbox(session, self.settings.webhooks.base_url)
        sent = await self.deliver_due()
        if taken or sent >= self.batch:
            self.wake()  # more may be waiting: carry on without the interval's pause
        if taken or sent:
            # Events arriving meanwhile are taken together: fewer, larger transactions,
            # which on SQLite leave the scheduler's own writes fewer chances to collide.
            await asyncio.sleep(self.settle_s)

    async def deliver_due(self) -> int:
        now = utcnow()
        async with session_scope(self.factory) as session:
            due = [
                _Due(r.id, r.event_id, r.url, r.payload, r.attempts, r.created_at)
                for r in (
                    await session.scalars(
                        select(WebhookEventModel)
                        .where(WebhookEventModel.next_attempt_at <= now)
                        .order_by(WebhookEventModel.next_attempt_at, WebhookEventModel.id)
                        .limit(self.batch)
                    )
                ).all()
            ]
        if not due:
            return 0
        if self._client is None:
            self._client = httpx.AsyncClient(
                timeout=self.settings.webhooks.timeout_s,
                limits=httpx.Limits(max_connections=32),
            )
        # One delivery per endpoint first: an endpoint that is down or failing costs one
        # attempt and one statement per pass, not one of each per event queued for it.
        by_url: dict[str, list[_Due]] = {}
        for event in due:
            by_url.setdefault(event.url, []).append(event)
        probes = [events[0] for events in by_url.values()]
        probe_results = await self._send_all(probes)
        failing = {
            p.url: (p, detail)
            for p, (outcome, detail) in zip(probes, probe_results, strict=True)
            if outcome == core.Outcome.RETRY
        }
        rest = [e for url, events in by_url.items() if url not in failing for e in events[1:]]
        rest_results = await self._send_all(rest)
        await self._settle(
            probes + rest, [*probe_results, *rest_results], list(failing.values()), now
        )
        return len(due)

    async def _send_all(self, events: list[_Due]) -> list[tuple[str, str]]:
        """Sent SEND_AT_ONCE at a time, each group only while no scheduling pass runs: the
        requests' work shares the event loop with the pass, which would wait behind it."""
        results: list[tuple[str, str]] = []
        for start in range(0, len(events), self.SEND_AT_ONCE):
            if self.scheduler_idle is not None:
                await self.scheduler_idle.wait()
            group = events[start : start + self.SEND_AT_ONCE]
            results += await asyncio.gather(*(self._send(e) for e in group))
        return results

    async def _send(self, event: _Due) -> tuple[str, str]:
        body = event.payload.encode()
        assert self._client is not None
        try:
            reply = await self._client.post(
                event.url, content=body, headers=_headers(self._key, body, event.event_id)
            )
        except httpx.HTTPError as exc:
            return core.Outcome.RETRY, f"{type(exc).__name__}: {exc}"[:500]
        return core.outcome_of(reply.status_code), f"HTTP {reply.status_code}"

    async def _settle(
        self,
        due: list[_Due],
        results: list[tuple[str, str]],
        failing: list[tuple[_Due, str]],
        picked_at: datetime,
    ) -> None:
        """One short write: delivered and dropped ones deleted, the others' next attempt set;
        the other due events of a failing endpoint wait with its probe."""
        cfg = self.settings.webhooks
        now = utcnow()
        finished: list[int] = []
        retries: list[dict[str, Any]] = []
        for event, (outcome, detail) in zip(due, results, strict=True):
            if outcome == core.Outcome.DELIVERED:
                finished.append(event.id)
                continue
            age = (now - event.created_at).total_seconds()
            if outcome == core.Outcome.REFUSED or age > cfg.max_age_s:
                log.warning(
                    "webhook event %s to %s dropped after %d attempts: %s",
                    event.event_id,
                    event.url,
                    event.attempts + 1,
                    detail,
                )
                finished.append(event.id)
                continue
            attempts = event.attempts + 1
            wait = core.retry_delay(attempts, cfg.retry_initial_s, cfg.retry_max_s)
            retries.append(
                {
                    "row_id": event.id,
                    "attempts": attempts,
                    "next_attempt_at": now + timedelta(seconds=wait),
                    "last_error": detail,
                }
            )
        if retries:
            first = next(d for d in due if d.id == retries[0]["row_id"])
            log.info(
                "%d webhook deliveries failed and will be retried (e.g. %s: %s)",
                len(retries),
                first.url,
                retries[0]["last_error"],
            )
        if not finished and not retries:
            return
        async with session_scope(self.factory) as session:
            for probe, detail in failing:
                attempts = probe.attempts + 1
                wait = core.retry_delay(attempts, cfg.retry_initial_s, cfg.retry_max_s)
                same_endpoint = (WebhookEventModel.url == probe.url) & (
                    WebhookEventModel.id != probe.id
                )
                expired = await session.execute(
                    delete(WebhookEventModel).where(
                        same_endpoint,
                        WebhookEventModel.created_at < now - timedelta(seconds=cfg.max_age_s),
                    )
                )
                dropped = int(getattr(expired, "rowcount", 0) or 0)
                if dropped:
                    log.warning(
                        "%d webhook events to %s dropped: still undelivered after "
                        "webhooks.max_age_s (%.0f s); the endpoint fails with: %s",
                        dropped,
                        probe.url,
                        cfg.max_age_s,
                        detail,
                    )
                await session.execute(
                    update(WebhookEventModel)
                    .where(same_endpoint, WebhookEventModel.next_attempt_at <= picked_at)
                    .values(
                        attempts=WebhookEventModel.attempts + 1,
                        next_attempt_at=now + timedelta(seconds=wait),
                        last_error=detail,
                    )
                )
            if retries:
                # One executemany through Core, not the ORM's bulk update by primary key:
                # that raises StaleDataError (rolling the whole batch back, so delivered
                # events would be sent again) when a webhook deleted mid-delivery took its
                # events with it; here a vanished row updates nothing.
                table = cast(Table, WebhookEventModel.__table__)
                await session.execute(
                    update(table).where(table.c.id == bindparam("row_id")), retries
                )
            if finished:
                await session.execute(
                    delete(WebhookEventModel).where(WebhookEventModel.id.in_(finished))
                )


async def pending_deliveries(session: AsyncSession) -> int:
    return int(await session.scalar(select(func.count()).select_from(WebhookEventModel)) or 0)
