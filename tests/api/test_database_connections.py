"""A PostgreSQL connection notices a silently dead link in seconds: TCP keepalives and a
user timeout on every pooled connection's socket (asyncpg has no settings for them)."""

from __future__ import annotations

import socket

import pytest

from master.db.session import (
    KEEPALIVE_COUNT,
    KEEPALIVE_IDLE_S,
    KEEPALIVE_INTERVAL_S,
    TCP_USER_TIMEOUT_MS,
    create_engine,
)
from tests.conftest import PostgresServer

pytestmark = pytest.mark.postgres


async def test_postgres_connections_carry_keepalives_and_a_user_timeout(
    postgres: PostgresServer,
) -> None:
    url = postgres.new_database().replace("postgresql://", "postgresql+asyncpg://", 1)
    engine = create_engine(url)
    try:
        async with engine.connect() as connection:
            raw = await connection.get_raw_connection()
            sock = raw.driver_connection._transport.get_extra_info("socket")  # type: ignore[union-attr]
            tcp = socket.IPPROTO_TCP
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
            assert sock.getsockopt(tcp, socket.TCP_KEEPIDLE) == KEEPALIVE_IDLE_S
            assert sock.getsockopt(tcp, socket.TCP_KEEPINTVL) == KEEPALIVE_INTERVAL_S
            assert sock.getsockopt(tcp, socket.TCP_KEEPCNT) == KEEPALIVE_COUNT
            assert sock.getsockopt(tcp, socket.TCP_USER_TIMEOUT) == TCP_USER_TIMEOUT_MS
    finally:
        await engine.dispose()
