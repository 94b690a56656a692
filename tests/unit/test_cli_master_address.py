"""Where our `det` looks for the master: every bad address is one clear line, no traceback."""

from __future__ import annotations

import pytest

from cli.client import CliError, canonical_master_url


@pytest.mark.parametrize(
    ("given", "url"),
    [
        ("localhost", "http://localhost:8080"),
        ("10.0.0.5:9000", "http://10.0.0.5:9000"),
        ("https://master.example", "https://master.example:8080"),
        ("[::1]:9", "http://[::1]:9"),
    ],
)
def test_addresses_are_made_canonical(given: str, url: str) -> None:
    assert canonical_master_url(given) == url


@pytest.mark.parametrize("given", ["http://[::1", "ftp://x", "http://", "localhost:99999"])
def test_bad_addresses_are_a_cli_error(given: str) -> None:
    with pytest.raises(CliError, match="master address"):
        canonical_master_url(given)


def test_several_masters_are_tried_in_the_order_given() -> None:
    from cli.client import master_urls

    assert master_urls("a:8080, b:9090,") == ["http://a:8080", "http://b:9090"]
