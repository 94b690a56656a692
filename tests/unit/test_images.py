"""Image references read as Docker and podman read them, the image of each slot type, and
the container a launch gets (master.core.images)."""

from __future__ import annotations

from typing import Any

import pytest

from master.core.images import (
    ContainerSpec,
    DeviceSpec,
    ImageRef,
    container_spec,
    image_for,
    parse_image,
    with_default_image,
    without_registry_auth,
)

DIGEST = "sha256:" + "0123456789abcdef" * 4


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("ubuntu", ImageRef("", "ubuntu")),
        ("ubuntu:22.04", ImageRef("", "ubuntu", "22.04")),
        (
            "determinedai/pytorch-ngc:0.38.1",
            ImageRef("", "determinedai/pytorch-ngc", "0.38.1"),
        ),
        ("nvcr.io/nvidia/pytorch:24.01-py3", ImageRef("nvcr.io", "nvidia/pytorch", "24.01-py3")),
        ("localhost/trainer", ImageRef("localhost", "trainer")),
        ("localhost:5000/team/trainer:v2", ImageRef("localhost:5000", "team/trainer", "v2")),
        (f"registry.example.com/img@{DIGEST}", ImageRef("registry.example.com", "img", "", DIGEST)),
        (f"img:v1@{DIGEST}", ImageRef("", "img", "v1", DIGEST)),
        ("[::1]:5000/img", ImageRef("[::1]:5000", "img")),
        ("Registry.Example.com/img", ImageRef("Registry.Example.com", "img")),
        ("a__b/c-d--e.f_g:Tag_1", ImageRef("", "a__b/c-d--e.f_g", "Tag_1")),
        # A first component without '.' or ':' is part of the path, not a registry.
        ("team/img", ImageRef("", "team/img")),
    ],
)
def test_valid_references_split_as_docker_splits_them(text: str, expected: ImageRef) -> None:
    assert parse_image(text) == expected
    assert str(parse_image(text)) == text


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "must not be empty"),
        ("Ubuntu", "'Ubuntu' must be lowercase"),
        ("team/Trainer:v1", "'Trainer' must be lowercase"),
        ("pytorch ngc", "whitespace"),
        (" ubuntu", "whitespace"),
        ("https://registry.example.com/img", "leave out the scheme"),
        ("a//b", "empty path component"),
        ("img:", "the tag after ':' is empty"),
        ("img:-latest", "tag '-latest' is not valid"),
        ("img:" + "t" * 129, "is not valid"),
        ("img@sha256:abc", "64 lowercase hex digits"),
        ("img@sha256:" + "A" * 64, "64 lowercase hex digits"),
        ("img@md5:" + "a" * 32, "must be sha256:"),
        ("img@" + DIGEST + "@" + DIGEST, "more than one @digest"),
        ("registry.example.com/", "names a registry but no repository"),
        ("registry.example.com:99999/img", "no valid port"),
        ("registry.example.com:port/img", "no valid port"),
        ("-bad.host/img", "not a host name"),
        ("team/-img", "may hold only lowercase letters"),
        ("team/img.", "may hold only lowercase letters"),
        (":v1", "names no repository"),
        ("a" * 256, "longer than 255"),
    ],
)
def test_malformed_references_are_refused_saying_why(text: str, why: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_image(text)
    assert why in str(caught.value)


CONFIG_PER_TYPE: dict[str, Any] = {
    "environment": {
        "image": {"cpu": "trainer:cpu", "gpu": "trainer:legacy-gpu", "rocm": "trainer:rocm"}
    }
}


def test_one_image_serves_every_slot_type() -> None:
    config = {"environment": {"image": "trainer:1"}}
    assert [image_for(config, t) for t in ("cpu", "cuda", "rocm")] == ["trainer:1"] * 3


def test_an_image_per_type_where_gpu_means_cuda() -> None:
    assert image_for(CONFIG_PER_TYPE, "cpu") == "trainer:cpu"
    assert image_for(CONFIG_PER_TYPE, "cuda") == "trainer:legacy-gpu"
    assert image_for(CONFIG_PER_TYPE, "rocm") == "trainer:rocm"
    # cuda, when given, wins over the legacy name.
    both = {"environment": {"image": {"cuda": "trainer:cuda", "gpu": "trainer:legacy-gpu"}}}
    assert image_for(both, "cuda") == "trainer:cuda"


def test_no_image_for_a_type_runs_on_the_host() -> None:
    assert image_for({"environment": {"image": {"cuda": "trainer:cuda"}}}, "cpu") is None
    assert image_for({"environment": {"image": None}}, "cuda") is None
    assert image_for({"environment": {}}, "cpu") is None
    assert image_for({}, "cpu") is None


def test_without_registry_auth_leaves_the_rest_and_the_original_alone() -> None:
    config = {
        "entrypoint": "python3 train.py",
        "environment": {"image": "trainer:1", "registry_auth": {"password": "s3cret"}},
    }
    stripped = without_registry_auth(config)
    assert stripped == {"entrypoint": "python3 train.py", "environment": {"image": "trainer:1"}}
    assert config["environment"]["registry_auth"] == {"password": "s3cret"}
    assert without_registry_auth({"entrypoint": "x"}) == {"entrypoint": "x"}


def test_the_container_spec_carries_image_pull_credentials_and_devices() -> None:
    config = {
        "environment": {
            "image": {"cpu": "trainer:cpu", "cuda": "nvcr.io/team/trainer:cuda"},
            "force_pull_image": True,
            "registry_auth": {
                "username": "robot",
                "password": "s3cret",
                "serveraddress": "nvcr.io",
                "email": "robot@example.com",
                "auth": None,
            },
        },
        "resources": {
            "devices": [
                {"host_path": "/dev/fuse", "container_path": "/dev/fuse", "mode": "rw"},
                {"host_path": "/dev/infiniband/uverbs0", "container_path": "/dev/uverbs0"},
            ]
        },
    }
    assert container_spec(config, "cuda") == ContainerSpec(
        image="nvcr.io/team/trainer:cuda",
        force_pull=True,
        registry_auth={"username": "robot", "password": "s3cret", "serveraddress": "nvcr.io"},
        devices=(
            DeviceSpec("/dev/fuse", "/dev/fuse", "rw"),
            DeviceSpec("/dev/infiniband/uverbs0", "/dev/uverbs0", "mrw"),
        ),
    )
    assert container_spec(config, "cpu") is not None
    assert container_spec(config, "rocm") is None  # no image for it: no container


def test_a_container_without_credentials_or_devices_pulls_anonymously() -> None:
    spec = container_spec({"environment": {"image": "ubuntu:22.04"}}, "cpu")
    assert spec == ContainerSpec(image="ubuntu:22.04")
    assert container_spec({"resources": {"devices": [{"host_path": "/dev/fuse"}]}}, "cpu") is None


def test_the_masters_default_image_fills_only_the_slot_types_a_config_names_none_for() -> None:
    fill = with_default_image
    assert fill({"name": "x"}, "team/base:1", False) == {
        "name": "x",
        "environment": {"image": "team/base:1"},
    }
    assert fill({}, {"cpu": "c:1"}, True) == {
        "environment": {"image": {"cpu": "c:1"}, "force_pull_image": True}
    }
    own = {"environment": {"image": "team/own:2", "force_pull_image": False}}
    assert fill(own, "team/base:1", True) == own  # names an image for every type
    assert fill({"environment": {"image": {"gpu": "g:1"}}}, "d:1", False) == {
        "environment": {"image": {"cuda": "g:1", "cpu": "d:1", "rocm": "d:1"}}
    }
    assert fill({"environment": {"image": {"cuda": "g:1"}}}, {"cuda": "d:1"}, True) == {
        "environment": {"image": {"cuda": "g:1"}}
    }
    # `cuda` wins over the legacy `gpu`, as at launch; the config's own images keep its
    # force_pull_image (False here), the defaults' goes only with a wholly default image.
    both = {"environment": {"image": {"cuda": "c:1", "gpu": "g:1"}, "force_pull_image": False}}
    assert fill(both, {"rocm": "r:1"}, True) == {
        "environment": {"image": {"cuda": "c:1", "rocm": "r:1"}, "force_pull_image": False}
    }
    assert fill({"environment": {"image": None}}, None, True) == {"environment": {"image": None}}
