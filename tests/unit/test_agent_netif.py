"""The agent's IPv4 interfaces as reported to the master, from real psutil."""

from __future__ import annotations

import ipaddress

from agent.netif import list_interfaces


def test_loopback_is_reported_with_127_0_0_1() -> None:
    by_name = {i.name: list(i.ipv4) for i in list_interfaces()}

    assert "127.0.0.1" in by_name["lo"]


def test_interfaces_are_sorted_and_each_has_ipv4_addresses() -> None:
    interfaces = list_interfaces()

    names = [i.name for i in interfaces]
    assert names == sorted(names)
    for interface in interfaces:
        addresses = [ipaddress.IPv4Address(a) for a in interface.ipv4]
        assert addresses
        assert addresses == sorted(set(addresses))
