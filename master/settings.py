"""Master settings: an optional YAML file first, then `DET_MASTER_*` environment variables."""

from __future__ import annotations

import logging
import ssl
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from master.core.durations import parse_duration
from resolute._yaml_settings import YamlFileSource, absolute_path

log = logging.getLogger(__name__)

CONFIG_FILE_ENV = "DET_MASTER_CONFIG_FILE"


class DatabaseSettings(BaseModel):
    url: str = Field(
        default="",
        description=(
            "SQLAlchemy URL. Empty means embedded SQLite at <data_dir>/resolute.db. "
            "Postgres: postgresql://user@host:5432/db (the asyncpg driver is chosen for you)."
        ),
    )
    echo: bool = Field(default=False, description="Log every SQL statement (debugging only).")


class TlsSettings(BaseModel):
    """The master's certificate: with it the HTTP API and the agent port both speak TLS."""

    cert_file: Path | None = Field(
        default=None,
        description=(
            "PEM certificate (with its chain) the master presents on the HTTP API and the agent "
            "port; set key_file with it. `det-master certs` makes one with its own CA."
        ),
    )
    key_file: Path | None = Field(
        default=None, description="The unencrypted PEM private key of cert_file."
    )

    @property
    def enabled(self) -> bool:
        return self.cert_file is not None

    @field_validator("cert_file", "key_file", mode="before")
    @classmethod
    def _absolute(cls, value: object) -> object:
        return absolute_path(value)

    @field_validator("cert_file", "key_file")
    @classmethod
    def _readable_pem(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        if value is None:
            return None
        try:
            data = value.read_bytes()
        except OSError as exc:
            raise ValueError(f"cannot read {value}: {exc.strerror}") from None
        if info.field_name == "cert_file" and b"-----BEGIN CERTIFICATE-----" not in data:
            raise ValueError(f"no PEM certificate in {value}")
        if info.field_name == "key_file":
            if b"PRIVATE KEY-----" not in data:
                raise ValueError(f"no PEM private key in {value}")
            if b"ENCRYPTED" in data:
                raise ValueError(f"the key in {value} is encrypted; give it unencrypted")
        return value

    @model_validator(mode="after")
    def _a_readable_pair(self) -> TlsSettings:
        # Checked here, so a bad file stops the master at start with the setting's name,
        # not later inside uvicorn or gRPC with a traceback.
        if (self.cert_file is None) != (self.key_file is None):
            given, missing = (
                ("cert_file", "key_file") if self.key_file is None else ("key_file", "cert_file")
            )
            raise ValueError(f"{missing} is not set: {given} is, and TLS needs both")
        if self.cert_file is None or self.key_file is None:
            return self
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        try:
            # A callable password: OpenSSL would otherwise prompt on the terminal.
            context.load_cert_chain(self.cert_file, self.key_file, password=_no_password)
        except (ssl.SSLError, ValueError) as exc:
            reason = getattr(exc, "reason", None) or str(exc)
            raise ValueError(
                f"cert_file {self.cert_file} and key_file {self.key_file} are not a "
                f"certificate and its key: {reason}"
            ) from None
        return self


def _no_password() -> str:
    raise ValueError("the key asks for a password")


class AuthzSettings(BaseModel):
    type: Literal["rbac", "basic"] = Field(
        default="rbac",
        description=(
            "Who reads what. `rbac`: workspaces are kept apart; a user sees what is in the "
            "workspaces they own or hold a role in (Viewer and up), the shared Uncategorized "
            "workspace, and their own work; anything else answers 404 as if it did not "
            "exist, and lists leave it out. `basic` (Determined's open-source rule): every "
            "signed-in user reads everything. Changing things follows the roles either way."
        ),
    )
    rbac_ui_enabled: bool = Field(
        default=False,
        description=(
            "Tell Determined's official client that RBAC is on (`rbacEnabled` in "
            "GET /api/v1/master), the switch its `det user-group` and `det rbac` verbs need. "
            "Its cost: that client's `det user list` then leaves out the Admin column. Access "
            "rules do not change; roles apply and our own `det` serves user groups and roles "
            "either way."
        ),
    )


class SecuritySettings(BaseModel):
    initial_user_password: str = Field(
        default="",
        description=(
            "Password given to the default users `admin` and `determined` when they are first "
            "created. Empty, as Determined ships; set it for any shared cluster."
        ),
    )
    token_ttl_hours: int = Field(default=24 * 7, ge=1, description="Lifetime of a login token.")
    allow_empty_passwords: bool = Field(
        default=False,
        description=(
            "Start on a non-loopback address although a default user (admin, determined) "
            "still has an empty password. Without it the master refuses to start there."
        ),
    )
    login_max_failures: int = Field(
        default=10,
        ge=1,
        le=10_000,
        description="Failed logins per user name and per client address within "
        "login_window_s before further logins from there get 429.",
    )
    login_window_s: float = Field(
        default=60.0, gt=0, le=86_400, description="The window of login_max_failures."
    )
    metrics_token: str = Field(
        default="",
        description=(
            "Bearer token Prometheus sends to /metrics (checked without the database, so "
            "metrics are served during an outage). Empty: /metrics takes any user's token."
        ),
    )
    authz: AuthzSettings = Field(
        default_factory=AuthzSettings,
        description="Determined's `security.authz` section: who reads what, and its RBAC switch.",
    )
    tls: TlsSettings = Field(
        default_factory=TlsSettings,
        description="TLS on both ports. Unset: plain HTTP and gRPC, for localhost development.",
    )


class SchedulerSettings(BaseModel):
    type: Literal["priority"] = Field(
        default="priority", description="Only Determined's default scheduler is offered."
    )
    fitting_policy: Literal["best", "worst"] = Field(
        default="best", description="best packs agents; worst spreads trials out."
    )
    preemption: bool = Field(
        default=False, description="Stop lower-priority trials for a waiting head of the queue."
    )
    default_priority: int = Field(default=42, ge=1, le=99, description="For jobs that set none.")


def _key_values(items: list[str]) -> list[str]:
    for item in items:
        if "=" not in item or item.startswith("="):
            raise ValueError(f"{item!r} is not KEY=VALUE")
    return items


class TaskContainerDefaults(BaseModel):
    # Determined's master.yaml has more keys here (shm_size_bytes, bind_mounts, devices,
    # network_mode, the pod specs, ...): kept, so such a file starts, and named at start as
    # not applied (MasterSettings.unapplied_container_defaults), not dropped unsaid.
    model_config = ConfigDict(extra="allow")

    image: str | dict[str, str] | None = Field(
        default=None,
        description=(
            "The image of work whose config names none (Determined's key): one name, or one "
            "per slot type ({cpu: ..., cuda: ...}). Written into the config at submit, so "
            "the experiment keeps saying where it ran if the default changes."
        ),
    )
    registry_auth: dict[str, str] | None = Field(
        default=None,
        description=(
            "Credentials for pulls whose config gives none (Docker's AuthConfig keys: "
            "username, password, serveraddress, ...), offered only to the registry "
            "serveraddress names (required). Applied at launch, never stored in an "
            "experiment's config."
        ),
    )
    force_pull_image: bool = Field(
        default=False, description="Pull the default image at every start, as the config's key."
    )
    dtrain_network_interface: str | None = Field(
        default=None,
        description=(
            "Interface for NCCL/Gloo between agents (NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME). "
            "Unset: chosen per gang by the rule in docs/agents.md. An experiment may override it "
            "with environment.dtrain_network_interface."
        ),
    )
    environment_variables: (
        Annotated[list[str], AfterValidator(_key_values)]
        | dict[
            Literal["cpu", "cuda", "rocm", "gpu"],
            Annotated[list[str], AfterValidator(_key_values)],
        ]
    ) = Field(
        default_factory=list,
        description=(
            "KEY=VALUE for every trial's processes, beneath the experiment's own "
            "environment.environment_variables (Determined's key): a list, or one list per "
            "device type (cpu, cuda). `PATH=/opt/det/bin:/usr/bin:/bin` chooses the `python3` "
            "entrypoints run, as a custom image would."
        ),
    )

    @model_validator(mode="after")
    def _valid_image(self) -> TaskContainerDefaults:
        # The checks an experiment's own environment.image and registry_auth pass at submit.
        from master.core import expconf

        given = {"image": self.image, "registry_auth": self.registry_auth}
        problems = expconf.environment_problems({k: v for k, v in given.items() if v})
        if self.registry_auth and not self.registry_auth.get("serveraddress"):
            # Without it the pull would offer the credentials to whatever registry a
            # user's image names.
            problems.append(
                "registry_auth.serveraddress: required here: the master's credentials go "
                "only to the registry it names"
            )
        if problems:
            raise ValueError("; ".join(problems))
        return self


class WorkspaceQuotaSettings(BaseModel):
    """A workspace's quota in one pool, from the master config (a quota set through the API
    for the same workspace and pool replaces it; docs/quotas.md)."""

    workspace: str = Field(min_length=1, description="The workspace's name.")
    nominal_slots: StrictInt = Field(
        ge=0, description="Slots the workspace is guaranteed in this pool (taken back if lent)."
    )
    borrowing_limit: StrictInt | None = Field(
        default=None,
        ge=0,
        description="Slots it may use above its nominal while others leave theirs idle "
        "(empty: any idle slot; 0: none).",
    )
    lending_limit: StrictInt | None = Field(
        default=None,
        ge=0,
        description="Slots of its nominal others may borrow while it leaves them idle "
        "(empty: all of them).",
    )

    @model_validator(mode="after")
    def _lends_what_it_has(self) -> WorkspaceQuotaSettings:
        if self.lending_limit is not None and self.lending_limit > self.nominal_slots:
            raise ValueError(
                f"quotas: workspace {self.workspace}: lending_limit {self.lending_limit} is "
                f"above its nominal_slots {self.nominal_slots}"
            )
        return self


class FairShareSettings(BaseModel):
    """How a workspace's queue is ordered at equal priority (docs/quotas.md)."""

    half_life: str = Field(
        default="168h",
        description="Recent usage (slot-seconds) counts half after this long: a duration such "
        "as '168h' (Slurm's PriorityDecayHalfLife default, 7 days) or '30m'.",
    )
    start_charge_s: float = Field(
        default=60.0,
        ge=0,
        description="Each allocation counts as this many seconds of its slots from the moment "
        "it is placed, so one pass spreads free slots over users and experiments instead of "
        "giving them all to whoever used least.",
    )

    @field_validator("half_life")
    @classmethod
    def _a_duration(cls, value: str) -> str:
        if parse_duration(value, "fair_share.half_life") < timedelta(seconds=1):
            raise ValueError(f"fair_share.half_life: {value!r} is shorter than 1s")
        return value

    def half_life_s(self) -> float:
        return parse_duration(self.half_life, "fair_share.half_life").total_seconds()


class ResourcePoolSettings(BaseModel):
    pool_name: str = Field(min_length=1, description="Name experiments and agents refer to.")
    description: str = Field(default="", description="Shown in `det resource-pool list`.")
    scheduler: SchedulerSettings = Field(default_factory=SchedulerSettings)
    max_aux_containers_per_agent: int = Field(
        default=100, ge=0, description="Zero-slot tasks one agent may run at once."
    )
    task_container_defaults: TaskContainerDefaults | None = Field(
        default=None,
        description="Replaces the master's task_container_defaults for this pool's trials.",
    )
    require_image: bool = Field(
        default=False,
        description=(
            "Take only work whose config names environment.image (its agents run containers, "
            "--container-runtime): a config without one is refused at submit, naming the pool."
        ),
    )
    idle_timeout_s: float | None = Field(
        default=None,
        gt=0,
        description=(
            "Notebooks, shells and TensorBoards that set no idle_timeout end after this many "
            "seconds without activity (none: they run until killed)."
        ),
    )
    quotas: list[WorkspaceQuotaSettings] = Field(
        default_factory=list,
        description="Workspaces' slot quotas in this pool (docs/quotas.md). A workspace with "
        "none here or through the API has no guaranteed slots and may borrow any idle ones.",
    )

    @field_validator("quotas")
    @classmethod
    def _one_quota_per_workspace(
        cls, quotas: list[WorkspaceQuotaSettings]
    ) -> list[WorkspaceQuotaSettings]:
        names = [q.workspace for q in quotas]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"quotas: workspace named more than once: {', '.join(twice)}")
        return quotas


class AgentLinkSettings(BaseModel):
    """The gRPC port agents connect to, and how the master judges them alive."""

    host: str = Field(default="127.0.0.1", description="Address the agent gRPC server listens on.")
    port: int = Field(default=8090, ge=0, le=65535, description="Agent gRPC port (0: any free).")
    join_token: str = Field(
        default="",
        description=(
            "Secret every agent must present. Empty: the master generates one and keeps it in "
            "<data_dir>/agent_join_token."
        ),
    )
    heartbeat_interval_s: float = Field(default=1.0, gt=0, le=60, description="Agent heartbeat.")
    lost_after_s: float = Field(
        default=10.0,
        gt=0,
        description=(
            "An agent silent this long is lost: its allocations fail as a transient error and "
            "their trials are requeued without counting a restart."
        ),
    )
    metrics_period_s: float = Field(default=1.0, gt=0, le=3600, description="Metric sampling.")
    metrics_retention_s: float = Field(
        default=24 * 3600.0, gt=0, description="Agent metric samples older than this are deleted."
    )
    stop_grace_s: float = Field(
        default=10.0, ge=0, description="SIGTERM to SIGKILL delay when ranks are stopped."
    )
    preemption_timeout_s: float = Field(
        default=60.0,
        ge=0,
        description=(
            "How long a trial that polls its preemption signal may take to checkpoint and "
            "exit on its own before it gets SIGTERM."
        ),
    )
    max_message_mb: int = Field(
        default=160, ge=4, description="Largest gRPC message (the model definition rides in one)."
    )

    # The agent's fence takes these shares of lost_after_s: its ranks get SIGTERM at 60% of
    # it without an acknowledged heartbeat, SIGKILL at 80%, and the last 20% is the margin
    # before the master declares the agent lost and may place its trials elsewhere.
    @property
    def fence_after_s(self) -> float:
        return 0.6 * self.lost_after_s

    @property
    def fence_kill_after_s(self) -> float:
        return 0.2 * self.lost_after_s

    @model_validator(mode="after")
    def _heartbeats_fit_the_fence(self) -> AgentLinkSettings:
        # Three heartbeats per fence window, so one lost ack does not fence a healthy agent.
        if self.heartbeat_interval_s * 3 > self.fence_after_s:
            raise ValueError(
                f"heartbeat_interval_s ({self.heartbeat_interval_s}) must be at most a fifth "
                f"of lost_after_s ({self.lost_after_s}): the agent's fence fires at 60% of it"
            )
        return self


class HighAvailabilitySettings(BaseModel):
    """Several masters on one PostgreSQL: one leads, the others stand by."""

    enabled: bool = Field(
        default=False,
        description=(
            "Take part in a leader election through the database (PostgreSQL only). A "
            "standby serves reads, redirects writes to the leader, and takes over when the "
            "leader's lease runs out."
        ),
    )
    lease_s: float = Field(
        default=3.0,
        ge=1.0,
        le=60.0,
        description=(
            "How long the leader's lease lasts without renewal (renewed every third of it). "
            "A standby takes over within this plus its 0.5 s poll."
        ),
    )


class LogRetentionSettings(BaseModel):
    """Determined's master `retention_policy`: how long task logs outlive their trial."""

    log_retention_days: int | None = Field(
        default=None,
        ge=-1,
        le=32767,
        description=(
            "Days a trial's logs are kept after it ends, for experiments whose config sets no "
            "retention_policy.log_retention_days. Empty or -1: forever."
        ),
    )
    schedule: str = Field(
        default="1h",
        description=(
            "How often the leader deletes logs whose retention is over: a duration such as "
            "'1h', '30m' or '1d' (cron expressions are not supported)."
        ),
    )

    @field_validator("schedule")
    @classmethod
    def _a_duration(cls, value: str) -> str:
        # Each look is a pass over the logs table: one a minute is already often.
        if parse_duration(value, "retention_policy.schedule") < timedelta(minutes=1):
            raise ValueError(f"retention_policy.schedule: {value!r} is shorter than 1m")
        return value

    def interval_s(self) -> float:
        return parse_duration(self.schedule, "retention_policy.schedule").total_seconds()


class WebhookSettings(BaseModel):
    """Webhook deliveries (Determined's `webhooks` master config)."""

    signing_key: str = Field(
        default="",
        description=(
            "Secret for each delivery's X-Determined-AI-Signature: hex HMAC-SHA256 of "
            "`<X-Determined-AI-Signature-Timestamp>,<body>`. Empty: a random key is made on "
            "the first start and kept in <data_dir>/webhook_signing_key (masters sharing a "
            "database should all be given the same key)."
        ),
    )
    base_url: str = Field(
        default="",
        description="The dashboard's URL, for links in Slack messages (empty: no links).",
    )
    timeout_s: float = Field(
        default=10.0,
        gt=0,
        le=300,
        description="How long one delivery may take; a receiver slower than this is retried.",
    )
    retry_initial_s: float = Field(
        default=1.0, gt=0, le=600, description="Wait before the first retry of a failed delivery."
    )
    retry_max_s: float = Field(
        default=60.0,
        gt=0,
        le=3600,
        description="Longest wait between retries (the wait doubles from retry_initial_s).",
    )
    max_age_s: float = Field(
        default=86400.0,
        gt=0,
        le=30 * 86400,  # a queue kept longer is a backlog nobody will want delivered
        description=(
            "A delivery still failing this long after its event is dropped, with a warning. "
            "A 4xx answer drops it at once: the receiver refused it."
        ),
    )
    poll_interval_s: float = Field(
        default=0.5,
        gt=0,
        le=10,
        description="Longest time between the shipper's looks at its queue.",
    )


class MasterSettings(BaseSettings):
    """Every master setting. Env vars: DET_MASTER_<FIELD>, nested with `__` (DET_MASTER_DB__URL)."""

    model_config = SettingsConfigDict(
        env_prefix="DET_MASTER_",
        env_nested_delimiter="__",
        extra="forbid",
    )

    host: str = Field(default="127.0.0.1", description="Address the HTTP API listens on.")
    port: int = Field(default=8080, ge=0, le=65535, description="HTTP API port.")
    data_dir: Path = Field(
        default=Path("data"), description="Directory for the embedded database and task files."
    )
    db: DatabaseSettings = Field(default_factory=DatabaseSettings)
    ha: HighAvailabilitySettings = Field(default_factory=HighAvailabilitySettings)
    security: SecuritySettings = Field(default_factory=SecuritySettings)
    webhooks: WebhookSettings = Field(default_factory=WebhookSettings)
    max_model_definition_mb: float = Field(
        default=96.0, gt=0, description="Largest model definition (decoded) accepted, in MiB."
    )
    max_trials_per_experiment: int = Field(
        default=10_000, ge=1, description="Upper bound on the trials one searcher may create."
    )
    cluster_name: str = Field(default="resolute", description="Shown by `det master info`.")
    log_level: str = Field(default="INFO", description="Python logging level for the master.")
    log_format: Literal["text", "json"] = Field(default="text", description="Log line format.")
    resource_pools: list[ResourcePoolSettings] = Field(
        default_factory=lambda: [ResourcePoolSettings(pool_name="default")],
        description="Resource pools; each has its own scheduler settings.",
    )
    default_compute_pool: str = Field(
        default="default", description="Pool of experiments that name none."
    )
    scheduler_interval_s: float = Field(
        default=0.5, gt=0, le=0.5, description="Longest time between scheduling passes."
    )
    idle_check_interval_s: float = Field(
        default=5.0,
        gt=0,
        le=60,
        description=(
            "How often idle notebooks, shells and TensorBoards are looked for, and the proxy's "
            "activity written: an idle task ends within this long after its idle_timeout."
        ),
    )
    run_loops: bool = Field(
        default=True, description="Run the background loops (off for API-only tests)."
    )
    agent_link: AgentLinkSettings = Field(default_factory=AgentLinkSettings)
    retention_policy: LogRetentionSettings = Field(default_factory=LogRetentionSettings)
    fair_share: FairShareSettings = Field(default_factory=FairShareSettings)
    task_container_defaults: TaskContainerDefaults = Field(default_factory=TaskContainerDefaults)
    checkpoint_storage: dict[str, Any] | None = Field(
        default=None,
        description=(
            "checkpoint_storage of experiments whose config has none (shared_fs or directory). "
            "Empty: shared_fs in <data_dir>/checkpoints, which agents on other machines must "
            "mount at the same path."
        ),
    )
    external_url: str = Field(
        default="",
        description=(
            "URL ranks use to reach the HTTP API (DET_MASTER). Empty: http://<host>:<port> "
            "(https with security.tls), with 127.0.0.1 for a wildcard host."
        ),
    )
    migrate_on_start: bool = Field(
        default=True, description="Upgrade the database schema to head when the master starts."
    )

    def default_checkpoint_storage(self) -> dict[str, Any]:
        if self.checkpoint_storage:
            return dict(self.checkpoint_storage)
        return {"type": "shared_fs", "host_path": str(self.data_dir.resolve() / "checkpoints")}

    @field_validator("data_dir", mode="before")
    @classmethod
    def _absolute_data_dir(cls, value: object) -> object:
        return absolute_path(value)

    @field_validator("log_level")
    @classmethod
    def _known_level(cls, value: str) -> str:
        level = value.upper()
        if level not in logging.getLevelNamesMapping():
            raise ValueError(f"unknown log level {value!r}")
        return level

    @model_validator(mode="after")
    def _external_url_matches_tls(self) -> MasterSettings:
        # Ranks are told this URL: plain http to a TLS port would fail only at their start.
        if self.security.tls.enabled and self.external_url.startswith("http://"):
            raise ValueError(
                f"external_url {self.external_url!r}: the master serves https "
                "(security.tls is set); tell ranks https://"
            )
        return self

    @model_validator(mode="after")
    def _standby_needs_postgres(self) -> MasterSettings:
        if self.ha.enabled and not self.db.url.startswith("postgres"):
            raise ValueError(
                "ha.enabled: several masters share one database, which must be PostgreSQL "
                "(db.url); the embedded SQLite belongs to one master"
            )
        return self

    @model_validator(mode="after")
    def _pools_are_consistent(self) -> MasterSettings:
        names = [p.pool_name for p in self.resource_pools]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"resource_pools: pool names must be unique: {duplicates}")
        if self.default_compute_pool not in names:
            raise ValueError(
                f"default_compute_pool {self.default_compute_pool!r} is not one of the "
                f"resource_pools ({', '.join(names) or 'none'})"
            )
        return self

    def pool(self, name: str) -> ResourcePoolSettings | None:
        return next((p for p in self.resource_pools if p.pool_name == name), None)

    def unapplied_container_defaults(self) -> list[str]:
        """The task_container_defaults keys, the master's and each pool's, that this master
        reads but does not apply."""
        found = [(self.task_container_defaults, "task_container_defaults")]
        found += [
            (
                pool.task_container_defaults,
                f"resource_pools[{pool.pool_name}].task_container_defaults",
            )
            for pool in self.resource_pools
            if pool.task_container_defaults is not None
        ]
        return [f"{where}.{key}" for defaults, where in found for key in defaults.model_extra or {}]

    def container_defaults(self, pool_name: str) -> TaskContainerDefaults:
        """task_container_defaults: the pool's own, else the master's."""
        pool = self.pool(pool_name)
        own = pool.task_container_defaults if pool else None
        return own or self.task_container_defaults

    @property
    def database_url(self) -> str:
        """The async SQLAlchemy URL actually used."""
        return async_database_url(self.db.url, self.data_dir)

    @property
    def master_url(self) -> str:
        if self.external_url:
            return self.external_url.rstrip("/")
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        scheme = "https" if self.security.tls.enabled else "http"
        return f"{scheme}://{host}:{self.port}"

    @property
    def max_model_definition_bytes(self) -> int:
        return int(self.max_model_definition_mb * 1024 * 1024)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Priority: explicit arguments (CLI flags) > environment > YAML file.
        return (init_settings, env_settings, YamlFileSource(settings_cls, CONFIG_FILE_ENV))


def async_database_url(url: str, data_dir: Path) -> str:
    """Pick the async driver for a user-facing URL; empty means SQLite in the data dir."""
    if not url:
        return f"sqlite+aiosqlite:///{(data_dir / 'resolute.db').resolve()}"
    if url.startswith(("postgres://", "postgresql://")):
        return "postgresql+asyncpg://" + url.split("://", 1)[1]
    if url.startswith("sqlite://"):
        return "sqlite+aiosqlite://" + url.split("://", 1)[1]
    return url
