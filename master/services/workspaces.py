"""The default workspace and project that every template and experiment belongs to."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from master.db.models import ExperimentModel, ProjectModel, WorkspaceModel
from master.errors import NotFound

DEFAULT_WORKSPACE = "Uncategorized"  # Determined's name for the default workspace (id 1)
DEFAULT_PROJECT = "Uncategorized"


async def ensure_defaults(session: AsyncSession) -> None:
    ws = await session.scalar(
        select(WorkspaceModel).where(WorkspaceModel.name == DEFAULT_WORKSPACE)
    )
    if ws is None:
        ws = WorkspaceModel(name=DEFAULT_WORKSPACE, immutable=True)
        session.add(ws)
        await session.flush()
    project = await session.scalar(
        select(ProjectModel).where(
            ProjectModel.workspace_id == ws.id, ProjectModel.name == DEFAULT_PROJECT
        )
    )
    if project is None:
        session.add(ProjectModel(name=DEFAULT_PROJECT, workspace_id=ws.id, immutable=True))
        await session.flush()


async def default_workspace(session: AsyncSession) -> WorkspaceModel:
    ws = await session.scalar(
        select(WorkspaceModel).where(WorkspaceModel.name == DEFAULT_WORKSPACE)
    )
    if ws is None:
        raise NotFound("the default workspace is missing; restart the master to recreate it")
    return ws


async def resolve_workspace(session: AsyncSession, workspace_id: int | None) -> WorkspaceModel:
    """Determined's client sends workspaceId 0 (or nothing) for the default workspace."""
    if not workspace_id:
        return await default_workspace(session)
    ws = await session.get(WorkspaceModel, workspace_id)
    if ws is None:
        raise NotFound(f"workspace {workspace_id} not found")
    return ws


async def resolve_project(session: AsyncSession, project_id: int | None) -> ProjectModel:
    if not project_id:
        # One statement: every submit without a project comes here.
        project = await session.scalar(
            select(ProjectModel)
            .join(WorkspaceModel, WorkspaceModel.id == ProjectModel.workspace_id)
            .where(WorkspaceModel.name == DEFAULT_WORKSPACE, ProjectModel.name == DEFAULT_PROJECT)
        )
        if project is None:
            raise NotFound("the default project is missing; restart the master to recreate it")
    else:
        project = await session.get(ProjectModel, project_id)
    if project is None:
        raise NotFound(f"project {project_id} not found")
    return project


async def list_workspaces(session: AsyncSession) -> list[tuple[WorkspaceModel, int, int]]:
    """Every workspace with its number of projects and experiments."""
    workspaces = (await session.scalars(select(WorkspaceModel).order_by(WorkspaceModel.id))).all()
    result = []
    for ws in workspaces:
        n_projects = await session.scalar(
            select(func.count()).select_from(ProjectModel).where(ProjectModel.workspace_id == ws.id)
        )
        n_experiments = await session.scalar(
            select(func.count())
            .select_from(ExperimentModel)
            .join(ProjectModel, ExperimentModel.project_id == ProjectModel.id)
            .where(ProjectModel.workspace_id == ws.id)
        )
        result.append((ws, n_projects or 0, n_experiments or 0))
    return result
