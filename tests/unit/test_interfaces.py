"""Choosing the dtrain network interface for a gang from what its agents reported."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from master.core.interfaces import InterfaceChoice, choose_interface, is_usable

LO = {"lo": ["127.0.0.1"]}


def test_explicit_interface_present_everywhere_is_used() -> None:
    choice = choose_interface(
        {
            "a": {**LO, "eth0": ["10.0.0.1"], "fast0": ["192.168.5.1"]},
            "b": {**LO, "eth0": ["10.0.0.2"], "fast0": ["192.168.5.2"]},
        },
        "fast0",
    )

    assert choice.name == "fast0"
    assert choice.addresses == {"a": "192.168.5.1", "b": "192.168.5.2"}
    assert "fast0" in choice.reason


def test_explicit_interface_missing_on_an_agent_names_that_agent() -> None:
    choice = choose_interface(
        {
            "a": {"eth0": ["10.0.0.1"], "fast0": ["192.168.5.1"]},
            "b": {"eth0": ["10.0.0.2"]},
            "c": {"eth0": ["10.0.0.3"], "fast0": []},
        },
        "fast0",
    )

    assert choice == InterfaceChoice(
        None, {}, "dtrain_network_interface 'fast0' has no IPv4 address on agents b, c"
    )


def test_explicit_interface_wins_even_on_one_agent() -> None:
    choice = choose_interface({"a": {**LO, "eth0": ["10.0.0.1"]}}, "eth0")

    assert (choice.name, choice.addresses) == ("eth0", {"a": "10.0.0.1"})


def test_explicit_interface_missing_on_one_agent() -> None:
    choice = choose_interface({"a": {**LO, "eth0": ["10.0.0.1"]}}, "ib0")

    assert choice.name is None
    assert choice.reason == "dtrain_network_interface 'ib0' has no IPv4 address on agent a"


def test_empty_explicit_counts_as_unset() -> None:
    assert choose_interface({"a": LO}, "").name == "lo"


def test_single_agent_uses_loopback() -> None:
    choice = choose_interface({"a": {"eth0": ["10.0.0.1"], **LO, "ib0": ["10.1.0.1"]}}, None)

    assert (choice.name, choice.addresses) == ("lo", {"a": "127.0.0.1"})
    assert "loopback" in choice.reason


def test_single_agent_without_loopback_picks_by_preference() -> None:
    choice = choose_interface({"a": {"eth0": ["10.0.0.1"], "docker0": ["172.17.0.1"]}}, None)

    assert (choice.name, choice.addresses) == ("eth0", {"a": "10.0.0.1"})


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        (["eth0", "ib0", "wlan0"], "ib0"),
        (["ib1", "ib0"], "ib0"),
        (["wlan0", "eth1", "bond0"], "eth1"),
        (["wlan0", "enp1s0", "bond0"], "enp1s0"),
        (["ens5", "eth0"], "ens5"),
        (["wlan0", "bond0"], "bond0"),
    ],
)
def test_several_agents_prefer_ib_then_eth_or_en_then_alphabetical(
    names: list[str], expected: str
) -> None:
    agents = {
        agent: {**LO, **{name: [f"10.{i}.0.{n}"] for i, name in enumerate(names)}}
        for n, agent in enumerate(["a", "b"], start=1)
    }

    choice = choose_interface(agents, None)

    assert choice.name == expected
    assert choice.addresses == {"a": agents["a"][expected][0], "b": agents["b"][expected][0]}


def test_loopback_and_virtual_interfaces_are_never_chosen_automatically() -> None:
    virtual = ["docker0", "veth1a2b", "virbr0", "br-3f2a", "cni0", "flannel.1", "cali12ab"]
    virtual += ["tun0", "tap0", "kube-ipvs0", "vxlan.calico"]
    ifaces = {**LO, **{name: ["172.17.0.1"] for name in virtual}}

    choice = choose_interface({"a": ifaces, "b": ifaces}, None)

    assert choice.name is None
    assert choice.reason == (
        "no network interface with an IPv4 address is common to agents a (none), b (none); "
        "set dtrain_network_interface"
    )


def test_only_interfaces_common_to_every_agent_are_candidates() -> None:
    choice = choose_interface(
        {
            "a": {**LO, "ib0": ["10.9.0.1"], "eth0": ["10.0.0.1"]},
            "b": {**LO, "ib0": ["10.9.0.2"], "eth0": ["10.0.0.2"]},
            "c": {**LO, "eth0": ["10.0.0.3"]},
        },
        None,
    )

    assert choice.name == "eth0"
    assert choice.addresses == {"a": "10.0.0.1", "b": "10.0.0.2", "c": "10.0.0.3"}


def test_no_common_interface_lists_what_each_agent_has() -> None:
    choice = choose_interface(
        {
            "b": {**LO, "ens5": ["10.0.0.2"], "docker0": ["172.17.0.1"]},
            "a": {**LO, "eth0": ["10.0.0.1"], "eth1": []},
        },
        None,
    )

    assert choice == InterfaceChoice(
        None,
        {},
        "no network interface with an IPv4 address is common to agents a (eth0), b (ens5); "
        "set dtrain_network_interface",
    )


def test_each_agent_gets_its_lowest_address_numerically() -> None:
    choice = choose_interface(
        {
            "a": {"eth0": ["10.0.0.10", "10.0.0.9"]},
            "b": {"eth0": ["192.168.1.1", "10.0.0.100"]},
        },
        None,
    )

    assert choice.addresses == {"a": "10.0.0.9", "b": "10.0.0.100"}
    assert list(choice.addresses) == ["a", "b"]


def test_an_empty_gang_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="at least one agent"):
        choose_interface({}, None)


NAMES = ["lo", "docker0", "veth9", "br-1", "eth0", "eth1", "ens5", "enp1s0", "ib0", "ib1", "bond0"]
ADDRESSES = st.lists(st.ip_addresses(v=4).map(str), min_size=0, max_size=3, unique=True)
GANGS = st.dictionaries(
    st.sampled_from(["a", "b", "c", "d", "e"]),
    st.dictionaries(st.sampled_from(NAMES), ADDRESSES, max_size=len(NAMES)),
    min_size=1,
    max_size=5,
)


@settings(max_examples=300, deadline=None)
@given(gang=GANGS, explicit=st.none() | st.sampled_from(NAMES), rnd=st.randoms())
def test_the_choice_never_depends_on_order(
    gang: dict[str, dict[str, list[str]]], explicit: str | None, rnd: random.Random
) -> None:
    shuffled: dict[str, dict[str, list[str]]] = {}
    agents = list(gang)
    rnd.shuffle(agents)
    for agent in agents:
        names = list(gang[agent])
        rnd.shuffle(names)
        shuffled[agent] = {
            name: rnd.sample(gang[agent][name], k=len(gang[agent][name])) for name in names
        }

    choice = choose_interface(gang, explicit)

    assert choose_interface(shuffled, explicit) == choice
    if choice.name is None:
        assert choice.addresses == {}
        assert choice.reason
        return
    assert list(choice.addresses) == sorted(gang)
    for agent, address in choice.addresses.items():
        assert address in gang[agent][choice.name]
    if explicit is not None:
        assert choice.name == explicit
    elif len(gang) > 1:
        assert is_usable(choice.name)
