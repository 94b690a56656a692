from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from master.api.deps import CurrentUser, SessionDep
from master.schemas.common import Pagination
from master.services import workspaces

router = APIRouter(prefix="/api/v1", tags=["Workspaces"])


@router.get("/workspaces")
async def list_workspaces(session: SessionDep, _user: CurrentUser) -> dict[str, Any]:
    rows = await workspaces.list_workspaces(session)
    items = [
        {
            "id": ws.id,
            "name": ws.name,
            "archived": False,
            "errorMessage": "",
            "immutable": ws.immutable,
            "numExperiments": n_experiments,
            "numProjects": n_projects,
            "pinned": False,
            "state": "WORKSPACE_STATE_UNSPECIFIED",
            "userId": ws.user_id or 0,
            "username": "",
        }
        for ws, n_projects, n_experiments in rows
    ]
    pagination = Pagination.of(0, 0, len(items), len(items))
    return {"workspaces": items, "pagination": pagination.model_dump(by_alias=True)}
