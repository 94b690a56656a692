"""The ranks' user (`det-agent --rank-user`): the settings that name it, the checks at
start, the setpriv command that switches to it, and what the agent hands a rank: its
environment, its run directory, its S3 credentials file, its namespace. The switching
tests run real processes and need root (CI runs as root)."""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from agent import bootstrap, rank_user, storage_secrets
from agent import runner as runner_module
from agent.main import app
from agent.rank_user import RankUser
from agent.runner import AllocationRun, Runner
from agent.settings import AgentSettings
from resolute_proto.agent.v1 import agent_pb2 as pb
from tests.conftest import require

DET_AGENT = Path(sys.executable).parent / "det-agent"
SETPRIV = "/usr/bin/setpriv"
NOBODY = RankUser("nobody", 65534, 65534)


def nobody() -> RankUser:
    try:
        entry = pwd.getpwnam("nobody")
    except KeyError:
        require(False, "no user 'nobody' on this machine")
        raise
    return RankUser("nobody", entry.pw_uid, entry.pw_gid)


def require_root() -> None:
    require(os.geteuid() == 0, "switching users needs root (as the agent has)")
    require(rank_user.SETPRIV is not None, "util-linux's setpriv is not installed")


@pytest.fixture
def passable() -> Iterator[Path]:
    """A directory the rank user may pass through (pytest's own are 0700)."""
    path = Path(tempfile.mkdtemp(dir="/var/tmp", prefix="resolute-rank-user-"))
    path.chmod(0o711)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


# -- settings ---------------------------------------------------------------------------------


def errors(**given: object) -> list[tuple[str, str]]:
    with pytest.raises(ValidationError) as caught:
        AgentSettings(join_token="t", **given)  # type: ignore[arg-type]
    return [(".".join(map(str, e["loc"])), e["msg"]) for e in caught.value.errors()]


def test_an_unknown_rank_user_is_named() -> None:
    assert errors(rank_user="no-such-user-x") == [("rank_user", "no such user 'no-such-user-x'")]


def test_an_unknown_rank_group_is_named() -> None:
    assert errors(rank_user="root", rank_group="no-such-group-x") == [
        ("rank_group", "no such group 'no-such-group-x'")
    ]


def test_a_rank_group_needs_a_rank_user() -> None:
    assert errors(rank_group="root") == [("rank_group", "rank_group needs rank_user")]


def test_the_rank_user_comes_from_the_environment_and_blank_means_unset(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DET_AGENT_RANK_USER", "root")
    assert AgentSettings(join_token="t").rank_user == "root"
    monkeypatch.setenv("DET_AGENT_RANK_USER", " ")
    assert AgentSettings(join_token="t").rank_user is None


def test_det_agent_refuses_an_unknown_rank_user_with_exit_2(tmp_path: Path) -> None:
    result = subprocess.run(
        [str(DET_AGENT), "--rank-user", "no-such-user-x", "--join-token", "t"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if not k.startswith("DET_")},
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert "det-agent: setting rank_user: no such user 'no-such-user-x'" in result.stderr


def test_det_agent_not_root_refuses_to_switch_users(monkeypatch: pytest.MonkeyPatch) -> None:
    # In-process with the agent's uid faked: the agent's own interpreter may be out of
    # nobody's reach (under /root), so it cannot simply be started as nobody.
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(os, "getegid", lambda: 1000)
    for name in [k for k in os.environ if k.startswith("DET_")]:
        monkeypatch.delenv(name)
    result = CliRunner().invoke(app, ["--rank-user", "root", "--join-token", "t"])
    assert result.exit_code == 2, result.output
    assert (
        "det-agent: setting rank_user: the agent runs as uid 1000, not root, and only root "
        "can start ranks as another user ('root')"
    ) in result.output


def test_det_agent_refuses_a_work_dir_the_rank_user_cannot_enter(tmp_path: Path) -> None:
    require_root()
    nobody()
    closed = tmp_path / "closed"  # pytest's tmp_path is 0700, root's
    result = subprocess.run(
        [str(DET_AGENT), "--rank-user", "nobody", "--join-token", "t", "--work-dir", str(closed)],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if not k.startswith("DET_")},
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert f"user 'nobody' cannot enter work_dir {closed}" in result.stderr


# -- the checks at start ----------------------------------------------------------------------


def test_an_agent_without_a_rank_user_warns_once() -> None:
    rank, warnings = rank_user.for_agent(None, euid=0, egid=0, setpriv=SETPRIV)
    assert rank is None
    assert len(warnings) == 1 and "ranks run as root" in warnings[0]
    # Not root either: its ranks still read what the agent's user can.
    rank, warnings = rank_user.for_agent(None, euid=1000, egid=1000, setpriv=SETPRIV)
    assert rank is None
    assert len(warnings) == 1 and "ranks run as the agent's own user" in warnings[0]


def test_a_root_agent_switches_to_the_rank_user() -> None:
    assert rank_user.for_agent(NOBODY, euid=0, egid=0, setpriv=SETPRIV) == (NOBODY, [])


def test_a_rank_user_root_is_accepted_with_a_warning() -> None:
    root = RankUser("root", 0, 0)
    rank, warnings = rank_user.for_agent(root, euid=0, egid=0, setpriv=SETPRIV)
    assert rank == root
    assert warnings == [rank_user.ROOT_RANKS_WARNING]
    # What the ranks can then read, and the way back to the default.
    for words in ("join token", "credential", "/proc", "run directory and checkpoints"):
        assert words in warnings[0]
    assert rank_user.DEFAULT_UID_SPACE in warnings[0]


def test_an_agent_that_is_not_root_cannot_switch() -> None:
    with pytest.raises(ValueError, match=r"runs as uid 1000, not root.*\('nobody'\)"):
        rank_user.for_agent(NOBODY, euid=1000, egid=1000, setpriv=SETPRIV)
    # Its own user needs no switch.
    own = RankUser("me", 1000, 1000)
    assert rank_user.for_agent(own, euid=1000, egid=1000, setpriv=SETPRIV) == (None, [])


def test_without_setpriv_a_rank_user_is_refused() -> None:
    with pytest.raises(ValueError, match="setpriv is not installed"):
        rank_user.for_agent(NOBODY, euid=0, egid=0, setpriv=None)


def test_a_join_token_file_others_can_read_is_named(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("t")
    token.chmod(0o644)
    _, warnings = rank_user.for_agent(
        NOBODY, euid=0, egid=0, setpriv=SETPRIV, join_token_file=token
    )
    assert warnings == [
        f"join_token_file {token} is readable by other users (mode 0644): chmod 600 it"
    ]
    token.chmod(0o600)
    assert (
        rank_user.for_agent(NOBODY, euid=0, egid=0, setpriv=SETPRIV, join_token_file=token)[1] == []
    )


# -- the command ------------------------------------------------------------------------------


def test_the_command_switches_then_execs_as_the_user() -> None:
    argv = rank_user.command(["python3", "x.py"], setpriv=SETPRIV, die_with_agent=True, rank=NOBODY)
    assert argv == [
        SETPRIV,
        "--pdeathsig",
        "KILL",
        "--reuid=65534",
        "--regid=65534",
        "--init-groups",
        "--no-new-privs",
        "--",
        rank_user.ENV,
        "--",
        "python3",
        "x.py",
    ]
    assert rank_user.command(["a"], setpriv=SETPRIV, die_with_agent=True) == [
        SETPRIV,
        "--pdeathsig",
        "KILL",
        "--",
        "a",
    ]
    assert rank_user.command(["a"], setpriv=SETPRIV) == ["a"]


def test_without_setpriv_a_rank_never_runs_as_the_agent() -> None:
    assert rank_user.command(["a"], setpriv=None, die_with_agent=True) == ["a"]
    with pytest.raises(RuntimeError, match="setpriv is not installed"):
        rank_user.command(["a"], setpriv=None, rank=NOBODY)


def test_a_switched_process_has_the_user_its_group_and_no_root_groups() -> None:
    require_root()
    user = nobody()
    argv = rank_user.command(
        ["sh", "-c", 'id -u; id -g; id -G; echo "$HOME"'],
        setpriv=rank_user.SETPRIV,
        rank=user,
    )
    out = subprocess.run(argv, capture_output=True, text=True, check=True, cwd="/").stdout.split()
    assert out[:3] == [str(user.uid), str(user.gid), str(user.gid)]


def test_a_switched_rank_still_dies_with_the_agent() -> None:
    """A change of user clears PR_SET_PDEATHSIG in the kernel; setpriv sets it after."""
    require_root()
    user = nobody()
    argv = rank_user.command(
        ["sleep", "60"], setpriv=rank_user.SETPRIV, die_with_agent=True, rank=user
    )
    parent = subprocess.run(
        [sys.executable, "-c", WAIT_FOR_EXEC_THEN_EXIT, *argv],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    pid = int(parent.stdout)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.05)
    if _alive(pid):
        os.kill(pid, signal.SIGKILL)
        pytest.fail(f"rank {pid} outlived its parent")


# The parent starts the rank (its output not inherited, so nothing waits on the sleep) and
# exits once setpriv has exec'd the command: by then PR_SET_PDEATHSIG is set. Exiting any
# sooner would race setpriv, and the kernel only signals deaths after the prctl.
WAIT_FOR_EXEC_THEN_EXIT = """
import pathlib, subprocess, sys, time
rank = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
comm = pathlib.Path(f"/proc/{rank.pid}/comm")
deadline = time.monotonic() + 10
while comm.read_text().strip() != "sleep" and time.monotonic() < deadline:
    time.sleep(0.01)
print(rank.pid)
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except OSError:
        return False
    return state != "Z"


# -- what a rank gets -------------------------------------------------------------------------


def make_runner(work_dir: Path, rank: RankUser | None) -> Runner:
    runner = Runner("a1", work_dir, [], lambda _m: None, lambda _e: None)
    runner.rank_user = rank
    runner.withheld = ("the-join-token-value",)
    return runner


def test_no_agent_setting_or_withheld_value_reaches_a_rank(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # pydantic-settings reads its variables in any case: the lowercase name is the token too.
    monkeypatch.setenv("det_agent_join_token", "the-join-token-value")
    monkeypatch.setenv("DET_AGENT_CREDENTIAL_FILE", "/x/agent-credential")
    monkeypatch.setenv("SOME_COPY", "prefix-the-join-token-value")
    monkeypatch.setenv("HARMLESS", "kept")
    runner = make_runner(tmp_path, NOBODY)
    run = AllocationRun("1.1", tmp_path / "allocations" / "1.1", 1.0)
    start = pb.StartAllocation(allocation_id="1.1", env={"MY_VAR": "x"})
    env = runner._rank_env(start, pb.RankSpec(rank=0), run)
    assert not [k for k in env if k.upper().startswith("DET_AGENT_") and k != "DET_AGENT_ID"]
    assert "SOME_COPY" not in env
    assert not any("the-join-token-value" in v for v in env.values())
    assert env["HARMLESS"] == "kept" and env["MY_VAR"] == "x"
    # Not root's home and name.
    assert (env["HOME"], env["USER"], env["LOGNAME"]) == (str(run.work_dir), "nobody", "nobody")


def test_an_experiment_s_own_home_wins(tmp_path: Path) -> None:
    runner = make_runner(tmp_path, NOBODY)
    run = AllocationRun("1.1", tmp_path / "allocations" / "1.1", 1.0)
    start = pb.StartAllocation(allocation_id="1.1", env={"HOME": "/data/home"})
    assert runner._rank_env(start, pb.RankSpec(rank=0), run)["HOME"] == "/data/home"


def test_the_run_directory_becomes_the_rank_user_s_alone(passable: Path) -> None:
    require_root()
    user = nobody()
    runner = make_runner(passable, user)
    run = AllocationRun("1.1", passable / "allocations" / "1.1", 1.0)
    (run.work_dir / "info").mkdir(parents=True)
    (run.work_dir / "info" / "trial.json").write_text("{}")
    runner._hand_over(run)
    for path in (run.work_dir, run.work_dir / "info", run.work_dir / "info" / "trial.json"):
        assert (path.stat().st_uid, path.stat().st_gid) == (user.uid, user.gid), path
    assert stat.S_IMODE(run.work_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE(run.work_dir.parent.stat().st_mode) == 0o711
    # The rank user reads its own run, and cannot list the other allocations.
    reads = rank_user.command(
        ["cat", str(run.work_dir / "info" / "trial.json")], setpriv=rank_user.SETPRIV, rank=user
    )
    assert subprocess.run(reads, capture_output=True, text=True, cwd="/").stdout == "{}"
    lists = rank_user.command(
        ["ls", str(run.work_dir.parent)], setpriv=rank_user.SETPRIV, rank=user
    )
    assert "Permission denied" in subprocess.run(lists, capture_output=True, text=True).stderr


def test_the_s3_credentials_file_is_the_rank_user_s_alone(passable: Path) -> None:
    require_root()
    user = nobody()
    config = (
        '{"checkpoint_storage": {"type": "s3", "bucket": "b", '
        '"access_key": "AKIA", "secret_key": "SECRET"}}'
    )
    env = {storage_secrets.CONFIG_VARIABLE: config}
    secrets_dir = passable / "secrets" / "1.1"
    path = storage_secrets.move_s3_keys(env, {}, secrets_dir, user)
    assert path is not None and "SECRET" not in env[storage_secrets.CONFIG_VARIABLE]
    for item, mode in ((path, 0o600), (secrets_dir, 0o700), (secrets_dir.parent, 0o711)):
        assert stat.S_IMODE(item.stat().st_mode) == mode, item
    assert (path.stat().st_uid, secrets_dir.stat().st_uid) == (user.uid, user.uid)
    reads = rank_user.command(["cat", str(path)], setpriv=rank_user.SETPRIV, rank=user)
    assert "SECRET" in subprocess.run(reads, capture_output=True, text=True, cwd="/").stdout


def test_a_per_agent_entrypoint_runs_as_the_rank_user_after_the_mounts(passable: Path) -> None:
    require_root()
    require(shutil.which("unshare") is not None, "util-linux's unshare is not installed")
    problem = bootstrap.probe_namespaces(passable)
    require(problem is None, f"no namespaces here: {problem}")
    user = nobody()
    run_dir, tmp_dir = passable / "run", passable / "tmp"
    (run_dir / "workdir").mkdir(parents=True)
    rank_user.chown_tree(run_dir, user)
    switch = rank_user.command([], setpriv=rank_user.SETPRIV, rank=user)
    script = (
        "id -u; pwd; mktemp -p /tmp >/dev/null && echo tmp-writable; cat /proc/1/environ || true"
    )
    result = subprocess.run(
        bootstrap.wrap(["sh", "-c", script], run_dir, "", tmp_dir, switch),
        capture_output=True,
        text=True,
        timeout=30,
        start_new_session=True,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [str(user.uid), "/run/determined/workdir", "tmp-writable"]
    # The namespace's init, which keeps root to pass signals on, is not readable to it.
    assert "Permission denied" in result.stderr


# -- rank_uid_range: a uid of their own per allocation ----------------------------------------


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ("61000", "'61000' is not START-END (two integers, e.g. 61000-61999)"),
        ("a-b", "'a-b' is not START-END (two integers, e.g. 61000-61999)"),
        ("999-2000", "'999-2000': START-END must satisfy 1000 <= START <= END < 2**31"),
        ("62000-61000", "'62000-61000': START-END must satisfy 1000 <= START <= END < 2**31"),
        ("61000-2147483648", "'61000-2147483648': START-END must satisfy 1000 <= START"),
    ],
)
def test_a_bad_rank_uid_range_is_named(given: str, message: str) -> None:
    [(where, msg)] = errors(rank_uid_range=given)
    assert where == "rank_uid_range" and msg.startswith(message), msg


def test_rank_user_and_rank_uid_range_are_alternatives() -> None:
    assert errors(rank_user="root", rank_uid_range="61000-61999") == [
        ("rank_uid_range", "rank_user and rank_uid_range are alternatives: set one of them")
    ]


def test_the_rank_uid_range_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DET_AGENT_RANK_UID_RANGE", " 61000-61999 ")
    assert AgentSettings(join_token="t").rank_uid_range == "61000-61999"
    assert rank_user.parse_uid_range("1000-1000") == (1000, 1000)
    assert rank_user.parse_uid_range("61000-2147483647") == (61000, 2**31 - 1)


RANGE_FLAG = ("--rank-uid-range", "61000-61999")


def test_det_agent_refuses_both_rank_settings_with_exit_2(tmp_path: Path) -> None:
    result = subprocess.run(
        [str(DET_AGENT), "--join-token", "t", "--rank-user", "root", *RANGE_FLAG],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if not k.startswith("DET_")},
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert (
        "det-agent: setting rank_uid_range: rank_user and rank_uid_range are alternatives"
    ) in result.stderr


def test_det_agent_not_root_refuses_a_rank_uid_range(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    for name in [k for k in os.environ if k.startswith("DET_")]:
        monkeypatch.delenv(name)
    result = CliRunner().invoke(app, ["--rank-uid-range", "61000-61999", "--join-token", "t"])
    assert result.exit_code == 2, result.output
    assert (
        "det-agent: setting rank_uid_range: the agent runs as uid 1000, not root, and only "
        "root can start ranks as the uids of rank_uid_range 61000-61999"
    ) in result.output
    with pytest.raises(ValueError, match="setpriv is not installed"):
        rank_user.for_range(rank_user.UidPool(61000, 61999), euid=0, setpriv=None)


def test_each_run_takes_the_lowest_free_uid_until_none_is_left() -> None:
    pool = rank_user.UidPool(61000, 61002)
    assert [pool.take(a).uid for a in ("1.1", "2.1", "3.1")] == [61000, 61001, 61002]
    assert pool.take("2.1") == rank_user.RankUser("rank-61001", 61001, 61001, init_groups=False)
    with pytest.raises(RuntimeError) as caught:
        pool.take("4.1")
    assert str(caught.value) == "no free uid in rank_uid_range 61000-61002 (3 runs)"
    pool.release("2.1")
    pool.release("2.1")  # twice is harmless
    assert pool.take("4.1").uid == 61001  # the lowest free, not the next one up
    pool.release("1.1")
    assert pool.take("5.1").uid == 61000


def test_a_run_takes_its_owner_s_group_when_the_master_names_the_owner() -> None:
    pool = rank_user.UidPool(61000, 61001)
    gid = rank_user.owner_group(7)
    assert gid == rank_user.OWNER_GID_BASE + 7
    assert pool.take("1.1", gid) == rank_user.RankUser("rank-61000", 61000, gid, init_groups=False)
    assert rank_user.owner_group(0) is None  # an older master's start names no owner
    assert pool.take("2.1", None).gid == 61001


def test_the_default_range_is_clear_of_login_dynamic_and_container_users() -> None:
    first, last = rank_user.parse_uid_range(rank_user.DEFAULT_UID_SPACE)
    assert 1879048192 <= first <= last < 2**31  # systemd's unused range (UIDS-GIDS.md)
    assert last < rank_user.OWNER_GID_BASE  # owner groups never meet a rank's own gid
    # Each agent takes a block of it by its id: the same every start, others elsewhere.
    blocks = {rank_user.default_uid_range(f"node-{n}") for n in range(50)}
    assert rank_user.default_uid_range("node-0") in blocks and len(blocks) == 50
    for low, high in blocks:
        assert first <= low and high <= last and high - low + 1 == rank_user.DEFAULT_BLOCK
        assert (low - first) % rank_user.DEFAULT_BLOCK == 0


def test_a_shared_fs_store_is_opened_to_the_ranks_uids(tmp_path: Path) -> None:
    created = tmp_path / "new" / "checkpoints"
    assert rank_user.open_checkpoint_dir(created) is None
    assert stat.S_IMODE(created.stat().st_mode) & 0o1007 == 0o1003
    existing = tmp_path / "existing"
    existing.mkdir(mode=0o755)
    existing.chmod(0o755)
    assert rank_user.open_checkpoint_dir(existing) is None
    assert stat.S_IMODE(existing.stat().st_mode) == 0o1753
    assert rank_user.open_checkpoint_dir(existing) is None  # twice changes nothing


def test_where_a_trial_s_shared_fs_checkpoints_go() -> None:
    def where(storage: dict[str, object]) -> Path | None:
        config = json.dumps({"checkpoint_storage": storage})
        return runner_module.shared_fs_directory({storage_secrets.CONFIG_VARIABLE: config})

    assert where({"type": "shared_fs", "host_path": "/ckpt"}) == Path("/ckpt")
    assert where({"type": "shared_fs", "host_path": "/ckpt", "storage_path": "a/b"}) == Path(
        "/ckpt/a/b"
    )
    assert where({"type": "shared_fs", "host_path": "/ckpt", "storage_path": "/ckpt/c"}) == (
        Path("/ckpt/c")
    )
    assert where({"type": "s3", "bucket": "b"}) is None
    assert runner_module.shared_fs_directory({}) is None


def test_a_run_s_checkpoints_become_root_s_when_it_ends(passable: Path) -> None:
    require_root()
    store = passable / "checkpoints"
    store.mkdir()
    gid = rank_user.OWNER_GID_BASE + 3
    for name, uid in (("mine", 61005), ("another-run-s", 61006)):
        (store / name / "sub").mkdir(parents=True)
        (store / name / "sub" / "weights.bin").write_bytes(b"x")
        (store / name / "sub" / "weights.bin").chmod(0o660)  # as RANK_UMASK leaves it
        rank_user.chown_tree(store / name, rank_user.range_user(uid, gid))
    assert rank_user.seal_checkpoints(store, 61005) == 1
    for path in (store / "mine", store / "mine" / "sub", store / "mine" / "sub" / "weights.bin"):
        assert (path.stat().st_uid, path.stat().st_gid) == (0, gid), path
    # Its group reads it still, changes it no more.
    assert stat.S_IMODE((store / "mine" / "sub" / "weights.bin").stat().st_mode) == 0o640
    assert (store / "another-run-s").stat().st_uid == 61006  # still running: left alone
    # The store's owner, when an admin gave it to a user (the master's, say), gets them.
    assert rank_user.seal_checkpoints(store, 61006, to=4242) == 1
    assert (store / "another-run-s" / "sub" / "weights.bin").stat().st_uid == 4242
    assert rank_user.seal_checkpoints(passable / "absent", 61005) == 0


def test_a_range_uid_switches_without_a_passwd_entry_and_with_no_groups() -> None:
    require_root()
    uid = 61999
    try:
        pwd.getpwuid(uid)
        require(False, f"uid {uid} has a passwd entry here")
    except KeyError:
        pass
    user = rank_user.range_user(uid)
    assert rank_user.switch_options(user) == [
        f"--reuid={uid}",
        f"--regid={uid}",
        "--clear-groups",
        "--no-new-privs",
    ]
    argv = rank_user.command(
        [sys.executable, "-c", "import os; print(os.getuid(), os.getgid(), os.getgroups())"],
        setpriv=rank_user.SETPRIV,
        rank=user,
    )
    out = subprocess.run(argv, capture_output=True, text=True, cwd="/", check=False)
    if out.returncode != 0:  # the agent's interpreter may be under root's 0700 home
        argv[-3:] = ["sh", "-c", "id -u; id -g; id -G"]
        out = subprocess.run(argv, capture_output=True, text=True, cwd="/", check=True)
        assert out.stdout.split() == [str(uid), str(uid), str(uid)]
    else:
        assert out.stdout.split() == [str(uid), str(uid), "[]"]


def test_each_allocation_runs_as_its_own_uid_and_gives_it_back(passable: Path) -> None:
    require_root()
    messages: list[pb.AgentMessage] = []
    runner = Runner("a1", passable, [], messages.append, lambda _e: None)
    runner.rank_uids = rank_user.UidPool(61000, 61000)

    def start(allocation_id: str) -> pb.StartAllocation:
        return pb.StartAllocation(
            allocation_id=allocation_id,
            argv=["sleep", "30"],
            ranks=[pb.RankSpec(rank=0)],
            stop_grace_s=1.0,
        )

    async def scenario() -> None:
        await runner.start(start("1.1"))
        run = runner.runs["1.1"]
        pid = run.processes[0].pid
        await asyncio.to_thread(_wait_for_exec, pid, "sleep")  # past setpriv's switch
        owner = os.stat(f"/proc/{pid}")  # a process's /proc entry is its euid's and egid's
        assert (owner.st_uid, owner.st_gid) == (61000, 61000)
        assert run.work_dir.stat().st_uid == 61000
        env = runner._rank_env(start("1.1"), pb.RankSpec(rank=0), run)
        assert (env["USER"], env["LOGNAME"], env["HOME"]) == (
            "rank-61000",
            "rank-61000",
            str(run.work_dir),
        )
        # The only uid is taken: the next allocation fails to start, saying why.
        await runner.start(start("2.1"))
        exited = [m.exited for m in messages if m.HasField("exited")]
        assert [(e.allocation_id, e.message) for e in exited] == [
            ("2.1", "could not start: no free uid in rank_uid_range 61000-61000 (1 runs)")
        ]
        await runner.stop("1.1", "test over", 1.0)
        await asyncio.gather(*run.tasks, return_exceptions=True)
        assert "1.1" not in runner.runs
        # Released with the run: the next allocation gets it.
        assert runner.rank_uids is not None and runner.rank_uids.take("3.1").uid == 61000

    asyncio.run(scenario())


def _wait_for_exec(pid: int, name: str) -> None:
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}/comm").read_text().strip() != name:
        assert time.monotonic() < deadline, f"process {pid} never became {name}"
        time.sleep(0.02)


@pytest.mark.parametrize(
    ("masters", "loopback"),
    [
        ("127.0.0.1:8090", True),
        ("localhost:8090,[::1]:8090", True),
        ("127.0.0.1:8090,198.18.0.1:8090", False),
        ("master.example.com:8090", False),
    ],
)
def test_a_plaintext_link_off_this_machine_is_warned_about(masters: str, loopback: bool) -> None:
    from agent.main import _all_loopback

    assert _all_loopback(masters) is loopback
