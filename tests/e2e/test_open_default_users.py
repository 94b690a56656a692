"""The master keeps off the network while a default user has an empty password (issue 15):
a real `det-master` on 0.0.0.0 exits at start with one clear line; with passwords set, or
told explicitly, it starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.conftest import MasterProcess

REFUSAL = "refusing to listen on 0.0.0.0: users admin, determined have empty passwords"


def test_a_master_on_the_network_refuses_empty_default_passwords(tmp_path: Path) -> None:
    refused = MasterProcess(
        tmp_path / "open",
        label="open",
        host="0.0.0.0",
        env={"DET_MASTER_SECURITY__ALLOW_EMPTY_PASSWORDS": "false"},
    )
    with pytest.raises(RuntimeError, match="exited with 2 while starting") as failure:
        refused.start()
    assert REFUSAL in str(failure.value)
    assert "Traceback" not in refused.output()

    with_passwords = MasterProcess(
        tmp_path / "closed",
        label="closed",
        host="0.0.0.0",
        env={
            "DET_MASTER_SECURITY__ALLOW_EMPTY_PASSWORDS": "false",
            "DET_MASTER_SECURITY__INITIAL_USER_PASSWORD": "Str0ng-enough",
        },
    )
    with_passwords.start()
    with_passwords.stop()

    told = MasterProcess(tmp_path / "told", label="told", host="0.0.0.0")
    told.start()  # MasterProcess sets security.allow_empty_passwords off loopback
    told.stop()
    assert "have empty passwords (security.allow_empty_passwords is set)" in told.output()
