"""Determined's experiment configuration (expconf v0): parsing, validation, defaults, warnings.

Field names, shapes and defaults follow Determined so that existing experiment YAML files work
unchanged. Every input problem is reported as a `ConfigError` whose problems carry dotted
paths (`resources.slots_per_trial`, `bind_mounts.1.container_path`), and all problems of a
document are reported at once so a user fixes a config in one round trip.

Two validation modes exist because Determined merges a config template into the user's
config: `complete=False` checks shapes only (a template, or a user config before the merge),
`complete=True` also requires what an experiment needs to run (the merged config).
"""

from __future__ import annotations

import copy
import difflib
import itertools
import math
import posixpath
import re
import shlex
import urllib.parse
from collections.abc import Callable, Hashable, Iterable, Mapping
from types import NoneType, UnionType
from typing import (
    TYPE_CHECKING,
    Annotated,
    Any,
    ClassVar,
    Literal,
    Self,
    TypeAlias,
    Union,
    get_args,
    get_origin,
)

import annotated_types
import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    SerializerFunctionWrapHandler,
    Tag,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError
from typing_extensions import TypeAliasType

from master.core import asha, expconf_keys, images, mounts
from master.core.errors import ConfigError, ConfigProblem

__all__ = [
    "DEEPSPEED_LAUNCHER",
    "HOROVOD_LAUNCHER",
    "HYPERPARAMETER_TYPES",
    "MAX_EXPERIMENT_SEED",
    "STORAGE_TYPES",
    "SUPPORTED_SEARCHERS",
    "AzureStorage",
    "BindMount",
    "CategoricalHP",
    "CheckpointStorage",
    "ConstHP",
    "Device",
    "DirectoryStorage",
    "DoubleHP",
    "Environment",
    "EnvironmentImageMap",
    "EnvironmentVariablesMap",
    "ExperimentConfig",
    "GCSStorage",
    "Hyperparameter",
    "IntHP",
    "Length",
    "LogHP",
    "Optimizations",
    "PartialStorage",
    "PositiveLength",
    "ProxyPort",
    "RegistryAuth",
    "Reproducibility",
    "Resources",
    "RetentionPolicy",
    "S3Storage",
    "Searcher",
    "SharedFSStorage",
    "config_warnings",
    "effective_dict",
    "entrypoint_modules",
    "parse_yaml",
    "registry_auth_problems",
    "validate_config",
]

MAX_EXPERIMENT_SEED = 2**31 - 1
"""Determined documents experiment seeds as integers in [0, 2**31 - 1]."""

SUPPORTED_SEARCHERS: tuple[str, ...] = ("single", "grid", "random", *asha.ASHA_SEARCHERS)
"""Searchers this master implements; those Determined 0.38 removed (custom, adaptive,
adaptive_simple, sync_halving) are rejected, as it does."""

HYPERPARAMETER_TYPES: tuple[str, ...] = ("const", "int", "double", "log", "categorical")

_GBS = "hyperparameters.global_batch_size"

# Validation context key under which hand-validated sections (hyperparameters) collect their
# problems, so that they are reported together with pydantic's.
_SINK = "expconf_problems"


# --- base model ------------------------------------------------------------------------------


class _Strict(BaseModel):
    """Base for every section: unknown keys are errors and YAML types are never coerced.

    Determined allows `null` for any optional field and then uses the default; dropping
    null-valued keys before validation gives the same behaviour.
    """

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    _keep_nulls: ClassVar[bool] = False

    @model_validator(mode="before")
    @classmethod
    def _drop_nulls(cls, data: Any) -> Any:
        if cls._keep_nulls or not isinstance(data, dict):
            return data
        return {key: value for key, value in data.items() if value is not None}


def _kind(value: Any) -> str | None:
    """Tag for the callable discriminators below: the JSON kind of a value."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, str):
        return "str"
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict | BaseModel):
        return "dict"
    return None


def _non_empty(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be empty")
    return value


NonEmptyStr = Annotated[str, AfterValidator(_non_empty)]


# --- lengths ---------------------------------------------------------------------------------


class Length(_Strict):
    """A training length in one unit, e.g. `{batches: 500}` (Determined's Length)."""

    batches: int | None = Field(default=None, ge=0)
    records: int | None = Field(default=None, ge=0)
    epochs: int | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _exactly_one_unit(self) -> Self:
        if len(self._set_units()) != 1:
            raise ValueError("must have exactly one key: batches, records or epochs")
        return self

    @model_serializer(mode="wrap")
    def _only_the_unit(self, handler: SerializerFunctionWrapHandler) -> dict[str, int]:
        dumped: dict[str, int | None] = handler(self)
        return {unit: value for unit, value in dumped.items() if value is not None}

    def _set_units(self) -> list[tuple[Literal["batches", "records", "epochs"], int]]:
        units: list[tuple[Literal["batches", "records", "epochs"], int | None]] = [
            ("batches", self.batches),
            ("records", self.records),
            ("epochs", self.epochs),
        ]
        return [(unit, value) for unit, value in units if value is not None]

    @property
    def unit(self) -> Literal["batches", "records", "epochs"]:
        return self._set_units()[0][0]

    @property
    def value(self) -> int:
        return self._set_units()[0][1]


class PositiveLength(Length):
    """A length that must be at least one unit (searcher.max_length)."""

    batches: int | None = Field(default=None, ge=1)
    records: int | None = Field(default=None, ge=1)
    epochs: int | None = Field(default=None, ge=1)


_LENGTH_HELP = "must be an integer or a mapping with one key: batches, records or epochs"

PeriodSpec = Annotated[
    Annotated[int, Field(ge=0), Tag("int")] | Annotated[Length, Tag("dict")],
    Discriminator(_kind, custom_error_type="length_type", custom_error_message=_LENGTH_HELP),
]
"""min_validation_period / min_checkpoint_period: `{batches: 0}` (off) is valid in Determined."""

MaxLengthSpec = Annotated[
    Annotated[int, Field(ge=1), Tag("int")] | Annotated[PositiveLength, Tag("dict")],
    Discriminator(_kind, custom_error_type="length_type", custom_error_message=_LENGTH_HELP),
]


# --- resources -------------------------------------------------------------------------------


def _memory_size(value: str) -> str:
    try:
        mounts.parse_memory_size(value)
    except ValueError:
        raise ValueError('must be a memory size such as 4294967296, "4G" or "512 MiB"') from None
    return value


def _device_path(value: str) -> str:
    if not value.startswith("/"):
        raise ValueError("must be an absolute path such as /dev/fuse")
    return value


def _device_mode(value: str) -> str:
    # Docker's cgroup permissions: read, write, mknod, each at most once.
    if not value or set(value) - set("rwm") or len(set(value)) != len(value):
        raise ValueError(f"{value!r} is not a device mode: use r, w and m, each at most once (rwm)")
    return value


class Device(_Strict):
    """A host device exposed to the trial's container (Docker's `--device`): applied where
    an image runs on an agent with a container runtime."""

    host_path: Annotated[str, AfterValidator(_device_path)]
    container_path: Annotated[str, AfterValidator(_device_path)]
    mode: Annotated[str, AfterValidator(_device_mode)] = "mrw"


# resources.shm_size: bytes, or a size such as "4G"; an experiment's and a task's alike.
ShmSize = (
    Annotated[
        (
            Annotated[int, Field(ge=0, le=2**63 - 1), Tag("int")]
            | Annotated[str, AfterValidator(_memory_size), Tag("str")]
        ),
        Discriminator(
            _kind,
            custom_error_type="shm_size_type",
            custom_error_message='must be a number of bytes or a size such as "4G"',
        ),
    ]
    | None
)


class Resources(_Strict):
    """What each trial asks the scheduler for."""

    # Upper bounds keep every count inside the database's 32-bit integers.
    slots_per_trial: int = Field(default=1, ge=0, le=2**31 - 1)
    max_slots: int | None = Field(default=None, ge=0, le=2**31 - 1)
    priority: int | None = Field(default=None, ge=1, le=99)
    """None: the resource pool's default priority, filled in by the scheduler."""
    weight: float = Field(default=1.0, gt=0)
    resource_pool: str = ""
    is_single_node: bool = False
    shm_size: ShmSize = None
    devices: list[Device] = Field(default_factory=list)
    agent_label: str = ""
    """Determined's older way to pick agents, accepted so that configs written for it still
    submit; placement here goes by resource_pool, and a label set is warned about."""
    native_parallel: bool = False
    """Accepted as Determined's schema still does; its legacy harness reads the key from
    the filled config (a KeyError without it). Warned about when true."""


# --- reproducibility, searcher, optimizations ------------------------------------------------


class Reproducibility(_Strict):
    """Seeds: None means the master assigns one at submit time and stores it."""

    experiment_seed: int | None = Field(default=None, ge=0, le=MAX_EXPERIMENT_SEED)
    deterministic: bool = False
    """Our addition: ask the harness for deterministic kernels."""


# Which searcher settings each searcher has; Determined rejects the others.
_SEARCHER_ONLY_FIELDS: dict[str, tuple[str, ...]] = {
    "max_trials": ("random", *asha.ASHA_SEARCHERS),
    "max_concurrent_trials": ("grid", "random", *asha.ASHA_SEARCHERS),
    "time_metric": asha.ASHA_SEARCHERS,
    "max_time": asha.ASHA_SEARCHERS,
    "divisor": asha.ASHA_SEARCHERS,
    "stop_once": asha.ASHA_SEARCHERS,
    "mode": ("adaptive_asha",),
    "max_rungs": ("adaptive_asha",),
    "bracket_rungs": ("adaptive_asha",),
    "num_rungs": ("async_halving",),
}


_REMOVED_SEARCHERS = ("custom", "adaptive", "adaptive_simple", "sync_halving")

_ASHA_DEFAULTS: dict[str, dict[str, Any]] = {
    "adaptive_asha": {"mode": "standard", "divisor": 4, "max_rungs": 5, "bracket_rungs": []},
    "async_halving": {"divisor": 4},
}


SearcherName = Literal["single", "grid", "random", "adaptive_asha", "async_halving"]
SEARCHER_NAMES: tuple[str, ...] = get_args(SearcherName)


class Searcher(_Strict):
    """How trials are chosen. One model for the three supported searchers."""

    name: SearcherName | None = None
    metric: str | None = None
    smaller_is_better: bool = True
    max_length: MaxLengthSpec | None = None
    max_trials: int | None = Field(default=None, ge=1)
    max_concurrent_trials: int = Field(default=16, ge=0)
    # adaptive_asha / async_halving (their combinations are checked in asha.parse_config)
    time_metric: str | None = None
    max_time: int | None = Field(default=None, ge=1)
    mode: Literal["aggressive", "standard", "conservative"] | None = None
    divisor: float | None = Field(default=None, gt=1)
    max_rungs: int | None = Field(default=None, ge=1)
    bracket_rungs: list[Annotated[int, Field(ge=1)]] | None = None
    num_rungs: int | None = Field(default=None, ge=1)
    stop_once: bool | None = None  # deprecated in 0.38; accepted and ignored
    source_trial_id: int | None = None
    source_checkpoint_uuid: str | None = None

    @field_validator("name", mode="before")
    @classmethod
    def _supported(cls, value: Any) -> Any:
        if isinstance(value, str) and value in _REMOVED_SEARCHERS:
            raise ValueError(
                f"the {value!r} searcher was removed in Determined 0.38 and is not valid for "
                "new experiments; supported searchers: " + ", ".join(SUPPORTED_SEARCHERS)
            )
        if isinstance(value, str) and value not in SUPPORTED_SEARCHERS:
            raise ValueError(
                f"unsupported searcher {value!r}; supported searchers: "
                + ", ".join(SUPPORTED_SEARCHERS)
            )
        return value


class Optimizations(_Strict):
    """Distributed-training knobs passed through to the harness."""

    aggregation_frequency: int = Field(default=1, ge=1)
    average_aggregated_gradients: bool = True
    average_training_metrics: bool = True
    gradient_compression: bool = False
    grad_updates_size_file: str | None = None
    mixed_precision: Literal["O0", "O1", "O2", "O3"] = "O0"
    tensor_fusion_threshold: int = Field(default=64, ge=0)
    tensor_fusion_cycle_time: int = Field(default=1, ge=0)
    auto_tune_tensor_fusion: bool = False


# --- bind mounts and environment -------------------------------------------------------------


def _absolute(value: str) -> str:
    if not value.startswith("/"):
        raise ValueError("must be an absolute path")
    return value


def _not_dot(value: str) -> str:
    if value.strip() in ("", "."):
        raise ValueError('must be a path other than "" or "."')
    return value


class BindMount(_Strict):
    """A host file or directory bind-mounted in every trial's private mount namespace
    (master.core.mounts says where, and which targets are refused)."""

    host_path: Annotated[str, AfterValidator(_absolute)]
    container_path: Annotated[str, AfterValidator(_not_dot)]
    read_only: bool = False
    propagation: Literal["rprivate", "private", "rshared", "shared", "rslave", "slave"] = "rprivate"


_ENV_VAR = re.compile(r"^[^=\s][^=]*=", re.DOTALL)


def _env_var(value: str) -> str:
    if not _ENV_VAR.match(value):
        raise ValueError('must have the form "KEY=VALUE"')
    return value


EnvVar = Annotated[str, AfterValidator(_env_var)]


def _image_name(value: str) -> str:
    images.parse_image(value)  # its ValueError says what is wrong with the name
    return value


ImageName = Annotated[str, AfterValidator(_image_name)]


class EnvironmentImageMap(_Strict):
    """Per-accelerator images; `gpu` is Determined's legacy name for `cuda`."""

    cpu: ImageName | None = None
    cuda: ImageName | None = None
    rocm: ImageName | None = None
    gpu: ImageName | None = None


class EnvironmentVariablesMap(_Strict):
    """Per-accelerator environment variables; `gpu` is the legacy name for `cuda`."""

    cpu: list[EnvVar] = Field(default_factory=list)
    cuda: list[EnvVar] = Field(default_factory=list)
    rocm: list[EnvVar] = Field(default_factory=list)
    gpu: list[EnvVar] = Field(default_factory=list)


def _server_address(value: str) -> str:
    """A registry host[:port], or an https:// URL of one (Docker Hub's is
    https://index.docker.io/v1/)."""
    host = value
    scheme, sep, rest = value.partition("://")
    if sep:
        host = rest.split("/", 1)[0] if scheme == "https" else ""
    if not host or images.registry_problem(host):
        raise ValueError(
            f"{value!r} is not a registry address: give the host (registry.example.com:5000) "
            "or an https:// URL"
        )
    return value


class RegistryAuth(_Strict):
    """Docker registry credentials (Docker's AuthConfig field names), for the pull of the
    image on agents with a container runtime. Hidden wherever a config is shown."""

    username: str | None = None
    password: str | None = None
    auth: str | None = None
    email: str | None = None
    serveraddress: Annotated[str, AfterValidator(_server_address)] | None = None
    identitytoken: str | None = None
    registrytoken: str | None = None


class ProxyPort(_Strict):
    """A port of the trial container that the master proxies."""

    proxy_port: int = Field(ge=1, le=65535)
    proxy_tcp: bool = False
    unauthenticated: bool = False
    default_service_id: bool = False


class Environment(_Strict):
    """The container the trials run in."""

    image: (
        Annotated[
            Annotated[ImageName, Tag("str")] | Annotated[EnvironmentImageMap, Tag("dict")],
            Discriminator(
                _kind,
                custom_error_type="image_type",
                custom_error_message="must be an image name or a mapping of cpu/cuda/rocm to "
                "image names",
            ),
        ]
        | None
    ) = None
    environment_variables: Annotated[
        Annotated[list[EnvVar], Tag("list")] | Annotated[EnvironmentVariablesMap, Tag("dict")],
        Discriminator(
            _kind,
            custom_error_type="env_type",
            custom_error_message='must be a list of "KEY=VALUE" strings or a mapping of '
            "cpu/cuda/rocm to such lists",
        ),
    ] = Field(default_factory=list)
    force_pull_image: bool = False
    registry_auth: RegistryAuth | None = None
    pod_spec: dict[str, Any] | None = None
    """Refused when set (expconf_keys says why); kept as a field so that the stored config
    still has Determined's shape (`pod_spec: null`)."""
    add_capabilities: list[str] = Field(default_factory=list)
    drop_capabilities: list[str] = Field(default_factory=list)
    proxy_ports: list[ProxyPort] = Field(default_factory=list)
    ports: dict[str, int] = Field(default_factory=dict)
    """Docker's published container ports, by name. Like the capabilities, it is accepted
    so that Determined's configs submit unchanged, and `config_warnings` says it does not
    apply."""
    # resolute's extension: overrides the master's task_container_defaults for this experiment.
    dtrain_network_interface: NonEmptyStr | None = Field(default=None, max_length=64)

    @field_validator("pod_spec")
    @classmethod
    def _no_pod_spec(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None:
            raise ValueError("refused: " + expconf_keys.REFUSED_REASONS["environment.pod_spec"])
        return value


# --- checkpoint storage ----------------------------------------------------------------------


def _relative_prefix(value: str) -> str:
    if any(part in (".", "..") for part in value.split("/")):
        raise ValueError('must not contain "." or ".." path segments')
    return value


def _endpoint_url(value: str) -> str:
    parsed = urllib.parse.urlsplit(value)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ValueError(f"must be an http:// or https:// URL, got {value!r}")
    return value


EndpointUrl = Annotated[str, AfterValidator(_endpoint_url)]


class _StorageBase(_Strict):
    """Checkpoint garbage-collection policy, common to every storage type."""

    save_experiment_best: int = Field(default=0, ge=0)
    save_trial_best: int = Field(default=1, ge=0)
    save_trial_latest: int = Field(default=1, ge=0)


class SharedFSStorage(_StorageBase):
    """Checkpoints in a directory shared by all agents (mounted from host_path)."""

    type: Literal["shared_fs"] = "shared_fs"
    host_path: str | None = None
    storage_path: str | None = None
    propagation: str = "rprivate"


class DirectoryStorage(_StorageBase):
    """Checkpoints in a directory that already exists inside the containers."""

    type: Literal["directory"] = "directory"
    container_path: str | None = None


class S3Storage(_StorageBase):
    """Checkpoints in an S3 (or S3-compatible) bucket."""

    type: Literal["s3"] = "s3"
    bucket: str | None = None
    access_key: str | None = None
    secret_key: str | None = None
    endpoint_url: EndpointUrl | None = None
    prefix: Annotated[str, AfterValidator(_relative_prefix)] | None = None


class GCSStorage(_StorageBase):
    """Checkpoints in a Google Cloud Storage bucket."""

    type: Literal["gcs"] = "gcs"
    bucket: str | None = None
    prefix: Annotated[str, AfterValidator(_relative_prefix)] | None = None


class AzureStorage(_StorageBase):
    """Checkpoints in an Azure Blob Storage container."""

    type: Literal["azure"] = "azure"
    container: str | None = None
    connection_string: str | None = None
    account_url: str | None = None
    credential: str | None = None


class PartialStorage(_StorageBase):
    """A storage section without `type`: only valid before a template merge supplies it.

    It accepts the keys of every storage type, as Determined's schema does.
    """

    host_path: str | None = None
    storage_path: str | None = None
    propagation: str | None = None
    container_path: str | None = None
    bucket: str | None = None
    access_key: str | None = None
    secret_key: str | None = None
    endpoint_url: EndpointUrl | None = None
    prefix: Annotated[str, AfterValidator(_relative_prefix)] | None = None
    container: str | None = None
    connection_string: str | None = None
    account_url: str | None = None
    credential: str | None = None


STORAGE_TYPES: tuple[str, ...] = ("shared_fs", "directory", "s3", "gcs", "azure")


def _storage_tag(value: Any) -> str | None:
    if isinstance(value, BaseModel):
        kind = getattr(value, "type", None)
        return kind if isinstance(kind, str) else "partial"
    if isinstance(value, dict):
        kind = value.get("type")
        if kind is None:
            return "partial"
        return kind if isinstance(kind, str) else None
    return "partial"  # PartialStorage then reports "must be a mapping"


CheckpointStorage = Annotated[
    (
        Annotated[SharedFSStorage, Tag("shared_fs")]
        | Annotated[DirectoryStorage, Tag("directory")]
        | Annotated[S3Storage, Tag("s3")]
        | Annotated[GCSStorage, Tag("gcs")]
        | Annotated[AzureStorage, Tag("azure")]
        | Annotated[PartialStorage, Tag("partial")]
    ),
    Discriminator(
        _storage_tag,
        custom_error_type="storage_type",
        custom_error_message="must be one of: " + ", ".join(STORAGE_TYPES),
    ),
]


class RetentionPolicy(_Strict):
    """How long task logs are kept; -1 keeps them forever."""

    log_retention_days: int | None = Field(default=None, ge=-1, le=32767)


# --- hyperparameters -------------------------------------------------------------------------


def _number_kind(value: Any) -> str | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return "int"
    return "float" if isinstance(value, float) else None


_NUMBER = Discriminator(
    _number_kind, custom_error_type="number_type", custom_error_message="must be a number"
)

Number = Annotated[Annotated[int, Tag("int")] | Annotated[float, Tag("float")], _NUMBER]
"""A number kept as the user wrote it (2 stays 2, not 2.0), as Determined's JSON does."""

PositiveNumber = Annotated[
    Annotated[int, Field(gt=0), Tag("int")] | Annotated[float, Field(gt=0), Tag("float")],
    _NUMBER,
]


class ConstHP(_Strict):
    """A fixed value; `lr: 0.1` is shorthand for `{type: const, val: 0.1}`."""

    _keep_nulls: ClassVar[bool] = True  # `val: null` is a legitimate constant

    type: Literal["const"] = "const"
    val: Any


class IntHP(_Strict):
    """An integer range, inclusive at both ends."""

    type: Literal["int"] = "int"
    minval: int
    maxval: int
    count: int | None = Field(default=None, ge=1)


class DoubleHP(_Strict):
    """A real range [minval, maxval)."""

    type: Literal["double"] = "double"
    minval: Number
    maxval: Number
    count: int | None = Field(default=None, ge=1)


class LogHP(_Strict):
    """base ** x for x in [minval, maxval)."""

    type: Literal["log"] = "log"
    minval: Number
    maxval: Number
    base: PositiveNumber = 10.0
    count: int | None = Field(default=None, ge=1)


class CategoricalHP(_Strict):
    """One of a list of values."""

    type: Literal["categorical"] = "categorical"
    vals: list[Any] = Field(min_length=1)


_HP_MODELS: dict[str, type[ConstHP | IntHP | DoubleHP | LogHP | CategoricalHP]] = {
    "const": ConstHP,
    "int": IntHP,
    "double": DoubleHP,
    "log": LogHP,
    "categorical": CategoricalHP,
}

# A nested group (a mapping without `type`) is a plain dict of hyperparameters. mypy does not
# follow recursive TypeAliasType, and pydantic needs it for a recursive alias.
if TYPE_CHECKING:
    Hyperparameter: TypeAlias = (
        ConstHP | IntHP | DoubleHP | LogHP | CategoricalHP | dict[str, "Hyperparameter"]
    )
else:
    Hyperparameter = TypeAliasType(
        "Hyperparameter",
        ConstHP | IntHP | DoubleHP | LogHP | CategoricalHP | dict[str, "Hyperparameter"],
    )


def _parse_hp_group(
    raw: Mapping[Any, Any], path: str, problems: list[ConfigProblem]
) -> dict[str, Hyperparameter]:
    group: dict[str, Hyperparameter] = {}
    for name, value in raw.items():
        if not isinstance(name, str):
            problems.append(ConfigProblem(f"{path}.{name}", "hyperparameter names must be strings"))
            continue
        group[name] = _parse_hp(value, f"{path}.{name}", problems)
    return group


def _parse_hp(value: Any, path: str, problems: list[ConfigProblem]) -> Hyperparameter:
    """One hyperparameter entry: a typed mapping, a nested group, or a const shorthand."""
    if not isinstance(value, Mapping):
        return ConstHP(val=value)
    if "type" not in value:
        return _parse_hp_group(value, path, problems)
    kind = value["type"]
    model = _HP_MODELS.get(kind) if isinstance(kind, str) else None
    if model is None:
        problems.append(
            ConfigProblem(
                f"{path}.type",
                f"unknown hyperparameter type {kind!r}; expected one of: "
                + ", ".join(HYPERPARAMETER_TYPES),
            )
        )
        return ConstHP(val=None)
    try:
        hp = model.model_validate(dict(value))
    except ValidationError as exc:
        problems.extend(_problems_from(exc, model, path))
        return ConstHP(val=None)
    if isinstance(hp, IntHP) and hp.minval > hp.maxval:
        problems.append(ConfigProblem(f"{path}.maxval", f"must be at least minval ({hp.minval})"))
    elif isinstance(hp, DoubleHP | LogHP) and not hp.minval < hp.maxval:
        problems.append(
            ConfigProblem(f"{path}.maxval", f"must be greater than minval ({hp.minval})")
        )
    return hp


def _walk_hps(
    group: Mapping[str, Hyperparameter], path: str
) -> Iterable[tuple[str, ConstHP | IntHP | DoubleHP | LogHP | CategoricalHP]]:
    for name, hp in group.items():
        if isinstance(hp, dict):
            yield from _walk_hps(hp, f"{path}.{name}")
        else:
            yield f"{path}.{name}", hp


def _hp_to_raw(hp: Hyperparameter) -> Any:
    """The typed-dict form of a hyperparameter; an unset count is left out as the user did."""
    if isinstance(hp, dict):
        return {name: _hp_to_raw(child) for name, child in hp.items()}
    if isinstance(hp, ConstHP):
        return {"type": "const", "val": copy.deepcopy(hp.val)}
    dumped: dict[str, Any] = hp.model_dump(mode="json")
    if dumped.get("count", 0) is None:
        del dumped["count"]
    return dumped


# --- the experiment --------------------------------------------------------------------------


class ExperimentConfig(_Strict):
    """A Determined experiment config; unset fields hold Determined's defaults."""

    name: str | None = Field(default=None, max_length=512)
    """None until the master generates a default name."""
    description: str | None = None
    labels: list[str] = Field(default_factory=list)
    entrypoint: (
        Annotated[
            (
                Annotated[NonEmptyStr, Tag("str")]
                | Annotated[list[str], Field(min_length=1), Tag("list")]
            ),
            Discriminator(
                _kind,
                custom_error_type="entrypoint_type",
                custom_error_message="must be a string or a list of strings",
            ),
        ]
        | None
    ) = None
    launch_layout: Literal["auto", "per_slot", "per_agent"] = "auto"
    """resolute's: one process per slot, or Determined's one per agent (a launcher starts
    the ranks); auto decides from the entrypoint (master.core.launch.choose_layout) and the
    master stores the decision."""
    hyperparameters: dict[str, Hyperparameter] = Field(default_factory=dict)
    resources: Resources = Field(default_factory=Resources)
    reproducibility: Reproducibility = Field(default_factory=Reproducibility)
    searcher: Searcher | None = None
    max_restarts: int = Field(default=5, ge=0)
    optimizations: Optimizations = Field(default_factory=Optimizations)
    bind_mounts: list[BindMount] = Field(default_factory=list)
    environment: Environment = Field(default_factory=Environment)
    checkpoint_storage: CheckpointStorage | None = None
    """None: the master's default checkpoint storage applies."""
    data: dict[str, Any] = Field(default_factory=dict)
    min_validation_period: PeriodSpec | None = None
    min_checkpoint_period: PeriodSpec | None = None
    records_per_epoch: int = Field(default=0, ge=0)
    scheduling_unit: int = Field(default=100, ge=1)
    perform_initial_validation: bool = False
    checkpoint_policy: Literal["best", "all", "none"] = "best"
    preemption_timeout: int | None = Field(default=None, ge=0)
    """Seconds a preempted trial gets to checkpoint; None: the master's default."""
    project: str | None = None
    workspace: str | None = None
    debug: bool = False
    profiling: dict[str, Any] = Field(default_factory=dict)
    log_policies: list[dict[str, Any]] = Field(default_factory=list)
    retention_policy: RetentionPolicy | None = None
    integrations: dict[str, Any] | None = None

    @field_validator("hyperparameters", mode="before")
    @classmethod
    def _parse_hyperparameters(cls, value: Any, info: ValidationInfo) -> Any:
        """Hand-parsed: the entry forms depend on the `type` key and shorthands are allowed."""
        if not isinstance(value, Mapping):
            raise PydanticCustomError(
                "hyperparameters_type", "must be a mapping of names to hyperparameters"
            )
        problems: list[ConfigProblem] = []
        parsed = _parse_hp_group(value, "hyperparameters", problems)
        if not any(p.path == _GBS or p.path.startswith(_GBS + ".") for p in problems):
            problems.extend(_check_global_batch_size(parsed))
        if not problems:
            return parsed
        sink = info.context.get(_SINK) if isinstance(info.context, dict) else None
        if not isinstance(sink, list):
            raise ValueError("; ".join(str(problem) for problem in problems))
        sink.extend(problems)
        return {}


# --- pydantic errors -> ConfigProblems -------------------------------------------------------

_SPECIAL_UNKNOWN_KEYS: dict[str, str] = {
    # Determined's keys refused here, each with why (docs/determined.md's table).
    **{key: f"refused: {why}" for key, why in expconf_keys.REFUSED_REASONS.items()},
    "template": "a config cannot name a template inside the file; pass it with --template "
    "(and a template cannot name another template)",
    "resources.slots": "not supported for experiments; use resources.slots_per_trial to set "
    "the number of slots (GPUs) each trial uses",
}

# Custom union errors that are about a key inside the value rather than the value itself.
_ERROR_SUBKEY: dict[str, str] = {"storage_type": "type"}

_TYPE_MESSAGES: dict[str, str] = {
    "missing": "required",
    "int_type": "must be an integer",
    "int_parsing": "must be an integer",
    "int_from_float": "must be an integer",
    "float_type": "must be a number",
    "float_parsing": "must be a number",
    "finite_number": "must be a finite number",
    "bool_type": "must be true or false",
    "bool_parsing": "must be true or false",
    "string_type": "must be a string",
    "list_type": "must be a list",
    "dict_type": "must be a mapping",
    "model_type": "must be a mapping",
    "model_attributes_type": "must be a mapping",
}


def _unwrap(tp: Any, meta: list[Any]) -> Any:
    """Strip Annotated (keeping its metadata), Optional and type aliases."""
    while True:
        if get_origin(tp) is Annotated:
            args = get_args(tp)
            meta.extend(args[1:])
            tp = args[0]
        elif isinstance(tp, TypeAliasType):
            tp = tp.__value__
        elif get_origin(tp) in (Union, UnionType):
            members = [arg for arg in get_args(tp) if arg is not NoneType]
            if len(members) != 1:
                return tp
            tp = members[0]
        else:
            return tp


def _union_tags(tp: Any) -> dict[str, Any]:
    tags: dict[str, Any] = {}
    for member in get_args(tp):
        if get_origin(member) is Annotated:
            for extra in get_args(member)[1:]:
                if isinstance(extra, Tag):
                    tags[extra.tag] = member
    return tags


def _locate(root: type[BaseModel], loc: tuple[int | str, ...]) -> tuple[list[str], Any, list[Any]]:
    """Follow a pydantic error location through the models.

    Returns the user-visible path (union tags removed), the type found there (None when
    unknown) and the constraints attached to it.
    """
    tp: Any = root
    meta: list[Any] = []
    path: list[str] = []
    for elem in loc:
        tp = _unwrap(tp, meta) if tp is not None else None
        if get_origin(tp) in (Union, UnionType):
            member = _union_tags(tp).get(str(elem))
            if member is not None:
                tp = member
                continue
            tp = None
        path.append(str(elem))
        meta = []
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            field = tp.model_fields.get(str(elem))
            tp = field.annotation if field is not None else None
            meta = list(field.metadata) if field is not None else []
        elif get_origin(tp) is list:
            tp = get_args(tp)[0]
        elif get_origin(tp) is dict:
            tp = get_args(tp)[1]
        else:
            tp = None
    if tp is not None:
        tp = _unwrap(tp, meta)
    return path, tp, meta


def _bounds(meta: Iterable[Any]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for item in meta:
        if isinstance(item, FieldInfo):
            found.update(_bounds(item.metadata))
        elif isinstance(item, annotated_types.Ge):
            found["ge"] = item.ge
        elif isinstance(item, annotated_types.Gt):
            found["gt"] = item.gt
        elif isinstance(item, annotated_types.Le):
            found["le"] = item.le
        elif isinstance(item, annotated_types.Lt):
            found["lt"] = item.lt
    return found


def _range_message(bounds: Mapping[str, Any]) -> str:
    if "ge" in bounds and "le" in bounds:
        return f"must be between {bounds['ge']} and {bounds['le']}"
    parts = []
    if "ge" in bounds:
        parts.append(f"at least {bounds['ge']}")
    if "gt" in bounds:
        parts.append(f"greater than {bounds['gt']}")
    if "le" in bounds:
        parts.append(f"at most {bounds['le']}")
    if "lt" in bounds:
        parts.append(f"less than {bounds['lt']}")
    return "must be " + " and ".join(parts)


def _unknown_key_message(key: str, model: type[BaseModel]) -> str:
    """Suggest a close name at the same level, else the same name in a sub-section (a
    top-level `max_length` that belongs under `searcher`), else list the valid names."""
    names = sorted(model.model_fields)
    close = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
    if close:
        return f"unknown key; did you mean {close[0]!r}?"
    for name, field in model.model_fields.items():
        section = _unwrap(field.annotation, [])
        is_model = isinstance(section, type) and issubclass(section, BaseModel)
        if is_model and key in section.model_fields:
            return f"unknown key; did you mean '{name}.{key}'?"
    return "unknown key; expected one of: " + ", ".join(names)


def _join(prefix: str, parts: Iterable[str]) -> str:
    return ".".join([p for p in (prefix, *parts) if p])


def _problems_from(
    exc: ValidationError, root: type[BaseModel], prefix: str = ""
) -> list[ConfigProblem]:
    """Turn pydantic's errors into short, human problems at dotted paths."""
    problems: list[ConfigProblem] = []
    for err in exc.errors(include_url=False):
        loc = tuple(err["loc"])
        kind = err["type"]
        ctx = err.get("ctx") or {}
        if kind == "extra_forbidden" and loc:
            parent_path, parent, _ = _locate(root, loc[:-1])
            key = str(loc[-1])
            path = _join(prefix, [*parent_path, key])
            if path in _SPECIAL_UNKNOWN_KEYS:
                message = _SPECIAL_UNKNOWN_KEYS[path]
            elif isinstance(parent, type) and issubclass(parent, BaseModel):
                message = _unknown_key_message(key, parent)
            else:
                message = "unknown key"
            problems.append(ConfigProblem(path, message))
            continue
        parts, _, meta = _locate(root, loc)
        if kind in _ERROR_SUBKEY:
            parts.append(_ERROR_SUBKEY[kind])
        if kind in _TYPE_MESSAGES:
            message = _TYPE_MESSAGES[kind]
        elif kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
            message = _range_message(_bounds(meta) or ctx)
        elif kind == "literal_error":
            message = f"must be one of {ctx.get('expected', '')}"
        elif kind == "too_short" and ctx.get("min_length") == 1:
            message = "must not be empty"
        elif kind == "value_error":
            message = str(ctx.get("error", err["msg"]))
        else:
            message = err["msg"]
        problems.append(ConfigProblem(_join(prefix, parts), message))
    return problems


# --- YAML ------------------------------------------------------------------------------------


# libyaml's parser where PyYAML has it: parsing is most of a submit's own CPU time in pure
# Python (issue 16); the constructor (duplicate keys, dates) stays ours either way.
if TYPE_CHECKING:
    _SafeLoader = yaml.SafeLoader
else:
    _SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Loader(_SafeLoader):
    """SafeLoader that keeps dates as strings (as Determined's JSON conversion does) and
    rejects duplicate keys instead of silently keeping the last one."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Hashable, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, Hashable):
                continue  # the base class reports unhashable keys
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"duplicate key {key!r} (first defined at line {seen[key] + 1})",
                    key_node.start_mark,
                )
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep)


_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
# YAML 1.2 floats that YAML 1.1 reads as strings (`lr: 1e-5`, `3E2`): Determined's master
# (Go) reads them as numbers, and so many configs write learning rates that way.
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def _yaml_error_message(exc: yaml.YAMLError) -> str:
    if isinstance(exc, yaml.MarkedYAMLError):
        what = exc.problem or "syntax error"
        if exc.context:
            what = f"{what} ({exc.context})"
        mark = exc.problem_mark or exc.context_mark
        if mark is not None:
            return f"invalid YAML at line {mark.line + 1}, column {mark.column + 1}: {what}"
        return f"invalid YAML: {what}"
    if isinstance(exc, yaml.reader.ReaderError):
        return f"invalid YAML: {exc.reason} (character {exc.character!r} at byte {exc.position})"
    return f"invalid YAML: {exc}"


def _json_problems(value: Any, path: str, problems: list[ConfigProblem]) -> None:
    """Configs are stored as JSON: string keys, JSON types, finite numbers only."""
    if isinstance(value, Mapping):
        for key, child in value.items():
            if not isinstance(key, str):
                problems.append(
                    ConfigProblem(
                        _join(path, [str(key)]), "keys must be strings (quote the key in YAML)"
                    )
                )
                continue
            _json_problems(child, _join(path, [key]), problems)
    elif isinstance(value, list | tuple):
        for index, child in enumerate(value):
            _json_problems(child, _join(path, [str(index)]), problems)
    elif isinstance(value, float):
        if not math.isfinite(value):
            problems.append(ConfigProblem(path, "must be a finite number"))
    elif value is not None and not isinstance(value, str | int | bool):
        problems.append(ConfigProblem(path, f"must be a JSON value, not a {type(value).__name__}"))


def _plain(value: Any) -> Any:
    """A deep copy with every mapping a dict and every sequence a list, as pydantic's strict
    mode expects, and so that validation never shares state with the caller's document."""
    if isinstance(value, Mapping):
        return {key: _plain(child) for key, child in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(child) for child in value]
    return value


def parse_yaml(text: str) -> dict[str, Any]:
    """Parse a config or template document; it must be a mapping with string keys."""
    try:
        document = yaml.load(text, Loader=_Loader)  # _Loader is a SafeLoader
    except yaml.YAMLError as exc:
        raise ConfigError.at("", _yaml_error_message(exc)) from exc
    except ValueError as exc:  # e.g. an integer longer than Python converts (4,300 digits)
        raise ConfigError.at("", f"a value cannot be read: {exc}") from exc
    if not isinstance(document, dict):
        got = "an empty document" if document is None else f"a {_json_kind(document)}"
        raise ConfigError.at("", f"the config must be a YAML mapping of keys to values, got {got}")
    problems: list[ConfigProblem] = []
    _json_problems(document, "", problems)
    if problems:
        raise ConfigError(problems)
    return document


def _json_kind(value: Any) -> str:
    if isinstance(value, list):
        return "list"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    return type(value).__name__


# --- validation ------------------------------------------------------------------------------


def validate_config(raw: Mapping[str, Any], *, complete: bool) -> ExperimentConfig:
    """Validate a config document and return the typed config, or raise every problem.

    complete=False: shapes, types and ranges only (templates; a user config before the
    template merge). complete=True: the merged config, which must also name an entrypoint
    and a fully specified searcher.
    """
    if not isinstance(raw, Mapping):
        raise ConfigError.at("", "the config must be a mapping of keys to values")
    problems: list[ConfigProblem] = []
    _json_problems(raw, "", problems)
    if problems:
        raise ConfigError(problems)
    document: dict[str, Any] = _plain(raw)

    cfg, bad_sections = _validate_sections(document, problems)
    if complete:
        problems.extend(_missing_required(document))
    if cfg is not None:
        for sections, check in _CHECKS:
            if sections & bad_sections:
                continue
            problems.extend(check(cfg, complete))
    if problems:
        raise ConfigError(_ordered(problems, list(document)))
    assert cfg is not None
    return cfg


def _validate_sections(
    document: dict[str, Any], problems: list[ConfigProblem]
) -> tuple[ExperimentConfig | None, set[str]]:
    """Validate with pydantic; on errors, revalidate without the broken top-level sections
    so the cross-field checks can still run on the sections that are fine."""
    sink: list[ConfigProblem] = []
    try:
        cfg = ExperimentConfig.model_validate(document, context={_SINK: sink})
    except ValidationError as exc:
        problems.extend(_problems_from(exc, ExperimentConfig))
        problems.extend(sink)
        bad = {str(err["loc"][0]) for err in exc.errors() if err["loc"]}
        if sink:
            bad.add("hyperparameters")
        if any(not err["loc"] for err in exc.errors()):
            return None, bad
        rest = {key: value for key, value in document.items() if key not in bad}
        try:
            return ExperimentConfig.model_validate(rest, context={_SINK: []}), bad
        except ValidationError:
            return None, bad
    problems.extend(sink)
    return cfg, {"hyperparameters"} if sink else set()


def _missing_required(document: Mapping[str, Any]) -> list[ConfigProblem]:
    """What an experiment cannot run without (Determined's "eventually required")."""
    problems: list[ConfigProblem] = []
    if document.get("entrypoint") is None:
        problems.append(ConfigProblem("entrypoint", "required"))
    searcher = document.get("searcher")
    if searcher is None:
        problems.append(ConfigProblem("searcher", "required"))
        return problems
    if not isinstance(searcher, Mapping):
        return problems  # reported as a type problem
    if searcher.get("name") is None:
        problems.append(
            ConfigProblem("searcher.name", "required; one of: " + ", ".join(SUPPORTED_SEARCHERS))
        )
    if searcher.get("metric") is None:
        problems.append(ConfigProblem("searcher.metric", "required"))
    name = searcher.get("name")
    if name in ("random", *asha.ASHA_SEARCHERS) and searcher.get("max_trials") is None:
        problems.append(ConfigProblem("searcher.max_trials", f"required by the {name} searcher"))
    return problems


def _check_searcher_fields(cfg: ExperimentConfig, complete: bool) -> list[ConfigProblem]:
    searcher = cfg.searcher
    if searcher is None or searcher.name is None:
        return []
    problems = [
        ConfigProblem(f"searcher.{field}", f"not a setting of the {searcher.name} searcher")
        for field, owners in _SEARCHER_ONLY_FIELDS.items()
        if field in searcher.model_fields_set and searcher.name not in owners
    ]
    # max_trials and metric missing are reported by _missing_required.
    required_present = searcher.max_trials is not None and searcher.metric is not None
    if complete and required_present and not problems and searcher.name in asha.ASHA_SEARCHERS:
        try:
            asha.parse_config(searcher.model_dump(exclude_unset=True))
        except ConfigError as exc:
            problems.extend(exc.problems)
    return problems


def _is_within(sub: str, host: str) -> bool:
    """A relative storage_path is taken inside host_path; an absolute one must lie in it."""
    if not posixpath.isabs(sub):
        return True
    host = posixpath.normpath(host)
    return posixpath.commonpath([host, posixpath.normpath(sub)]) == host


def _check_storage(cfg: ExperimentConfig, complete: bool) -> list[ConfigProblem]:
    storage = cfg.checkpoint_storage
    problems: list[ConfigProblem] = []
    if isinstance(storage, SharedFSStorage | PartialStorage):
        host, sub = storage.host_path, storage.storage_path
        if host is not None and sub is not None and not _is_within(sub, host):
            problems.append(
                ConfigProblem(
                    "checkpoint_storage.storage_path",
                    "must be a relative path or a directory inside host_path",
                )
            )
    if not complete or storage is None:
        return problems
    required: dict[type[BaseModel], tuple[str, ...]] = {
        SharedFSStorage: ("host_path",),
        DirectoryStorage: ("container_path",),
        S3Storage: ("bucket",),
        GCSStorage: ("bucket",),
        AzureStorage: ("container",),
    }
    if isinstance(storage, PartialStorage):
        return [
            *problems,
            ConfigProblem(
                "checkpoint_storage.type", "required; one of: " + ", ".join(STORAGE_TYPES)
            ),
        ]
    for field in required[type(storage)]:
        if getattr(storage, field) is None:
            problems.append(
                ConfigProblem(f"checkpoint_storage.{field}", f"required for {storage.type} storage")
            )
    if isinstance(storage, S3Storage) and (storage.access_key is None) != (
        storage.secret_key is None
    ):
        given, missing = (
            ("access_key", "secret_key")
            if storage.secret_key is None
            else ("secret_key", "access_key")
        )
        problems.append(
            ConfigProblem(
                f"checkpoint_storage.{missing}",
                f"required with {given} (or leave both out for the standard AWS credential chain)",
            )
        )
    if isinstance(storage, AzureStorage) and (storage.connection_string is None) == (
        storage.account_url is None
    ):
        problems.append(
            ConfigProblem(
                "checkpoint_storage.connection_string",
                "set exactly one of connection_string and account_url",
            )
        )
    return problems


def _is_positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _check_global_batch_size(hyperparameters: Mapping[str, Hyperparameter]) -> list[ConfigProblem]:
    """Determined accepts a positive integer, or an int/categorical search over them."""
    hp = hyperparameters.get("global_batch_size")
    if hp is None:
        return []
    if isinstance(hp, ConstHP):
        if _is_positive_int(hp.val):
            return []
        return [ConfigProblem(_GBS, "must be a positive integer")]
    if isinstance(hp, IntHP):
        if hp.minval >= 1:
            return []
        return [ConfigProblem(f"{_GBS}.minval", "must be at least 1")]
    if isinstance(hp, CategoricalHP):
        if all(_is_positive_int(val) for val in hp.vals):
            return []
        return [ConfigProblem(f"{_GBS}.vals", "must all be positive integers")]
    return [
        ConfigProblem(
            _GBS, "must be a positive integer or an int or categorical hyperparameter of them"
        )
    ]


def _check_batch_vs_slots(cfg: ExperimentConfig, complete: bool) -> list[ConfigProblem]:
    """Each slot trains on global_batch_size // slots_per_trial samples; 0 cannot train."""
    hp = cfg.hyperparameters.get("global_batch_size")
    slots = cfg.resources.slots_per_trial
    if not complete or not isinstance(hp, ConstHP) or not _is_positive_int(hp.val):
        return []
    if slots >= 1 and hp.val < slots:
        return [
            ConfigProblem(
                _GBS,
                f"global_batch_size {hp.val} is smaller than resources.slots_per_trial "
                f"({slots}), so each slot would train on 0 samples per batch; use a "
                f"global_batch_size of at least {slots} or fewer slots",
            )
        ]
    return []


def _check_max_slots(cfg: ExperimentConfig, complete: bool) -> list[ConfigProblem]:
    """A cap below one trial's gang would keep every trial waiting for ever."""
    resources = cfg.resources
    if resources.max_slots is None or resources.max_slots >= resources.slots_per_trial:
        return []
    return [
        ConfigProblem(
            "resources.max_slots",
            f"is {resources.max_slots}, below resources.slots_per_trial "
            f"({resources.slots_per_trial}): no trial could ever start",
        )
    ]


def _check_grid_counts(cfg: ExperimentConfig, complete: bool) -> list[ConfigProblem]:
    """The grid searcher needs a count for every range it enumerates."""
    if not complete or cfg.searcher is None or cfg.searcher.name != "grid":
        return []
    return [
        ConfigProblem(f"{path}.count", "is required when the grid searcher is used")
        for path, hp in _walk_hps(cfg.hyperparameters, "hyperparameters")
        if isinstance(hp, IntHP | DoubleHP | LogHP) and hp.count is None
    ]


def _check_workspace_project(cfg: ExperimentConfig, complete: bool) -> list[ConfigProblem]:
    """Determined: workspace and project are given together or not at all."""
    if not complete or (cfg.workspace is None) == (cfg.project is None):
        return []
    missing = "project" if cfg.project is None else "workspace"
    other = "workspace" if missing == "project" else "project"
    return [ConfigProblem(missing, f"required when {other} is set (give both or neither)")]


HOROVOD_LAUNCHER = "determined.launch.horovod"
DEEPSPEED_LAUNCHER = "determined.launch.deepspeed"


def _entrypoint_argv(entrypoint: Any) -> list[str]:
    """The entrypoint as arguments; empty when there is none or a string cannot be split
    (choosing the launch layout reports that one)."""
    if isinstance(entrypoint, list):
        return [arg for arg in entrypoint if isinstance(arg, str)]
    if not isinstance(entrypoint, str):
        return []
    try:
        return shlex.split(entrypoint)
    except ValueError:
        return []


def entrypoint_modules(entrypoint: Any) -> list[str]:
    """Every module the entrypoint runs with `-m MODULE` (or `-mMODULE`), in order: a
    launcher such as determined.launch.deepspeed, then whatever it runs in turn."""
    argv = _entrypoint_argv(entrypoint)
    modules = []
    for index, arg in enumerate(argv):
        if arg == "-m" and index + 1 < len(argv):
            modules.append(argv[index + 1])
        elif arg.startswith("-m") and not arg.startswith("--") and len(arg) > 2:
            modules.append(arg[2:])
    return modules


def _check_entrypoint(cfg: ExperimentConfig, complete: bool) -> list[ConfigProblem]:
    """What the agents cannot run, refused at submit rather than when a trial starts: a
    legacy Trial class (master.core.launch.entrypoint_argv's rule: one argument with a ':'
    and no '/'), and Determined's Horovod launcher."""
    argv = _entrypoint_argv(cfg.entrypoint)
    # Also the form Determined turns it into: a launcher given `--trial module:Class`.
    trial_class = [b for a, b in itertools.pairwise(argv) if a == "--trial"]
    if (len(argv) == 1 and ":" in argv[0] and "/" not in argv[0]) or trial_class:
        named = trial_class[0] if trial_class else argv[0]
        return [
            ConfigProblem(
                "entrypoint",
                f"{named!r} names a Trial class (Determined's legacy API), which resolute "
                "does not run; port it to the PyTorch Trainer and use `python3 -m "
                "determined.launch.torch_distributed python3 train.py`, or run a script "
                "(`python3 train.py`)",
            )
        ]
    if HOROVOD_LAUNCHER in entrypoint_modules(cfg.entrypoint):
        return [
            ConfigProblem(
                "entrypoint",
                f"runs {HOROVOD_LAUNCHER}, which resolute does not support: Horovod needs sshd "
                "between containers, which bare-process agents do not run; use "
                "determined.launch.torch_distributed",
            )
        ]
    return []


def registry_auth_problems(env: Environment) -> list[ConfigProblem]:
    """Credentials a pull could never log in with. Checked on a complete config only: a
    template may hold the username and the experiment's own config the password."""
    auth = env.registry_auth
    if auth is None or auth.auth or auth.identitytoken or auth.registrytoken:
        return []
    if auth.username and not auth.password:
        return [
            ConfigProblem(
                "environment.registry_auth.password",
                "required with a username (or give `auth`, base64 of username:password)",
            )
        ]
    if auth.password and not auth.username:
        return [
            ConfigProblem(
                "environment.registry_auth.username",
                "required with a password (or give `auth`, base64 of username:password)",
            )
        ]
    return []


def environment_problems(environment: Mapping[str, Any]) -> list[str]:
    """What is wrong with an environment section on its own (image names, registry_auth),
    as `key: problem` lines: the master's task_container_defaults pass these checks."""
    try:
        env = Environment.model_validate(environment)
    except ValidationError as exc:
        return [str(problem) for problem in _problems_from(exc, Environment)]
    return [
        str(ConfigProblem(p.path.removeprefix("environment."), p.message))
        for p in registry_auth_problems(env)
    ]


def _check_registry_auth(cfg: ExperimentConfig, complete: bool) -> list[ConfigProblem]:
    return registry_auth_problems(cfg.environment) if complete else []


_Check = Callable[[ExperimentConfig, bool], list[ConfigProblem]]

# Cross-field checks and the top-level sections they read; a check is skipped when one of
# its sections already failed validation, so it never reports on stand-in defaults.
_CHECKS: tuple[tuple[frozenset[str], _Check], ...] = (
    (frozenset({"searcher"}), _check_searcher_fields),
    (frozenset({"checkpoint_storage"}), _check_storage),
    (frozenset({"hyperparameters", "resources"}), _check_batch_vs_slots),
    (frozenset({"resources"}), _check_max_slots),
    (frozenset({"hyperparameters", "searcher"}), _check_grid_counts),
    (frozenset({"workspace", "project"}), _check_workspace_project),
    (frozenset({"entrypoint"}), _check_entrypoint),
    (frozenset({"environment"}), _check_registry_auth),
)


def _ordered(problems: list[ConfigProblem], keys: list[str]) -> list[ConfigProblem]:
    """Problems in document order (by top-level key), without duplicates."""
    position = {key: index for index, key in enumerate(keys)}
    unique = list(dict.fromkeys(problems))
    return sorted(unique, key=lambda p: position.get(p.path.split(".", 1)[0], len(keys)))


# --- output ----------------------------------------------------------------------------------


def effective_dict(cfg: ExperimentConfig) -> dict[str, Any]:
    """The JSON-ready config with defaults filled in: what the master stores and returns.

    Hyperparameters keep the user's structure in typed-dict form (`lr: 0.1` becomes
    `{type: const, val: 0.1}`); nested groups stay plain mappings.
    """
    out: dict[str, Any] = cfg.model_dump(mode="json")
    out["hyperparameters"] = _hp_to_raw(cfg.hyperparameters)
    searcher = out.get("searcher")
    if cfg.searcher is not None and cfg.searcher.name is not None and isinstance(searcher, dict):
        for field, owners in _SEARCHER_ONLY_FIELDS.items():
            if cfg.searcher.name not in owners:
                searcher.pop(field, None)
        # Determined's defaults, written out so the stored config says what the search used.
        for field, default in _ASHA_DEFAULTS.get(cfg.searcher.name, {}).items():
            if searcher.get(field) is None:
                searcher[field] = copy.deepcopy(default)
    return out


def config_warnings(cfg: ExperimentConfig) -> list[str]:
    """Things that are allowed but probably not what the user meant."""
    warnings: list[str] = _docker_only_warnings(cfg.environment)
    warnings += _container_mount_warnings(cfg)
    warnings += _retired_resources_warnings(cfg.resources)
    warnings += _unserved_warnings(cfg)
    hp = cfg.hyperparameters.get("global_batch_size")
    slots = cfg.resources.slots_per_trial
    if isinstance(hp, ConstHP) and _is_positive_int(hp.val) and slots >= 1:
        gbs: int = hp.val
        if gbs % slots:
            warnings.append(
                f"{_GBS} ({gbs}) is not divisible by resources.slots_per_trial ({slots}): "
                f"each slot trains on {gbs // slots} samples per batch and {gbs % slots} "
                f"samples of every global batch are dropped; use a multiple of {slots}"
            )
    elif isinstance(hp, IntHP) and slots > 1 and hp.minval < slots:
        warnings.append(
            f"{_GBS} can be as small as {hp.minval}, below resources.slots_per_trial "
            f"({slots}); trials that draw a batch size under {slots} give each slot 0 samples"
        )
    elif isinstance(hp, CategoricalHP) and slots > 1:
        small = [val for val in hp.vals if _is_positive_int(val) and val < slots]
        if small:
            warnings.append(
                f"{_GBS} values {small} are below resources.slots_per_trial ({slots}); "
                "trials that use them give each slot 0 samples"
            )
    return warnings


_RUNTIME = "agents started with --container-runtime podman|docker"
_NO_CONTAINERS = (
    "no capabilities are added or dropped: trials run as processes on the host, or in "
    "containers with the runtime's default capabilities"
)


def _unserved_warnings(cfg: ExperimentConfig) -> list[str]:
    """Determined's keys whose work its master does and this one does not (yet)."""
    warnings: list[str] = []
    if cfg.log_policies:
        warnings.append(
            "log_policies does not apply: the master does not match a trial's logs against "
            "patterns, so no policy's action is taken"
        )
    if cfg.environment.proxy_ports:
        ports = ", ".join(str(p.proxy_port) for p in cfg.environment.proxy_ports)
        warnings.append(
            f"environment.proxy_ports ({ports}) does not apply: the master does not proxy a "
            "trial's ports; trials listen on the host's network directly"
        )
    return warnings


def _retired_resources_warnings(resources: Resources) -> list[str]:
    warnings: list[str] = []
    if resources.agent_label:
        warnings.append(
            f"resources.agent_label ({resources.agent_label!r}) does not apply: trials are "
            "placed by resource pool; name one in resources.resource_pool"
        )
    if resources.native_parallel:
        warnings.append(
            "resources.native_parallel (true) does not apply: a trial's processes are "
            "started as its entrypoint and launch layout say"
        )
    return warnings


def _container_mount_warnings(cfg: ExperimentConfig) -> list[str]:
    """bind_mounts and resources.shm_size are made in the trial's private mount namespace
    (agent/bootstrap.py); what of them cannot hold there is named, so a config that relied
    on it is not silently running without it: mount propagation to or from the host, and
    devices, which only a container's device cgroup gives or takes (on agents with a
    container runtime, when the config names an image)."""
    warnings: list[str] = []
    for index, mount in enumerate(cfg.bind_mounts):
        if mount.propagation not in mounts.PRIVATE_PROPAGATIONS:
            warnings.append(
                f"bind_mounts.{index}.propagation ({mount.propagation}) does not apply: "
                "every mount of a trial is private to its mount namespace (rprivate), so "
                "mounts made later under the path are not shared with the host"
            )
    if cfg.resources.devices:
        paths = ", ".join(device.host_path for device in cfg.resources.devices)
        warnings.append(
            f"resources.devices ({paths}) apply only in containers: where environment.image "
            f"runs on {_RUNTIME}; a trial run on the host sees the host's devices as the "
            "agent's user may open them"
        )
    return warnings


def _docker_only_warnings(env: Environment) -> list[str]:
    """A note on where the image applies, and one warning per Docker-only environment key
    the config sets to something (an empty list asks for nothing and is not mentioned).
    These keys are accepted, never refused, so Determined's configs submit unchanged."""
    warnings: list[str] = []
    if isinstance(env.image, EnvironmentImageMap):
        shown = ", ".join(
            f"{kind}: {name}" for kind, name in env.image.model_dump().items() if name
        )
    else:
        shown = env.image or ""
    if shown:
        warnings.append(
            f"environment.image ({shown}) is used on {_RUNTIME}; agents without a runtime "
            "run the trial's processes on the host, where PATH in "
            "environment.environment_variables chooses the interpreter"
        )
        variables = env.environment_variables
        lists = (
            list(variables.model_dump().values())
            if isinstance(variables, EnvironmentVariablesMap)
            else [variables]
        )
        broken = sorted(
            {item.split("=", 1)[0] for items in lists for item in items or () if "\n" in item}
        )
        if broken:
            warnings.append(
                f"environment.environment_variables {', '.join(broken)}: a value with a line "
                f"break cannot be given to a container, so on {_RUNTIME} the trial ends at "
                "its start; pass such a value as a file (bind_mounts)"
            )
    for key, names in (
        ("add_capabilities", env.add_capabilities),
        ("drop_capabilities", env.drop_capabilities),
    ):
        if names:
            warnings.append(
                f"environment.{key} ({', '.join(names)}) does not apply: {_NO_CONTAINERS}"
            )
    if env.ports:
        ports = ", ".join(f"{name}: {port}" for name, port in env.ports.items())
        warnings.append(
            f"environment.ports ({ports}) does not apply: trials use the host's network "
            "directly, so a port a trial listens on is already the host's and nothing is "
            "published"
        )
    return warnings
