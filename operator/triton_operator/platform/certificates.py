"""The admission webhook's serving certificate: a self-signed CA and a leaf for the webhook Service's names,
issued in memory at start-up and renewed before it expires (no cert-manager needed)."""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass

CERT_VALIDITY = dt.timedelta(days=365)
RENEW_AFTER = dt.timedelta(days=240)  # two thirds of the validity


@dataclass(frozen=True)
class Issued:
    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes
    not_after: dt.datetime


def issue_certificate(hosts: list[str], now: dt.datetime | None = None) -> Issued:
    """A new self-signed CA and a serving certificate signed by it for `hosts` (DNS names or IPs)."""
    # Here, not at the top: cryptography's x509 is 7 MB of the operator's memory, and only a webhook without a
    # mounted certificate (`--webhook-cert-dir`) issues one (issue 17).
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = now or dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "triton-operator webhook CA")])
    ca = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + CERT_VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                                     key_encipherment=False, data_encipherment=False, key_agreement=False,
                                     encipher_only=False, decipher_only=False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = []
    for h in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            sans.append(x509.DNSName(h))
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "triton-operator webhook")]))  # names: SANs
        .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + CERT_VALIDITY)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    return Issued(
        ca.public_bytes(pem), cert.public_bytes(pem),
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
        now + CERT_VALIDITY,
    )
