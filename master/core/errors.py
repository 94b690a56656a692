"""Errors the pure cores raise; the services turn them into API errors."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ConfigProblem:
    """One thing wrong with a config, at a dotted path such as `resources.slots_per_trial`.

    `path` is "" when the problem is with the document as a whole.
    """

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class ConfigError(ValueError):
    """A config (or template) that cannot be used; carries every problem found."""

    def __init__(self, problems: list[ConfigProblem]) -> None:
        if not problems:
            raise ValueError("ConfigError needs at least one problem")
        self.problems = problems
        super().__init__("; ".join(str(p) for p in problems))

    @classmethod
    def at(cls, path: str, message: str) -> ConfigError:
        return cls([ConfigProblem(path, message)])
