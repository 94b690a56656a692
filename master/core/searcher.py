"""Trial planning for the `single`, `random` and `grid` searchers, and the trial draws of
the ASHA searchers (whose stop rule lives in `asha.py`).

Plans must be reproducible from the experiment seed and must match what Determined derives
from the same seed (hyperparameters, request IDs and trial seeds drawn from one NumPy-legacy
stream, in Determined's order), so that an experiment resubmitted here gets the same trials.
One deliberate difference: Determined walks nested hyperparameter groups in Go map order,
which is random; we always walk names in sorted order, so nested draws are reproducible too.
"""

from __future__ import annotations

import copy
import itertools
import math
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from master.core import asha
from master.core.errors import ConfigError, ConfigProblem
from master.core.seeds import LegacyRandom

SUPPORTED_SEARCHERS: tuple[str, ...] = ("single", "grid", "random", *asha.ASHA_SEARCHERS)

_TRIAL_SEED_BOUND = 1 << 31  # Determined: TrialSeed = uint32(Int64n(1 << 31))


@dataclass(frozen=True)
class TrialPlan:
    """What one trial is created with; `hparams` keeps the config's nesting."""

    hparams: dict[str, Any]
    request_id: uuid.UUID
    seed: int


# --- parsed hyperparameters ----------------------------------------------------------------


@dataclass(frozen=True)
class _Const:
    value: Any


@dataclass(frozen=True)
class _Int:
    path: str
    minval: int
    maxval: int
    count: int | None


@dataclass(frozen=True)
class _Double:
    path: str
    minval: float
    maxval: float
    count: int | None


@dataclass(frozen=True)
class _Log:
    path: str
    minval: float
    maxval: float
    base: float
    count: int | None


@dataclass(frozen=True)
class _Categorical:
    vals: tuple[Any, ...]


@dataclass(frozen=True)
class _Group:
    children: tuple[tuple[str, _Node], ...]  # sorted by name


_Node = _Const | _Int | _Double | _Log | _Categorical | _Group


# --- public API ----------------------------------------------------------------------------


def count_trials(searcher: Mapping[str, Any], hyperparameters: Mapping[str, Any] | None) -> int:
    """How many trials `plan_trials` would create, without building them.

    Cheap even for an enormous grid, so callers can reject one before planning it.
    """
    name = _searcher_name(searcher)
    tree = _parse_hyperparameters(hyperparameters, require_count=name == "grid")
    if name == "single":
        return 1
    if name == "random":
        return _max_trials(searcher)
    if name in asha.ASHA_SEARCHERS:
        # Each bracket runs at least one trial, so the sum can pass max_trials.
        return sum(b.max_trials for b in asha.parse_config(searcher).brackets)
    return _grid_size(tree)


def plan_trials(
    searcher: Mapping[str, Any],
    hyperparameters: Mapping[str, Any] | None,
    experiment_seed: int,
) -> list[TrialPlan]:
    """Every trial the searcher creates, in creation order.

    One generator serves the whole experiment; per trial it yields the sampled
    hyperparameters (none for grid), then the request ID, then the trial seed.
    """
    name = _searcher_name(searcher)
    tree = _parse_hyperparameters(hyperparameters, require_count=name == "grid")
    rng = LegacyRandom(experiment_seed)
    if name in asha.ASHA_SEARCHERS:
        initial = asha.initial_creates(asha.parse_config(searcher).brackets)
        return [_new_trial(rng, _sample_group(tree, rng)) for _ in initial]
    if name == "grid":
        return [_new_trial(rng, point) for point in _grid_points_in_creation_order(tree)]
    trials = 1 if name == "single" else _max_trials(searcher)
    return [_new_trial(rng, _sample_group(tree, rng)) for _ in range(trials)]


def sample_trials(
    hyperparameters: Mapping[str, Any] | None, rng: LegacyRandom, count: int
) -> list[TrialPlan]:
    """The next `count` trials of a search that creates them as it goes (ASHA), drawn from
    the experiment's generator where the last create left it."""
    tree = _parse_hyperparameters(hyperparameters, require_count=False)
    return [_new_trial(rng, _sample_group(tree, rng)) for _ in range(count)]


def grid_points(hyperparameters: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The grid in enumeration order: the first name (sorted) varies slowest.

    Determined creates grid trials from the end of this list backwards; `plan_trials`
    does the same, so trial 1 gets the last point.
    """
    tree = _parse_hyperparameters(hyperparameters, require_count=True)
    axes = _grid_axes(tree, ())
    return [_point(axes, combo) for combo in itertools.product(*(vals for _, vals in axes))]


# --- searcher section ----------------------------------------------------------------------


def _searcher_name(searcher: Mapping[str, Any]) -> str:
    if not isinstance(searcher, Mapping):
        raise ConfigError.at("searcher", "must be an object")
    name = searcher.get("name")
    if name not in SUPPORTED_SEARCHERS:
        supported = ", ".join(SUPPORTED_SEARCHERS)
        raise ConfigError.at(
            "searcher.name", f"unsupported searcher {name!r}; supported searchers: {supported}"
        )
    assert isinstance(name, str)
    return name


def _max_trials(searcher: Mapping[str, Any]) -> int:
    value = searcher.get("max_trials")
    if value is None:
        raise ConfigError.at("searcher.max_trials", "is required for the random searcher")
    if not _is_int(value) or value < 1:
        raise ConfigError.at("searcher.max_trials", f"must be an integer >= 1, got {value!r}")
    return int(value)


# --- parsing -------------------------------------------------------------------------------


def _parse_hyperparameters(raw: Mapping[str, Any] | None, *, require_count: bool) -> _Group:
    if raw is None:
        return _Group(())
    if not isinstance(raw, Mapping):
        raise ConfigError.at("hyperparameters", "must be an object")
    problems: list[ConfigProblem] = []
    tree = _parse_group(raw, "hyperparameters", require_count, problems)
    if problems:
        raise ConfigError(problems)
    return tree


def _parse_group(
    raw: Mapping[str, Any], path: str, require_count: bool, problems: list[ConfigProblem]
) -> _Group:
    names = [key for key in raw if isinstance(key, str)]
    for key in raw:
        if not isinstance(key, str):
            problems.append(ConfigProblem(f"{path}.{key}", "hyperparameter names must be strings"))
    children = tuple(
        (name, _parse_node(raw[name], f"{path}.{name}", require_count, problems))
        for name in sorted(names)
    )
    return _Group(children)


def _parse_node(raw: Any, path: str, require_count: bool, problems: list[ConfigProblem]) -> _Node:
    if not isinstance(raw, Mapping):
        return _Const(raw)
    if "type" not in raw:
        return _parse_group(raw, path, require_count, problems)
    kind = raw["type"]
    if kind == "const":
        if "val" not in raw:
            problems.append(ConfigProblem(f"{path}.val", "is required for a const hyperparameter"))
        return _Const(raw.get("val"))
    if kind == "categorical":
        vals = raw.get("vals")
        if not isinstance(vals, list | tuple) or not vals:
            problems.append(ConfigProblem(f"{path}.vals", "must be a non-empty list"))
            return _Categorical((None,))
        return _Categorical(tuple(vals))
    if kind in ("int", "double", "log"):
        return _parse_range(raw, path, kind, require_count, problems)
    problems.append(
        ConfigProblem(
            f"{path}.type",
            f"unknown hyperparameter type {kind!r}; expected one of "
            "const, int, double, log, categorical",
        )
    )
    return _Const(None)


def _parse_range(
    raw: Mapping[str, Any],
    path: str,
    kind: str,
    require_count: bool,
    problems: list[ConfigProblem],
) -> _Node:
    before = len(problems)
    number_ok = _is_int if kind == "int" else _is_number
    expected = "an integer" if kind == "int" else "a number"
    for field in ("minval", "maxval"):
        if field not in raw:
            problems.append(ConfigProblem(f"{path}.{field}", f"is required for a {kind} range"))
        elif not number_ok(raw[field]):
            problems.append(ConfigProblem(f"{path}.{field}", f"must be {expected}"))
    count = raw.get("count")
    if count is None:
        if require_count:
            problems.append(
                ConfigProblem(f"{path}.count", "is required when the grid searcher is used")
            )
    elif not _is_int(count) or count < 1:
        problems.append(ConfigProblem(f"{path}.count", f"must be an integer >= 1, got {count!r}"))
    base = raw.get("base", 10.0)
    if kind == "log" and (not _is_number(base) or not base > 0):
        problems.append(ConfigProblem(f"{path}.base", f"must be a number > 0, got {base!r}"))
    if len(problems) == before and raw["minval"] > raw["maxval"]:
        problems.append(ConfigProblem(f"{path}.maxval", "must not be less than minval"))
    if len(problems) != before:
        return _Const(None)
    if kind == "int":
        return _Int(path, int(raw["minval"]), int(raw["maxval"]), count)
    if kind == "double":
        return _Double(path, float(raw["minval"]), float(raw["maxval"]), count)
    return _Log(path, float(raw["minval"]), float(raw["maxval"]), float(base), count)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))


# --- sampling ------------------------------------------------------------------------------


def _new_trial(rng: LegacyRandom, hparams: dict[str, Any]) -> TrialPlan:
    # Determined's NewCreate: request ID (16 bytes, each 32-bit word little-endian), then seed.
    raw = b"".join(rng.bits32().to_bytes(4, "little") for _ in range(4))
    request_id = uuid.UUID(bytes=raw, version=4)
    seed = rng.int64n(_TRIAL_SEED_BOUND)
    return TrialPlan(hparams=hparams, request_id=request_id, seed=seed)


def _sample_group(group: _Group, rng: LegacyRandom) -> dict[str, Any]:
    return {name: _sample(node, rng) for name, node in group.children}


def _sample(node: _Node, rng: LegacyRandom) -> Any:
    match node:
        case _Group():
            return _sample_group(node, rng)
        case _Const(value):
            return copy.deepcopy(value)
        case _Int(_, minval, maxval, _):
            return minval + rng.int64n(maxval - minval + 1)
        case _Double(_, minval, maxval, _):
            return rng.uniform(minval, maxval)
        case _Log(path, minval, maxval, base, _):
            return _power(base, rng.uniform(minval, maxval), path)
        case _Categorical(vals):
            return copy.deepcopy(vals[rng.int64n(len(vals))])
    raise AssertionError(f"unexpected hyperparameter node {node!r}")


def _power(base: float, exponent: float, path: str) -> float:
    try:
        return math.pow(base, exponent)
    except OverflowError:
        raise ConfigError.at(path, f"{base} ** {exponent} is too large") from None


# --- grid ----------------------------------------------------------------------------------

_Axis = tuple[tuple[str, ...], list[Any]]


def _grid_axes(group: _Group, route: tuple[str, ...]) -> list[_Axis]:
    """One axis per leaf, depth-first in sorted name order (Determined's getGridAxes)."""
    if route and not group.children:
        # An empty nested group still appears in every point, as an empty object.
        return [(route, [{}])]
    axes: list[_Axis] = []
    for name, node in group.children:
        sub = (*route, name)
        if isinstance(node, _Group):
            axes.extend(_grid_axes(node, sub))
        else:
            axes.append((sub, _axis_values(node)))
    return axes


def _grid_size(group: _Group) -> int:
    """Number of grid points, from the counts alone (a huge `count` builds nothing)."""
    size = 1
    for _, node in group.children:
        match node:
            case _Group():
                size *= _grid_size(node)
            case _Categorical(vals):
                size *= len(vals)
            case _Int(_, minval, maxval, count):
                assert count is not None
                size *= min(count, maxval - minval + 1)
            case _Double(count=count) | _Log(count=count):
                assert count is not None
                size *= count
    return size


def _axis_values(node: _Node) -> list[Any]:
    match node:
        case _Const(value):
            return [value]
        case _Categorical(vals):
            return list(vals)
        case _Int(_, minval, maxval, count):
            assert count is not None
            # More points than integers in the range would only repeat values.
            count = min(count, maxval - minval + 1)
            if count == 1:
                return [_round_half_away(float(minval + maxval) / 2.0)]
            return [
                _round_half_away(float(minval) + float(i * (maxval - minval)) / float(count - 1))
                for i in range(count)
            ]
        case _Double(_, minval, maxval, count):
            assert count is not None
            return _linspace(minval, maxval, count)
        case _Log(path, minval, maxval, base, count):
            assert count is not None
            return [_power(base, e, path) for e in _linspace(minval, maxval, count)]
    raise AssertionError(f"unexpected hyperparameter node {node!r}")


def _linspace(minval: float, maxval: float, count: int) -> list[float]:
    if count == 1:
        return [(minval + maxval) / 2.0]
    return [minval + float(i) * (maxval - minval) / float(count - 1) for i in range(count)]


def _round_half_away(value: float) -> int:
    """Go's math.Round (halves away from zero), not Python's round-half-to-even."""
    magnitude = abs(value)
    whole = math.floor(magnitude)
    if magnitude - whole >= 0.5:
        whole += 1
    return int(math.copysign(whole, value))


def _grid_points_in_creation_order(tree: _Group) -> Iterator[dict[str, Any]]:
    # Determined pops grid points off the end of its list, so trials are created in reverse
    # enumeration order; the product of reversed axes yields exactly that order lazily.
    axes = _grid_axes(tree, ())
    reversed_values = [vals[::-1] for _, vals in axes]
    for combo in itertools.product(*reversed_values):
        yield _point(axes, combo)


def _point(axes: Sequence[_Axis], combo: Sequence[Any]) -> dict[str, Any]:
    point: dict[str, Any] = {}
    for (route, _), value in zip(axes, combo, strict=True):
        target = point
        for key in route[:-1]:
            target = target.setdefault(key, {})
        target[route[-1]] = copy.deepcopy(value)
    return point
