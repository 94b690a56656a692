"""bind_mounts and shm_size: sizes as Docker reads them, where mounts land, and which
targets are refused at submit (master.core.mounts); the agent's mount plan and mount
points (agent.bootstrap)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent import bootstrap
from master.core import mounts
from master.core.mounts import MountRequest


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0, 0),
        (4096, 4096),
        ("4096", 4096),
        ("4G", 4 * 1024**3),
        ("4g", 4 * 1024**3),
        ("512 MiB", 512 * 1024**2),
        ("512mb", 512 * 1024**2),
        ("1.5k", 1536),
        (".5M", 512 * 1024),
        ("10b", 10),
        ("2T", 2 * 1024**4),
    ],
)
def test_memory_sizes_read_as_docker_reads_them(value: int | str, expected: int) -> None:
    assert mounts.parse_memory_size(value) == expected


@pytest.mark.parametrize("value", ["", "4 GB extra", "G", "-1", "4X", "1e9", True, -5])
def test_other_sizes_are_refused(value: int | str) -> None:
    with pytest.raises(ValueError):
        mounts.parse_memory_size(value)


def test_shm_size_zero_is_dockers_default_and_unset_is_the_hosts() -> None:
    assert mounts.shm_bytes(None) == 0  # no private /dev/shm
    assert mounts.shm_bytes(0) == 64 * 1024**2
    assert mounts.shm_bytes("1G") == 1024**3


def test_relative_container_paths_land_in_the_working_directory() -> None:
    assert mounts.container_target("data", mounts.WORKDIR) == "/run/determined/workdir/data"
    assert mounts.container_target("./a/../b", "/w") == "/w/b"
    assert mounts.container_target("/datasets/", "/w") == "/datasets"


def _problems(
    *container_paths: str, own: tuple[str, ...] = (), shared_fs: bool = False
) -> dict[str, str]:
    requests = [MountRequest("/host", path, False) for path in container_paths]
    return {p.path: p.message for p in mounts.mount_problems(requests, own, shared_fs=shared_fs)}


def test_mounts_over_the_trials_own_files_are_refused_naming_the_field() -> None:
    problems = _problems(
        "/data",  # fine
        "/run/determined",
        "/run/determined/train/model",
        "/run",  # would cover /run/determined
        "/",
        "train.py",  # the model definition's own file
        "pkg",  # covers pkg/util.py
        "../escape",
        "/tmp",
        "/dev/shm",
        "/determined_shared_fs/ckpt",
        "datasets",  # fine: a new directory in the working directory
        own=("train.py", "pkg", "pkg/util.py"),
        shared_fs=True,
    )
    assert set(problems) == {f"bind_mounts.{i}.container_path" for i in range(1, 11)}
    assert "/run/determined" in problems["bind_mounts.1.container_path"]
    assert "/run/determined" in problems["bind_mounts.3.container_path"]
    assert "'train.py'" in problems["bind_mounts.5.container_path"]
    assert "'pkg'" in problems["bind_mounts.6.container_path"]
    assert "leaves the working directory" in problems["bind_mounts.7.container_path"]
    assert "shared_fs" in problems["bind_mounts.10.container_path"]


def test_shared_fs_path_is_free_without_shared_fs_storage() -> None:
    assert _problems("/determined_shared_fs/x") == {}


def test_agent_plans_relative_mounts_inside_its_allocation(tmp_path: Path) -> None:
    planned = bootstrap.plan_mounts(
        [("/srv/a", "data/x", True), ("/srv/b", "/abs/", False)],
        "/run/determined/workdir",
        tmp_path,
    )
    assert planned[0].target == "/run/determined/workdir/data/x"
    assert planned[0].mount_point == tmp_path / "data" / "x"
    assert planned[0].read_only
    assert planned[1].target == "/abs" and planned[1].mount_point == Path("/abs")


def test_agent_makes_mount_points_and_names_a_missing_host_path(tmp_path: Path) -> None:
    source_dir = tmp_path / "src"
    source_dir.mkdir()
    source_file = tmp_path / "token.txt"
    source_file.write_text("x")
    work = tmp_path / "work"
    planned = bootstrap.plan_mounts(
        [(str(source_dir), "in/dir", False), (str(source_file), "conf/token.txt", True)],
        "/w",
        work,
    )
    assert bootstrap.prepare_mounts(planned) is None
    assert (work / "in" / "dir").is_dir()
    assert (work / "conf" / "token.txt").is_file()

    missing = bootstrap.plan_mounts([(str(tmp_path / "nope"), "x", False)], "/w", work)
    problem = bootstrap.prepare_mounts(missing)
    assert problem is not None and str(tmp_path / "nope") in problem
    assert "does not exist" in problem

    clash = bootstrap.plan_mounts([(str(source_file), "in/dir", False)], "/w", work)
    problem = bootstrap.prepare_mounts(clash)
    assert problem is not None and "is a file but /w/in/dir is a directory" in problem


@pytest.mark.parametrize(
    ("container_path", "says"),
    [
        ("//run/determined", "/run/determined"),  # the kernel collapses what normpath keeps
        ("///run/determined/x", "/run/determined"),
        ("/var/run/determined", "/run/determined"),  # /var/run is a link to /run
        ("//tmp", "the trial's own"),
        ("//dev/shm", "the trial's own"),
        ("//proc", "the trial's own"),
        ("./", "the working directory itself"),
        ("x/..", "the working directory itself"),
        ("/etc/sudoers", "the host's /etc"),
        ("//etc/ld.so.preload", "the host's /etc"),
        ("/root/.ssh", "the host's /root"),
        ("/var/run/other", "the host's /run"),
        ("/lib64", "the host's /lib64"),
    ],
)
def test_spellings_of_refused_targets_are_refused_too(container_path: str, says: str) -> None:
    """Found in review: these reached /run/determined, the trial's own paths, the whole
    working directory or the host's system configuration past the checks."""
    problems = _problems(container_path)
    assert list(problems) == ["bind_mounts.0.container_path"], (container_path, problems)
    assert says in problems["bind_mounts.0.container_path"]


def test_data_mounts_outside_system_directories_stay_allowed() -> None:
    assert _problems("/data", "/mnt/datasets", "/usr/local/share/x", "/var/lib/data", "cache") == {}


def test_a_size_past_int64_is_refused() -> None:
    assert mounts.parse_memory_size(2**63 - 1) == 2**63 - 1
    for value in (2**63, 2**70, "8192p", "9e"):
        with pytest.raises(ValueError):
            mounts.parse_memory_size(value)
