"""Secrets the master hands out must survive a command line: none may start with "-"."""

from __future__ import annotations

import secrets

import pytest

from master.core import credentials
from master.core.credentials import new_token


def test_a_token_drawn_with_a_leading_dash_is_drawn_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # One in 64 of token_urlsafe's draws starts with "-"; Determined's client then reads
    # `det token login -Abc...` as an unknown option (CI saw it fail so).
    draws = iter(["-Ab3xQ", "-", "Zk9_Q-"])
    monkeypatch.setattr(credentials.secrets, "token_urlsafe", lambda nbytes: next(draws))
    assert new_token() == "Zk9_Q-"


def test_tokens_are_long_url_safe_and_distinct() -> None:
    tokens = {new_token() for _ in range(2000)}
    assert len(tokens) == 2000
    for token in tokens:
        assert not token.startswith("-")
        assert len(token) == len(secrets.token_urlsafe(32)) == 43
        assert set(token) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
