"""What the agent tells its container runtime (agent/containers.py), without running one:
the run command of a rank, the credentials file of a pull, the env file, the checks made
before anything starts. The real runtime is driven by tests/e2e/test_containers.py."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import resource
from pathlib import Path

import pytest

from agent import containers

PODMAN = containers.Runtime("podman", "/usr/bin/podman")
DOCKER = containers.Runtime("docker", "/usr/bin/docker")


def _spec(**overrides: object) -> containers.RankContainer:
    fields: dict[str, object] = {
        "name": "resolute-7.1-0",
        "agent_id": "gpu-node-3",
        "allocation_id": "7.1",
        "image": "registry.example.com:5000/team/train:2.1",
        "argv": ["python3", "train.py", "--epochs", "3"],
        "workdir": "/var/lib/agent/allocations/7.1",
        "env_file": "/var/lib/agent/containers/7.1/0.env",
    }
    fields.update(overrides)
    return containers.RankContainer(**fields)  # type: ignore[arg-type]


def _option_values(argv: list[str], option: str) -> list[str]:
    return [argv[i + 1] for i, word in enumerate(argv) if word == option]


def test_a_rank_runs_attached_on_the_host_network_with_labels_and_its_env_file() -> None:
    argv = containers.run_argv(PODMAN, _spec())
    image_at = argv.index("registry.example.com:5000/team/train:2.1")
    # The entrypoint follows the image, untouched; every option comes before it.
    assert argv[image_at + 1 :] == ["python3", "train.py", "--epochs", "3"]
    assert argv[:2] == ["/usr/bin/podman", "run"]
    assert "--rm" in argv and "--init" in argv and "--detach" not in argv
    assert _option_values(argv, "--network") == ["host"]
    assert _option_values(argv, "--pull") == ["never"]  # pulled before, with credentials
    assert _option_values(argv, "--label") == [
        "ai.resolute.agent=gpu-node-3",
        "ai.resolute.allocation=7.1",
    ]
    assert _option_values(argv, "--env-file") == ["/var/lib/agent/containers/7.1/0.env"]
    assert _option_values(argv, "--workdir") == ["/var/lib/agent/allocations/7.1"]
    assert _option_values(argv, "--shm-size") == [str(4 << 30)]  # Determined's default


def test_mounts_devices_gpus_user_and_shm_reach_the_command() -> None:
    spec = _spec(
        volumes=[
            containers.Volume("/datasets/imagenet", "/data", read_only=True),
            containers.Volume("/scratch", "/scratch"),
        ],
        devices=[("/dev/fuse", "/dev/fuse", ""), ("/dev/infiniband/uverbs0", "/dev/ib0", "rw")],
        gpus=["GPU-aaaa", "GPU-bbbb"],
        shm_size_bytes=96 << 20,
        user=(1879048200, 1879048200),
        groups=[44, 1000],
        id_file="/run/x/0.id",
    )
    podman = containers.run_argv(PODMAN, spec)
    assert _option_values(podman, "--volume") == [
        "/datasets/imagenet:/data:ro",
        "/scratch:/scratch",
    ]
    assert _option_values(podman, "--device") == [
        "/dev/fuse:/dev/fuse:rwm",
        "/dev/infiniband/uverbs0:/dev/ib0:rw",
        "nvidia.com/gpu=GPU-aaaa",  # CDI names a GPU by its UUID
        "nvidia.com/gpu=GPU-bbbb",
    ]
    assert _option_values(podman, "--user") == ["1879048200:1879048200"]
    assert _option_values(podman, "--shm-size") == [str(96 << 20)]
    assert _option_values(podman, "--group-add") == ["44", "1000"]
    assert _option_values(podman, "--pidfile") == ["/run/x/0.id"]
    docker = containers.run_argv(DOCKER, spec)
    assert _option_values(docker, "--gpus") == ["device=GPU-aaaa", "device=GPU-bbbb"]
    # Docker's run has no --pidfile: the container's id, then `docker inspect`.
    assert "--pidfile" not in docker and _option_values(docker, "--cidfile") == ["/run/x/0.id"]


def test_podman_gets_limits_the_host_allows_and_docker_its_daemons() -> None:
    limits = containers.host_limits(PODMAN)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY:
        assert f"nofile={soft}:{hard}" in limits
    nproc = _option_values(limits, "--ulimit")[-1]
    assert nproc.startswith("nproc=") and int(nproc.split(":")[1]) <= containers.PODMAN_NPROC
    assert containers.host_limits(DOCKER) == []


@pytest.mark.parametrize(
    ("image", "registry"),
    [
        ("python:3.11", "docker.io"),
        ("determinedai/pytorch-ngc:0.38.1", "docker.io"),
        ("registry.example.com/team/img", "registry.example.com"),
        ("127.0.0.1:5000/team/img:1", "127.0.0.1:5000"),
        ("localhost/resolute-test/base:bookworm", "localhost"),
    ],
)
def test_the_registry_of_an_image(image: str, registry: str) -> None:
    assert containers.registry_of(image) == registry


def test_credentials_go_to_the_images_registry_as_docker_writes_them() -> None:
    written = containers.auth_file(
        {"username": "team", "password": "pw:with:colons"}, "127.0.0.1:5000/team/img:1"
    )
    entry = written["auths"]["127.0.0.1:5000"]  # type: ignore[index]
    assert base64.b64decode(entry["auth"]).decode() == "team:pw:with:colons"
    # serveraddress wins, written as the runtimes look it up (a host, no scheme).
    written = containers.auth_file(
        {"username": "a", "password": "b", "serveraddress": "https://registry.example.com/"},
        "img",
    )
    assert list(written["auths"]) == ["registry.example.com"]  # type: ignore[call-overload]
    token = containers.auth_file({"identitytoken": "tok"}, "ghcr.io/x/y")
    assert token == {"auths": {"ghcr.io": {"identitytoken": "tok"}}}
    json.dumps(token)
    # Docker Hub under the key each runtime looks it up by, however the config names it.
    for server in ("https://index.docker.io/v1/", "docker.io", "registry-1.docker.io"):
        hub = {"username": "a", "password": "b", "serveraddress": server}
        assert list(containers.auth_file(hub, "team/img")["auths"]) == ["docker.io"]  # type: ignore[call-overload]
        docker = containers.auth_file(hub, "team/img", "docker")
        assert list(docker["auths"]) == ["https://index.docker.io/v1/"]  # type: ignore[call-overload]
    assert list(containers.auth_file({"username": "a", "password": "b"}, "team/img")["auths"]) == [  # type: ignore[call-overload]
        "docker.io"
    ]


def test_an_env_file_carries_each_variable_and_refuses_a_line_break() -> None:
    text = containers.env_file_text({"A": "1", "DET_EXPERIMENT_CONFIG": '{"x": "a=b"}', "E": ""})
    assert text == 'A=1\nDET_EXPERIMENT_CONFIG={"x": "a=b"}\nE=\n'
    with pytest.raises(ValueError, match=r"'MULTI'.*line break"):
        containers.env_file_text({"MULTI": "one\ntwo"})
    assert containers.env_problem({"A": "1", "E": ""}) is None
    assert "'K=V'" in (containers.env_problem({"K=V": "1"}) or "")


def test_mounts_onto_runtime_paths_and_missing_sources_are_named(tmp_path: Path) -> None:
    assert containers.mounts_problem([(str(tmp_path), "/data")], [("/dev/null", "/dev/x")]) is None
    for target in ("/proc", "/proc/sys", "/dev/shm", "/run/determined", "/"):
        problem = containers.mounts_problem([(str(tmp_path), target)], [])
        assert problem is not None and f"container_path {target}" in problem, target
    problem = containers.mounts_problem([(str(tmp_path / "gone"), "/data")], [])
    assert problem == (
        f"bind_mounts: host_path {tmp_path / 'gone'} does not exist on this agent "
        "(for container_path /data)"
    )
    problem = containers.mounts_problem([], [("/dev/no-such-device", "/dev/x")])
    assert (
        problem
        == "resources.devices: /dev/no-such-device does not exist on this agent (for /dev/x)"
    )


def test_a_container_killed_by_a_signal_reads_as_a_host_process_killed_by_it() -> None:
    assert containers.signal_exit(137) == -9
    assert containers.signal_exit(143) == -15
    assert containers.signal_exit(0) == 0
    assert containers.signal_exit(1) == 1
    assert containers.signal_exit(125) == 125  # the runtime's own failure stays visible


def test_an_unknown_runtime_or_a_missing_client_is_refused_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(ValueError, match="must be one of none, podman, docker"):
        containers.find_runtime("containerd")
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ValueError, match="podman is not on PATH"):
        containers.find_runtime("podman")


def test_a_gang_on_one_agent_is_one_container_whose_launcher_gets_the_ranks() -> None:
    argv = containers.group_argv("/w/7.1/.ranks", [0, 1, 2], ["python3", "train.py", "--x"])
    assert argv[:2] == ["/bin/sh", "-c"] and argv[2] == containers.GROUP_LAUNCHER
    ranks = ["resolute-ranks", "/w/7.1/.ranks", "3", "0", "1", "2"]
    assert argv[3:] == [*ranks, "python3", "train.py", "--x"]


def test_only_the_launchers_own_line_says_a_rank_ended() -> None:
    marker = containers.RANK_EXIT_MARKER.encode()
    assert containers.parse_rank_exit(marker + b" 3 143") == (3, 143)
    assert containers.parse_rank_exit(b"resolute-rank-exit 3 143") is None  # no marker byte
    assert containers.parse_rank_exit(b"[rank=3] " + marker + b" 3 0") is None
    assert containers.parse_rank_exit(marker + b" 3") is None
    assert containers.parse_rank_exit(marker + b" x 1") is None


def _fake_runtime(tmp_path: Path) -> containers.Runtime:
    """A stand-in for podman's client that logs each call: `image exists` says no, `pull`
    fails for the password "wrong" (read from the --authfile it gets).
    The concurrency of pulls is what is tested; real pulls are in tests/e2e."""
    script = tmp_path / "podman"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> {tmp_path}/calls\n'
        'if [ "$1" = image ]; then exit 1; fi\n'
        'auth=""\n'
        'while [ $# -gt 0 ]; do [ "$1" = --authfile ] && auth=$2; shift; done\n'
        # base64 of "team:wrong"
        'if [ -n "$auth" ] && grep -q dGVhbTp3cm9uZw== "$auth"; then\n'
        '  echo "Error: unauthorized: authentication required" >&2; exit 125; fi\n'
        "echo done\n"
    )
    script.chmod(0o755)
    return containers.Runtime("podman", str(script))


async def test_launches_share_a_pull_only_with_the_same_credentials(tmp_path: Path) -> None:
    puller = containers.ImagePuller(_fake_runtime(tmp_path), tmp_path / "pulls")
    right = {"username": "team", "password": "right"}
    wrong = {"username": "team", "password": "wrong"}
    image = "127.0.0.1:5000/team/img:1"
    results = await asyncio.gather(
        puller.ensure(image, right, False, lambda _: None),
        puller.ensure(image, right, False, lambda _: None),
        puller.ensure(image, wrong, False, lambda _: None),
        return_exceptions=True,
    )
    assert results[0] is None and results[1] is None, results  # the wrong one failed alone
    assert isinstance(results[2], containers.ImageProblem)
    assert "unauthorized: authentication required" in str(results[2])
    pulls = [c for c in (tmp_path / "calls").read_text().splitlines() if c.startswith("pull")]
    assert len(pulls) == 2, pulls  # one for the two launches with the right password
    assert not os.listdir(tmp_path / "pulls"), "a pull's credentials outlived it"
