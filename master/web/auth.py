"""Sign-in and sign-out: the API's users and tokens, the token kept in an HttpOnly cookie."""

from __future__ import annotations

from datetime import timedelta

from fastapi import APIRouter, Request, Response

from master.api.deps import SessionDep, SettingsDep
from master.errors import InvalidArgument, TooManyRequests, Unauthenticated
from master.services import auth
from master.web.common import (
    COOKIE,
    PROXY_COOKIE,
    WebRoute,
    WebSessionDep,
    check_origin,
    checked_form,
    page_response,
    read_form,
    redirect,
)

router = APIRouter(route_class=WebRoute)


def safe_next(target: str) -> str:
    """Only our own pages (the dashboard's and the tasks' behind the proxy): never another
    host (`//evil`), a scheme, or a backslash trick."""
    if (
        target.startswith(("/ui/", "/proxy/"))
        and not target.startswith("/ui/login")
        and "//" not in target
        and "\\" not in target
        and target.isprintable()
    ):
        return target
    return "/ui/"


@router.get("/ui/login")
async def login_page(request: Request, next: str = "/ui/") -> Response:
    return page_response(request, "login.html", {"next": safe_next(next), "username": ""})


@router.post("/ui/login")
async def login(request: Request, session: SessionDep, settings: SettingsDep) -> Response:
    check_origin(request)
    form = await read_form(request)
    username = form.get("username").strip()
    target = safe_next(form.get("next", "/ui/"))
    ttl = timedelta(hours=settings.security.token_ttl_hours)
    limiter: auth.LoginLimiter = request.app.state.login_limiter
    client = request.client.host if request.client else "unknown"
    try:
        limiter.check(username, client)
        try:
            token, _user = await auth.login(
                session, username, form.get("password"), is_hashed=False, ttl=ttl
            )
        except Unauthenticated:
            limiter.failed(username, client)
            raise
    except (InvalidArgument, Unauthenticated, TooManyRequests) as exc:
        await session.rollback()
        message = "Enter a username." if isinstance(exc, InvalidArgument) else exc.message
        context = {"next": target, "username": username, "error": message}
        status = 429 if isinstance(exc, TooManyRequests) else 200
        return page_response(request, "login.html", context, status=status)
    limiter.succeeded(username)
    response = redirect(target)
    for name, path in ((COOKIE, "/ui"), (PROXY_COOKIE, "/proxy")):
        response.set_cookie(
            name,
            token,
            max_age=int(ttl.total_seconds()),
            path=path,
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
    return response


@router.post("/ui/logout")
async def logout(request: Request, session: SessionDep, web: WebSessionDep) -> Response:
    await checked_form(request, web)
    await auth.logout(session, web.token)
    response = redirect("/ui/login")
    response.delete_cookie(COOKIE, path="/ui")
    response.delete_cookie(PROXY_COOKIE, path="/proxy")
    return response
