"""The webhook's self-issued certificate, checked the way the API server checks it: a TLS handshake that
trusts only the issued CA and verifies the host name, for a Service name longer than a CN may be."""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import ssl
import tempfile
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from triton_operator.platform.certificates import CERT_VALIDITY, issue_certificate
from triton_operator.platform.namespaces import exact_namespaces, missed, watches
from triton_operator.render.webhook import WebhookTarget


async def _handshake(issued, server_name: str) -> str:  # type: ignore[no-untyped-def]
    with tempfile.TemporaryDirectory() as d:
        cert, key = Path(d) / "tls.crt", Path(d) / "tls.key"
        cert.write_bytes(issued.cert_pem)
        key.write_bytes(issued.key_pem)
        server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server_ctx.load_cert_chain(cert, key)

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.write(b"ok")
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=server_ctx)
        port = server.sockets[0].getsockname()[1]
        client_ctx = ssl.create_default_context(cadata=issued.ca_pem.decode())
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_ctx,
                                                           server_hostname=server_name)
            data = await reader.read()
            writer.close()
            return data.decode()
        finally:
            server.close()
            await server.wait_closed()


def test_a_long_service_name_is_served_and_verified() -> None:
    target = WebhookTarget(service_namespace="namespaced-install-reconciles-add-sub-un-a202c-op",
                           service_name="tro-triton-operator-webhook")
    issued = issue_certificate(target.hosts())
    assert asyncio.run(_handshake(issued, target.hosts()[0])) == "ok"
    cert = x509.load_pem_x509_certificate(issued.cert_pem)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    assert sans == target.hosts()
    assert cert.not_valid_after_utc - dt.datetime.now(dt.UTC) > CERT_VALIDITY - dt.timedelta(hours=1)


def test_an_ip_url_is_served_and_another_name_is_refused() -> None:
    target = WebhookTarget(url="https://127.0.0.1:9443")
    issued = issue_certificate(target.hosts())
    assert asyncio.run(_handshake(issued, "127.0.0.1")) == "ok"
    with pytest.raises(ssl.SSLCertVerificationError):
        asyncio.run(_handshake(issued, "example.invalid"))


def test_another_ca_is_not_trusted() -> None:
    hosts = ["127.0.0.1"]
    first, second = issue_certificate(hosts), issue_certificate(hosts)
    mixed = type(first)(second.ca_pem, first.cert_pem, first.key_pem, first.not_after)
    with pytest.raises(ssl.SSLCertVerificationError):
        asyncio.run(_handshake(mixed, "127.0.0.1"))


def test_namespace_patterns_match_like_kopf() -> None:
    ours = watches(["op-*", "!op-private"], clusterwide=False)
    assert ours("op-a") and not ours("op-private") and not ours("default")
    assert watches([], clusterwide=True)("anything")
    assert exact_namespaces(["team-a", "team-b"], False) == ["team-a", "team-b"]
    assert exact_namespaces(["op-*"], False) is None and exact_namespaces([], True) is None


def test_missed_namespaces_are_the_live_matching_ones_not_served() -> None:
    ours = watches(["op-*", "!op-private"], clusterwide=False)
    listed = {"op-a": False, "op-b": False, "op-gone": True, "op-private": False, "default": False}
    assert missed(listed, {"op-a"}, ours) == {"op-b"}
    assert missed(listed, {"op-a", "op-b"}, ours) == set()


# -- the chart's certificate, shared by every replica (--webhook-cert-dir) ------------------------------


def _served_certificate(port: int, ca_pem: bytes) -> x509.Certificate:
    """The certificate a TLS handshake with 127.0.0.1:`port` gets, verified against `ca_pem`."""
    import socket
    import ssl

    ctx = ssl.create_default_context(cadata=ca_pem.decode())
    ctx.check_hostname = False  # the name is checked below, on the certificate itself
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, ctx.wrap_socket(raw) as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der)


def test_a_mounted_certificate_is_served_as_is_and_reloaded_when_the_secret_changes(tmp_path: Path) -> None:
    import asyncio

    from triton_operator.render.webhook import WebhookTarget
    from triton_operator.servers.webhook import AdmissionWebhook
    from triton_operator.triton.local import free_port

    hosts = ["trop-webhook.triton-system.svc"]
    first, second = issue_certificate(hosts), issue_certificate(hosts)
    (tmp_path / "tls.crt").write_bytes(first.cert_pem)
    (tmp_path / "tls.key").write_bytes(first.key_pem)
    port = free_port()

    from tests.webhook_server import FakeModelsApi

    class NoWrites(FakeModelsApi):  # the chart's mode writes nothing (it reads TritonModels: its own watch)
        def __getattribute__(self, name: str) -> Any:
            if name in ("apply_cluster", "json_patch_cluster", "delete_cluster", "apply", "create", "replace"):
                raise AssertionError(f"the webhook called the API ({name}) in --webhook-cert-dir mode")
            return super().__getattribute__(name)

    async def run() -> tuple[x509.Certificate, x509.Certificate]:
        webhook = AdmissionWebhook(NoWrites(), WebhookTarget(service_namespace="triton-system", service_name="trop-webhook"),  # type: ignore[arg-type]
                                   configuration="trop", failure_policy="Fail", namespaces=[], clusterwide=True,
                                   address="127.0.0.1", port=port, cert_dir=str(tmp_path))
        await webhook.start()
        try:
            before = await asyncio.to_thread(_served_certificate, port, first.ca_pem)
            (tmp_path / "tls.crt").write_bytes(second.cert_pem)  # the kubelet updates a Secret's files in place
            (tmp_path / "tls.key").write_bytes(second.key_pem)
            os.utime(tmp_path / "tls.crt", (1e9, 2e9))
            webhook._load_mounted()  # what the reload loop does every minute
            after = await asyncio.to_thread(_served_certificate, port, second.ca_pem)
            return before, after
        finally:
            webhook._renewal and webhook._renewal.cancel()
            webhook.informer.stop()
            if webhook._runner:
                await webhook._runner.cleanup()

    before, after = asyncio.run(run())
    assert before.serial_number == x509.load_pem_x509_certificate(first.cert_pem).serial_number
    assert after.serial_number == x509.load_pem_x509_certificate(second.cert_pem).serial_number
