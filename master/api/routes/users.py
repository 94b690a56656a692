"""Users and access tokens, on Determined's routes (`det user ...`, `det token ...`)."""

from __future__ import annotations

from fastapi import APIRouter, Body, Query

from master.api.deps import MAX_INT, CurrentActor, ObjectId, SessionDep
from master.errors import InvalidArgument
from master.schemas.auth import (
    AccessTokenRequest,
    AccessTokenResponse,
    CreateUserRequest,
    PatchTokenRequest,
    PatchUserRequest,
    TokenInfo,
    TokenInfoResponse,
    TokenList,
    User,
    UserList,
    UserResponse,
)
from master.schemas.common import Pagination
from master.services import auth

router = APIRouter(prefix="/api/v1", tags=["Users"])


def _no_enterprise(remote: bool | None, agent_user_group: object) -> None:
    if remote:
        raise InvalidArgument("remote: users managed by an SSO service are not supported")
    if agent_user_group:
        raise InvalidArgument(
            "agentUserGroup: ranks run as the agent's --rank-user, not per user; leave it unset"
        )


@router.get("/users")
async def list_users(
    session: SessionDep,
    _actor: CurrentActor,
    offset: int = Query(0, ge=0, le=MAX_INT),
    limit: int = Query(0, ge=0, le=MAX_INT),
    active: bool | None = None,
    admin: bool | None = None,
    name: str | None = Query(None, max_length=256),
) -> UserList:
    """Determined's filters: `det user list` asks for active users only."""
    users = [
        u
        for u in await auth.list_users(session)
        if (active is None or u.active == active)
        and (admin is None or u.admin == admin)
        and (
            not name or name.lower() in u.username.lower() or name.lower() in u.display_name.lower()
        )
    ]
    page = users[offset : offset + limit] if limit else users[offset:]
    return UserList(
        users=[User.of(u) for u in page],
        pagination=Pagination.of(offset, limit, len(page), len(users)),
    )


@router.post("/users")
async def create_user(
    body: CreateUserRequest, session: SessionDep, actor: CurrentActor
) -> UserResponse:
    _no_enterprise(body.user.remote, body.user.agent_user_group)
    user = await auth.create_user(
        session,
        actor,
        body.user.username,
        body.password or "",
        is_hashed=bool(body.is_hashed),
        admin=body.user.admin,
        active=body.user.active,
        display_name=body.user.display_name or "",
    )
    return UserResponse(user=User.of(user))


@router.get("/users/{username}/by-username")
async def get_user_by_username(
    username: str, session: SessionDep, _actor: CurrentActor
) -> UserResponse:
    return UserResponse(user=User.of(await auth.get_user_by_name(session, username)))


@router.get("/users/{user_id}")
async def get_user(user_id: ObjectId, session: SessionDep, _actor: CurrentActor) -> UserResponse:
    return UserResponse(user=User.of(await auth.get_user(session, user_id)))


@router.patch("/users/{user_id}")
async def patch_user(
    user_id: ObjectId, body: PatchUserRequest, session: SessionDep, actor: CurrentActor
) -> UserResponse:
    _no_enterprise(body.remote, body.agent_user_group)
    if body.username is not None:
        current = await auth.get_user(session, user_id)
        if body.username != current.username:
            raise InvalidArgument("username: renaming users is not supported")
    user = await auth.update_user(
        session,
        actor,
        user_id,
        active=body.active,
        admin=body.admin,
        display_name=body.display_name,
        password=body.password,
        is_hashed=bool(body.is_hashed),
    )
    return UserResponse(user=User.of(user))


@router.post("/users/{user_id}/password")
async def set_password(
    user_id: ObjectId, session: SessionDep, actor: CurrentActor, password: str = Body(...)
) -> UserResponse:
    """Determined's SetUserPassword: the body is the bare (client-hashed) password."""
    user = await auth.update_user(session, actor, user_id, password=password, is_hashed=True)
    return UserResponse(user=User.of(user))


@router.post("/tokens")
async def create_access_token(
    body: AccessTokenRequest, session: SessionDep, actor: CurrentActor
) -> AccessTokenResponse:
    token, row = await auth.create_access_token(
        session,
        actor,
        body.user_id,
        auth.parse_lifespan(body.lifespan),
        body.description or "",
    )
    return AccessTokenResponse(token=token, token_id=row.id)


@router.get("/tokens")
async def list_access_tokens(
    session: SessionDep,
    actor: CurrentActor,
    username: str | None = None,
    token_ids: list[int] = Query([], alias="tokenIds"),
    show_inactive: bool = Query(False, alias="showInactive"),
    offset: int = Query(0, ge=0, le=MAX_INT),
    limit: int = Query(0, ge=0, le=MAX_INT),
) -> TokenList:
    if any(not 0 <= i <= MAX_INT for i in token_ids):
        raise InvalidArgument(f"tokenIds: each must be between 0 and {MAX_INT}")
    rows = await auth.list_access_tokens(
        session, actor, username=username, token_ids=token_ids, show_inactive=show_inactive
    )
    page = rows[offset : offset + limit] if limit else rows[offset:]
    return TokenList(
        token_info=[TokenInfo.of(row, name) for row, name in page],
        pagination=Pagination.of(offset, limit, len(page), len(rows)),
    )


@router.patch("/tokens/{token_id}")
async def patch_access_token(
    token_id: ObjectId, body: PatchTokenRequest, session: SessionDep, actor: CurrentActor
) -> TokenInfoResponse:
    if body.token_id not in (None, token_id):
        raise InvalidArgument(f"tokenId: the body says {body.token_id}, the path {token_id}")
    row = await auth.patch_access_token(
        session, actor, token_id, revoke=body.set_revoked, description=body.description
    )
    user = await auth.get_user(session, row.user_id)
    return TokenInfoResponse(token_info=TokenInfo.of(row, user.username))
