"""The ports an agent hands to a trial's chief (the rendezvous, Determined's broadcast
sockets), picked from the agent's `port_range` and outside the kernel's ephemeral range.

Why not the kernel's choice (bind to port 0): that port comes from the ephemeral range, and
the trial binds it seconds later. Meanwhile any outgoing connection in the same network
namespace (the ranks' own requests to the master, the agent's) may be given the same port
as its local end, and the trial's bind then fails with "Address already in use". A port
outside the ephemeral range is never handed to an outgoing connection. Slurm does the same
with MpiParams=ports.
"""

from __future__ import annotations

import errno
import random
import socket
from collections.abc import Callable, Collection
from pathlib import Path

DEFAULT_PORT_RANGE = "20000-32767"
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def parse_port_range(text: str) -> tuple[int, int]:
    """`START-END` as two ints; ValueError says what is wrong with it."""
    start, sep, end = text.strip().partition("-")
    if not sep or not start.strip().isdigit() or not end.strip().isdigit():
        raise ValueError(f"{text!r} is not START-END (e.g. {DEFAULT_PORT_RANGE})")
    first, last = int(start), int(end)
    if not 1024 <= first <= last <= 65535:
        raise ValueError(f"{text!r}: ports must satisfy 1024 <= START <= END <= 65535")
    if last - first + 1 < 16:
        raise ValueError(f"{text!r}: at least 16 ports, for trials that start together")
    return first, last


def ephemeral_range(path: Path = EPHEMERAL_RANGE_FILE) -> tuple[int, int] | None:
    """The kernel's ephemeral range (net.ipv4.ip_local_port_range), None if unreadable."""
    try:
        low, high = path.read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return None


def candidates(port_range: tuple[int, int], ephemeral: tuple[int, int] | None) -> list[int]:
    """The ports of the range outside the ephemeral range; the whole range if that leaves
    none (the agent warns about it at start)."""
    first, last = port_range
    ports = list(range(first, last + 1))
    if ephemeral is None:
        return ports
    outside = [p for p in ports if not ephemeral[0] <= p <= ephemeral[1]]
    return outside or ports


def overlap_warning(port_range: tuple[int, int], ephemeral: tuple[int, int] | None) -> str | None:
    """What to log once at start when the whole range lies inside the ephemeral range."""
    first, last = port_range
    if ephemeral is None or not (ephemeral[0] <= first and last <= ephemeral[1]):
        return None
    return (
        f"port_range {first}-{last} lies inside the kernel's ephemeral range "
        f"{ephemeral[0]}-{ephemeral[1]} (net.ipv4.ip_local_port_range): an outgoing "
        "connection may take a trial's port before the trial binds it; choose a range "
        "outside it"
    )


def bindable(port: int) -> bool:
    """Whether nothing holds `port` now (listening, connected or lingering)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("", port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


def pick_ports(
    count: int,
    pool: list[int],
    taken: Collection[int],
    is_free: Callable[[int], bool] = bindable,
    rng: random.Random | None = None,
) -> list[int]:
    """`count` distinct free ports of `pool`, none of `taken` (those handed to this agent's
    other live allocations, which may not have bound them yet). Starts at a random place so
    that agents sharing a host rarely try the same port at once. OSError when too few."""
    if not pool:
        raise OSError(errno.EADDRNOTAVAIL, "the port range is empty")
    start = (rng or random).randrange(len(pool))
    picked: list[int] = []
    for i in range(len(pool)):
        port = pool[(start + i) % len(pool)]
        if port in taken or not is_free(port):
            continue
        picked.append(port)
        if len(picked) == count:
            return picked
    raise OSError(
        errno.EADDRINUSE,
        f"only {len(picked)} of the {count} ports needed are free in port_range "
        f"{pool[0]}-{pool[-1]}",
    )
