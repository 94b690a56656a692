"""What `MasterSettings` and `AgentSettings` share: the YAML settings source, and path
settings made absolute.

It lives here, in the package both already depend on, so that the agent never imports the
master package (and with it the web stack a GPU node does not install)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError
from pydantic_core import PydanticCustomError
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource


class YamlFileSource(PydanticBaseSettingsSource):
    """Reads the YAML file named by an environment variable, if it is set (the master's
    and the agent's settings both use it)."""

    def __init__(self, settings_cls: type[BaseSettings], env_var: str) -> None:
        super().__init__(settings_cls)
        self.env_var = env_var

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # unused: __call__ returns the whole mapping

    def __call__(self) -> dict[str, Any]:
        path = os.environ.get(self.env_var)
        if not path:
            return {}
        try:
            data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
        except OSError as exc:
            raise self._error(path, f"cannot read it: {exc.strerror}") from None
        except (yaml.YAMLError, UnicodeDecodeError) as exc:
            raise self._error(path, f"not valid YAML: {one_line(exc)}") from None
        if not isinstance(data, dict):
            raise self._error(path, "the config file must be a YAML mapping")
        return data

    def _error(self, path: str, problem: str) -> ValidationError:
        # A ValidationError located at the variable, so that det-master and det-agent print
        # it like any bad setting ("setting DET_AGENT_CONFIG_FILE: ...") instead of a traceback.
        error = PydanticCustomError(
            "config_file", "{path}: {problem}", {"path": path, "problem": problem}
        )
        return ValidationError.from_exception_data(
            self.settings_cls.__name__, [{"type": error, "loc": (self.env_var,), "input": path}]
        )


def one_line(exc: Exception) -> str:
    mark = getattr(exc, "problem_mark", None)
    if isinstance(exc, yaml.MarkedYAMLError) and mark is not None:
        return f"line {mark.line + 1}, column {mark.column + 1}: {exc.problem}"
    return " ".join(str(exc).split())


def absolute_path(value: object) -> object:
    """A path setting made absolute against the directory the process started in (a
    `mode="before"` validator's body): what it hands on (the agent's work dir to mount(8)
    and to ranks, the master's checkpoint host path) means the same from anywhere."""
    if isinstance(value, str | Path) and str(value):
        return Path(value).expanduser().absolute()
    return value
