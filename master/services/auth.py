"""Users, password checks and bearer tokens, speaking the login protocol of Determined's client.

The official client never sends a plain password: it sends `sha512_hex(CLIENT_SALT + password)`
(or "" for an empty password) with `isHashed: true`. We store a salted PBKDF2 of that client
hash, so both hashed and plain logins can be checked and the stored value is never the secret.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import hmac
import logging
import os
import re
import secrets
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from sqlalchemy import delete, func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from master.core.credentials import client_side_hash, new_token
from master.db.models import AccessStateModel, UserModel, UserSessionModel
from master.errors import (
    AlreadyExists,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    TooManyRequests,
    Unauthenticated,
)
from master.services import counters
from master.services.access import (
    ACCESS_GENERATION,
    TASK,
    TOKEN_KIND,
    TOKEN_TRIAL_ID,
    Actor,
    may_act_for_user,
)

log = logging.getLogger(__name__)
_T = TypeVar("_T")

PBKDF2_ITERATIONS = 100_000
# session.info key: the id of the user_sessions row the request's token belongs to.
TOKEN_SESSION_ID = "token_session_id"
STALE_RUN = (
    "this token belonged to a run that has ended: a process of an earlier run is still "
    "reporting, and its reports are refused"
)
DEFAULT_USERS = (("admin", True), ("determined", False))
LOGIN, ACCESS = "login", "access"
# A notebook's, shell's or command's token: the owner's access until the task ends.
INTERACTIVE = "interactive"
USERNAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,127}$")
# `det token create` without --expiration-days; Determined's default is 30 days.
DEFAULT_ACCESS_TOKEN_LIFESPAN = timedelta(days=30)
MAX_ACCESS_TOKEN_LIFESPAN = timedelta(days=3650)


def hash_password(
    password: str, *, is_hashed: bool = False, iterations: int = PBKDF2_ITERATIONS
) -> str:
    """The stored form; it names its iterations, so a check reads them from the hash."""
    client_hash = password if is_hashed else client_side_hash(password)
    salt = secrets.token_bytes(16)
    digest = hashlib.pbkdf2_hmac("sha256", client_hash.encode(), salt, iterations)
    return f"pbkdf2_sha256${iterations}${salt.hex()}${digest.hex()}"


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


# PBKDF2 takes ~20 ms of CPU per check. Off the event loop (which acknowledges heartbeats),
# and on at most cores - 1 threads: a burst of logins queues here instead of taking every
# core from the loop (benchmarks/bench_security.py measures the probe latency it keeps).
_HASHING = ThreadPoolExecutor(
    max_workers=max(1, (os.cpu_count() or 2) - 1), thread_name_prefix="password-hash"
)


_DECOY_HASH = hash_password("resolute-decoy")


async def _hashing(function: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_HASHING, functools.partial(function, *args, **kwargs))


def _token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


async def _mint(
    session: AsyncSession,
    user_id: int,
    ttl: timedelta,
    kind: str,
    *,
    trial_id: int | None = None,
    description: str = "",
) -> tuple[str, UserSessionModel]:
    """A new bearer token and its row; only the token's SHA-256 is stored."""
    token = new_token()
    now = datetime.now(UTC)
    row = UserSessionModel(
        user_id=user_id,
        token_hash=_token_digest(token),
        created_at=now,
        expires_at=now + ttl,
        kind=kind,
        trial_id=trial_id,
        description=description,
    )
    session.add(row)
    await session.flush()
    return token, row


async def ensure_default_users(
    session: AsyncSession, initial_password: str, *, iterations: int = PBKDF2_ITERATIONS
) -> None:
    """Create `admin` and `determined` once; never touch them again (they may have changed).
    `iterations` is for test fixtures, which make these users before every test."""
    for username, admin in DEFAULT_USERS:
        exists = await session.scalar(select(UserModel.id).where(UserModel.username == username))
        if exists is None:
            session.add(
                UserModel(
                    username=username,
                    admin=admin,
                    password_hash=hash_password(initial_password, iterations=iterations),
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
    # One message for every failure, and the same ~20 ms of hashing, so a caller cannot
    # probe which usernames exist by the answer or by its time.
    if user is None or not user.active:
        await _hashing(password_matches, _DECOY_HASH, password, is_hashed=is_hashed)
        raise Unauthenticated("invalid credentials")
    matches = await _hashing(password_matches, user.password_hash, password, is_hashed=is_hashed)
    if not matches:
        raise Unauthenticated("invalid credentials")
    token, _ = await _mint(session, user.id, ttl, LOGIN)
    log.info("user %s logged in", username)
    return token, user


async def issue_task_token(
    session: AsyncSession, user_id: int, ttl: timedelta, trial_id: int
) -> tuple[str, int]:
    """A token for a task's processes to call the API as the experiment's owner, on that
    one trial's routes only (access.check_task_scope), and the id of its session row
    (revoke it with `revoke_session` when the task ends)."""
    token, row = await _mint(session, user_id, ttl, TASK, trial_id=trial_id)
    return token, row.id


async def issue_interactive_token(
    session: AsyncSession, user_id: int, ttl: timedelta, description: str
) -> tuple[str, int]:
    """A token for a notebook's, shell's or command's processes: the owner's own access
    (`det` inside a notebook acts as its user, as in Determined), revoked when the task
    ends. Returns the token and its session row's id."""
    token, row = await _mint(session, user_id, ttl, INTERACTIVE, description=description)
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


_ACCESS_GENERATION = (
    select(AccessStateModel.generation).where(AccessStateModel.id == 1).scalar_subquery()
)


async def user_for_token(session: AsyncSession, token: str) -> UserModel:
    # The token and its user in one statement: every authenticated request starts here.
    # With them the access generation, for the readers' cache (access.SightCache).
    found = (
        await session.execute(
            select(UserSessionModel, UserModel, _ACCESS_GENERATION)
            .outerjoin(UserModel, UserModel.id == UserSessionModel.user_id)
            .where(UserSessionModel.token_hash == _token_digest(token))
        )
    ).first()
    row: UserSessionModel | None = None
    user: UserModel | None = None
    if found is not None:
        row, user, session.info[ACCESS_GENERATION] = found
    if row is None or row.expires_at <= datetime.now(UTC):
        raise Unauthenticated("invalid or expired token; log in again")
    if row.revoked_at is not None:
        if row.kind != TASK:
            raise Unauthenticated("this token has been revoked; log in again")
        counters.stale_reports["request"] += 1
        raise Unauthenticated(STALE_RUN)
    session.info[TOKEN_SESSION_ID] = row.id
    session.info[TOKEN_KIND] = row.kind
    session.info[TOKEN_TRIAL_ID] = row.trial_id if row.kind == TASK else None
    if user is None or not user.active:
        raise Unauthenticated("user is no longer active")
    return user


async def logout(session: AsyncSession, token: str) -> None:
    """Ends a login; an access token or a run's token is not ended by a logout with it."""
    await session.execute(
        delete(UserSessionModel).where(
            UserSessionModel.token_hash == _token_digest(token), UserSessionModel.kind == LOGIN
        )
    )


async def default_users_with_empty_password(session: AsyncSession) -> list[str]:
    """The default users an attacker could sign in as with no password at all."""
    names = [name for name, _ in DEFAULT_USERS]
    rows = await session.execute(
        select(UserModel.username, UserModel.password_hash).where(
            UserModel.username.in_(names), UserModel.active.is_(True)
        )
    )
    return sorted(
        name for name, stored in rows.all() if password_matches(stored, "", is_hashed=False)
    )


# -- users -----------------------------------------------------------------------------------


def check_username(username: str) -> str:
    if not USERNAME.match(username or ""):
        raise InvalidArgument(
            f"username: {username!r} must be 1-128 letters, digits or . _ @ -, "
            "starting with a letter or digit"
        )
    return username


async def get_user(session: AsyncSession, user_id: int) -> UserModel:
    user = await session.get(UserModel, user_id)
    if user is None:
        raise NotFound(f"user {user_id} not found")
    return user


async def get_user_by_name(session: AsyncSession, username: str) -> UserModel:
    user = await session.scalar(select(UserModel).where(UserModel.username == username))
    if user is None:
        raise NotFound(f"user {username!r} not found")
    return user


async def list_users(session: AsyncSession) -> list[UserModel]:
    return list((await session.scalars(select(UserModel).order_by(UserModel.id))).all())


async def list_usernames(session: AsyncSession) -> list[str]:
    """Every user's name, A to Z (the dashboard's owner filters)."""
    query = select(UserModel.username).order_by(UserModel.username)
    return list((await session.scalars(query)).all())


async def create_user(
    session: AsyncSession,
    actor: Actor,
    username: str,
    password: str,
    *,
    is_hashed: bool,
    admin: bool = False,
    active: bool = True,
    display_name: str = "",
) -> UserModel:
    if not actor.admin:
        raise PermissionDenied(f"creating users is for admins; user {actor.username} is not one")
    check_username(username)
    if len(display_name) > 256:
        raise InvalidArgument("displayName: at most 256 characters")
    exists = await session.scalar(
        select(func.count()).select_from(UserModel).where(UserModel.username == username)
    )
    if exists:
        raise AlreadyExists(f"user {username!r} already exists")
    user = UserModel(
        username=username,
        admin=admin,
        active=active,
        display_name=display_name,
        password_hash=await _hashing(hash_password, password, is_hashed=is_hashed),
    )
    session.add(user)
    await session.flush()
    log.info("user %s created by %s (admin=%s)", username, actor.username, admin)
    return user


async def update_user(
    session: AsyncSession,
    actor: Actor,
    user_id: int,
    *,
    active: bool | None = None,
    admin: bool | None = None,
    display_name: str | None = None,
    password: str | None = None,
    is_hashed: bool = False,
) -> UserModel:
    """Users change their own display name and password; only admins change the rest."""
    may_act_for_user(actor, user_id, "change the account")
    user = await get_user(session, user_id)
    if (active is not None and active != user.active) or (
        admin is not None and admin != user.admin
    ):
        if not actor.admin:
            raise PermissionDenied("only an admin may activate, deactivate or promote users")
        if user.id == actor.user_id and (active is False or admin is False):
            raise InvalidArgument(
                "an admin cannot deactivate or demote themselves; ask another admin"
            )
    if display_name is not None:
        if len(display_name) > 256:
            raise InvalidArgument("displayName: at most 256 characters")
        user.display_name = display_name
    if active is not None:
        user.active = active
    if admin is not None:
        user.admin = admin
    if password is not None:
        user.password_hash = await _hashing(hash_password, password, is_hashed=is_hashed)
    if password is not None or active is False:
        # A new password or a deactivation ends the user's logins (not their runs' tokens).
        await session.execute(
            delete(UserSessionModel).where(
                UserSessionModel.user_id == user.id, UserSessionModel.kind == LOGIN
            )
        )
    await session.flush()
    log.info("user %s changed by %s", user.username, actor.username)
    return user


# -- access tokens (det token) ---------------------------------------------------------------


def parse_lifespan(value: str | None) -> timedelta:
    """Determined's lifespan: a Go duration in hours ("720h") as its CLI sends, or days
    ("30d"); "-1" is its spelling of the longest allowed."""
    if value is None or value == "":
        return DEFAULT_ACCESS_TOKEN_LIFESPAN
    if value.strip() == "-1":
        return MAX_ACCESS_TOKEN_LIFESPAN
    match = re.fullmatch(r"\s*(\d{1,7})\s*([hd])\s*", value)
    if match is None:
        raise InvalidArgument(f"lifespan: {value!r} is not a duration like '720h' or '30d'")
    amount = int(match.group(1))
    span = timedelta(hours=amount) if match.group(2) == "h" else timedelta(days=amount)
    if span <= timedelta(0) or span > MAX_ACCESS_TOKEN_LIFESPAN:
        raise InvalidArgument(f"lifespan: {value!r} must be between 1h and 3650d")
    return span


async def create_access_token(
    session: AsyncSession, actor: Actor, user_id: int, lifespan: timedelta, description: str
) -> tuple[str, UserSessionModel]:
    may_act_for_user(actor, user_id, "create access tokens")
    user = await get_user(session, user_id)
    if not user.active:
        raise InvalidArgument(f"user {user.username} is deactivated")
    if len(description) > 256:
        raise InvalidArgument("description: at most 256 characters")
    token, row = await _mint(session, user.id, lifespan, ACCESS, description=description)
    log.info("access token %d for %s created by %s", row.id, user.username, actor.username)
    return token, row


async def list_access_tokens(
    session: AsyncSession,
    actor: Actor,
    *,
    username: str | None,
    token_ids: list[int],
    show_inactive: bool,
) -> list[tuple[UserSessionModel, str]]:
    """Access tokens and their users' names: one's own, or everyone's for an admin."""
    query = (
        select(UserSessionModel, UserModel.username)
        .join(UserModel, UserModel.id == UserSessionModel.user_id)
        .where(UserSessionModel.kind == ACCESS)
        .order_by(UserSessionModel.id)
    )
    if not actor.admin:
        query = query.where(UserSessionModel.user_id == actor.user_id)
    if username:
        query = query.where(UserModel.username == username)
    if token_ids:
        query = query.where(UserSessionModel.id.in_(token_ids))
    if not show_inactive:
        query = query.where(
            UserSessionModel.revoked_at.is_(None),
            UserSessionModel.expires_at > datetime.now(UTC),
        )
    return [(row, name) for row, name in (await session.execute(query)).all()]


async def patch_access_token(
    session: AsyncSession,
    actor: Actor,
    token_id: int,
    *,
    revoke: bool | None,
    description: str | None,
) -> UserSessionModel:
    row = await session.get(UserSessionModel, token_id)
    if row is None or row.kind != ACCESS:
        raise NotFound(f"access token {token_id} not found")
    may_act_for_user(actor, row.user_id, "change the access tokens")
    if description is not None:
        if len(description) > 256:
            raise InvalidArgument("description: at most 256 characters")
        row.description = description
    if revoke and row.revoked_at is None:
        row.revoked_at = datetime.now(UTC)
        log.info("access token %d revoked by %s", token_id, actor.username)
    elif revoke is False and row.revoked_at is not None:
        raise InvalidArgument("setRevoked: a revoked token cannot be made valid again")
    await session.flush()
    return row


# -- login rate limit ------------------------------------------------------------------------


class LoginLimiter:
    """Failed logins per user name and per client address in a sliding window: past the
    limit, logins from there (even right ones) wait, so passwords cannot be guessed at
    the speed of the network. In memory, and bounded: a flood of made-up names evicts the
    oldest entries, never the counts of a name under attack that is still failing."""

    MAX_KEYS = 100_000

    def __init__(self, max_failures: int = 10, window_s: float = 60.0) -> None:
        self.max_failures = max_failures
        self.window_s = window_s
        # Least recently failed first, so eviction drops the stalest entry.
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()

    def _recent(self, key: str, now: float) -> deque[float] | None:
        times = self._failures.get(key)
        if times is None:
            return None
        while times and times[0] <= now - self.window_s:
            times.popleft()
        if not times:
            del self._failures[key]
            return None
        return times

    def check(self, username: str, client: str) -> None:
        """Reads only: checking a name never stores it."""
        now = time.monotonic()
        for key, what in ((f"user:{username[:128]}", "user"), (f"addr:{client}", "address")):
            times = self._recent(key, now)
            if times is not None and len(times) >= self.max_failures:
                retry = max(1, int(times[0] + self.window_s - now) + 1)
                raise TooManyRequests(
                    f"too many failed logins for {what} {key.split(':', 1)[1]!r}; "
                    f"try again in {retry}s",
                    retry_after_s=retry,
                )

    def failed(self, username: str, client: str) -> None:
        now = time.monotonic()
        # Names are at most 128 characters; a longer one cannot exist, nor grow a key.
        for key in (f"user:{username[:128]}", f"addr:{client}"):
            times = self._recent(key, now)
            if times is None:
                times = self._failures[key] = deque()
            times.append(now)
            self._failures.move_to_end(key)
        while len(self._failures) > self.MAX_KEYS:
            self._failures.popitem(last=False)

    def succeeded(self, username: str) -> None:
        self._failures.pop(f"user:{username[:128]}", None)
