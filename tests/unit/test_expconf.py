"""Experiment config parsing, validation, defaults and warnings (master/core/expconf.py)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from master.core.errors import ConfigError
from master.core.expconf import (
    CategoricalHP,
    ConstHP,
    DoubleHP,
    IntHP,
    LogHP,
    PositiveLength,
    S3Storage,
    config_warnings,
    effective_dict,
    entrypoint_modules,
    parse_yaml,
    validate_config,
)

# Determined's mnist example from "Configuration Templates" (seed document 001), with the
# nesting its flattened text lost put back; its entrypoint, the legacy Trial class
# `model_def:MNistTrial`, is refused at submit, so it runs the ported script instead.
MNIST_YAML = """
name: mnist_tf_const
entrypoint: python3 -m determined.launch.torch_distributed python3 train.py
checkpoint_storage:
  type: s3
  access_key: my-access-key
  secret_key: my-secret-key
  bucket: my-bucket-name
data:
  base_url: https://s3-us-west-2.amazonaws.com/determined-ai-datasets/mnist/
  training_data: train-images-idx3-ubyte.gz
  training_labels: train-labels-idx1-ubyte.gz
  validation_set_size: 10000
hyperparameters:
  base_learning_rate: 0.001
  weight_cost: 0.0001
  global_batch_size: 64
  n_filters1: 40
  n_filters2: 40
searcher:
  name: single
  metric: error
  max_length:
    batches: 500
  smaller_is_better: true
"""

# Most other sections of a realistic distributed experiment, in Determined's spelling.
FULL_YAML = """
name: cifar10-dist
description: ResNet-18 on CIFAR-10, 8 GPUs
labels: [vision, baseline]
workspace: research
project: cifar
entrypoint: python3 -m determined.launch.torch_distributed python3 train.py
max_restarts: 2
scheduling_unit: 50
records_per_epoch: 50000
perform_initial_validation: true
checkpoint_policy: all
min_validation_period:
  epochs: 1
min_checkpoint_period:
  batches: 1000
preemption_timeout: 600
debug: false
resources:
  slots_per_trial: 8
  max_slots: 16
  priority: 10
  weight: 2.5
  resource_pool: a100
  is_single_node: true
  shm_size: 16G
  devices:
    - host_path: /dev/infiniband
      container_path: /dev/infiniband
reproducibility:
  experiment_seed: 12345
  deterministic: true
searcher:
  name: random
  metric: validation_loss
  smaller_is_better: true
  max_trials: 16
  max_concurrent_trials: 4
  max_length: 10
optimizations:
  aggregation_frequency: 2
  average_training_metrics: false
  gradient_compression: true
  mixed_precision: O1
  tensor_fusion_threshold: 128
  tensor_fusion_cycle_time: 10
  auto_tune_tensor_fusion: true
bind_mounts:
  - host_path: /mnt/datasets
    container_path: /data
    read_only: true
  - host_path: /mnt/scratch
    container_path: /scratch
    propagation: rshared
environment:
  image:
    cpu: determinedai/pytorch-ngc:0.38.1
    cuda: determinedai/pytorch-ngc:0.38.1
  environment_variables:
    cpu: [OMP_NUM_THREADS=4]
    cuda: [NCCL_DEBUG=INFO, NCCL_SOCKET_IFNAME=ib0]
  force_pull_image: false
  registry_auth:
    username: robot
    password: s3cret
    serveraddress: registry.example.com
  add_capabilities: [IPC_LOCK]
  drop_capabilities: [NET_RAW]
  proxy_ports:
    - proxy_port: 6006
      proxy_tcp: false
checkpoint_storage:
  type: shared_fs
  host_path: /mnt/checkpoints
  storage_path: determined
  save_experiment_best: 2
  save_trial_best: 1
  save_trial_latest: 1
data:
  dataset: cifar10
  augment: {flip: true, crop: 32}
profiling:
  enabled: true
  begin_on_batch: 10
log_policies:
  - name: oom
    pattern: ".*CUDA out of memory.*"
    action: {type: cancel_retries}
retention_policy:
  log_retention_days: 30
integrations:
  webhooks:
    webhook_name: [slack]
hyperparameters:
  global_batch_size: 512
  lr:
    type: log
    minval: -4
    maxval: -1
    base: 10
  momentum:
    type: double
    minval: 0.8
    maxval: 0.99
  layers:
    type: int
    minval: 2
    maxval: 6
  activation:
    type: categorical
    vals: [relu, gelu]
  optimizer:
    name: sgd
    nesterov: {type: categorical, vals: [true, false]}
    schedule:
      warmup: {type: const, val: 500}
"""

MINIMAL: dict[str, Any] = {
    "entrypoint": "python3 train.py",
    "searcher": {"name": "single", "metric": "validation_loss"},
}


def with_changes(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """`base` with `changes` merged in recursively; a None value deletes the key."""
    out = copy.deepcopy(base)
    for key, value in changes.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = with_changes(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def problems(raw: Any, *, complete: bool = True) -> list[tuple[str, str]]:
    with pytest.raises(ConfigError) as info:
        validate_config(raw, complete=complete)
    return [(p.path, p.message) for p in info.value.problems]


# --- valid configs ---------------------------------------------------------------------------


def test_mnist_example_validates() -> None:
    cfg = validate_config(parse_yaml(MNIST_YAML), complete=True)
    assert cfg.name == "mnist_tf_const"
    assert isinstance(cfg.checkpoint_storage, S3Storage)
    assert cfg.checkpoint_storage.bucket == "my-bucket-name"
    assert cfg.searcher is not None and cfg.searcher.name == "single"
    assert isinstance(cfg.searcher.max_length, PositiveLength)
    assert (cfg.searcher.max_length.unit, cfg.searcher.max_length.value) == ("batches", 500)
    assert cfg.hyperparameters["global_batch_size"] == ConstHP(val=64)
    assert cfg.data["validation_set_size"] == 10000
    assert config_warnings(cfg) == []


def test_full_realistic_config_validates() -> None:
    cfg = validate_config(parse_yaml(FULL_YAML), complete=True)
    assert cfg.resources.slots_per_trial == 8
    assert cfg.resources.priority == 10
    assert cfg.reproducibility.experiment_seed == 12345
    assert cfg.searcher is not None and cfg.searcher.max_trials == 16
    assert cfg.bind_mounts[0].read_only is True
    assert cfg.bind_mounts[1].propagation == "rshared"
    assert cfg.optimizations.mixed_precision == "O1"
    hps = cfg.hyperparameters
    assert hps["lr"] == LogHP(minval=-4, maxval=-1, base=10)
    assert isinstance(hps["momentum"], DoubleHP)
    assert hps["layers"] == IntHP(minval=2, maxval=6)
    assert hps["activation"] == CategoricalHP(vals=["relu", "gelu"])
    optimizer = hps["optimizer"]
    assert isinstance(optimizer, dict)
    assert optimizer["name"] == ConstHP(val="sgd")
    assert optimizer["schedule"] == {"warmup": ConstHP(val=500)}
    # Only what does not apply is mentioned, and where the image does.
    assert [w.split(" ", 1)[0] for w in config_warnings(cfg)] == [
        "environment.image",
        "environment.add_capabilities",
        "environment.drop_capabilities",
        "bind_mounts.1.propagation",
        "resources.devices",
        "log_policies",
        "environment.proxy_ports",
    ]
    # The stored config validates again to the same thing (the master re-reads it).
    effective = effective_dict(cfg)
    assert effective_dict(validate_config(effective, complete=True)) == effective
    json.dumps(effective, allow_nan=False)


def test_minimal_complete_config() -> None:
    cfg = validate_config(MINIMAL, complete=True)
    assert cfg.entrypoint == "python3 train.py"
    assert cfg.hyperparameters == {}


def test_nothing_is_required_before_the_template_merge() -> None:
    cfg = validate_config({}, complete=False)
    assert cfg.searcher is None and cfg.entrypoint is None
    template = {"checkpoint_storage": {"save_trial_best": 3}, "searcher": {"metric": "loss"}}
    validate_config(template, complete=False)


def test_null_means_default_as_in_determined() -> None:
    cfg = validate_config(
        {**MINIMAL, "resources": None, "max_restarts": None, "hyperparameters": None},
        complete=True,
    )
    assert cfg.resources.slots_per_trial == 1
    assert cfg.max_restarts == 5


def test_entrypoint_may_be_a_list() -> None:
    cfg = validate_config({**MINIMAL, "entrypoint": ["python3", "train.py"]}, complete=True)
    assert cfg.entrypoint == ["python3", "train.py"]


def test_searched_global_batch_size_is_allowed() -> None:
    for hp in (
        {"type": "int", "minval": 32, "maxval": 256},
        {"type": "categorical", "vals": [32, 64]},
        {"type": "const", "val": 32},
    ):
        validate_config({**MINIMAL, "hyperparameters": {"global_batch_size": hp}}, complete=True)


# --- errors ----------------------------------------------------------------------------------

ERROR_CASES: list[tuple[str, dict[str, Any], bool, list[tuple[str, str]]]] = [
    (
        "unknown key at depth suggests a close name",
        {"resources": {"slot_per_trial": 2}},
        False,
        [("resources.slot_per_trial", "unknown key; did you mean 'slots_per_trial'?")],
    ),
    (
        "unknown key deep in a list item",
        {"bind_mounts": [{"host_path": "/a", "container_path": "/b", "readonly": True}]},
        False,
        [("bind_mounts.0.readonly", "unknown key; did you mean 'read_only'?")],
    ),
    (
        "unknown key inside a storage type",
        {"checkpoint_storage": {"type": "s3", "bucket": "b", "bucket_name": "b"}},
        False,
        [("checkpoint_storage.bucket_name", "unknown key; did you mean 'bucket'?")],
    ),
    (
        "top-level key that belongs in a section",
        {"max_trials": 4},
        False,
        [("max_trials", "unknown key; did you mean 'searcher.max_trials'?")],
    ),
    (
        "unknown key with nothing close lists the valid ones",
        {"searcher": {"max_length": {"steps": 10}}},
        False,
        [("searcher.max_length.steps", "unknown key; expected one of: batches, epochs, records")],
    ),
    (
        "template named inside the file",
        {**MINIMAL, "template": "gpu-defaults"},
        True,
        [
            (
                "template",
                "a config cannot name a template inside the file; pass it with --template "
                "(and a template cannot name another template)",
            )
        ],
    ),
    (
        "resources.slots is for commands, not experiments",
        {"resources": {"slots": 4}},
        False,
        [
            (
                "resources.slots",
                "not supported for experiments; use resources.slots_per_trial to set the "
                "number of slots (GPUs) each trial uses",
            )
        ],
    ),
    (
        "wrong scalar types",
        {
            "max_restarts": "5",
            "debug": "yes",
            "description": 3,
            "labels": "vision",
            "resources": {"weight": "heavy"},
        },
        False,
        [
            ("max_restarts", "must be an integer"),
            ("debug", "must be true or false"),
            ("description", "must be a string"),
            ("labels", "must be a list"),
            ("resources.weight", "must be a number"),
        ],
    ),
    (
        "booleans are not integers and floats are not integers",
        {"max_restarts": True, "resources": {"slots_per_trial": 2.0}},
        False,
        [
            ("max_restarts", "must be an integer"),
            ("resources.slots_per_trial", "must be an integer"),
        ],
    ),
    (
        "a section that is not a mapping",
        {"resources": 8, "searcher": "random"},
        False,
        [("resources", "must be a mapping"), ("searcher", "must be a mapping")],
    ),
    (
        "seed below range",
        {"reproducibility": {"experiment_seed": -1}},
        False,
        [("reproducibility.experiment_seed", "must be between 0 and 2147483647")],
    ),
    (
        "seed above range",
        {"reproducibility": {"experiment_seed": 2**31}},
        False,
        [("reproducibility.experiment_seed", "must be between 0 and 2147483647")],
    ),
    (
        "negative slots_per_trial",
        {"resources": {"slots_per_trial": -1}},
        False,
        [("resources.slots_per_trial", "must be between 0 and 2147483647")],
    ),
    (
        "slots_per_trial beyond 32 bits",
        {"resources": {"slots_per_trial": 2**31}},
        False,
        [("resources.slots_per_trial", "must be between 0 and 2147483647")],
    ),
    (
        "priority 0",
        {"resources": {"priority": 0}},
        False,
        [("resources.priority", "must be between 1 and 99")],
    ),
    (
        "priority 100",
        {"resources": {"priority": 100}},
        False,
        [("resources.priority", "must be between 1 and 99")],
    ),
    (
        "weight must be positive",
        {"resources": {"weight": 0}},
        False,
        [("resources.weight", "must be greater than 0")],
    ),
    (
        "removed searcher",
        {"searcher": {"name": "custom"}},
        False,
        [
            (
                "searcher.name",
                "the 'custom' searcher was removed in Determined 0.38 and is not valid for new "
                "experiments; supported searchers: single, grid, random, adaptive_asha, "
                "async_halving",
            )
        ],
    ),
    (
        "unknown searcher",
        {"searcher": {"name": "bayesian"}},
        False,
        [
            (
                "searcher.name",
                "unsupported searcher 'bayesian'; supported searchers: single, grid, random, "
                "adaptive_asha, async_halving",
            )
        ],
    ),
    (
        "random without max_trials",
        {**MINIMAL, "searcher": {"name": "random", "metric": "loss"}},
        True,
        [("searcher.max_trials", "required by the random searcher")],
    ),
    (
        "max_trials is not a setting of the single searcher",
        with_changes(MINIMAL, {"searcher": {"max_trials": 4}}),
        True,
        [("searcher.max_trials", "not a setting of the single searcher")],
    ),
    (
        "missing entrypoint and searcher",
        {"name": "x"},
        True,
        [("entrypoint", "required"), ("searcher", "required")],
    ),
    (
        "searcher without name and metric",
        {"entrypoint": "python3 a.py", "searcher": {"max_trials": 2}},
        True,
        [
            (
                "searcher.name",
                "required; one of: single, grid, random, adaptive_asha, async_halving",
            ),
            ("searcher.metric", "required"),
        ],
    ),
    (
        "max_length must be positive",
        with_changes(MINIMAL, {"searcher": {"max_length": {"batches": 0}}}),
        True,
        [("searcher.max_length.batches", "must be at least 1")],
    ),
    (
        "max_length with two units",
        with_changes(MINIMAL, {"searcher": {"max_length": {"batches": 1, "epochs": 1}}}),
        True,
        [("searcher.max_length", "must have exactly one key: batches, records or epochs")],
    ),
    (
        "length of the wrong type",
        {"min_validation_period": "1 epoch"},
        False,
        [
            (
                "min_validation_period",
                "must be an integer or a mapping with one key: batches, records or epochs",
            )
        ],
    ),
    (
        "bind mount paths",
        {
            "bind_mounts": [
                {"host_path": "/ok", "container_path": "/ok"},
                {"host_path": "data", "container_path": "."},
                {"container_path": "/x"},
            ]
        },
        False,
        [
            ("bind_mounts.1.host_path", "must be an absolute path"),
            ("bind_mounts.1.container_path", 'must be a path other than "" or "."'),
            ("bind_mounts.2.host_path", "required"),
        ],
    ),
    (
        "environment variables must be KEY=VALUE",
        {"environment": {"environment_variables": {"cuda": ["NCCL_DEBUG=INFO", "NCCL_DEBUG"]}}},
        False,
        [("environment.environment_variables.cuda.1", 'must have the form "KEY=VALUE"')],
    ),
    (
        "image of the wrong shape",
        {"environment": {"image": ["a", "b"]}},
        False,
        [
            (
                "environment.image",
                "must be an image name or a mapping of cpu/cuda/rocm to image names",
            )
        ],
    ),
    (
        "unknown storage type",
        {"checkpoint_storage": {"type": "hdfs", "hdfs_url": "x"}},
        False,
        [("checkpoint_storage.type", "must be one of: shared_fs, directory, s3, gcs, azure")],
    ),
    (
        "storage without its required fields once complete",
        {**MINIMAL, "checkpoint_storage": {"type": "gcs"}},
        True,
        [("checkpoint_storage.bucket", "required for gcs storage")],
    ),
    (
        "storage without a type once complete",
        {**MINIMAL, "checkpoint_storage": {"bucket": "b"}},
        True,
        [("checkpoint_storage.type", "required; one of: shared_fs, directory, s3, gcs, azure")],
    ),
    (
        "shared_fs storage_path outside host_path",
        {"checkpoint_storage": {"type": "shared_fs", "host_path": "/a", "storage_path": "/b"}},
        False,
        [
            (
                "checkpoint_storage.storage_path",
                "must be a relative path or a directory inside host_path",
            )
        ],
    ),
    (
        "checkpoint_policy enum",
        {"checkpoint_policy": "latest"},
        False,
        [("checkpoint_policy", "must be one of 'best', 'all' or 'none'")],
    ),
    (
        "workspace without project",
        {**MINIMAL, "workspace": "research"},
        True,
        [("project", "required when workspace is set (give both or neither)")],
    ),
    (
        "problems from every section are reported together",
        {
            "resources": {"priority": 0},
            "hyperparameters": {"lr": {"type": "double", "minval": 1, "maxval": 0}},
            "reproducibility": {"experiment_seed": -5},
        },
        False,
        [
            ("resources.priority", "must be between 1 and 99"),
            ("hyperparameters.lr.maxval", "must be greater than minval (1)"),
            ("reproducibility.experiment_seed", "must be between 0 and 2147483647"),
        ],
    ),
]


@pytest.mark.parametrize(
    ("raw", "complete", "expected"),
    [case[1:] for case in ERROR_CASES],
    ids=[case[0] for case in ERROR_CASES],
)
def test_config_errors(
    raw: dict[str, Any], complete: bool, expected: list[tuple[str, str]]
) -> None:
    assert problems(raw, complete=complete) == expected


def test_required_fields_only_when_complete() -> None:
    partial = {"searcher": {"name": "random", "metric": "loss"}}
    validate_config(partial, complete=False)
    # Problems come in document order; keys the document lacks come last.
    assert problems(partial, complete=True) == [
        ("searcher.max_trials", "required by the random searcher"),
        ("entrypoint", "required"),
    ]


# --- hyperparameters -------------------------------------------------------------------------

HP_CASES: list[tuple[str, Any, list[tuple[str, str]]]] = [
    (
        "unknown type",
        {"lr": {"type": "uniform", "minval": 0, "maxval": 1}},
        [
            (
                "hyperparameters.lr.type",
                "unknown hyperparameter type 'uniform'; expected one of: const, int, double, "
                "log, categorical",
            )
        ],
    ),
    (
        "unknown key inside an entry",
        {"layers": {"type": "int", "minval": 1, "maxval": 4, "step": 1}},
        [
            (
                "hyperparameters.layers.step",
                "unknown key; expected one of: count, maxval, minval, type",
            )
        ],
    ),
    (
        "int bounds must be integers and ordered",
        {
            "a": {"type": "int", "minval": 1.5, "maxval": 4},
            "b": {"type": "int", "minval": 5, "maxval": 4},
        },
        [
            ("hyperparameters.a.minval", "must be an integer"),
            ("hyperparameters.b.maxval", "must be at least minval (5)"),
        ],
    ),
    (
        "double needs minval < maxval",
        {"dropout": {"type": "double", "minval": 0.5, "maxval": 0.5}},
        [("hyperparameters.dropout.maxval", "must be greater than minval (0.5)")],
    ),
    (
        "missing bounds",
        {"lr": {"type": "log", "minval": -3}},
        [("hyperparameters.lr.maxval", "required")],
    ),
    (
        "log base must be positive",
        {"lr": {"type": "log", "minval": -3, "maxval": -1, "base": 0}},
        [("hyperparameters.lr.base", "must be greater than 0")],
    ),
    (
        "count must be at least 1",
        {"units": {"type": "int", "minval": 1, "maxval": 9, "count": 0}},
        [("hyperparameters.units.count", "must be at least 1")],
    ),
    (
        "categorical needs values",
        {"act": {"type": "categorical", "vals": []}},
        [("hyperparameters.act.vals", "must not be empty")],
    ),
    (
        "const needs val",
        {"x": {"type": "const"}},
        [("hyperparameters.x.val", "required")],
    ),
    (
        "errors in nested groups carry the full path",
        {
            "optimizer": {
                "name": "adam",
                "params": {"beta1": {"type": "double", "minval": "0.8", "maxval": 1}},
            }
        },
        [("hyperparameters.optimizer.params.beta1.minval", "must be a number")],
    ),
    (
        "global_batch_size must be a positive integer",
        {"global_batch_size": 0},
        [("hyperparameters.global_batch_size", "must be a positive integer")],
    ),
    (
        "global_batch_size cannot be a float",
        {"global_batch_size": 32.0},
        [("hyperparameters.global_batch_size", "must be a positive integer")],
    ),
    (
        "searched global_batch_size starts at 1",
        {"global_batch_size": {"type": "int", "minval": 0, "maxval": 64}},
        [("hyperparameters.global_batch_size.minval", "must be at least 1")],
    ),
    (
        "global_batch_size cannot be a double",
        {"global_batch_size": {"type": "double", "minval": 1, "maxval": 64}},
        [
            (
                "hyperparameters.global_batch_size",
                "must be a positive integer or an int or categorical hyperparameter of them",
            )
        ],
    ),
    (
        "hyperparameters must be a mapping",
        [1, 2],
        [("hyperparameters", "must be a mapping of names to hyperparameters")],
    ),
]


@pytest.mark.parametrize(
    ("hps", "expected"), [case[1:] for case in HP_CASES], ids=[case[0] for case in HP_CASES]
)
def test_hyperparameter_errors(hps: Any, expected: list[tuple[str, str]]) -> None:
    assert problems({"hyperparameters": hps}, complete=False) == expected


def test_global_batch_size_smaller_than_slots_is_an_error() -> None:
    raw = {
        **MINIMAL,
        "hyperparameters": {"global_batch_size": 2},
        "resources": {"slots_per_trial": 4},
    }
    assert problems(raw) == [
        (
            "hyperparameters.global_batch_size",
            "global_batch_size 2 is smaller than resources.slots_per_trial (4), so each slot "
            "would train on 0 samples per batch; use a global_batch_size of at least 4 or "
            "fewer slots",
        )
    ]


def test_grid_needs_counts_once_complete() -> None:
    raw = {
        **MINIMAL,
        "searcher": {"name": "grid", "metric": "loss"},
        "hyperparameters": {
            "a": {"type": "int", "minval": 1, "maxval": 3, "count": 3},
            "g": {"b": {"type": "double", "minval": 0, "maxval": 1}},
        },
    }
    validate_config(raw, complete=False)
    assert problems(raw) == [
        ("hyperparameters.g.b.count", "is required when the grid searcher is used")
    ]


# --- YAML ------------------------------------------------------------------------------------


def test_malformed_yaml_names_the_line() -> None:
    with pytest.raises(ConfigError) as info:
        parse_yaml("name: x\nresources:\n  slots_per_trial: [1, 2\nmax_restarts: 3\n")
    [problem] = info.value.problems
    assert problem.path == ""
    assert problem.message.startswith("invalid YAML at line 4, column 13: ")
    assert "expected ',' or ']'" in problem.message


def test_duplicate_keys_are_rejected() -> None:
    with pytest.raises(ConfigError) as info:
        parse_yaml("searcher:\n  name: grid\n  name: random\n")
    assert [(p.path, p.message) for p in info.value.problems] == [
        ("", "invalid YAML at line 3, column 3: duplicate key 'name' (first defined at line 2)")
    ]


@pytest.mark.parametrize(
    ("text", "got"),
    [
        ("- a\n- b\n", "a list"),
        ("just a string\n", "a string"),
        ("42\n", "a number"),
        ("", "an empty document"),
        ("# only a comment\n", "an empty document"),
    ],
)
def test_yaml_must_be_a_mapping(text: str, got: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_yaml(text)
    assert [(p.path, p.message) for p in info.value.problems] == [
        ("", f"the config must be a YAML mapping of keys to values, got {got}")
    ]


def test_yaml_keys_must_be_strings() -> None:
    with pytest.raises(ConfigError) as info:
        parse_yaml("hyperparameters:\n  1: x\n")
    assert [(p.path, p.message) for p in info.value.problems] == [
        ("hyperparameters.1", "keys must be strings (quote the key in YAML)")
    ]


def test_yaml_dates_stay_strings() -> None:
    assert parse_yaml("description: 2024-01-01\n") == {"description": "2024-01-01"}


# --- warnings --------------------------------------------------------------------------------


def test_global_batch_size_not_divisible_warns() -> None:
    cfg = validate_config(
        {
            **MINIMAL,
            "hyperparameters": {"global_batch_size": 30},
            "resources": {"slots_per_trial": 4},
        },
        complete=True,
    )
    assert config_warnings(cfg) == [
        "hyperparameters.global_batch_size (30) is not divisible by "
        "resources.slots_per_trial (4): each slot trains on 7 samples per batch and 2 samples "
        "of every global batch are dropped; use a multiple of 4"
    ]


@pytest.mark.parametrize(("gbs", "slots"), [(32, 4), (30, 1), (30, 0), (None, 3)])
def test_no_warning_when_divisible_or_not_distributed(gbs: int | None, slots: int) -> None:
    hps = {} if gbs is None else {"global_batch_size": gbs}
    cfg = validate_config(
        {**MINIMAL, "hyperparameters": hps, "resources": {"slots_per_trial": slots}},
        complete=True,
    )
    assert config_warnings(cfg) == []


# --- effective config ------------------------------------------------------------------------


def test_effective_dict_fills_defaults() -> None:
    effective = effective_dict(validate_config(MINIMAL, complete=True))
    json.dumps(effective, allow_nan=False)
    assert effective["resources"]["slots_per_trial"] == 1
    assert effective["resources"]["priority"] is None
    assert effective["resources"]["resource_pool"] == ""
    assert effective["max_restarts"] == 5
    assert effective["name"] is None
    assert effective["reproducibility"] == {"experiment_seed": None, "deterministic": False}
    assert effective["searcher"] == {
        "name": "single",
        "metric": "validation_loss",
        "smaller_is_better": True,
        "max_length": None,
        "source_trial_id": None,
        "source_checkpoint_uuid": None,
    }
    assert effective["optimizations"]["aggregation_frequency"] == 1
    assert effective["checkpoint_policy"] == "best"
    assert effective["checkpoint_storage"] is None
    assert effective["bind_mounts"] == []


def test_effective_dict_storage_defaults() -> None:
    cfg = validate_config(parse_yaml(MNIST_YAML), complete=True)
    assert effective_dict(cfg)["checkpoint_storage"] == {
        "type": "s3",
        "bucket": "my-bucket-name",
        "access_key": "my-access-key",
        "secret_key": "my-secret-key",
        "endpoint_url": None,
        "prefix": None,
        "save_experiment_best": 0,
        "save_trial_best": 1,
        "save_trial_latest": 1,
    }


def test_effective_dict_normalises_hyperparameters() -> None:
    raw = with_changes(
        MINIMAL,
        {
            "searcher": {"name": "random", "max_trials": 3, "max_length": {"epochs": 2}},
            "hyperparameters": {
                "global_batch_size": 64,
                "lr": {"type": "log", "minval": -4, "maxval": -1},
                "dropout": {"type": "double", "minval": 0.1, "maxval": 0.5, "count": 3},
                "nothing": None,
                "widths": [64, 128],
                "optimizer": {"name": "adam", "betas": {"b1": {"type": "const", "val": 0.9}}},
            },
        },
    )
    effective = effective_dict(validate_config(raw, complete=True))
    assert effective["hyperparameters"] == {
        "global_batch_size": {"type": "const", "val": 64},
        "lr": {"type": "log", "minval": -4, "maxval": -1, "base": 10.0},
        "dropout": {"type": "double", "minval": 0.1, "maxval": 0.5, "count": 3},
        "nothing": {"type": "const", "val": None},
        "widths": {"type": "const", "val": [64, 128]},
        "optimizer": {
            "name": {"type": "const", "val": "adam"},
            "betas": {"b1": {"type": "const", "val": 0.9}},
        },
    }
    assert effective["searcher"]["max_length"] == {"epochs": 2}
    assert effective["searcher"]["max_concurrent_trials"] == 16
    assert effective["searcher"]["max_trials"] == 3


def test_validating_the_stored_config_again_is_stable() -> None:
    effective = effective_dict(validate_config(parse_yaml(MNIST_YAML), complete=True))
    assert effective_dict(validate_config(effective, complete=True)) == effective


# --- entrypoints resolute cannot run (refused at submit) ------------------------------------

TRIAL_CLASS_MESSAGE = (
    "names a Trial class (Determined's legacy API), which resolute does not run; port it to "
    "the PyTorch Trainer and use `python3 -m determined.launch.torch_distributed python3 "
    "train.py`, or run a script (`python3 train.py`)"
)
HOROVOD_MESSAGE = (
    "runs determined.launch.horovod, which resolute does not support: Horovod needs sshd "
    "between containers, which bare-process agents do not run; use "
    "determined.launch.torch_distributed"
)


@pytest.mark.parametrize(
    ("entrypoint", "shown"),
    [
        ("model_def:MyTrial", "model_def:MyTrial"),
        ("module.sub:Class", "module.sub:Class"),
        ("  model_def:MyTrial  ", "model_def:MyTrial"),
        (["model_def:MyTrial"], "model_def:MyTrial"),
        # What Determined expands a Trial class into: the launcher given --trial.
        (
            "python3 -m determined.launch.torch_distributed --trial model_def:MyTrial",
            "model_def:MyTrial",
        ),
    ],
)
@pytest.mark.parametrize("complete", [True, False])
def test_trial_class_entrypoint_is_refused(entrypoint: Any, shown: str, complete: bool) -> None:
    raw = {**MINIMAL, "entrypoint": entrypoint}
    assert problems(raw, complete=complete) == [("entrypoint", f"{shown!r} {TRIAL_CLASS_MESSAGE}")]


@pytest.mark.parametrize(
    "entrypoint",
    [
        "python3 -m determined.launch.horovod --autohorovod python3 train.py",
        "python3 -mdetermined.launch.horovod python3 train.py",
        ["python3", "-m", "determined.launch.horovod", "--autohorovod", "python3", "train.py"],
    ],
)
def test_horovod_launcher_is_refused(entrypoint: Any) -> None:
    raw = {**MINIMAL, "entrypoint": entrypoint}
    assert problems(raw) == [("entrypoint", HOROVOD_MESSAGE)]
    assert problems(raw, complete=False) == [("entrypoint", HOROVOD_MESSAGE)]


@pytest.mark.parametrize(
    "entrypoint",
    [
        "python3 train.py",
        "python3 -m determined.launch.torch_distributed python3 train.py",
        "python -m determined.launch.deepspeed python train.py --deepspeed ds.json",
        "python3 -m pkg.train",
        "./scripts/run:all",  # a path, not a Trial class
        "python3 train.py --resume ckpt:latest",  # a ':' among several arguments
        ["python3", "train.py"],
        ["scripts/run:all"],
        "python3 train.py 'unclosed",  # left to the launch layout, which names the problem
    ],
)
def test_commands_are_accepted(entrypoint: Any) -> None:
    cfg = validate_config({**MINIMAL, "entrypoint": entrypoint}, complete=True)
    assert cfg.entrypoint == entrypoint


def test_entrypoint_modules() -> None:
    assert entrypoint_modules(
        "python3 -m determined.launch.deepspeed python3 -m pkg.train --lr 0.1"
    ) == ["determined.launch.deepspeed", "pkg.train"]
    assert entrypoint_modules(["python3", "-mdetermined.launch.deepspeed", "x.py"]) == [
        "determined.launch.deepspeed"
    ]
    assert entrypoint_modules("python3 train.py --max-steps 3") == []
    assert entrypoint_modules("python3 -m") == []
    assert entrypoint_modules(None) == []


# --- container keys: images apply on agents with a runtime; the rest is said not to apply -----

# Shaped like Determined's examples (hf_trainer_api's deepspeed.yaml, gpt_neox): an image per
# accelerator, a forced pull and the ranks' environment variables.
DETERMINED_EXAMPLE_YAML = """
name: vit-deepspeed
entrypoint: >-
  python -m determined.launch.deepspeed
  python image_classification.py --deepspeed ds_configs/ds_config_stage_1.json
environment:
  environment_variables:
    - NCCL_DEBUG=INFO
    - NCCL_SOCKET_IFNAME=ens,eth,ib
  force_pull_image: true
  image:
    cpu: determinedai/pytorch-ngc:0.38.1
    cuda: determinedai/pytorch-ngc:0.38.1
resources:
  slots_per_trial: 2
searcher:
  name: single
  metric: eval_loss
  max_length: 100
hyperparameters:
  global_batch_size: 16
"""

IMAGE_NOTE = (
    "is used on agents started with --container-runtime podman|docker; agents without a "
    "runtime run the trial's processes on the host, where PATH in "
    "environment.environment_variables chooses the interpreter"
)


def test_determined_example_environment_is_accepted_with_a_note_on_the_image() -> None:
    cfg = validate_config(parse_yaml(DETERMINED_EXAMPLE_YAML), complete=True)
    # force_pull_image applies (the runtime pulls again), so only the image's note is left.
    assert config_warnings(cfg) == [
        "environment.image (cpu: determinedai/pytorch-ngc:0.38.1, cuda: "
        f"determinedai/pytorch-ngc:0.38.1) {IMAGE_NOTE}",
    ]
    # Stored as given, so the config still says what the user wrote.
    environment = effective_dict(cfg)["environment"]
    assert environment["image"]["cuda"] == "determinedai/pytorch-ngc:0.38.1"
    assert environment["force_pull_image"] is True
    assert environment["environment_variables"] == [
        "NCCL_DEBUG=INFO",
        "NCCL_SOCKET_IFNAME=ens,eth,ib",
    ]


def test_every_docker_only_key_gets_one_warning() -> None:
    environment = {
        "image": "determinedai/pytorch-ngc:0.38.1",
        "registry_auth": {"username": "robot", "password": "s3cret", "serveraddress": "r.io"},
        "force_pull_image": True,
        "add_capabilities": ["IPC_LOCK", "SYS_NICE"],
        "drop_capabilities": ["NET_RAW"],
        "ports": {"tensorboard": 6006},
        "environment_variables": ["PATH=/opt/venv/bin:/usr/bin"],
    }
    cfg = validate_config({**MINIMAL, "environment": environment}, complete=True)
    warnings = config_warnings(cfg)
    # registry_auth and force_pull_image apply to the image's pull: no warning of theirs.
    assert [w.split(" ", 1)[0] for w in warnings] == [
        "environment.image",
        "environment.add_capabilities",
        "environment.drop_capabilities",
        "environment.ports",
    ]
    assert warnings[0] == f"environment.image (determinedai/pytorch-ngc:0.38.1) {IMAGE_NOTE}"
    assert warnings[1].startswith("environment.add_capabilities (IPC_LOCK, SYS_NICE) does not")
    assert warnings[3].startswith("environment.ports (tensorboard: 6006) does not apply")
    assert all("does not apply" in w for w in warnings[1:])
    assert not any("s3cret" in w or "robot" in w for w in warnings)  # credentials never shown
    assert effective_dict(cfg)["environment"]["ports"] == {"tensorboard": 6006}


def test_mounts_and_shm_apply_so_only_propagation_and_devices_warn() -> None:
    config = {
        **MINIMAL,
        "bind_mounts": [
            {"host_path": "/data", "container_path": "/data"},
            {"host_path": "/datasets/imagenet", "container_path": "/data/imagenet"},
            {"host_path": "/models", "container_path": "/models", "read_only": True},
            {"host_path": "/nfs", "container_path": "/nfs", "propagation": "rslave"},
        ],
        "resources": {
            "shm_size": "4G",
            "devices": [
                {
                    "host_path": "/dev/infiniband/uverbs0",
                    "container_path": "/dev/infiniband/uverbs0",
                }
            ],
        },
    }
    warnings = config_warnings(validate_config(config, complete=True))
    assert warnings == [
        "bind_mounts.3.propagation (rslave) does not apply: every mount of a trial is "
        "private to its mount namespace (rprivate), so mounts made later under the path are "
        "not shared with the host",
        "resources.devices (/dev/infiniband/uverbs0) apply only in containers: where "
        "environment.image runs on agents started with --container-runtime podman|docker; a "
        "trial run on the host sees the host's devices as the agent's user may open them",
    ]


def test_bind_mount_propagation_must_be_one_of_dockers() -> None:
    bad = {
        **MINIMAL,
        "bind_mounts": [{"host_path": "/a", "container_path": "/a", "propagation": "up"}],
    }
    with pytest.raises(ConfigError) as caught:
        validate_config(bad, complete=True)
    assert [p.path for p in caught.value.problems] == ["bind_mounts.0.propagation"]
    assert "rprivate" in caught.value.problems[0].message


def test_docker_only_keys_that_ask_for_nothing_are_not_mentioned() -> None:
    environment = {
        "force_pull_image": False,
        "add_capabilities": [],
        "drop_capabilities": [],
        "ports": {},
        "registry_auth": {},
        "pod_spec": None,
        "image": None,
    }
    cfg = validate_config({**MINIMAL, "environment": environment}, complete=True)
    assert config_warnings(cfg) == []
    # Nor are the defaults a stored config holds, when the master validates it again.
    stored = effective_dict(validate_config(MINIMAL, complete=True))
    assert config_warnings(validate_config(stored, complete=True)) == []
    example = validate_config(parse_yaml(DETERMINED_EXAMPLE_YAML), complete=True)
    again = validate_config(effective_dict(example), complete=True)
    assert config_warnings(again) == config_warnings(example)


def test_ports_must_be_named_integers() -> None:
    raw = {**MINIMAL, "environment": {"ports": {"tb": "6006"}}}
    assert problems(raw) == [("environment.ports.tb", "must be an integer")]


@pytest.mark.parametrize(
    ("text", "value"),
    [("1e-5", 1e-5), ("3E2", 300.0), ("-2.5e-3", -2.5e-3), ("1.0e+2", 100.0), ("1_000", 1000)],
)
def test_yaml_reads_exponent_floats_as_numbers_as_determined_does(text: str, value: Any) -> None:
    """YAML 1.1 reads `1e-5` as a string; Determined's Go master reads a number."""
    parsed = parse_yaml(f"hyperparameters:\n  lr: {text}\n")
    assert parsed["hyperparameters"]["lr"] == value
    assert type(parsed["hyperparameters"]["lr"]) is type(value)


def test_yaml_keeps_quoted_exponents_and_words_as_strings() -> None:
    assert parse_yaml('a: "1e-5"\nb: e5\nc: 1e\n') == {"a": "1e-5", "b": "e5", "c": "1e"}


def test_determined_s_retired_resources_keys_submit_with_a_warning() -> None:
    # Configs written for older Determined releases carry these; refusing them as unknown
    # keys failed the whole submit.
    resources = {"agent_label": "a100-nodes", "native_parallel": True}
    cfg = validate_config({**MINIMAL, "resources": resources}, complete=True)
    assert config_warnings(cfg) == [
        "resources.agent_label ('a100-nodes') does not apply: trials are placed by resource "
        "pool; name one in resources.resource_pool",
        "resources.native_parallel (true) does not apply: a trial's processes are started "
        "as its entrypoint and launch layout say",
    ]
    # Their defaults say nothing, and the filled config keeps native_parallel, which
    # Determined's legacy harness reads from it.
    plain = validate_config({**MINIMAL, "resources": {"native_parallel": False}}, complete=True)
    assert config_warnings(plain) == []
    assert effective_dict(plain)["resources"]["native_parallel"] is False
    with pytest.raises(ConfigError, match=r"resources\.agent_label: must be a string"):
        validate_config({**MINIMAL, "resources": {"agent_label": ["a100"]}}, complete=True)


@pytest.mark.parametrize(("max_slots", "slots"), [(0, 1), (3, 4)])
def test_max_slots_below_one_trials_gang_is_refused(max_slots: int, slots: int) -> None:
    raw = with_changes(MINIMAL, {"resources": {"max_slots": max_slots, "slots_per_trial": slots}})
    with pytest.raises(ConfigError) as info:
        validate_config(raw, complete=True)
    assert [p.path for p in info.value.problems] == ["resources.max_slots"]
    assert f"below resources.slots_per_trial ({slots}): no trial could ever start" in str(
        info.value
    )


def test_max_slots_of_whole_gangs_and_of_cpu_trials_are_accepted() -> None:
    for resources in (
        {"max_slots": 4, "slots_per_trial": 4},
        {"max_slots": 0, "slots_per_trial": 0},
    ):
        cfg = validate_config(with_changes(MINIMAL, {"resources": resources}), complete=True)
        assert cfg.resources.max_slots == resources["max_slots"]
