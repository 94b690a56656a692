"""`det-master certs`: a self-signed CA and a master certificate it signs, for a quick start
with TLS. A production cluster would rather use its own CA; these files are what the master
(`security.tls`), the agents (`--master-cert`) and the clients (`DET_MASTER_CERT_FILE`) take."""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_DAYS = 10 * 365
# Browsers cap server certificates at about 13 months; other clients do not. Ours rotate by
# running the command again with --force.
MASTER_DAYS = 825

_DNS_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")


class CertError(Exception):
    """One line for the user; `det-master certs` exits 2."""


@dataclass(frozen=True)
class CertFiles:
    ca_cert: Path
    ca_key: Path
    master_cert: Path
    master_key: Path

    def all(self) -> list[Path]:
        return [self.ca_cert, self.ca_key, self.master_cert, self.master_key]


def default_hosts() -> list[str]:
    hosts = ["localhost", "127.0.0.1"]
    name = socket.gethostname()
    if name and name not in hosts:
        hosts.append(name)
    return hosts


def _subject_names(hosts: list[str]) -> list[x509.GeneralName]:
    """The SubjectAlternativeName entries; a bad host raises CertError naming it."""
    names: list[x509.GeneralName] = []
    for host in hosts:
        text = host.strip().strip("[]")
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(text)))
            continue
        except ValueError:
            pass
        labels = text.rstrip(".").split(".")
        if labels and labels[0] == "*":  # a wildcard covers one leftmost label
            labels = labels[1:]
        if not text or not labels or not all(_DNS_LABEL.match(label) for label in labels):
            raise CertError(f"--host {host!r} is neither an IP address nor a DNS name")
        names.append(x509.DNSName(text.rstrip(".").lower()))
    if not names:
        raise CertError("--host: give at least one host name or IP address")
    return names


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _write(path: Path, data: bytes, mode: int) -> None:
    # A new file, created with its final mode: a key is never readable by others, even for a
    # moment, and --force does not inherit the mode of the file it replaces.
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    os.chmod(path, mode)  # the umask may have taken bits off a certificate's 0644


def generate(
    out: Path,
    hosts: list[str],
    *,
    force: bool = False,
    now: datetime.datetime | None = None,
) -> CertFiles:
    """Write ca.crt, ca.key, master.crt and master.key into `out`. Refuses (CertError) to
    replace any of them unless `force`; checks everything before writing anything."""
    files = CertFiles(out / "ca.crt", out / "ca.key", out / "master.crt", out / "master.key")
    names = _subject_names(hosts)
    if out.exists() and not out.is_dir():
        raise CertError(f"--out {out} is not a directory")
    existing = [p.name for p in files.all() if p.exists()]
    if existing and not force:
        raise CertError(
            f"{out} already holds {', '.join(existing)}; pass --force to replace them "
            "(agents and clients must then be given the new ca.crt)"
        )
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CertError(f"--out {out}: cannot create it: {exc.strerror}") from None

    start = (now or datetime.datetime.now(datetime.UTC)) - datetime.timedelta(minutes=5)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "resolute"),
            x509.NameAttribute(NameOID.COMMON_NAME, f"resolute CA ({socket.gethostname()})"),
        ]
    )
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + datetime.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(ca_ski, critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    master_key = ec.generate_private_key(ec.SECP256R1())
    common_name = hosts[0].strip().strip("[]")[:64]
    master_cert = (
        x509.CertificateBuilder()
        .subject_name(
            x509.Name(
                [
                    x509.NameAttribute(NameOID.ORGANIZATION_NAME, "resolute"),
                    x509.NameAttribute(NameOID.COMMON_NAME, common_name),
                ]
            )
        )
        .issuer_name(ca_name)
        .public_key(master_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + datetime.timedelta(days=MASTER_DAYS))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        # Hostname checks read only the SANs (RFC 6125); the CN is for people.
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(master_key.public_key()), critical=False
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )

    _write(files.ca_key, _key_pem(ca_key), 0o600)
    _write(files.ca_cert, ca_cert.public_bytes(serialization.Encoding.PEM), 0o644)
    _write(files.master_key, _key_pem(master_key), 0o600)
    _write(files.master_cert, master_cert.public_bytes(serialization.Encoding.PEM), 0o644)
    return files


def usage(files: CertFiles, hosts: list[str]) -> str:
    """What to do with the files: the settings and flags of the master, agents and clients."""
    host = hosts[0].strip()
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return "\n".join(
        [
            f"wrote {files.ca_cert} and {files.ca_key} (the CA: keep ca.key private, "
            f"it can sign more certificates)",
            f"wrote {files.master_cert} and {files.master_key} for {', '.join(hosts)}",
            "",
            "master (settings file: security.tls.cert_file / key_file, or the environment):",
            f"  DET_MASTER_SECURITY__TLS__CERT_FILE={files.master_cert.resolve()}",
            f"  DET_MASTER_SECURITY__TLS__KEY_FILE={files.master_key.resolve()}",
            "agents (copy ca.crt to each; DET_AGENT_MASTER_CERT_FILE):",
            f"  det-agent --master {host}:8090 --master-cert {files.ca_cert.resolve()}",
            "det and Determined's det client:",
            f"  DET_MASTER=https://{host}:8080 DET_MASTER_CERT_FILE={files.ca_cert.resolve()}",
        ]
    )
