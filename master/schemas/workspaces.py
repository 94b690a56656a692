"""Determined's workspace and project messages (v1Workspace, v1Project and their requests)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import Field

from master.schemas.common import DbInt, Pagination, WireInput, WireModel
from master.services.workspaces import ProjectView, WorkspaceView
from resolute.storage import mask_secrets

# Determined's v1WorkspaceState (its projects use it too).
NOT_DELETING = "WORKSPACE_STATE_UNSPECIFIED"
DELETING = "WORKSPACE_STATE_DELETING"


class Workspace(WireModel):
    """v1Workspace; every key the official client requires is sent."""

    id: int
    name: str
    archived: bool
    error_message: str = ""
    immutable: bool
    num_experiments: int
    num_projects: int
    pinned: bool
    state: str = NOT_DELETING
    user_id: int
    username: str
    pinned_at: datetime | None = None
    checkpoint_storage_config: dict[str, Any] | None = None
    # "" for none, as Determined sends its unset strings.
    default_compute_pool: str = ""
    default_aux_pool: str = ""

    @classmethod
    def of(cls, view: WorkspaceView) -> Workspace:
        ws = view.workspace
        return cls(
            id=ws.id,
            name=ws.name,
            archived=ws.archived,
            immutable=ws.immutable,
            num_experiments=view.num_experiments,
            num_projects=view.num_projects,
            pinned=view.pinned_at is not None,
            state=DELETING if ws.deleting else NOT_DELETING,
            user_id=ws.user_id or 0,
            username=view.username,
            pinned_at=view.pinned_at,
            checkpoint_storage_config=(
                mask_secrets(ws.checkpoint_storage) if ws.checkpoint_storage else None
            ),
            default_compute_pool=ws.default_compute_pool or "",
            default_aux_pool=ws.default_aux_pool or "",
        )


class WorkspaceResponse(WireModel):
    workspace: Workspace


class WorkspaceCreated(WireModel):
    """v1PostWorkspaceResponse. The official client iterates namespaceBindings after a
    create, so an empty mapping is sent (resolute binds no Kubernetes namespaces)."""

    workspace: Workspace
    namespace_bindings: dict[str, Any] = Field(default_factory=dict)


class WorkspaceList(WireModel):
    workspaces: list[Workspace]
    pagination: Pagination


class Project(WireModel):
    """v1Project; every key the official client requires is sent."""

    id: int
    name: str
    key: str
    description: str
    archived: bool
    error_message: str = ""
    immutable: bool
    notes: list[Any] = Field(default_factory=list)
    num_active_experiments: int
    num_experiments: int
    num_runs: int
    state: str = NOT_DELETING
    user_id: int
    username: str
    workspace_id: int
    workspace_name: str
    last_experiment_started_at: datetime | None = None

    @classmethod
    def of(cls, view: ProjectView) -> Project:
        project = view.project
        return cls(
            id=project.id,
            name=project.name,
            key=project.key,
            description=project.description,
            archived=project.archived,
            immutable=project.immutable,
            state=DELETING if project.deleting else NOT_DELETING,
            num_active_experiments=view.num_active_experiments,
            num_experiments=view.num_experiments,
            # A run is a trial in Determined's later model; experiments are what we count.
            num_runs=view.num_experiments,
            user_id=project.user_id or 0,
            username=view.username,
            workspace_id=project.workspace_id,
            workspace_name=view.workspace_name,
            last_experiment_started_at=view.last_experiment_started_at,
        )


class ProjectResponse(WireModel):
    project: Project


class ProjectList(WireModel):
    projects: list[Project]
    pagination: Pagination


class DeleteResponse(WireModel):
    """v1DeleteWorkspaceResponse and v1DeleteProjectResponse: completed is false while
    experiments' checkpoints are still being deleted; the client then polls until a GET
    answers 404."""

    completed: bool


class WorkspaceCreate(WireInput):
    """v1PostWorkspaceRequest. The agent user and namespace keys are Determined's; the
    route refuses them while resolute does not apply them. clusterQuotaPairs sets the
    nominal quota in its default compute pool (master.services.quotas)."""

    name: Any = None
    agent_user_group: Any = None
    checkpoint_storage_config: Any = None
    default_compute_pool: Any = None
    default_aux_pool: Any = None
    cluster_namespace_meta: Any = None
    cluster_quota_pairs: Any = None


class WorkspacePatch(WireInput):
    """v1PatchWorkspace. Determined's client sets the pools with the *ResourcePool keys;
    the older two are taken when those are absent."""

    name: Any = None
    agent_user_group: Any = None
    checkpoint_storage_config: Any = None
    default_compute_pool: Any = None
    default_compute_resource_pool: Any = None
    default_aux_pool: Any = None
    default_aux_resource_pool: Any = None
    cluster_namespace_meta: Any = None


class ProjectCreate(WireInput):
    """v1PostProjectRequest."""

    name: Any = None
    workspace_id: DbInt | None = None
    description: Any = None
    key: Any = None


class ProjectPatch(WireInput):
    """v1PatchProject."""

    name: Any = None
    description: Any = None
    key: Any = None


class ProjectMove(WireInput):
    """v1MoveProjectRequest."""

    destination_workspace_id: DbInt | None = None
    project_id: DbInt | None = None


class ExperimentMove(WireInput):
    """v1MoveExperimentRequest."""

    destination_project_id: DbInt | None = None
    experiment_id: DbInt | None = None


class PoolBindings(WireInput):
    """v1BindRPToWorkspaceRequest, v1UnbindRPFromWorkspaceRequest and
    v1OverwriteRPWorkspaceBindingsRequest: the pool is the path's; the body may repeat it."""

    resource_pool_name: Any = None
    workspace_ids: list[DbInt] | None = None
    workspace_names: list[Any] | None = None


class WorkspacesBoundToPool(WireModel):
    """v1ListWorkspacesBoundToRPResponse."""

    workspace_ids: list[int]
    pagination: Pagination


class PoolsAvailableToWorkspace(WireModel):
    """v1ListRPsBoundToWorkspaceResponse."""

    resource_pools: list[str]
    pagination: Pagination
