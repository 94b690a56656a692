"""Request-scoped dependencies: settings, one DB session per request, the signed-in user."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Annotated

from fastapi import Depends, Path, Request
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from master.db.models import MAX_INT as MAX_INT  # re-exported: routes bound their ids with it
from master.db.models import UserModel
from master.db.session import session_scope
from master.errors import Unauthenticated
from master.services import access, auth, webhooks
from master.services.allocations import WAKE_HUB, WAKE_SCHEDULER
from master.services.preemption import PreemptionSignals
from master.settings import MasterSettings

AFTER_COMMIT = "after_commit"


def get_settings(request: Request) -> MasterSettings:
    settings: MasterSettings = request.app.state.settings
    return settings


async def get_session(request: Request) -> AsyncIterator[AsyncSession]:
    """Commit after the handler returns and before the reply is sent; roll back if it raises.

    Used with scope="function": the default scope would commit after the reply, so a client
    could be told "done" about a write that then fails, or race its own next request.
    """
    factory: async_sessionmaker[AsyncSession] = request.app.state.session_factory
    settings: MasterSettings = request.app.state.settings
    async with session_scope(factory) as session:
        session.info[access.OPEN_READING] = settings.security.authz.type == "basic"
        session.info[access.SHARED_SIGHTS] = request.app.state.sights
        yield session
    for action in session.info.get(AFTER_COMMIT, ()):
        action()
    if session.info.get(WAKE_HUB):
        # A kill or a pause reaches the ranks' agents now rather than on the hub's tick
        # (woken first: the pass a stop asks for has nothing to place until slots free).
        hub_loop = getattr(request.app.state, "hub_loop", None)
        if hub_loop is not None:
            hub_loop.wake()
    if session.info.get(webhooks.WAKE_SHIPPER):
        # An event this request recorded goes out now rather than at the shipper's next look.
        shipper = getattr(request.app.state, "webhook_shipper", None)
        if shipper is not None:
            shipper.wake()
    if session.info.get(WAKE_SCHEDULER):
        # Only now is the new work visible to the scheduler's own transaction.
        request.app.state.scheduler.wake()


def after_commit(session: AsyncSession, action: Callable[[], None]) -> None:
    """Run `action` once the request's transaction has committed (never if it fails)."""
    session.info.setdefault(AFTER_COMMIT, []).append(action)


ObjectId = Annotated[int, Path(ge=0, le=MAX_INT)]

SettingsDep = Annotated[MasterSettings, Depends(get_settings)]
SessionDep = Annotated[AsyncSession, Depends(get_session, scope="function")]


def bearer_token(request: Request) -> str:
    # Determined's trial harness sends its allocation token in this header instead.
    header = request.headers.get("authorization") or request.headers.get(
        "grpc-metadata-x-allocation-token", ""
    )
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthenticated("missing bearer token; log in with POST /api/v1/auth/login")
    return token.strip()


async def current_user(request: Request, session: SessionDep) -> UserModel:
    user = await auth.user_for_token(session, bearer_token(request))
    route = getattr(request.scope.get("route"), "path", request.url.path)
    actor = access.Actor.of(user)
    params = dict(request.path_params)
    if session.info.get(access.TOKEN_KIND) == access.TASK:
        trial_id = session.info[access.TOKEN_TRIAL_ID]
        # Its own trial's routes need nothing more: the run's owner reads what they own.
        if await access.check_task_scope(session, trial_id, user.id, request.method, route, params):
            await access.check_sight(session, actor, route, params)
    else:
        await access.check_sight(session, actor, route, params)
    return user


CurrentUser = Annotated[UserModel, Depends(current_user)]


async def optional_user(request: Request, session: SessionDep) -> UserModel | None:
    """The signed-in user, or None for a request that sends no token at all (a bad token
    is still refused)."""
    if not (
        request.headers.get("authorization")
        or request.headers.get("grpc-metadata-x-allocation-token")
    ):
        return None
    return await current_user(request, session)


OptionalUser = Annotated[UserModel | None, Depends(optional_user)]


async def current_actor(user: CurrentUser) -> access.Actor:
    return access.Actor.of(user)


# The signed-in user as plain values, for the permission checks in master/services/access.py.
CurrentActor = Annotated[access.Actor, Depends(current_actor)]


def preemption_signals(request: Request) -> PreemptionSignals:
    signals: PreemptionSignals = request.app.state.preemption
    return signals


PreemptionDep = Annotated[PreemptionSignals, Depends(preemption_signals)]
