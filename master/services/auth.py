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

from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncSession

from master.core.credentials import client_side_hash
from master.db.models import UserModel, UserSessionModel
from master.errors import InvalidArgument, Unauthenticated

log = logging.getLogger(__name__)

PBKDF2_ITERATIONS = 100_000
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
    id of its session row (delete it with `revoke_session` when the task ends)."""
    token = secrets.token_urlsafe(32)
    now = datetime.now(UTC)
    row = UserSessionModel(
        user_id=user_id, token_hash=_token_digest(token), created_at=now, expires_at=now + ttl
    )
    session.add(row)
    await session.flush()
    return token, row.id


async def revoke_session(session: AsyncSession, session_id: int) -> None:
    await session.execute(delete(UserSessionModel).where(UserSessionModel.id == session_id))


async def user_for_token(session: AsyncSession, token: str) -> UserModel:
    row = await session.scalar(
        select(UserSessionModel).where(UserSessionModel.token_hash == _token_digest(token))
    )
    if row is None or row.expires_at <= datetime.now(UTC):
        raise Unauthenticated("invalid or expired token; log in again")
    user = await session.get(UserModel, row.user_id)
    if user is None or not user.active:
        raise Unauthenticated("user is no longer active")
    return user


async def logout(session: AsyncSession, token: str) -> None:
    await session.execute(
        delete(UserSessionModel).where(UserSessionModel.token_hash == _token_digest(token))
    )
