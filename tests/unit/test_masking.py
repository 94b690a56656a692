"""Secrets hidden from `det master config`, wherever they sit in the settings."""

from __future__ import annotations

from master.core.masking import HIDDEN, masked


def test_secret_keys_and_url_passwords_are_hidden_and_nothing_else() -> None:
    settings = {
        "db": {"url": "postgresql://det:hunter2@db.example:5432/resolute"},
        "security": {"initial_user_password": "s3cret", "allow_empty_passwords": False},
        "checkpoint_storage": {
            "type": "s3",
            "bucket": "models",
            "access_key": "AKIA",
            "secret_key": "abc",
            "endpoint_url": "http://127.0.0.1:9000",
        },
        "webhooks": [{"url": "https://user:pw@hooks.example/x", "signing_token": "t"}],
        "port": 8080,
        "empty_password": "",
    }
    shown = masked(settings)
    assert shown["db"]["url"] == f"postgresql://det:{HIDDEN}@db.example:5432/resolute"
    assert shown["security"] == {"initial_user_password": HIDDEN, "allow_empty_passwords": False}
    storage = shown["checkpoint_storage"]
    assert (storage["access_key"], storage["secret_key"]) == (HIDDEN, HIDDEN)
    assert storage["bucket"] == "models" and storage["endpoint_url"] == "http://127.0.0.1:9000"
    assert shown["webhooks"] == [
        {"url": f"https://user:{HIDDEN}@hooks.example/x", "signing_token": HIDDEN}
    ]
    assert shown["port"] == 8080
    assert shown["empty_password"] == ""  # nothing to hide: an empty one shows as empty
    assert settings["db"]["url"].endswith("hunter2@db.example:5432/resolute")  # not changed
