"""`det-master certs` and the TLS settings of the master, the agent and the clients: the
certificates hold what was asked for and verify, keys stay private, bad files are refused
at start naming the setting."""

from __future__ import annotations

import ipaddress
import json
import logging
import ssl
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from pydantic import ValidationError

from agent import bootstrap
from agent.settings import AgentSettings
from cli.client import MasterClient
from cli.errors import CliError
from master import certs
from master.main import announce_transport
from master.settings import MasterSettings, TlsSettings

DET_MASTER = Path(sys.executable).parent / "det-master"


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> certs.CertFiles:
    out = tmp_path_factory.mktemp("certs") / "tls"
    return certs.generate(out, ["master.example", "10.1.2.3", "localhost", "::1"])


def _load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_the_master_certificate_names_every_host_asked_for(made: certs.CertFiles) -> None:
    cert = _load(made.master_cert)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["master.example", "localhost"]
    assert sans.get_values_for_type(x509.IPAddress) == [
        ipaddress.ip_address("10.1.2.3"),
        ipaddress.ip_address("::1"),
    ]
    usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert x509.oid.ExtendedKeyUsageOID.SERVER_AUTH in usage
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca


def test_the_master_certificate_is_signed_by_the_ca(made: certs.CertFiles) -> None:
    ca, cert = _load(made.ca_cert), _load(made.master_cert)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert cert.issuer == ca.subject
    cert.verify_directly_issued_by(ca)  # raises if the signature does not check out
    # And what a client does: a TLS handshake that verifies the chain and the name.
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(made.master_cert, made.master_key)
    client = ssl.create_default_context(cafile=str(made.ca_cert))
    _handshake(server, client, "master.example")
    with pytest.raises(ssl.SSLCertVerificationError, match=r"other\.example"):
        _handshake(server, client, "other.example")


def _handshake(server: ssl.SSLContext, client: ssl.SSLContext, name: str) -> None:
    server_in, server_out = ssl.MemoryBIO(), ssl.MemoryBIO()
    client_in, client_out = ssl.MemoryBIO(), ssl.MemoryBIO()
    s = server.wrap_bio(server_in, server_out, server_side=True)
    c = client.wrap_bio(client_in, client_out, server_hostname=name)
    for _ in range(10):
        done = 0
        for side in (c, s):
            try:
                side.do_handshake()
                done += 1
            except ssl.SSLWantReadError:
                pass
        server_in.write(client_out.read())
        client_in.write(server_out.read())
        if done == 2:
            return
    raise AssertionError("the handshake did not finish")


def test_keys_are_private_and_certificates_public(made: certs.CertFiles) -> None:
    for key in (made.ca_key, made.master_key):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600, key
    for cert in (made.ca_cert, made.master_cert):
        assert stat.S_IMODE(cert.stat().st_mode) == 0o644, cert
    key = made.master_key.read_bytes()
    assert b"ENCRYPTED" not in key  # the master reads it without a password
    assert isinstance(_load(made.master_cert).public_key(), ec.EllipticCurvePublicKey)


def test_existing_files_are_kept_unless_forced(tmp_path: Path) -> None:
    first = certs.generate(tmp_path, ["localhost"])
    before = first.ca_cert.read_bytes()
    first.master_key.chmod(0o644)
    with pytest.raises(certs.CertError, match=r"already holds ca\.crt, ca\.key, master\.crt"):
        certs.generate(tmp_path, ["localhost"])
    assert first.ca_cert.read_bytes() == before
    again = certs.generate(tmp_path, ["localhost"], force=True)
    assert again.ca_cert.read_bytes() != before
    # A replaced key does not keep the loose mode of the file it replaced.
    assert stat.S_IMODE(again.master_key.stat().st_mode) == 0o600


@pytest.mark.parametrize("host", ["bad host", "", "-x.example", "a..b"])
def test_a_bad_host_is_refused_naming_it(tmp_path: Path, host: str) -> None:
    with pytest.raises(certs.CertError, match="--host"):
        certs.generate(tmp_path / "out", [host])
    assert not (tmp_path / "out").exists()


def test_the_command_prints_the_settings_and_refuses_to_overwrite(tmp_path: Path) -> None:
    out = tmp_path / "tls"
    command = [str(DET_MASTER), "certs", "--out", str(out), "--host", "gpu-master.lan"]
    made = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert made.returncode == 0, made.stderr
    assert f"DET_MASTER_SECURITY__TLS__CERT_FILE={out / 'master.crt'}" in made.stdout
    assert f"--master-cert {out / 'ca.crt'}" in made.stdout
    assert "DET_MASTER=https://gpu-master.lan:8080" in made.stdout
    sans = _load(out / "master.crt").extensions.get_extension_for_class(x509.SubjectAlternativeName)
    assert sans.value.get_values_for_type(x509.DNSName) == ["gpu-master.lan"]
    before = (out / "master.key").read_bytes()
    again = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert again.returncode == 2
    assert again.stderr.strip().startswith("det-master certs: ")
    assert "--force" in again.stderr and "Traceback" not in again.stderr
    assert (out / "master.key").read_bytes() == before


# -- settings ----------------------------------------------------------------------------


def test_tls_comes_from_the_environment_and_makes_the_url_https(
    made: certs.CertFiles, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DET_MASTER_CONFIG_FILE", raising=False)
    assert MasterSettings().master_url == "http://127.0.0.1:8080"
    monkeypatch.setenv("DET_MASTER_SECURITY__TLS__CERT_FILE", str(made.master_cert))
    monkeypatch.setenv("DET_MASTER_SECURITY__TLS__KEY_FILE", str(made.master_key))
    settings = MasterSettings()
    assert settings.security.tls.enabled
    assert settings.master_url == "https://127.0.0.1:8080"  # what ranks are told
    with pytest.raises(ValidationError, match=r"external_url.*https"):
        MasterSettings(external_url="http://10.0.0.1:8080")


def test_cert_and_key_go_together(made: certs.CertFiles) -> None:
    with pytest.raises(ValidationError, match="key_file is not set: cert_file is"):
        TlsSettings(cert_file=made.master_cert)
    with pytest.raises(ValidationError, match="cert_file is not set: key_file is"):
        TlsSettings(key_file=made.master_key)


def test_unreadable_or_wrong_files_are_refused_naming_the_field(
    made: certs.CertFiles, tmp_path: Path
) -> None:
    missing = tmp_path / "nope.crt"
    with pytest.raises(ValidationError) as error:
        TlsSettings(cert_file=missing, key_file=made.master_key)
    assert error.value.errors()[0]["loc"] == ("cert_file",)
    assert f"cannot read {missing}" in str(error.value)
    with pytest.raises(ValidationError, match="no PEM private key") as error:
        TlsSettings(cert_file=made.master_cert, key_file=made.master_cert)
    assert error.value.errors()[0]["loc"] == ("key_file",)
    # The CA's key is a real key, but not the certificate's.
    with pytest.raises(ValidationError, match="are not a certificate and its key"):
        TlsSettings(cert_file=made.master_cert, key_file=made.ca_key)


def test_a_bad_pair_stops_det_master_with_one_line(made: certs.CertFiles, tmp_path: Path) -> None:
    env = {
        "PATH": "/usr/bin:/bin",
        "DET_MASTER_SECURITY__TLS__CERT_FILE": str(made.master_cert),
        "DET_MASTER_SECURITY__TLS__KEY_FILE": str(made.ca_key),
    }
    result = subprocess.run(
        [str(DET_MASTER), "--data-dir", str(tmp_path), "--port", "0"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr.startswith("det-master: setting security.tls: "), result.stderr
    assert "not a certificate and its key" in result.stderr
    assert "Traceback" not in result.stderr


def test_the_agent_checks_its_ca_file(made: certs.CertFiles, tmp_path: Path) -> None:
    settings = AgentSettings(master_cert_file=made.ca_cert, master_cert_name="master.example")
    assert settings.master_cert_file == made.ca_cert
    with pytest.raises(ValidationError, match="cannot read") as error:
        AgentSettings(master_cert_file=tmp_path / "missing.crt")
    assert error.value.errors()[0]["loc"] == ("master_cert_file",)
    with pytest.raises(ValidationError, match="no PEM certificate") as error:
        AgentSettings(master_cert_file=made.ca_key)
    with pytest.raises(ValidationError, match="needs master_cert_file") as error:
        AgentSettings(master_cert_name="master.example")
    assert error.value.errors()[0]["loc"] == ("master_cert_name",)


def test_det_reads_its_ca_only_for_https_masters(
    made: certs.CertFiles, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DET_MASTER_CERT_FILE", str(tmp_path / "missing.crt"))
    MasterClient("http://127.0.0.1:8080", None).close()  # plain http: not read at all
    with pytest.raises(CliError, match=r"^DET_MASTER_CERT_FILE=.*missing.crt: cannot read it"):
        MasterClient("https://127.0.0.1:8080", None)
    monkeypatch.setenv("DET_MASTER_CERT_FILE", str(made.master_key))
    with pytest.raises(CliError, match="no PEM certificate"):
        MasterClient("https://127.0.0.1:8080", None)
    monkeypatch.setenv("DET_MASTER_CERT_FILE", "noverify")
    client = MasterClient("https://127.0.0.1:8080", None)
    assert client.tls is not None and client.tls.verify is False
    client.close()


def test_determined_runs_get_the_ca_in_their_cluster_info(
    made: certs.CertFiles, tmp_path: Path
) -> None:
    """What Determined's harness reads in a per-agent run: cluster.json names the agent's
    CA, copied into the run's /run/determined, readable by ranks of another user."""
    cluster = json.dumps({"master_url": "https://m:8080", "master_cert_file": None})
    bootstrap.write_info(tmp_path, {"cluster.json": cluster}, [], made.ca_cert, "m.example")
    info = json.loads((tmp_path / "info" / "cluster.json").read_text())
    assert info["master_cert_file"] == "/run/determined/etc/ssl/master.crt"
    assert info["master_cert_name"] == "m.example"
    copied = tmp_path / "etc" / "ssl" / "master.crt"
    assert copied.read_bytes() == made.ca_cert.read_bytes()
    assert stat.S_IMODE(copied.stat().st_mode) == 0o644


@pytest.mark.parametrize(
    ("host", "level", "says"),
    [
        ("127.0.0.1", logging.INFO, "(loopback only: fine for development)"),
        ("0.0.0.0", logging.WARNING, "tokens and the join token cross the network in the clear"),
    ],
)
def test_plain_http_is_announced_at_start(
    host: str, level: int, says: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="master")
    announce_transport(MasterSettings(host=host, agent_link={"host": host}))
    [record] = [r for r in caplog.records if r.name == "master"]
    assert record.levelno == level
    assert record.getMessage().startswith(f"TLS off: plain HTTP on {host}:8080"), record
    assert says in record.getMessage()


def test_a_key_others_can_read_is_warned_about(
    made: certs.CertFiles, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    key = tmp_path / "master.key"
    key.write_bytes(made.master_key.read_bytes())
    key.chmod(0o644)
    caplog.set_level(logging.INFO, logger="master")
    tls = {"tls": {"cert_file": made.master_cert, "key_file": key}}
    announce_transport(MasterSettings(security=tls))
    messages = [r.getMessage() for r in caplog.records if r.name == "master"]
    assert messages[0] == f"security.tls.key_file {key} is readable by other users; chmod 600 it"
    assert messages[1].startswith("TLS on: https on 127.0.0.1:8080")
