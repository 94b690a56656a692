from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ExitKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EXIT_KIND_UNSPECIFIED: _ClassVar[ExitKind]
    EXIT_KIND_COMPLETED: _ClassVar[ExitKind]
    EXIT_KIND_FAILED: _ClassVar[ExitKind]
    EXIT_KIND_STOPPED: _ClassVar[ExitKind]
    EXIT_KIND_UNRUNNABLE: _ClassVar[ExitKind]
    EXIT_KIND_FENCED: _ClassVar[ExitKind]

class LaunchLayout(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LAUNCH_LAYOUT_PER_SLOT: _ClassVar[LaunchLayout]
    LAUNCH_LAYOUT_PER_AGENT: _ClassVar[LaunchLayout]
EXIT_KIND_UNSPECIFIED: ExitKind
EXIT_KIND_COMPLETED: ExitKind
EXIT_KIND_FAILED: ExitKind
EXIT_KIND_STOPPED: ExitKind
EXIT_KIND_UNRUNNABLE: ExitKind
EXIT_KIND_FENCED: ExitKind
LAUNCH_LAYOUT_PER_SLOT: LaunchLayout
LAUNCH_LAYOUT_PER_AGENT: LaunchLayout

class AgentMessage(_message.Message):
    __slots__ = ("hello", "heartbeat", "prepared", "started", "exited", "logs")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    PREPARED_FIELD_NUMBER: _ClassVar[int]
    STARTED_FIELD_NUMBER: _ClassVar[int]
    EXITED_FIELD_NUMBER: _ClassVar[int]
    LOGS_FIELD_NUMBER: _ClassVar[int]
    hello: Hello
    heartbeat: Heartbeat
    prepared: AllocationPrepared
    started: AllocationStarted
    exited: AllocationExited
    logs: LogBatch
    def __init__(self, hello: _Optional[_Union[Hello, _Mapping]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ..., prepared: _Optional[_Union[AllocationPrepared, _Mapping]] = ..., started: _Optional[_Union[AllocationStarted, _Mapping]] = ..., exited: _Optional[_Union[AllocationExited, _Mapping]] = ..., logs: _Optional[_Union[LogBatch, _Mapping]] = ...) -> None: ...

class Device(_message.Message):
    __slots__ = ("slot_id", "type", "brand", "uuid", "memory_bytes", "index")
    SLOT_ID_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    BRAND_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    slot_id: int
    type: str
    brand: str
    uuid: str
    memory_bytes: int
    index: int
    def __init__(self, slot_id: _Optional[int] = ..., type: _Optional[str] = ..., brand: _Optional[str] = ..., uuid: _Optional[str] = ..., memory_bytes: _Optional[int] = ..., index: _Optional[int] = ...) -> None: ...

class NetworkInterface(_message.Message):
    __slots__ = ("name", "ipv4")
    NAME_FIELD_NUMBER: _ClassVar[int]
    IPV4_FIELD_NUMBER: _ClassVar[int]
    name: str
    ipv4: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., ipv4: _Optional[_Iterable[str]] = ...) -> None: ...

class RunningAllocation(_message.Message):
    __slots__ = ("allocation_id", "ranks")
    ALLOCATION_ID_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    allocation_id: str
    ranks: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, allocation_id: _Optional[str] = ..., ranks: _Optional[_Iterable[int]] = ...) -> None: ...

class Hello(_message.Message):
    __slots__ = ("agent_id", "resource_pool", "version", "hostname", "join_token", "devices", "interfaces", "running", "exited", "instance_id", "agent_secret", "container_runtime")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_POOL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    JOIN_TOKEN_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    INTERFACES_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    EXITED_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_SECRET_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_RUNTIME_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    resource_pool: str
    version: str
    hostname: str
    join_token: str
    devices: _containers.RepeatedCompositeFieldContainer[Device]
    interfaces: _containers.RepeatedCompositeFieldContainer[NetworkInterface]
    running: _containers.RepeatedCompositeFieldContainer[RunningAllocation]
    exited: _containers.RepeatedCompositeFieldContainer[AllocationExited]
    instance_id: str
    agent_secret: str
    container_runtime: str
    def __init__(self, agent_id: _Optional[str] = ..., resource_pool: _Optional[str] = ..., version: _Optional[str] = ..., hostname: _Optional[str] = ..., join_token: _Optional[str] = ..., devices: _Optional[_Iterable[_Union[Device, _Mapping]]] = ..., interfaces: _Optional[_Iterable[_Union[NetworkInterface, _Mapping]]] = ..., running: _Optional[_Iterable[_Union[RunningAllocation, _Mapping]]] = ..., exited: _Optional[_Iterable[_Union[AllocationExited, _Mapping]]] = ..., instance_id: _Optional[str] = ..., agent_secret: _Optional[str] = ..., container_runtime: _Optional[str] = ...) -> None: ...

class GpuSample(_message.Message):
    __slots__ = ("index", "uuid", "gpu_util", "gpu_memory_used", "gpu_free_memory", "temperature_c", "power_w")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    GPU_UTIL_FIELD_NUMBER: _ClassVar[int]
    GPU_MEMORY_USED_FIELD_NUMBER: _ClassVar[int]
    GPU_FREE_MEMORY_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_C_FIELD_NUMBER: _ClassVar[int]
    POWER_W_FIELD_NUMBER: _ClassVar[int]
    index: int
    uuid: str
    gpu_util: float
    gpu_memory_used: int
    gpu_free_memory: int
    temperature_c: float
    power_w: float
    def __init__(self, index: _Optional[int] = ..., uuid: _Optional[str] = ..., gpu_util: _Optional[float] = ..., gpu_memory_used: _Optional[int] = ..., gpu_free_memory: _Optional[int] = ..., temperature_c: _Optional[float] = ..., power_w: _Optional[float] = ...) -> None: ...

class MetricSample(_message.Message):
    __slots__ = ("unix_millis", "gpus", "cpu_util_simple", "memory_free", "memory_used", "disk_throughput_read", "disk_throughput_write", "disk_iops", "net_throughput_sent", "net_throughput_recv")
    UNIX_MILLIS_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    CPU_UTIL_SIMPLE_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FREE_FIELD_NUMBER: _ClassVar[int]
    MEMORY_USED_FIELD_NUMBER: _ClassVar[int]
    DISK_THROUGHPUT_READ_FIELD_NUMBER: _ClassVar[int]
    DISK_THROUGHPUT_WRITE_FIELD_NUMBER: _ClassVar[int]
    DISK_IOPS_FIELD_NUMBER: _ClassVar[int]
    NET_THROUGHPUT_SENT_FIELD_NUMBER: _ClassVar[int]
    NET_THROUGHPUT_RECV_FIELD_NUMBER: _ClassVar[int]
    unix_millis: int
    gpus: _containers.RepeatedCompositeFieldContainer[GpuSample]
    cpu_util_simple: float
    memory_free: int
    memory_used: int
    disk_throughput_read: float
    disk_throughput_write: float
    disk_iops: float
    net_throughput_sent: float
    net_throughput_recv: float
    def __init__(self, unix_millis: _Optional[int] = ..., gpus: _Optional[_Iterable[_Union[GpuSample, _Mapping]]] = ..., cpu_util_simple: _Optional[float] = ..., memory_free: _Optional[int] = ..., memory_used: _Optional[int] = ..., disk_throughput_read: _Optional[float] = ..., disk_throughput_write: _Optional[float] = ..., disk_iops: _Optional[float] = ..., net_throughput_sent: _Optional[float] = ..., net_throughput_recv: _Optional[float] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ("seq", "sent_unix_nanos", "samples", "last_round_trip_micros")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    SENT_UNIX_NANOS_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    LAST_ROUND_TRIP_MICROS_FIELD_NUMBER: _ClassVar[int]
    seq: int
    sent_unix_nanos: int
    samples: _containers.RepeatedCompositeFieldContainer[MetricSample]
    last_round_trip_micros: int
    def __init__(self, seq: _Optional[int] = ..., sent_unix_nanos: _Optional[int] = ..., samples: _Optional[_Iterable[_Union[MetricSample, _Mapping]]] = ..., last_round_trip_micros: _Optional[int] = ...) -> None: ...

class AllocationPrepared(_message.Message):
    __slots__ = ("allocation_id", "master_port", "error", "extra_ports")
    ALLOCATION_ID_FIELD_NUMBER: _ClassVar[int]
    MASTER_PORT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    EXTRA_PORTS_FIELD_NUMBER: _ClassVar[int]
    allocation_id: str
    master_port: int
    error: str
    extra_ports: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, allocation_id: _Optional[str] = ..., master_port: _Optional[int] = ..., error: _Optional[str] = ..., extra_ports: _Optional[_Iterable[int]] = ...) -> None: ...

class AllocationStarted(_message.Message):
    __slots__ = ("allocation_id", "pids")
    ALLOCATION_ID_FIELD_NUMBER: _ClassVar[int]
    PIDS_FIELD_NUMBER: _ClassVar[int]
    allocation_id: str
    pids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, allocation_id: _Optional[str] = ..., pids: _Optional[_Iterable[int]] = ...) -> None: ...

class RankExit(_message.Message):
    __slots__ = ("rank", "exit_code")
    RANK_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    rank: int
    exit_code: int
    def __init__(self, rank: _Optional[int] = ..., exit_code: _Optional[int] = ...) -> None: ...

class AllocationExited(_message.Message):
    __slots__ = ("allocation_id", "kind", "exits", "message")
    ALLOCATION_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    EXITS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    allocation_id: str
    kind: ExitKind
    exits: _containers.RepeatedCompositeFieldContainer[RankExit]
    message: str
    def __init__(self, allocation_id: _Optional[str] = ..., kind: _Optional[_Union[ExitKind, str]] = ..., exits: _Optional[_Iterable[_Union[RankExit, _Mapping]]] = ..., message: _Optional[str] = ...) -> None: ...

class LogEntry(_message.Message):
    __slots__ = ("allocation_id", "rank", "stdtype", "unix_micros", "message")
    ALLOCATION_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    STDTYPE_FIELD_NUMBER: _ClassVar[int]
    UNIX_MICROS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    allocation_id: str
    rank: int
    stdtype: str
    unix_micros: int
    message: str
    def __init__(self, allocation_id: _Optional[str] = ..., rank: _Optional[int] = ..., stdtype: _Optional[str] = ..., unix_micros: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class LogBatch(_message.Message):
    __slots__ = ("entries",)
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[LogEntry]
    def __init__(self, entries: _Optional[_Iterable[_Union[LogEntry, _Mapping]]] = ...) -> None: ...

class MasterMessage(_message.Message):
    __slots__ = ("welcome", "refused", "heartbeat_ack", "prepare", "start", "stop", "exit_ack")
    WELCOME_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_ACK_FIELD_NUMBER: _ClassVar[int]
    PREPARE_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    EXIT_ACK_FIELD_NUMBER: _ClassVar[int]
    welcome: Welcome
    refused: Refused
    heartbeat_ack: HeartbeatAck
    prepare: PrepareAllocation
    start: StartAllocation
    stop: StopAllocation
    exit_ack: ExitAck
    def __init__(self, welcome: _Optional[_Union[Welcome, _Mapping]] = ..., refused: _Optional[_Union[Refused, _Mapping]] = ..., heartbeat_ack: _Optional[_Union[HeartbeatAck, _Mapping]] = ..., prepare: _Optional[_Union[PrepareAllocation, _Mapping]] = ..., start: _Optional[_Union[StartAllocation, _Mapping]] = ..., stop: _Optional[_Union[StopAllocation, _Mapping]] = ..., exit_ack: _Optional[_Union[ExitAck, _Mapping]] = ...) -> None: ...

class Welcome(_message.Message):
    __slots__ = ("stream_id", "master_id", "heartbeat_interval_s", "metrics_period_s", "stop_allocation_ids", "fence_after_s", "fence_kill_after_s", "agent_secret")
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    MASTER_ID_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    METRICS_PERIOD_S_FIELD_NUMBER: _ClassVar[int]
    STOP_ALLOCATION_IDS_FIELD_NUMBER: _ClassVar[int]
    FENCE_AFTER_S_FIELD_NUMBER: _ClassVar[int]
    FENCE_KILL_AFTER_S_FIELD_NUMBER: _ClassVar[int]
    AGENT_SECRET_FIELD_NUMBER: _ClassVar[int]
    stream_id: str
    master_id: str
    heartbeat_interval_s: float
    metrics_period_s: float
    stop_allocation_ids: _containers.RepeatedScalarFieldContainer[str]
    fence_after_s: float
    fence_kill_after_s: float
    agent_secret: str
    def __init__(self, stream_id: _Optional[str] = ..., master_id: _Optional[str] = ..., heartbeat_interval_s: _Optional[float] = ..., metrics_period_s: _Optional[float] = ..., stop_allocation_ids: _Optional[_Iterable[str]] = ..., fence_after_s: _Optional[float] = ..., fence_kill_after_s: _Optional[float] = ..., agent_secret: _Optional[str] = ...) -> None: ...

class Refused(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...

class HeartbeatAck(_message.Message):
    __slots__ = ("seq", "sent_unix_nanos")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    SENT_UNIX_NANOS_FIELD_NUMBER: _ClassVar[int]
    seq: int
    sent_unix_nanos: int
    def __init__(self, seq: _Optional[int] = ..., sent_unix_nanos: _Optional[int] = ...) -> None: ...

class PrepareAllocation(_message.Message):
    __slots__ = ("allocation_id", "extra_ports")
    ALLOCATION_ID_FIELD_NUMBER: _ClassVar[int]
    EXTRA_PORTS_FIELD_NUMBER: _ClassVar[int]
    allocation_id: str
    extra_ports: int
    def __init__(self, allocation_id: _Optional[str] = ..., extra_ports: _Optional[int] = ...) -> None: ...

class RankSpec(_message.Message):
    __slots__ = ("rank", "local_rank", "slot_ids")
    RANK_FIELD_NUMBER: _ClassVar[int]
    LOCAL_RANK_FIELD_NUMBER: _ClassVar[int]
    SLOT_IDS_FIELD_NUMBER: _ClassVar[int]
    rank: int
    local_rank: int
    slot_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, rank: _Optional[int] = ..., local_rank: _Optional[int] = ..., slot_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class StartAllocation(_message.Message):
    __slots__ = ("allocation_id", "trial_id", "experiment_id", "ranks", "argv", "env", "model_definition", "stop_grace_s", "layout", "info_files", "shared_fs_host_path", "bind_mounts", "shm_size_bytes", "owner_id", "container")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class InfoFilesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ALLOCATION_ID_FIELD_NUMBER: _ClassVar[int]
    TRIAL_ID_FIELD_NUMBER: _ClassVar[int]
    EXPERIMENT_ID_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    ARGV_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    MODEL_DEFINITION_FIELD_NUMBER: _ClassVar[int]
    STOP_GRACE_S_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    INFO_FILES_FIELD_NUMBER: _ClassVar[int]
    SHARED_FS_HOST_PATH_FIELD_NUMBER: _ClassVar[int]
    BIND_MOUNTS_FIELD_NUMBER: _ClassVar[int]
    SHM_SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    OWNER_ID_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_FIELD_NUMBER: _ClassVar[int]
    allocation_id: str
    trial_id: int
    experiment_id: int
    ranks: _containers.RepeatedCompositeFieldContainer[RankSpec]
    argv: _containers.RepeatedScalarFieldContainer[str]
    env: _containers.ScalarMap[str, str]
    model_definition: bytes
    stop_grace_s: float
    layout: LaunchLayout
    info_files: _containers.ScalarMap[str, str]
    shared_fs_host_path: str
    bind_mounts: _containers.RepeatedCompositeFieldContainer[BindMount]
    shm_size_bytes: int
    owner_id: int
    container: Container
    def __init__(self, allocation_id: _Optional[str] = ..., trial_id: _Optional[int] = ..., experiment_id: _Optional[int] = ..., ranks: _Optional[_Iterable[_Union[RankSpec, _Mapping]]] = ..., argv: _Optional[_Iterable[str]] = ..., env: _Optional[_Mapping[str, str]] = ..., model_definition: _Optional[bytes] = ..., stop_grace_s: _Optional[float] = ..., layout: _Optional[_Union[LaunchLayout, str]] = ..., info_files: _Optional[_Mapping[str, str]] = ..., shared_fs_host_path: _Optional[str] = ..., bind_mounts: _Optional[_Iterable[_Union[BindMount, _Mapping]]] = ..., shm_size_bytes: _Optional[int] = ..., owner_id: _Optional[int] = ..., container: _Optional[_Union[Container, _Mapping]] = ...) -> None: ...

class Container(_message.Message):
    __slots__ = ("image", "force_pull", "registry_auth", "devices")
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    FORCE_PULL_FIELD_NUMBER: _ClassVar[int]
    REGISTRY_AUTH_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    image: str
    force_pull: bool
    registry_auth: RegistryAuth
    devices: _containers.RepeatedCompositeFieldContainer[DeviceMapping]
    def __init__(self, image: _Optional[str] = ..., force_pull: _Optional[bool] = ..., registry_auth: _Optional[_Union[RegistryAuth, _Mapping]] = ..., devices: _Optional[_Iterable[_Union[DeviceMapping, _Mapping]]] = ...) -> None: ...

class RegistryAuth(_message.Message):
    __slots__ = ("username", "password", "auth", "serveraddress", "identitytoken", "registrytoken")
    USERNAME_FIELD_NUMBER: _ClassVar[int]
    PASSWORD_FIELD_NUMBER: _ClassVar[int]
    AUTH_FIELD_NUMBER: _ClassVar[int]
    SERVERADDRESS_FIELD_NUMBER: _ClassVar[int]
    IDENTITYTOKEN_FIELD_NUMBER: _ClassVar[int]
    REGISTRYTOKEN_FIELD_NUMBER: _ClassVar[int]
    username: str
    password: str
    auth: str
    serveraddress: str
    identitytoken: str
    registrytoken: str
    def __init__(self, username: _Optional[str] = ..., password: _Optional[str] = ..., auth: _Optional[str] = ..., serveraddress: _Optional[str] = ..., identitytoken: _Optional[str] = ..., registrytoken: _Optional[str] = ...) -> None: ...

class DeviceMapping(_message.Message):
    __slots__ = ("host_path", "container_path", "cgroup_permissions")
    HOST_PATH_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_PATH_FIELD_NUMBER: _ClassVar[int]
    CGROUP_PERMISSIONS_FIELD_NUMBER: _ClassVar[int]
    host_path: str
    container_path: str
    cgroup_permissions: str
    def __init__(self, host_path: _Optional[str] = ..., container_path: _Optional[str] = ..., cgroup_permissions: _Optional[str] = ...) -> None: ...

class BindMount(_message.Message):
    __slots__ = ("host_path", "container_path", "read_only")
    HOST_PATH_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_PATH_FIELD_NUMBER: _ClassVar[int]
    READ_ONLY_FIELD_NUMBER: _ClassVar[int]
    host_path: str
    container_path: str
    read_only: bool
    def __init__(self, host_path: _Optional[str] = ..., container_path: _Optional[str] = ..., read_only: _Optional[bool] = ...) -> None: ...

class StopAllocation(_message.Message):
    __slots__ = ("allocation_id", "reason", "grace_s")
    ALLOCATION_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    GRACE_S_FIELD_NUMBER: _ClassVar[int]
    allocation_id: str
    reason: str
    grace_s: float
    def __init__(self, allocation_id: _Optional[str] = ..., reason: _Optional[str] = ..., grace_s: _Optional[float] = ...) -> None: ...

class ExitAck(_message.Message):
    __slots__ = ("allocation_id",)
    ALLOCATION_ID_FIELD_NUMBER: _ClassVar[int]
    allocation_id: str
    def __init__(self, allocation_id: _Optional[str] = ...) -> None: ...
