"""The operator's own credential loader (`controller.kubeconfig`, issue 17: no `kubernetes` package in the operator
process): kubeconfigs and in-cluster ServiceAccounts on real temporary files, exec plugins as real scripts."""

# ruff: noqa: S105, S107 - the tokens and passwords here are test data

from __future__ import annotations

import base64
import datetime as dt
import json
import os
import stat
import sys
import textwrap
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from triton_operator.controller.kube import Kube
from triton_operator.controller.kubeconfig import (
    TOKEN_FILE_MAX_AGE,
    ConfigError,
    InCluster,
    KubeConfig,
    kubeconfig_paths,
    load,
)

CA = b"-----BEGIN CERTIFICATE-----\nCA\n-----END CERTIFICATE-----\n"
CERT = b"-----BEGIN CERTIFICATE-----\nCLIENT\n-----END CERTIFICATE-----\n"
KEY = b"-----BEGIN EC PRIVATE KEY-----\nKEY\n-----END EC PRIVATE KEY-----\n"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def kubeconfig(path: Path, *, cluster: dict[str, Any] | None = None, user: dict[str, Any] | None = None,
               current: str | None = "ctx", extra_contexts: list[dict[str, Any]] | None = None) -> Path:
    doc = {
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "c", "cluster": cluster or {"server": "https://127.0.0.1:6443"}}],
        "users": [{"name": "u", "user": user or {}}],
        "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}, *(extra_contexts or [])],
    }
    if current:
        doc["current-context"] = current
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc))
    return path


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_files_relative_to_the_kubeconfig_and_insecure(tmp_path: Path) -> None:
    conf = tmp_path / "conf"
    (conf / "pki").mkdir(parents=True)
    for name, data in (("ca.crt", CA), ("client.crt", CERT), ("client.key", KEY)):
        (conf / "pki" / name).write_bytes(data)
    path = kubeconfig(conf / "config", cluster={"server": "https://10.0.0.1:6443/", "certificate-authority": "pki/ca.crt",
                                                "tls-server-name": "kubernetes.default"},
                      user={"client-certificate": "pki/client.crt", "client-key": str(conf / "pki" / "client.key")})
    creds = KubeConfig([str(path)]).current()
    assert creds.server == "https://10.0.0.1:6443"
    assert creds.ca_path == str(conf / "pki" / "ca.crt")
    assert creds.certificate_path == str(conf / "pki" / "client.crt")
    assert creds.private_key_path == str(conf / "pki" / "client.key")
    assert creds.tls_server_name == "kubernetes.default" and not creds.insecure
    assert creds.authorization() is None

    insecure = KubeConfig([str(kubeconfig(tmp_path / "i", cluster={"server": "https://h", "insecure-skip-tls-verify": True}))])
    assert insecure.current().insecure


def test_data_values_are_written_to_private_files(tmp_path: Path) -> None:
    path = kubeconfig(tmp_path / "config", cluster={"server": "https://h:1", "certificate-authority-data": b64(CA)},
                      user={"client-certificate-data": b64(CERT), "client-key-data": b64(KEY)})
    creds = KubeConfig([str(path)]).current()
    for p, data in ((creds.ca_path, CA), (creds.certificate_path, CERT), (creds.private_key_path, KEY)):
        assert p is not None and Path(p).read_bytes() == data
        assert stat.S_IMODE(os.stat(p).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(os.path.dirname(p)).st_mode) == 0o700


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    path = kubeconfig(tmp_path / "config", cluster={"server": "https://h", "certificate-authority": "nowhere/ca.crt"})
    with pytest.raises(ConfigError, match=r"certificate-authority: no file .*nowhere/ca\.crt"):
        KubeConfig([str(path)])
    half = kubeconfig(tmp_path / "half", user={"client-certificate-data": b64(CERT)})
    with pytest.raises(ConfigError, match="without its key"):
        KubeConfig([str(half)])


def test_token_and_basic_auth(tmp_path: Path) -> None:
    token = KubeConfig([str(kubeconfig(tmp_path / "t", user={"token": "abc"}))]).current()
    assert token.token == "abc" and token.authorization() == "Bearer abc"
    basic = KubeConfig([str(kubeconfig(tmp_path / "b", user={"username": "admin", "password": "s3cret"}))]).current()
    assert basic.token is None and basic.authorization() == "Basic " + b64(b"admin:s3cret")


def test_a_token_file_is_read_again_after_a_minute(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("first\n")
    clock = Clock()
    source = KubeConfig([str(kubeconfig(tmp_path / "config", user={"tokenFile": "token"}))], clock=clock)
    assert source.current().token == "first"
    (tmp_path / "token").write_text("second\n")
    clock.t += TOKEN_FILE_MAX_AGE - 1
    assert source.current().token == "first"
    clock.t += 2
    assert source.current().token == "second"
    (tmp_path / "token").write_text("third")
    assert source.reload().token == "third"


def test_the_current_context_or_the_one_asked_for(tmp_path: Path) -> None:
    other = {"name": "other", "context": {"cluster": "c2", "user": "u2"}}
    path = kubeconfig(tmp_path / "config", user={"token": "one"}, extra_contexts=[other], current="other")
    doc = yaml.safe_load(path.read_text())
    doc["clusters"].append({"name": "c2", "cluster": {"server": "https://two:6443"}})
    doc["users"].append({"name": "u2", "user": {"token": "two"}})
    path.write_text(yaml.safe_dump(doc))
    assert KubeConfig([str(path)]).current().server == "https://two:6443"
    assert KubeConfig([str(path)]).current().token == "two"
    assert KubeConfig([str(path)], context="ctx").current().token == "one"
    with pytest.raises(ConfigError, match="no context 'missing'"):
        KubeConfig([str(path)], context="missing")
    with pytest.raises(ConfigError, match="no current-context"):
        KubeConfig([str(kubeconfig(tmp_path / "none", current=None))])


def test_a_kubeconfig_list_merges_first_wins(tmp_path: Path) -> None:
    """As client-go: the first file to set current-context (or a name) wins; missing files are skipped."""
    first = tmp_path / "a"
    first.write_text(yaml.safe_dump({"current-context": "ctx", "users": [{"name": "u", "user": {"token": "from-a"}}]}))
    second = kubeconfig(tmp_path / "b", user={"token": "from-b"}, current="elsewhere")
    value = os.pathsep.join([str(tmp_path / "missing"), str(first), str(second)])
    assert kubeconfig_paths(value) == [str(tmp_path / "missing"), str(first), str(second)]
    creds = load(value).current()
    assert creds.token == "from-a" and creds.server == "https://127.0.0.1:6443"
    env = {"KUBECONFIG": value}
    assert load(environ=env, service_account_dir=str(tmp_path / "no-sa")).current().token == "from-a"
    with pytest.raises(ConfigError, match="no kubeconfig found"):
        load(str(tmp_path / "missing"))


def _plugin(tmp_path: Path, body: str) -> Path:
    script = tmp_path / "bin" / "plugin.py"
    script.parent.mkdir(exist_ok=True)
    script.write_text(f"#!{sys.executable}\n" + textwrap.dedent(body))
    script.chmod(0o755)
    return script


def test_an_exec_plugin_token_cached_until_it_expires(tmp_path: Path) -> None:
    calls = tmp_path / "calls"
    _plugin(tmp_path, f"""
        import json, os, sys
        with open({str(calls)!r}, "a") as f:
            f.write(" ".join(sys.argv[1:]) + " " + os.environ["GREETING"] + "\\n")
        info = json.loads(os.environ["KUBERNETES_EXEC_INFO"])
        assert info["spec"]["interactive"] is False
        n = sum(1 for _ in open({str(calls)!r}))
        print(json.dumps({{"apiVersion": info["apiVersion"], "kind": "ExecCredential",
                          "status": {{"token": f"token-{{n}}", "expirationTimestamp": "2030-01-01T00:10:00Z"}}}}))
    """)
    now = [dt.datetime(2030, 1, 1, tzinfo=dt.UTC)]
    path = kubeconfig(tmp_path / "config", user={"exec": {
        "apiVersion": "client.authentication.k8s.io/v1beta1", "command": "./bin/plugin.py", "args": ["--cluster", "c"],
        "env": [{"name": "GREETING", "value": "hello"}]}})
    source = KubeConfig([str(path)], now=lambda: now[0])
    first = source.current()
    assert first.token == "token-1" and first.authorization() == "Bearer token-1"
    assert first.expiration == dt.datetime(2030, 1, 1, 0, 10, tzinfo=dt.UTC)
    assert source.current().token == "token-1"  # cached
    now[0] += dt.timedelta(minutes=10)
    assert source.current().token == "token-2"  # expired: the plugin runs again
    assert source.reload().token == "token-3"  # a 401 or a kopf login: again
    assert calls.read_text().splitlines() == ["--cluster c hello"] * 3


def test_an_exec_plugin_client_certificate(tmp_path: Path) -> None:
    _plugin(tmp_path, f"""
        import json
        print(json.dumps({{"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
                          "status": {{"clientCertificateData": {CERT.decode()!r}, "clientKeyData": {KEY.decode()!r}}}}}))
    """)
    path = kubeconfig(tmp_path / "config", user={"exec": {"apiVersion": "client.authentication.k8s.io/v1",
                                                          "command": str(tmp_path / "bin" / "plugin.py")}})
    creds = KubeConfig([str(path)]).current()
    assert creds.token is None and creds.expiration is None
    assert creds.certificate_path and Path(creds.certificate_path).read_bytes() == CERT
    assert creds.private_key_path and Path(creds.private_key_path).read_bytes() == KEY


def test_a_failing_exec_plugin_is_a_clear_error(tmp_path: Path) -> None:
    script = _plugin(tmp_path, """
        import sys
        print("error: you must be logged in to the server", file=sys.stderr)
        sys.exit(3)
    """)
    path = kubeconfig(tmp_path / "config", user={"exec": {"apiVersion": "client.authentication.k8s.io/v1",
                                                          "command": str(script), "args": ["get-token"]}})
    with pytest.raises(ConfigError, match=rf"exec plugin '{script} get-token' exited with 3: error: you must be logged in"):
        KubeConfig([str(path)]).current()
    missing = kubeconfig(tmp_path / "missing", user={"exec": {"apiVersion": "client.authentication.k8s.io/v1",
                                                              "command": "no-such-plugin-xyz",
                                                              "installHint": "install it"}})
    with pytest.raises(ConfigError, match="exec plugin 'no-such-plugin-xyz': command not found: install it"):
        KubeConfig([str(missing)]).current()


def _service_account(root: Path, token: str = "sa-token") -> Path:
    sa = root / "serviceaccount"
    sa.mkdir(parents=True, exist_ok=True)
    (sa / "token").write_text(token)
    (sa / "ca.crt").write_bytes(CA)
    return sa


def test_in_cluster_and_its_rotating_token(tmp_path: Path) -> None:
    sa = _service_account(tmp_path)
    env = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}
    clock = Clock()
    source = InCluster(env, str(sa), clock=clock)
    creds = source.current()
    assert creds.server == "https://[fd00::1]:443" and creds.ca_path == str(sa / "ca.crt")
    assert creds.token == "sa-token"
    (sa / "token").write_text("rotated")
    assert source.current().token == "sa-token"
    clock.t += TOKEN_FILE_MAX_AGE
    assert source.current().token == "rotated"


def test_selection_order(tmp_path: Path) -> None:
    """The kubeconfig asked for, else in-cluster, else $KUBECONFIG."""
    sa = _service_account(tmp_path)
    asked = kubeconfig(tmp_path / "asked", user={"token": "asked"})
    env_conf = kubeconfig(tmp_path / "env", user={"token": "env"})
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443", "KUBECONFIG": str(env_conf)}
    assert load(str(asked), environ=env, service_account_dir=str(sa)).current().token == "asked"
    assert load(None, environ=env, service_account_dir=str(sa)).current().token == "sa-token"
    assert load(None, environ={"KUBECONFIG": str(env_conf)}, service_account_dir=str(sa)).current().token == "env"
    assert load(None, environ=env, service_account_dir=str(tmp_path / "nothing")).current().token == "env"


# -- the transport: a 401 reads the credentials again and retries once


class _Server(ThreadingHTTPServer):
    accepted = "second"
    seen: list[str]


@pytest.fixture
def http_server() -> Iterator[_Server]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            server: _Server = self.server  # type: ignore[assignment]
            auth = self.headers.get("Authorization") or ""
            server.seen.append(f"{auth} {self.headers.get('User-Agent')} {self.path}")
            ok = auth == f"Bearer {server.accepted}"
            body = json.dumps({"kind": "Pod", "metadata": {"name": "p"}} if ok else
                              {"kind": "Status", "message": "Unauthorized"}).encode()
            self.send_response(200 if ok else 401)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            pass

    server = _Server(("127.0.0.1", 0), Handler)
    server.seen = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def test_a_401_reads_a_rotated_token_and_retries_once(tmp_path: Path, http_server: _Server) -> None:
    (tmp_path / "token").write_text("first")
    path = kubeconfig(tmp_path / "config", cluster={"server": f"http://127.0.0.1:{http_server.server_port}"},
                      user={"tokenFile": "token"})
    kube = Kube(KubeConfig([str(path)]))
    (tmp_path / "token").write_text("second")  # rotated before the minute is up: only a 401 makes us look
    assert kube.get("v1", "Pod", "ns", "p") == {"kind": "Pod", "metadata": {"name": "p"}}
    assert [s.split()[1] for s in http_server.seen] == ["first", "second"]
    assert http_server.seen[0].split()[2].startswith("triton-operator")
    http_server.accepted = "never"
    from triton_operator.controller.errors import ApiCallError
    with pytest.raises(ApiCallError) as refused:
        kube.get("v1", "Pod", "ns", "p")
    assert refused.value.status == 401 and refused.value.message == "Unauthorized"
    assert len(http_server.seen) == 4  # one retry, not more
