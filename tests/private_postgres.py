"""A PostgreSQL server of a test's own, to stop and start in outage tests.

The machine's own server (127.0.0.1:5432) is never touched: this one is a fresh cluster
(initdb, trust authentication, fsync off) in a directory of its own on a free port,
run as the `postgres` user, since PostgreSQL refuses to run as root.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.conftest import require


def _bin(name: str) -> str | None:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return found[-1] if found else shutil.which(name)


def available() -> tuple[bool, str]:
    if _bin("initdb") is None or _bin("pg_ctl") is None:
        return False, "initdb/pg_ctl not installed (apt-get install postgresql)"
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        return False, "no postgres user to run a private server as"
    if os.geteuid() != 0:
        return False, "starting a server as the postgres user needs root"
    return True, ""


class PrivatePostgres:
    """`netns`: run the server inside that network namespace, listening on `address`."""

    def __init__(self, port: int, *, netns: str | None = None, address: str = "127.0.0.1") -> None:
        usable, reason = available()
        require(usable, reason)
        self.port = port
        self.netns = netns
        self.address = address
        # Not under pytest's tmp dirs: those are private to root, and postgres must read it.
        self.root = Path(tempfile.mkdtemp(prefix="resolute-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        user = pwd.getpwnam("postgres")
        os.chown(self.root, user.pw_uid, user.pw_gid)
        self._as_postgres(
            _bin("initdb"), "-D", str(self.data), "--auth=trust", "-U", "postgres", "-E", "UTF8"
        )
        # Clients in the test networks (the master in the root namespace, 198.18.0.0/15).
        with (self.data / "pg_hba.conf").open("a", encoding="utf-8") as hba:
            hba.write("host all all 198.18.0.0/15 trust\n")

    @property
    def url(self) -> str:
        return f"postgresql://postgres@{self.address}:{self.port}/postgres"

    def start(self) -> None:
        options = (
            f"-p {self.port} -k {self.root} -c listen_addresses={self.address} -c fsync=off "
            "-c max_connections=50"
        )
        self._as_postgres(
            _bin("pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "start"
        )

    def stop(self, mode: str = "fast") -> None:
        """`fast` disconnects clients and shuts down cleanly; `immediate` is a crash."""
        self._as_postgres(_bin("pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop")

    def destroy(self) -> None:
        if (self.data / "postmaster.pid").exists():
            subprocess.run(
                [
                    "runuser",
                    "-u",
                    "postgres",
                    "--",
                    _bin("pg_ctl") or "pg_ctl",
                    "-D",
                    str(self.data),
                    "-m",
                    "immediate",
                    "-w",
                    "stop",
                ],
                check=False,
                capture_output=True,
            )
        shutil.rmtree(self.root, ignore_errors=True)

    def _as_postgres(self, *argv: str | None) -> None:
        command = ["runuser", "-u", "postgres", "--", *(a for a in argv if a is not None)]
        if self.netns is not None:
            command = ["ip", "netns", "exec", self.netns, *command]
        done = subprocess.run(command, capture_output=True, text=True, check=False, cwd=self.root)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed:\n{done.stdout}\n{done.stderr}")
