"""Template merging follows seed document 001's documented rule."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from master.core.merge import merge_template


def test_doc_001_checkpoint_storage_template() -> None:
    template = {
        "description": "template-tf-gpu",
        "checkpoint_storage": {
            "type": "s3",
            "access_key": "my-access-key",
            "secret_key": "my-secret-key",
            "bucket": "my-bucket-name",
        },
    }
    config = {
        "description": "mnist_tf_const",
        "data": {
            "base_url": "https://s3-us-west-2.amazonaws.com/determined-ai-datasets/mnist/",
            "training_data": "train-images-idx3-ubyte.gz",
            "training_labels": "train-labels-idx1-ubyte.gz",
            "validation_set_size": 10000,
        },
        "hyperparameters": {
            "base_learning_rate": 0.001,
            "weight_cost": 0.0001,
            "global_batch_size": 64,
            "n_filters1": 40,
            "n_filters2": 40,
        },
        "searcher": {
            "name": "single",
            "metric": "error",
            "max_length": {"batches": 500},
            "smaller_is_better": True,
        },
    }

    merged = merge_template(template, config)

    # The merged document is the original, un-split experiment configuration.
    assert merged == {**config, "checkpoint_storage": template["checkpoint_storage"]}
    assert merged["description"] == "mnist_tf_const"


@pytest.mark.parametrize(
    ("template", "config", "expected"),
    [
        # keys on one side only are kept
        ({"a": 1}, {"c": 3}, {"a": 1, "c": 3}),
        ({"a": 1, "b": 2}, {"b": 20, "c": 3}, {"a": 1, "b": 20, "c": 3}),
        # scalars: the config wins, whatever the scalar types
        ({"b": "x"}, {"b": 5}, {"b": 5}),
        ({"b": True}, {"b": False}, {"b": False}),
        ({"b": 1.5}, {"b": None}, {"b": None}),
        # lists: template's entries, then the config's (duplicates are kept)
        ({"l": [1, 2]}, {"l": [3]}, {"l": [1, 2, 3]}),
        ({"l": [1]}, {"l": [1]}, {"l": [1, 1]}),
        ({"l": []}, {"l": ["x"]}, {"l": ["x"]}),
        ({"l": [{"k": 1}]}, {"l": [{"k": 2}]}, {"l": [{"k": 1}, {"k": 2}]}),
        # objects merge recursively, at any depth
        (
            {"o": {"x": 1, "y": {"p": 1, "q": [1]}}},
            {"o": {"y": {"q": [2], "r": 3}, "z": 4}},
            {"o": {"x": 1, "y": {"p": 1, "q": [1, 2], "r": 3}, "z": 4}},
        ),
        # a list somewhere else named `devices` is an ordinary list
        (
            {"environment": {"devices": [{"container_path": "/a", "host_path": "/t"}]}},
            {"environment": {"devices": [{"container_path": "/a", "host_path": "/c"}]}},
            {
                "environment": {
                    "devices": [
                        {"container_path": "/a", "host_path": "/t"},
                        {"container_path": "/a", "host_path": "/c"},
                    ]
                }
            },
        ),
    ],
)
def test_merge_rule(template: dict[str, Any], config: dict[str, Any], expected: Any) -> None:
    assert merge_template(template, config) == expected


@pytest.mark.parametrize(
    ("template_value", "config_value"),
    [
        ({"x": 1}, 5),
        (5, {"x": 1}),
        ([1, 2], {"x": 1}),
        ({"x": 1}, [1, 2]),
        ([1, 2], "a string"),
        ("a string", [1]),
        ({"x": 1}, None),
    ],
)
def test_type_mismatch_config_wins(template_value: Any, config_value: Any) -> None:
    assert merge_template({"k": template_value}, {"k": config_value}) == {"k": config_value}


def _mount(container: str, host: str) -> dict[str, Any]:
    return {"host_path": host, "container_path": container, "read_only": False}


def test_bind_mounts_config_entry_replaces_template_entry_with_same_container_path() -> None:
    template = {"bind_mounts": [_mount("/data", "/tpl/data"), _mount("/scratch", "/tpl/s")]}
    config = {"bind_mounts": [_mount("/models", "/cfg/m"), _mount("/data", "/cfg/data")]}

    merged = merge_template(template, config)

    assert merged["bind_mounts"] == [
        _mount("/scratch", "/tpl/s"),  # template entries first, minus the conflict
        _mount("/models", "/cfg/m"),
        _mount("/data", "/cfg/data"),  # the config's entry for /data survives
    ]


def test_resources_devices_config_entry_replaces_template_entry() -> None:
    template = {
        "resources": {
            "slots_per_trial": 2,
            "devices": [
                {"host_path": "/dev/fuse", "container_path": "/dev/fuse", "mode": "mrw"},
                {"host_path": "/dev/a", "container_path": "/dev/a"},
            ],
        }
    }
    config = {
        "resources": {
            "devices": [{"host_path": "/dev/fuse1", "container_path": "/dev/fuse", "mode": "r"}]
        }
    }

    merged = merge_template(template, config)

    assert merged["resources"] == {
        "slots_per_trial": 2,
        "devices": [
            {"host_path": "/dev/a", "container_path": "/dev/a"},
            {"host_path": "/dev/fuse1", "container_path": "/dev/fuse", "mode": "r"},
        ],
    }


def test_bind_mounts_without_conflicts_concatenate() -> None:
    template = {"bind_mounts": [_mount("/a", "/ha")]}
    config = {"bind_mounts": [_mount("/b", "/hb")]}
    assert merge_template(template, config)["bind_mounts"] == [
        _mount("/a", "/ha"),
        _mount("/b", "/hb"),
    ]


def test_bind_mounts_only_in_template_are_kept() -> None:
    template = {"bind_mounts": [_mount("/a", "/ha")]}
    assert merge_template(template, {"name": "x"}) == {
        "bind_mounts": [_mount("/a", "/ha")],
        "name": "x",
    }


def test_bind_mounts_duplicates_within_config_are_kept() -> None:
    # Only template entries are dropped; the config is taken as written.
    config = {"bind_mounts": [_mount("/a", "/h1"), _mount("/a", "/h2")]}
    template = {"bind_mounts": [_mount("/a", "/t")]}
    assert merge_template(template, config)["bind_mounts"] == config["bind_mounts"]


def test_inputs_are_not_mutated_and_result_shares_nothing() -> None:
    template = {
        "only_t": {"deep": [1, {"x": 1}]},
        "both": {"list": [{"a": 1}], "obj": {"k": [1]}},
        "bind_mounts": [_mount("/a", "/ha"), _mount("/b", "/hb")],
        "mismatch": {"x": [1]},
    }
    config = {
        "only_c": [{"y": 2}],
        "both": {"list": [{"b": 2}], "obj": {"k": [2]}},
        "bind_mounts": [_mount("/a", "/hc")],
        "mismatch": [{"z": 1}],
    }
    template_before = copy.deepcopy(template)
    config_before = copy.deepcopy(config)

    merged = merge_template(template, config)

    assert template == template_before
    assert config == config_before

    # Mutating every mutable value of the result leaves both inputs untouched.
    def scribble(value: Any) -> None:
        if isinstance(value, dict):
            for child in list(value.values()):
                scribble(child)
            value["scribbled"] = True
        elif isinstance(value, list):
            for child in value:
                scribble(child)
            value.append("scribbled")

    scribble(merged)
    assert template == template_before
    assert config == config_before


_keys = st.sampled_from(["a", "b", "c", "bind_mounts", "resources", "devices"])
_scalars = st.none() | st.booleans() | st.integers() | st.text(max_size=3)
_values = st.recursive(
    _scalars,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(_keys, children, max_size=3),
    max_leaves=10,
)
_docs = st.dictionaries(_keys, _values, max_size=4)


def _assert_keeps_keys(template: Any, config: Any, merged: Any) -> None:
    assert set(merged) == set(template) | set(config)
    for key in set(template) & set(config):
        if isinstance(template[key], dict) and isinstance(config[key], dict):
            _assert_keeps_keys(template[key], config[key], merged[key])


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(_docs, _docs)
def test_merge_never_drops_a_key(template: dict[str, Any], config: dict[str, Any]) -> None:
    # At every level where both sides hold an object, each key of either side survives.
    _assert_keeps_keys(template, config, merge_template(template, config))


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(_docs, _docs)
def test_merge_with_empty_side_is_a_copy(template: dict[str, Any], config: dict[str, Any]) -> None:
    assert merge_template(template, {}) == template
    assert merge_template({}, config) == config
