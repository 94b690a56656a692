"""TLS end to end: certificates from `det-master certs`, a det-master serving https and TLS
gRPC, a det-agent that verifies it with the CA, our `det` and Determined's official client
over https, and trial ranks that report to the master over https (the resolute library and
Determined's Core API). And the refusals: plain HTTP to the https port, a plaintext agent,
an agent that trusts another CA, a client that trusts nothing but the system's CAs."""

from __future__ import annotations

import os
import re
import shutil
import socket
import ssl
import subprocess
import time
import warnings
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.cluster import DET_MASTER_BIN, START_TIMEOUT_S, AgentProcess
from resolute._api import MasterError, Session
from tests.conftest import require
from tests.e2e.agents import create_experiment, trial_logs, wait_trial_state, write_experiment
from tests.e2e.conftest import (
    OUR_DET,
    MasterProcess,
    describe_run,
    ok,
    unique,
)

pytestmark = pytest.mark.e2e

WORKLOADS = Path(__file__).resolve().parent / "determined_workloads"


def make_certs(out: Path) -> Path:
    """`det-master certs` as a user runs it; returns the directory."""
    ok(
        subprocess.run(
            [str(DET_MASTER_BIN), "certs", "--out", str(out)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    )
    return out


class TlsMaster(MasterProcess):
    """A det-master with security.tls set, at an https:// URL. The harness's own requests
    and both det clients trust the test CA only while they run, so nothing started
    meanwhile (an agent, its ranks) inherits that trust: they must get it their own way."""

    def __init__(self, data_dir: Path, certs: Path) -> None:
        super().__init__(
            data_dir,
            label="tls",
            env={
                "DET_MASTER_SECURITY__TLS__CERT_FILE": str(certs / "master.crt"),
                "DET_MASTER_SECURITY__TLS__KEY_FILE": str(certs / "master.key"),
            },
            scheme="https",
        )
        self.ca = certs / "ca.crt"

    @contextmanager
    def _trusting(self) -> Iterator[None]:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("SSL_CERT_FILE", str(self.ca))  # httpx, for http() and start()
            patch.setenv("DET_MASTER_CERT_FILE", str(self.ca))  # our det and Determined's
            # requests would prefer these to DET_MASTER_CERT_FILE in Determined's client.
            patch.delenv("REQUESTS_CA_BUNDLE", raising=False)
            patch.delenv("CURL_CA_BUNDLE", raising=False)
            yield

    def start(self, timeout: float = START_TIMEOUT_S) -> None:
        with self._trusting():
            super().start(timeout)

    def http(self, method: str, path: str, **kwargs: Any) -> Any:
        with self._trusting():
            return super().http(method, path, **kwargs)

    def det(self, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        with self._trusting():
            return super().det(*args, **kwargs)

    def official(self, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        with self._trusting():
            return super().official(*args, **kwargs)


@dataclass
class Cluster:
    master: TlsMaster
    agent: AgentProcess
    certs: Path
    other_certs: Path  # a second CA, which did not sign the master's certificate
    work: Path


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    work = tmp_path_factory.mktemp("tls")
    certs = make_certs(work / "certs")
    other = make_certs(work / "other-certs")
    with ExitStack() as stack:
        master = TlsMaster(work / "data", certs)
        stack.callback(shutil.rmtree, master.scratch, ignore_errors=True)
        stack.callback(master.stop)
        master.start()
        agent = AgentProcess(master, "tls-agent", work / "tls-agent", slots=1)
        agent.command += ["--master-cert", str(certs / "ca.crt")]
        stack.callback(agent.stop)
        agent.start().wait_connected()
        yield Cluster(master, agent, certs, other, work)


def test_the_master_says_it_serves_tls(cluster: Cluster) -> None:
    log = cluster.master.output(tail=200_000)
    assert re.search(r"INFO master: TLS on: https on 127\.0\.0\.1:\d+ and the agent port", log)
    assert re.search(r"agent gRPC server on 127\.0\.0\.1:\d+ \(TLS\)", log)


def test_our_det_lists_agents_and_runs_a_trial_that_reports_over_https(
    cluster: Cluster, tmp_path: Path
) -> None:
    listed = ok(cluster.master.det("agent", "list")).stdout
    assert "tls-agent" in listed, listed
    script = """
    import os
    import resolute

    url, cert = os.environ["DET_MASTER"], os.environ["DET_MASTER_CERT_FILE"]
    print("MASTER", url, "CERT", cert, open(cert).read().count("BEGIN CERTIFICATE"), flush=True)
    with resolute.init() as ctx:
        for step in range(1, 4):
            ctx.train.report_training_metrics(steps_completed=step, metrics={"loss": 1 / step})
        ctx.train.report_validation_metrics(steps_completed=3, metrics={"loss": 0.25})
    print("REPORTED", flush=True)
    """
    config, model = write_experiment(tmp_path, script, slots=1)
    experiment_id = create_experiment(cluster.master, config, model)
    trial = wait_trial_state(cluster.master, experiment_id, {"COMPLETED", "ERROR"}, timeout=120)
    logs = trial_logs(cluster.master, trial["id"])
    assert trial["state"] == "COMPLETED", logs
    # Ranks were told the https URL and given the agent's copy of its CA, nothing else.
    found = re.search(r"MASTER (\S+) CERT (\S+) (\d+)", logs)
    assert found, logs
    assert found[1] == cluster.master.url
    assert found[2].endswith(".det-master-ca.crt") and found[3] == "1", found[0]
    assert "REPORTED" in logs
    metrics = cluster.master.api(
        "GET", f"/api/v1/trials/{trial['id']}/metrics", params={"group": "training"}
    )["metrics"]
    assert [row["stepsCompleted"] for row in metrics] == [1, 2, 3]
    described = ok(cluster.master.det("experiment", "describe", str(experiment_id))).stdout
    assert "COMPLETED" in described.upper(), described


def test_the_official_client_works_over_https(cluster: Cluster) -> None:
    agents = ok(cluster.master.official("agent", "list")).stdout
    assert "tls-agent" in agents, agents
    ok(cluster.master.official("experiment", "list"))


def test_plain_http_to_the_https_port_gets_nothing(cluster: Cluster) -> None:
    with socket.create_connection(("127.0.0.1", cluster.master.port), timeout=10) as sock:
        sock.sendall(b"GET /api/v1/agents HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    assert b"200 OK" not in received and b"tls-agent" not in received, received[:300]


def test_tls_older_than_1_2_is_refused(cluster: Cluster) -> None:
    def handshake(newest: ssl.TLSVersion) -> str:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.load_verify_locations(cluster.master.ca)
        context.minimum_version = ssl.TLSVersion.TLSv1_1
        context.maximum_version = newest
        context.set_ciphers("DEFAULT:@SECLEVEL=0")  # let this client offer TLS 1.1 at all
        with (
            socket.create_connection(("127.0.0.1", cluster.master.port), timeout=10) as sock,
            context.wrap_socket(sock, server_hostname="127.0.0.1") as tls,
        ):
            return str(tls.version())

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # TLS 1.1 is deprecated, rightly
        assert handshake(ssl.TLSVersion.TLSv1_2) == "TLSv1.2"
        with pytest.raises(ssl.SSLError) as refused:
            handshake(ssl.TLSVersion.TLSv1_1)
    # The client did offer TLS 1.1 (it did not give up before sending anything).
    assert refused.value.reason != "NO_PROTOCOLS_AVAILABLE", refused.value


def _lines_about(agent: AgentProcess, text: str) -> list[str]:
    return [line for line in agent.output(tail=100_000).splitlines() if text in line]


def _refused_agent(cluster: Cluster, *extra: str, wait_for: str) -> AgentProcess:
    """An agent with the cluster's join token that must not get in; returned once its log
    shows two failed attempts (it keeps retrying, as for an unreachable master)."""
    agent_id = unique("refused")
    agent = AgentProcess(cluster.master, agent_id, cluster.work / agent_id, slots=1)
    agent.command += list(extra)
    agent.start()
    try:
        cluster.master.wait_for(
            f"{agent_id} to fail twice ({wait_for!r})",
            lambda: len(_lines_about(agent, wait_for)) >= 2 or None,
            timeout=60,
        )
        assert agent.proc is not None and agent.proc.poll() is None, agent.output()
    except BaseException:
        agent.stop()
        raise
    return agent


def _not_registered(cluster: Cluster, agent: AgentProcess) -> None:
    reply = cluster.master.http("GET", f"/api/v1/agents/{agent.id}")
    assert reply.status_code == 404, reply.text
    # Its Hello (the agent id, the join token) never reached the master's code.
    assert agent.id not in cluster.master.output(tail=1_000_000)


def test_a_plaintext_agent_is_not_registered(cluster: Cluster) -> None:
    agent = _refused_agent(cluster, wait_for="link to master")
    try:
        _not_registered(cluster, agent)
        assert "Traceback" not in agent.output(tail=100_000)
    finally:
        agent.stop()


def test_an_agent_that_trusts_another_ca_is_not_registered_and_says_why(
    cluster: Cluster,
) -> None:
    other_ca = cluster.other_certs / "ca.crt"
    agent = _refused_agent(
        cluster, "--master-cert", str(other_ca), wait_for="did not verify against"
    )
    try:
        _not_registered(cluster, agent)
        output = agent.output(tail=100_000)
        assert "Traceback" not in output, output
        line = _lines_about(agent, "did not verify against")[0]
        assert line.split(" agent.link: ", 1)[1] == (
            f"link to master {cluster.master.agent_address} broken: the master's certificate "
            f"did not verify against master_cert_file={other_ca}: unable to get local issuer "
            "certificate"
        ), line
    finally:
        agent.stop()


def test_det_without_the_ca_says_the_certificate_did_not_verify(cluster: Cluster) -> None:
    def det(**env: str) -> subprocess.CompletedProcess[str]:
        clean = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("DET_") and k not in ("SSL_CERT_FILE", "SSL_CERT_DIR")
        }
        clean.update({"DET_MASTER": cluster.master.url, "NO_COLOR": "1", **env})
        return subprocess.run(
            [str(OUR_DET), "agent", "list"],
            capture_output=True,
            text=True,
            env=clean,
            timeout=60,
            check=False,
        )

    untrusted = det()
    assert untrusted.returncode == 1, describe_run(untrusted)
    assert untrusted.stderr.strip() == (
        "Error: the master's certificate did not verify against the system's trusted CAs "
        "(set DET_MASTER_CERT_FILE to the cluster's CA file): unable to get local issuer "
        "certificate"
    ), describe_run(untrusted)
    ca = str(cluster.master.ca)
    wrong_name = det(DET_MASTER_CERT_FILE=ca, DET_MASTER_CERT_NAME="elsewhere.example")
    assert wrong_name.returncode == 1
    assert wrong_name.stderr.strip() == (
        f"Error: the master's certificate did not verify against DET_MASTER_CERT_FILE={ca} "
        "for the name 'elsewhere.example' (DET_MASTER_CERT_NAME): Hostname mismatch, "
        "certificate is not valid for 'elsewhere.example'."
    ), describe_run(wrong_name)
    # A name the certificate holds, checked instead of the URL's host.
    renamed = ok(det(DET_MASTER_CERT_FILE=ca, DET_MASTER_CERT_NAME="localhost"))
    assert "tls-agent" in renamed.stdout
    plain = det(DET_MASTER=cluster.master.url.replace("https://", "http://"))
    assert plain.returncode == 1
    assert "if the master serves https, use https://" in plain.stderr, describe_run(plain)


def test_determined_core_api_reports_over_https(cluster: Cluster, tmp_path: Path) -> None:
    venv = Path(os.environ.get("DET_TRIAL_VENV") or "")
    require(
        bool(os.environ.get("DET_TRIAL_VENV")) and (venv / "bin" / "python3").exists(),
        "no trial interpreter with determined: run `make trial-venv` and set DET_TRIAL_VENV",
    )
    require(
        "Determined-style (per-agent) launches are disabled" not in cluster.agent.output(),
        "this agent cannot run Determined-style launches (no namespaces)",
    )
    config = yaml.safe_load((WORKLOADS / "metrics.yaml").read_text())
    config.update(
        name=unique("tls-core-api"),
        entrypoint="python3 metrics.py --steps 5 --sleep 0.01",
        environment={"environment_variables": [f"PATH={venv}/bin:/usr/local/bin:/usr/bin:/bin"]},
    )
    path = tmp_path / "metrics.yaml"
    path.write_text(yaml.safe_dump(config))
    created = ok(cluster.master.official("experiment", "create", str(path), str(WORKLOADS)))
    experiment_id = int(re.findall(r"Created experiment (\d+)", created.stdout)[0])
    trial = wait_trial_state(cluster.master, experiment_id, {"COMPLETED", "ERROR"}, timeout=180)
    logs = trial_logs(cluster.master, trial["id"])
    assert trial["state"] == "COMPLETED", logs[-4000:] + "\n" + cluster.agent.output()
    training = cluster.master.api(
        "GET", f"/api/v1/trials/{trial['id']}/metrics", params={"group": "training"}
    )["metrics"]
    assert [row["stepsCompleted"] for row in training] == [1, 2, 3, 4, 5]
    metadata = cluster.master.api("GET", f"/api/v1/runs/{trial['id']}/metadata")["metadata"]
    assert metadata["steps"] == 5


def test_the_training_library_verifies_the_name_it_is_given(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """resolute's client as a rank runs it: DET_MASTER_CERT_NAME is the name checked, and a
    certificate that does not verify fails at once (no minute of retries) saying why."""
    monkeypatch.setenv("DET_MASTER_CERT_FILE", str(cluster.master.ca))
    monkeypatch.setenv("DET_MASTER_CERT_NAME", "localhost")
    session = Session(cluster.master.url, None, retry_for_s=30)
    try:
        assert session.request("GET", "/info")["clusterName"]
    finally:
        session.close()
    monkeypatch.setenv("DET_MASTER_CERT_NAME", "elsewhere.example")
    session = Session(cluster.master.url, None, retry_for_s=30)
    started = time.monotonic()
    try:
        with pytest.raises(MasterError, match="did not verify against DET_MASTER_CERT_FILE="):
            session.request("GET", "/info")
    finally:
        session.close()
    assert time.monotonic() - started < 5
