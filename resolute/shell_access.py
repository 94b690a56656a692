"""How a shell task is reached through the master's proxy, shared by the master and the
task's shell server (resolute.shell_server). No I/O.

- `/proxy/<id>/terminal`: our `det shell start`'s terminal, for the owner's login only.
- any other path: Determined's `det shell start`, an SSH connection tunnelled over the
  WebSocket without a login (determined.cli.tunnel sends none, as Determined's proxy asks
  none of shells); the SSH key is the credential.

The key pair: both ends derive it from the task's secret, so nothing new is stored or sent.
The master hands the private key to the shell's owner (v1Shell.privateKey), and the shell
server, which already holds the secret, accepts only the matching public key. Whoever holds
the secret can already open that server's terminal, so the key grants nothing more.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

# Domain separation: the key is not the secret, nor any other value derived from it.
_CONTEXT = b"resolute shell ssh key v1\x00"


TERMINAL = "terminal"


def is_terminal_path(path: str) -> bool:
    """Whether a WebSocket's path (with or without the /proxy/<id>/ prefix) is the terminal's."""
    return path.split("?")[0].rstrip("/").rsplit("/", 1)[-1] == TERMINAL


@dataclass(frozen=True)
class ShellKeys:
    private_openssh: str  # "-----BEGIN OPENSSH PRIVATE KEY-----...", what ssh -i reads
    public_openssh: str  # "ssh-ed25519 AAAA... resolute-shell", an authorized_keys line


def shell_keys(secret: str) -> ShellKeys:
    # Imported here: `det` reads TERMINAL from this module and must start fast.
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import (
        Encoding,
        NoEncryption,
        PrivateFormat,
        PublicFormat,
    )

    if not secret:
        raise ValueError("a shell's key needs its task secret, which is empty")
    seed = hashlib.sha256(_CONTEXT + secret.encode()).digest()
    key = Ed25519PrivateKey.from_private_bytes(seed)
    private = key.private_bytes(Encoding.PEM, PrivateFormat.OpenSSH, NoEncryption()).decode()
    public = key.public_key().public_bytes(Encoding.OpenSSH, PublicFormat.OpenSSH).decode()
    return ShellKeys(private_openssh=private, public_openssh=f"{public} resolute-shell")
