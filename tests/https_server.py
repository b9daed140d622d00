"""A real HTTPS server on 127.0.0.1 for the `fetch` tests: a throwaway CA (made with `cryptography`), a server
certificate for 127.0.0.1 signed by it, and http.server answering from a dict of pages. Clients trust the CA
through `SSL_CERT_FILE`, the standard OpenSSL variable fetch's https:// client honours (a replica has no volume for
a private CA's bundle: users' servers need a publicly trusted certificate)."""

from __future__ import annotations

import datetime as dt
import io
import ipaddress
import ssl
import tarfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID


@dataclass
class Page:
    """What one path answers: a body (status 200), a redirect (`location`, 302), an error status, or a body
    cut short (`truncate`: Content-Length says the whole body, the connection closes after this many bytes).
    `length=False` sends no Content-Length (the body ends when the connection closes); `drip` sends the body one
    byte at a time, this many seconds apart (a source that is slow on purpose)."""

    body: bytes = b""
    status: int = 200
    location: str | None = None
    truncate: int | None = None
    length: bool = True
    drip: float | None = None


@dataclass
class HttpsServer:
    ca_file: Path
    port: int
    pages: dict[str, Page] = field(default_factory=dict)
    requests: list[str] = field(default_factory=list)
    host: str = "127.0.0.1"

    def url(self, path: str) -> str:
        return f"https://{self.host}:{self.port}{path}"

    def __setitem__(self, path: str, page: bytes | Page) -> None:
        self.pages[path] = page if isinstance(page, Page) else Page(page)


def _certificates(directory: Path, names: list[x509.GeneralName] | None = None,
                  ca_files: tuple[Path, Path] | None = None) -> tuple[Path, Path, Path]:
    """(CA certificate, server certificate, server key) files, the server's valid for `names` (IP 127.0.0.1), signed
    by a new CA, or by the CA of `ca_files` (its certificate and key: an e2e cluster's, which every pod trusts through
    its service account's ca.crt)."""
    now = dt.datetime.now(dt.UTC)
    if ca_files is not None:
        ca = x509.load_pem_x509_certificate(ca_files[0].read_bytes())
        loaded = serialization.load_pem_private_key(ca_files[1].read_bytes(), password=None)
        assert isinstance(loaded, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey), type(loaded)
        return _leaf(directory, names, ca, loaded, now)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "triton-operator test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
          .not_valid_after(now + dt.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                                       key_encipherment=False, data_encipherment=False, key_agreement=False,
                                       encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    return _leaf(directory, names, ca, ca_key, now)


def _leaf(directory: Path, names: list[x509.GeneralName] | None, ca: x509.Certificate,
          ca_key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey, now: dt.datetime) -> tuple[Path, Path, Path]:
    ca_name = ca.subject
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])).issuer_name(ca_name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(names or [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    ca_file, cert_file, key_file = directory / "ca.pem", directory / "server.pem", directory / "server.key"
    ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return ca_file, cert_file, key_file


def serve(directory: Path, host: str = "127.0.0.1", ca_files: tuple[Path, Path] | None = None) -> Iterator[HttpsServer]:
    """Runs the server on `host` (an IP address; its certificate names it, signed by a new CA or by `ca_files`'s)
    until the generator is closed (use as a pytest fixture body)."""
    ca_file, cert_file, key_file = _certificates(directory, [x509.IPAddress(ipaddress.ip_address(host))], ca_files)
    state = HttpsServer(ca_file, 0, host=host)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            state.requests.append(self.path)
            page = state.pages.get(self.path.split("?", 1)[0])
            if page is None:
                self.send_error(404, "Not Found")
                return
            if page.location is not None:
                self.send_response(302)
                self.send_header("Location", page.location)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if page.status != 200:
                self.send_error(page.status)
                return
            self.send_response(200)
            if page.length:
                self.send_header("Content-Length", str(len(page.body)))
            self.end_headers()
            body = page.body[: page.truncate] if page.truncate is not None else page.body
            pieces = [body] if page.drip is None else [body[i:i + 1] for i in range(len(body))]
            try:
                for piece in pieces:
                    self.wfile.write(piece)
                    self.wfile.flush()
                    if page.drip is not None:
                        time.sleep(page.drip)  # the source's own pace, not a test's wait
            except (BrokenPipeError, ConnectionResetError, ssl.SSLError):  # the client gave up
                pass
            if page.truncate is not None or not page.length:
                self.close_connection = True

        def log_message(self, format: str, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer((host, 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_file, key_file)
    httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    state.port = httpd.server_address[1]
    thread = threading.Thread(target=httpd.serve_forever, name="https-server", daemon=True)
    thread.start()
    try:
        yield state
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(10)


def tgz(files: dict[str, bytes]) -> bytes:
    """A .tar.gz holding `files` (name -> bytes), as a model archive a source serves."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()
