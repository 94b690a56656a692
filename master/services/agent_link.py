"""The master's side of the agent link: connected agents, resync, liveness, launches, exits.

One `AgentHub` per master process. The gRPC servicer (master/grpc_server.py) hands it each
stream's messages; `HubLoop` calls `tick()` a few times a second to launch assigned
allocations, pass on stop requests and declare silent agents lost. Database changes go
through the same services the REST API uses (register_agent, release_allocation, states),
in short transactions; the prepared/started/exited messages of agents that arrive together
share one (group commit: one commit, one epoch bump, for a round of kills' exits).

The hub is the state machine; its neighbours hold the rest of the link: who may join
(agent_enrolment), what a launch sends (agent_launch) and the messages' conversions to and
from the master's types (agent_protos).

Allocation lifecycle on the agents (AllocationModel.state, written only here after the
scheduler's ASSIGNED): ASSIGNED -> PULLING (the chief reserves the rendezvous port) ->
STARTING (every agent was sent its ranks) -> RUNNING (every agent started them) ->
TERMINATED (release_allocation, once every agent reported its ranks gone, or one was lost).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from master.core import launch
from master.db.models import (
    AgentModel,
    AllocationModel,
    AllocationSlotModel,
    AllocationState,
    ExperimentModel,
    TrialModel,
    TrialState,
)
from master.db.session import DatabaseHealth, is_outage, session_scope
from master.errors import InvalidArgument
from master.services import (
    agent_enrolment,
    agent_protos,
    allocations,
    release,
    states,
    trial_reports,
)
from master.services import agents as agent_service
from master.services import logs as log_service
from master.services import metrics as metric_service
from master.services.agent_enrolment import Refusal
from master.services.agent_launch import LaunchAssembler
from master.services.allocations import HELD_STATES, ReleaseOutcome
from master.services.leadership import Leadership
from master.services.loops import Loop
from master.services.preemption import PreemptionSignals
from master.services.prometheus import ROUND_TRIP_BUCKETS_S, Histogram
from master.settings import MasterSettings
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


# The most agent messages handled in one transaction.
MAX_STATE_BATCH = 64


@dataclass
class StateMessage:
    """A prepared/started/exited message waiting for its batch; `done` when committed."""

    connection: Connection
    message: pb.AgentMessage
    done: asyncio.Future[None]


def _allocation_of(message: pb.AgentMessage) -> str:
    body = getattr(message, message.WhichOneof("body") or "")
    return str(body.allocation_id)


def _fail(waiting: StateMessage, error: Exception) -> None:
    """An outage as it is (the caller keeps the message for later); anything else ends the
    stream, so the agent resyncs and repeats what it reported."""
    if waiting.done.done():
        return
    if not is_outage(error):
        kind = waiting.message.WhichOneof("body")
        failure = StateMessageFailed(f"{kind} for {_allocation_of(waiting.message)}")
        failure.__cause__ = error
        error = failure
    waiting.done.set_exception(error)


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
        # When this master last heard from each agent (any message; heartbeats come every
        # second): the dashboard's "seen", which the database updates only on (re)connect.
        self.last_heard: dict[str, datetime] = {}
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
        # Prepared/started/exited messages of several agents are handled in one transaction
        # (group commit, issue 27): those that arrive while a batch is being handled wait
        # and go together in the next one. `_batch_session`: the batch being handled.
        self._state_waiting: list[StateMessage] = []
        self._state_worker: asyncio.Task[None] | None = None
        self._batch_session: AsyncSession | None = None
        self.state_transactions = 0  # committed batches, and the messages in them
        self.state_messages = 0
        self.launches = LaunchAssembler(settings, cluster_id=cluster_id, master_id=master_id)

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

    @contextlib.asynccontextmanager
    async def _state_transaction(self) -> AsyncIterator[AsyncSession]:
        """The transaction of a prepared/started/exited message: the batch's, when the
        message is handled in one (its sends go out once the batch commits)."""
        if self._batch_session is not None:
            yield self._batch_session
            return
        async with self._transaction() as session:
            yield session

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
        registration = agent_protos.registration_of(hello, self.settings.default_compute_pool)
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
        connection.peer_host = agent_enrolment.peer_host(peer)
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
                issued = await agent_enrolment.authenticate(session, hello, self.join_token)
                agent = await agent_service.register_agent(session, self.settings, registration)
                if issued:
                    agent_enrolment.enroll(agent, issued)
                agent.interfaces = agent_protos.interfaces_of(hello)
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
            "agent %s connected (stream %s, %d slots, running %d, exited %d, images: %s)",
            hello.agent_id,
            connection.stream_id,
            len(hello.devices),
            len(hello.running),
            len(hello.exited),
            hello.container_runtime or "none, processes on the host",
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

    async def _confirm_credential(self, connection: Connection) -> None:
        try:
            async with self._transaction() as session:
                await agent_enrolment.confirm_credential(session, connection.agent_id)
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
        self.last_heard[connection.agent_id] = datetime.now(UTC)
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
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._state_waiting.append(StateMessage(connection, message, done))
        if self._state_worker is None or self._state_worker.done():
            self._state_worker = asyncio.create_task(
                self._handle_state_messages(), name="hub-state-messages"
            )
        await done

    async def _handle_state_messages(self) -> None:
        batch: list[StateMessage] = []
        try:
            while self._state_waiting:
                batch = self._state_waiting[:MAX_STATE_BATCH]
                del self._state_waiting[:MAX_STATE_BATCH]
                # A stream that closed before its message's batch began: the agent repeats
                # the message on its next stream (nothing of it was acknowledged).
                batch = [m for m in batch if not m.done.cancelled()]
                if batch:
                    await self._handle_batch(batch)
        except BaseException:  # cancelled at shutdown: nobody may wait forever
            for waiting in batch + self._state_waiting:
                if not waiting.done.done():
                    waiting.done.set_exception(StateMessageFailed("the master is stopping"))
            self._state_waiting.clear()
            raise

    async def _handle_batch(self, batch: list[StateMessage]) -> None:
        """The messages in one transaction, in order; if it fails for a reason other than
        an outage, each again alone, so one bad message fails only its own stream."""
        async with self._lock:
            try:
                async with self._transaction() as session:
                    self._batch_session = session
                    try:
                        for one in batch:
                            await self._dispatch(one.connection, one.message)
                    finally:
                        self._batch_session = None
            except Exception as exc:
                for one in batch:
                    # What memory held of these gangs may be ahead of the database now.
                    self.gangs.pop(_allocation_of(one.message), None)
                if len(batch) > 1 and not is_outage(exc):
                    log.info("a batch of %d agent messages failed; each again alone", len(batch))
                else:
                    for one in batch:
                        _fail(one, exc)
                    return
            else:
                self.state_transactions += 1
                self.state_messages += len(batch)
                for one in batch:
                    if not one.done.done():
                        one.done.set_result(None)
                return
        for one in batch:
            await self._handle_batch([one])

    async def _dispatch(self, connection: Connection, message: pb.AgentMessage) -> None:
        kind = message.WhichOneof("body")
        body = getattr(message, kind)
        if kind == "prepared":
            await self.on_prepared(connection, body)
        elif kind == "started":
            await self.on_started(connection, body)
        else:
            await self.on_exited(connection, body)

    def on_heartbeat(self, connection: Connection, heartbeat: pb.Heartbeat) -> None:
        connection.last_heartbeat = time.monotonic()
        if connection.unconfirmed_credential:
            connection.unconfirmed_credential = False
            self._spawn(self._confirm_credential(connection))
        if self.leadership is not None and not self.leadership.valid():
            return  # no acknowledgement: see Leadership
        if heartbeat.samples:
            readings = [agent_protos.reading_of(s) for s in heartbeat.samples]
            self.metrics.add(connection.agent_id, readings)
            self.latest_reading[connection.agent_id] = readings[-1]
        if heartbeat.last_round_trip_micros:
            seconds = heartbeat.last_round_trip_micros / 1e6
            self.round_trips.observe(seconds)
            self.last_round_trip_s[connection.agent_id] = seconds
        connection.send(agent_protos.heartbeat_ack(heartbeat))

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
        async with self._state_transaction() as session:
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
        async with self._state_transaction() as session:
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
        async with self._state_transaction() as session:
            allocation = await session.get(AllocationModel, allocation_id)
            if allocation is None or allocation.state not in HELD_STATES:
                self.gangs.pop(allocation_id, None)
                self._send(session, agent_id, agent_protos.exit_ack(allocation_id))
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
            elif _stopped_by_its_agent(exited, allocation, gang):
                # The agent stopped ranks nobody asked to stop: it is shutting down. Out of
                # the scheduler's choice in the same commit, or the requeued trial may be
                # placed on it again in the moment before its stream closes, and wait out
                # the lost-agent window there (seen in CI). It rejoins when it reconnects.
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
                if self._waits_for_exits(allocation):
                    continue  # nothing to do until its ranks exit: no savepoint for it
                # One allocation that cannot advance must not hold up the others.
                sends = len(session.info[_SENDS])
                try:
                    async with session.begin_nested():
                        await self._advance(session, allocation)
                except Exception:
                    log.exception("allocation %s: advancing it failed", allocation.id)
                    self.gangs.pop(allocation.id, None)
                    del session.info[_SENDS][sends:]
                    allocations.forget_described_changes(session)

    def _waits_for_exits(self, allocation: AllocationModel) -> bool:
        """Its ranks were started and told to stop: only their exits (or their agent's
        loss) move it on, so a tick has nothing to do for it. After a round of kills every
        tick meets them all until they exit."""
        gang = self.gangs.get(allocation.id)
        return (
            gang is not None
            and gang.stop_sent
            and allocation.master_port is not None
            and gang.phase not in ("assigned", "preparing")
        )

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
        choice = await self.launches.choose_interface(
            session, gang.agent_ids, allocation.resource_pool, experiment
        )
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
        self._send(session, gang.chief, self.launches.prepare(gang.allocation_id, experiment))

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
        self._send(session, gang.chief, self.launches.prepare_task(gang.allocation_id))

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
            try:
                agent_id, message = await self.launches.task_start(
                    session, allocation, gang.members, master_port
                )
            except launch.LaunchError as exc:
                await self._fail_gang(session, gang.allocation_id, ReleaseOutcome.FAILED, str(exc))
                return
            messages = [(agent_id, message)]
        else:
            try:
                found = await self.launches.trial_start(
                    session, allocation, gang.members, gang.addresses, master_port, extra_ports
                )
            except launch.LaunchError as exc:
                await self._fail_gang(session, gang.allocation_id, ReleaseOutcome.FAILED, str(exc))
                return
            if found is None:
                gang.phase = "assigned"  # an answer to an older prepare: ask again
                return
            messages = found
        allocation.master_port = master_port
        allocation.state = AllocationState.STARTING
        gang.phase = "starting"
        for agent_id, message in messages:
            self._send(session, agent_id, message)

    # -- stopping, failing, releasing --------------------------------------------------------

    def _send_stop(self, session: AsyncSession, gang: Gang, reason: str) -> None:
        gang.stop_sent = True
        for agent_id in gang.agent_ids:
            if agent_id not in gang.exits:
                self._send(
                    session,
                    agent_id,
                    agent_protos.stop(gang.allocation_id, reason, self.link.stop_grace_s),
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
            session,
            gang.allocation_id,
            outcome,
            message,
            exit_code=agent_protos.exit_code(list(gang.exits.values())),
        )
        # Exits are acked only now, with the outcome committed: until then an agent that
        # reconnects (or a restarted master) hears them again, so a recorded failure is
        # never mistaken for lost ranks.
        for agent_id in gang.exits:
            self._send(session, agent_id, agent_protos.exit_ack(gang.allocation_id))
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


class HubLoop(Loop):
    """Drives `AgentHub.tick`: launches, stop requests, lost agents."""

    name = "agent-hub"

    def __init__(self, hub: AgentHub, interval: float = 0.25) -> None:
        super().__init__(interval)
        self.hub = hub

    async def run_once(self) -> None:
        await self.hub.tick()


def _stopped_by_its_agent(
    exited: pb.AllocationExited, allocation: AllocationModel, gang: Gang
) -> bool:
    """Ranks stopped though the master asked for no stop, kill or preemption."""
    return (
        exited.kind == pb.EXIT_KIND_STOPPED
        and allocation.state != AllocationState.TERMINATING
        and not allocation.preempt_requested
        and not gang.stop_sent
    )
