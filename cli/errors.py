"""The one error every `det` command turns into a line on stderr and exit status 1. Kept
apart from cli.client so that modules the client itself uses (the token store) can raise it."""


class CliError(Exception):
    """One line for stderr; the command exits 1."""


class NameNotFound(CliError):
    """No workspace, group, user or role has the name given; a command may say which of its
    arguments gave it."""
