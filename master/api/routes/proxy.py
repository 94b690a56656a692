"""/proxy/<task id>/...: notebooks, TensorBoards and shells, reached through the master.

The owner's login is required: the API's bearer token (det shell start) or the dashboard's
sign-in (a cookie scoped to /proxy). Only the owner gets in, admins included: the page is
the task's own code served from the master's origin, so opening another user's notebook
would run that user's scripts with the viewer's dashboard session. One exception: a shell's
SSH tunnel (Determined's `det shell start`) needs no login, its credential being the
shell's key (resolute.shell_access). The task's server trusts only requests carrying its
secret, which the proxy adds.
"""

from __future__ import annotations

from urllib.parse import quote

from fastapi import APIRouter, Request, Response, WebSocket
from fastapi.responses import RedirectResponse

from master.api.proxy import ProxyPool, Upstream
from master.db.session import is_outage, session_scope
from master.errors import MasterError, PermissionDenied, Unauthenticated
from master.services import access, auth, interactive
from master.settings import MasterSettings
from master.web.common import PROXY_COOKIE
from resolute.shell_access import is_terminal_path

router = APIRouter()

_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


def _token(request: Request | WebSocket) -> str:
    """The API's bearer token, else the dashboard's sign-in. Another Authorization scheme
    is the page's own business (JupyterLab sends `token ...`), never ours."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return request.cookies.get(PROXY_COOKIE, "")


async def _target(
    request: Request | WebSocket, task_id: str, *, ssh_tunnel: bool = False
) -> tuple[Upstream, str]:
    """Who asks, and where the task listens; a short session of its own, so a notebook's
    hours-long WebSocket holds no database connection. `ssh_tunnel`: a shell's SSH may
    come without a login (see resolute.shell_access)."""
    token = _token(request)
    if not token and not ssh_tunnel:
        raise Unauthenticated(interactive.SIGN_IN_FIRST)
    settings: MasterSettings = request.app.state.settings
    async with session_scope(request.app.state.session_factory) as session:
        session.info[access.OPEN_READING] = settings.security.authz.type == "basic"
        if not token:
            target = await interactive.ssh_tunnel_target(session, task_id)
        else:
            user = await auth.user_for_token(session, token)
            if session.info.get(access.TOKEN_KIND) == access.TASK:
                raise PermissionDenied("a run's token opens its trial's API routes, not tasks")
            target = await interactive.proxy_target(session, access.Actor.of(user), task_id)
    upstream = Upstream(
        base_url=target.base_url,
        headers={"Authorization": f"token {target.secret}"},
    )
    return upstream, target.task_uuid


def _signed_out(request: Request) -> bool:
    return not _token(request)


@router.api_route("/proxy/{task_id}", methods=_METHODS, include_in_schema=False)
async def proxy_root(task_id: str, request: Request) -> Response:
    # The servers live under /proxy/<id>/: their relative links need the slash.
    query = f"?{request.url.query}" if request.url.query else ""
    return RedirectResponse(f"/proxy/{quote(task_id)}/{query}", status_code=307)


@router.api_route("/proxy/{task_id}/{path:path}", methods=_METHODS, include_in_schema=False)
async def proxy_http(task_id: str, path: str, request: Request) -> Response:
    if _signed_out(request) and request.method == "GET":
        # A browser: sign in on the dashboard, then come back here.
        target = quote(request.url.path + (f"?{request.url.query}" if request.url.query else ""))
        return RedirectResponse(f"/ui/login?next={target}", status_code=303)
    upstream, task_uuid = await _target(request, task_id)
    pool: ProxyPool = request.app.state.proxy_pool
    activity: interactive.ActivityLog = request.app.state.task_activity
    return await pool.forward_http(request, upstream, lambda: activity.touch(task_uuid))


async def _refuse(websocket: WebSocket, code: int, reason: str) -> None:
    """Accept, then close with the code and reason: a close before the accept reaches the
    client as a bare HTTP 403 (uvicorn), the reason lost. Chrome fails a handshake that
    picks none of the subprotocols it offered, so one of them is taken."""
    offered = websocket.scope.get("subprotocols") or []
    await websocket.accept(subprotocol=offered[0] if offered else None)
    await websocket.close(code=code, reason=reason.encode()[:123].decode(errors="ignore"))


@router.websocket("/proxy/{task_id}/{path:path}")
async def proxy_websocket(task_id: str, path: str, websocket: WebSocket) -> None:
    try:
        ssh_tunnel = not is_terminal_path(path)
        upstream, task_uuid = await _target(websocket, task_id, ssh_tunnel=ssh_tunnel)
    except MasterError as exc:
        # 4000 + the HTTP status: a client can tell "sign in" (4401) from "not yours"
        # (4403) and "not running" (4409).
        await _refuse(websocket, 4000 + exc.http_status, exc.message)
        return
    except Exception as exc:
        if not is_outage(exc):
            raise
        await _refuse(websocket, 1013, "the master's database is unreachable; retry")
        return
    pool: ProxyPool = websocket.app.state.proxy_pool
    activity: interactive.ActivityLog = websocket.app.state.task_activity
    await pool.forward_websocket(websocket, upstream, lambda: activity.touch(task_uuid))
