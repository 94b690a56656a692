"""Real servers speaking each object store's protocol, on loopback, for the checkpoint-storage
tests: moto's standalone server (S3), gcp-storage-emulator (GCS) and Azurite (Azure Blob).

Each runs as its own process for the whole test session; `make test` installs them (the
first two from PyPI with the test group, Azurite from npm into .azurite/). A server that
cannot start skips its tests outside CI and fails them under CI=true.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.cluster import START_TIMEOUT_S, Process, free_port, wait_until

REPO = Path(__file__).resolve().parents[1]
AZURITE = Path(os.environ.get("AZURITE_BLOB", REPO / ".azurite/node_modules/.bin/azurite-blob"))
# Azurite's documented development account; it is public and means nothing elsewhere.
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
S3_KEYS = ("resolute-test-access", "resolute-test-secret")


@dataclass
class StoreServer:
    """One server process, started and stopped through the harness (its own session, its
    log kept, its whole group stopped). `stop()`/`start()` take it down and bring it back on
    the same port (for outage tests); an in-memory server comes back empty."""

    kind: str
    argv: list[str]
    port: int
    log: Path
    env: dict[str, str] = field(default_factory=dict)
    host: str = "127.0.0.1"
    process: Process | None = None

    def start(self) -> None:
        self.process = process = Process(self.argv, self.log, self.env)
        process.launch()

        def listening() -> bool:
            process.check_running(self.kind)
            try:
                with socket.create_connection((self.host, self.port), timeout=0.5):
                    return True
            except OSError:
                return False

        try:
            wait_until(
                f"{self.kind} to listen on {self.host}:{self.port}",
                listening,
                START_TIMEOUT_S,
                0.1,
                process.output,
            )
        except AssertionError as exc:
            raise RuntimeError(str(exc)) from None

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop(grace_s=10)

    def pause(self) -> None:
        """The store stops answering (SIGSTOP) but keeps what it holds."""
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGCONT)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def new_bucket(self) -> str:
        """A fresh, empty bucket (container) on the server."""
        name = f"resolute-{uuid.uuid4().hex[:12]}"
        if self.kind == "s3":
            s3_client(self).create_bucket(Bucket=name)
        elif self.kind == "gcs":
            gcs_client(self).create_bucket(name)
        else:
            azure_service(self).create_container(name)
        return name

    def storage_config(self, bucket: str, prefix: str = "") -> dict[str, Any]:
        """The experiment's checkpoint_storage for this server and bucket."""
        if self.kind == "s3":
            config: dict[str, Any] = {
                "type": "s3",
                "bucket": bucket,
                "endpoint_url": self.url,
                "access_key": S3_KEYS[0],
                "secret_key": S3_KEYS[1],
            }
            if prefix:
                config["prefix"] = prefix
            return config
        if self.kind == "gcs":
            config = {"type": "gcs", "bucket": bucket}
            if prefix:
                config["prefix"] = prefix
            return config
        return {"type": "azure", "container": bucket, "connection_string": azurite_connection(self)}

    def keys(self, bucket: str) -> dict[str, int]:
        """Every object in the bucket and its size, read from the store itself."""
        if self.kind == "s3":
            pages = s3_client(self).get_paginator("list_objects_v2").paginate(Bucket=bucket)
            return {o["Key"]: o["Size"] for page in pages for o in page.get("Contents", [])}
        if self.kind == "gcs":
            return {b.name: b.size for b in gcs_client(self).list_blobs(bucket)}
        container = azure_service(self).get_container_client(bucket)
        return {b.name: b.size for b in container.list_blobs()}


def azurite_connection(server: StoreServer) -> str:
    return (
        f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
        f"BlobEndpoint={server.url}/{AZURITE_ACCOUNT};"
    )


def s3_client(server: StoreServer) -> Any:
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=server.url,
        aws_access_key_id=S3_KEYS[0],
        aws_secret_access_key=S3_KEYS[1],
        region_name="us-east-1",
    )


def gcs_client(server: StoreServer) -> Any:
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    os.environ["STORAGE_EMULATOR_HOST"] = server.url
    return storage.Client(project="resolute", credentials=AnonymousCredentials())


def azure_service(server: StoreServer) -> Any:
    from azure.storage.blob import BlobServiceClient

    return BlobServiceClient.from_connection_string(azurite_connection(server))


def _bin(name: str) -> str | None:
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.exists() else shutil.which(name)


def server_argv(kind: str, port: int, data_dir: Path, host: str) -> list[str] | str:
    """How to start a server, or why it cannot start here."""
    if kind == "s3":
        found = _bin("moto_server")
        if found is None:
            return "moto_server not installed (pip install 'moto[server]')"
        return [found, "-H", host, "-p", str(port)]
    if kind == "gcs":
        found = _bin("gcp-storage-emulator")
        if found is None:
            return "gcp-storage-emulator not installed (pip install gcp-storage-emulator)"
        return [found, "start", "--host", host, "--port", str(port), "--in-memory"]
    if not AZURITE.exists() or shutil.which("node") is None:
        return f"Azurite not installed at {AZURITE} (make azurite: npm install azurite)"
    return [
        str(AZURITE),
        "--blobHost",
        host,
        "--blobPort",
        str(port),
        "--location",
        str(data_dir),
        "--skipApiVersionCheck",
        "--silent",
    ]


def start_server(kind: str, work: Path, host: str = "127.0.0.1") -> StoreServer | str:
    """A running server of `kind` listening on `host` (loopback, or a test bridge that
    agents in network namespaces reach), or the reason there is none."""
    port = free_port()
    data_dir = work / f"{kind}-data"
    data_dir.mkdir(parents=True, exist_ok=True)
    argv = server_argv(kind, port, data_dir, host)
    if isinstance(argv, str):
        return argv
    env = {"STORAGE_EMULATOR_HOST": f"http://{host}:{port}"} if kind == "gcs" else {}
    server = StoreServer(kind, argv, port, work / f"{kind}.log", env, host=host)
    try:
        server.start()
    except (OSError, RuntimeError) as exc:
        server.stop()
        return f"{kind} server did not start: {exc}"
    return server
