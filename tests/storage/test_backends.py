"""resolute.storage against real servers of each object store (moto for S3,
gcp-storage-emulator, Azurite), read back through the stores' own clients, and the
library's store_path / restore_path on top of them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from resolute.checkpoint import CheckpointContext
from resolute.storage import Storage, StorageError, from_config
from tests.object_stores import (
    StoreServer,
    azure_service,
    free_port,
    gcs_client,
    s3_client,
)


def write_tree(root: Path) -> dict[str, bytes]:
    files = {
        "model.bin": os.urandom(3 * 1024 * 1024 + 17),
        "empty.txt": b"",
        "nested/deeper/state.json": b'{"step": 7}',
    }
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return files


def read_tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def store_of(server: StoreServer, prefix: str = "") -> tuple[Storage, str]:
    bucket = server.new_bucket()
    return from_config(server.storage_config(bucket, prefix)), bucket


def test_a_checkpoint_round_trips_in_determineds_layout(
    object_store: StoreServer, tmp_path: Path
) -> None:
    prefix = "" if object_store.kind == "azure" else "team/a"
    store, bucket = store_of(object_store, prefix)
    files = write_tree(tmp_path / "src")
    store.upload(tmp_path / "src", "ckpt-1")

    base = f"{prefix}/ckpt-1" if prefix else "ckpt-1"
    expected = {f"{base}/{name}": len(data) for name, data in files.items()}
    assert object_store.keys(bucket) == expected  # what the store itself holds
    assert store.list("ckpt-1") == {name: len(data) for name, data in files.items()}
    assert store.download("ckpt-1", tmp_path / "dst") == store.list("ckpt-1")
    assert read_tree(tmp_path / "dst") == files

    store.delete("ckpt-1")
    assert object_store.keys(bucket) == {}
    store.delete("ckpt-1")  # nothing left to delete is not an error
    assert store.list("ckpt-1") == {}


def delete_object(server: StoreServer, bucket: str, key: str) -> None:
    """Remove one object with the store's own client."""
    if server.kind == "s3":
        s3_client(server).delete_object(Bucket=bucket, Key=key)
    elif server.kind == "gcs":
        gcs_client(server).bucket(bucket).blob(key).delete()
    else:
        azure_service(server).get_container_client(bucket).delete_blob(key)


def test_a_retried_upload_sends_only_what_the_store_lacks(
    object_store: StoreServer, tmp_path: Path
) -> None:
    store, bucket = store_of(object_store)
    files = write_tree(tmp_path / "src")
    store.upload(tmp_path / "src", "ckpt-2")
    # As if the first attempt had died before its last file.
    (missing,) = [k for k in object_store.keys(bucket) if k.endswith("state.json")]
    delete_object(object_store, bucket, missing)
    # A file the store already holds with the same size is not sent again: change its
    # bytes locally (same size) and the store keeps the first upload's.
    (tmp_path / "src" / "model.bin").write_bytes(os.urandom(len(files["model.bin"])))
    moved: list[int] = []
    store.upload(tmp_path / "src", "ckpt-2", progress=moved.append)
    assert sum(moved) == sum(len(d) for d in files.values())  # progress counts every byte
    store.download("ckpt-2", tmp_path / "again")
    assert read_tree(tmp_path / "again") == files


def test_validate_writes_reads_and_cleans_up(object_store: StoreServer) -> None:
    store, bucket = store_of(object_store)
    store.validate()
    assert object_store.keys(bucket) == {}


def test_a_missing_bucket_fails_validation_in_one_line_in_the_stores_words(
    object_store: StoreServer,
) -> None:
    store = from_config(object_store.storage_config("no-such-bucket-anywhere"))
    with pytest.raises(StorageError) as caught:
        store.validate()
    message = str(caught.value)
    assert "\n" not in message and message.startswith("checkpoint storage ")
    words = {"s3": "NoSuchBucket", "gcs": "no-such-bucket-anywhere", "azure": "does not exist"}
    assert words[object_store.kind] in message, message


def test_an_endpoint_nobody_listens_on_fails_in_one_line() -> None:
    store = from_config(
        {
            "type": "s3",
            "bucket": "b",
            "endpoint_url": f"http://127.0.0.1:{free_port()}",
            "access_key": "a",
            "secret_key": "b",
        }
    )
    with pytest.raises(StorageError, match="Could not connect to the endpoint URL") as caught:
        store.validate()
    assert "\n" not in str(caught.value)


def test_downloading_an_unknown_checkpoint_names_where_it_looked(
    object_store: StoreServer, tmp_path: Path
) -> None:
    store, _ = store_of(object_store)
    with pytest.raises(StorageError, match="no-such-uuid: no such checkpoint"):
        store.download("no-such-uuid", tmp_path)


def test_store_path_uploads_and_restore_path_downloads(
    object_store: StoreServer, tmp_path: Path
) -> None:
    store, bucket = store_of(object_store)
    context = CheckpointContext(
        store, session=None, is_chief=True, trial_id=None, task_id=None, allocation_id=None
    )
    with context.store_path(5, {"note": "x"}) as (path, uuid):
        staging = path
        (path / "weights.bin").write_bytes(b"w" * 1000)
    assert not staging.exists()  # the staging copy is gone once uploaded
    assert object_store.keys(bucket) == {f"{uuid}/weights.bin": 1000}
    with context.restore_path(uuid) as restored:
        assert (restored / "weights.bin").read_bytes() == b"w" * 1000
        kept = restored
    assert not kept.exists()

    with pytest.raises(RuntimeError, match="boom"), context.store_path(6) as (path, _):
        (path / "half.bin").write_bytes(b"h")
        raise RuntimeError("boom")
    assert object_store.keys(bucket) == {f"{uuid}/weights.bin": 1000}  # nothing uploaded
