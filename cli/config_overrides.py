"""`det experiment create --config KEY=VALUE`: changes to the user's config, applied before
it is sent, as Determined 0.38.1's CLI applies them.

- KEY is a dotted path (`searcher.max_length.batches`); missing (or null) mappings along
  it are created.
- VALUE is YAML 1.2, as Determined's client reads it (`1e-4` is a float, `yes` a string).
  A value that starts with `[` or `{` is read whole; otherwise one with commas is a list
  of its comma-separated parts (`labels=a,b`). `bind_mounts` always becomes a list, so
  `bind_mounts={host_path: /a, container_path: /b}` is one mount.
- A mapping value is merged into the mapping already there (keys it does not name are
  kept); any other value replaces what was there.
- Overrides apply in order, to the user's file alone: the master merges the template in
  afterwards, so an override wins over the template as the file's own keys do.

Unlike Determined's client, which fails with a Python traceback there, a path through a
value that is not a mapping is an error naming the argument, and so are a missing `=`, an
empty key and a value that is not valid YAML. Nothing is changed when any override fails.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

__all__ = ["ConfigOverrideError", "apply_config_overrides", "parse_config_override"]

# Keys whose value is always a list (Determined's client coerces these).
_LIST_KEYS = frozenset({"bind_mounts"})


class ConfigOverrideError(ValueError):
    """A `--config` argument that cannot be applied; the message names the argument."""


# --- YAML 1.2 core schema scalars on PyYAML ----------------------------------------------------


class _Yaml12Loader(yaml.SafeLoader):
    """SafeLoader with the YAML 1.2 core schema's plain scalars (what Determined's client,
    ruamel.yaml's safe loader, resolves): true/false only, `1e-4` a float, `0o17` octal,
    `017` decimal, no sexagesimal numbers. Dates stay strings, as the master keeps them."""


_REPLACED_TAGS = {
    "tag:yaml.org,2002:bool",
    "tag:yaml.org,2002:int",
    "tag:yaml.org,2002:float",
    "tag:yaml.org,2002:timestamp",
}
_Yaml12Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in _REPLACED_TAGS]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Yaml12Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool",
    re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
    list("tTfF"),
)
_Yaml12Loader.add_implicit_resolver(
    "tag:yaml.org,2002:int",
    re.compile(r"^[-+]?(?:0b[01_]+|0o[0-7_]+|0x[0-9a-fA-F_]+|[0-9][0-9_]*)$"),
    list("-+0123456789"),
)
_Yaml12Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"^(?:[-+]?(?:[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?"
        r"|[0-9][0-9_]*[eE][-+]?[0-9]+"
        r"|\.[0-9_]+(?:[eE][-+]?[0-9]+)?"
        r"|\.(?:inf|Inf|INF))"
        r"|\.(?:nan|NaN|NAN))$"
    ),
    list("-+0123456789."),
)


def _construct_int(loader: yaml.SafeLoader, node: yaml.Node) -> int:
    text = str(loader.construct_scalar(node)).replace("_", "")  # type: ignore[arg-type]
    sign = -1 if text.startswith("-") else 1
    digits = text.lstrip("+-")
    for prefix, base in (("0b", 2), ("0o", 8), ("0x", 16)):
        if digits.startswith(prefix):
            return sign * int(digits[2:], base)
    return sign * int(digits)


_Yaml12Loader.add_constructor("tag:yaml.org,2002:int", _construct_int)


def _yaml_value(text: str) -> Any:
    return yaml.load(text, Loader=_Yaml12Loader)  # a SafeLoader: builds plain data only


# --- overrides --------------------------------------------------------------------------------


def _describe(value: Any) -> str:
    if isinstance(value, list):
        return "a list"
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, int | float):
        return f"a number ({value})"
    if isinstance(value, str):
        return f"a string ({value!r})"
    return f"a {type(value).__name__}"


def parse_config_override(argument: str) -> tuple[list[str], Any]:
    """One `KEY=VALUE` argument: the key's path and the value, as Determined reads them."""
    if "=" not in argument:
        raise ConfigOverrideError(
            f"--config {argument!r}: expected KEY=VALUE, for example "
            "--config resources.slots_per_trial=2"
        )
    key, text = argument.split("=", 1)
    if not key.strip():
        raise ConfigOverrideError(f"--config {argument!r}: the key before '=' is empty")
    path = key.split(".")
    if any(not part.strip() for part in path):
        raise ConfigOverrideError(
            f"--config {argument!r}: the key {key!r} has an empty part; write a dotted path "
            "such as searcher.max_length.batches"
        )
    try:
        if text.startswith(("[", "{")):
            value = _yaml_value(text)
            if key in _LIST_KEYS and text.startswith("{"):
                value = [value]
        elif "," in text:
            value = [_yaml_value(part) for part in text.split(",")]
        else:
            value = _yaml_value(text)
            if key in _LIST_KEYS:
                value = [value]
    except yaml.YAMLError as exc:
        what = " ".join(str(exc).split())
        raise ConfigOverrideError(
            f"--config {argument!r}: the value is not valid YAML: {what}"
        ) from None
    return path, value


def _merge(base: dict[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    """Mappings merge key by key; anything else replaces."""
    for key, value in changes.items():
        if isinstance(value, Mapping) and isinstance(base.get(key), dict):
            base[key] = _merge(base[key], value)
        else:
            base[key] = value
    return base


def _apply(config: dict[str, Any], argument: str) -> None:
    path, value = parse_config_override(argument)
    node = config
    for depth, part in enumerate(path[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        elif not isinstance(child, dict):
            where = ".".join(path[: depth + 1])
            hint = f"; give the whole list instead: --config '{where}=[...]'"
            raise ConfigOverrideError(
                f"--config {argument!r}: {where} is {_describe(child)}, not a mapping, so it "
                f"has no key {path[depth + 1]!r}" + (hint if isinstance(child, list) else "")
            )
        node = child
    _merge(node, {path[-1]: value})


def apply_config_overrides(config: Mapping[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """The config with every override applied in order; `config` itself is left as it is,
    and nothing is applied when one override is bad (ConfigOverrideError)."""
    result: dict[str, Any] = copy.deepcopy(dict(config))
    for argument in overrides:
        _apply(result, argument)
    return result
