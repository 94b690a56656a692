"""Users, password checks and bearer tokens, speaking the login protocol of Determined's client.

The official client never sends a plain password: it sends `sha512_hex(CLIENT_SALT + password)`
(or "" for an empty password) with `isHashed: true`. We store a salted PBKDF2 of that client
hash, so both hashed and plain logins can be checked and the stored value is never the secret.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from datetime import UTC, datetime, timedelta

from sqlalchemy import delete, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from master.core.credentials import client_side_hash
from master.db.models import UserModel, UserSessionModel
from master.errors import InvalidArgument, Unauthenticated
from master.services import counters

log = logging.getLogger(__name__)

PBKDF2_ITERATIONS = 100_000
# session.info key: the id of the user_sessions row the request's token belongs to.
TOKEN_SESSION_ID = "token_session_id"
STALE_RUN = (
    "this token belonged to a run that has ended: a process of an earlier run is still "
    "reporting, and its reports are refused"
)
DEFAULT_USERS = (("admin", True), ("determined", False))


def hash_password(password: str, *, is_hashed: bool = False) -> str:
    client_hash = password if is_hashed else client_side_hash(password)
    salt = secrets.token_bytes(16)
    digest = hashlib.pbkdf2_hmac("sha256", client_hash.encode(), salt, PBKDF2_ITERATIONS)
    return f"pbkdf2_sha256${PBKDF2_ITERATIONS}${salt.hex()}${digest.hex()}"


def password_matches(stored: str, password: str, *, is_hashed: bool) -> bool:
    try:
        scheme, iterations, salt_hex, digest_hex = stored.split("$")
    except ValueError:
        return False
    if scheme != "pbkdf2_sha256":
        return False
    client_hash = password if is_hashed else client_side_hash(password)
    digest = hashlib.pbkdf2_hmac(
        "sha256", client_hash.encode(), bytes.fromhex(salt_hex), int(iterations)
    )
    return hmac.compare_digest(digest.hex(), digest_hex)


def _token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


async def ensure_default_users(session: AsyncSession, initial_password: str) -> None:
    """Create `admin` and `determined` once; never touch them again (they may have changed)."""
    for username, admin in DEFAULT_USERS:
        exists = await session.scalar(select(UserModel.id).where(UserModel.username == username))
        if exists is None:
            session.add(
                UserModel(
                    username=username,
                    admin=admin,
                    password_hash=hash_password(initial_password),
                )
            )
            log.info("created default user %s", username)
    await session.flush()
    if initial_password == "":
        log.warning("default users admin and determined have empty passwords; set one")


async def login(
    session: AsyncSession, username: str, password: str, *, is_hashed: bool, ttl: timedelta
) -> tuple[str, UserModel]:
    """Check the credentials and mint a token. The caller's transaction commits the session row."""
    if not username:
        raise InvalidArgument("username: must not be empty")
    user = await session.scalar(select(UserModel).where(UserModel.username == username))
    # One message for every failure, so a caller cannot probe which usernames exist.
    if user is None or not user.active:
        raise Unauthenticated("invalid credentials")
    if not password_matches(user.password_hash, password, is_hashed=is_hashed):
        raise Unauthenticated("invalid credentials")
    token = secrets.token_urlsafe(32)
    now = datetime.now(UTC)
    session.add(
        UserSessionModel(
            user_id=user.id, token_hash=_token_digest(token), created_at=now, expires_at=now + ttl
        )
    )
    await session.flush()
    log.info("user %s logged in", username)
    return token, user


async def issue_task_token(session: AsyncSession, user_id: int, ttl: timedelta) -> tuple[str, int]:
    """A token for a task's processes to call the API as the experiment's owner, and the
    id of its session row (revoke it with `revoke_session` when the task ends)."""
    token = secrets.token_urlsafe(32)
    now = datetime.now(UTC)
    row = UserSessionModel(
        user_id=user_id, token_hash=_token_digest(token), created_at=now, expires_at=now + ttl
    )
    session.add(row)
    await session.flush()
    return token, row.id


async def revoke_session(session: AsyncSession, session_id: int) -> None:
    """End a task token. The row stays (until it expires) so that a late report with it
    is recognised as a stale run's, not taken for a bad token."""
    await session.execute(
        update(UserSessionModel)
        .where(UserSessionModel.id == session_id, UserSessionModel.revoked_at.is_(None))
        .values(revoked_at=datetime.now(UTC))
    )


async def confirm_token_live(session: AsyncSession, what: str) -> None:
    """Before a report is written: the request's task token is still live, checked in the
    report's own transaction and held until its commit. A no-op write to the token's row
    does it: the release that revokes the token then waits for this commit (Postgres row
    lock; SQLite's one writer), or it has committed first and the write matches no row.
    A person's own login is checked the same way (a logout ends it)."""
    session_id = session.info.get(TOKEN_SESSION_ID)
    if session_id is None:
        return
    live = await session.scalar(
        update(UserSessionModel)
        .where(UserSessionModel.id == session_id, UserSessionModel.revoked_at.is_(None))
        .values(revoked_at=None)
        .returning(UserSessionModel.id)
    )
    if live is None:
        counters.stale_reports[what] += 1
        log.warning("refused a %s report from a run that has ended", what)
        raise Unauthenticated(STALE_RUN)


async def user_for_token(session: AsyncSession, token: str) -> UserModel:
    row = await session.scalar(
        select(UserSessionModel).where(UserSessionModel.token_hash == _token_digest(token))
    )
    if row is None or row.expires_at <= datetime.now(UTC):
        raise Unauthenticated("invalid or expired token; log in again")
    if row.revoked_at is not None:
        counters.stale_reports["request"] += 1
        raise Unauthenticated(STALE_RUN)
    session.info[TOKEN_SESSION_ID] = row.id
    user = await session.get(UserModel, row.user_id)
    if user is None or not user.active:
        raise Unauthenticated("user is no longer active")
    return user


async def logout(session: AsyncSession, token: str) -> None:
    await session.execute(
        delete(UserSessionModel).where(UserSessionModel.token_hash == _token_digest(token))
    )
