"""`det user`: accounts, logins kept in the token store, and passwords.

Passwords go to the master as Determined's client sends them (`isHashed: true` with the
salted SHA-512 of master.core.credentials), never in plain text. Prompts read the terminal
with getpass; when stdin is not a terminal they read one line from stdin each, so scripts
can pipe them (`printf 'pw\\n' | det user login alice`).
"""

from __future__ import annotations

import contextlib
import getpass
import re
import sys
from typing import Any
from urllib.parse import quote

import typer

from cli.client import MasterClient
from cli.errors import CliError
from cli.output import (
    CsvOpt,
    JsonOpt,
    cli_errors,
    one_format,
    print_json,
    print_table,
    stdout,
    warn,
)
from cli.state import client
from master.core.credentials import client_side_hash

user_app = typer.Typer(help="Manage users: create, activate, log in and out, change passwords.")

USER_HEADERS = ["User ID", "Username", "Display Name", "Admin", "Active"]
# Who a client acts as when nobody is named or logged in, as in Determined.
DEFAULT_USER = "determined"


def read_secret(prompt: str) -> str:
    """A password from the terminal without echo, else one line of stdin."""
    if sys.stdin.isatty():
        return getpass.getpass(prompt)
    line = sys.stdin.readline()
    if not line:
        raise CliError(f"{prompt.strip().rstrip(':')}: stdin ended before a line was read")
    return line.rstrip("\r\n")


def weakness(password: str) -> str | None:
    """What Determined's client asks of a password (at least 8 characters, upper and lower
    case, a digit), as one phrase naming what is missing; None if nothing is."""
    if not password:
        return "it must not be empty"
    missing = []
    if len(password) < 8:
        missing.append("at least 8 characters")
    if not re.search(r"[A-Z]", password):
        missing.append("an uppercase letter")
    if not re.search(r"[a-z]", password):
        missing.append("a lowercase letter")
    if not re.search(r"\d", password):
        missing.append("a digit")
    if not missing:
        return None
    listed = missing[0] if len(missing) == 1 else ", ".join(missing[:-1]) + " and " + missing[-1]
    return f"it needs {listed}"


def new_password(username: str, given: str | None) -> str:
    """`given`, or asked twice; refused unless it meets the complexity rule."""
    if given is None:
        given = read_secret(f"New password for user '{username}': ")
        if read_secret("Confirm password: ") != given:
            raise CliError("passwords do not match")
    problem = weakness(given)
    if problem:
        raise CliError(f"password for user {username} is too weak: {problem}")
    return given


def user_by_name(api: MasterClient, username: str) -> dict[str, Any]:
    user: dict[str, Any] = api.get(f"/api/v1/users/{quote(username, safe='')}/by-username")["user"]
    return user


def log_in(api: MasterClient, username: str, password: str) -> str:
    reply = api.post(
        "/api/v1/auth/login",
        json={"username": username, "password": client_side_hash(password), "isHashed": True},
        auth=False,
    )
    token: str = reply["token"]
    return token


@user_app.command("list")
def list_users(
    ctx: typer.Context,
    show_all: bool = typer.Option(False, "--all", "-a", help="Deactivated users too."),
    as_json: bool = JsonOpt,
    as_csv: bool = CsvOpt,
) -> None:
    """List active users (with --all, deactivated ones too)."""
    with cli_errors():
        one_format(as_json, as_csv)
        users = client(ctx).get_all("/api/v1/users", "users")
        if not show_all:
            users = [u for u in users if u["active"]]
        if as_json:
            print_json(users)
            return
        print_table(
            USER_HEADERS,
            [[u["id"], u["username"], u["displayName"], u["admin"], u["active"]] for u in users],
            as_csv=as_csv,
        )


user_app.command("ls", hidden=True)(list_users)


@user_app.command("create")
def create_user(
    ctx: typer.Context,
    username: str = typer.Argument(..., help="Name of the new user."),
    admin: bool = typer.Option(False, "--admin", help="Make the user an admin."),
    password: str | None = typer.Option(
        None, "--password", help="The password (else asked twice)."
    ),
) -> None:
    """Create a user (admins only)."""
    with cli_errors():
        secret = new_password(username, password)
        body = {
            "user": {"username": username, "admin": admin, "active": True},
            "password": client_side_hash(secret),
            "isHashed": True,
        }
        client(ctx).post("/api/v1/users", json=body)
        stdout.print(f"Created user {username}{' (admin)' if admin else ''}", markup=False)


def _set_active(ctx: typer.Context, username: str, active: bool) -> None:
    with cli_errors():
        api = client(ctx)
        user = user_by_name(api, username)
        api.request("PATCH", f"/api/v1/users/{user['id']}", json={"active": active})
        stdout.print(f"{'Activated' if active else 'Deactivated'} user {username}", markup=False)


@user_app.command("activate")
def activate_user(
    ctx: typer.Context, username: str = typer.Argument(..., help="User to activate.")
) -> None:
    """Let a deactivated user log in again (admins only)."""
    _set_active(ctx, username, True)


@user_app.command("deactivate")
def deactivate_user(
    ctx: typer.Context, username: str = typer.Argument(..., help="User to deactivate.")
) -> None:
    """Refuse a user's logins and end the ones they have (admins only)."""
    _set_active(ctx, username, False)


@user_app.command("change-password")
def change_password(
    ctx: typer.Context,
    target_user: str | None = typer.Argument(
        None, help="Whose password (else your own; another user's: admins only)."
    ),
) -> None:
    """Set a new password, asked twice. It ends that user's logins; your own stored login
    is renewed with the new password."""
    with cli_errors():
        api = client(ctx)
        me: dict[str, Any] = api.get("/api/v1/me")["user"]
        own = target_user in (None, me["username"])
        user = me if own else user_by_name(api, target_user or "")
        secret = new_password(user["username"], None)
        # Determined's SetUserPassword: the body is the bare client-hashed password.
        api.post(f"/api/v1/users/{user['id']}/password", json=client_side_hash(secret))
        stdout.print(f"Changed the password of user {user['username']}", markup=False)
        store = api.token_store()
        if own and store.token(me["username"]):
            store.set_token(me["username"], log_in(api, me["username"], secret), activate=False)


@user_app.command("whoami")
def whoami(ctx: typer.Context) -> None:
    """Print the user this client acts as."""
    with cli_errors():
        user = client(ctx).get("/api/v1/me")["user"]
        stdout.print(f"You are logged in as user '{user['username']}'", markup=False)


@user_app.command("login")
def login(
    ctx: typer.Context,
    username: str | None = typer.Argument(None, help="User to log in as (else asked)."),
) -> None:
    """Log in and keep the token, so later commands act as this user (the active user).
    The password is asked on the terminal, or read as one line of stdin (an empty line: an
    empty password); from a pipe without a name, the user is the active one, else determined."""
    with cli_errors():
        api = client(ctx)
        name = username or api.requested_user
        if not name and sys.stdin.isatty():
            name = input("Username: ")
        elif not name:
            # Piped, stdin holds the password alone (`echo "" | det user login`).
            name = api.token_store().active_user() or DEFAULT_USER
        if not name.strip():
            raise CliError("username: must not be empty")
        password = read_secret(f"Password for user '{name}': ")
        token = log_in(api, name, password)
        api.token_store().set_token(name, token)
        stdout.print(f"Logged in as user '{name}'", markup=False)
        _print_cluster_message(api, token)
        problem = weakness(password)
        if problem:
            warn(
                f"the password of user {name} is weak ({problem}); "
                "change it with `det user change-password`"
            )


def _print_cluster_message(api: MasterClient, token: str) -> None:
    """The admins' banner, if one is showing: a login is when people read it."""
    try:
        reply = api.get("/api/v1/master", auth=False, headers={"Authorization": f"Bearer {token}"})
    except CliError:
        return  # the login worked; a banner that cannot be read is not worth failing it
    message = reply.get("clusterMessage")
    if message:
        stdout.print(f"Cluster message: {message['message']}", markup=False)


def print_auth_token(ctx: typer.Context) -> None:
    """Print the session token of the user this client acts as, for other HTTP clients:
    curl -H "Authorization: Bearer $(det user auth-token)" $DET_MASTER/api/v1/me"""
    with cli_errors():
        api = client(ctx)
        api.get("/api/v1/me")  # an ended stored login fails here, with what to do about it
        sys.stdout.write(api.session_token() + "\n")


user_app.command("auth-token")(print_auth_token)
# Determined's own spelling: `det dev auth-token` (its `dev` is hidden too).
dev_app = typer.Typer(help="Developer tools.", no_args_is_help=True)
dev_app.command("auth-token")(print_auth_token)


@user_app.command("logout")
def logout(
    ctx: typer.Context,
    all_users: bool = typer.Option(
        False, "--all", "-a", help="Every user logged in on this master."
    ),
) -> None:
    """End the login of the active user (or -u USER), and forget its token."""
    with cli_errors():
        api = client(ctx)
        store = api.token_store()
        if all_users:
            names = store.users()
        else:
            name = api.requested_user or store.active_user()
            names = [name] if name else []
        if not names:
            stdout.print(f"No stored login on {api.base_url}", markup=False)
            return
        for name in names:
            token = store.token(name)
            if not token:
                store.drop(name)  # still the active user, with its login ended
                stdout.print(f"No stored login for user {name} on {api.base_url}", markup=False)
                continue
            # One already expired or revoked: forgetting it is all that is left to do.
            with contextlib.suppress(CliError):
                api.post(
                    "/api/v1/auth/logout", auth=False, headers={"Authorization": f"Bearer {token}"}
                )
            store.drop(name)
            stdout.print(f"Logged out user {name}", markup=False)


@user_app.callback(invoke_without_command=True)
def _default(ctx: typer.Context) -> None:
    # Like Determined's, `det user` alone lists.
    if ctx.invoked_subcommand is None:
        list_users(ctx, show_all=False, as_json=False, as_csv=False)
