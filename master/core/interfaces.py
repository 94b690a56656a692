"""Which network interface the ranks of a distributed (dtrain) allocation talk over.

Pure: it takes the interfaces each agent of the gang reported and returns a choice, or a
reason there is none that can be shown as the trial's pending reason. The rule:

1. If `dtrain_network_interface` is set, it is used, provided every agent of the gang has an
   IPv4 address on it; otherwise nothing is chosen and the reason names the agents lacking it.
2. Unset, on a single agent: loopback (`lo`), since all ranks run on the one machine.
3. Unset, on several agents: the candidates are the interfaces that have an IPv4 address on
   every agent, except `lo` and virtual ones (names starting with docker, veth, virbr, br-,
   cni, flannel, cali, tun, tap, kube or vxlan). InfiniBand (`ib*`) is preferred, then
   Ethernet (`eth*`, `en*`), then anything else, alphabetically within each group. With no
   candidate nothing is chosen and the reason lists each agent's usable interfaces.

Each agent's address is its lowest IPv4 address (numerically) on the chosen interface. The
result depends only on what each agent reported, never on the order of the agents, their
interfaces or their addresses.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

LOOPBACK = "lo"
VIRTUAL_PREFIXES = (
    "docker",
    "veth",
    "virbr",
    "br-",
    "cni",
    "flannel",
    "cali",
    "tun",
    "tap",
    "kube",
    "vxlan",
)


@dataclass(frozen=True)
class InterfaceChoice:
    """`name` None means no interface could be chosen; `reason` then says why."""

    name: str | None
    addresses: dict[str, str]  # agent id -> its address on `name`, by agent id; empty if None
    reason: str


def choose_interface(
    agent_interfaces: Mapping[str, Mapping[str, Sequence[str]]], explicit: str | None
) -> InterfaceChoice:
    """Pick by the module's rule; `agent_interfaces` maps agent id -> interface -> IPv4s.

    An empty `explicit` counts as unset. Raises ValueError for an empty gang.
    """
    if not agent_interfaces:
        raise ValueError("choose_interface needs at least one agent")
    # Interfaces listed without an address are no use to NCCL or Gloo; drop them up front.
    reported = {
        agent: {name: addrs for name, addrs in ifaces.items() if addrs}
        for agent, ifaces in sorted(agent_interfaces.items())
    }

    if explicit:
        missing = [agent for agent, ifaces in reported.items() if explicit not in ifaces]
        if missing:
            return InterfaceChoice(
                None,
                {},
                f"dtrain_network_interface {explicit!r} has no IPv4 address on {_agents(missing)}",
            )
        return _chosen(explicit, reported, f"dtrain_network_interface is set to {explicit!r}")

    if len(reported) == 1:
        ((agent, ifaces),) = reported.items()
        if LOOPBACK in ifaces:
            return _chosen(
                LOOPBACK, reported, f"all ranks run on agent {agent}, so they talk over loopback"
            )

    usable = {agent: sorted(filter(is_usable, ifaces)) for agent, ifaces in reported.items()}
    common = set.intersection(*(set(names) for names in usable.values()))
    if not common:
        if len(usable) == 1:
            ((agent, _),) = usable.items()
            return InterfaceChoice(
                None,
                {},
                f"agent {agent} has no usable network interface with an IPv4 address; "
                "set dtrain_network_interface",
            )
        listing = ", ".join(
            f"{agent} ({', '.join(names) or 'none'})" for agent, names in usable.items()
        )
        return InterfaceChoice(
            None,
            {},
            f"no network interface with an IPv4 address is common to agents {listing}; "
            "set dtrain_network_interface",
        )
    name = min(common, key=_preference)
    return _chosen(
        name,
        reported,
        f"{name!r} has an IPv4 address on every agent "
        "(preferred: ib*, then eth* or en*, then alphabetical)",
    )


def is_usable(name: str) -> bool:
    """Whether automatic choice may consider `name`: not loopback, not a virtual interface."""
    # "lo:1"-style names are aliases of loopback.
    return name != LOOPBACK and not name.startswith(("lo:", *VIRTUAL_PREFIXES))


def _preference(name: str) -> tuple[int, str]:
    if name.startswith("ib"):
        return (0, name)
    if name.startswith(("eth", "en")):
        return (1, name)
    return (2, name)


def _chosen(
    name: str, reported: Mapping[str, Mapping[str, Sequence[str]]], reason: str
) -> InterfaceChoice:
    addresses = {agent: min(ifaces[name], key=_address_order) for agent, ifaces in reported.items()}
    return InterfaceChoice(name, addresses, reason)


def _address_order(address: str) -> tuple[int, int, str]:
    # Numeric, so 10.0.0.9 comes before 10.0.0.10; anything unparsable sorts last, as text.
    try:
        return (0, int(ipaddress.IPv4Address(address)), "")
    except ValueError:
        return (1, 0, address)


def _agents(ids: Sequence[str]) -> str:
    return f"agent {ids[0]}" if len(ids) == 1 else f"agents {', '.join(ids)}"
