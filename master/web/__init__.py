"""The web dashboard det-master serves under /ui: Jinja2 pages, htmx partial refresh and
uPlot charts (vendored under static/vendor), built on the same services as the REST API."""

from __future__ import annotations

from fastapi import APIRouter, FastAPI, Request, Response
from starlette.exceptions import HTTPException

from master.errors import NotFound
from master.web import (
    auth,
    cluster,
    config_templates,
    experiments,
    registry,
    search_views,
    tasks,
    trials,
    workspaces,
)
from master.web.common import (
    STATIC_DIR,
    STATIC_PREFIX,
    CachedStaticFiles,
    MaybeWebSessionDep,
    WebRoute,
    redirect,
)

router = APIRouter(include_in_schema=False)
for _module in (
    auth,
    cluster,
    experiments,
    search_views,
    trials,
    tasks,
    config_templates,
    registry,
    workspaces,
):
    router.include_router(_module.router)


@router.get("/")
async def root(request: Request) -> Response:
    """Browsers land on the dashboard; API clients keep the API's 404 for `/`."""
    if "text/html" in request.headers.get("accept", ""):
        return redirect("/ui/")
    raise HTTPException(status_code=404, detail="Not Found")


@router.get("/ui")
async def ui_root() -> Response:
    return redirect("/ui/")


# Registered last: a mistyped dashboard URL gets an error page (with the site's navigation
# when signed in), not the API's JSON 404.
_fallback = APIRouter(route_class=WebRoute)


@_fallback.get("/ui/{rest:path}")
async def unknown_page(rest: str, _web: MaybeWebSessionDep) -> Response:
    raise NotFound(f"no page at /ui/{rest}")


router.include_router(_fallback)


def mount_static(app: FastAPI) -> None:
    """Mount before including `router`, whose catch-all would otherwise shadow the files."""
    app.mount(STATIC_PREFIX, CachedStaticFiles(directory=STATIC_DIR), name="ui-static")


__all__ = ["mount_static", "router"]
