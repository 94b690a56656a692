"""Who may join: the join token, each agent's own credential, and revocation.

An enrolled agent id admits only its own secret; an id not seen before is enrolled with the
join token and gets a secret of its own. So one node holding the join token cannot pass for
another enrolled node, a revoked id stays out, and the join token can be rotated without
touching the enrolled agents.
"""

from __future__ import annotations

import hashlib
import logging
import secrets

from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncSession

from master.core.credentials import new_token
from master.db.models import AgentModel
from master.settings import MasterSettings
from resolute_proto.agent.v1 import agent_pb2 as pb

log = logging.getLogger(__name__)


class Refusal(Exception):
    """The agent may not join; the reason is sent to it before the stream closes."""


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


async def authenticate(session: AsyncSession, hello: pb.Hello, join_token: str) -> str | None:
    """Check the Hello's credential against the agent's row (read afresh); a new secret to
    send in the Welcome when the agent is enrolled now, else None. Until the agent has shown
    its secret back once, the join token still enrolls it afresh: a Welcome lost on the way
    must not lock the id out. Raises Refusal."""
    agent = await session.get(AgentModel, hello.agent_id, populate_existing=True)
    if agent is not None and agent.revoked_at is not None:
        raise Refusal(
            f"agent id {hello.agent_id!r} was revoked (det agent revoke); "
            "start this node under a new --id"
        )
    if agent is not None and agent.credential_hash is not None:
        if hello.agent_secret and secrets.compare_digest(
            digest(hello.agent_secret), agent.credential_hash
        ):
            agent.credential_confirmed = True
            return None
        if agent.credential_confirmed:
            raise Refusal(
                f"the credential does not match agent id {hello.agent_id!r}: that id is "
                "enrolled and admits only its own secret (its agent-credential file)"
            )
    if not secrets.compare_digest(hello.join_token.encode(), join_token.encode()):
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


def enroll(agent: AgentModel, secret: str) -> None:
    """Store the hash of the secret sent in the Welcome, unconfirmed until the agent uses it."""
    agent.credential_hash = digest(secret)
    agent.credential_confirmed = False


async def confirm_credential(session: AsyncSession, agent_id: str) -> None:
    """The agent's first heartbeat on the stream it was enrolled on: it has read (and
    stored) its secret, which from now on is the only way in for its id."""
    await session.execute(
        update(AgentModel).where(AgentModel.id == agent_id).values(credential_confirmed=True)
    )


def peer_host(peer: str) -> str:
    """The host of gRPC's peer name: "ipv4:10.0.0.5:4242" -> "10.0.0.5",
    "ipv6:[::1]:4242" -> "::1"; anything else (a unix socket) -> ""."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv4":
        return rest.rpartition(":")[0]
    if kind == "ipv6":
        return rest.rpartition(":")[0].strip("[]").replace("%25", "%")
    return ""


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
