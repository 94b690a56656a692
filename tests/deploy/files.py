"""Reading the deployment files as Docker, Compose and systemd would: the stages of
deploy/Dockerfile with their COPY, RUN pip install and ENTRYPOINT lines, and the settings that
an environment variable name reaches."""

from __future__ import annotations

import json
import shlex
import shutil
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "deploy" / "Dockerfile"


@dataclass
class Stage:
    name: str
    base: str
    copies: list[tuple[list[str], str]] = field(default_factory=list)  # (sources, destination)
    pip_installs: list[list[str]] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    entrypoint: list[str] | None = None
    workdir: str = "/"


def _logical_lines(text: str) -> list[str]:
    lines: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        lines.append(pending + line)
        pending = ""
    return lines


def parse_dockerfile(path: Path = DOCKERFILE) -> dict[str, Stage]:
    """The stages by name (an unnamed one gets its index). Fails on an instruction this
    reader does not model, so that the test never passes over a line it did not read."""
    stages: dict[str, Stage] = {}
    stage: Stage | None = None
    for line in _logical_lines(path.read_text(encoding="utf-8")):
        instruction, _, rest = line.partition(" ")
        instruction = instruction.upper()
        if instruction == "FROM":
            words = rest.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else str(len(stages))
            inherited = stages.get(words[0])
            stage = Stage(name, words[0], workdir=inherited.workdir if inherited else "/")
            stages[name] = stage
            continue
        assert stage is not None, f"{path}: {instruction} before FROM"
        if instruction == "WORKDIR":
            stage.workdir = rest.strip()
        elif instruction == "COPY":
            words = shlex.split(rest)
            assert not any(w.startswith("--") for w in words), f"{path}: COPY flags: {line}"
            stage.copies.append((words[:-1], words[-1]))
        elif instruction == "RUN":
            words = shlex.split(rest)
            assert words[:2] == ["pip", "install"], f"{path}: a RUN this test ignores: {line}"
            stage.pip_installs.append([w for w in words[2:] if not w.startswith("-")])
        elif instruction == "ENV":
            for item in shlex.split(rest):
                key, _, value = item.partition("=")
                stage.env[key] = value
        elif instruction == "ENTRYPOINT":
            stage.entrypoint = json.loads(rest)
        elif instruction != "EXPOSE":
            raise AssertionError(f"{path}: an instruction this test does not model: {line}")
    return stages


def chain(stages: dict[str, Stage], name: str) -> list[Stage]:
    """The stage and those it is built FROM, base first."""
    found = [stages[name]]
    while found[0].base in stages:
        found.insert(0, stages[found[0].base])
    return found


def lay_out_context(stages: list[Stage], context: Path, target: Path) -> None:
    """Copy into `target` what the COPY lines of `stages` put in their WORKDIR, with Docker's
    rules: a directory's contents go into the destination, a file goes under its name."""
    for stage in stages:
        for sources, destination in stage.copies:
            # Relative to the WORKDIR, as every COPY of ours is; an absolute one would land
            # outside what pip installs from.
            assert not Path(destination).is_absolute(), f"Dockerfile: COPY to {destination}"
            into = target / destination
            for source in sources:
                origin = context / source
                assert origin.exists(), f"Dockerfile: COPY {source}: not in the build context"
                if origin.is_dir():
                    shutil.copytree(origin, into, dirs_exist_ok=True)
                elif destination.endswith("/") or len(sources) > 1:
                    into.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(origin, into / origin.name)
                else:
                    into.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(origin, into)


def setting_of(settings_cls: type[BaseModel], prefix: str, variable: str) -> str | None:
    """The dotted setting an environment variable sets (nested with `__`), or None when
    pydantic-settings would silently ignore it."""
    if not variable.startswith(prefix):
        return None
    model: type[BaseModel] | None = settings_cls
    path: list[str] = []
    for part in variable[len(prefix) :].lower().split("__"):
        if model is None or part not in model.model_fields:
            return None
        path.append(part)
        model = _model_in(model.model_fields[part].annotation)
    return ".".join(path)


def _model_in(annotation: object) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            found = _model_in(arg)
            if found is not None:
                return found
    return None
