"""The master's side of the agent link: connected agents, resync, liveness, launches, exits.

One `AgentHub` per master process. The gRPC servicer (master/grpc_server.py) hands it each
stream's messages; `HubLoop` calls `tick()` a few times a second to launch assigned
allocations, pass on stop requests and declare silent agents lost. Database changes go
through the same services the REST API uses (register_agent, release_allocation, states),
each in its own short transaction.

Allocation lifecycle on the agents (AllocationModel.state, written only here after the
scheduler's ASSIGNED): ASSIGNED -> PULLING (the chief reserves the rendezvous port) ->
STARTING (every agent was sent its ranks) -> RUNNING (every agent started them) ->
TERMINATED (release_allocation, once every agent reported its ranks gone, or one was lost).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import secrets
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from master.core import launch, task_config
from master.core.credentials import new_token
from master.core.interfaces import InterfaceChoice, choose_interface
from master.db.models import (
    AgentModel,
    AllocationModel,
    AllocationSlotModel,
    AllocationState,
    ExperimentModel,
    ModelDefinitionModel,
    SlotModel,
    TaskModel,
    TrialModel,
    TrialState,
    UserModel,
)
from master.db.session import DatabaseHealth, is_outage, session_scope
from master.errors import InvalidArgument
from master.services import agents as agent_service
from master.services import allocations, release, states, trial_reports
from master.services import auth as auth_service
from master.services import logs as log_service
from master.services import metrics as metric_service
from master.services.allocations import HELD_STATES, ReleaseOutcome
from master.services.leadership import Leadership
from master.services.loops import Loop
from master.services.preemption import PreemptionSignals
from master.services.prometheus import ROUND_TRIP_BUCKETS_S, Histogram
from master.settings import MasterSettings, TaskContainerDefaults
from resolute_proto.agent.v1 import agent_pb2 as pb

log = logging.getLogger(__name__)

NO_COMMON_INTERFACE = "NO_COMMON_INTERFACE"
PREPARE_TIMEOUT_S = 30.0
# Messages kept for the database's return (about 50 MB of logs at 500 lines a batch).
MAX_BACKLOG = 1000
# A trial whose code polled the preemption signal this recently is listening for it.
PREEMPTION_POLL_WINDOW_S = 15.0
TASK_TOKEN_TTL = timedelta(days=7)
_SENDS = "agent_link_sends"
_LAUNCHING = (AllocationState.ASSIGNED, AllocationState.PULLING)
# Exits that stop the rest of the gang.
_FAILURES = (pb.EXIT_KIND_FAILED, pb.EXIT_KIND_UNRUNNABLE)
# A gang rebuilt from the database (after a failure or a restart) resumes where it stood.
_PHASE_OF_STATE = {
    AllocationState.ASSIGNED: "assigned",
    AllocationState.PULLING: "assigned",  # the chief's answer may be lost: prepare again
    AllocationState.STARTING: "starting",
}


@dataclass(eq=False)
class Connection:
    agent_id: str
    stream_id: str
    instance_id: str = ""
    # The address the master sees the agent's stream come from: the way back to it for the
    # proxy (notebooks, TensorBoards, shells).
    peer_host: str = ""
    outbox: asyncio.Queue[pb.MasterMessage | None] = field(default_factory=asyncio.Queue)
    last_heartbeat: float = field(default_factory=time.monotonic)
    closed: bool = False
    # Enrolled on this stream: its first heartbeat shows the agent has read (and stored)
    # the secret, which then becomes the only way in for this id.
    unconfirmed_credential: bool = False

    def send(self, message: pb.MasterMessage) -> None:
        if not self.closed:
            self.outbox.put_nowait(message)

    def close(self) -> None:
        """End the stream from the master's side (the servicer's writer stops on None)."""
        if not self.closed:
            self.closed = True
            self.outbox.put_nowait(None)


@dataclass
class Gang:
    """What the master knows of one allocation's ranks on its agents."""

    allocation_id: str
    members: list[launch.GangMember]  # chief first
    phase: str = "assigned"  # assigned | preparing | starting | running
    prepare_sent_at: float = 0.0
    started: set[str] = field(default_factory=set)
    exits: dict[str, pb.AllocationExited] = field(default_factory=dict)
    failure: str = ""
    failure_at: float | None = None  # when the first rank failure was reported (monotonic)
    stop_sent: bool = False
    # How the allocation ends, decided before every agent has said its ranks are gone
    # (an agent lost, a failed start); released with it once they all have.
    decided: tuple[ReleaseOutcome, str] | None = None
    # The gang's addresses on its network interface, in gang order (set when preparing).
    addresses: tuple[str, ...] = ()
    # When the hub first saw the master wants the ranks to stop on their own (monotonic).
    preempt_seen_at: float | None = None
    preempt_listening: bool = False
    # The experiment's preemption_timeout, read when a stop is first wanted (None: unread).
    preemption_timeout_s: float | None = None

    @property
    def agent_ids(self) -> list[str]:
        return [m.agent_id for m in self.members]

    @property
    def chief(self) -> str:
        return self.members[0].agent_id

    def may_run_ranks(self) -> bool:
        """Whether some agent may still run ranks of it: a start went out and not every
        agent has said its ranks are gone (a lost agent counts as gone: its fence)."""
        started = self.phase in ("starting", "running")
        return started and not set(self.exits) >= set(self.agent_ids)


class StateMessageFailed(Exception):
    """Handling an agent's prepared/started/exited message failed; the stream must end."""


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _exit_ack(allocation_id: str) -> pb.MasterMessage:
    return pb.MasterMessage(exit_ack=pb.ExitAck(allocation_id=allocation_id))


class Refusal(Exception):
    """The agent may not join; the reason is sent to it before the stream closes."""


class AgentHub:
    def __init__(
        self,
        factory: async_sessionmaker[AsyncSession],
        settings: MasterSettings,
        *,
        master_id: str,
        cluster_id: str,
        join_token: str,
        metrics: metric_service.MetricsBuffer,
        wake_scheduler: Callable[[], None] = lambda: None,
        preemption: PreemptionSignals | None = None,
        health: DatabaseHealth | None = None,
        leadership: Leadership | None = None,
    ) -> None:
        self.factory = factory
        self.settings = settings
        self.link = settings.agent_link
        self.master_id = master_id
        self.cluster_id = cluster_id
        self.join_token = join_token
        self.metrics = metrics
        self.wake_scheduler = wake_scheduler
        self.preemption = preemption or PreemptionSignals()
        self.health = health or DatabaseHealth()
        # With standby masters: heartbeats are acknowledged only while the lease surely
        # runs, so no agent's fence outlasts this master's leadership.
        self.leadership = leadership
        # Agents' messages that could not be stored while the database was unreachable,
        # in arrival order; replayed by the tick once it is back. While it holds any,
        # later messages queue behind them, so an exit never overtakes its logs.
        self.backlog: deque[tuple[Connection, pb.AgentMessage]] = deque()
        # For the metrics endpoint: each agent's latest reading and heartbeat round trip,
        # and how many runs agents fenced since this master started.
        self.latest_reading: dict[str, metric_service.MetricReading] = {}
        self.round_trips = Histogram(ROUND_TRIP_BUCKETS_S)
        self.last_round_trip_s: dict[str, float] = {}
        self.fenced_runs = 0
        self.connections: dict[str, Connection] = {}
        self.gangs: dict[str, Gang] = {}
        # Agents that hold allocations but have no stream: since when (monotonic).
        self.absent_since: dict[str, float] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        # One state machine: a connect, a prepared/started/exited message, a tick and a
        # loss declaration each run alone, so none acts on a gang another is changing.
        # Heartbeats and logs stay outside it.
        self._lock = asyncio.Lock()

    @contextlib.asynccontextmanager
    async def _transaction(self) -> AsyncIterator[AsyncSession]:
        """A session whose messages to agents (`_send`) go out only after it commits, so
        an agent's answer never races the state change that asked for it."""
        async with session_scope(self.factory) as session:
            sends: list[tuple[Connection, pb.MasterMessage]] = []
            session.info[_SENDS] = sends
            yield session
        for connection, message in sends:
            connection.send(message)

    def _send(self, session: AsyncSession, agent_id: str, message: pb.MasterMessage) -> None:
        connection = self.connections.get(agent_id)
        if connection is not None:
            session.info[_SENDS].append((connection, message))

    # -- start-up ------------------------------------------------------------------------

    async def recover(self) -> None:
        """After a (re)start no agent is connected yet: every agent is marked disconnected,
        and those holding allocations get the reconnect window before they count as lost."""
        now = time.monotonic()
        async with self._transaction() as session:
            holders = await _agents_holding_allocations(session)
            await session.execute(
                update(AgentModel)
                .where(AgentModel.connected.is_(True))
                .values(connected=False)
                .execution_options(synchronize_session=False)
            )
            allocations.request_scheduling(session)
        for agent_id in holders:
            self.absent_since[agent_id] = now
        if holders:
            log.info(
                "waiting up to %.0fs for %d agents to reconnect",
                self.link.lost_after_s,
                len(holders),
            )

    def restart_absence_clocks(self) -> None:
        """Called once the agent port listens. An agent's fence may have kept its ranks
        alive on connections refused until then (agent/link.py), so its silence counts
        from here: lost_after_s later, its fence has surely fired."""
        now = time.monotonic()
        for agent_id, since in self.absent_since.items():
            self.absent_since[agent_id] = max(since, now)

    # -- connections -----------------------------------------------------------------------

    async def open(self, hello: pb.Hello, peer: str = "") -> tuple[Connection, pb.Welcome]:
        """Authenticate and register the agent, reconcile what it runs; raise Refusal.
        `peer`: gRPC's name of the stream's other end ("ipv4:198.18.0.2:40112")."""
        registration = agent_service.AgentRegistration(
            id=hello.agent_id,
            resource_pool=hello.resource_pool or self.settings.default_compute_pool,
            devices=tuple(
                agent_service.Device(
                    slot_id=d.slot_id,
                    type=d.type,
                    brand=d.brand,
                    uuid=d.uuid,
                    memory_bytes=d.memory_bytes or None,
                )
                for d in hello.devices
            ),
            addresses=tuple(sorted({a for i in hello.interfaces for a in i.ipv4})),
            version=hello.version,
            hostname=hello.hostname,
        )
        old = self.connections.get(hello.agent_id)
        if (
            old is not None
            and old.instance_id != hello.instance_id
            and time.monotonic() - old.last_heartbeat < self.link.lost_after_s
        ):
            raise Refusal(
                f"agent id {hello.agent_id!r} is already connected from another process "
                f"(stream {old.stream_id}); give each agent its own --id"
            )
        async with self._lock:
            connection, welcome = await self._open(hello, registration)
        connection.peer_host = peer_host(peer)
        return connection, welcome

    async def _open(
        self, hello: pb.Hello, registration: agent_service.AgentRegistration
    ) -> tuple[Connection, pb.Welcome]:
        stop_ids: list[str] = []
        issued: str | None = None
        try:
            async with self._transaction() as session:
                # Under the scheduler's lock, which a revocation takes too: it committed
                # before this reads the row (refused here), or it waits for this commit and
                # then finds this connection to close.
                await allocations.hold_scheduler(session)
                issued = await self._authenticate(session, hello)
                agent = await agent_service.register_agent(session, self.settings, registration)
                if issued:
                    agent.credential_hash = _digest(issued)
                    agent.credential_confirmed = False
                agent.interfaces = [
                    {"name": i.name, "ipv4": list(i.ipv4)} for i in hello.interfaces
                ]
                stop_ids = await self._reconcile(session, hello)
        except InvalidArgument as exc:
            raise Refusal(str(exc)) from None
        old = self.connections.get(hello.agent_id)
        if old is not None:
            old.close()
        connection = Connection(hello.agent_id, str(uuid.uuid4()), hello.instance_id)
        connection.unconfirmed_credential = issued is not None
        self.connections[hello.agent_id] = connection
        self.absent_since.pop(hello.agent_id, None)
        self.wake_scheduler()
        log.info(
            "agent %s connected (stream %s, %d slots, running %d, exited %d)",
            hello.agent_id,
            connection.stream_id,
            len(hello.devices),
            len(hello.running),
            len(hello.exited),
        )
        welcome = pb.Welcome(
            stream_id=connection.stream_id,
            master_id=self.master_id,
            heartbeat_interval_s=self.link.heartbeat_interval_s,
            metrics_period_s=self.link.metrics_period_s,
            fence_after_s=self.link.fence_after_s,
            fence_kill_after_s=self.link.fence_kill_after_s,
            stop_allocation_ids=stop_ids,
            agent_secret=issued or "",
        )
        return connection, welcome

    async def _authenticate(self, session: AsyncSession, hello: pb.Hello) -> str | None:
        """An enrolled agent id admits only its own secret; an id not seen before is
        enrolled with the join token and gets a secret of its own (returned, to be sent in
        the Welcome). So one node holding the join token cannot pass for another enrolled
        node, a revoked id stays out, and the join token can be rotated without touching
        the enrolled agents. Until the agent has shown its secret back once, the join token
        still enrolls it afresh: a Welcome lost on the way must not lock the id out.
        Raises Refusal."""
        agent = await session.get(AgentModel, hello.agent_id, populate_existing=True)
        if agent is not None and agent.revoked_at is not None:
            raise Refusal(
                f"agent id {hello.agent_id!r} was revoked (det agent revoke); "
                "start this node under a new --id"
            )
        if agent is not None and agent.credential_hash is not None:
            if hello.agent_secret and secrets.compare_digest(
                _digest(hello.agent_secret), agent.credential_hash
            ):
                agent.credential_confirmed = True
                return None
            if agent.credential_confirmed:
                raise Refusal(
                    f"the credential does not match agent id {hello.agent_id!r}: that id is "
                    "enrolled and admits only its own secret (its agent-credential file)"
                )
        if not secrets.compare_digest(hello.join_token.encode(), self.join_token.encode()):
            raise Refusal("join token missing or wrong; start the agent with --join-token-file")
        if agent is not None and agent.credential_hash is None:
            log.warning(
                "agent %s was registered before agents had credentials: enrolled it now with "
                "the join token (revoke it if that was not the node you know)",
                hello.agent_id,
            )
        else:
            log.info("agent %s enrolled with the join token", hello.agent_id)
        return new_token()

    async def _confirm_credential(self, connection: Connection) -> None:
        try:
            async with self._transaction() as session:
                await session.execute(
                    update(AgentModel)
                    .where(AgentModel.id == connection.agent_id)
                    .values(credential_confirmed=True)
                )
        except Exception as exc:
            connection.unconfirmed_credential = True  # the next heartbeat tries again
            log.warning("agent %s: could not confirm its credential: %s", connection.agent_id, exc)

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def disconnect(self, agent_id: str, why: str) -> None:
        """End an agent's stream now (it was revoked): its next Hello is refused."""
        connection = self.connections.get(agent_id)
        if connection is not None:
            log.warning("closing the stream of agent %s: %s", agent_id, why)
            self.close(connection)

    async def _reconcile(self, session: AsyncSession, hello: pb.Hello) -> list[str]:
        """Match the agent's running allocations with ours. Returns those it must stop."""
        agent_id = hello.agent_id
        running = {r.allocation_id for r in hello.running}
        exited = {e.allocation_id for e in hello.exited}
        held = await _held_on_agent(session, agent_id)
        lost: list[str] = []
        stops: set[str] = set()
        for allocation_id, (state, stop_wanted) in held.items():
            gang = self.gangs.get(allocation_id)
            if allocation_id in running:
                if gang is None:
                    gang = await self._gang_from_db(session, allocation_id, state)
                gang.started.add(agent_id)
                if gang.phase in ("assigned", "preparing"):
                    gang.phase = "starting"
                if stop_wanted or gang.stop_sent:
                    stops.add(allocation_id)  # a stop sent before the break may be lost
                else:
                    await self._mark_running_if_started(session, gang)
            elif allocation_id in exited:
                continue
            elif state in (AllocationState.ASSIGNED, AllocationState.PULLING):
                # Not started anywhere yet: the next tick prepares it afresh.
                self.gangs.pop(allocation_id, None)
            else:
                lost.append(allocation_id)
        for allocation_id in lost:
            await self._fail_gang(
                session,
                allocation_id,
                ReleaseOutcome.AGENT_LOST,
                f"agent {agent_id} came back without the allocation's ranks",
                gone_from=agent_id,
            )
        return sorted((running - held.keys()) | stops)

    def close(self, connection: Connection) -> None:
        """The stream ended (either side). Running ranks keep their window to come back."""
        connection.close()
        if self.connections.get(connection.agent_id) is connection:
            del self.connections[connection.agent_id]
            self.absent_since[connection.agent_id] = connection.last_heartbeat
            task = asyncio.get_running_loop().create_task(
                self._mark_disconnected(connection.agent_id)
            )
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            log.info("agent %s disconnected (stream %s)", connection.agent_id, connection.stream_id)

    async def _mark_disconnected(self, agent_id: str) -> None:
        try:
            async with self._lock, self._transaction() as session:
                if agent_id not in self.connections:
                    await agent_service.set_connected(session, agent_id, False)
                    # What has not started there has nothing to wait for: place it again
                    # now rather than after the lost-agent window.
                    for allocation_id, (state, _) in (
                        await _held_on_agent(session, agent_id)
                    ).items():
                        if state in _LAUNCHING:
                            await self._fail_gang(
                                session,
                                allocation_id,
                                ReleaseOutcome.AGENT_LOST,
                                f"agent {agent_id} disconnected before the ranks started",
                            )
        except Exception:
            log.exception("could not mark agent %s disconnected", agent_id)

    # -- messages --------------------------------------------------------------------------

    async def on_message(self, connection: Connection, message: pb.AgentMessage) -> None:
        """Handle one message. A state message that fails raises StateMessageFailed after
        dropping what memory held of its gang (rebuilt from the database by the next tick);
        the servicer then ends the stream, so the agent resyncs and repeats its exits.

        While the database is unreachable, messages that need it wait in `backlog` and the
        stream stays up: heartbeats are still acknowledged, so no agent is fenced or
        declared lost because of the database."""
        connection.last_heartbeat = time.monotonic()  # any message shows the agent alive
        kind = message.WhichOneof("body")
        if kind == "heartbeat":
            self.on_heartbeat(connection, message.heartbeat)
            return
        if self.backlog:
            self._queue(connection, message)
            return
        try:
            await self._handle(connection, message)
        except Exception as exc:
            if not is_outage(exc):
                raise
            self.health.failed(exc)
            self._queue(connection, message)

    def _queue(self, connection: Connection, message: pb.AgentMessage) -> None:
        if len(self.backlog) >= MAX_BACKLOG:
            dropped = self.backlog.popleft()[1]
            log.warning("database backlog full: dropped a %s message", dropped.WhichOneof("body"))
        self.backlog.append((connection, message))

    async def replay_backlog(self) -> None:
        """Handle what waited for the database, in order; stop at the first outage."""
        while self.backlog:
            connection, message = self.backlog[0]
            try:
                await self._handle(connection, message)
            except Exception as exc:
                if is_outage(exc):
                    raise
                log.exception(
                    "agent %s: %s from the backlog failed; closing its stream to resync",
                    connection.agent_id,
                    message.WhichOneof("body"),
                )
                self.close(connection)
            self.backlog.popleft()

    async def _handle(self, connection: Connection, message: pb.AgentMessage) -> None:
        kind = message.WhichOneof("body")
        if kind == "logs":
            await self.on_logs(connection, message.logs)
            return
        if kind not in ("prepared", "started", "exited"):
            log.warning("agent %s sent an unexpected %s message", connection.agent_id, kind)
            return
        body = getattr(message, kind)
        async with self._lock:
            try:
                if kind == "prepared":
                    await self.on_prepared(connection, body)
                elif kind == "started":
                    await self.on_started(connection, body)
                else:
                    await self.on_exited(connection, body)
            except Exception as exc:
                self.gangs.pop(body.allocation_id, None)
                if is_outage(exc):
                    raise
                raise StateMessageFailed(f"{kind} for {body.allocation_id}") from exc

    def on_heartbeat(self, connection: Connection, heartbeat: pb.Heartbeat) -> None:
        connection.last_heartbeat = time.monotonic()
        if connection.unconfirmed_credential:
            connection.unconfirmed_credential = False
            self._spawn(self._confirm_credential(connection))
        if self.leadership is not None and not self.leadership.valid():
            return  # no acknowledgement: see Leadership
        if heartbeat.samples:
            readings = [_reading(s) for s in heartbeat.samples]
            self.metrics.add(connection.agent_id, readings)
            self.latest_reading[connection.agent_id] = readings[-1]
        if heartbeat.last_round_trip_micros:
            seconds = heartbeat.last_round_trip_micros / 1e6
            self.round_trips.observe(seconds)
            self.last_round_trip_s[connection.agent_id] = seconds
        connection.send(
            pb.MasterMessage(
                heartbeat_ack=pb.HeartbeatAck(
                    seq=heartbeat.seq, sent_unix_nanos=heartbeat.sent_unix_nanos
                )
            )
        )

    async def on_logs(self, connection: Connection, batch: pb.LogBatch) -> None:
        lines = [
            log_service.LogLine(
                allocation_id=e.allocation_id,
                rank=e.rank if e.rank >= 0 else None,
                stdtype=e.stdtype or "stdout",
                timestamp=datetime.fromtimestamp(e.unix_micros / 1e6, UTC),
                message=e.message,
            )
            for e in batch.entries
        ]
        async with self._transaction() as session:
            await log_service.append_logs(session, connection.agent_id, lines, placed_only=True)

    async def on_prepared(self, connection: Connection, prepared: pb.AllocationPrepared) -> None:
        gang = self.gangs.get(prepared.allocation_id)
        if gang is None or gang.phase != "preparing" or connection.agent_id != gang.chief:
            return
        async with self._transaction() as session:
            if prepared.error:
                gang.failure = f"agent {connection.agent_id}: {prepared.error}"
                await self._fail_gang(
                    session, gang.allocation_id, ReleaseOutcome.FAILED, gang.failure
                )
                return
            await self._start(session, gang, prepared.master_port, tuple(prepared.extra_ports))

    async def on_started(self, connection: Connection, started: pb.AllocationStarted) -> None:
        gang = self.gangs.get(started.allocation_id)
        if gang is None or connection.agent_id not in gang.agent_ids:
            return
        gang.started.add(connection.agent_id)
        async with self._transaction() as session:
            await self._mark_running_if_started(session, gang)

    async def _mark_running_if_started(self, session: AsyncSession, gang: Gang) -> None:
        if not gang.started >= set(gang.agent_ids):
            return
        # The scheduler's lock first, in the same order as kill and pause take it. Without
        # bumping the epoch: STARTING and RUNNING hold the same slots, so no pass is owed.
        await allocations.hold_scheduler_for_pass(session)
        allocation = await session.get(AllocationModel, gang.allocation_id, populate_existing=True)
        if allocation is None or allocation.state != AllocationState.STARTING:
            return
        allocation.state = AllocationState.RUNNING
        gang.phase = "running"
        if allocation.trial_id is None:
            log.info("task allocation %s running on %s", gang.allocation_id, gang.chief)
            return
        trial = await session.get(TrialModel, allocation.trial_id)
        if trial is not None and TrialState(trial.state) in (
            TrialState.PULLING,
            TrialState.STARTING,
        ):
            states.set_trial_state(session, trial, TrialState.RUNNING, "every rank started")
        log.info("allocation %s running on %s", gang.allocation_id, ", ".join(gang.agent_ids))

    async def on_exited(self, connection: Connection, exited: pb.AllocationExited) -> None:
        agent_id = connection.agent_id
        allocation_id = exited.allocation_id
        newly_fenced = False
        async with self._transaction() as session:
            allocation = await session.get(AllocationModel, allocation_id)
            if allocation is None or allocation.state not in HELD_STATES:
                self.gangs.pop(allocation_id, None)
                self._send(session, agent_id, _exit_ack(allocation_id))
                return
            gang = self.gangs.get(allocation_id) or await self._gang_from_db(session, allocation_id)
            if agent_id not in gang.agent_ids:
                # Only the gang's own agents may end it; anything else is ignored (not
                # acked, so a confused agent keeps saying it and the log shows it).
                log.warning(
                    "agent %s reported an exit of %s, which it does not run",
                    agent_id,
                    allocation_id,
                )
                return
            newly_fenced = exited.kind == pb.EXIT_KIND_FENCED and agent_id not in gang.exits
            if newly_fenced:
                self.fenced_runs += 1
                # Out of the scheduler's choice in the same commit that frees the slots.
                await agent_service.set_connected(session, agent_id, False)
            gang.exits[agent_id] = exited
            log.info(
                "allocation %s: ranks on %s exited (%s) %s",
                allocation_id,
                agent_id,
                pb.ExitKind.Name(exited.kind),
                exited.message,
            )
            if exited.kind in _FAILURES and not gang.failure:
                gang.failure = f"agent {agent_id}: {exited.message or 'a rank failed'}"
                gang.failure_at = time.monotonic()
            if gang.failure and not gang.stop_sent:
                self._send_stop(session, gang, f"stopping the gang: {gang.failure}")
            if exited.kind == pb.EXIT_KIND_FENCED and not gang.stop_sent:
                # Its peers would wait on the fenced ranks in their collectives.
                self._send_stop(session, gang, f"agent {agent_id} fenced its ranks")
            if set(gang.exits) >= set(gang.agent_ids):
                outcome, message = gang.decided or await self._outcome(session, gang, allocation)
                await self._release(session, gang, outcome, message)
        if newly_fenced:
            # It hears nothing from us (a one-way partition, perhaps) though we hear it: no
            # more work for it until it reconnects, which closing its stream makes it do.
            log.warning("agent %s fenced its ranks: closing its stream", agent_id)
            self.close(connection)

    async def _outcome(
        self, session: AsyncSession, gang: Gang, allocation: AllocationModel
    ) -> tuple[ReleaseOutcome, str]:
        kinds = {e.kind for e in gang.exits.values()}
        unrunnable = [e.message for e in gang.exits.values() if e.kind == pb.EXIT_KIND_UNRUNNABLE]
        if unrunnable:
            return ReleaseOutcome.UNRUNNABLE, unrunnable[0]
        if gang.failure:
            return ReleaseOutcome.FAILED, gang.failure
        if allocation.state == AllocationState.TERMINATING:
            return ReleaseOutcome.KILLED, "stopped on request"
        if kinds == {pb.EXIT_KIND_COMPLETED} and allocation.trial_id is not None:
            trial = await session.get(TrialModel, allocation.trial_id)
            early = await trial_reports.early_exit_reason(session, trial) if trial else None
            if early is not None:  # det.InvalidHP: done, never rerun, even if preempted
                return ReleaseOutcome.COMPLETED, early
        if allocation.preempt_requested and (
            allocation.preempt_acked or kinds != {pb.EXIT_KIND_COMPLETED}
        ):
            # Ranks that acknowledged the signal, checkpointed and exited 0 have not
            # finished their work: the trial runs again later from that checkpoint. An
            # exit 0 without an acknowledgement is a finished trial (Determined's rule).
            return ReleaseOutcome.PREEMPTED, "stopped for preemption"
        if kinds == {pb.EXIT_KIND_COMPLETED}:
            return ReleaseOutcome.COMPLETED, ""
        if pb.EXIT_KIND_COMPLETED in kinds:
            # Some ranks finished and the others were stopped: the work is done.
            return ReleaseOutcome.COMPLETED, ""
        # Stopped by their agent, not by us: it is shutting down. Not the trial's fault.
        messages = "; ".join(sorted({e.message for e in gang.exits.values() if e.message}))
        return ReleaseOutcome.AGENT_LOST, f"ranks stopped by their agent ({messages})"

    # -- the periodic tick -----------------------------------------------------------------

    async def tick(self) -> None:
        if self.backlog:
            await self.replay_backlog()  # each message takes the lock itself
        async with self._lock:
            await self._tick()

    async def _tick(self) -> None:
        await self._declare_lost()
        async with self._transaction() as session:
            # Running allocations need nothing from a tick unless asked to stop, so a busy
            # cluster's tick reads only the few that are starting or stopping.
            needs_work = or_(
                AllocationModel.state.in_((*_LAUNCHING, AllocationState.TERMINATING)),
                AllocationModel.state.in_(HELD_STATES) & AllocationModel.preempt_requested,
            )
            rows = (await session.scalars(select(AllocationModel).where(needs_work))).all()
            for allocation in rows:
                if allocation.preempt_requested or allocation.state == AllocationState.TERMINATING:
                    self.preemption.raise_signal(allocation.id)
                # One allocation that cannot advance must not hold up the others.
                sends = len(session.info[_SENDS])
                try:
                    async with session.begin_nested():
                        await self._advance(session, allocation)
                except Exception:
                    log.exception("allocation %s: advancing it failed", allocation.id)
                    self.gangs.pop(allocation.id, None)
                    del session.info[_SENDS][sends:]

    async def _advance(self, session: AsyncSession, allocation: AllocationModel) -> None:
        state = AllocationState(allocation.state)
        gang = self.gangs.get(allocation.id)
        stop_wanted = state == AllocationState.TERMINATING or allocation.preempt_requested
        # Ranks exist only once StartAllocation has gone out, which is when the
        # rendezvous port is recorded; before that a stop is a plain release. (A kill
        # moves the state to TERMINATING, so the state alone cannot tell.)
        not_started = allocation.master_port is None
        if not_started and stop_wanted:
            outcome = (
                ReleaseOutcome.KILLED
                if state == AllocationState.TERMINATING
                else ReleaseOutcome.PREEMPTED
            )
            if gang is None:
                gang = await self._gang_from_db(session, allocation.id, state)
            # The chief may hold a reserved port for it: the stop frees that.
            self._send_stop(session, gang, "stopped before it started")
            await self._release(session, gang, outcome, "stopped before it started")
            return
        if gang is None:
            gang = await self._gang_from_db(session, allocation.id, state)
        if stop_wanted and not gang.stop_sent:
            if state != AllocationState.TERMINATING:
                if gang.preemption_timeout_s is None:
                    gang.preemption_timeout_s = await self._preemption_timeout(session, allocation)
                if self._trial_may_stop_itself(gang):
                    return
            self._send_stop(session, gang, "stop requested")
            return
        if gang.phase == "assigned":
            await self._prepare(session, gang, allocation)
        elif gang.phase == "preparing" and (
            time.monotonic() - gang.prepare_sent_at > PREPARE_TIMEOUT_S
        ):
            gang.phase = "assigned"  # the chief never answered: ask again

    def _trial_may_stop_itself(self, gang: Gang) -> bool:
        """A preempted trial whose code polls the preemption signal gets
        `preemption_timeout_s` to checkpoint and exit; one that does not is stopped now."""
        now = time.monotonic()
        if gang.preempt_seen_at is None:
            gang.preempt_seen_at = now
        # Once told, a trial stops polling: the decision that it listens is kept.
        gang.preempt_listening = gang.preempt_listening or self.preemption.watched(
            gang.allocation_id, within_s=PREEMPTION_POLL_WINDOW_S
        )
        if not gang.preempt_listening:
            return False
        timeout = gang.preemption_timeout_s
        return now - gang.preempt_seen_at < (
            self.link.preemption_timeout_s if timeout is None else timeout
        )

    async def _preemption_timeout(
        self, session: AsyncSession, allocation: AllocationModel
    ) -> float:
        """The experiment's `preemption_timeout` (Determined's per-experiment setting), or
        the master's default."""
        config = await session.scalar(
            select(ExperimentModel.config).where(ExperimentModel.id == allocation.experiment_id)
        )
        value = (config or {}).get("preemption_timeout")
        return float(value) if value is not None else self.link.preemption_timeout_s

    async def _prepare(
        self, session: AsyncSession, gang: Gang, allocation: AllocationModel
    ) -> None:
        if any(a not in self.connections for a in gang.agent_ids):
            return  # an agent is away; it reconnects or is declared lost
        if allocation.task_id is not None:
            await self._prepare_task(session, gang, allocation)
            return
        experiment = await session.get(ExperimentModel, allocation.experiment_id)
        choice = await self._choose_interface(session, gang, allocation, experiment)
        if choice.name is None:
            if allocation.pending_code != NO_COMMON_INTERFACE:
                allocation.pending_code = NO_COMMON_INTERFACE
                allocation.pending_reason = f"cannot start: {choice.reason}"
                log.warning("allocation %s cannot start: %s", allocation.id, choice.reason)
            return
        # PULLING too: a prepare asked again (no answer in time, an answer without the
        # ports, a restarted master) finds the allocation there.
        if await _still(session, allocation.id, *_LAUNCHING) is None:
            return
        allocation.pending_code = allocation.pending_reason = ""
        allocation.network_interface = choice.name
        allocation.chief_address = choice.addresses[gang.chief]
        allocation.state = AllocationState.PULLING
        gang.phase = "preparing"
        gang.prepare_sent_at = time.monotonic()
        gang.addresses = tuple(choice.addresses[a] for a in gang.agent_ids)
        layout = launch.stored_layout(experiment.config) if experiment else launch.PER_SLOT
        per_agent = layout == launch.PER_AGENT
        self._send(
            session,
            gang.chief,
            pb.MasterMessage(
                prepare=pb.PrepareAllocation(
                    allocation_id=gang.allocation_id,
                    # Determined's ZMQ broadcast listens on two more ports of the chief.
                    extra_ports=2 if per_agent else 0,
                )
            ),
        )

    async def _prepare_task(
        self, session: AsyncSession, gang: Gang, allocation: AllocationModel
    ) -> None:
        """A task's one process needs no rendezvous, but its server needs a port, and the
        proxy the address the master reaches its agent at."""
        if await _still(session, allocation.id, *_LAUNCHING) is None:
            return
        allocation.pending_code = allocation.pending_reason = ""
        allocation.chief_address = self.connections[gang.chief].peer_host
        allocation.state = AllocationState.PULLING
        gang.phase = "preparing"
        gang.prepare_sent_at = time.monotonic()
        self._send(
            session,
            gang.chief,
            pb.MasterMessage(prepare=pb.PrepareAllocation(allocation_id=gang.allocation_id)),
        )

    async def _choose_interface(
        self,
        session: AsyncSession,
        gang: Gang,
        allocation: AllocationModel,
        experiment: ExperimentModel | None,
    ) -> InterfaceChoice:
        environment = (experiment.config.get("environment") if experiment else None) or {}
        explicit = (
            environment.get("dtrain_network_interface")
            or self._container_defaults(allocation.resource_pool).dtrain_network_interface
        )
        rows = (
            await session.execute(
                select(AgentModel.id, AgentModel.interfaces).where(
                    AgentModel.id.in_(gang.agent_ids)
                )
            )
        ).all()
        reported = {
            agent_id: {i["name"]: list(i.get("ipv4", [])) for i in interfaces or []}
            for agent_id, interfaces in rows
        }
        return choose_interface({a: reported.get(a, {}) for a in gang.agent_ids}, explicit)

    async def _start(
        self,
        session: AsyncSession,
        gang: Gang,
        master_port: int,
        extra_ports: tuple[int, ...] = (),
    ) -> None:
        allocation = await _still(session, gang.allocation_id, AllocationState.PULLING)
        if allocation is None:
            return  # stopped meanwhile: the next tick releases it
        if allocation.task_id is not None:
            await self._start_task(session, gang, allocation, master_port)
            return
        # What the launch needs, in one statement rather than four.
        found = (
            await session.execute(
                select(TrialModel, ExperimentModel, ModelDefinitionModel, UserModel)
                .join(ExperimentModel, ExperimentModel.id == TrialModel.experiment_id)
                .outerjoin(
                    ModelDefinitionModel,
                    ModelDefinitionModel.experiment_id == ExperimentModel.id,
                )
                .outerjoin(UserModel, UserModel.id == ExperimentModel.owner_id)
                .where(TrialModel.id == allocation.trial_id)
            )
        ).one()  # foreign keys: the trial and its experiment exist
        trial, experiment, model_definition, owner = found
        token, allocation.task_session_id = await auth_service.issue_task_token(
            session, experiment.owner_id, TASK_TOKEN_TTL, trial.id
        )
        resume = await trial_reports.resume_point(session, trial, experiment)
        steps_completed = await trial_reports.start_run_from(session, trial, resume)
        info = launch.TrialInfo(
            experiment_id=experiment.id,
            trial_id=trial.id,
            run_id=trial.run_id,
            task_id=allocations.task_id(trial),
            allocation_id=allocation.id,
            seed=trial.seed,
            hparams=trial.hparams,
            config=experiment.config,
            steps_completed=steps_completed,
            latest_checkpoint=resume.uuid if resume is not None else "",
            user=owner.username if owner else "",
            session_token=token,
        )
        device_type = await _device_type(session, gang)
        layout = launch.stored_layout(experiment.config)
        if layout == launch.PER_AGENT and len(extra_ports) < 2:
            gang.phase = "assigned"  # an answer to an older prepare: ask again
            return
        try:
            argv = launch.entrypoint_argv(experiment.config)
            launches = launch.build_launches(
                gang.members,
                info,
                launch.Rendezvous(
                    allocation.network_interface,
                    allocation.chief_address,
                    master_port,
                    addresses=gang.addresses,
                    comm_ports=extra_ports,
                ),
                master_url=self.settings.master_url,
                cluster_id=self.cluster_id,
                master_id=self.master_id,
                device_type=device_type,
                layout=layout,
                default_variables=self._default_variables(allocation.resource_pool, device_type),
            )
        except launch.LaunchError as exc:
            await self._fail_gang(session, gang.allocation_id, ReleaseOutcome.FAILED, str(exc))
            return
        allocation.master_port = master_port
        allocation.state = AllocationState.STARTING
        gang.phase = "starting"
        archive = model_definition.archive if model_definition else b""
        for agent_launch in launches:
            self._send(
                session,
                agent_launch.agent_id,
                pb.MasterMessage(
                    start=pb.StartAllocation(
                        allocation_id=allocation.id,
                        trial_id=trial.id,
                        experiment_id=experiment.id,
                        ranks=[
                            pb.RankSpec(rank=r.rank, local_rank=r.local_rank, slot_ids=r.slot_ids)
                            for r in agent_launch.ranks
                        ],
                        argv=argv,
                        env=agent_launch.env,
                        model_definition=archive,
                        stop_grace_s=self.link.stop_grace_s,
                        layout=(
                            pb.LAUNCH_LAYOUT_PER_AGENT
                            if layout == launch.PER_AGENT
                            else pb.LAUNCH_LAYOUT_PER_SLOT
                        ),
                        info_files=agent_launch.info_files,
                        shared_fs_host_path=launch.shared_fs_host_path(experiment.config),
                    )
                ),
            )
        log.info(
            "allocation %s starting (%s): %d processes on %s, rendezvous %s:%d over %s",
            allocation.id,
            layout,
            sum(len(x.ranks) for x in launches),
            ", ".join(gang.agent_ids),
            allocation.chief_address,
            master_port,
            allocation.network_interface,
        )

    async def _start_task(
        self, session: AsyncSession, gang: Gang, allocation: AllocationModel, port: int
    ) -> None:
        found = (
            await session.execute(
                select(TaskModel, UserModel)
                .join(UserModel, UserModel.id == TaskModel.owner_id)
                .where(TaskModel.id == allocation.task_id)
            )
        ).one()  # foreign keys: the task and its owner exist
        task, owner = found
        # The owner's own API access, as Determined gives a notebook (`det` inside it acts
        # as the user); revoked when the task ends.
        token, allocation.task_session_id = await auth_service.issue_interactive_token(
            session, owner.id, TASK_TOKEN_TTL, f"{task.type.lower()} {task.uuid}"
        )
        config = task_config.validate_task_config(task.config, task.type)
        device_type = await _device_type(session, gang)
        info = launch.TaskInfo(
            task_id=task.uuid,
            task_type=task.type,
            allocation_id=allocation.id,
            config=task.config,
            argv=tuple(
                task_config.task_argv(
                    task.type,
                    config,
                    task_uuid=task.uuid,
                    port=port,
                    experiment_ids=task.experiment_ids,
                    trial_ids=task.trial_ids,
                )
            ),
            port=port,
            secret=task.secret,
            user=owner.username,
            session_token=token,
        )
        agent_launch = launch.build_task_launch(
            gang.members[0],
            info,
            master_url=self.settings.master_url,
            cluster_id=self.cluster_id,
            master_id=self.master_id,
            device_type=device_type,
            default_variables=self._default_variables(allocation.resource_pool, device_type),
        )
        allocation.master_port = port
        allocation.state = AllocationState.STARTING
        gang.phase = "starting"
        self._send(
            session,
            agent_launch.agent_id,
            pb.MasterMessage(
                start=pb.StartAllocation(
                    allocation_id=allocation.id,
                    ranks=[
                        pb.RankSpec(rank=r.rank, local_rank=r.local_rank, slot_ids=r.slot_ids)
                        for r in agent_launch.ranks
                    ],
                    argv=list(info.argv),
                    env=agent_launch.env,
                    stop_grace_s=self.link.stop_grace_s,
                    layout=pb.LAUNCH_LAYOUT_PER_SLOT,
                )
            ),
        )
        log.info(
            "%s %s starting on %s (port %d): %s",
            task.type.lower(),
            task.uuid,
            agent_launch.agent_id,
            port,
            " ".join(info.argv)[:200],
        )

    def _container_defaults(self, pool_name: str) -> TaskContainerDefaults:
        """task_container_defaults: the pool's own, else the master's."""
        pool = self.settings.pool(pool_name)
        own = pool.task_container_defaults if pool else None
        return own or self.settings.task_container_defaults

    def _default_variables(self, pool_name: str, device_type: str) -> dict[str, str]:
        defaults = self._container_defaults(pool_name).environment_variables
        return launch.runtime_variables(defaults, device_type)

    # -- stopping, failing, releasing --------------------------------------------------------

    def _send_stop(self, session: AsyncSession, gang: Gang, reason: str) -> None:
        gang.stop_sent = True
        for agent_id in gang.agent_ids:
            if agent_id not in gang.exits:
                self._send(
                    session,
                    agent_id,
                    pb.MasterMessage(
                        stop=pb.StopAllocation(
                            allocation_id=gang.allocation_id,
                            reason=reason,
                            grace_s=self.link.stop_grace_s,
                        )
                    ),
                )

    async def _fail_gang(
        self,
        session: AsyncSession,
        allocation_id: str,
        outcome: ReleaseOutcome,
        message: str,
        *,
        gone_from: str | None = None,
        lost_silent_since: float | None = None,
    ) -> None:
        """Stop whatever still runs of the gang; release the allocation once no agent can
        still run its ranks, so its replacement never overlaps them. Until then it stays
        held, and the agents' exits (or their loss) finish it with the outcome decided here.

        `gone_from`: an agent whose ranks are gone without an exit report (lost: its fence
        has killed them by now; or back without them).
        `lost_silent_since`: when the lost agent was last heard from. A rank failing after
        that failed because its peer vanished (its collective broke): not the trial's fault.
        """
        gang = self.gangs.get(allocation_id) or await self._gang_from_db(session, allocation_id)
        if gone_from is not None and gone_from in gang.agent_ids:
            gang.exits.setdefault(
                gone_from,
                pb.AllocationExited(
                    allocation_id=allocation_id, kind=pb.EXIT_KIND_FENCED, message=message
                ),
            )
        if gang.decided is None:
            failed_first = gang.failure_at is not None and (
                lost_silent_since is None or gang.failure_at < lost_silent_since
            )
            if gang.failure and outcome == ReleaseOutcome.AGENT_LOST and failed_first:
                # A rank had already failed on its own: that counts against max_restarts.
                outcome, message = ReleaseOutcome.FAILED, gang.failure
            gang.decided = (outcome, message)
            gang.failure = gang.failure or message
        if not gang.stop_sent:
            self._send_stop(session, gang, message)
        if gang.may_run_ranks():
            log.info(
                "allocation %s: waiting for the ranks on %s to stop before it is released",
                allocation_id,
                ", ".join(a for a in gang.agent_ids if a not in gang.exits),
            )
            return
        await self._release(session, gang, *gang.decided)

    async def _release(
        self, session: AsyncSession, gang: Gang, outcome: ReleaseOutcome, message: str
    ) -> None:
        self.gangs.pop(gang.allocation_id, None)
        self.preemption.forget(gang.allocation_id)
        await release.release_allocation(
            session, gang.allocation_id, outcome, message, exit_code=_exit_code(gang)
        )
        # Exits are acked only now, with the outcome committed: until then an agent that
        # reconnects (or a restarted master) hears them again, so a recorded failure is
        # never mistaken for lost ranks.
        for agent_id in gang.exits:
            self._send(session, agent_id, _exit_ack(gang.allocation_id))
        self.wake_scheduler()

    async def _declare_lost(self) -> None:
        now = time.monotonic()
        window = self.link.lost_after_s
        for connection in list(self.connections.values()):
            if now - connection.last_heartbeat > window:
                log.warning(
                    "agent %s sent no heartbeat for %.1fs; closing its stream",
                    connection.agent_id,
                    now - connection.last_heartbeat,
                )
                self.close(connection)
        lost = [(a, since) for a, since in self.absent_since.items() if now - since > window]
        for agent_id, silent_since in lost:
            async with self._transaction() as session:
                held = await _held_on_agent(session, agent_id)
                for allocation_id in held:
                    await self._fail_gang(
                        session,
                        allocation_id,
                        ReleaseOutcome.AGENT_LOST,
                        f"agent {agent_id} lost (no heartbeat for {window:.0f}s)",
                        gone_from=agent_id,
                        lost_silent_since=silent_since,
                    )
                if await session.get(AgentModel, agent_id) is not None:
                    await agent_service.set_connected(session, agent_id, False)
            self.absent_since.pop(agent_id, None)
            log.warning("agent %s lost; its %d allocations end", agent_id, len(held))

    async def _gang_from_db(
        self,
        session: AsyncSession,
        allocation_id: str,
        state: AllocationState = AllocationState.ASSIGNED,
    ) -> Gang:
        slots = (
            await session.execute(
                select(AllocationSlotModel.agent_id, AllocationSlotModel.slot_id).where(
                    AllocationSlotModel.allocation_id == allocation_id
                )
            )
        ).all()
        by_agent: dict[str, list[int]] = {}
        for agent_id, slot_id in slots:
            by_agent.setdefault(agent_id, []).append(slot_id)
        if not by_agent:
            zero_agent = await session.scalar(
                select(AllocationModel.zero_slot_agent_id).where(
                    AllocationModel.id == allocation_id
                )
            )
            if zero_agent is not None:
                by_agent[zero_agent] = []
        members = launch.order_gang([launch.GangMember(a, tuple(s)) for a, s in by_agent.items()])
        gang = Gang(allocation_id, members, phase=_PHASE_OF_STATE.get(state, "running"))
        self.gangs[allocation_id] = gang
        return gang


def peer_host(peer: str) -> str:
    """The host of gRPC's peer name: "ipv4:10.0.0.5:4242" -> "10.0.0.5",
    "ipv6:[::1]:4242" -> "::1"; anything else (a unix socket) -> ""."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv4":
        return rest.rpartition(":")[0]
    if kind == "ipv6":
        return rest.rpartition(":")[0].strip("[]").replace("%25", "%")
    return ""


def _exit_code(gang: Gang) -> int | None:
    """The first nonzero exit code of the gang's processes, else 0; None if none exited
    (a lost agent, a start that never happened)."""
    codes = [e.exit_code for exited in gang.exits.values() for e in exited.exits]
    if not codes:
        return None
    return next((c for c in codes if c != 0), 0)


def _reading(sample: pb.MetricSample) -> metric_service.MetricReading:
    return metric_service.MetricReading(
        unix_millis=sample.unix_millis,
        cpu_util_simple=sample.cpu_util_simple,
        memory_free=sample.memory_free,
        memory_used=sample.memory_used,
        disk_throughput_read=sample.disk_throughput_read,
        disk_throughput_write=sample.disk_throughput_write,
        disk_iops=sample.disk_iops,
        net_throughput_sent=sample.net_throughput_sent,
        net_throughput_recv=sample.net_throughput_recv,
        gpus=tuple(
            metric_service.GpuReading(
                index=g.index,
                uuid=g.uuid,
                gpu_util=g.gpu_util,
                gpu_memory_used=g.gpu_memory_used,
                gpu_free_memory=g.gpu_free_memory,
                temperature_c=g.temperature_c,
                power_w=g.power_w,
            )
            for g in sample.gpus
        ),
    )


async def _still(
    session: AsyncSession, allocation_id: str, *states: AllocationState
) -> AllocationModel | None:
    """Lock out kill, pause and scheduling passes (the scheduler's row lock, without waking
    the scheduler), then read the allocation afresh: it, if it is still in one of `states`
    with no stop asked, else None. A kill committed after an earlier read must not be
    overwritten by a launch."""
    await allocations.hold_scheduler_for_pass(session)
    allocation = await session.get(AllocationModel, allocation_id, populate_existing=True)
    if allocation is None or allocation.state not in states or allocation.preempt_requested:
        return None
    return allocation


async def _held_on_agent(
    session: AsyncSession, agent_id: str
) -> dict[str, tuple[AllocationState, bool]]:
    """Allocations holding this agent: their state and whether a stop is wanted."""
    on_slots = select(AllocationSlotModel.allocation_id).where(
        AllocationSlotModel.agent_id == agent_id
    )
    rows = await session.execute(
        select(AllocationModel.id, AllocationModel.state, AllocationModel.preempt_requested).where(
            or_(AllocationModel.id.in_(on_slots), AllocationModel.zero_slot_agent_id == agent_id),
            AllocationModel.state.in_(HELD_STATES),
        )
    )
    return {
        allocation_id: (
            AllocationState(state),
            bool(preempt) or state == AllocationState.TERMINATING,
        )
        for allocation_id, state, preempt in rows.all()
    }


async def _agents_holding_allocations(session: AsyncSession) -> set[str]:
    held = select(AllocationModel.id).where(AllocationModel.state.in_(HELD_STATES))
    on_slots = await session.scalars(
        select(AllocationSlotModel.agent_id).where(AllocationSlotModel.allocation_id.in_(held))
    )
    zero = await session.scalars(
        select(AllocationModel.zero_slot_agent_id).where(
            AllocationModel.state.in_(HELD_STATES), AllocationModel.zero_slot_agent_id.is_not(None)
        )
    )
    return {a for a in on_slots.all()} | {a for a in zero.all() if a is not None}


async def _device_type(session: AsyncSession, gang: Gang) -> str:
    for member in gang.members:
        if member.slot_ids:
            device_type = await session.scalar(
                select(SlotModel.device_type).where(
                    SlotModel.agent_id == member.agent_id,
                    SlotModel.slot_id == member.slot_ids[0],
                )
            )
            return device_type or "cpu"
    return "cpu"


class HubLoop(Loop):
    """Drives `AgentHub.tick`: launches, stop requests, lost agents."""

    name = "agent-hub"

    def __init__(self, hub: AgentHub, interval: float = 0.25) -> None:
        super().__init__(interval)
        self.hub = hub

    async def run_once(self) -> None:
        await self.hub.tick()


def read_or_create_join_token(settings: MasterSettings) -> str:
    """The configured token, or one generated once and kept in the data dir (mode 0600)."""
    if settings.agent_link.join_token:
        return settings.agent_link.join_token
    path = settings.data_dir / "agent_join_token"
    try:
        token = path.read_text().strip()
        if token:
            return token
    except FileNotFoundError:
        pass
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    token = new_token()
    path.touch(mode=0o600)
    path.write_text(token + "\n")
    log.info("generated the agent join token in %s", path)
    return token
