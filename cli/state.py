"""What the root command's global options leave for the sub-commands."""

from __future__ import annotations

from dataclasses import dataclass

import typer

from cli.client import MasterClient


@dataclass
class Globals:
    master: str | None = None
    user: str | None = None


def client(ctx: typer.Context) -> MasterClient:
    root = ctx.find_root()
    globals_: Globals = root.obj if isinstance(root.obj, Globals) else Globals()
    return MasterClient(globals_.master, globals_.user)
