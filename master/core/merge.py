"""Config-template merging, following Determined's *documented* rule (seed document 001).

Determined's Go code replaces lists instead of concatenating them; resolute deliberately
follows the documentation instead, so that a template's list entries are never silently lost.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

# Lists whose entries are keyed by `container_path`: two entries for the same path would
# make the container unstable, so the config's entry replaces the template's.
_CONTAINER_PATH_LISTS: frozenset[tuple[str, ...]] = frozenset(
    {("bind_mounts",), ("resources", "devices")}
)


def merge_template(template: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
    """Merge `config` over `template` and return a fresh document.

    Neither input is modified, and the result shares no mutable object with them, so the
    caller may store it while the template keeps changing.
    """
    return _merge_mappings(template, config, ())


def _merge_mappings(
    template: Mapping[str, Any], config: Mapping[str, Any], path: tuple[str, ...]
) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for key, value in template.items():
        if key in config:
            merged[key] = _merge_values(value, config[key], (*path, key))
        else:
            merged[key] = copy.deepcopy(value)
    for key, value in config.items():
        if key not in template:
            merged[key] = copy.deepcopy(value)
    return merged


def _merge_values(template: Any, config: Any, path: tuple[str, ...]) -> Any:
    if isinstance(template, Mapping) and isinstance(config, Mapping):
        return _merge_mappings(template, config, path)
    if _is_list(template) and _is_list(config):
        if path in _CONTAINER_PATH_LISTS:
            return _merge_by_container_path(template, config)
        return [copy.deepcopy(item) for item in (*template, *config)]
    # Scalars, and any pair of different kinds: the config overrides the template.
    return copy.deepcopy(config)


def _merge_by_container_path(template: list[Any] | tuple[Any, ...], config: Any) -> list[Any]:
    # A list rather than a set: a malformed (unhashable) container_path must not crash the merge.
    used = [_container_path(entry) for entry in config]
    used = [p for p in used if p is not None]
    kept = [
        entry
        for entry in template
        if (p := _container_path(entry)) is None or all(p != u for u in used)
    ]
    return [copy.deepcopy(item) for item in (*kept, *config)]


def _container_path(entry: Any) -> Any:
    if isinstance(entry, Mapping):
        return entry.get("container_path")
    return None


def _is_list(value: Any) -> bool:
    return isinstance(value, list | tuple)
