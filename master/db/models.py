"""ORM classes: the master's whole schema. Migrations in migrations/ must match this module."""

from __future__ import annotations

import enum
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    SmallInteger,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    false,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

# One naming convention so constraint names are identical on SQLite and Postgres and
# Alembic can compare and drop them by name.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

JsonType = JSON().with_variant(JSONB(), "postgresql")
# Ids and counts are 32-bit in the database; larger numbers are a 400, never a 500.
MAX_INT = 2**31 - 1
_BIG_ID = BigInteger().with_variant(Integer(), "sqlite")  # SQLite autoincrements INTEGER only


class UTCDateTime(TypeDecorator[datetime]):
    """Stores UTC and always reads back tz-aware datetimes (SQLite keeps no zone)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def utcnow() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class ExperimentState(enum.StrEnum):
    """Determined's experiment states (wire names without the STATE_ prefix)."""

    ACTIVE = "ACTIVE"
    PAUSED = "PAUSED"
    STOPPING_COMPLETED = "STOPPING_COMPLETED"
    STOPPING_CANCELED = "STOPPING_CANCELED"
    STOPPING_KILLED = "STOPPING_KILLED"
    STOPPING_ERROR = "STOPPING_ERROR"
    COMPLETED = "COMPLETED"
    CANCELED = "CANCELED"
    ERROR = "ERROR"
    # `det experiment delete`: its checkpoints are being deleted; then its rows go.
    DELETING = "DELETING"

    @property
    def is_terminal(self) -> bool:
        return self in _TERMINAL_EXPERIMENT_STATES


_TERMINAL_EXPERIMENT_STATES = frozenset(
    {
        ExperimentState.COMPLETED,
        ExperimentState.CANCELED,
        ExperimentState.ERROR,
        ExperimentState.DELETING,
    }
)


class TrialState(enum.StrEnum):
    """Determined's trial states (wire names without the STATE_ prefix)."""

    QUEUED = "QUEUED"
    PAUSED = "PAUSED"
    PULLING = "PULLING"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    STOPPING_CANCELED = "STOPPING_CANCELED"
    STOPPING_KILLED = "STOPPING_KILLED"
    STOPPING_COMPLETED = "STOPPING_COMPLETED"
    STOPPING_ERROR = "STOPPING_ERROR"
    COMPLETED = "COMPLETED"
    CANCELED = "CANCELED"
    ERROR = "ERROR"

    @property
    def is_terminal(self) -> bool:
        return self in _TERMINAL_TRIAL_STATES

    @property
    def holds_resources(self) -> bool:
        """True while processes of the trial may run somewhere."""
        return self in _RUNNING_TRIAL_STATES


_TERMINAL_TRIAL_STATES = frozenset({TrialState.COMPLETED, TrialState.CANCELED, TrialState.ERROR})
_RUNNING_TRIAL_STATES = frozenset(
    {
        TrialState.PULLING,
        TrialState.STARTING,
        TrialState.RUNNING,
        TrialState.STOPPING_CANCELED,
        TrialState.STOPPING_KILLED,
        TrialState.STOPPING_COMPLETED,
        TrialState.STOPPING_ERROR,
    }
)


class UserModel(Base):
    __tablename__ = "users"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    username: Mapped[str] = mapped_column(String(128), unique=True)
    display_name: Mapped[str] = mapped_column(String(256), default="")
    # "pbkdf2_sha256$<iterations>$<salt hex>$<hash hex>" of the client-side hash (services.auth).
    password_hash: Mapped[str] = mapped_column(String(256))
    admin: Mapped[bool] = mapped_column(default=False)
    active: Mapped[bool] = mapped_column(default=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class UserSessionModel(Base):
    """A bearer token; only its SHA-256 is stored so a database leak exposes no token."""

    __tablename__ = "user_sessions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime())
    # A task token whose allocation ended: kept (until it expires) so that a report from
    # that earlier run is known for what it is, refused and counted.
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    # login (POST /auth/login), access (`det token create`) or task (a run's ranks).
    kind: Mapped[str] = mapped_column(String(16), default="login", server_default="login")
    description: Mapped[str] = mapped_column(String(256), default="", server_default="")
    # Task tokens only: the one trial whose routes the token opens.
    trial_id: Mapped[int | None] = mapped_column(Integer, nullable=True)

    user: Mapped[UserModel] = relationship(lazy="raise")


class MasterLeaseModel(Base):
    """The leader's lease when several masters share the database (master/services/
    leadership.py); times are the database's own clock."""

    __tablename__ = "master_leases"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    holder: Mapped[str] = mapped_column(String(64))
    epoch: Mapped[int] = mapped_column(BigInteger)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime())
    url: Mapped[str] = mapped_column(Text)


class WorkspaceModel(Base):
    __tablename__ = "workspaces"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(256), unique=True)
    # The owner: who may edit or delete it besides admins (NULL: the built-in one's).
    user_id: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="SET NULL"))
    immutable: Mapped[bool] = mapped_column(default=False)
    # No new projects or experiments go into an archived workspace; running ones go on.
    archived: Mapped[bool] = mapped_column(default=False, server_default=false())
    # Being deleted: its experiments' checkpoints go first, then its projects, then it
    # (master.services.workspaces.finish_deletions).
    deleting: Mapped[bool] = mapped_column(default=False, server_default=false())
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    # Where its submits that name no pool go (NULL: the master's default). Checked against
    # the pools it may use when set, and again at each submit, since bindings change.
    default_compute_pool: Mapped[str | None] = mapped_column(String(256))
    # The same for tasks that ask for no slots.
    default_aux_pool: Mapped[str | None] = mapped_column(String(256))
    # Where its experiments keep checkpoints when their config names no storage (NULL:
    # the master's default); master.services.workspace_storage.
    checkpoint_storage: Mapped[dict[str, Any] | None] = mapped_column(JsonType, nullable=True)


class PoolBindingModel(Base):
    """A resource pool bound to a workspace: a pool with any binding takes work only from
    the workspaces bound to it; a pool with none is shared by all. Pool names are the
    master config's, not a table's, so a binding may outlive its pool's removal from the
    config (it can still be unbound)."""

    __tablename__ = "pool_bindings"

    pool_name: Mapped[str] = mapped_column(String(256), primary_key=True)
    workspace_id: Mapped[int] = mapped_column(
        ForeignKey("workspaces.id", ondelete="CASCADE"), primary_key=True, index=True
    )
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class WorkspaceQuotaModel(Base):
    """Slots a workspace is guaranteed in a resource pool (its nominal quota), how many more
    it may borrow while others leave theirs idle, and how much of its own it lends. Set
    through the API; a row overrides the master config's quota for the same workspace and
    pool (master.services.quotas)."""

    __tablename__ = "workspace_quotas"

    workspace_id: Mapped[int] = mapped_column(
        ForeignKey("workspaces.id", ondelete="CASCADE"), primary_key=True
    )
    resource_pool: Mapped[str] = mapped_column(String(256), primary_key=True)
    nominal_slots: Mapped[int] = mapped_column(Integer)
    # NULL: no limit (borrow any idle slots; lend all of the nominal it does not use).
    borrowing_limit: Mapped[int | None] = mapped_column(Integer, nullable=True)
    lending_limit: Mapped[int | None] = mapped_column(Integer, nullable=True)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class FairShareUsageModel(Base):
    """Slot-seconds used in a pool by one job (an experiment; a task as -task id) of one
    user in one workspace, decayed to `as_of` with the master's fair_share half-life
    (master.core.fair_share). Written when an allocation ends; the scheduler sums them by
    user for its fair order, so the order survives a restart and a takeover."""

    __tablename__ = "fair_share_usage"

    resource_pool: Mapped[str] = mapped_column(String(256), primary_key=True)
    workspace_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    user_id: Mapped[int] = mapped_column(Integer, primary_key=True)  # 0: no owner
    job_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    slot_seconds: Mapped[float] = mapped_column(Float)
    as_of: Mapped[datetime] = mapped_column(UTCDateTime())


class WorkspacePinModel(Base):
    """A user's pinned workspaces (Determined's pins are each user's own)."""

    __tablename__ = "workspace_pins"

    workspace_id: Mapped[int] = mapped_column(
        ForeignKey("workspaces.id", ondelete="CASCADE"), primary_key=True
    )
    user_id: Mapped[int] = mapped_column(
        ForeignKey("users.id", ondelete="CASCADE"), primary_key=True
    )
    pinned_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class UserGroupModel(Base):
    """A named set of users (`det user-group`); roles may be given to a group."""

    __tablename__ = "user_groups"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(255), unique=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class UserGroupMemberModel(Base):
    """One user in one group; deleting either side deletes the row (foreign-key cascade)."""

    __tablename__ = "user_group_members"

    group_id: Mapped[int] = mapped_column(
        ForeignKey("user_groups.id", ondelete="CASCADE"), primary_key=True
    )
    # Indexed for "the groups this user is in" (`det user-group list --groups-user-belongs-to`).
    user_id: Mapped[int] = mapped_column(
        ForeignKey("users.id", ondelete="CASCADE"), primary_key=True, index=True
    )


_ROLE_SCOPE = {
    (holder, scope): f"{holder}_id IS NOT NULL AND workspace_id IS {neg}NULL"
    for holder in ("user", "group")
    for scope, neg in (("cluster", ""), ("workspace", "NOT "))
}


class RoleAssignmentModel(Base):
    """A role (master.core.roles) given to a user or to a group, in one workspace or (no
    workspace) across the cluster. ClusterAdmin given to a user is not a row: it is the
    user's admin flag (master.services.roles)."""

    __tablename__ = "role_assignments"
    __table_args__ = (
        CheckConstraint("(user_id IS NULL) <> (group_id IS NULL)", name="user_or_group"),
        # Each assignment at most once (two requests giving it at the same moment): one
        # partial index per kind of holder and scope, since NULLs never clash in a plain one.
        *(
            Index(
                f"uq_role_assignments_{holder}_{scope}",
                "role_id",
                *(["workspace_id"] if scope == "workspace" else []),
                f"{holder}_id",
                unique=True,
                sqlite_where=text(_ROLE_SCOPE[holder, scope]),
                postgresql_where=text(_ROLE_SCOPE[holder, scope]),
            )
            for holder in ("user", "group")
            for scope in ("cluster", "workspace")
        ),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    role_id: Mapped[int] = mapped_column(Integer)
    # NULL: the whole cluster.
    workspace_id: Mapped[int | None] = mapped_column(
        ForeignKey("workspaces.id", ondelete="CASCADE"), index=True
    )
    user_id: Mapped[int | None] = mapped_column(
        ForeignKey("users.id", ondelete="CASCADE"), index=True
    )
    group_id: Mapped[int | None] = mapped_column(
        ForeignKey("user_groups.id", ondelete="CASCADE"), index=True
    )
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class ProjectModel(Base):
    __tablename__ = "projects"
    # Project names are unique within their workspace, keys across the cluster.
    __table_args__ = (UniqueConstraint("workspace_id", "name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(256))
    workspace_id: Mapped[int] = mapped_column(ForeignKey("workspaces.id"), index=True)
    user_id: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="SET NULL"))
    immutable: Mapped[bool] = mapped_column(default=False)
    # Determined's project key, a short name for the project's runs (upper-case letters
    # and digits).
    key: Mapped[str] = mapped_column(String(16), unique=True)
    description: Mapped[str] = mapped_column(Text, default="", server_default="")
    # No new experiments go into an archived project; running ones go on.
    archived: Mapped[bool] = mapped_column(default=False, server_default=false())
    # Being deleted: it goes once its experiments have (finish_deletions).
    deleting: Mapped[bool] = mapped_column(default=False, server_default=false())
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class TemplateModel(Base):
    __tablename__ = "templates"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(256), unique=True)
    workspace_id: Mapped[int] = mapped_column(ForeignKey("workspaces.id"), index=True)
    config: Mapped[dict[str, Any]] = mapped_column(JsonType)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    # Who may change it besides admins; NULL for templates made before owners were kept.
    owner_id: Mapped[int | None] = mapped_column(
        ForeignKey("users.id", ondelete="SET NULL"), nullable=True
    )


class ExperimentModel(Base):
    __tablename__ = "experiments"
    # Where each is and whose: a list of what a user may read (master.services.access)
    # counts from the first index alone, and on SQLite pages through the second in id order.
    __table_args__ = (
        Index("ix_experiments_project_id_owner_id", "project_id", "owner_id"),
        Index("ix_experiments_id_project_id_owner_id", "id", "project_id", "owner_id"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(512))
    description: Mapped[str] = mapped_column(Text, default="")
    # Changed only by master.services.states.set_experiment_state.
    state: Mapped[str] = mapped_column(String(32), index=True)
    # The effective config: template merged, defaults filled, seed written in.
    config: Mapped[dict[str, Any]] = mapped_column(JsonType)
    # The user's YAML exactly as submitted, before the template merge.
    original_config: Mapped[str] = mapped_column(Text)
    template_name: Mapped[str | None] = mapped_column(String(256))
    # The template's config as it was at submit time; later edits never touch this row.
    template_config: Mapped[dict[str, Any] | None] = mapped_column(JsonType)
    experiment_seed: Mapped[int] = mapped_column(Integer)
    searcher_type: Mapped[str] = mapped_column(String(32))
    resource_pool: Mapped[str] = mapped_column(String(256), default="")
    # The job's scheduling priority (1..99, lower first); `det job update` changes it.
    priority: Mapped[int] = mapped_column(Integer, default=42)
    owner_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    project_id: Mapped[int] = mapped_column(ForeignKey("projects.id"), index=True)
    # The experiment this one was forked from (Determined's forked_from); forgotten, not
    # followed, when that one is deleted.
    parent_id: Mapped[int | None] = mapped_column(
        ForeignKey("experiments.id", ondelete="SET NULL"), index=True
    )
    job_id: Mapped[str] = mapped_column(String(64), unique=True)
    archived: Mapped[bool] = mapped_column(default=False)
    progress: Mapped[float | None] = mapped_column()
    start_time: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    end_time: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # Why its launch_layout is what it is ("4_distributed.py imports determined").
    launch_reason: Mapped[str] = mapped_column(Text, default="", server_default="")
    # ASHA searchers: where the experiment's generator is (MT19937 words and position), so
    # trials created after a master restart get the draws they would have got anyway.
    searcher_state: Mapped[dict[str, Any] | None] = mapped_column(JsonType)
    # The searcher metric's best finite validation value over the experiment's trials, kept
    # so the list can show and sort it without reading metrics. Only improved, by one
    # conditional UPDATE in master.services.trial_reports.record_best_metric.
    best_metric: Mapped[float | None] = mapped_column(Float)
    # Its labels, in the order they were added, each once (master.services.labels checks
    # them). The config's `labels` key mirrors this list, as Determined's config does.
    labels: Mapped[list[str]] = mapped_column(JsonType, default=list, server_default=text("'[]'"))

    owner: Mapped[UserModel] = relationship(lazy="raise")
    project: Mapped[ProjectModel] = relationship(lazy="raise")


class ModelDefinitionModel(Base):
    """The experiment's files as a tar.gz, kept apart so listing experiments never loads it."""

    __tablename__ = "model_definitions"

    experiment_id: Mapped[int] = mapped_column(
        ForeignKey("experiments.id", ondelete="CASCADE"), primary_key=True
    )
    archive: Mapped[bytes] = mapped_column(LargeBinary)
    size_bytes: Mapped[int] = mapped_column(Integer)
    file_count: Mapped[int] = mapped_column(Integer)


class TrialModel(Base):
    __tablename__ = "trials"
    __table_args__ = (
        Index("ix_trials_experiment_id_id", "experiment_id", "id"),
        # Request ids derive from the experiment seed, so two experiments may share them.
        UniqueConstraint("experiment_id", "request_id"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id", ondelete="CASCADE"))
    request_id: Mapped[str] = mapped_column(String(36))
    # Changed only by master.services.states.set_trial_state.
    state: Mapped[str] = mapped_column(String(32), index=True)
    hparams: Mapped[dict[str, Any]] = mapped_column(JsonType)
    seed: Mapped[int] = mapped_column(Integer)
    restarts: Mapped[int] = mapped_column(Integer, default=0)
    # Number of allocations made so far; allocation ids are "<trial id>.<run_id>".
    run_id: Mapped[int] = mapped_column(Integer, default=0)
    total_batches_processed: Mapped[int] = mapped_column(Integer, default=0)
    # What the trial's code last said about itself (POST .../progress, .../runner/metadata).
    progress: Mapped[float | None] = mapped_column(Float)
    runner_state: Mapped[str] = mapped_column(String(256), default="")
    start_time: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    end_time: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # Why it ended, where the state alone does not say (an invalid hyperparameter, an
    # interpreter without the `determined` package...); shown by describe and the UI.
    end_reason: Mapped[str] = mapped_column(Text, default="", server_default="")
    # What its code set with TrainContext.set_metadata (POST /api/v1/runs/{id}/metadata).
    run_metadata: Mapped[dict[str, Any] | None] = mapped_column(JsonType)
    # ASHA searchers only: the bracket, the next rung to reach, the rung the searcher
    # stopped it at, and how the searcher saw it close (stopped, completed, errored...).
    searcher_bracket: Mapped[int | None] = mapped_column(Integer)
    searcher_rung: Mapped[int | None] = mapped_column(Integer)
    searcher_stopped_rung: Mapped[int | None] = mapped_column(Integer)
    searcher_closed: Mapped[str | None] = mapped_column(String(16))


class SearcherRungEntryModel(Base):
    """A trial's value in one rung of an ASHA bracket: one row per (trial, rung), so a
    trial that keeps reporting after its stop can never enter a rung twice. `value` is
    normalised so smaller is better (+inf for a missing or NaN metric)."""

    __tablename__ = "searcher_rung_entries"
    __table_args__ = (
        Index("ix_searcher_rung_entries_rank", "experiment_id", "bracket", "rung", "value"),
    )

    trial_id: Mapped[int] = mapped_column(
        ForeignKey("trials.id", ondelete="CASCADE"), primary_key=True
    )
    rung: Mapped[int] = mapped_column(Integer, primary_key=True)
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id", ondelete="CASCADE"))
    bracket: Mapped[int] = mapped_column(Integer)
    value: Mapped[float] = mapped_column(Float)
    # The report's time (in the searcher's time_metric) and the metric as reported.
    time: Mapped[float] = mapped_column(Float)
    metric: Mapped[float | None] = mapped_column(Float)


class TrialMetricModel(Base):
    """One metrics report of a trial: a group ("training", "validation", ...) at a step.

    A trial that resumes from a checkpoint reports the steps after it again; the new report
    replaces the old one, so there is one row per (trial, group, steps) and a loss curve
    reads straight off the table.
    """

    __tablename__ = "trial_metrics"
    __table_args__ = (
        UniqueConstraint("trial_id", "group_name", "steps_completed"),
        # Every 2**L-th report of a trial's group, read without the others (core.thinning).
        Index("ix_trial_metrics_thinning", "trial_id", "group_name", "thinning_level"),
    )

    id: Mapped[int] = mapped_column(_BIG_ID, primary_key=True, autoincrement=True)
    trial_id: Mapped[int] = mapped_column(ForeignKey("trials.id", ondelete="CASCADE"))
    group_name: Mapped[str] = mapped_column(String(64))
    steps_completed: Mapped[int] = mapped_column(Integer)
    trial_run_id: Mapped[int] = mapped_column(Integer)
    # {name: number | "NaN" | "Infinity" | "-Infinity" | null}
    metrics: Mapped[dict[str, Any]] = mapped_column(JsonType)
    report_time: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    # The report's place among its trial's reports of this group (0 first) and the trailing
    # zero bits of that place (master.core.thinning), set when it is first written; a
    # report that replaces one of the same step keeps them. Rows written without them
    # (0, 0) are drawn only at full resolution.
    ordinal: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    thinning_level: Mapped[int] = mapped_column(SmallInteger, default=0, server_default="0")


class CheckpointModel(Base):
    """A checkpoint a trial wrote to its checkpoint storage and then reported."""

    __tablename__ = "checkpoints"
    __table_args__ = (Index("ix_checkpoints_trial_steps", "trial_id", "steps_completed"),)

    uuid: Mapped[str] = mapped_column(String(64), primary_key=True)
    trial_id: Mapped[int] = mapped_column(ForeignKey("trials.id", ondelete="CASCADE"))
    experiment_id: Mapped[int] = mapped_column(
        ForeignKey("experiments.id", ondelete="CASCADE"), index=True
    )
    task_id: Mapped[str] = mapped_column(String(64), default="")
    allocation_id: Mapped[str] = mapped_column(String(64), default="")
    trial_run_id: Mapped[int] = mapped_column(Integer, default=0)
    steps_completed: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(32), default="COMPLETED")
    # {relative path: size in bytes as a string}, as Determined's harness reports it.
    resources: Mapped[dict[str, Any]] = mapped_column(JsonType, default=dict)
    metadata_: Mapped[dict[str, Any]] = mapped_column("metadata", JsonType, default=dict)
    # Where the files are: a directory, or s3://bucket/prefix/uuid and the like.
    storage_path: Mapped[str] = mapped_column(Text, default="")
    report_time: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    # Deletion (master.services.checkpoint_gc): `state` goes COMPLETED -> DELETING ->
    # DELETED, or PARTIALLY_DELETED while some files are gone and others not yet; the
    # store's last error is the reason, and the deleter retries at delete_next_at.
    state_reason: Mapped[str] = mapped_column(Text, default="", server_default="")
    delete_attempts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    delete_next_at: Mapped[datetime | None] = mapped_column(
        UTCDateTime(), nullable=True, index=True
    )


class ClusterMessageModel(Base):
    """A banner admins set for every user (Determined's cluster message). Only the newest
    row counts; setting or clearing one ends the others (end_time = now), so the table is
    also the history of what was said."""

    __tablename__ = "cluster_messages"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    message: Mapped[str] = mapped_column(Text)
    start_time: Mapped[datetime] = mapped_column(UTCDateTime())
    end_time: Mapped[datetime | None] = mapped_column(UTCDateTime())
    created_time: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    created_by: Mapped[int | None] = mapped_column(
        ForeignKey("users.id", ondelete="SET NULL"), nullable=True
    )


# "ModelModel" is the ORM naming rule applied to Determined's registry "model".
class ModelModel(Base):
    """A model in the registry: a named home for checkpoints a user chose to keep."""

    __tablename__ = "models"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(255), unique=True)
    description: Mapped[str] = mapped_column(Text, default="")
    notes: Mapped[str] = mapped_column(Text, default="")
    labels: Mapped[list[str]] = mapped_column(JsonType, default=list)
    metadata_: Mapped[dict[str, Any]] = mapped_column("metadata", JsonType, default=dict)
    archived: Mapped[bool] = mapped_column(default=False)
    workspace_id: Mapped[int] = mapped_column(ForeignKey("workspaces.id"), index=True)
    # Who may change it besides admins; NULL once that user is gone.
    owner_id: Mapped[int | None] = mapped_column(
        ForeignKey("users.id", ondelete="SET NULL"), nullable=True
    )
    creation_time: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    last_updated_time: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class ModelVersionModel(Base):
    """A version of a model: one checkpoint, numbered 1, 2, ... within its model. While it
    exists its checkpoint is neither deleted by retention nor by a user (checkpoint_gc)."""

    __tablename__ = "model_versions"
    __table_args__ = (UniqueConstraint("model_id", "version"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    model_id: Mapped[int] = mapped_column(ForeignKey("models.id", ondelete="CASCADE"))
    version: Mapped[int] = mapped_column(Integer)
    # RESTRICT: a checkpoint row cannot go while a version holds it.
    checkpoint_uuid: Mapped[str] = mapped_column(
        ForeignKey("checkpoints.uuid", ondelete="RESTRICT"), index=True
    )
    name: Mapped[str] = mapped_column(String(255), default="")
    comment: Mapped[str] = mapped_column(Text, default="")
    notes: Mapped[str] = mapped_column(Text, default="")
    labels: Mapped[list[str]] = mapped_column(JsonType, default=list)
    metadata_: Mapped[dict[str, Any]] = mapped_column("metadata", JsonType, default=dict)
    owner_id: Mapped[int | None] = mapped_column(
        ForeignKey("users.id", ondelete="SET NULL"), nullable=True
    )
    creation_time: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    last_updated_time: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class TrialSourceModel(Base):
    """A trial that used a checkpoint, or a model version's checkpoint (Determined's
    trial_source_infos, reported by `core_context.experimental.report_task_using_...`): the
    metrics that trial reports are the checkpoint's and the version's inference metrics."""

    __tablename__ = "trial_source_infos"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    trial_id: Mapped[int] = mapped_column(ForeignKey("trials.id", ondelete="CASCADE"), index=True)
    checkpoint_uuid: Mapped[str] = mapped_column(
        ForeignKey("checkpoints.uuid", ondelete="CASCADE"), index=True
    )
    # SET NULL: a deleted version leaves the link to its checkpoint.
    model_version_id: Mapped[int | None] = mapped_column(
        ForeignKey("model_versions.id", ondelete="SET NULL"), nullable=True, index=True
    )
    kind: Mapped[str] = mapped_column(String(32))  # INFERENCE or FINE_TUNING
    created_time: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class StateChangeModel(Base):
    """Audit trail of every experiment and trial state change."""

    __tablename__ = "state_changes"
    __table_args__ = (Index("ix_state_changes_entity", "entity", "entity_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    entity: Mapped[str] = mapped_column(String(32))
    entity_id: Mapped[int] = mapped_column(Integer)
    from_state: Mapped[str | None] = mapped_column(String(32))
    to_state: Mapped[str] = mapped_column(String(32))
    reason: Mapped[str] = mapped_column(Text, default="")
    at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class AllocationState(enum.StrEnum):
    """Determined's allocation states; PENDING waits in the queue, TERMINATED is final."""

    PENDING = "PENDING"
    ASSIGNED = "ASSIGNED"
    PULLING = "PULLING"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    TERMINATING = "TERMINATING"
    TERMINATED = "TERMINATED"


class AgentModel(Base):
    """A machine that runs ranks. Its slots are in SlotModel."""

    __tablename__ = "agents"

    id: Mapped[str] = mapped_column(String(256), primary_key=True)
    resource_pool: Mapped[str] = mapped_column(String(256), index=True)
    enabled: Mapped[bool] = mapped_column(default=True)
    # Finish running work, take nothing new (disable --drain).
    draining: Mapped[bool] = mapped_column(default=False)
    connected: Mapped[bool] = mapped_column(default=True)
    version: Mapped[str] = mapped_column(String(64), default="")
    hostname: Mapped[str] = mapped_column(String(256), default="")
    addresses: Mapped[list[str]] = mapped_column(JsonType, default=list)
    # [{"name": "eth0", "ipv4": ["10.0.0.5"]}, ...] as the agent reported them; the
    # launcher picks the gang's dtrain network interface from these.
    interfaces: Mapped[list[dict[str, Any]]] = mapped_column(JsonType, default=list)
    registered_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    last_seen_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    # SHA-256 of the secret this agent got when it first joined with the join token; every
    # later connection must show that secret. NULL: not enrolled yet.
    credential_hash: Mapped[str | None] = mapped_column(String(64), nullable=True)
    # Set once the agent shows that secret back (it has it): until then a Welcome lost on
    # the way must not lock the id out, so the join token enrolls it again.
    credential_confirmed: Mapped[bool] = mapped_column(default=False, server_default=false())
    # `det agent revoke`: the id can no longer connect.
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)


class SlotModel(Base):
    __tablename__ = "slots"

    agent_id: Mapped[str] = mapped_column(
        ForeignKey("agents.id", ondelete="CASCADE"), primary_key=True
    )
    slot_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    device_type: Mapped[str] = mapped_column(String(16))  # cpu | cuda | rocm
    brand: Mapped[str] = mapped_column(String(256), default="")
    uuid: Mapped[str] = mapped_column(String(256), default="")
    memory_bytes: Mapped[int | None] = mapped_column(
        Integer().with_variant(BigInteger(), "postgresql")
    )
    enabled: Mapped[bool] = mapped_column(default=True)


class TaskType(enum.StrEnum):
    """Determined's task types that are not trials (DET_TASK_TYPE)."""

    COMMAND = "COMMAND"
    NOTEBOOK = "NOTEBOOK"
    SHELL = "SHELL"
    TENSORBOARD = "TENSORBOARD"


class TaskModel(Base):
    """A command, notebook, shell or TensorBoard: one allocation, never run twice.

    Its state is its allocation's; what it ended with is kept here."""

    __tablename__ = "tasks"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    # The public id (Determined's command ids are UUIDs): `det cmd logs`, /proxy/<uuid>/.
    uuid: Mapped[str] = mapped_column(String(64), unique=True)
    type: Mapped[str] = mapped_column(String(16), index=True)
    description: Mapped[str] = mapped_column(Text, default="")
    owner_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    workspace_id: Mapped[int] = mapped_column(ForeignKey("workspaces.id"))
    # The effective config: template merged, defaults filled.
    config: Mapped[dict[str, Any]] = mapped_column(JsonType)
    template_name: Mapped[str | None] = mapped_column(String(256))
    resource_pool: Mapped[str] = mapped_column(String(256), default="")
    priority: Mapped[int] = mapped_column(Integer, default=42)
    # TensorBoard: the experiments it shows.
    experiment_ids: Mapped[list[int]] = mapped_column(JsonType, default=list)
    # TensorBoard: single trials it shows besides whole experiments (det tensorboard start -t).
    trial_ids: Mapped[list[int]] = mapped_column(JsonType, default=list)
    # Handed to the task's server (Jupyter's token, the shell server's); the proxy adds it
    # to every request it forwards, so nothing else on the agents' network gets in.
    secret: Mapped[str] = mapped_column(String(128))
    idle_timeout_s: Mapped[float | None] = mapped_column(Float)
    # Traffic through the proxy (or the task's own report of activity) moves this on.
    last_activity_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    exit_code: Mapped[int | None] = mapped_column(Integer)
    end_reason: Mapped[str] = mapped_column(Text, default="")


class TaskContextModel(Base):
    """A command's or shell's context directory (`det cmd run -c DIR`) as a tar.gz, packed
    like a model definition and unpacked into its working directory; kept apart so listing
    tasks never loads it."""

    __tablename__ = "task_contexts"

    task_id: Mapped[int] = mapped_column(
        ForeignKey("tasks.id", ondelete="CASCADE"), primary_key=True
    )
    archive: Mapped[bytes] = mapped_column(LargeBinary)
    size_bytes: Mapped[int] = mapped_column(Integer)
    file_count: Mapped[int] = mapped_column(Integer)


class AllocationModel(Base):
    """One attempt to run a trial, or a task's one run: waits PENDING with a reason, then
    holds its slots. Exactly one of trial_id and task_id is set."""

    __tablename__ = "allocations"
    __table_args__ = (
        Index("ix_allocations_state_pool", "state", "resource_pool"),
        # The fair-share accounting reads what ended since it last looked.
        Index("ix_allocations_ended_at", "ended_at"),
    )

    # "<trial id>.<run>", or "<task uuid>.1"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    trial_id: Mapped[int | None] = mapped_column(
        ForeignKey("trials.id", ondelete="CASCADE"), index=True
    )
    experiment_id: Mapped[int | None] = mapped_column(
        ForeignKey("experiments.id", ondelete="CASCADE"), index=True
    )
    task_id: Mapped[int | None] = mapped_column(
        ForeignKey("tasks.id", ondelete="CASCADE"), index=True
    )
    # Changed only by master.services.allocations.
    state: Mapped[str] = mapped_column(String(16))
    resource_pool: Mapped[str] = mapped_column(String(256))
    slots_needed: Mapped[int] = mapped_column(Integer)
    single_node: Mapped[bool] = mapped_column(default=False)
    registered_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    assigned_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # Why it waits, kept current by every scheduling pass (code machine-readable).
    pending_code: Mapped[str] = mapped_column(String(64), default="")
    pending_reason: Mapped[str] = mapped_column(Text, default="")
    blocking_job: Mapped[int | None] = mapped_column(Integer)
    # Set when the scheduler wants the holder to stop gracefully (preemption).
    preempt_requested: Mapped[bool] = mapped_column(default=False)
    # Trial code acknowledged the preemption signal: an exit 0 then means "stopped for
    # preemption", not "finished" (Determined's rule).
    preempt_acked: Mapped[bool] = mapped_column(default=False, server_default=false())
    # Zero-slot allocations hold a place on an agent but no slot.
    zero_slot_agent_id: Mapped[str | None] = mapped_column(
        ForeignKey("agents.id", ondelete="SET NULL"), index=True
    )
    exit_reason: Mapped[str] = mapped_column(Text, default="")
    # Chosen at launch (master.services.launcher): the gang's rendezvous.
    network_interface: Mapped[str] = mapped_column(String(64), default="")
    chief_address: Mapped[str] = mapped_column(String(64), default="")
    master_port: Mapped[int | None] = mapped_column(Integer)
    # The login session behind the ranks' DET_SESSION_TOKEN; deleted when the allocation
    # ends, so a token left in a finished job's environment opens nothing.
    task_session_id: Mapped[int | None] = mapped_column(
        ForeignKey("user_sessions.id", ondelete="SET NULL")
    )


class AllocationSlotModel(Base):
    """Slots held right now. The primary key makes giving a slot twice impossible, even
    across a crash: a pass that tried would fail to commit as a whole."""

    __tablename__ = "allocation_slots"

    agent_id: Mapped[str] = mapped_column(
        ForeignKey("agents.id", ondelete="CASCADE"), primary_key=True
    )
    slot_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    allocation_id: Mapped[str] = mapped_column(
        ForeignKey("allocations.id", ondelete="CASCADE"), index=True
    )


class SchedulerStateModel(Base):
    """One row. `epoch` grows with every committed change the scheduler must look at, so
    a periodic pass can tell from one small read that nothing changed and skip the work."""

    __tablename__ = "scheduler_state"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    epoch: Mapped[int] = mapped_column(Integer().with_variant(BigInteger(), "postgresql"))
    # Allocations that ended up to this time have their usage in fair_share_usage
    # (master.services.usage); NULL: none accounted yet.
    usage_accounted_until: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)


class AccessStateModel(Base):
    """One row. `generation` changes (by triggers in the database, migration 0031) with
    every write to what decides who reads which workspace: role assignments, group
    memberships and groups, workspaces' owners. A master keeps each user's readable
    workspaces in memory for as long as the generation it read with them is current, so
    a change made by any master, standby or tool is seen on the next request."""

    __tablename__ = "access_state"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    generation: Mapped[int] = mapped_column(Integer().with_variant(BigInteger(), "postgresql"))


class AgentMetricModel(Base):
    """One system-metrics sample of one agent; trimmed by the retention loop."""

    __tablename__ = "agent_metrics"
    __table_args__ = (Index("ix_agent_metrics_agent_time", "agent_id", "unix_millis"),)

    id: Mapped[int] = mapped_column(_BIG_ID, primary_key=True, autoincrement=True)
    agent_id: Mapped[str] = mapped_column(String(256))
    unix_millis: Mapped[int] = mapped_column(BigInteger, index=True)
    cpu_util_simple: Mapped[float] = mapped_column(Float)
    memory_free: Mapped[int] = mapped_column(BigInteger)
    memory_used: Mapped[int] = mapped_column(BigInteger)
    disk_throughput_read: Mapped[float] = mapped_column(Float)
    disk_throughput_write: Mapped[float] = mapped_column(Float)
    disk_iops: Mapped[float] = mapped_column(Float)
    net_throughput_sent: Mapped[float] = mapped_column(Float)
    net_throughput_recv: Mapped[float] = mapped_column(Float)
    # [{"index", "uuid", "gpu_util", "gpu_memory_used", "gpu_free_memory", "temperature_c",
    #   "power_w"}], empty on CPU-only agents.
    gpus: Mapped[list[dict[str, Any]]] = mapped_column(JsonType, default=list)


class TaskLogModel(Base):
    """One line a rank (or the agent, about a rank) wrote; `id` orders a task's lines."""

    __tablename__ = "task_logs"
    __table_args__ = (
        Index("ix_task_logs_trial", "trial_id", "id"),
        Index("ix_task_logs_task", "task_id", "id"),
    )

    id: Mapped[int] = mapped_column(_BIG_ID, primary_key=True, autoincrement=True)
    task_id: Mapped[str] = mapped_column(String(64))
    trial_id: Mapped[int | None] = mapped_column(Integer)
    allocation_id: Mapped[str] = mapped_column(String(64))
    agent_id: Mapped[str] = mapped_column(String(256), default="")
    rank: Mapped[int | None] = mapped_column(Integer)
    stdtype: Mapped[str] = mapped_column(String(16), default="stdout")
    level: Mapped[str] = mapped_column(String(32), default="LOG_LEVEL_INFO")
    timestamp: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    message: Mapped[str] = mapped_column(Text)


class WebhookModel(Base):
    """Where to tell someone about events (Determined's webhooks): a URL, a payload format
    (DEFAULT JSON or SLACK), a workspace it is limited to (NULL: every workspace), and a
    mode (WORKSPACE: every experiment in scope; SPECIFIC: those whose config names it)."""

    __tablename__ = "webhooks"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(255))
    url: Mapped[str] = mapped_column(Text)
    webhook_type: Mapped[str] = mapped_column(String(16))
    mode: Mapped[str] = mapped_column(String(16))
    workspace_id: Mapped[int | None] = mapped_column(
        ForeignKey("workspaces.id", ondelete="CASCADE"), index=True
    )
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class WebhookTriggerModel(Base):
    """One thing a webhook fires on: EXPERIMENT_STATE_CHANGE {state}, TASK_LOG {regex},
    CUSTOM {} or METRIC_THRESHOLD_EXCEEDED (accepted, as Determined accepts it, and never
    fired, as there)."""

    __tablename__ = "webhook_triggers"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    webhook_id: Mapped[int] = mapped_column(
        ForeignKey("webhooks.id", ondelete="CASCADE"), index=True
    )
    trigger_type: Mapped[str] = mapped_column(String(32))
    condition: Mapped[dict[str, Any]] = mapped_column(JsonType, default=dict)


class WebhookOutboxModel(Base):
    """Something happened that webhooks may want to hear about, written in the transaction
    that made it happen; the leader's shipper turns each row into deliveries and deletes it
    (master/services/webhooks.py). kind: state (experiment_id, data.state), task_log
    (task_id, data: trigger_id, line, node) or custom (experiment_id, trial_id, data)."""

    __tablename__ = "webhook_outbox"

    id: Mapped[int] = mapped_column(_BIG_ID, primary_key=True, autoincrement=True)
    kind: Mapped[str] = mapped_column(String(16))
    experiment_id: Mapped[int | None] = mapped_column(Integer)
    trial_id: Mapped[int | None] = mapped_column(Integer)
    task_id: Mapped[str | None] = mapped_column(String(64))
    data: Mapped[dict[str, Any]] = mapped_column(JsonType, default=dict)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class WebhookEventModel(Base):
    """One delivery to make: its payload is fixed when queued, so a retry sends the same
    bytes and the same event_id (the receiver's key to drop a second copy)."""

    __tablename__ = "webhook_events"

    id: Mapped[int] = mapped_column(_BIG_ID, primary_key=True, autoincrement=True)
    event_id: Mapped[str] = mapped_column(String(36), unique=True)
    webhook_id: Mapped[int] = mapped_column(
        ForeignKey("webhooks.id", ondelete="CASCADE"), index=True
    )
    url: Mapped[str] = mapped_column(Text)
    payload: Mapped[str] = mapped_column(Text)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, index=True)
    last_error: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class WebhookLogMatchModel(Base):
    """A TASK_LOG trigger fires once per task, as Determined's does: the first matching
    line is remembered here."""

    __tablename__ = "webhook_log_matches"

    task_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    trigger_id: Mapped[int] = mapped_column(
        ForeignKey("webhook_triggers.id", ondelete="CASCADE"), primary_key=True
    )
