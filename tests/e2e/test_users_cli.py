"""`det user`, `det token` and `det agent revoke` against real masters and agents.

Each person here is a `det` with a config directory of its own (XDG_CONFIG_HOME), as on
their own machine: `det user login` keeps its token there, and later commands act as that
user. Passwords are piped on stdin, which the CLI reads when stdin is not a terminal.

The module runs masters of its own rather than the shared `master` fixture: the login rate
limit counts failures per client address, and every client here is 127.0.0.1, so the
failures these tests cause on purpose must not reach other modules' logins.
"""

from __future__ import annotations

import asyncio
import json
import re
import stat
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from sqlalchemy import update

from harness.cluster import AgentProcess
from master.db.models import UserSessionModel
from master.db.session import create_engine, create_session_factory, session_scope
from master.settings import async_database_url
from tests.conftest import require
from tests.e2e.concurrently import concurrently
from tests.e2e.conftest import (
    BACKENDS,
    COMMAND_TIMEOUT_S,
    OUR_DET,
    MasterProcess,
    client_env,
    describe_run,
    lines,
    official_client_path,
    ok,
    running_master,
    unique,
)
from tests.factories import EXPERIMENT_YAML

pytestmark = pytest.mark.e2e

PASSWORD = "Correct-Horse-9"
AGENT_REFUSED = 3  # det-agent's exit status when the master refuses it


class Person:
    """Our `det` as one person runs it: their own token store, and only the environment
    given here (no DET_USER or DET_PASS unless named)."""

    def __init__(self, master: MasterProcess, home: Path, **env: str) -> None:
        self.master = master
        self.home = home
        self.env = env
        home.mkdir(parents=True, exist_ok=True)

    @property
    def store(self) -> Path:
        return self.home / "resolute" / "auth.json"

    def det(
        self, *args: str, input: str | None = None, **env: str
    ) -> subprocess.CompletedProcess[str]:
        return self._run([str(OUR_DET), *args], input, env)

    def official(
        self, *args: str, input: str | None = None, **env: str
    ) -> subprocess.CompletedProcess[str]:
        path = official_client_path()
        require(path is not None, "official det client not installed: run `make official-client`")
        return self._run([str(path), *args], input, env)

    def _run(
        self, command: list[str], input: str | None, env: dict[str, str]
    ) -> subprocess.CompletedProcess[str]:
        full = client_env(self.master.url, XDG_CONFIG_HOME=str(self.home), **{**self.env, **env})
        full.pop("DET_DEBUG_CONFIG_PATH", None)
        return subprocess.run(
            command,
            # Never the terminal: a prompt must read stdin, not wait for a person.
            input=input if input is not None else "",
            capture_output=True,
            text=True,
            env=full,
            cwd=self.home,
            timeout=COMMAND_TIMEOUT_S,
            check=False,
        )


def refused(result: subprocess.CompletedProcess[str]) -> str:
    """The one line a refused command prints (on stderr, exit 1, nothing on stdout)."""
    assert result.returncode == 1, describe_run(result)
    assert result.stdout == "" and len(lines(result.stderr)) == 1, describe_run(result)
    assert "Traceback" not in result.stderr
    return lines(result.stderr)[0]


def said(result: subprocess.CompletedProcess[str]) -> list[str]:
    return lines(ok(result).stdout)


@pytest.fixture(scope="module", params=BACKENDS)
def users_master(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[MasterProcess]:
    with running_master(request, tmp_path_factory, "users") as proc:
        yield proc


@pytest.fixture(scope="module")
def admin(users_master: MasterProcess, tmp_path_factory: pytest.TempPathFactory) -> Person:
    """The default admin, logged in with its (empty, default) password: once for the
    module's tests, which never change the admin's password nor log it out."""
    person = Person(users_master, tmp_path_factory.mktemp("admin") / "admin-home")
    logged = ok(person.det("user", "login", "admin", input="\n"))
    assert lines(logged.stdout) == ["Logged in as user 'admin'"], describe_run(logged)
    assert "weak" in logged.stderr and "must not be empty" in logged.stderr
    return person


def new_user(admin: Person, tmp_path: Path, prefix: str) -> tuple[str, Person]:
    """A user the admin creates, logged in on a machine of their own."""
    name = unique(prefix)
    assert said(admin.det("user", "create", name, "--password", PASSWORD)) == [
        f"Created user {name}"
    ]
    person = Person(admin.master, tmp_path / f"{name}-home")
    assert said(person.det("user", "login", name, input=PASSWORD + "\n")) == [
        f"Logged in as user '{name}'"
    ]
    return name, person


def whoami(person: Person, **env: str) -> str:
    (line,) = said(person.det("user", "whoami", **env))
    match = re.fullmatch(r"You are logged in as user '(.+)'", line)
    assert match, line
    return match.group(1)


def create_experiment(person: Person) -> int:
    config = person.home / f"{unique('exp')}.yaml"
    config.write_text(EXPERIMENT_YAML, encoding="utf-8")
    return int(said(person.det("experiment", "create", str(config)))[-1].split()[-1])


def expire_token(master: MasterProcess, token_id: int) -> None:
    """Move a token's expiry into the past in the master's database (nobody waits a day)."""

    async def run() -> None:
        engine = create_engine(async_database_url(master.db_url, master.data_dir))
        try:
            async with session_scope(create_session_factory(engine)) as session:
                await session.execute(
                    update(UserSessionModel)
                    .where(UserSessionModel.id == token_id)
                    .values(expires_at=datetime.now(UTC) - timedelta(minutes=1))
                )
        finally:
            await engine.dispose()

    asyncio.run(run())


def created_token(result: subprocess.CompletedProcess[str]) -> tuple[int, str]:
    """`det token create`'s two lines, as Determined prints them."""
    first, second = said(result)
    assert first.startswith("TokenID: ") and second.startswith("Access-Token: "), describe_run(
        result
    )
    return int(first.removeprefix("TokenID: ")), second.removeprefix("Access-Token: ")


# -- users -----------------------------------------------------------------------------------


def test_a_new_user_logs_in_and_may_change_only_their_own_work(
    admin: Person, users_master: MasterProcess, tmp_path: Path
) -> None:
    master = users_master
    name = unique("alice")

    # The complexity rule and the twice-asked password are checked before anything is sent.
    # (Calls that need not wait for one another run side by side: reads, refusals, and
    # changes to what the others do not look at.)
    weak_run, mismatch_run = concurrently(
        lambda: admin.det("user", "create", name, "--password", "short1"),
        lambda: admin.det("user", "create", name, input=f"{PASSWORD}\nOther-Pass-1\n"),
    )
    weak = refused(weak_run)
    assert weak == (
        f"Error: password for user {name} is too weak: it needs at least 8 characters "
        "and an uppercase letter"
    )
    mismatch = refused(mismatch_run)
    assert mismatch == "Error: passwords do not match"
    assert master.http("GET", f"/api/v1/users/{name}/by-username").status_code == 404
    assert said(admin.det("user", "create", name, input=f"{PASSWORD}\n{PASSWORD}\n")) == [
        f"Created user {name}"
    ]
    alice = Person(master, tmp_path / "alice-home")
    listed_run, table_run, before_login, theirs = concurrently(
        lambda: admin.det("user", "list", "--json"),
        lambda: admin.det("user", "list"),
        lambda: whoami(alice),
        # Someone else's experiment, for below.
        lambda: create_experiment(Person(master, tmp_path / "determined-home")),
    )
    listed = {u["username"]: u for u in json.loads(ok(listed_run).stdout)}
    assert (listed[name]["admin"], listed[name]["active"]) == (False, True)
    assert listed["admin"]["admin"] is True
    table = ok(table_run).stdout
    assert re.search(rf"^\s*\d+\s+{re.escape(name)}\s+False\s+True\s*$", table, re.M), table

    # Logging in keeps a token (never the password) in an owner-only file.
    assert before_login == "determined"  # nobody logged in: the default user
    assert said(alice.det("user", "login", name, input=PASSWORD + "\n")) == [
        f"Logged in as user '{name}'"
    ]
    assert stat.S_IMODE(alice.store.stat().st_mode) == 0o600
    kept = json.loads(alice.store.read_text())["masters"][master.url]
    assert kept["active"] == name and set(kept["tokens"]) == {name}
    assert PASSWORD not in alice.store.read_text()
    logged_in_as, kill_theirs, disable, create_user, mine = concurrently(
        lambda: whoami(alice),
        lambda: alice.det("experiment", "kill", str(theirs)),
        lambda: alice.det("agent", "disable", "any-agent"),
        lambda: alice.det("user", "create", unique("bob"), "--password", PASSWORD),
        lambda: create_experiment(alice),
    )
    assert logged_in_as == name

    # Someone else's experiment, and the cluster, are refused with whom to ask.
    assert refused(kill_theirs) == (
        f"Error: experiment {theirs} belongs to determined; only its owner or an admin may kill "
        "it, or whoever holds PERMISSION_TYPE_UPDATE_EXPERIMENT in its workspace (WorkspaceAdmin, "
        "Editor, EditorRestricted, EditorProjectRestricted)"
    )
    assert refused(disable) == (f"Error: disabling an agent is for admins; user {name} is not one")
    assert refused(create_user) == (f"Error: creating users is for admins; user {name} is not one")
    experiment = master.api("GET", f"/api/v1/experiments/{theirs}")["experiment"]
    assert experiment["state"] == "STATE_ACTIVE", experiment

    # Their own experiment is theirs to kill.
    assert master.api("GET", f"/api/v1/experiments/{mine}")["experiment"]["username"] == name
    assert said(alice.det("experiment", "kill", str(mine))) == [f"Killed experiment {mine}"]

    # Logging out ends the token on the master and forgets it here.
    token = kept["tokens"][name]
    assert said(alice.det("user", "logout")) == [f"Logged out user {name}"]
    assert json.loads(alice.store.read_text())["masters"] == {}
    after_logout, ended = concurrently(
        lambda: whoami(alice),
        lambda: alice.det("user", "whoami", DET_USER_TOKEN=token),
    )
    assert after_logout == "determined"
    assert refused(ended).startswith("Error: invalid or expired token")
    assert said(alice.det("user", "logout")) == [f"No stored login on {master.url}"]


def test_a_piped_login_needs_no_name_and_auth_token_serves_curl(
    admin: Person, users_master: MasterProcess, tmp_path: Path
) -> None:
    master = users_master
    # `echo "" | det user login`: the default user, with the empty password the pipe holds.
    person = Person(master, tmp_path / "piped")
    logged = ok(person.det("user", "login", input="\n"))
    assert lines(logged.stdout) == ["Logged in as user 'determined'"], describe_run(logged)
    assert json.loads(person.store.read_text())["masters"][master.url]["active"] == "determined"
    # An empty pipe has no password line: refused, nothing kept.
    nobody = Person(master, tmp_path / "empty-pipe")
    assert refused(nobody.det("user", "login", input="")) == (
        "Error: Password for user 'determined': stdin ended before a line was read"
    )
    assert not nobody.store.exists()

    # Once logged in, the pipe logs in as the active user again.
    name, alice = new_user(admin, tmp_path, "alice")
    assert said(alice.det("user", "login", input=PASSWORD + "\n")) == [
        f"Logged in as user '{name}'"
    ]
    kept = alice.store.read_text()
    assert refused(alice.det("user", "login", input="Wrong-Guess-1\n")) == (
        "Error: invalid credentials"
    )
    assert alice.store.read_text() == kept

    # The token for curl: -H "Authorization: Bearer $(det user auth-token)".
    printed = ok(alice.det("user", "auth-token")).stdout
    token = printed.removesuffix("\n")
    assert printed == token + "\n" and token.strip() == token and token, printed
    reply = httpx.get(
        f"{master.url}/api/v1/me", headers={"Authorization": f"Bearer {token}"}, timeout=30
    )
    assert reply.status_code == 200 and reply.json()["user"]["username"] == name, reply.text
    assert ok(alice.det("dev", "auth-token")).stdout == printed  # Determined's spelling
    # Without a login: the default user's (a password login, as every command does).
    (theirs,) = said(Person(master, tmp_path / "no-login").det("user", "auth-token"))
    reply = httpx.get(
        f"{master.url}/api/v1/me", headers={"Authorization": f"Bearer {theirs}"}, timeout=30
    )
    assert reply.json()["user"]["username"] == "determined", reply.text
    # A login that has ended prints no token, but what to do.
    ok(admin.det("user", "deactivate", name))
    ended = refused(alice.det("user", "auth-token"))
    assert ended.endswith(f"run `det user login {name}` to log in again"), ended


def test_deactivation_and_a_new_password_end_logins(admin: Person, tmp_path: Path) -> None:
    name, carol = new_user(admin, tmp_path, "carol")
    elsewhere = Person(admin.master, tmp_path / "carol-laptop")

    assert said(admin.det("user", "deactivate", name)) == [f"Deactivated user {name}"]
    ended = refused(carol.det("user", "whoami"))
    assert ended.startswith("Error: invalid or expired token"), ended
    assert ended.endswith(f"run `det user login {name}` to log in again"), ended
    # The token is dropped, the user stays active here: no silent switch to `determined`.
    assert refused(carol.det("user", "whoami")) == (
        f"Error: the login of user {name} on {admin.master.url} has ended; run "
        f"`det user login {name}` (or `det user logout` to act as determined)"
    )
    assert refused(carol.det("user", "login", name, input=PASSWORD + "\n")) == (
        "Error: invalid credentials"
    )
    listed = json.loads(ok(admin.det("user", "list", "--json")).stdout)
    assert name not in {u["username"] for u in listed}
    listed = json.loads(ok(admin.det("user", "list", "--all", "--json")).stdout)
    assert {u["username"]: u["active"] for u in listed}[name] is False

    assert said(admin.det("user", "activate", name)) == [f"Activated user {name}"]
    ok(carol.det("user", "login", name, input=PASSWORD + "\n"))
    ok(elsewhere.det("user", "login", name, input=PASSWORD + "\n"))

    # A new password (asked twice) ends every login, but renews the one it was changed from.
    new = "Battery-Staple-7"
    assert refused(carol.det("user", "change-password", input=f"{new}\n{new}x\n")) == (
        "Error: passwords do not match"
    )
    assert said(carol.det("user", "change-password", input=f"{new}\n{new}\n")) == [
        f"Changed the password of user {name}"
    ]
    assert whoami(carol) == name
    assert refused(elsewhere.det("user", "whoami")).startswith("Error: invalid or expired token")
    assert refused(elsewhere.det("user", "login", name, input=PASSWORD + "\n")) == (
        "Error: invalid credentials"
    )
    ok(elsewhere.det("user", "login", name, input=new + "\n"))

    # Another user's password is an admin's to change.
    assert refused(carol.det("user", "change-password", "admin", input=f"{new}\n{new}\n")) == (
        "Error: only an admin may change the account of another user"
    )
    assert said(admin.det("user", "change-password", name, input=f"{PASSWORD}\n{PASSWORD}\n")) == [
        f"Changed the password of user {name}"
    ]
    assert whoami(admin) == "admin"  # changing someone else's leaves the admin's login alone
    ok(elsewhere.det("user", "login", name, input=PASSWORD + "\n"))


# -- access tokens ---------------------------------------------------------------------------


def test_access_tokens_are_created_listed_revoked_and_expire(
    admin: Person, users_master: MasterProcess, tmp_path: Path
) -> None:
    master = users_master
    name, bob = new_user(admin, tmp_path, "bob")
    script = Person(master, tmp_path / "ci-runner")  # no login of its own: the token alone

    token_id, token = created_token(bob.det("token", "create", "-e", "2", "-d", "ci"))
    # (Calls that need not wait for one another run side by side: reads and refusals.)
    as_script, listed, described, (other_id, _) = concurrently(
        lambda: whoami(script, DET_USER_TOKEN=token),
        lambda: bob.det("token", "list", "--json"),
        lambda: bob.det("token", "describe", str(token_id)),
        lambda: created_token(admin.det("token", "create", "determined")),
    )
    assert as_script == name
    (info,) = json.loads(ok(listed).stdout)
    assert (info["id"], info["username"], info["description"]) == (token_id, name, "ci")
    expiry = datetime.fromisoformat(info["expiry"])
    assert abs(expiry - datetime.now(UTC) - timedelta(days=2)) < timedelta(minutes=5), info
    table = ok(described).stdout
    assert re.search(rf"^\s*{token_id}\s+\d+\s+{re.escape(name)}\s+ci\s", table, re.M), table
    assert "ACCESS_TOKEN" in table

    # Another user's tokens are neither listed nor changeable; an admin's view has both.
    hidden, kept, everyone_run, only_bob_run, too_short = concurrently(
        lambda: bob.det("token", "describe", str(other_id)),
        lambda: bob.det("token", "revoke", str(other_id)),
        lambda: admin.det("token", "list", "--json"),
        lambda: admin.det("token", "list", "--username", name, "--json"),
        lambda: bob.det("token", "create", "-e", "0"),
    )
    assert refused(hidden) == (
        f"Error: access token {other_id} not found (only admins see other users' tokens)"
    )
    assert refused(kept) == ("Error: only an admin may change the access tokens of another user")
    everyone = json.loads(ok(everyone_run).stdout)
    assert {token_id, other_id} <= {t["id"] for t in everyone}
    only_bob = json.loads(ok(only_bob_run).stdout)
    assert [t["id"] for t in only_bob] == [token_id]
    assert refused(too_short) == (
        "Error: --expiration-days: 0 is not between 1 and 3650 (or -1 for the longest allowed)"
    )

    # A revoked token is refused from then on and listed only with --show-inactive.
    assert said(bob.det("token", "revoke", str(token_id))) == [f"Revoked token {token_id}"]
    revoked, active, inactive = concurrently(
        lambda: script.det("user", "whoami", DET_USER_TOKEN=token),
        lambda: bob.det("token", "list", "--json"),
        lambda: bob.det("token", "list", "--show-inactive", "--json"),
    )
    assert refused(revoked) == ("Error: this token has been revoked; log in again")
    assert json.loads(ok(active).stdout) == []
    (info,) = json.loads(ok(inactive).stdout)
    assert (info["id"], info["revoked"]) == (token_id, True)

    # `det token login` keeps a token as its user's login; once it expires it is dropped.
    short_id, short = created_token(bob.det("token", "create", "--expiration-days", "1"))
    assert said(script.det("token", "login", input=short + "\n")) == [f"Authenticated as {name}."]
    assert whoami(script) == name
    expire_token(master, short_id)
    assert refused(script.det("user", "whoami")) == (
        f"Error: invalid or expired token: run `det user login {name}` to log in again"
    )
    assert json.loads(script.store.read_text())["masters"][master.url]["tokens"] == {}
    assert refused(script.det("token", "login", short)) == (
        "Error: invalid or expired token; log in again"
    )


# -- the login rate limit --------------------------------------------------------------------


def test_failed_logins_are_rate_limited(tmp_path: Path) -> None:
    """Its own master: ten failures from 127.0.0.1 lock every login from there for 60 s."""
    master = MasterProcess(tmp_path / "data", label="rate-limit")
    master.start()
    try:
        admin = Person(master, tmp_path / "admin", DET_USER="admin", DET_PASS="")
        name = unique("dave")
        ok(admin.det("user", "create", name, "--password", PASSWORD))
        dave = Person(master, tmp_path / "dave")
        # Side by side: each is checked against the failures before it (at most nine).
        for result in concurrently(
            *[lambda: dave.det("user", "login", name, input="Wrong-Guess-1\n")] * 10
        ):
            assert refused(result) == "Error: invalid credentials"
        pattern = (
            rf"Error: too many failed logins for user '{re.escape(name)}'; try again in (\d+)s"
        )
        attempts = ("Wrong-Guess-1", PASSWORD)  # the right password waits too
        for result in concurrently(
            *((lambda a=a: dave.det("user", "login", name, input=a + "\n")) for a in attempts)
        ):
            line = refused(result)
            match = re.fullmatch(pattern, line)
            assert match and 1 <= int(match.group(1)) <= 60, line
        assert not dave.store.exists()
    finally:
        master.stop()


# -- agent identity --------------------------------------------------------------------------


def test_a_revoked_agent_exits_and_stays_out(tmp_path: Path) -> None:
    master = MasterProcess(tmp_path / "data", label="revoke")
    master.start()
    agents: list[AgentProcess] = []

    def start(agent_id: str, work_dir: Path) -> AgentProcess:
        agent = AgentProcess(master, agent_id, work_dir, slots=1)
        agents.append(agent.start())
        return agent

    def exits_refused(agent: AgentProcess, why: str, since: int) -> None:
        assert agent.proc is not None
        assert agent.proc.wait(timeout=60) == AGENT_REFUSED, agent.output()
        assert why in agent.log.read_text(encoding="utf-8")[since:], agent.output()

    try:
        admin = Person(master, tmp_path / "admin", DET_USER="admin", DET_PASS="")
        agent_id = unique("node")
        home = tmp_path / "node-work"
        first = start(agent_id, home)
        first.wait_connected()
        # Its first heartbeat after the Welcome confirms it holds its secret.
        master.wait_for(
            "the agent's enrollment",
            lambda: master.api("GET", f"/api/v1/agents/{agent_id}")["agent"]["enrolled"],
        )
        credential = home / "agent-credential"
        assert stat.S_IMODE(credential.stat().st_mode) == 0o600

        # The id is enrolled: the join token alone (another work dir) no longer admits it.
        first.stop()
        impostor = start(agent_id, tmp_path / "impostor-work")
        exits_refused(impostor, "credential does not match", 0)
        second = start(agent_id, home)
        second.wait_connected()

        # Only an admin revokes; a "no" at the prompt changes nothing.
        determined = Person(master, tmp_path / "determined")
        assert refused(determined.det("agent", "revoke", agent_id, "--yes")) == (
            "Error: revoking an agent is for admins; user determined is not one"
        )
        kept = ok(admin.det("agent", "revoke", agent_id, input="n\n"))
        # The prompt is on stdout too; a terminal would have echoed the answer's newline.
        assert kept.stdout.endswith(f"[y/N]: Agent {agent_id} was not revoked.\n"), describe_run(
            kept
        )
        assert master.api("GET", f"/api/v1/agents/{agent_id}")["agent"]["connected"] is True

        since = len(second.log.read_text(encoding="utf-8"))
        assert said(admin.det("agent", "revoke", agent_id, "--yes")) == [
            f"Revoked agent {agent_id}: it is disconnected and refused from now on. To bring "
            "the node back, start det-agent there under a new --id."
        ]
        exits_refused(second, "was revoked", since)
        agent = master.api("GET", f"/api/v1/agents/{agent_id}")["agent"]
        assert (agent["connected"], agent["enabled"]) == (False, False), agent

        # Its own credential file does not bring it back either.
        since = len(second.log.read_text(encoding="utf-8"))
        exits_refused(start(agent_id, home), "was revoked", since)
        assert refused(admin.det("agent", "revoke", "no-such-agent", "--yes")) == (
            "Error: agent no-such-agent not found"
        )
    finally:
        for agent in agents:
            agent.stop()
        master.stop()


# -- Determined's official client ------------------------------------------------------------


@pytest.mark.official_client
def test_official_client_manages_users_and_tokens(
    users_master: MasterProcess, tmp_path: Path
) -> None:
    admin = Person(users_master, tmp_path / "official-admin", DET_USER="admin", DET_PASS="")

    def run(person: Person, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        result = ok(person.official(*args, **env))
        assert "Traceback" not in result.stderr + result.stdout, describe_run(result)
        return result

    name = unique("erin")
    run(admin, "user", "create", name, "--password", PASSWORD)
    erin = Person(users_master, tmp_path / "official-erin", DET_USER=name, DET_PASS=PASSWORD)
    # (Calls that need not wait for one another run side by side.)
    listed, erin_whoami, created = concurrently(
        lambda: run(admin, "user", "list"),
        lambda: run(erin, "user", "whoami"),
        lambda: run(admin, "token", "create", name, "-e", "3", "-d", "official"),
    )
    rows = [[c.strip() for c in line.split("|")] for line in lines(listed.stdout) if "|" in line]
    header = rows[0]
    assert header[:2] == ["User Id", "Username"], describe_run(listed)
    by_name = {row[1]: dict(zip(header, row, strict=True)) for row in rows[1:]}
    assert {"admin", "determined", name} <= set(by_name), describe_run(listed)
    assert (by_name[name]["Admin"], by_name[name]["Active"]) == ("False", "True")

    assert lines(erin_whoami.stdout) == [f"You are logged in as user '{name}'"]
    token_id, token = created_token(created)
    ours = Person(users_master, tmp_path / "ours")
    kiosk = Person(users_master, tmp_path / "official-kiosk")

    def kiosk_login() -> tuple[subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]]:
        return run(kiosk, "token", "login", token), run(kiosk, "user", "whoami")

    listed, as_json_run, described_run, ours_whoami, (kiosk_login_run, kiosk_whoami) = concurrently(
        lambda: run(erin, "token", "list"),
        lambda: run(admin, "token", "list", name, "--json"),
        lambda: run(erin, "token", "describe", str(token_id), "--json"),
        # The token works in our client too, and as a login of Determined's.
        lambda: whoami(ours, DET_USER_TOKEN=token),
        kiosk_login,
    )
    assert re.search(rf"^\s*{token_id}\s*\|.*\|\s*official\s*\|", listed.stdout, re.M), (
        describe_run(listed)
    )
    as_json = json.loads(as_json_run.stdout)
    assert [(t["id"], t["description"]) for t in as_json] == [(token_id, "official")]
    described = json.loads(described_run.stdout)
    assert [(t["id"], t["revoked"]) for t in described] == [(token_id, False)]
    assert ours_whoami == name
    assert lines(kiosk_login_run.stdout) == [f"Authenticated as {name}."]
    assert lines(kiosk_whoami.stdout) == [f"You are logged in as user '{name}'"]

    revoked = run(erin, "token", "revoke", str(token_id))
    assert lines(revoked.stdout)[-1] == f"Successfully revoked token {token_id}.", describe_run(
        revoked
    )
    assert refused(ours.det("user", "whoami", DET_USER_TOKEN=token)) == (
        "Error: this token has been revoked; log in again"
    )
