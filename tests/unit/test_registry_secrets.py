"""environment.registry_auth's credentials are secrets as storage keys are
(resolute.storage): hidden when shown, taken back from the stored config when a shown one
is resubmitted, named when still hidden, and left out of what a checkpoint's reader gets."""

from __future__ import annotations

from typing import Any

from resolute.storage import (
    HIDDEN,
    hidden_secret_keys,
    keep_hidden_secrets,
    mask_config,
    without_secrets,
)

STORED: dict[str, Any] = {
    "entrypoint": "python3 train.py",
    "checkpoint_storage": {"type": "s3", "bucket": "b", "secret_key": "sk"},
    "environment": {
        "image": "ubuntu:22.04",
        "registry_auth": {
            "username": "robot",
            "password": "pw",
            "auth": "cm9ib3Q6cHc=",
            "identitytoken": "id-token",
            "registrytoken": "reg-token",
            "serveraddress": "registry.example.com",
            "email": None,
        },
    },
}


def test_every_registry_credential_is_hidden_and_the_rest_shown() -> None:
    shown = mask_config(STORED)
    assert shown["environment"]["registry_auth"] == {
        "username": "robot",
        "password": HIDDEN,
        "auth": HIDDEN,
        "identitytoken": HIDDEN,
        "registrytoken": HIDDEN,
        "serveraddress": "registry.example.com",
        "email": None,
    }
    assert shown["environment"]["image"] == "ubuntu:22.04"
    assert shown["checkpoint_storage"]["secret_key"] == HIDDEN
    assert STORED["environment"]["registry_auth"]["password"] == "pw"  # a copy was masked
    no_secret = {"environment": {"registry_auth": {"username": "robot", "password": None}}}
    assert mask_config(no_secret) == no_secret


def test_a_shown_config_sent_back_takes_the_stored_credentials_again() -> None:
    shown = mask_config(STORED)
    assert hidden_secret_keys(shown) == [
        "checkpoint_storage.secret_key",
        "environment.registry_auth.password",
        "environment.registry_auth.auth",
        "environment.registry_auth.identitytoken",
        "environment.registry_auth.registrytoken",
    ]
    restored = keep_hidden_secrets(shown, STORED)
    assert restored == STORED
    assert hidden_secret_keys(restored) == []
    # A new password given with the shown config wins; a hidden one without a stored one
    # stays hidden, for the caller to refuse.
    changed = keep_hidden_secrets(
        {"environment": {"registry_auth": {"username": "robot", "password": "new"}}}, STORED
    )
    assert changed["environment"]["registry_auth"]["password"] == "new"
    orphan = keep_hidden_secrets(shown, {"entrypoint": "x"})
    assert "environment.registry_auth.password" in hidden_secret_keys(orphan)


def test_a_hidden_credential_is_never_restored_for_another_destination() -> None:
    """Whoever reads a config (and may fork it) must not send its owner's credentials to
    a server of their choosing: a ******** is restored only for the same registry and
    images, or the same store."""
    shown = mask_config(STORED)
    environment = shown["environment"]
    auth = environment["registry_auth"]
    for changed in (
        {**environment, "image": "evil.example/x:1"},
        {**environment, "registry_auth": {**auth, "serveraddress": "evil.example"}},
        {**environment, "registry_auth": {**auth, "username": "other"}},
    ):
        restored = keep_hidden_secrets({**shown, "environment": changed}, STORED)
        assert "environment.registry_auth.password" in hidden_secret_keys(restored), changed
        assert STORED["environment"]["registry_auth"]["password"] not in str(restored)
    storage = {**shown["checkpoint_storage"], "endpoint_url": "https://evil.example"}
    restored = keep_hidden_secrets({**shown, "checkpoint_storage": storage}, STORED)
    assert "checkpoint_storage.secret_key" in hidden_secret_keys(restored)
    assert STORED["checkpoint_storage"]["secret_key"] not in str(restored)


def test_a_checkpoints_config_has_no_registry_credentials() -> None:
    auth = without_secrets(STORED)["environment"]["registry_auth"]
    assert auth == {"username": "robot", "serveraddress": "registry.example.com", "email": None}
