"""Checkpoint storage: where a checkpoint's files live, for each `checkpoint_storage` type.

One class per type, with the same five operations: upload a directory as a checkpoint,
download one, list its files, delete it, and validate the store before training. The
layout is Determined's, so its SDK and ours read each other's checkpoints:

- `shared_fs`, `directory`: `<directory>/<uuid>/<path>`, written in place;
- `s3`, `gcs`: `<prefix>/<uuid>/<path>` in the bucket (no prefix: `<uuid>/<path>`);
- `azure`: `<uuid>/<path>` in the container.

The cloud clients (boto3, google-cloud-storage, azure-storage-blob) are imported only by
the class that needs them, so `import resolute` stays light. Every failure of a store is a
`StorageError` whose message is one line: where, what, and the store's own words.

Transfers run files in parallel (and S3 splits large files into parallel parts). A retry
is resumable file by file: an upload skips files the store already holds with the same
size, a download those already on disk with the same size.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import threading
import uuid as uuidlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

# Bytes moved so far, called from transfer threads.
Progress = Callable[[int], None]

CLOUD_TYPES = ("s3", "gcs", "azure")
LOCAL_TYPES = ("shared_fs", "directory")
STORAGE_TYPES = (*LOCAL_TYPES, *CLOUD_TYPES)
# What the API, the CLI, the dashboard and logs show instead of a secret (as Determined).
HIDDEN = "********"
SECRET_KEYS: dict[str, tuple[str, ...]] = {
    "s3": ("access_key", "secret_key"),
    "azure": ("connection_string", "credential"),
}
# environment.registry_auth's credentials (Docker's AuthConfig), secret as storage keys are.
REGISTRY_SECRET_KEYS = ("password", "auth", "identitytoken", "registrytoken")
TRANSFER_THREADS = 8
MULTIPART_BYTES = 64 * 1024 * 1024


class StorageError(Exception):
    """A store refused or failed an operation; the message is one line: where, then the
    store's own words (`words`)."""

    def __init__(self, message: str, words: str | None = None) -> None:
        super().__init__(message)
        self.words = words or message


def one_line(text: object) -> str:
    return " ".join(str(text).split())


def mask_secrets(storage: Mapping[str, Any]) -> dict[str, Any]:
    """`checkpoint_storage` as it may be shown: secrets replaced by ********."""
    shown = dict(storage)
    for key in SECRET_KEYS.get(str(storage.get("type")), ()):
        if shown.get(key) is not None:
            shown[key] = HIDDEN
    return shown


def _registry_auth(config: Mapping[str, Any]) -> Mapping[str, Any] | None:
    environment = config.get("environment")
    auth = environment.get("registry_auth") if isinstance(environment, Mapping) else None
    return auth if isinstance(auth, Mapping) else None


def _with_registry_auth(config: Mapping[str, Any], auth: dict[str, Any]) -> dict[str, Any]:
    return {**config, "environment": {**config["environment"], "registry_auth": auth}}


def without_secrets(config: Mapping[str, Any]) -> dict[str, Any]:
    """A config with its storage secrets left out: what Determined's SDK gets with a
    checkpoint, so that its direct download uses the user's own credentials, or falls back
    to the master's download when it has none. Registry credentials are left out too."""
    shown = dict(config)
    storage = shown.get("checkpoint_storage")
    if isinstance(storage, Mapping):
        hidden = SECRET_KEYS.get(str(storage.get("type")), ())
        shown["checkpoint_storage"] = {k: v for k, v in storage.items() if k not in hidden}
    auth = _registry_auth(shown)
    if auth is not None:
        kept = {k: v for k, v in auth.items() if k not in REGISTRY_SECRET_KEYS}
        shown = _with_registry_auth(shown, kept)
    return shown


def mask_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """An experiment, task or template config as it may be shown: its storage and
    registry secrets hidden."""
    shown = dict(config)
    storage = shown.get("checkpoint_storage")
    if isinstance(storage, Mapping):
        shown["checkpoint_storage"] = mask_secrets(storage)
    auth = _registry_auth(shown)
    if auth is not None and any(auth.get(key) is not None for key in REGISTRY_SECRET_KEYS):
        masked = {
            key: HIDDEN if key in REGISTRY_SECRET_KEYS and value is not None else value
            for key, value in auth.items()
        }
        shown = _with_registry_auth(shown, masked)
    return shown


def _without(block: Mapping[str, Any], secrets: tuple[str, ...]) -> dict[str, Any]:
    return {key: value for key, value in block.items() if key not in secrets}


def keep_hidden_secrets(
    config: Mapping[str, Any], previous: Mapping[str, Any] | None
) -> dict[str, Any]:
    """A config sent back as it was shown: each ******** takes the previous config's
    secret again, so editing a shown template or forking a shown experiment loses no
    credential. Only when the secret goes to the server it went to before: the same store
    type and endpoint; the same registry user, serveraddress and images' registries.
    Otherwise the ******** stays, and is refused (hidden_secret_keys): a reader of a config
    must not send its owner's credential to a server of their choosing (a registry gets
    the password itself, in basic auth)."""
    restored = dict(config)
    storage = config.get("checkpoint_storage")
    old = (previous or {}).get("checkpoint_storage")
    if (
        isinstance(storage, Mapping)
        and isinstance(old, Mapping)
        and storage.get("type") == old.get("type")
        and storage.get("endpoint_url") == old.get("endpoint_url")
    ):
        kept = dict(storage)
        for key in SECRET_KEYS.get(str(storage.get("type")), ()):
            if kept.get(key) == HIDDEN and old.get(key) is not None:
                kept[key] = old[key]
        restored["checkpoint_storage"] = kept
    auth, old_auth = _registry_auth(config), _registry_auth(previous or {})
    if (
        auth is not None
        and old_auth is not None
        and _registries(config) == _registries(previous or {})
        and _without(auth, REGISTRY_SECRET_KEYS) == _without(old_auth, REGISTRY_SECRET_KEYS)
    ):
        kept = dict(auth)
        for key in REGISTRY_SECRET_KEYS:
            if kept.get(key) == HIDDEN and old_auth.get(key) is not None:
                kept[key] = old_auth[key]
        restored = _with_registry_auth(restored, kept)
    return restored


def registry_of(image: str) -> str:
    """The registry host an image reference names (Docker's rule: a first component with
    '.' or ':', or `localhost`); docker.io otherwise."""
    first, slash, _ = image.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        return first
    return "docker.io"


def _registries(config: Mapping[str, Any]) -> set[str]:
    """The registries environment.image pulls from (one image, or one per slot type)."""
    environment = config.get("environment")
    image = environment.get("image") if isinstance(environment, Mapping) else None
    names = image.values() if isinstance(image, Mapping) else [image]
    return {registry_of(name) for name in names if isinstance(name, str) and name}


def hidden_secret_keys(config: Mapping[str, Any]) -> list[str]:
    """Paths of secrets that are still ********: the shown value, not a credential."""
    hidden: list[str] = []
    storage = config.get("checkpoint_storage")
    if isinstance(storage, Mapping):
        hidden += [
            f"checkpoint_storage.{key}"
            for key in SECRET_KEYS.get(str(storage.get("type")), ())
            if storage.get(key) == HIDDEN
        ]
    auth = _registry_auth(config)
    if auth is not None:
        hidden += [
            f"environment.registry_auth.{key}"
            for key in REGISTRY_SECRET_KEYS
            if auth.get(key) == HIDDEN
        ]
    return hidden


def list_files(directory: Path) -> dict[str, int]:
    """Every file under `directory`: relative path (with /) to size in bytes."""
    return {
        path.relative_to(directory).as_posix(): path.stat().st_size
        for path in sorted(directory.rglob("*"))
        if path.is_file()
    }


def check_name(checkpoint_uuid: str) -> str:
    if not isinstance(checkpoint_uuid, str) or not checkpoint_uuid:
        raise ValueError(f"checkpoint uuid must be a non-empty string, got {checkpoint_uuid!r}")
    if "/" in checkpoint_uuid or os.sep in checkpoint_uuid or checkpoint_uuid in (".", ".."):
        raise ValueError(f"{checkpoint_uuid!r} is not a checkpoint uuid")
    return checkpoint_uuid


class Storage(ABC):
    """One `checkpoint_storage`. Checkpoints are named by their uuid."""

    kind: str

    @abstractmethod
    def describe(self) -> str:
        """Where checkpoints go, with no secret in it (s3://bucket/prefix)."""

    def local_directory(self) -> Path | None:
        """The directory checkpoints are written in place, for file-system stores."""
        return None

    def location(self, checkpoint_uuid: str) -> str:
        return f"{self.describe().rstrip('/')}/{check_name(checkpoint_uuid)}"

    @abstractmethod
    def upload(
        self, source: Path, checkpoint_uuid: str, progress: Progress | None = None
    ) -> None: ...

    @abstractmethod
    def download(
        self, checkpoint_uuid: str, target: Path, progress: Progress | None = None
    ) -> dict[str, int]:
        """Fetch every file of the checkpoint into `target`; the files and sizes."""

    @abstractmethod
    def list(self, checkpoint_uuid: str) -> dict[str, int]:
        """The checkpoint's files as the store holds them ({} when it holds none)."""

    @abstractmethod
    def delete(self, checkpoint_uuid: str) -> None:
        """Remove every file of the checkpoint; deleting nothing is not an error."""

    def files(self, checkpoint_uuid: str) -> Iterator[tuple[str, int, Path]]:
        """Each file of the checkpoint as (path, size, a local copy), one at a time: an
        object store's file is fetched when its turn comes and removed after, so a
        checkpoint can be streamed (the master's download) without a copy of all of it."""
        listed = self.list(checkpoint_uuid)
        if not listed:
            raise StorageError(f"{self.location(checkpoint_uuid)}: no such checkpoint")
        with tempfile_directory() as scratch:
            for rel, size in sorted(listed.items()):
                yield rel, size, self._fetch(checkpoint_uuid, rel, scratch / "file")

    @abstractmethod
    def _fetch(self, checkpoint_uuid: str, rel: str, scratch: Path) -> Path: ...

    def validate(self) -> None:
        """Write, read back and delete a small file, so a wrong bucket, endpoint or
        credential fails before training, not at the first checkpoint."""
        name = f"VALIDATE-{uuidlib.uuid4()}"
        try:
            with tempfile_directory() as scratch:
                probe = scratch / "up" / "VALIDATE.txt"
                probe.parent.mkdir()
                probe.write_text(name)
                self.upload(probe.parent, name)
                try:
                    self.download(name, scratch / "down")
                    if (scratch / "down" / "VALIDATE.txt").read_text() != name:
                        raise StorageError(f"{self.location(name)}: read back other bytes")
                finally:
                    self.delete(name)
        except StorageError as exc:
            where = self.describe()
            raise StorageError(f"checkpoint storage {where} is not usable: {exc.words}") from None


@contextlib.contextmanager
def tempfile_directory() -> Iterator[Path]:
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="resolute-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _parallel(work: Sequence[Callable[[], None]]) -> None:
    """Run transfers on a few threads; the first failure is raised after all finish."""
    if len(work) <= 1:
        for item in work:
            item()
        return
    with ThreadPoolExecutor(max_workers=min(TRANSFER_THREADS, len(work))) as pool:
        futures = [pool.submit(item) for item in work]
    for future in futures:
        future.result()


class _Counter:
    """Serialises progress callbacks coming from several transfer threads."""

    def __init__(self, progress: Progress | None) -> None:
        self._progress = progress
        self._lock = threading.Lock()

    def __call__(self, moved: int) -> None:
        if self._progress is not None and moved:
            with self._lock:
                self._progress(moved)


# --- file systems --------------------------------------------------------------------------


class DirectoryStorage(Storage):
    """shared_fs and directory: checkpoints are directories under one directory."""

    def __init__(self, kind: str, directory: Path) -> None:
        self.kind = kind
        self.directory = directory.absolute()

    def describe(self) -> str:
        return str(self.directory)

    def location(self, checkpoint_uuid: str) -> str:
        return str(self.directory / check_name(checkpoint_uuid))

    def local_directory(self) -> Path:
        return self.directory

    def upload(self, source: Path, checkpoint_uuid: str, progress: Progress | None = None) -> None:
        target = self.directory / check_name(checkpoint_uuid)
        if source.resolve() == target.resolve():
            return  # written in place
        counter = _Counter(progress)
        try:
            for rel, size in list_files(source).items():
                (target / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source / rel, target / rel)
                counter(size)
        except OSError as exc:
            raise StorageError(f"{target}: {one_line(exc)}") from None

    def download(
        self, checkpoint_uuid: str, target: Path, progress: Progress | None = None
    ) -> dict[str, int]:
        source = self.directory / check_name(checkpoint_uuid)
        if not source.is_dir():
            raise StorageError(f"{source}: no such checkpoint directory")
        files = list_files(source)
        counter = _Counter(progress)
        try:
            for rel, size in files.items():
                (target / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source / rel, target / rel)
                counter(size)
        except OSError as exc:
            raise StorageError(f"{source}: {one_line(exc)}") from None
        return files

    def list(self, checkpoint_uuid: str) -> dict[str, int]:
        path = self.directory / check_name(checkpoint_uuid)
        return list_files(path) if path.is_dir() else {}

    def _fetch(self, checkpoint_uuid: str, rel: str, scratch: Path) -> Path:
        return self.directory / checkpoint_uuid / rel  # read in place

    def delete(self, checkpoint_uuid: str) -> None:
        path = self.directory / check_name(checkpoint_uuid)
        try:
            shutil.rmtree(path)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise StorageError(f"{path}: {one_line(exc)}") from None

    def validate(self) -> None:
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StorageError(f"{self.directory}: {one_line(exc)}") from None
        super().validate()


# --- object stores -------------------------------------------------------------------------


class _ObjectStorage(Storage):
    """Shared logic of the three object stores: keys are `<prefix>/<uuid>/<path>`."""

    prefix: str

    def _key_prefix(self, checkpoint_uuid: str) -> str:
        name = check_name(checkpoint_uuid)
        return f"{self.prefix}/{name}/" if self.prefix else f"{name}/"

    @abstractmethod
    def _list_keys(self, key_prefix: str) -> dict[str, int]: ...

    @abstractmethod
    def _put(self, path: Path, key: str, progress: Progress) -> None: ...

    @abstractmethod
    def _get(self, key: str, path: Path, progress: Progress) -> None: ...

    @abstractmethod
    def _remove(self, keys: list[str]) -> None: ...

    @abstractmethod
    def _failure(self, exc: Exception) -> str | None:
        """The store's own words for an error of its client; None: not the store's."""

    @contextlib.contextmanager
    def _errors(self, where: str) -> Iterator[None]:
        try:
            yield
        except StorageError:
            raise
        except Exception as exc:
            words = self._failure(exc)
            if words is None:
                raise
            raise StorageError(f"{where}: {one_line(words)}", one_line(words)) from None

    def list(self, checkpoint_uuid: str) -> dict[str, int]:
        key_prefix = self._key_prefix(checkpoint_uuid)
        with self._errors(self.location(checkpoint_uuid)):
            keys = self._list_keys(key_prefix)
        return {key[len(key_prefix) :]: size for key, size in keys.items()}

    def upload(self, source: Path, checkpoint_uuid: str, progress: Progress | None = None) -> None:
        key_prefix = self._key_prefix(checkpoint_uuid)
        counter = _Counter(progress)
        files = list_files(source)
        with self._errors(self.location(checkpoint_uuid)):
            stored = self._list_keys(key_prefix)
            work = []
            for rel, size in files.items():
                key = key_prefix + rel
                if stored.get(key) == size:
                    counter(size)  # a retry: already there
                    continue
                work.append(functools.partial(self._put, source / rel, key, counter))
            _parallel(work)

    def download(
        self, checkpoint_uuid: str, target: Path, progress: Progress | None = None
    ) -> dict[str, int]:
        key_prefix = self._key_prefix(checkpoint_uuid)
        counter = _Counter(progress)
        with self._errors(self.location(checkpoint_uuid)):
            stored = self._list_keys(key_prefix)
            if not stored:
                raise StorageError(f"{self.location(checkpoint_uuid)}: no such checkpoint")
            work = []
            for key, size in stored.items():
                path = target / key[len(key_prefix) :]
                if path.is_file() and path.stat().st_size == size:
                    counter(size)
                    continue
                path.parent.mkdir(parents=True, exist_ok=True)
                work.append(functools.partial(self._get, key, path, counter))
            _parallel(work)
        return {key[len(key_prefix) :]: size for key, size in stored.items()}

    def _fetch(self, checkpoint_uuid: str, rel: str, scratch: Path) -> Path:
        with self._errors(self.location(checkpoint_uuid)):
            self._get(self._key_prefix(checkpoint_uuid) + rel, scratch, lambda _: None)
        return scratch

    def delete(self, checkpoint_uuid: str) -> None:
        key_prefix = self._key_prefix(checkpoint_uuid)
        with self._errors(self.location(checkpoint_uuid)):
            keys = sorted(self._list_keys(key_prefix))
            for start in range(0, len(keys), 1000):
                self._remove(keys[start : start + 1000])


class S3Storage(_ObjectStorage):
    """Amazon S3 or any S3-compatible store (MinIO, Ceph, R2) through `endpoint_url`.
    Without access_key and secret_key, boto3's standard chain finds the credentials
    (environment, AWS_SHARED_CREDENTIALS_FILE, instance role)."""

    kind = "s3"

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        access_key: str | None = None,
        secret_key: str | None = None,
    ) -> None:
        import boto3
        from boto3.s3.transfer import TransferConfig
        from botocore.config import Config

        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.endpoint_url = endpoint_url
        session = boto3.session.Session(
            aws_access_key_id=access_key, aws_secret_access_key=secret_key
        )
        self._client = session.client(
            "s3",
            endpoint_url=endpoint_url or None,
            config=Config(
                max_pool_connections=TRANSFER_THREADS * 2,
                retries={"max_attempts": 5, "mode": "standard"},
                connect_timeout=10,
                read_timeout=60,
            ),
        )
        self._transfer = TransferConfig(
            multipart_threshold=MULTIPART_BYTES,
            multipart_chunksize=MULTIPART_BYTES // 4,
            max_concurrency=4,
        )

    def describe(self) -> str:
        where = f"s3://{self.bucket}/{self.prefix}".rstrip("/")
        return where + (f" at {self.endpoint_url}" if self.endpoint_url else "")

    def location(self, checkpoint_uuid: str) -> str:
        return f"s3://{self.bucket}/{self._key_prefix(checkpoint_uuid).rstrip('/')}"

    def _list_keys(self, key_prefix: str) -> dict[str, int]:
        keys: dict[str, int] = {}
        paginator = self._client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=key_prefix):
            for item in page.get("Contents", []):
                keys[item["Key"]] = int(item["Size"])
        return keys

    def _put(self, path: Path, key: str, progress: Progress) -> None:
        self._client.upload_file(
            str(path), self.bucket, key, Config=self._transfer, Callback=progress
        )

    def _get(self, key: str, path: Path, progress: Progress) -> None:
        self._client.download_file(
            self.bucket, key, str(path), Config=self._transfer, Callback=progress
        )

    def _remove(self, keys: list[str]) -> None:
        reply = self._client.delete_objects(
            Bucket=self.bucket, Delete={"Objects": [{"Key": k} for k in keys], "Quiet": True}
        )
        errors = reply.get("Errors") or []
        if errors:
            first = errors[0]
            raise StorageError(
                f"s3://{self.bucket}/{first.get('Key')}: {first.get('Code')}: "
                f"{one_line(first.get('Message', ''))} ({len(errors)} of {len(keys)} not deleted)"
            )

    def _failure(self, exc: Exception) -> str | None:
        from boto3.exceptions import Boto3Error
        from botocore.exceptions import BotoCoreError, ClientError

        if isinstance(exc, ClientError):
            error = exc.response.get("Error", {})
            return f"{error.get('Code', 'error')}: {error.get('Message') or exc}"
        if isinstance(exc, BotoCoreError | Boto3Error):
            return str(exc)
        return None


class GCSStorage(_ObjectStorage):
    """Google Cloud Storage; credentials from Google's standard chain
    (GOOGLE_APPLICATION_CREDENTIALS, the metadata server), or none with
    STORAGE_EMULATOR_HOST."""

    kind = "gcs"

    def __init__(self, bucket: str, prefix: str = "") -> None:
        from google.cloud import storage

        self.bucket_name = bucket
        self.prefix = prefix.strip("/")
        if os.environ.get("STORAGE_EMULATOR_HOST"):
            from google.auth.credentials import AnonymousCredentials

            client = storage.Client(
                project=os.environ.get("GOOGLE_CLOUD_PROJECT") or "resolute",
                credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call]
            )
        else:
            client = storage.Client()
        self._bucket = client.bucket(bucket)
        self._client = client

    def describe(self) -> str:
        return f"gs://{self.bucket_name}/{self.prefix}".rstrip("/")

    def location(self, checkpoint_uuid: str) -> str:
        return f"gs://{self.bucket_name}/{self._key_prefix(checkpoint_uuid).rstrip('/')}"

    def _list_keys(self, key_prefix: str) -> dict[str, int]:
        return {
            blob.name: int(blob.size or 0)
            for blob in self._client.list_blobs(self._bucket, prefix=key_prefix)
        }

    def _put(self, path: Path, key: str, progress: Progress) -> None:
        blob = self._bucket.blob(key, chunk_size=MULTIPART_BYTES // 4)  # resumable upload
        blob.upload_from_filename(str(path), timeout=300)
        progress(path.stat().st_size)

    def _get(self, key: str, path: Path, progress: Progress) -> None:
        self._bucket.blob(key).download_to_filename(str(path), timeout=300)
        progress(path.stat().st_size)

    def _remove(self, keys: list[str]) -> None:
        from google.api_core.exceptions import NotFound

        for key in keys:
            with contextlib.suppress(NotFound):
                self._bucket.blob(key).delete()

    def _failure(self, exc: Exception) -> str | None:
        from google.api_core.exceptions import GoogleAPIError
        from google.auth.exceptions import GoogleAuthError
        from requests.exceptions import RequestException

        if isinstance(exc, GoogleAPIError | GoogleAuthError | RequestException):
            message = getattr(exc, "message", None) or str(exc)
            code = getattr(exc, "code", None)
            return f"{code} {message}" if code else str(message)
        return None


class AzureStorage(_ObjectStorage):
    """Azure Blob Storage: a connection string, or an account URL with a credential (an
    account key or SAS token; none: azure-identity's default chain if installed)."""

    kind = "azure"

    def __init__(
        self,
        container: str,
        *,
        connection_string: str | None = None,
        account_url: str | None = None,
        credential: str | None = None,
    ) -> None:
        from azure.storage.blob import BlobServiceClient, ExponentialRetry

        self.container = container
        self.prefix = ""
        # A few quick retries, as for S3: the deleter and the trial's start check retry
        # on their own schedule, and a dead endpoint must fail in seconds.
        # (The storage SDK's own policy waits 15 s, then 18 s, 24 s... between tries.)
        options: dict[str, Any] = {
            "retry_policy": ExponentialRetry(initial_backoff=1, increment_base=2, retry_total=2),
            "connection_timeout": 10,
            "read_timeout": 60,
        }
        if connection_string:
            service = BlobServiceClient.from_connection_string(connection_string, **options)
        elif account_url:
            credential = credential or _azure_default()
            service = BlobServiceClient(account_url, credential=credential, **options)
        else:
            raise StorageError("checkpoint_storage: azure needs connection_string or account_url")
        self.account = service.account_name or ""
        self._container = service.get_container_client(container)

    def describe(self) -> str:
        return f"azure://{self.account}/{self.container}"

    def _list_keys(self, key_prefix: str) -> dict[str, int]:
        return {
            blob.name: int(blob.size or 0)
            for blob in self._container.list_blobs(name_starts_with=key_prefix)
        }

    def _put(self, path: Path, key: str, progress: Progress) -> None:
        with path.open("rb") as data:
            self._container.upload_blob(key, data, overwrite=True, max_concurrency=4, timeout=300)
        progress(path.stat().st_size)

    def _get(self, key: str, path: Path, progress: Progress) -> None:
        with path.open("wb") as out:
            self._container.download_blob(key, max_concurrency=4, timeout=300).readinto(out)
        progress(path.stat().st_size)

    def _remove(self, keys: list[str]) -> None:
        from azure.core.exceptions import ResourceNotFoundError

        for key in keys:
            with contextlib.suppress(ResourceNotFoundError):
                self._container.delete_blob(key)

    def _failure(self, exc: Exception) -> str | None:
        from azure.core.exceptions import AzureError

        if isinstance(exc, AzureError):
            # The first line; the rest is the raw error document.
            return str(getattr(exc, "message", None) or exc).splitlines()[0]
        return None


def _azure_default() -> Any:
    try:
        from azure.identity import DefaultAzureCredential
    except ImportError:
        raise StorageError(
            "checkpoint_storage.credential: none given, and azure-identity is not installed "
            "for the default chain"
        ) from None
    return DefaultAzureCredential()


# --- from a config -------------------------------------------------------------------------


def _text(storage: Mapping[str, Any], key: str, *, required: bool = False) -> str | None:
    value = storage.get(key)
    if value is None or value == "":
        if required:
            raise ValueError(f"checkpoint_storage.{key}: required for {storage.get('type')}")
        return None
    if not isinstance(value, str):
        raise ValueError(f"checkpoint_storage.{key}: must be a string")
    return value


def directory_of(storage: Mapping[str, Any]) -> Path:
    """The directory of a file-system storage: shared_fs host_path joined with
    storage_path when that is relative (an absolute storage_path stands alone);
    directory container_path."""
    kind = storage.get("type")
    if kind == "shared_fs":
        host = _text(storage, "host_path", required=True)
        assert host is not None
        sub = _text(storage, "storage_path")
        return Path(host) / sub if sub else Path(host)  # an absolute `sub` replaces `host`
    if kind == "directory":
        path = _text(storage, "container_path", required=True)
        assert path is not None
        return Path(path)
    raise ValueError(f"checkpoint_storage.type: {kind!r} is not a file-system storage")


def checkpoint_location(storage: Mapping[str, Any], checkpoint_uuid: str) -> str:
    """Where a checkpoint lives, from the config alone (no client is built): a directory,
    or s3://bucket/prefix/uuid, gs://..., azure://container/uuid."""
    kind = storage.get("type")
    name = check_name(checkpoint_uuid)
    if kind in LOCAL_TYPES:
        return str(directory_of(storage) / name)
    prefix = str(storage.get("prefix") or "").strip("/")
    key = f"{prefix}/{name}" if prefix else name
    if kind == "s3":
        return f"s3://{storage.get('bucket')}/{key}"
    if kind == "gcs":
        return f"gs://{storage.get('bucket')}/{key}"
    if kind == "azure":
        return f"azure://{storage.get('container')}/{name}"
    raise ValueError(f"checkpoint_storage.type: {kind!r} is not one of {', '.join(STORAGE_TYPES)}")


def from_config(storage: Mapping[str, Any]) -> Storage:
    """The Storage of an experiment's `checkpoint_storage`. Raises ValueError naming the
    key for a config it cannot use."""
    kind = storage.get("type")
    if kind in LOCAL_TYPES:
        return DirectoryStorage(str(kind), directory_of(storage))
    if kind == "s3":
        bucket = _text(storage, "bucket", required=True)
        assert bucket is not None
        return S3Storage(
            bucket,
            _text(storage, "prefix") or "",
            endpoint_url=_text(storage, "endpoint_url"),
            access_key=_text(storage, "access_key"),
            secret_key=_text(storage, "secret_key"),
        )
    if kind == "gcs":
        bucket = _text(storage, "bucket", required=True)
        assert bucket is not None
        return GCSStorage(bucket, _text(storage, "prefix") or "")
    if kind == "azure":
        container = _text(storage, "container", required=True)
        assert container is not None
        connection_string = _text(storage, "connection_string")
        account_url = _text(storage, "account_url")
        if connection_string is None and account_url is None:
            raise ValueError(
                "checkpoint_storage.connection_string: azure needs connection_string, or "
                "account_url (with credential)"
            )
        return AzureStorage(
            container,
            connection_string=connection_string,
            account_url=account_url,
            credential=_text(storage, "credential"),
        )
    raise ValueError(f"checkpoint_storage.type: {kind!r} is not one of {', '.join(STORAGE_TYPES)}")
