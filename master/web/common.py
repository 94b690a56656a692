"""What every dashboard page shares: rendering, the signed-in user from the session cookie,
CSRF checks, form parsing, paging, and turning errors into pages instead of JSON.

Status codes: a page that cannot be shown (unknown id, bad query parameter, refused CSRF
token) is an error page with the 4xx status the API would give. A form refused by the
service is shown again with each problem beside its field, as a 200: it is a normal page
to the browser, which would otherwise log the status as a console error.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import math
import re
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, TypeVar
from urllib.parse import parse_qs, quote, urlencode, urlsplit

import yaml
from fastapi import Depends, Query, Request, Response
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse
from fastapi.routing import APIRoute
from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

from master.api.deps import MAX_INT, SessionDep
from master.api.errors import describe_error, error_response, note_outage
from master.errors import InvalidArgument, MasterError, PayloadTooLarge, PermissionDenied
from master.services import access, auth, cluster_message

log = logging.getLogger(__name__)

T = TypeVar("T")

WEB_DIR = Path(__file__).resolve().parent
TEMPLATES_DIR = WEB_DIR / "templates"
STATIC_DIR = WEB_DIR / "static"
STATIC_PREFIX = "/ui/static"

COOKIE = "resolute_session"
# The same sign-in, for the proxy (/proxy/<task>/): a second cookie, so the dashboard's
# never travels with requests to the tasks' pages, and the proxy strips this one.
PROXY_COOKIE = "resolute_proxy_session"
CSRF_FIELD = "csrf_token"
CSRF_HEADER = "x-csrf-token"
# Templates are the largest thing a form carries; the API takes JSON for anything bigger.
MAX_FORM_BYTES = 1 * 2**20
MAX_PER_PAGE = 200
MAX_PAGE = MAX_INT // MAX_PER_PAGE

# Inline scripts are never needed: htmx attributes and app.js do everything. uPlot sets
# element styles, and htmx may add an indicator <style>, so inline styles stay allowed.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; form-action 'self'; "
    "base-uri 'self'; object-src 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
    # Pages carry a CSRF token and live data: never serve them from a cache.
    "Cache-Control": "no-store",
}


class SignInRequired(Exception):
    """No valid session cookie: full pages redirect to the sign-in form."""


# -- static files ------------------------------------------------------------------------


def _file_versions() -> dict[str, str]:
    """A short content hash per static file, for cache-busting query strings."""
    versions = {}
    for path in STATIC_DIR.rglob("*"):
        if path.is_file():
            digest = hashlib.sha256(path.read_bytes()).hexdigest()[:12]
            versions[path.relative_to(STATIC_DIR).as_posix()] = digest
    return versions


_VERSIONS = _file_versions()


def static_url(path: str) -> str:
    version = _VERSIONS.get(path)
    if version is None:
        raise KeyError(f"no static file {path}")
    return f"{STATIC_PREFIX}/{path}?v={version}"


class CachedStaticFiles(StaticFiles):
    """Pages link static files with their content hash, so a linked copy never changes."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        response = await super().get_response(path, scope)
        if response.status_code == 200:
            # Only a link carrying the current hash may be cached for good.
            current = f"v={_VERSIONS.get(path, '')}".encode()
            versioned = scope.get("query_string", b"") == current
            response.headers["Cache-Control"] = (
                "public, max-age=31536000, immutable" if versioned else "no-cache"
            )
            response.headers["X-Content-Type-Options"] = "nosniff"
        return response


# -- rendering ---------------------------------------------------------------------------


NONE_SHOWN = "\u2013"  # an en dash, as tables show a missing value


def _when(value: datetime | None) -> str:
    if value is None:
        return NONE_SHOWN
    return value.strftime("%Y-%m-%d %H:%M:%S UTC")


def _percent(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return NONE_SHOWN
    return f"{value * 100:.0f}%"


def _gib(value: float | None) -> str:
    if value is None:
        return NONE_SHOWN
    return f"{value / 2**30:.1f} GiB"


def _number(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def to_yaml(value: Any) -> str:
    text: str = yaml.safe_dump(value, sort_keys=False, default_flow_style=False, width=90)
    return text.removesuffix("...\n")


def _state_class(state: str) -> str:
    state = state.removeprefix("STATE_")
    if state in ("COMPLETED",):
        return "ok"
    if state in ("ERROR", "STOPPING_ERROR"):
        return "bad"
    if state in (
        "CANCELED",
        "STOPPING_CANCELED",
        "STOPPING_KILLED",
        "PAUSED",
        "DELETED",
        "TERMINATED",
    ):
        return "muted"
    if state in ("QUEUED", "PENDING", "DELETING", "PARTIALLY_DELETED"):
        return "wait"
    return "live"


def _path(value: str) -> str:
    """One URL path segment (agent ids and template names may hold spaces, @ or +)."""
    return quote(value, safe="")


environment = Environment(
    loader=FileSystemLoader(TEMPLATES_DIR),
    autoescape=select_autoescape(["html"]),
    undefined=StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
    auto_reload=False,
)
environment.globals["static"] = static_url
environment.filters.update(
    when=_when, percent=_percent, gib=_gib, number=_number, state=_state_class
)
environment.filters["path"] = _path


def page_response(
    request: Request,
    template: str,
    context: Mapping[str, Any],
    *,
    web: WebSession | None = None,
    status: int = 200,
) -> HTMLResponse:
    values = {"request": request, "web": web, "error": None, "notice": None, "nav": "", **context}
    html = environment.get_template(template).render(values)
    return HTMLResponse(html, status_code=status, headers=SECURITY_HEADERS)


def redirect(url: str) -> RedirectResponse:
    return RedirectResponse(url, status_code=303, headers={"Cache-Control": "no-store"})


def is_htmx(request: Request) -> bool:
    return request.headers.get("hx-request") == "true"


# -- the signed-in user ------------------------------------------------------------------


def csrf_token(session_token: str) -> str:
    """Per session and unguessable without the HttpOnly cookie it derives from."""
    return hmac.new(session_token.encode(), b"resolute web csrf", hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class WebSession:
    """Plain values, not the ORM row: a page that rolls back a refused form expires every
    row of the session, and rendering must not load one again."""

    username: str
    user_id: int
    token: str
    admin: bool = False
    # The admins' banner while it is active (det master cluster-message set), on every page.
    cluster_message: str | None = None

    @property
    def actor(self) -> access.Actor:
        return access.Actor(user_id=self.user_id, username=self.username, admin=self.admin)

    @property
    def csrf(self) -> str:
        return csrf_token(self.token)


async def web_session(request: Request, session: SessionDep) -> WebSession:
    token = request.cookies.get(COOKIE, "")
    if not token:
        raise SignInRequired
    try:
        user = await auth.user_for_token(session, token)
    except MasterError:
        raise SignInRequired from None
    if session.info.get(access.TOKEN_KIND) == access.TASK:
        raise SignInRequired  # a run's token opens its trial's API routes, not the dashboard
    showing = await cluster_message.current(session, include_scheduled=False)
    web = WebSession(
        username=user.username,
        user_id=user.id,
        token=token,
        admin=user.admin,
        cluster_message=showing.message if showing is not None else None,
    )
    # Kept for the error page: a handler that fails later still renders the navigation.
    request.state.web = web
    # What the page's path names must be the user's to see (a 404 as for nothing there).
    route = getattr(request.scope.get("route"), "path", request.url.path)
    await access.check_sight(session, web.actor, route, dict(request.path_params))
    return web


WebSessionDep = Annotated[WebSession, Depends(web_session)]


async def maybe_web_session(request: Request, session: SessionDep) -> WebSession | None:
    try:
        return await web_session(request, session)
    except SignInRequired:
        return None


# For pages anyone may see (the 404 page), with the navigation when signed in.
MaybeWebSessionDep = Annotated[WebSession | None, Depends(maybe_web_session)]


def check_origin(request: Request) -> None:
    """Browsers send Origin on every cross-site POST; a different host is a forged form."""
    # A reverse proxy may rewrite Host and say the original in X-Forwarded-Host; a forged
    # cross-site form can set neither.
    hosts = {request.headers.get("host", ""), request.headers.get("x-forwarded-host", "")}
    origin = request.headers.get("origin")
    source = origin if origin is not None else request.headers.get("referer")
    if source is None:
        return  # neither header: the CSRF token (or, at sign-in, nothing to steal) decides
    if source == "null" or urlsplit(source).netloc not in hosts - {""}:
        raise PermissionDenied("this form was sent from another site; reload the page and retry")


def check_csrf(request: Request, web: WebSession, form: Form) -> None:
    check_origin(request)
    sent = request.headers.get(CSRF_HEADER) or form.get(CSRF_FIELD)
    if not sent or not hmac.compare_digest(sent, web.csrf):
        raise PermissionDenied(
            "the form's security token is missing or stale; reload the page and retry"
        )


# -- forms -------------------------------------------------------------------------------


class Form:
    """A urlencoded form body. Only the first value of each name counts."""

    def __init__(self, fields: dict[str, list[str]]) -> None:
        self._fields = fields

    def get(self, name: str, default: str = "") -> str:
        values = self._fields.get(name)
        return values[0] if values else default


async def read_form(request: Request) -> Form:
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            raise PayloadTooLarge(f"the form is over {MAX_FORM_BYTES // 2**20} MiB")
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if body and content_type != "application/x-www-form-urlencoded":
        raise InvalidArgument("expected a form (application/x-www-form-urlencoded)")
    try:
        fields = parse_qs(
            body.decode("ascii"),
            keep_blank_values=True,
            max_num_fields=100,
            encoding="utf-8",
            errors="strict",
        )
    except (UnicodeDecodeError, ValueError):
        raise InvalidArgument("the form is not valid urlencoded UTF-8") from None
    for name, values in fields.items():
        if any("\x00" in v for v in (name, *values)):
            raise InvalidArgument(f"{name}: must not contain NUL characters")
    return Form(fields)


async def checked_form(request: Request, web: WebSession) -> Form:
    form = await read_form(request)
    check_csrf(request, web, form)
    return form


_WHOLE_NUMBER = re.compile(r"-?[0-9]{1,12}")


def parse_int(form: Form, name: str, low: int, high: int) -> int:
    raw = form.get(name).strip()
    if not _WHOLE_NUMBER.fullmatch(raw):
        raise InvalidArgument(f"{name}: {raw[:32]!r} is not a whole number")
    value = int(raw)
    if not low <= value <= high:
        raise InvalidArgument(f"{name}: {value} is not between {low} and {high}")
    return value


# -- paging ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Paging:
    page: int
    per_page: int

    @property
    def offset(self) -> int:
        return (self.page - 1) * self.per_page


def paging_by(default: int, most: int = MAX_PER_PAGE) -> Callable[..., Paging]:
    def paging(
        page: int = Query(1, ge=1, le=MAX_PAGE),
        per_page: int = Query(default, ge=1, le=most),
    ) -> Paging:
        return Paging(page, per_page)

    return paging


PagingDep = Annotated[Paging, Depends(paging_by(50))]


@dataclass(frozen=True)
class PageLinks:
    """What a pager shows: where we are, and the URLs of its neighbours."""

    page: int
    pages: int
    total: int
    first_index: int
    last_index: int
    prev_url: str | None
    next_url: str | None
    last_url: str | None


def page_links(
    path: str,
    paged: Paging,
    total: int,
    shown: int,
    params: Mapping[str, Any] | None = None,
    *,
    page_param: str = "page",
    per_page_param: str | None = "per_page",
) -> PageLinks:
    """Links for one of a page's tables; a page with two tables names each its own
    parameters (a fixed-size table has no per_page parameter)."""
    pages = max(1, math.ceil(total / paged.per_page))

    def url(page: int) -> str:
        query = {**(params or {}), page_param: page}
        if per_page_param:
            query[per_page_param] = paged.per_page
        return f"{path}?{urlencode({k: v for k, v in query.items() if v not in (None, '')})}"

    return PageLinks(
        page=paged.page,
        pages=pages,
        total=total,
        first_index=paged.offset + 1 if shown else 0,
        last_index=paged.offset + shown,
        prev_url=url(min(paged.page - 1, pages)) if paged.page > 1 else None,
        next_url=url(paged.page + 1) if paged.page < pages else None,
        last_url=url(pages) if paged.page > pages else None,
    )


def slice_page(items: list[T], paged: Paging) -> list[T]:
    return items[paged.offset : paged.offset + paged.per_page]


# -- errors as pages ---------------------------------------------------------------------


def _sign_in_url(request: Request) -> str:
    target = request.url.path
    if request.url.query:
        target += f"?{request.url.query}"
    return f"/ui/login?{urlencode({'next': target})}"


def _wants_json(request: Request) -> bool:
    return request.url.path.endswith(".json")


def _problem(
    status: int,
    code: int,
    message: str,
    details: list[Any],
    request: Request,
    headers: dict[str, str] | None = None,
) -> Response:
    if _wants_json(request):
        return error_response(status, code, message, details, headers)
    response = page_response(
        request,
        "error.html",
        {"status": status, "message": message, "details": details},
        web=getattr(request.state, "web", None),
        status=status,
    )
    response.headers.update(headers or {})
    return response


class WebRoute(APIRoute):
    """Renders errors as pages (or as the API's JSON for the .json feeds the pages poll).

    The request's database session has already rolled back when an error reaches here,
    so a refused form has changed nothing.
    """

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            try:
                return await handler(request)
            except SignInRequired:
                if _wants_json(request):
                    return error_response(401, 16, "sign in again", [])
                target = _sign_in_url(request)
                if is_htmx(request):
                    # htmx follows this header instead of swapping a login form into a table.
                    response: Response = Response(status_code=204, headers={"HX-Redirect": target})
                else:
                    response = redirect(target)
                response.delete_cookie(COOKIE, path="/ui")
                return response
            except Exception as exc:
                # The API's own mapping, so a page and the JSON API never disagree.
                note_outage(request, exc)
                problem = describe_error(exc)
                return _problem(
                    problem.http_status,
                    problem.code,
                    problem.message,
                    problem.details,
                    request,
                    problem.headers,
                )

        return route


def json_response(content: Any) -> JSONResponse:
    return JSONResponse(content, headers={"Cache-Control": "no-store"})
