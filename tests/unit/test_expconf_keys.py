"""docs/determined.md's table of Determined's experiment config keys is the one
master.core.expconf_keys renders, and every row says what a submit does with the key."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from master.core import expconf_keys
from master.core.errors import ConfigError
from master.core.expconf import (
    BindMount,
    Environment,
    ExperimentConfig,
    Resources,
    config_warnings,
    validate_config,
)

DOC = Path(__file__).resolve().parents[2] / "docs" / "determined.md"
BEGIN = "<!-- expconf-keys: begin (generated from master/core/expconf_keys.py) -->\n"
END = "<!-- expconf-keys: end -->"

MINIMAL: dict[str, Any] = {
    "entrypoint": "python3 train.py",
    "searcher": {"name": "single", "metric": "loss", "max_length": {"batches": 10}},
    "checkpoint_storage": {"type": "shared_fs", "host_path": "/tmp/ckpt"},
}

SECTIONS: dict[str, type[BaseModel]] = {
    "": ExperimentConfig,
    "resources.": Resources,
    "environment.": Environment,
    "bind_mounts.": BindMount,
}


def _with(key: str, value: Any) -> dict[str, Any]:
    config = copy.deepcopy(MINIMAL)
    *parents, leaf = key.split(".")
    if parents == ["bind_mounts"]:
        config["bind_mounts"] = [{"host_path": "/srv", "container_path": "/srv", leaf: value}]
        return config
    node = config
    for parent in parents:
        node = node.setdefault(parent, {})
    node[leaf] = value
    return config


def test_the_docs_table_is_the_generated_one() -> None:
    text = DOC.read_text(encoding="utf-8")
    assert BEGIN in text and END in text, f"{DOC} lacks the expconf-keys markers"
    table = text.split(BEGIN, 1)[1].split(END, 1)[0]
    assert table == expconf_keys.markdown_table(), (
        "docs/determined.md's key table is stale: paste expconf_keys.markdown_table()"
    )


def test_every_key_of_the_config_models_has_a_row() -> None:
    listed = {rule.key for rule in expconf_keys.KEYS}
    for prefix, model in SECTIONS.items():
        for name in model.model_fields:
            key = prefix + name
            assert key in listed or key in expconf_keys.RESOLUTE_EXTENSIONS, key


@pytest.mark.parametrize(
    "rule", [r for r in expconf_keys.KEYS if r.status != "refused"], ids=lambda r: r.key
)
def test_accepted_keys_are_fields(rule: expconf_keys.KeyRule) -> None:
    prefix, _, name = rule.key.rpartition(".")
    model = SECTIONS[prefix + "." if prefix else ""]
    assert name in model.model_fields


@pytest.mark.parametrize(
    "rule", [r for r in expconf_keys.KEYS if r.status == "refused"], ids=lambda r: r.key
)
def test_refused_keys_are_refused_with_the_tables_reason(rule: expconf_keys.KeyRule) -> None:
    with pytest.raises(ConfigError) as caught:
        validate_config(_with(rule.key, {}), complete=True)
    problems = {p.path: p.message for p in caught.value.problems}
    assert rule.key in problems, problems
    if rule.key != "resources.slots":  # its message predates the table, and says the same
        assert rule.note in problems[rule.key]


@pytest.mark.parametrize(
    "rule", [r for r in expconf_keys.KEYS if r.status == "warned"], ids=lambda r: r.key
)
def test_warned_keys_draw_a_warning_naming_them(rule: expconf_keys.KeyRule) -> None:
    warnings = config_warnings(validate_config(_with(rule.key, rule.sample), complete=True))
    leaf = rule.key.rpartition(".")[2]
    named = [w for w in warnings if rule.key in w or (leaf == "propagation" and leaf in w)]
    assert named, warnings
    assert config_warnings(validate_config(MINIMAL, complete=True)) == []
