"""A throw-away two-host network for the multi-agent e2e tests, built from Linux namespaces.

    root namespace                    namespace A ("host a")         namespace B ("host b")
    bridge 198.18.N.1/24 ── veth ──── MGMT_A 198.18.N.2/24
           (the master)   └─ veth ─────────────────────────────────── MGMT_B 198.18.N.3/24
                                      FAST_A 198.19.N.2/24 ── veth ── FAST_B 198.19.N.3/24

N is the pytest-xdist worker's number (0 without xdist), so parallel workers never share
addresses.

Each namespace also has `lo` up. The interface names inside the namespaces are parameters,
so a test can choose names that the master's automatic rule (`master.core.interfaces`) would
or would not pick. Names in the root namespace (the bridge, the host ends of the management
veths, and the fast pair before it moves) are short (IFNAMSIZ is 16 with the NUL) and carry
a tag derived from the test, so tests never share them; whatever an earlier, crashed run left
under the same names is deleted before building. `destroy()` never raises and can be called
any number of times; `topology()` calls it even when the build or the test fails.

Everything here needs root and the `ip` tool (iproute2).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

from tests.conftest import require

IP = "ip"
NETNS_PREFIX = "resolute-e2e-"
# Root-namespace names: "rs" + kind letter + 6-hex tag + side letter <= 10 characters.
ROOT_PREFIX = "rs"


CAP_NET_ADMIN = 12
CAP_SYS_ADMIN = 21  # `ip netns add` bind-mounts the namespace


def available() -> tuple[bool, str]:
    """Whether this machine can build a topology; if not, why (for `require`)."""
    if os.geteuid() != 0:
        return False, "network namespaces need root"
    if shutil.which(IP) is None:
        return False, "the `ip` tool (iproute2) is not installed"
    try:
        text = Path("/proc/self/status").read_text(encoding="utf-8")
        status = dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)
        effective = int(status["CapEff"].strip(), 16)
    except (OSError, KeyError, ValueError):
        effective = -1  # cannot tell: let the probe below decide
    for cap, label in ((CAP_NET_ADMIN, "CAP_NET_ADMIN"), (CAP_SYS_ADMIN, "CAP_SYS_ADMIN")):
        if effective >= 0 and not effective >> cap & 1:
            return False, f"network namespaces need {label}, which this process lacks"
    probe = f"{NETNS_PREFIX}probe-{os.getpid()}"
    made = ip("netns", "add", probe, check=False)
    ip("netns", "del", probe, check=False)
    if made.returncode != 0:
        return False, f"cannot create a network namespace: {made.stderr.strip()}"
    return True, ""


def tag_for(text: str) -> str:
    """A short, stable tag for `text` (a test's node id): the same test reuses its names,
    so its own leftovers are found and removed; different tests never share them."""
    return hashlib.sha1(text.encode()).hexdigest()[:6]


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([IP, *args], capture_output=True, text=True, timeout=30, check=False)
    if check and result.returncode != 0:
        raise RuntimeError(
            f"$ ip {' '.join(args)}\nexit {result.returncode}: {result.stderr.strip()}"
        )
    return result


def link_exists(name: str, netns: str | None = None) -> bool:
    args = ("-n", netns) if netns else ()
    return ip(*args, "link", "show", "dev", name, check=False).returncode == 0


def netns_exists(name: str) -> bool:
    listing = ip("-j", "netns", "list", check=False).stdout.strip()
    try:
        entries = json.loads(listing) if listing else []
    except json.JSONDecodeError:
        return False
    return any(entry.get("name") == name for entry in entries)


def counters(netns: str, interface: str) -> dict[str, int]:
    """`rx_bytes`, `tx_bytes`, `rx_packets`, `tx_packets` of `interface` inside `netns`."""
    reply = json.loads(ip("-n", netns, "-s", "-j", "link", "show", "dev", interface).stdout)
    stats = reply[0]["stats64"]
    return {
        "rx_bytes": int(stats["rx"]["bytes"]),
        "tx_bytes": int(stats["tx"]["bytes"]),
        "rx_packets": int(stats["rx"]["packets"]),
        "tx_packets": int(stats["tx"]["packets"]),
    }


def difference(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {key: after[key] - before[key] for key in after}


@dataclass(frozen=True)
class Host:
    """One namespace: its name and the names and addresses of its two links."""

    netns: str
    mgmt: str
    mgmt_address: str
    fast: str
    fast_address: str


def worker_subnet() -> int:
    """The third octet of this test process's networks: the suite runs in parallel
    (pytest-xdist workers gw0, gw1, ...), and two topologies on the same addresses would
    route each other's traffic astray in the root namespace."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    return int(worker) % 256 if worker.isdigit() else 0


def _addresses(network: str, *hosts: int) -> tuple[str, ...]:
    return tuple(f"{network}.{worker_subnet()}.{host}" for host in hosts)


@dataclass
class Topology:
    """Bridge + two namespaces; `build()` creates it, `destroy()` removes it."""

    tag: str
    mgmt_names: tuple[str, str] = ("mgmt0", "mgmt0")
    fast_names: tuple[str, str] = ("fast0", "fast0")
    bridge_address: str = field(default_factory=lambda: _addresses("198.18", 1)[0])
    mgmt_addresses: tuple[str, ...] = field(default_factory=lambda: _addresses("198.18", 2, 3))
    fast_addresses: tuple[str, ...] = field(default_factory=lambda: _addresses("198.19", 2, 3))
    prefix_len: int = 24
    hosts: tuple[Host, Host] = field(init=False)
    built: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        if not (self.tag.isalnum() and len(self.tag) <= 6):
            raise ValueError(f"tag must be at most 6 letters or digits, not {self.tag!r}")
        for name in (*self.mgmt_names, *self.fast_names):
            if not 0 < len(name) <= 15 or "/" in name or name.isspace():
                raise ValueError(f"bad interface name {name!r}")
        self.hosts = tuple(  # type: ignore[assignment]
            Host(
                netns=f"{NETNS_PREFIX}{self.tag}-{side}",
                mgmt=self.mgmt_names[i],
                mgmt_address=self.mgmt_addresses[i],
                fast=self.fast_names[i],
                fast_address=self.fast_addresses[i],
            )
            for i, side in enumerate("ab")
        )

    # -- names in the root namespace ---------------------------------------------------------

    @property
    def bridge(self) -> str:
        return f"{ROOT_PREFIX}b{self.tag}"

    def mgmt_peer(self, index: int) -> str:
        """The root-namespace end of host `index`'s management veth (enslaved to the bridge)."""
        return f"{ROOT_PREFIX}m{self.tag}{'ab'[index]}"

    def fast_temp(self, index: int) -> str:
        """The name of host `index`'s fast end while it is still in the root namespace."""
        return f"{ROOT_PREFIX}f{self.tag}{'ab'[index]}"

    def root_links(self) -> list[str]:
        return [self.bridge, *(self.mgmt_peer(i) for i in range(2))] + [
            self.fast_temp(i) for i in range(2)
        ]

    # -- lifecycle ---------------------------------------------------------------------------

    def build(self) -> Topology:
        self.destroy()  # an earlier run that crashed may have left the same names behind
        self._remove_stray_bridges()
        self.built = True
        cidr = f"/{self.prefix_len}"
        ip("link", "add", self.bridge, "type", "bridge")
        ip("addr", "add", self.bridge_address + cidr, "dev", self.bridge)
        ip("link", "set", self.bridge, "up")
        for i, host in enumerate(self.hosts):
            ip("netns", "add", host.netns)
            ip("-n", host.netns, "link", "set", "lo", "up")
            # Management: a veth whose root end is a bridge port.
            temp = f"{ROOT_PREFIX}t{self.tag}{'ab'[i]}"
            ip("link", "add", self.mgmt_peer(i), "type", "veth", "peer", "name", temp)
            ip("link", "set", self.mgmt_peer(i), "master", self.bridge)
            ip("link", "set", self.mgmt_peer(i), "up")
            self._move(temp, host.netns, host.mgmt, host.mgmt_address + cidr)
        # Fast: a veth straight from one namespace to the other.
        ip("link", "add", self.fast_temp(0), "type", "veth", "peer", "name", self.fast_temp(1))
        for i, host in enumerate(self.hosts):
            self._move(self.fast_temp(i), host.netns, host.fast, host.fast_address + cidr)
        return self

    def _move(self, name: str, netns: str, new_name: str, cidr: str) -> None:
        ip("link", "set", "dev", name, "netns", netns)
        ip("-n", netns, "link", "set", "dev", name, "name", new_name)
        ip("-n", netns, "addr", "add", cidr, "dev", new_name)
        ip("-n", netns, "link", "set", "dev", new_name, "up")

    def _remove_stray_bridges(self) -> None:
        """Bridges of ours (by prefix) from crashed runs of other tests that hold our bridge
        address: two of them in the root namespace would route the master's replies astray."""
        listing = ip("-j", "-4", "addr", "show", check=False).stdout.strip()
        for entry in json.loads(listing) if listing else []:
            name = entry.get("ifname", "")
            addresses = {a.get("local") for a in entry.get("addr_info", [])}
            if name.startswith(f"{ROOT_PREFIX}b") and self.bridge_address in addresses:
                ip("link", "del", "dev", name, check=False)

    def destroy(self) -> list[str]:
        """Remove everything this topology's names refer to; returns what could not be
        removed (empty when all went). Never raises."""
        problems: list[str] = []
        for host in self.hosts:
            if not netns_exists(host.netns):
                continue
            if self.built:
                # Processes still inside (ours: this run built the namespace) would keep it
                # and its links alive, unnamed. Those of an earlier run are left alone.
                pids = ip("netns", "pids", host.netns, check=False).stdout.split()
                for pid in pids:
                    with suppress(ProcessLookupError, ValueError):
                        os.kill(int(pid), signal.SIGKILL)
            result = ip("netns", "del", host.netns, check=False)
            if result.returncode != 0:
                problems.append(f"netns {host.netns}: {result.stderr.strip()}")
        for name in self.root_links():
            # A veth's root end usually went with its peer's namespace; the bridge did not.
            if link_exists(name):
                result = ip("link", "del", "dev", name, check=False)
                if result.returncode != 0 and link_exists(name):
                    problems.append(f"link {name}: {result.stderr.strip()}")
        for i in range(2):
            temp = f"{ROOT_PREFIX}t{self.tag}{'ab'[i]}"
            if link_exists(temp):
                ip("link", "del", "dev", temp, check=False)
        return problems

    def leftovers(self) -> list[str]:
        """What of this topology still exists (for a test's final check)."""
        found = [h.netns for h in self.hosts if netns_exists(h.netns)]
        names = [*self.root_links(), *(f"{ROOT_PREFIX}t{self.tag}{s}" for s in "ab")]
        return found + [name for name in names if link_exists(name)]

    def counters(self, index: int, interface: str) -> dict[str, int]:
        return counters(self.hosts[index].netns, interface)


@contextmanager
def topology(tag: str, **kwargs: object) -> Iterator[Topology]:
    """Build a `Topology` and always remove it afterwards, whatever happened."""
    net = Topology(tag, **kwargs)  # type: ignore[arg-type]
    try:
        yield net.build()
    except BaseException:
        net.destroy()  # the failure in flight says more than any trouble removing
        raise
    problems = net.destroy()
    if problems:
        raise RuntimeError("could not remove the test network: " + "; ".join(problems))


def require_netns() -> None:
    """Skip (fail under CI) with the reason when this machine cannot build a topology."""
    usable, reason = available()
    require(usable, reason)


def require_netns_and_torch() -> None:
    """The multi-host tests need namespaces and torch.distributed; skip (fail under CI)
    with the reason otherwise."""
    usable, reason = available()
    require(usable, reason)
    require(
        importlib.util.find_spec("torch") is not None,
        "torch is not importable by the agents' interpreter (pip install torch)",
    )
