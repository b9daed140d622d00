"""The operator's own credential loader (`platform.kubeconfig`, issue 17: no `kubernetes` package in the operator
process): kubeconfigs and in-cluster ServiceAccounts on real temporary files, exec plugins as real scripts."""

# ruff: noqa: S105, S107 - the tokens and passwords here are test data

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import json
import os
import ssl
import stat
import sys
import textwrap
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509

from e2e.proxy import ConnectProxy
from tests.https_server import _certificates
from triton_operator.platform.kube import Kube
from triton_operator.platform.kubeconfig import (
    TOKEN_FILE_MAX_AGE,
    ConfigError,
    InCluster,
    KubeConfig,
    environment_proxy,
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
    with pytest.raises(ConfigError, match=r"kubeconfig .*missing: no such file"):
        load(str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match="no kubeconfig found"):
        load(os.pathsep.join([str(tmp_path / "missing"), str(tmp_path / "gone")]))


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
    from triton_operator.platform.errors import ApiCallError
    with pytest.raises(ApiCallError) as refused:
        kube.get("v1", "Pod", "ns", "p")
    assert refused.value.status == 401 and refused.value.message == "Unauthorized"
    assert len(http_server.seen) == 4  # one retry, not more


# -- every key is honoured or refused by name (issue 28)


def test_auth_provider_is_refused_naming_the_field_and_what_to_use(tmp_path: Path) -> None:
    oidc = kubeconfig(tmp_path / "oidc", user={"auth-provider": {"name": "oidc", "config": {"idp-issuer-url": "x"}}})
    with pytest.raises(ConfigError) as refused:
        KubeConfig([str(oidc)])
    assert str(refused.value) == (f"kubeconfig {oidc}: users[0].user.auth-provider (oidc) is not supported; "
                                  "use an exec credential plugin such as kubelogin")
    gcp = kubeconfig(tmp_path / "gcp", user={"auth-provider": {"name": "gcp"}})
    with pytest.raises(ConfigError, match=r"users\[0\]\.user\.auth-provider \(gcp\) .* gke-gcloud-auth-plugin"):
        KubeConfig([str(gcp)])


def test_an_unknown_key_of_the_chosen_entries_is_refused_by_name(tmp_path: Path) -> None:
    cases = {
        "clusters[0].cluster.proxy_url": {"cluster": {"server": "https://h", "proxy_url": "http://p:1"}},
        "users[0].user.impersonate": {"user": {"token": "t", "impersonate": "admin"}},
        "users[0].user.exec.cluster": {"user": {"exec": {"command": "x", "cluster": {}}}},
    }
    for i, (where, parts) in enumerate(cases.items()):
        path = kubeconfig(tmp_path / f"config-{i}", **parts)
        with pytest.raises(ConfigError) as refused:
            KubeConfig([str(path)])
        assert str(refused.value) == (f"kubeconfig {path}: {where} is not supported (a field the operator does not "
                                      "know is refused, not ignored)")
    doc = yaml.safe_load(kubeconfig(tmp_path / "ctx").read_text())
    doc["contexts"][0]["context"]["as"] = "someone"  # `as` belongs to a user, not a context: kubectl ignores it there
    (tmp_path / "ctx").write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match=r"contexts\[0\]\.context\.as is not supported"):
        KubeConfig([str(tmp_path / "ctx")])


def test_only_the_chosen_entries_are_checked(tmp_path: Path) -> None:
    """A kubeconfig's other users (an oidc login for another cluster) are client-go's business, not ours."""
    path = kubeconfig(tmp_path / "config", user={"token": "t"})
    doc = yaml.safe_load(path.read_text())
    doc["users"].append({"name": "other", "user": {"auth-provider": {"name": "oidc"}, "future-field": 1}})
    doc["clusters"].append({"name": "other", "cluster": {"server": "https://o", "future-field": 1}})
    path.write_text(yaml.safe_dump(doc))
    assert KubeConfig([str(path)]).current().token == "t"


def test_harmless_keys_are_accepted(tmp_path: Path) -> None:
    ext = [{"name": "example.dev/x", "extension": {"a": 1}}]
    path = kubeconfig(tmp_path / "config", cluster={"server": "https://h", "disable-compression": True, "extensions": ext},
                      user={"token": "t", "extensions": ext})
    assert KubeConfig([str(path)]).current().token == "t"


def test_a_flag_that_is_a_string_is_refused(tmp_path: Path) -> None:
    """`insecure-skip-tls-verify: "false"` must not turn verification off."""
    path = kubeconfig(tmp_path / "config", cluster={"server": "https://h", "insecure-skip-tls-verify": "false"})
    with pytest.raises(ConfigError, match=r"clusters\[0\]\.cluster\.insecure-skip-tls-verify: expected true or false"):
        KubeConfig([str(path)])


def test_an_interactive_exec_plugin_is_refused(tmp_path: Path) -> None:
    path = kubeconfig(tmp_path / "config", user={"exec": {"command": "x", "interactiveMode": "Always"}})
    with pytest.raises(ConfigError, match=r"users\[0\]\.user\.exec\.interactiveMode: 'Always' is not supported"):
        KubeConfig([str(path)])
    ok = kubeconfig(tmp_path / "ok", user={"exec": {"command": "x", "interactiveMode": "IfAvailable"}})
    KubeConfig([str(ok)])


def test_malformed_kubeconfigs_are_one_line_naming_the_file(tmp_path: Path) -> None:
    cases = {
        "clusters: [unclosed\n": "not valid YAML: expected ',' or ']', but got '<stream end>' at line 2, column 1",
        "- a list\n": "not a mapping",
        "clusters: 5\n": "clusters: expected a list",
        "clusters: [{name: c, cluster: text}]\n": "clusters[0]: expected a mapping with a name and a cluster mapping",
    }
    for i, (text, says) in enumerate(cases.items()):
        path = tmp_path / f"bad-{i}"
        path.write_text(text)
        with pytest.raises(ConfigError) as raised:
            KubeConfig([str(path)])
        assert str(raised.value) == f"kubeconfig {path}: {says}"
    latin1 = tmp_path / "latin1"
    latin1.write_bytes(b"current-context: caf\xe9\n")
    with pytest.raises(ConfigError, match=rf"^kubeconfig {latin1}: not UTF-8 text \(at byte 20\)$"):
        KubeConfig([str(latin1)])
    with pytest.raises(ConfigError, match=rf"^kubeconfig {tmp_path}: not a file$"):
        KubeConfig([str(tmp_path)])


# -- impersonation


def test_impersonation_becomes_client_gos_headers(tmp_path: Path) -> None:
    path = kubeconfig(tmp_path / "config", user={
        "token": "t", "as": "jane", "as-uid": "1234", "as-groups": ["dev", "ops"],
        "as-user-extra": {"scopes": ["view", "edit"], "example.dev/team": ["ml"], "a%b c": ["x"]}})
    creds = KubeConfig([str(path)]).current()
    assert creds.headers() == [
        ("Authorization", "Bearer t"), ("Impersonate-User", "jane"), ("Impersonate-Uid", "1234"),
        ("Impersonate-Group", "dev"), ("Impersonate-Group", "ops"),
        ("Impersonate-Extra-a%25b%20c", "x"), ("Impersonate-Extra-example.dev%2Fteam", "ml"),  # (keys sorted: yaml)
        ("Impersonate-Extra-scopes", "view"), ("Impersonate-Extra-scopes", "edit")]


def test_impersonating_groups_without_a_user_is_refused(tmp_path: Path) -> None:
    for key, value in (("as-groups", ["dev"]), ("as-uid", "1"), ("as-user-extra", {"k": ["v"]})):
        path = kubeconfig(tmp_path / key, user={"token": "t", key: value})
        with pytest.raises(ConfigError, match=rf"users\[0\]\.user\.{key} needs .*users\[0\]\.user\.as \(the user"):
            KubeConfig([str(path)])
    bad = kubeconfig(tmp_path / "bad", user={"as": "jane", "as-groups": "dev"})
    with pytest.raises(ConfigError, match=r"users\[0\]\.user\.as-groups: expected a list of strings"):
        KubeConfig([str(bad)])


# -- proxies: the kubeconfig's proxy-url, else the environment as Go reads it


def test_proxy_url_wins_over_the_environment(tmp_path: Path) -> None:
    env = {"HTTPS_PROXY": "http://env-proxy:3128"}
    with_url = kubeconfig(tmp_path / "url", cluster={"server": "https://api.example:6443",
                                                     "proxy-url": "http://kube-proxy:8080"})
    assert KubeConfig([str(with_url)], environ=env).current().proxy_url == "http://kube-proxy:8080"
    without = kubeconfig(tmp_path / "env", cluster={"server": "https://api.example:6443"})
    assert KubeConfig([str(without)], environ=env).current().proxy_url == "http://env-proxy:3128"
    assert KubeConfig([str(without)], environ={**env, "NO_PROXY": "example"}).current().proxy_url is None
    assert KubeConfig([str(without)], environ={}).current().proxy_url is None
    # proxy-url is used even for a loopback server, as client-go does (only the environment's proxy skips those)
    local = kubeconfig(tmp_path / "local", cluster={"server": "https://127.0.0.1:6443", "proxy-url": "http://p:1"})
    assert KubeConfig([str(local)], environ={}).current().proxy_url == "http://p:1"


def test_a_proxy_that_is_not_http_is_refused_naming_where_it_came_from(tmp_path: Path) -> None:
    for scheme in ("socks5", "https"):
        path = kubeconfig(tmp_path / scheme, cluster={"server": "https://h", "proxy-url": f"{scheme}://p:1080"})
        with pytest.raises(ConfigError, match=rf"clusters\[0\]\.cluster\.proxy-url: '{scheme}://p:1080' is not "
                                              r"supported; the operator uses http:// proxies only"):
            KubeConfig([str(path)])
    path = kubeconfig(tmp_path / "env", cluster={"server": "https://h"})
    with pytest.raises(ConfigError, match=r"^https_proxy: 'socks5://p:1080' is not supported"):
        KubeConfig([str(path)], environ={"https_proxy": "socks5://p:1080"})


@pytest.mark.parametrize(("server", "env", "proxy"), [
    ("https://api.example:6443", {"HTTPS_PROXY": "http://p:1"}, "http://p:1"),
    ("https://api.example:6443", {"https_proxy": "http://low:1"}, "http://low:1"),
    ("https://api.example:6443", {"HTTPS_PROXY": "http://up:1", "https_proxy": "http://low:1"}, "http://up:1"),
    ("https://api.example:6443", {"HTTPS_PROXY": "p:3128"}, "http://p:3128"),  # no scheme: http
    ("https://api.example:6443", {"HTTP_PROXY": "http://p:1"}, None),  # HTTP_PROXY is for http:// servers
    ("http://api.example:8080", {"HTTP_PROXY": "http://p:1", "HTTPS_PROXY": "http://q:1"}, "http://p:1"),
    # never for localhost or loopback addresses
    ("https://localhost:6443", {"HTTPS_PROXY": "http://p:1"}, None),
    ("https://127.0.0.2:6443", {"HTTPS_PROXY": "http://p:1"}, None),
    ("https://[::1]:6443", {"HTTPS_PROXY": "http://p:1"}, None),
    # NO_PROXY: names (and their subdomains), .names (subdomains only), *.names, IPs, CIDRs, ports, *
    ("https://api.example:6443", {"HTTPS_PROXY": "http://p:1", "NO_PROXY": "api.example"}, None),
    ("https://api.example:6443", {"HTTPS_PROXY": "http://p:1", "NO_PROXY": "example"}, None),
    ("https://api.example:6443", {"HTTPS_PROXY": "http://p:1", "no_proxy": " other , .EXAMPLE "}, None),
    ("https://example:6443", {"HTTPS_PROXY": "http://p:1", "NO_PROXY": ".example"}, "http://p:1"),
    ("https://example:6443", {"HTTPS_PROXY": "http://p:1", "NO_PROXY": "*.example"}, "http://p:1"),
    ("https://api.example:6443", {"HTTPS_PROXY": "http://p:1", "NO_PROXY": "*.example"}, None),
    ("https://api.example:6443", {"HTTPS_PROXY": "http://p:1", "NO_PROXY": "pi.example"}, "http://p:1"),
    ("https://api.example:6443", {"HTTPS_PROXY": "http://p:1", "NO_PROXY": "api.example:6443"}, None),
    ("https://api.example:6443", {"HTTPS_PROXY": "http://p:1", "NO_PROXY": "api.example:443"}, "http://p:1"),
    ("https://api.example", {"HTTPS_PROXY": "http://p:1", "NO_PROXY": "api.example:443"}, None),
    ("https://10.1.2.3:6443", {"HTTPS_PROXY": "http://p:1", "NO_PROXY": "10.0.0.0/8"}, None),
    ("https://11.1.2.3:6443", {"HTTPS_PROXY": "http://p:1", "NO_PROXY": "10.0.0.0/8"}, "http://p:1"),
    ("https://10.1.2.3:6443", {"HTTPS_PROXY": "http://p:1", "NO_PROXY": "10.1.2.3"}, None),
    ("https://10.1.2.3:6443", {"HTTPS_PROXY": "http://p:1", "NO_PROXY": "10.1.2.3:443"}, "http://p:1"),
    ("https://[fd00::1]:6443", {"HTTPS_PROXY": "http://p:1", "NO_PROXY": "[fd00::1]:6443"}, None),
    ("https://[fd00::1]:6443", {"HTTPS_PROXY": "http://p:1", "NO_PROXY": "fd00::/64"}, None),
    ("https://api.example:6443", {"HTTPS_PROXY": "http://p:1", "NO_PROXY": "*"}, None),
])
def test_the_environments_proxy_as_go_reads_it(server: str, env: dict[str, str], proxy: str | None) -> None:
    assert environment_proxy(server, env) == proxy


def test_in_cluster_uses_the_environments_proxy_too(tmp_path: Path) -> None:
    sa = _service_account(tmp_path)
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443", "HTTPS_PROXY": "http://p:1"}
    assert InCluster(env, str(sa)).current().proxy_url == "http://p:1"
    assert InCluster({**env, "NO_PROXY": "10.96.0.0/12"}, str(sa)).current().proxy_url is None


def test_an_exec_plugin_with_provide_cluster_info_is_told_the_cluster(tmp_path: Path) -> None:
    seen = tmp_path / "exec-info.json"
    _plugin(tmp_path, f"""
        import json, os
        open({str(seen)!r}, "w").write(os.environ["KUBERNETES_EXEC_INFO"])
        print(json.dumps({{"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
                          "status": {{"token": "t"}}}}))
    """)
    path = kubeconfig(tmp_path / "config", cluster={
        "server": "https://api.example:6443", "certificate-authority-data": b64(CA), "tls-server-name": "kubernetes",
        "proxy-url": "http://p:3128",
        "extensions": [{"name": "client.authentication.k8s.io/exec", "extension": {"audience": "api"}}]},
                      user={"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "./bin/plugin.py",
                                     "provideClusterInfo": True, "interactiveMode": "Never"}})
    assert KubeConfig([str(path)], environ={}).current().token == "t"
    assert json.loads(seen.read_text())["spec"] == {"interactive": False, "cluster": {
        "server": "https://api.example:6443", "insecure-skip-tls-verify": False, "certificate-authority-data": b64(CA),
        "tls-server-name": "kubernetes", "proxy-url": "http://p:3128", "config": {"audience": "api"}}}


# -- both clients (ours and kopf's) through a CONNECT proxy to a TLS server known only as `kubernetes`


@dataclass
class _TlsApi:
    port: int
    ca: Path
    server_names: list[str | None]  # each handshake's SNI
    requests: list[list[tuple[str, str]]]  # each request's headers, in order, repeated names kept


@pytest.fixture
def tls_api(tmp_path: Path) -> Iterator[_TlsApi]:
    """An HTTPS server whose certificate names only `kubernetes` (not 127.0.0.1, where it listens)."""
    ca, cert, key = _certificates(tmp_path, [x509.DNSName("kubernetes")])

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            state.requests.append(list(self.headers.items()))
            body = b'{"kind": "Status", "status": "Success"}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    state = _TlsApi(server.server_address[1], ca, [], [])
    context.sni_callback = lambda _sock, name, _ctx: state.server_names.append(name)  # type: ignore[assignment,func-returns-value]
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()


def _get_with_both_clients(source: KubeConfig) -> dict[str, Any]:
    """GET /version with our client, then with the session kopf's login gets: what each answered or raised."""
    from triton_operator.controller.operator import kopf_session

    out: dict[str, Any] = {}
    try:
        out["ours"] = Kube(source).transport.request("GET", "/version")[0]
    except Exception as exc:  # noqa: BLE001 - what it raised is the answer
        out["ours"] = exc

    async def kopf_get() -> Any:
        creds = source.current()
        session = kopf_session(creds).aiohttp_session
        try:
            async with session.get(creds.server + "/version") as resp:
                return resp.status
        except Exception as exc:  # noqa: BLE001
            return exc
        finally:
            await session.close()

    out["kopf"] = asyncio.run(kopf_get())
    return out


def test_both_clients_use_the_proxy_the_tls_server_name_and_the_impersonation(tmp_path: Path, tls_api: _TlsApi) -> None:
    with ConnectProxy() as proxy:
        cluster = {"server": f"https://127.0.0.1:{tls_api.port}", "certificate-authority": str(tls_api.ca),
                   "tls-server-name": "kubernetes", "proxy-url": proxy.url.replace("//", "//proxy-user:p%40ss@")}
        path = kubeconfig(tmp_path / "config", cluster=cluster, user={
            "token": "secret", "as": "jane", "as-groups": ["dev", "ops"], "as-user-extra": {"example.dev/team": ["ml"]}})
        answers = _get_with_both_clients(KubeConfig([str(path)], environ={}))
        assert answers == {"ours": 200, "kopf": 200}, answers
        connects = proxy.seen()
    assert [c.target for c in connects] == [f"127.0.0.1:{tls_api.port}"] * 2
    assert connects[0].user_agent.startswith("triton-operator") and "aiohttp" in connects[1].user_agent
    for c in connects:  # the proxy gets its own credentials, never ours
        assert c.headers.get("proxy-authorization") == "Basic " + b64(b"proxy-user:p@ss"), c
        assert not [h for h in c.headers if h == "authorization" or h.startswith("impersonate-")], c
    assert tls_api.server_names == ["kubernetes", "kubernetes"]
    for headers in tls_api.requests:
        ours = [(k, v) for k, v in headers if k.lower() == "authorization" or k.lower().startswith("impersonate-")]
        assert sorted(ours) == sorted([("Authorization", "Bearer secret"), ("Impersonate-User", "jane"),
                                       ("Impersonate-Group", "dev"), ("Impersonate-Group", "ops"),
                                       ("Impersonate-Extra-example.dev%2Fteam", "ml")]), headers


def test_without_the_tls_server_name_both_clients_refuse_the_certificate(tmp_path: Path, tls_api: _TlsApi) -> None:
    """The control for the test above: the certificate does not name 127.0.0.1, so the name is what made it work."""
    path = kubeconfig(tmp_path / "config", cluster={"server": f"https://127.0.0.1:{tls_api.port}",
                                                    "certificate-authority": str(tls_api.ca)}, user={"token": "t"})
    answers = _get_with_both_clients(KubeConfig([str(path)], environ={}))
    assert "CERTIFICATE_VERIFY_FAILED" in str(answers["ours"]), answers
    assert "CERTIFICATE_VERIFY_FAILED" in str(answers["kopf"]), answers
    assert tls_api.requests == []
