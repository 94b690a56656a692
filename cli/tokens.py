"""`det token`: access tokens (long-lived, for scripts and CI), as Determined 0.38's."""

from __future__ import annotations

from typing import Any

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
    short_time,
    stdout,
)
from cli.state import client
from cli.users import read_secret, user_by_name

token_app = typer.Typer(
    help="Create, list, describe and revoke access tokens; log in with one.", no_args_is_help=True
)

TOKEN_HEADERS = [
    "ID",
    "User ID",
    "Username",
    "Description",
    "Created At",
    "Expires At",
    "Revoked",
    "Token Type",
]
# The master's longest lifespan (auth.MAX_ACCESS_TOKEN_LIFESPAN); -1 asks for it.
MAX_DAYS = 3650


def _render(tokens: list[dict[str, Any]], as_json: bool, as_csv: bool = False) -> None:
    if as_json:
        print_json(tokens)
        return
    print_table(
        TOKEN_HEADERS,
        [
            [
                t["id"],
                t["userId"],
                t["username"],
                t["description"],
                short_time(t["createdAt"]),
                short_time(t["expiry"]),
                t["revoked"],
                str(t["tokenType"]).removeprefix("TOKEN_TYPE_"),
            ]
            for t in tokens
        ],
        as_csv=as_csv,
    )


def _lifespan(days: int | None) -> str | None:
    """Determined's CLI sends days as a Go duration in hours, and -1 for the longest."""
    if days is None:
        return None
    if days == -1:
        return "-1"
    if not 1 <= days <= MAX_DAYS:
        raise CliError(
            f"--expiration-days: {days} is not between 1 and {MAX_DAYS} "
            "(or -1 for the longest allowed)"
        )
    return f"{24 * days}h"


@token_app.command("create")
def create_token(
    ctx: typer.Context,
    username: str | None = typer.Argument(
        None, help="Whose token (else yours; another user's: admins only)."
    ),
    expiration_days: int | None = typer.Option(
        None, "--expiration-days", "-e", help="Days it lives (default 30; -1: the longest)."
    ),
    description: str | None = typer.Option(None, "--description", "-d", help="What it is for."),
    as_json: bool = JsonOpt,
) -> None:
    """Create an access token. It is shown once: keep it (use it as DET_USER_TOKEN or with
    `det token login`)."""
    with cli_errors():
        lifespan = _lifespan(expiration_days)
        api = client(ctx)
        user = user_by_name(api, username) if username else api.get("/api/v1/me")["user"]
        body = {"userId": user["id"], "lifespan": lifespan, "description": description}
        reply = api.post("/api/v1/tokens", json=body)
        if as_json:
            print_json(reply)
            return
        stdout.print(f"TokenID: {reply['tokenId']}\nAccess-Token: {reply['token']}", markup=False)


def _tokens(api: MasterClient, params: dict[str, Any]) -> list[dict[str, Any]]:
    return api.get_all("/api/v1/tokens", "tokenInfo", params)


@token_app.command("list")
def list_tokens(
    ctx: typer.Context,
    username: str | None = typer.Argument(None, help="Only this user's tokens."),
    username_option: str | None = typer.Option(
        None, "--username", help="Only this user's tokens (the same as the argument)."
    ),
    show_inactive: bool = typer.Option(
        False, "--show-inactive", help="Revoked and expired tokens too."
    ),
    as_json: bool = JsonOpt,
    as_csv: bool = CsvOpt,
) -> None:
    """List access tokens: your own, or everyone's for an admin."""
    with cli_errors():
        if username and username_option and username != username_option:
            raise CliError(f"two users given: {username} and --username {username_option}")
        params: dict[str, Any] = {"showInactive": show_inactive}
        if username or username_option:
            params["username"] = username or username_option
        one_format(as_json, as_csv)
        _render(_tokens(client(ctx), params), as_json, as_csv)


token_app.command("ls", hidden=True)(list_tokens)


@token_app.command("describe")
def describe_tokens(
    ctx: typer.Context,
    token_ids: list[int] = typer.Argument(..., help="Token IDs."),
    as_json: bool = JsonOpt,
    as_csv: bool = CsvOpt,
) -> None:
    """Show access tokens by ID, revoked and expired ones included."""
    with cli_errors():
        one_format(as_json, as_csv)
        found = _tokens(client(ctx), {"tokenIds": token_ids, "showInactive": True})
        missing = sorted(set(token_ids) - {t["id"] for t in found})
        if missing:
            listed = ", ".join(str(i) for i in missing)
            raise CliError(
                f"access token{'s' if len(missing) > 1 else ''} {listed} not found "
                "(only admins see other users' tokens)"
            )
        _render(found, as_json, as_csv)


@token_app.command("revoke")
def revoke_token(ctx: typer.Context, token_id: int = typer.Argument(..., help="Token ID.")) -> None:
    """Revoke an access token: it is refused from now on, for good."""
    with cli_errors():
        body = {"tokenId": token_id, "setRevoked": True}
        client(ctx).request("PATCH", f"/api/v1/tokens/{token_id}", json=body)
        stdout.print(f"Revoked token {token_id}", markup=False)


@token_app.command("login")
def login_with_token(
    ctx: typer.Context,
    token: str | None = typer.Argument(
        None, help="The access token (else asked, or read from stdin: keeps it out of history)."
    ),
) -> None:
    """Act as the token's user from now on: it is kept as that user's login."""
    with cli_errors():
        secret = token or read_secret("Access token: ")
        if not secret.strip():
            raise CliError("no token given")
        api = client(ctx)
        headers = {"Authorization": f"Bearer {secret.strip()}"}
        user = api.get("/api/v1/me", auth=False, headers=headers)["user"]
        api.token_store().set_token(user["username"], secret.strip())
        stdout.print(f"Authenticated as {user['username']}.", markup=False)
