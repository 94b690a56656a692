"""The ports an agent hands to a trial's chief: from its port_range, never from the kernel's
ephemeral range (where an outgoing connection can take one before the trial binds it, as a
CI run once saw: Determined's broadcast socket failed with "Address already in use"), and
never one already handed to another live allocation."""

from __future__ import annotations

import random
import socket
from pathlib import Path

import pytest
from pydantic import ValidationError

from agent import ports
from agent.runner import Runner
from agent.settings import AgentSettings
from resolute_proto.agent.v1 import agent_pb2 as pb


@pytest.mark.parametrize(
    ("given", "problem"),
    [
        ("", "is not START-END"),
        ("20000", "is not START-END"),
        ("a-b", "is not START-END"),
        ("30000-20000", "1024 <= START <= END <= 65535"),
        ("80-2000", "1024 <= START <= END <= 65535"),
        ("20000-70000", "1024 <= START <= END <= 65535"),
        ("20000-20003", "at least 16 ports"),
    ],
)
def test_a_bad_port_range_is_refused_naming_the_setting(given: str, problem: str) -> None:
    with pytest.raises(ValidationError) as caught:
        AgentSettings(join_token="t", port_range=given)
    [error] = caught.value.errors()
    assert error["loc"] == ("port_range",) and problem in error["msg"], error


def test_the_default_range_is_outside_linuxs_default_ephemeral_range() -> None:
    first, last = ports.parse_port_range(AgentSettings(join_token="t").port_range)
    assert last < 32768 and first >= 1024


def test_ports_of_the_ephemeral_range_are_never_candidates() -> None:
    pool = ports.candidates((30000, 40000), (32768, 60999))
    assert pool == list(range(30000, 32768))
    # A range wholly inside it leaves nothing outside: the agent uses it, and warns.
    assert ports.candidates((40000, 40100), (32768, 60999)) == list(range(40000, 40101))
    assert "ephemeral range 32768-60999" in (
        ports.overlap_warning((40000, 40100), (32768, 60999)) or ""
    )
    assert ports.overlap_warning((20000, 40000), (32768, 60999)) is None
    assert ports.candidates((20000, 20100), None) == list(range(20000, 20101))


def test_the_kernels_ephemeral_range_is_read(tmp_path: Path) -> None:
    (tmp_path / "range").write_text("32768\t60999\n")
    assert ports.ephemeral_range(tmp_path / "range") == (32768, 60999)
    assert ports.ephemeral_range(tmp_path / "missing") is None


def test_picked_ports_skip_those_taken_and_those_in_use() -> None:
    pool = list(range(20000, 20020))
    busy = {20005, 20006}
    for seed in range(50):
        picked = ports.pick_ports(
            3, pool, taken={20001, 20002}, is_free=lambda p: p not in busy, rng=random.Random(seed)
        )
        assert len(set(picked)) == 3
        assert not set(picked) & {20001, 20002, 20005, 20006}
        assert set(picked) <= set(pool)


def test_too_few_free_ports_is_an_error_saying_so() -> None:
    pool = list(range(20000, 20016))
    with pytest.raises(OSError, match="only 1 of the 2 ports needed are free"):
        ports.pick_ports(2, pool, taken=set(pool[1:]), is_free=lambda p: True)


def test_a_port_something_listens_on_is_not_bindable() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("", 0))
        held.listen()
        port = held.getsockname()[1]
        assert not ports.bindable(port)


def test_a_runner_hands_each_live_allocation_its_own_ports_from_its_range(tmp_path: Path) -> None:
    runner = Runner("agent-a", tmp_path, [], lambda m: None, lambda e: None)
    runner.port_pool = ports.candidates((21000, 21015), ports.ephemeral_range())
    # Every port free as far as the kernel knows (whatever else runs on this machine now):
    # what keeps the runner's choices apart is its memory of what it handed out.
    asked: list[int] = []

    def free(port: int) -> bool:
        asked.append(port)
        return True

    runner.port_is_free = free
    handed: list[int] = []
    for n in range(5):
        prepared = runner.prepare(f"{n}.1", extra_ports=2)
        assert not prepared.error
        handed += [prepared.master_port, *prepared.extra_ports]
    # Nothing bound them (the trials have not started): every one is from the range, and
    # none twice.
    assert asked and len(set(handed)) == 15 and set(handed) <= set(range(21000, 21016))
    # Asked again (a repeat after a reconnect): the same ports.
    again = runner.prepare("0.1", extra_ports=2)
    assert [again.master_port, *again.extra_ports] == handed[:3]
    # The range has one port left: a gang needing three is told why.
    refused = runner.prepare("9.1", extra_ports=2)
    assert "no free port for the rendezvous" in refused.error
    assert "only 1 of the 3 ports needed" in refused.error
    assert isinstance(refused, pb.AllocationPrepared)
