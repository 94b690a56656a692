"""The agent's IPv4 network interfaces, reported in Hello so the master can pick a dtrain NIC.

Nothing is filtered here (loopback and bridges included): which interfaces to use for
multi-agent training is the master's decision (`master.core.interfaces`).
"""

from __future__ import annotations

import ipaddress
import socket

import psutil

from resolute_proto.agent.v1 import agent_pb2


def list_interfaces() -> list[agent_pb2.NetworkInterface]:
    """Interfaces with at least one IPv4 address, by name; addresses in numeric order."""
    out = []
    for name, addrs in sorted(psutil.net_if_addrs().items()):
        ipv4 = {a.address for a in addrs if a.family == socket.AF_INET}
        if ipv4:
            out.append(
                agent_pb2.NetworkInterface(name=name, ipv4=sorted(ipv4, key=ipaddress.IPv4Address))
            )
    return out
