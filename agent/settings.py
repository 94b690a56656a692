"""Agent settings: command-line flags over `DET_AGENT_*` variables over an optional YAML file."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from master.settings import YamlFileSource

CONFIG_FILE_ENV = "DET_AGENT_CONFIG_FILE"


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
    reconnect_max_backoff_s: float = Field(
        default=5.0, gt=0, description="Longest wait between attempts to reach the master."
    )
    log_level: str = Field(default="INFO", description="Python logging level.")
    log_format: Literal["text", "json"] = Field(default="text", description="Log line format.")
    max_message_mb: int = Field(default=160, ge=4, description="Largest gRPC message.")

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

    @model_validator(mode="after")
    def _token(self) -> AgentSettings:
        if self.join_token_file is not None and not self.join_token:
            try:
                self.join_token = self.join_token_file.read_text().strip()
            except OSError as exc:
                raise ValueError(f"join_token_file: cannot read it: {exc.strerror}") from None
        return self

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
