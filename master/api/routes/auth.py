from __future__ import annotations

from datetime import timedelta

from fastapi import APIRouter, Request

from master.api.deps import CurrentUser, SessionDep, SettingsDep, bearer_token
from master.errors import Unauthenticated
from master.schemas.auth import LoginRequest, LoginResponse, MeResponse, User
from master.schemas.experiments import Empty
from master.services import auth

router = APIRouter(prefix="/api/v1", tags=["Authentication"])


@router.post("/auth/login")
async def login(
    body: LoginRequest, request: Request, session: SessionDep, settings: SettingsDep
) -> LoginResponse:
    limiter: auth.LoginLimiter = request.app.state.login_limiter
    client = request.client.host if request.client else "unknown"
    limiter.check(body.username, client)
    try:
        token, user = await auth.login(
            session,
            body.username,
            body.password or "",
            is_hashed=bool(body.is_hashed),
            ttl=timedelta(hours=settings.security.token_ttl_hours),
        )
    except Unauthenticated:
        limiter.failed(body.username, client)
        raise
    limiter.succeeded(body.username)
    return LoginResponse(token=token, user=User.of(user))


@router.post("/auth/logout")
async def logout(request: Request, session: SessionDep, _user: CurrentUser) -> Empty:
    await auth.logout(session, bearer_token(request))
    return Empty()


@router.get("/me")
async def me(user: CurrentUser) -> MeResponse:
    return MeResponse(user=User.of(user))
