"""The agent gRPC server (grpc.aio) beside the HTTP API: one Connect stream per agent."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc

from master.db.session import is_outage
from master.services.agent_enrolment import Refusal
from master.services.agent_link import AgentHub, StateMessageFailed
from master.settings import AgentLinkSettings
from resolute_proto.agent.v1 import agent_pb2 as pb
from resolute_proto.agent.v1 import agent_pb2_grpc

log = logging.getLogger(__name__)

HELLO_TIMEOUT_S = 10.0


def channel_options(settings: AgentLinkSettings) -> list[tuple[str, Any]]:
    size = settings.max_message_mb * 2**20
    return [
        ("grpc.max_send_message_length", size),
        ("grpc.max_receive_message_length", size),
        # Pings every two minutes: well under idle-connection reapers, far below the
        # two-hour default (STYLE.md 18). Agents ping at the same rate.
        ("grpc.keepalive_time_ms", 120_000),
        ("grpc.keepalive_timeout_ms", 20_000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_recv_ping_interval_without_data_ms", 60_000),
        ("grpc.http2.max_pings_without_data", 0),
    ]


class AgentService(agent_pb2_grpc.AgentServiceServicer):
    def __init__(self, hub: AgentHub) -> None:
        self.hub = hub

    async def Connect(
        self, request_iterator: AsyncIterator[pb.AgentMessage], context: Any
    ) -> AsyncIterator[pb.MasterMessage]:
        try:
            first = await asyncio.wait_for(anext(request_iterator), HELLO_TIMEOUT_S)
        except (TimeoutError, StopAsyncIteration):
            return
        if first.WhichOneof("body") != "hello":
            yield pb.MasterMessage(refused=pb.Refused(reason="the first message must be Hello"))
            return
        hello = first.hello
        try:
            connection, welcome = await self.hub.open(hello, context.peer())
        except Refusal as exc:
            log.warning("agent %r refused: %s (peer %s)", hello.agent_id, exc, context.peer())
            yield pb.MasterMessage(refused=pb.Refused(reason=str(exc)))
            return
        except Exception as exc:
            if not is_outage(exc):
                raise
            # Not a refusal (that would stop the agent): it retries once we can register it.
            self.hub.health.failed(exc)
            await context.abort(
                grpc.StatusCode.UNAVAILABLE, "the master's database is unreachable; retry"
            )
            return
        yield pb.MasterMessage(welcome=welcome)

        async def read() -> None:
            try:
                async for message in request_iterator:
                    try:
                        await self.hub.on_message(connection, message)
                    except StateMessageFailed:
                        # The agent resyncs on a new stream and repeats what it reported.
                        log.exception("agent %s: closing its stream", connection.agent_id)
                        break
                    except Exception:
                        log.exception(
                            "agent %s: handling %s failed",
                            connection.agent_id,
                            message.WhichOneof("body"),
                        )
            except (asyncio.CancelledError, grpc.aio.AioRpcError):
                pass
            except Exception:
                log.exception("agent %s: stream reader failed", connection.agent_id)
            finally:
                self.hub.close(connection)

        reader = asyncio.create_task(read(), name=f"agent-{connection.agent_id}-reader")
        try:
            while True:
                message = await connection.outbox.get()
                if message is None:
                    break
                yield message
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
            self.hub.close(connection)


async def start_server(hub: AgentHub, settings: AgentLinkSettings) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server(options=channel_options(settings))
    agent_pb2_grpc.add_AgentServiceServicer_to_server(AgentService(hub), server)  # type: ignore[no-untyped-call]
    address = f"{settings.host}:{settings.port}"
    tls = hub.settings.security.tls
    if tls.cert_file is not None and tls.key_file is not None:
        # The same pair as the HTTP API (checked readable and matching by the settings).
        # Agents verify it against their CA file before they send the join token.
        credentials = grpc.ssl_server_credentials(
            [(tls.key_file.read_bytes(), tls.cert_file.read_bytes())]
        )
        port = server.add_secure_port(address, credentials)
    else:
        port = server.add_insecure_port(address)
    if port == 0:
        raise RuntimeError(f"cannot listen for agents on {address}")
    await server.start()
    log.info(
        "agent gRPC server on %s:%d (%s)", settings.host, port, "TLS" if tls.enabled else "plain"
    )
    return server, port
