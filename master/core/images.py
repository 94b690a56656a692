"""Container images of trials and tasks (issue 31): image references read as Docker and
podman read them, the image a slot type runs, and what a launch's container needs. No I/O.

The agent's runtime pulls and runs the image; the master only checks the reference at
submit, so a typo is refused there rather than failing every trial on its agent, and says
which image, credentials and devices go with each launch.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ContainerSpec",
    "DeviceSpec",
    "ImageRef",
    "container_spec",
    "image_for",
    "parse_image",
    "registry_problem",
    "without_registry_auth",
]

MAX_NAME_LENGTH = 255  # Docker's limit on the name (host and path), tag and digest apart
# Docker's AuthConfig keys that a launch's container carries (not `email`, which no
# registry reads any more).
_AUTH_KEYS = ("username", "password", "auth", "serveraddress", "identitytoken", "registrytoken")

# A path component: lowercase letters and digits, joined by one '.', one or two '_', or
# any number of '-' (Docker's reference grammar).
_COMPONENT = re.compile(r"[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*")
_HOST_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?")
_IPV6 = re.compile(r"\[[0-9A-Fa-f:.]+\]")
_TAG = re.compile(r"[\w][\w.-]{0,127}", re.ASCII)
_DIGEST_HEX = {"sha256": 64, "sha512": 128}


@dataclass(frozen=True)
class ImageRef:
    """An image reference, split: `registry` is "" for Docker Hub's default registry."""

    registry: str
    path: str
    tag: str = ""
    digest: str = ""

    def __str__(self) -> str:
        name = f"{self.registry}/{self.path}" if self.registry else self.path
        tag = f":{self.tag}" if self.tag else ""
        return name + tag + (f"@{self.digest}" if self.digest else "")


def parse_image(text: str) -> ImageRef:
    """`[registry-host[:port]/]path[:tag][@algorithm:hex]`; ValueError says what is wrong."""
    if not text:
        raise ValueError("must not be empty")
    if text != text.strip() or any(c.isspace() for c in text):
        raise ValueError(f"{text!r} is not an image name: it contains whitespace")
    if "://" in text:
        raise ValueError(
            f"{text!r} is not an image name: leave out the scheme ({text.split('://')[0]}://)"
        )
    rest, _, digest = text.partition("@")
    if "@" in digest:
        raise ValueError(f"{text!r} is not an image name: it has more than one @digest")
    if digest:
        _check_digest(text, digest)
    # A tag follows the last ':' after the last '/' (a ':' before it is the registry's port).
    slash = rest.rfind("/")
    colon = rest.rfind(":")
    tag = ""
    if colon > slash:
        rest, tag = rest[:colon], rest[colon + 1 :]
        if not tag:
            raise ValueError(f"{text!r}: the tag after ':' is empty")
        if not _TAG.fullmatch(tag):
            raise ValueError(
                f"{text!r}: tag {tag!r} is not valid; a tag is at most 128 letters, digits, "
                "'_', '.' or '-', not starting with '.' or '-'"
            )
    if not rest:
        raise ValueError(f"{text!r} is not an image name: it names no repository")
    first, sep, path = rest.partition("/")
    registry = ""
    if sep and ("." in first or ":" in first or first == "localhost"):
        registry = first
        _check_registry(text, registry)
    else:
        path = rest
    if not path:
        raise ValueError(f"{text!r} is not an image name: it names a registry but no repository")
    for component in path.split("/"):
        if not component:
            raise ValueError(f"{text!r} is not an image name: it has an empty path component")
        if not _COMPONENT.fullmatch(component):
            why = (
                "must be lowercase"
                if _COMPONENT.fullmatch(component.lower())
                else "may hold only lowercase letters, digits and single separators "
                "('.', '_', '__' or '-') between them"
            )
            raise ValueError(f"{text!r}: repository name component {component!r} {why}")
    if len(rest) > MAX_NAME_LENGTH:
        raise ValueError(f"{text!r}: the name is longer than {MAX_NAME_LENGTH} characters")
    return ImageRef(registry=registry, path=path, tag=tag, digest=digest)


def _check_digest(text: str, digest: str) -> None:
    algorithm, _, hex_part = digest.partition(":")
    length = _DIGEST_HEX.get(algorithm)
    if length is None:
        raise ValueError(
            f"{text!r}: digest {digest!r} must be sha256:<64 hex digits> "
            "(or sha512:<128 hex digits>)"
        )
    if len(hex_part) != length or not re.fullmatch(r"[0-9a-f]+", hex_part):
        raise ValueError(
            f"{text!r}: digest {digest!r} must be {algorithm}: followed by {length} lowercase "
            "hex digits"
        )


def _check_registry(text: str, registry: str) -> None:
    problem = registry_problem(registry)
    if problem:
        raise ValueError(f"{text!r}: registry {registry!r} {problem}")


def registry_problem(registry: str) -> str | None:
    """What is wrong with a registry's host[:port] (a DNS name, an IPv4 address or a
    bracketed IPv6 one), or None."""
    port: str | None
    if registry.startswith("["):
        host, bracket, after = registry.partition("]")
        host_ok = bool(bracket) and _IPV6.fullmatch(host + bracket) is not None
        host_ok = host_ok and (not after or after.startswith(":"))
        port = after[1:] if after else None
    else:
        host, colon, after = registry.partition(":")
        host_ok = all(_HOST_LABEL.fullmatch(label) for label in host.split("."))
        port = after if colon else None
    if not host_ok:
        return "is not a host name or address"
    if port is not None and not (re.fullmatch(r"[0-9]{1,5}", port) and 0 < int(port) <= 65535):
        return "has no valid port (1-65535)"
    return None


def image_for(config: Mapping[str, Any], device_type: str) -> str | None:
    """The image of a slot type ("cpu", "cuda", "rocm") from environment.image: one name
    for every type, or one per type, where Determined's legacy `gpu` means `cuda`. None:
    no image for that type, and the processes run on the host."""
    environment = config.get("environment")
    image = environment.get("image") if isinstance(environment, Mapping) else None
    if isinstance(image, str):
        return image or None
    if not isinstance(image, Mapping):
        return None
    chosen = image.get(device_type)
    if not chosen and device_type == "cuda":
        chosen = image.get("gpu")
    return chosen if isinstance(chosen, str) and chosen else None


def names_an_image(config: Mapping[str, Any]) -> bool:
    """Whether environment.image names an image for some slot type."""
    return any(image_for(config, kind) for kind in ("cpu", "cuda", "rocm"))


def required_image_problem(config: Mapping[str, Any], pool_name: str) -> str | None:
    """Why a pool that takes only images (require_image) refuses `config`, or None."""
    if names_an_image(config):
        return None
    return (
        f"environment.image: resource pool {pool_name!r} runs only images (require_image); "
        "name one in environment.image, or choose another pool in resources.resource_pool"
    )


SLOT_TYPES = ("cpu", "cuda", "rocm")


def with_default_image(
    config: Mapping[str, Any], default: str | Mapping[str, str] | None, force_pull: bool
) -> dict[str, Any]:
    """`config` with task_container_defaults.image for each slot type it names no image
    for, as Determined merges the master's defaults into a config at submit (so the stored
    config says where it ran). The defaults' force_pull_image goes with the default image
    when the config names none of its own (its own images keep its own setting)."""
    out = dict(config)
    if not default:
        return out
    missing = [kind for kind in SLOT_TYPES if image_for(config, kind) is None]
    defaults = {"environment": {"image": default}}
    filled = {kind: image for kind in missing if (image := image_for(defaults, kind))}
    if not filled:
        return out
    environment = dict(config.get("environment") or {})
    own = environment.get("image")
    if len(missing) == len(SLOT_TYPES) and isinstance(default, str):
        environment["image"] = default
    else:
        mine = {k: v for k, v in own.items() if v} if isinstance(own, Mapping) else {}
        if "gpu" in mine:  # Determined's legacy name, where `cuda` wins (image_for)
            mine.setdefault("cuda", mine["gpu"])
            del mine["gpu"]
        environment["image"] = {**mine, **filled}
    if force_pull and len(missing) == len(SLOT_TYPES):
        environment["force_pull_image"] = True
    out["environment"] = environment
    return out


def without_registry_auth(config: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of the config without environment.registry_auth: what a trial's or task's
    processes may read (the agent's runtime alone gets the credentials)."""
    out = dict(config)
    environment = out.get("environment")
    if isinstance(environment, Mapping) and "registry_auth" in environment:
        out["environment"] = {k: v for k, v in environment.items() if k != "registry_auth"}
    return out


@dataclass(frozen=True)
class DeviceSpec:
    host_path: str
    container_path: str
    cgroup_permissions: str


@dataclass(frozen=True)
class ContainerSpec:
    """What a launch's container needs: the master turns it into the protocol's Container."""

    image: str
    force_pull: bool = False
    registry_auth: dict[str, str] = field(default_factory=dict)
    """Only the keys that are set; empty: the pull is anonymous."""
    devices: tuple[DeviceSpec, ...] = ()


def container_spec(
    config: Mapping[str, Any],
    device_type: str,
    default_auth: Mapping[str, str] | None = None,
) -> ContainerSpec | None:
    """The container of a launch on slots of `device_type`, from a validated experiment
    or task config; None when no image applies to that type. `default_auth`: the
    task_container_defaults' credentials, for a config that gives none."""
    image = image_for(config, device_type)
    if image is None:
        return None
    environment = config.get("environment")
    environment = environment if isinstance(environment, Mapping) else {}
    auth = environment.get("registry_auth") or default_auth
    registry_auth = (
        {key: str(auth[key]) for key in _AUTH_KEYS if auth.get(key)}
        if isinstance(auth, Mapping)
        else {}
    )
    resources = config.get("resources")
    listed = resources.get("devices") if isinstance(resources, Mapping) else None
    devices = tuple(
        DeviceSpec(
            host_path=str(device["host_path"]),
            container_path=str(device["container_path"]),
            cgroup_permissions=str(device.get("mode") or "mrw"),
        )
        for device in listed or ()
        if isinstance(device, Mapping)
    )
    return ContainerSpec(
        image=image,
        force_pull=bool(environment.get("force_pull_image")),
        registry_auth=registry_auth,
        devices=devices,
    )
