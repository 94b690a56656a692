"""The agent's side of the link: one Connect stream to the master, rebuilt after any break.

Every connection starts with a Hello that carries the agent's whole state (devices,
interfaces, running allocations, unacknowledged exits), so a reconnect to the same or a
restarted master is a resync. Heartbeats carry the metric samples taken since the last
one; rank output goes in log batches. While the master is unreachable, ranks keep running,
logs queue up (bounded) and exits wait for their acknowledgement.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import socket
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

import grpc

from agent import credential, ports
from agent.fence import FenceProcess
from agent.runner import Runner
from agent.sampler import SystemSampler
from agent.settings import AgentSettings
from resolute.version import __version__
from resolute_proto.agent.v1 import agent_pb2 as pb
from resolute_proto.agent.v1 import agent_pb2_grpc

log = logging.getLogger(__name__)

LOG_BATCH_LINES = 500
LOG_FLUSH_S = 0.2
MAX_QUEUED_LOG_LINES = 100_000
MAX_QUEUED_SAMPLES = 600
# Until a master says otherwise (Welcome): its defaults for lost_after_s = 10 s.
DEFAULT_FENCE_AFTER_S = 6.0
DEFAULT_FENCE_KILL_AFTER_S = 2.0


class Refused(Exception):
    """The master will not take this agent (wrong token, wrong pool...)."""


class Agent:
    def __init__(
        self,
        settings: AgentSettings,
        devices: list[pb.Device],
        interfaces: list[pb.NetworkInterface],
        sampler: SystemSampler,
    ) -> None:
        self.settings = settings
        self.devices = devices
        self.interfaces = interfaces
        self.sampler = sampler
        self.fence = FenceProcess()
        self.runner = Runner(
            settings.id, settings.work_dir, devices, self._emit, self._log, self.fence
        )
        self.runner.port_pool = ports.candidates(
            ports.parse_port_range(settings.port_range), ports.ephemeral_range()
        )
        self._outbox: asyncio.Queue[pb.AgentMessage | None] | None = None
        self._logs: deque[pb.LogEntry] = deque(maxlen=MAX_QUEUED_LOG_LINES)
        self._samples: deque[pb.MetricSample] = deque(maxlen=MAX_QUEUED_SAMPLES)
        self._heartbeat_s = 1.0
        self._metrics_period_s = 1.0
        self._seq = 0
        self._sent_at: dict[int, float] = {}  # heartbeat seq -> time.monotonic() sent
        self._round_trip_micros = 0
        self._fence_after_s = DEFAULT_FENCE_AFTER_S
        self._fence_kill_after_s = DEFAULT_FENCE_KILL_AFTER_S
        self.instance_id = uuid.uuid4().hex
        # Several masters (a leader and standbys): tried in turn until one welcomes us.
        self.addresses = [a.strip() for a in settings.master.split(",") if a.strip()]
        self._address = 0

    # -- public ------------------------------------------------------------------------------

    @property
    def master(self) -> str:
        """The master address this agent tries or talks to now."""
        return self.addresses[self._address]

    async def run(self) -> None:
        """Serve until cancelled; raises Refused if the master turns the agent away.

        A stream that falls silent is kept while a new one is tried: after a link is down
        for a second or two, TCP's retransmission backoff takes as long again to get the
        old stream going, and a new stream's handshake must get through the same gaps. So
        whichever is heard first serves: acknowledgements on the silent stream still renew
        the ranks' lease, and a welcome on the new one ends the old."""
        sampling = asyncio.create_task(self._sample_forever(), name="sampler")
        probing = asyncio.create_task(self._probe_while_away(), name="probe")
        silent_stream: asyncio.Task[None] | None = None
        session: asyncio.Task[None] | None = None
        heard_nothing: asyncio.Task[Any] | None = None
        attempt = 0
        try:
            while True:
                started = time.monotonic()
                silent = asyncio.Event()
                session = asyncio.create_task(self._session(silent, silent_stream), name="stream")
                heard_nothing = asyncio.create_task(silent.wait())
                await asyncio.wait([session, heard_nothing], return_when=asyncio.FIRST_COMPLETED)
                heard_nothing.cancel()
                if not session.done():
                    log.warning(
                        "link to master %s silent for %.0fs; trying a new stream beside it",
                        self.master,
                        self._silence_limit(),
                    )
                    if silent_stream is not None:
                        silent_stream.cancel()  # one kept at a time: the latest
                    silent_stream = session
                    session.add_done_callback(_ended)
                    self._address = (self._address + 1) % len(self.addresses)
                else:
                    try:
                        session.result()
                    except Refused:
                        raise
                    except (grpc.aio.AioRpcError, ConnectionError, TimeoutError) as exc:
                        log.warning("link to master %s broken: %s", self.master, _short(exc))
                        self._address = (self._address + 1) % len(self.addresses)
                    if silent_stream is not None and silent_stream.done():
                        silent_stream = None
                attempt = 0 if time.monotonic() - started > 10 else attempt + 1
                delay = min(self.settings.reconnect_max_backoff_s, 0.25 * 2**attempt)
                if self.runner.runs:
                    # The ranks' lease needs acknowledgements: a master that is back must
                    # be reached well within the fence window, whatever the backoff says.
                    delay = min(delay, 0.5)
                await asyncio.sleep(delay * random.uniform(0.8, 1.2))
        finally:
            # Cancelled (the agent stops) or refused: every stream goes, the one being
            # tried included, before the caller closes the fence.
            for task in (sampling, probing, silent_stream, session, heard_nothing):
                if task is None or (task is session and task.done()):  # the loop saw its end
                    continue
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    pass
                except Exception as exc:  # a stream's end was logged where it ended
                    log.warning("%s had ended with %s", task.get_name(), _short(exc))

    def _silence_limit(self) -> float:
        # Half the fence window: enough for a new stream (a resync, perhaps to a standby that
        # took over) to be welcomed before the lease runs out.
        return max(self._fence_after_s / 2, 3 * self._heartbeat_s)

    # -- one connection ---------------------------------------------------------------------

    async def _session(
        self, silent: asyncio.Event, replaces: asyncio.Task[None] | None = None
    ) -> None:
        """One stream, from Hello to its end. `silent` is set once nothing has come from
        the master for the silence limit (the stream goes on); once welcomed, this stream
        ends `replaces`, the silent one it was opened beside."""
        size = self.settings.max_message_mb * 2**20
        options = [
            ("grpc.max_send_message_length", size),
            ("grpc.max_receive_message_length", size),
            ("grpc.keepalive_time_ms", 120_000),
            ("grpc.keepalive_timeout_ms", 20_000),
            ("grpc.keepalive_permit_without_calls", 1),
            # A channel of its own per session, with a short connect backoff: gRPC's shared
            # subchannels keep their backoff across channels, and a master that is back
            # must be reached within the fence window, not minutes later.
            ("grpc.use_local_subchannel_pool", 1),
            ("grpc.initial_reconnect_backoff_ms", 250),
            ("grpc.min_reconnect_backoff_ms", 250),
            ("grpc.max_reconnect_backoff_ms", 1000),
        ]
        async with _open_channel(self.settings, self.master, options) as channel:
            stub = agent_pb2_grpc.AgentServiceStub(channel)  # type: ignore[no-untyped-call]
            outbox: asyncio.Queue[pb.AgentMessage | None] = asyncio.Queue()
            outbox.put_nowait(pb.AgentMessage(hello=self._hello()))
            hello_sent = time.monotonic()
            call = stub.Connect(_drain(outbox))
            # A frozen master's kernel still accepts the connection: while ranks depend on
            # an answer, try the next master soon.
            first = await asyncio.wait_for(call.read(), timeout=5 if self.runner.runs else 30)
            if first is grpc.aio.EOF:  # not a refusal: the master may be restarting
                call.cancel()
                raise ConnectionError("the master closed the stream before welcoming us")
            if first.WhichOneof("body") != "welcome":
                call.cancel()
                raise Refused(first.refused.reason or "no welcome from the master")
            welcome = first.welcome
            if welcome.agent_secret:
                # Enrolled: from now on this id is admitted with this secret only.
                credential.save(self.settings.credential_path, welcome.agent_secret)
                log.info("enrolled; credential kept in %s", self.settings.credential_path)
            self._heartbeat_s = welcome.heartbeat_interval_s or 1.0
            self._metrics_period_s = welcome.metrics_period_s or 1.0
            self._fence_after_s = welcome.fence_after_s or DEFAULT_FENCE_AFTER_S
            self._fence_kill_after_s = welcome.fence_kill_after_s or DEFAULT_FENCE_KILL_AFTER_S
            self._renew_lease(hello_sent)  # the welcome answers the hello
            if replaces is not None:
                replaces.cancel()
            self._outbox = outbox
            heard = [time.monotonic()]  # when this stream last brought word from the master
            log.info(
                "connected to master %s (stream %s) as %s with %d slots",
                self.master,
                welcome.stream_id,
                self.settings.id,
                len(self.devices),
            )
            # What the ranks wrote while we were away goes before their exits, so a trial
            # the master ends on one of them already has its last log lines.
            self._flush_logs()
            for exited in list(self.runner.unacked.values()):
                outbox.put_nowait(pb.AgentMessage(exited=exited))
            for allocation_id in welcome.stop_allocation_ids:
                self.runner.spawn_task(
                    self.runner.stop(allocation_id, "stopped by the master after a reconnect", 10.0)
                )
            tasks = [
                asyncio.create_task(self._heartbeats(outbox, heard, silent), name="heartbeats"),
                asyncio.create_task(self._ship_logs(), name="logs"),
                asyncio.create_task(self._read(call, heard, outbox), name="read"),
            ]
            try:
                # Whichever ends first (the master's silence, a broken stream) ends the session.
                done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
                for task in done:
                    task.result()
            finally:
                if self._outbox is outbox:
                    self._outbox = None
                outbox.put_nowait(None)
                for task in tasks:
                    task.cancel()
                for task in tasks:
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
                call.cancel()

    async def _read(
        self, call: Any, heard: list[float], outbox: asyncio.Queue[pb.AgentMessage | None]
    ) -> None:
        while True:
            message = await call.read()
            if message is grpc.aio.EOF:
                raise ConnectionError("the master closed the stream")
            heard[0] = time.monotonic()
            await self._handle(message, outbox)

    def _hello(self) -> pb.Hello:
        return pb.Hello(
            agent_id=self.settings.id,
            resource_pool=self.settings.resource_pool,
            version=__version__,
            hostname=socket.gethostname(),
            join_token=self.settings.join_token,
            agent_secret=credential.load(self.settings.credential_path),
            devices=self.devices,
            interfaces=self.interfaces,
            running=self.runner.running(),
            exited=list(self.runner.unacked.values()),
            instance_id=self.instance_id,
            container_runtime=self.runner.runtime.kind if self.runner.runtime else "",
        )

    async def _handle(
        self, message: pb.MasterMessage, outbox: asyncio.Queue[pb.AgentMessage | None]
    ) -> None:
        """One message from the master, read from the stream whose queue is `outbox`."""
        kind = message.WhichOneof("body")
        if kind == "heartbeat_ack":
            sent = self._sent_at.pop(message.heartbeat_ack.seq, None)
            if sent is not None:
                self._round_trip_micros = int((time.monotonic() - sent) * 1e6)
                self._renew_lease(sent)
            return
        if kind == "prepare":
            prepare = message.prepare
            prepared = self.runner.prepare(prepare.allocation_id, prepare.extra_ports)
            # The answer goes back on the stream that asked, silent or not: the master
            # waits for it there, and no other stream carries it later.
            outbox.put_nowait(pb.AgentMessage(prepared=prepared))
        elif kind == "start":
            self.runner.spawn_task(self.runner.start(message.start))
        elif kind == "stop":
            stop = message.stop
            self.runner.spawn_task(self.runner.stop(stop.allocation_id, stop.reason, stop.grace_s))
        elif kind == "exit_ack":
            self.runner.ack(message.exit_ack.allocation_id)
        elif kind == "refused":
            raise Refused(message.refused.reason)
        else:
            log.warning("unexpected %s message from the master", kind)

    # -- outgoing ------------------------------------------------------------------------------

    def _emit(self, message: pb.AgentMessage) -> None:
        """Send now if connected; exits are kept by the runner until acked anyway.

        An exit goes after every log line queued before it, so a follower of the trial's
        logs, which stops when the trial ends, has seen the last lines."""
        if self._outbox is None:
            return
        if message.WhichOneof("body") == "exited":
            self._flush_logs()
        self._outbox.put_nowait(message)

    def _flush_logs(self) -> None:
        while self._logs and self._outbox is not None:
            batch = [self._logs.popleft() for _ in range(min(LOG_BATCH_LINES, len(self._logs)))]
            self._outbox.put_nowait(pb.AgentMessage(logs=pb.LogBatch(entries=batch)))

    async def drained(self) -> None:
        """Returns once the master has acknowledged every exit."""
        await self.runner.all_acked.wait()

    def _log(self, entry: pb.LogEntry) -> None:
        self._logs.append(entry)

    async def _heartbeats(
        self,
        outbox: asyncio.Queue[pb.AgentMessage | None],
        heard: list[float],
        silent: asyncio.Event,
    ) -> None:
        """A heartbeat a period on this stream, silent or not: its acknowledgement renews
        the lease whichever stream carries it. Once the stream is silent, logs and exits
        wait for the stream that replaces it instead of going into this one."""
        while True:
            await asyncio.sleep(self._heartbeat_s)
            if not silent.is_set() and time.monotonic() - heard[0] > self._silence_limit():
                if self._outbox is outbox:
                    self._outbox = None
                silent.set()
            self._seq += 1
            now = time.monotonic()
            self._sent_at[self._seq] = now
            for seq in [s for s, at in self._sent_at.items() if now - at > 60]:
                del self._sent_at[seq]  # never acknowledged: no lease comes of it
            samples = list(self._samples)
            self._samples.clear()
            outbox.put_nowait(
                pb.AgentMessage(
                    heartbeat=pb.Heartbeat(
                        seq=self._seq,
                        sent_unix_nanos=time.time_ns(),
                        samples=samples,
                        last_round_trip_micros=self._round_trip_micros,
                    )
                )
            )

    def _renew_lease(self, sent_at: float) -> None:
        """The master answered a message sent at `sent_at`, so it had heard from us by then
        and cannot declare us lost before sent_at + lost_after_s: the ranks may run until
        sent_at + fence_after_s, which leaves the fence its kill delay and a margin."""
        self.fence.renew(sent_at + self._fence_after_s, self._fence_kill_after_s)

    async def _probe_while_away(self) -> None:
        """While no master answers and ranks run, find out whether a master runs at all.

        A connection refused at the master's address (nothing listens there) shows that no
        master process runs, and none can declare us lost: a master that starts counts
        lost_after_s from its start, after the refusal. Then the ranks keep running, so a
        master restart costs no trial a restart. A timeout or an unreachable network shows
        nothing, and the lease runs out."""
        while True:
            await asyncio.sleep(min(1.0, self._fence_after_s / 6))
            acknowledged_lately = time.monotonic() < self.fence.deadline - self._fence_after_s / 2
            if acknowledged_lately or not self.runner.runs:
                continue
            sent = time.monotonic()
            # Every master refusing: none runs. A standby does not listen for agents.
            refusals = await asyncio.gather(
                *(asyncio.to_thread(_refused, address) for address in self.addresses)
            )
            if all(refusals):
                self._renew_lease(sent)

    async def _ship_logs(self) -> None:
        while True:
            await asyncio.sleep(LOG_FLUSH_S)
            self._flush_logs()

    async def _sample_forever(self) -> None:
        while True:
            try:
                self._samples.append(await asyncio.to_thread(self.sampler.sample))
            except Exception:
                log.exception("sampling system metrics failed")
            await asyncio.sleep(self._metrics_period_s)


async def _drain(outbox: asyncio.Queue[pb.AgentMessage | None]) -> AsyncIterator[pb.AgentMessage]:
    while True:
        message = await outbox.get()
        if message is None:
            return
        yield message


def _refused(address: str, timeout: float = 1.0) -> bool:
    """Whether a TCP connection to host:port is refused outright (nothing listens there)."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            return False
    except ConnectionRefusedError:
        return True
    except (OSError, ValueError):
        return False


def _ended(task: asyncio.Task[None]) -> None:
    """A silent stream kept beside its replacement ended: say how, once."""
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None:
        log.info("the silent stream ended: %s", _short(exc))


def _short(exc: BaseException) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {exc.details()}"
    return str(exc) or type(exc).__name__


@contextlib.asynccontextmanager
async def _open_channel(
    settings: AgentSettings, address: str, options: list[tuple[str, Any]]
) -> AsyncIterator[grpc.aio.Channel]:
    """A plain channel, or with master_cert_file a TLS one that verifies the master before
    a byte of the Hello (the join token) is sent. A master that fails verification reads
    as one ConnectionError line, and the agent retries as for an unreachable master."""
    if settings.master_cert_file is None:
        async with grpc.aio.insecure_channel(address, options=options) as channel:
            yield channel
        return
    try:
        # Read at each connection: a CA file replaced on disk is used from the next one.
        roots = settings.master_cert_file.read_bytes()
    except OSError as exc:
        raise ConnectionError(
            f"cannot read master_cert_file {settings.master_cert_file}: {exc.strerror}"
        ) from None
    if settings.master_cert_name:
        options = [*options, ("grpc.ssl_target_name_override", settings.master_cert_name)]
    credentials = grpc.ssl_channel_credentials(root_certificates=roots)
    async with grpc.aio.secure_channel(address, credentials, options=options) as channel:
        try:
            yield channel
        except grpc.aio.AioRpcError as exc:
            problem = _tls_problem(exc, settings, address)
            if problem is None:
                raise
            raise ConnectionError(problem) from None


def _tls_problem(exc: grpc.aio.AioRpcError, settings: AgentSettings, address: str) -> str | None:
    """One line if the call failed in the TLS handshake (gRPC reports it as UNAVAILABLE)."""
    details = exc.details() or ""
    if exc.code() != grpc.StatusCode.UNAVAILABLE:
        return None
    if "CERTIFICATE_VERIFY_FAILED" in details:
        reason = details.split("CERTIFICATE_VERIFY_FAILED:", 1)[1].removesuffix(": OK").strip()
        return (
            f"the master's certificate did not verify against master_cert_file="
            f"{settings.master_cert_file}: {reason}"
        )
    if "Hostname Verification Check failed" in details:
        name = settings.master_cert_name or address.rpartition(":")[0].strip("[]")
        return (
            f"the master's certificate is not valid for the name {name!r}; set "
            "master_cert_name to a name it holds"
        )
    if "WRONG_VERSION_NUMBER" in details:
        return (
            f"the master at {address} does not speak TLS on its agent port; drop "
            "master_cert_file or give the master security.tls"
        )
    if "andshake" in details:
        return f"TLS handshake with the master failed: {details}"
    return None
