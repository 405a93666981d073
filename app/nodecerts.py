"""A node's TLS identity for ``edgesched install``: check the files given, or issue from a CA.

Role: before an install writes anything, make sure the certificate a gateway admin hands over
is the one that will work: a client certificate whose name is the node id (the broker takes
it as the MQTT username and client id, see :mod:`edgesched.sync.security`), signed by the CA
given, not expired, with its private key next to it. Or issue one from the fleet CA made by
``edgesched certs init``, keeping an installed certificate that is still good so a re-install
changes nothing. Errors are :class:`CertError` naming the file and what is wrong with it.
"""

from __future__ import annotations

import datetime as dt
import tempfile
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

#: An installed certificate closer to its expiry than this is renewed by a re-install.
RENEW_BEFORE = dt.timedelta(days=30)


class CertError(ValueError):
    """A certificate, key or CA that cannot be used; the message names it."""


@dataclass(frozen=True, slots=True)
class NodeCerts:
    """PEM bytes of the CA certificate, the node's certificate and its private key."""

    ca: bytes
    cert: bytes
    key: bytes
    reused: bool  # the installed certificate was kept


def read_file(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise CertError(f"{what} {path}: no such file") from None
    except OSError as exc:
        raise CertError(f"{what} {path}: cannot read: {exc.strerror or exc}") from None


def load_cert(pem: bytes, label: str) -> x509.Certificate:
    try:
        return x509.load_pem_x509_certificate(pem)
    except ValueError:
        raise CertError(f"{label}: not a PEM certificate") from None


def check_ca(pem: bytes, label: str) -> x509.Certificate:
    """The CA certificate in ``pem`` (CertError if it is not one)."""
    ca = load_cert(pem, label)
    try:
        basic = ca.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        basic = None
    if basic is None or not basic.ca:
        raise CertError(f"{label}: not a CA certificate")
    return ca


def check_leaf(
    cert_pem: bytes,
    key_pem: bytes,
    ca: x509.Certificate,
    identity: str,
    cert_label: str,
    key_label: str,
) -> x509.Certificate:
    """``cert_pem`` is a client certificate for ``identity`` signed by ``ca``, not expired,
    and ``key_pem`` is its unencrypted private key; else CertError."""
    cert = load_cert(cert_pem, cert_label)
    try:
        private = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError) as exc:
        raise CertError(f"{key_label}: not an unencrypted PEM private key ({exc})") from None
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    cn = names[0].value if names else ""
    if cn != identity:
        raise CertError(
            f"{cert_label}: issued to {cn!r}, not to {identity!r} (the broker takes the "
            "certificate's name as the node's MQTT identity)"
        )
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        raise CertError(f"{cert_label}: not signed by the CA given") from None
    der, spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    if private.public_key().public_bytes(der, spki) != cert.public_key().public_bytes(der, spki):
        raise CertError(f"{key_label}: not the private key of {cert_label}")
    if cert.not_valid_after_utc <= dt.datetime.now(dt.UTC):
        raise CertError(f"{cert_label}: expired on {cert.not_valid_after_utc:%Y-%m-%d}")
    try:
        usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        return cert
    if ExtendedKeyUsageOID.CLIENT_AUTH not in usage:
        raise CertError(f"{cert_label}: not a client certificate (a broker's?)")
    return cert


def from_files(ca: Path, cert: Path, key: Path, identity: str) -> NodeCerts:
    """The three files an admin was given, checked."""
    ca_pem = read_file(ca, "--ca")
    ca_cert = check_ca(ca_pem, f"--ca {ca}")
    cert_pem, key_pem = read_file(cert, "--cert"), read_file(key, "--key")
    check_leaf(cert_pem, key_pem, ca_cert, identity, f"--cert {cert}", f"--key {key}")
    return NodeCerts(ca_pem, cert_pem, key_pem, reused=False)


def from_ca_dir(
    ca_dir: Path, identity: str, installed: tuple[bytes, bytes] | None = None
) -> NodeCerts:
    """Issue ``identity``'s client certificate from the CA in ``ca_dir`` (``ca.crt`` and
    ``ca.key``), unless ``installed`` (cert, key) is still good for it: signed by this CA,
    for this identity, and further than :data:`RENEW_BEFORE` from expiry."""
    from edgesched.sync.security import issue, load_ca

    try:
        ca = load_ca(ca_dir)
    except FileNotFoundError as exc:
        raise CertError(
            f"--ca-dir {ca_dir}: {exc} (make one with `edgesched certs init`)"
        ) from None
    ca_pem = read_file(ca.cert, "--ca-dir")
    ca_cert = check_ca(ca_pem, f"--ca-dir {ca.cert}")
    if installed is not None:
        try:
            old = check_leaf(*installed, ca_cert, identity, "installed cert", "installed key")
        except CertError:
            pass
        else:
            if old.not_valid_after_utc - dt.datetime.now(dt.UTC) > RENEW_BEFORE:
                return NodeCerts(ca_pem, installed[0], installed[1], reused=True)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            files = issue(ca, identity, Path(tmp))
        except (ValueError, OSError) as exc:
            raise CertError(f"--ca-dir {ca_dir}: cannot issue a certificate: {exc}") from None
        return NodeCerts(ca_pem, files.cert.read_bytes(), files.key.read_bytes(), reused=False)
