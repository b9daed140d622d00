"""The operator's own API client and credential loader (issue 17: no `kubernetes` package in the operator process;
issue 28: every kubeconfig field that changes where it connects or as whom is honoured or refused) against a real
kube-apiserver. Each time kopf's watches (the session our login handler gives kopf) and our own writes must work:
a TritonModel is reconciled, which takes a watch event (kopf) and our writes.

- a client certificate given as `-data` (the admin's), then an `exec` credential plugin (a real script printing a
  ServiceAccount's token);
- impersonation: a user that may do nothing but impersonate, impersonating a user whose group alone has the rights;
- proxies: the kubeconfig's `proxy-url`, the environment's `HTTPS_PROXY` and `NO_PROXY`, through a CONNECT proxy
  that records each tunnel (`e2e.proxy`), to a server name only the proxy can resolve;
- `tls-server-name`: a server name the API server's certificate does not carry;
- a refused field (`auth-provider`): one line at start, no traceback."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from cryptography import x509

from e2e.cluster import REPO_ROOT, LocalCluster, session_root
from e2e.kube import Kube, wait_for
from e2e.operator_fixtures import OPERATOR, apply_crds, kubectl
from e2e.proxy import ConnectProxy

pytestmark = pytest.mark.cluster

ROOT = session_root() / ".cluster" / "credentials"
TEAM = "team-c"
#: Never inherited from the test's environment: each run sets its own.
PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy")


def _exec_kubeconfig(kube: Kube, admin: Path, out: Path) -> Path:
    """A kubeconfig whose user is an exec plugin (relative to the kubeconfig's directory) printing the token of a
    ServiceAccount bound to cluster-admin."""
    token = kube.service_account_token("default", "default")
    kube.request("POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "exec-user"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": "default"}]})
    plugin = out.parent / "bin" / "get-token"
    plugin.parent.mkdir(parents=True, exist_ok=True)
    credential = {"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
                  "status": {"token": token, "expirationTimestamp": "2099-01-01T00:00:00Z"}}
    plugin.write_text(f"#!{sys.executable}\nprint({json.dumps(json.dumps(credential))})\n")
    plugin.chmod(0o700)
    cfg = json.loads(admin.read_text())
    cfg["users"] = [{"name": "exec", "user": {"exec": {"apiVersion": "client.authentication.k8s.io/v1",
                                                       "command": "./bin/get-token"}}}]
    cfg["contexts"][0]["context"]["user"] = "exec"
    out.write_text(json.dumps(cfg))
    out.chmod(0o600)
    return out


def _model(name: str) -> dict:
    return {"apiVersion": "serving.triton-operator.dev/v1alpha1", "kind": "TritonModel",
            "metadata": {"name": name, "namespace": TEAM},
            "spec": {"replicas": 0, "backend": "python", "maxBatchSize": 8,
                     "inputs": [{"name": "x", "dataType": "FP32", "dims": [1]}],
                     "outputs": [{"name": "y", "dataType": "FP32", "dims": [1]}],
                     "source": {"inline": {"model.py": "class TritonPythonModel:\n    pass\n"}}}}


def _prepared(control_plane: LocalCluster) -> Kube:
    """The CRDs (established, their schema published) and the namespace the operator watches."""
    kube = Kube(control_plane.kubeconfig)
    apply_crds(control_plane.kubeconfig, kube)
    kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": TEAM}})
    return kube


@contextlib.contextmanager
def _operator(control_plane: LocalCluster, kubeconfig: Path, name: str, env: dict[str, str] | None = None,
              hosts: dict[str, str] | None = None) -> Iterator[Path]:
    """`triton-operator run` with `kubeconfig` (and `env`) until the block ends; yields its log's path. `hosts`:
    names only this process resolves (its own mount namespace, with its own /etc/hosts)."""
    argv = [str(OPERATOR), "run", "--kubeconfig", str(kubeconfig), "--namespace", TEAM, "--metrics-port", "0",
            "--liveness", "", "--drift-interval", "5"]
    if hosts:
        hosts_file = kubeconfig.parent / f"hosts-{name}"
        hosts_file.write_text("127.0.0.1 localhost\n::1 localhost\n" + "".join(f"{a} {n}\n" for n, a in hosts.items()))
        argv = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
                'mount --bind "$0" /etc/hosts && exec "$@"', str(hosts_file), *argv]
    environ = {k: v for k, v in os.environ.items() if k not in PROXY_VARIABLES} | (env or {})
    log_path = control_plane.logs / f"operator-credentials-{name}.log"
    with open(log_path, "wb") as logf:
        proc = subprocess.Popen(argv, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=REPO_ROOT,
                                env=environ)
    try:
        yield log_path
        assert proc.poll() is None, log_path.read_text()
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _reconciled(kube: Kube, admin: Path, name: str, log_path: Path) -> None:
    """A new TritonModel is reconciled (a kopf watch event, then our writes), and the log has no traceback."""
    kubectl(admin, "apply", "-f", "-", stdin=json.dumps(_model(name)))
    path = f"/apis/serving.triton-operator.dev/v1alpha1/namespaces/{TEAM}/tritonmodels/{name}"
    try:
        wait_for(f"TritonModel {name} reconciled (a watch event, our writes)", lambda: kube.request(
            "GET", path).get("status", {}).get("observedGeneration") == 1, 60)
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\n--- operator log ---\n{log_path.read_text()[-6000:]}") from exc
    assert kube.get_or_none("Deployment", name, TEAM) is not None
    log = log_path.read_text()
    assert "_login' succeeded" in log, log
    assert "Traceback" not in log, log


def _kubeconfig(admin: Path, out: Path, cluster: dict[str, Any] | None = None, user: dict[str, Any] | None = None) -> Path:
    """The admin's kubeconfig with its cluster's and user's fields changed (None: removed)."""
    cfg = json.loads(admin.read_text())
    for entry, changes in ((cfg["clusters"][0]["cluster"], cluster), (cfg["users"][0]["user"], user)):
        for key, value in (changes or {}).items():
            if value is None:
                entry.pop(key, None)
            else:
                entry[key] = value
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(cfg))
    out.chmod(0o600)
    return out


def _with_host(server: str, host: str) -> str:
    return f"https://{host}:{urlsplit(server).port}"


def test_the_operator_runs_with_client_certificate_data_and_with_an_exec_plugin(
        control_plane: LocalCluster, tmp_path: Path) -> None:
    admin = control_plane.kubeconfig
    kube = _prepared(control_plane)
    assert "client-certificate-data" in json.loads(admin.read_text())["users"][0]["user"]
    configs = {"cert": admin, "exec": _exec_kubeconfig(kube, admin, tmp_path / "exec" / "kubeconfig")}
    for name, kubeconfig in configs.items():
        with _operator(control_plane, kubeconfig, name) as log_path:
            _reconciled(kube, admin, name, log_path)


# -- as whom: impersonation


IMPERSONATED, GROUP, UID, EXTRA = "jane-operator", "triton-operators", "uid-1234", ("example.dev/team", "serving")


def _impersonator(kube: Kube) -> str:
    """A ServiceAccount's token whose only right is to impersonate IMPERSONATED (with GROUP, UID and EXTRA); GROUP
    alone is bound to cluster-admin: a request has rights only if it carries the user and the group."""
    kube.create({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "impersonator", "namespace": "default"}})
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    kube.request("POST", f"{rbac}/clusterroles", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "impersonator"},
        "rules": [{"apiGroups": [""], "resources": ["users"], "verbs": ["impersonate"], "resourceNames": [IMPERSONATED]},
                  {"apiGroups": [""], "resources": ["groups"], "verbs": ["impersonate"], "resourceNames": [GROUP]},
                  {"apiGroups": ["authentication.k8s.io"], "resources": ["uids"], "verbs": ["impersonate"],
                   "resourceNames": [UID]},
                  {"apiGroups": ["authentication.k8s.io"], "resources": [f"userextras/{EXTRA[0]}"],
                   "verbs": ["impersonate"], "resourceNames": [EXTRA[1]]}]})
    for name, role, subject in (
            ("impersonator", "impersonator", {"kind": "ServiceAccount", "name": "impersonator", "namespace": "default"}),
            ("triton-operators", "cluster-admin", {"kind": "Group", "name": GROUP, "apiGroup": "rbac.authorization.k8s.io"})):
        kube.request("POST", f"{rbac}/clusterrolebindings", {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [subject]})
    return kube.service_account_token("default", "impersonator")


def _self_subject_reviews(kubeconfig: Path) -> dict[str, Any]:
    """status.userInfo of a SelfSubjectReview made by each client (ours, and the session kopf's login gets), or
    the status code it was refused with."""
    from triton_operator.controller.operator import kopf_session
    from triton_operator.platform.kube import Kube as OperatorKube
    from triton_operator.platform.kubeconfig import KubeConfig

    source = KubeConfig([str(kubeconfig)], environ={})
    path = "/apis/authentication.k8s.io/v1/selfsubjectreviews"
    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
    status, _, answer = OperatorKube(source).transport.request(
        "POST", path, body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    out: dict[str, Any] = {"ours": json.loads(answer)["status"]["userInfo"] if status in (200, 201) else status}

    async def kopf_review() -> Any:
        creds = source.current()
        session = kopf_session(creds).aiohttp_session
        try:
            async with session.post(creds.server + path, json=body) as resp:
                return (await resp.json())["status"]["userInfo"] if resp.status in (200, 201) else resp.status
        finally:
            await session.close()

    out["kopf"] = asyncio.run(kopf_review())
    return out


def test_impersonation_is_what_both_clients_run_as_and_a_refused_field_stops_the_start(
        control_plane: LocalCluster, tmp_path: Path) -> None:
    admin = control_plane.kubeconfig
    kube = _prepared(control_plane)
    token = _impersonator(kube)
    plain = _kubeconfig(admin, tmp_path / "plain" / "kubeconfig", user={
        "client-certificate-data": None, "client-key-data": None, "token": token})
    impersonating = _kubeconfig(admin, tmp_path / "as" / "kubeconfig", user={
        "client-certificate-data": None, "client-key-data": None, "token": token, "as": IMPERSONATED,
        "as-groups": [GROUP], "as-uid": UID, "as-user-extra": {EXTRA[0]: [EXTRA[1]]}})

    # The real user is no one: as itself, it may not even list TritonModels.
    real = _self_subject_reviews(plain)
    assert real["ours"]["username"] == real["kopf"]["username"] == "system:serviceaccount:default:impersonator", real
    from triton_operator.platform.errors import ApiCallError
    from triton_operator.platform.kube import Kube as OperatorKube
    from triton_operator.platform.kubeconfig import KubeConfig
    with pytest.raises(ApiCallError) as denied:
        OperatorKube(KubeConfig([str(plain)], environ={})).list("serving.triton-operator.dev/v1alpha1", "TritonModel", TEAM)
    assert denied.value.status == 403, denied.value

    # Impersonating, both clients are the impersonated user, with its uid, group and extra.
    seen = _self_subject_reviews(impersonating)
    for client, info in seen.items():
        assert isinstance(info, dict), (client, info)
        assert (info["username"], info.get("uid")) == (IMPERSONATED, UID), (client, info)
        assert GROUP in info["groups"], (client, info)
        assert info.get("extra") == {EXTRA[0]: [EXTRA[1]]}, (client, info)

    # The operator as that user: its watches and its writes need the group's rights, which only impersonation gives.
    with _operator(control_plane, impersonating, "impersonation") as log_path:
        _reconciled(kube, admin, "impersonated", log_path)

    # A field that would change as whom the operator runs, which it does not honour: one line at start.
    oidc = _kubeconfig(admin, tmp_path / "oidc" / "kubeconfig", user={
        "client-certificate-data": None, "client-key-data": None,
        "auth-provider": {"name": "oidc", "config": {"idp-issuer-url": "https://issuer.example", "client-id": "k"}}})
    done = subprocess.run([str(OPERATOR), "run", "--kubeconfig", str(oidc), "--namespace", TEAM, "--metrics-port", "0",
                           "--liveness", ""], capture_output=True, text=True, timeout=60, cwd=REPO_ROOT, check=False)
    assert done.returncode == 1 and done.stdout == "", done
    assert done.stderr.splitlines() == [
        f"error: kubeconfig {oidc}: users[0].user.auth-provider (oidc) is not supported; use an exec credential "
        "plugin such as kubelogin"], done.stderr


# -- where: proxies and the TLS server name


def _both_clients_tunnelled(connects: list[Any], target: str) -> None:
    """CONNECTs to `target` from both clients (their User-Agents), none carrying our credentials."""
    assert {c.target for c in connects} == {target}, connects
    agents = {c.user_agent.split("/")[0] for c in connects}
    assert agents == {"triton-operator", "kopf"}, connects
    for c in connects:
        assert not [h for h in c.headers if h == "authorization" or h.startswith("impersonate-")], c


def test_proxies_from_the_kubeconfig_and_from_the_environment(control_plane: LocalCluster, tmp_path: Path) -> None:
    """The server is named `kubernetes` (a name its certificate carries) which only the proxies resolve: an operator
    that reconciles through one sent every request of both clients through it."""
    admin = control_plane.kubeconfig
    kube = _prepared(control_plane)
    server = json.loads(admin.read_text())["clusters"][0]["cluster"]["server"]
    named = _with_host(server, "kubernetes")
    target = f"kubernetes:{urlsplit(server).port}"
    hosts = {"kubernetes": "127.0.0.1"}
    with ConnectProxy(hosts) as kube_proxy, ConnectProxy(hosts) as env_proxy:
        # proxy-url, over an environment that names another proxy
        with_url = _kubeconfig(admin, tmp_path / "url" / "kubeconfig", cluster={"server": named,
                                                                                "proxy-url": kube_proxy.url})
        with _operator(control_plane, with_url, "proxy-url", env={"HTTPS_PROXY": env_proxy.url}) as log_path:
            _reconciled(kube, admin, "proxy-url", log_path)
        _both_clients_tunnelled(kube_proxy.seen(), target)
        assert env_proxy.seen() == []

        # the environment's HTTPS_PROXY
        plain = _kubeconfig(admin, tmp_path / "env" / "kubeconfig", cluster={"server": named})
        with _operator(control_plane, plain, "https-proxy", env={"https_proxy": env_proxy.url}) as log_path:
            _reconciled(kube, admin, "https-proxy", log_path)
        _both_clients_tunnelled(env_proxy.seen(), target)

        # NO_PROXY names the server: straight there (the operator resolves the name itself, in its own /etc/hosts)
        before = len(kube_proxy.seen()), len(env_proxy.seen())
        with _operator(control_plane, plain, "no-proxy", env={"HTTPS_PROXY": env_proxy.url, "NO_PROXY": "10.0.0.0/8,kubernetes"},
                       hosts=hosts) as log_path:
            _reconciled(kube, admin, "no-proxy", log_path)
        assert (len(kube_proxy.seen()), len(env_proxy.seen())) == before


def _sans(port: int) -> list[str]:
    pem = ssl.get_server_certificate(("127.0.0.1", port))
    names = x509.load_pem_x509_certificate(pem.encode()).extensions.get_extension_for_class(x509.SubjectAlternativeName)
    return [str(n.value) for n in names.value]


def test_a_tls_server_name_for_a_server_address_the_certificate_does_not_name(
        control_plane: LocalCluster, tmp_path: Path) -> None:
    admin = control_plane.kubeconfig
    kube = _prepared(control_plane)
    server = json.loads(admin.read_text())["clusters"][0]["cluster"]["server"]
    sans = _sans(urlsplit(server).port or 443)
    assert "kubernetes" in sans and "apiserver.test" not in sans, sans
    config = _kubeconfig(admin, tmp_path / "sni" / "kubeconfig", cluster={
        "server": _with_host(server, "apiserver.test"), "tls-server-name": "kubernetes"})
    with _operator(control_plane, config, "tls-server-name", hosts={"apiserver.test": "127.0.0.1"}) as log_path:
        _reconciled(kube, admin, "tls-server-name", log_path)
