"""`det user-group`: named sets of users. Groups and users are named as Determined's client
names them (a group by its name, users by their names, several joined by commas); admins
change groups, everyone may list and describe them."""

from __future__ import annotations

from typing import Any

import typer

from cli.client import MasterClient
from cli.errors import CliError, NameNotFound
from cli.output import CsvOpt, JsonOpt, cli_errors, one_format, print_json, print_table, stdout
from cli.state import client
from cli.users import user_by_name

group_app = typer.Typer(help="Manage user groups.", no_args_is_help=True)

GROUP_HEADERS = ["ID", "Name", "# Members"]
MEMBER_HEADERS = ["ID", "Username", "Display Name", "Admin", "Active"]


def group_by_name(api: MasterClient, name: str) -> dict[str, Any]:
    """The group's id and name."""
    found = api.post("/api/v1/groups/search", json={"name": name, "limit": 1})["groups"]
    if not found:
        raise NameNotFound(f"user group '{name}' not found")
    group: dict[str, Any] = found[0]["group"]
    return group


def user_ids(api: MasterClient, usernames: list[str]) -> list[int]:
    """Ids of the named users; an unknown name is refused by the master, naming it."""
    return [int(user_by_name(api, name)["id"]) for name in usernames]


def split_usernames(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",")]
    if not all(names):
        raise CliError(f"usernames: {text!r} holds an empty name; give USER[,USER...]")
    return names


def _show_group(group: dict[str, Any], as_json: bool, said: str) -> None:
    """A group as the master describes it: JSON, or a line and its members' table."""
    if as_json:
        print_json(group)
        return
    heading = f"{said} user group" if said else "User group"
    stdout.print(f"{heading} {group['name']} (ID {group['groupId']})", markup=False)
    rows = [
        [u["id"], u["username"], u["displayName"], u["admin"], u["active"]] for u in group["users"]
    ]
    print_table(MEMBER_HEADERS, rows)


def _update(
    ctx: typer.Context, group_name: str, change: dict[str, Any], as_json: bool, said: str
) -> None:
    """One PUT of the group: `change` holds a new name, or usernames under addUsers or
    removeUsers (sent as their ids)."""
    with cli_errors():
        api = client(ctx)
        group = group_by_name(api, group_name)
        body: dict[str, Any] = {"groupId": group["groupId"]}
        for key, value in change.items():
            body[key] = value if key == "name" else user_ids(api, value)
        reply = api.request("PUT", f"/api/v1/groups/{group['groupId']}", json=body)
        _show_group(reply["group"], as_json, said)


@group_app.command("create")
def create_group(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="A name no other user group has."),
    add_user: list[str] = typer.Option(
        [], "--add-user", help="A user to add (repeat the option for more)."
    ),
    as_json: bool = JsonOpt,
) -> None:
    """Create a user group, with members if given (admins only)."""
    with cli_errors():
        api = client(ctx)
        body = {"name": name, "addUsers": user_ids(api, add_user)}
        _show_group(api.post("/api/v1/groups", json=body)["group"], as_json, "Created")


@group_app.command("list")
def list_groups(
    ctx: typer.Context,
    member: str | None = typer.Option(
        None, "--groups-user-belongs-to", help="Only the groups this user is in."
    ),
    limit: int = typer.Option(0, "--limit", min=0, help="At most this many (0: all)."),
    offset: int = typer.Option(0, "--offset", min=0, help="Skip this many first."),
    as_json: bool = JsonOpt,
    as_csv: bool = CsvOpt,
) -> None:
    """List user groups with their numbers of members."""
    with cli_errors():
        one_format(as_json, as_csv)
        api = client(ctx)
        body: dict[str, Any] = {"limit": limit, "offset": offset}
        if member is not None:
            body["userId"] = user_ids(api, [member])[0]
        found = api.post("/api/v1/groups/search", json=body)["groups"]
        groups = [{**g["group"], "numMembers": g["numMembers"]} for g in found]
        if as_json:
            print_json(groups)
            return
        rows = [[g["groupId"], g["name"], g["numMembers"]] for g in groups]
        print_table(GROUP_HEADERS, rows, as_csv=as_csv)


group_app.command("ls", hidden=True)(list_groups)


@group_app.command("describe")
def describe_group(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="User group name."),
    as_json: bool = JsonOpt,
) -> None:
    """Show a user group and its members."""
    with cli_errors():
        api = client(ctx)
        group = group_by_name(api, name)
        _show_group(api.get(f"/api/v1/groups/{group['groupId']}")["group"], as_json, "")


@group_app.command("add-user")
def add_users(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="User group name."),
    usernames: str = typer.Argument(..., help="USER[,USER...] to add."),
    as_json: bool = JsonOpt,
) -> None:
    """Add users to a user group (admins only)."""
    _update(ctx, name, {"addUsers": split_usernames(usernames)}, as_json, "Added to")


@group_app.command("remove-user")
def remove_users(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="User group name."),
    usernames: str = typer.Argument(..., help="USER[,USER...] to remove."),
    as_json: bool = JsonOpt,
) -> None:
    """Remove users from a user group (admins only)."""
    _update(ctx, name, {"removeUsers": split_usernames(usernames)}, as_json, "Removed from")


@group_app.command("change-name")
def change_name(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="Its name now."),
    new_name: str = typer.Argument(..., help="Its new name."),
    as_json: bool = JsonOpt,
) -> None:
    """Rename a user group (admins only)."""
    _update(ctx, name, {"name": new_name}, as_json, "Renamed")


@group_app.command("delete")
def delete_group(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="User group name."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
    as_json: bool = JsonOpt,
) -> None:
    """Delete a user group and its memberships; its users stay (admins only)."""
    with cli_errors():
        api = client(ctx)
        group = group_by_name(api, name)
        if not yes and not typer.confirm(f"Delete user group {name} and its memberships?"):
            raise typer.Exit(1)
        api.request("DELETE", f"/api/v1/groups/{group['groupId']}")
        if as_json:
            print_json({**group, "deleted": True})
        else:
            stdout.print(f"Deleted user group {name} (ID {group['groupId']})", markup=False)
