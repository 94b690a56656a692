"""Agent settings: command-line flags over `DET_AGENT_*` variables over an optional YAML file."""

from __future__ import annotations

import grp
import pwd
import socket
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from agent import ports, rank_user
from resolute._yaml_settings import YamlFileSource, absolute_path

CONFIG_FILE_ENV = "DET_AGENT_CONFIG_FILE"
DEFAULT_UID_SPACE = rank_user.DEFAULT_UID_SPACE  # the field rank_user hides the module


class AgentSettings(BaseSettings):
    """Every agent setting. Env vars: DET_AGENT_<FIELD> (DET_AGENT_ARTIFICIAL_SLOTS=2)."""

    model_config = SettingsConfigDict(env_prefix="DET_AGENT_", extra="forbid")

    master: str = Field(
        default="127.0.0.1:8090",
        description=(
            "HOST:PORT of the master's agent gRPC port; several, comma-separated, for a "
            "leader and its standbys (tried in turn)."
        ),
    )
    id: str = Field(default_factory=socket.gethostname, description="Agent id; the host name.")
    resource_pool: str = Field(default="default", description="Pool the agent's slots join.")
    artificial_slots: int | None = Field(
        default=None,
        ge=1,
        le=1024,
        description="Offer this many CPU slots instead of the machine's GPUs (no GPU needed).",
    )
    work_dir: Path = Field(
        default=Path("agent-work"), description="Per-allocation directories go here."
    )
    join_token: str = Field(default="", description="The master's cluster join token.")
    join_token_file: Path | None = Field(
        default=None, description="Read the join token from this file instead."
    )
    master_cert_file: Path | None = Field(
        default=None,
        description=(
            "CA bundle (PEM) the master's certificate must verify against: the agent then "
            "dials with TLS and sends nothing before it has verified the master. Its ranks "
            "get a copy (DET_MASTER_CERT_FILE). Unset: plain gRPC. Determined's "
            "security.tls.master_cert."
        ),
    )
    master_cert_name: str | None = Field(
        default=None,
        description=(
            "Name to verify the master's certificate for instead of the host in `master` "
            "(Determined's security.tls.master_cert_name)."
        ),
    )
    rank_user: str | None = Field(
        default=None,
        description=(
            "Run ranks (and every process the agent starts for a trial) as this user, shared "
            "by every allocation, instead of a uid of their own per allocation; needs an "
            "agent running as root. `root` keeps them as root, warned about at start: they "
            "can then read the agent's secrets and every trial's files. Unset: as root, a "
            "uid of their own (rank_uid_range); otherwise the agent's own user."
        ),
    )
    rank_group: str | None = Field(
        default=None, description="The ranks' group; rank_user's primary group if unset."
    )
    rank_uid_range: str | None = Field(
        default=None,
        description=(
            "START-END: instead of rank_user, run each allocation's ranks as a uid of their "
            "own from this range (in the group of the experiment's owner, no passwd entry "
            "needed), so trials cannot read each other's files, S3 keys or /proc; needs "
            "root. Unset on an agent running as root without rank_user: "
            f"a block of 1024 uids of {DEFAULT_UID_SPACE} picked by the agent's id."
        ),
    )
    port_range: str = Field(
        default=ports.DEFAULT_PORT_RANGE,
        description=(
            "START-END: the ports handed to a trial's chief (the rendezvous, Determined's "
            "broadcast sockets). Ports of the kernel's ephemeral range "
            "(net.ipv4.ip_local_port_range) are left out: an outgoing connection could take "
            "one before the trial binds it."
        ),
    )
    credential_file: Path | None = Field(
        default=None,
        description=(
            "Where the agent keeps the secret the master issues when it first joins "
            "(owner-only); default <work_dir>/agent-credential. Back it up with the node: "
            "without it an enrolled id is refused."
        ),
    )
    container_runtime: Literal["none", "podman", "docker"] = Field(
        default="none",
        description=(
            "Run launches whose config names environment.image in containers of that image, "
            "with podman or Docker's CLI; none: every launch runs as processes on the host."
        ),
    )
    insecure_registries: list[str] = Field(
        default_factory=list,
        description=(
            "HOST[:PORT] of registries podman pulls from without verifying TLS (plain HTTP, "
            "or a certificate the host does not trust). Docker's daemon has its own list."
        ),
    )
    reconnect_max_backoff_s: float = Field(
        default=5.0, gt=0, description="Longest wait between attempts to reach the master."
    )
    log_level: str = Field(default="INFO", description="Python logging level.")
    log_format: Literal["text", "json"] = Field(default="text", description="Log line format.")
    max_message_mb: int = Field(default=160, ge=4, description="Largest gRPC message.")

    @property
    def credential_path(self) -> Path:
        return self.credential_file or self.work_dir / "agent-credential"

    @field_validator(
        "work_dir", "join_token_file", "master_cert_file", "credential_file", mode="before"
    )
    @classmethod
    def _absolute(cls, value: object) -> object:
        return absolute_path(value)

    @field_validator("master")
    @classmethod
    def _host_port(cls, value: str) -> str:
        host, sep, port = value.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{value!r} is not HOST:PORT")
        return value

    @field_validator("id")
    @classmethod
    def _agent_id(cls, value: str) -> str:
        if not value or "/" in value or len(value) > 256:
            raise ValueError("must be 1-256 characters without '/'")
        return value

    @field_validator("rank_user", "rank_group", "rank_uid_range", mode="before")
    @classmethod
    def _blank_is_unset(cls, value: object) -> object:
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("rank_user")
    @classmethod
    def _rank_user(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                pwd.getpwnam(value)
            except KeyError:
                raise PydanticCustomError(
                    "no_such_user", "no such user '{user}'", {"user": value}
                ) from None
        return value

    @field_validator("rank_group")
    @classmethod
    def _rank_group(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        if "rank_user" in info.data and info.data["rank_user"] is None:  # not when invalid
            raise PydanticCustomError("needs_rank_user", "rank_group needs rank_user", {})
        try:
            grp.getgrnam(value)
        except KeyError:
            raise PydanticCustomError(
                "no_such_group", "no such group '{group}'", {"group": value}
            ) from None
        return value

    @field_validator("rank_uid_range")
    @classmethod
    def _rank_uid_range(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        if info.data.get("rank_user") is not None:
            raise PydanticCustomError(
                "rank_user_and_range",
                "rank_user and rank_uid_range are alternatives: set one of them",
                {},
            )
        try:
            rank_user.parse_uid_range(value)
        except ValueError as exc:
            raise PydanticCustomError("uid_range", "{problem}", {"problem": str(exc)}) from None
        return value.strip()

    @field_validator("port_range")
    @classmethod
    def _port_range(cls, value: str) -> str:
        try:
            ports.parse_port_range(value)
        except ValueError as exc:
            raise PydanticCustomError("port_range", "{problem}", {"problem": str(exc)}) from None
        return value.strip()

    @model_validator(mode="after")
    def _token(self) -> AgentSettings:
        if self.join_token_file is not None and not self.join_token:
            try:
                self.join_token = self.join_token_file.read_text().strip()
            except OSError as exc:
                raise ValueError(f"join_token_file: cannot read it: {exc.strerror}") from None
        return self

    @field_validator("master_cert_file")
    @classmethod
    def _a_ca_file(cls, value: Path | None) -> Path | None:
        if value is not None:
            try:
                data = value.read_bytes()
            except OSError as exc:
                raise ValueError(f"cannot read {value}: {exc.strerror}") from None
            if b"-----BEGIN CERTIFICATE-----" not in data:
                raise ValueError(f"no PEM certificate in {value}")
        return value

    @field_validator("master_cert_name")
    @classmethod
    def _name_with_a_ca_file(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None and "master_cert_file" in info.data:  # not when that is invalid
            if info.data["master_cert_file"] is None:
                raise ValueError("needs master_cert_file, the CA to verify the master with")
            if not value.strip():
                raise ValueError("must not be blank")
        return value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, YamlFileSource(settings_cls, CONFIG_FILE_ENV))
