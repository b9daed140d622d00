"""The operator's credentials for the API server: in-cluster (its ServiceAccount) or from a kubeconfig.

It follows client-go's rules where they matter to an operator:

- in-cluster: `KUBERNETES_SERVICE_HOST`/`_PORT`, the ServiceAccount's `token` and `ca.crt`; the token is a bound,
  rotating one: the file is read again when what was read is older than a minute (as client-go does);
- a kubeconfig: a path or a list of them (`:`-separated, as `$KUBECONFIG`), merged as client-go merges them (the
  first file to name a cluster, user or context wins; `current-context` from the first file that sets it), then
  the current context's cluster (server, CA as a file or `-data`, `insecure-skip-tls-verify`, `tls-server-name`,
  `proxy-url`) and user (client certificate and key as files or `-data`, `token`, `tokenFile`,
  `username`/`password`, an `exec` credential plugin with `provideClusterInfo`, and impersonation: `as`,
  `as-uid`, `as-groups`, `as-user-extra`). Relative paths resolve against the directory of the file that names
  them;
- a proxy: the cluster's `proxy-url`, else `HTTPS_PROXY`/`HTTP_PROXY`/`NO_PROXY` as Go's
  http.ProxyFromEnvironment reads them (in-cluster too): never for localhost or a loopback address; `NO_PROXY`
  entries are `*`, IPs, CIDRs and domains (`example.com` also matches its subdomains, `.example.com` only them),
  each with an optional port. Only http:// proxies: an https:// or socks5:// one is refused.

Both clients use what this module decides: our own (`kube.Transport`, urllib3) and kopf's watches (the session
`operator` gives kopf's login). Every key of the chosen context, cluster, user and exec plugin is checked against
the fields above (plus `extensions` and `disable-compression`, which change neither where nor as whom): any other
key is refused at start by name, so that nothing that would send requests elsewhere or as someone else is ignored
silently. `auth-provider` is refused: client-go itself now points its users to exec plugins.

Why our own loader (measured on this machine, issue 28, on top of the operator's own imports, ~61 MiB):
- the `kubernetes` package: `import kubernetes` and `load_kube_config` add 14.7 MiB of RSS, and 36.1 MiB once its
  API client is used (issue 17 measured ~32 MB); its loader has no impersonation (`as`, `as-groups`, `as-uid`)
  and no `NO_PROXY`; the operator process never imports it;
- lightkube 1.0.1: its loader adds 1.9 MiB, 4.8 MiB with its httpx clients made; its kubeconfig model
  (`lightkube/config/models.py`) has no `proxy-url`, no `as`/`as-groups`/`as-uid`/`as-user-extra`, no
  `tls-server-name` and no `provideClusterInfo` (a TODO), and it ignores unknown keys silently; its clients are
  httpx, while kopf's are aiohttp, so both clients would still need the fields turned into their settings here.
No library serves; this module is the part of client-go's loader an operator needs.

`-data` values (and the certificates an exec plugin returns) are written to files in a private temporary
directory (0700, files 0600): Python's ssl loads certificates from files only.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import datetime
import hashlib
import ipaddress
import json
import logging
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from ..validate import yaml_input

log = logging.getLogger("triton_operator.kubeconfig")

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
#: How long a token read from a file is used before the file is read again (client-go's cachingTokenSource).
TOKEN_FILE_MAX_AGE = 60.0
#: An exec plugin's credential is renewed this long before it expires (kopf and client-go would meet a 401).
EXPIRY_MARGIN = datetime.timedelta(seconds=10)
EXEC_TIMEOUT = 120.0
EXEC_API_VERSIONS = ("client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1")
#: The cluster extension whose `extension` an exec plugin with provideClusterInfo receives as `config` (client-go's).
EXEC_CLUSTER_EXTENSION = "client.authentication.k8s.io/exec"

# The keys the operator honours (or that change neither where it connects nor as whom: extensions,
# disable-compression, a context's namespace). Any other key of the chosen entries is refused by name.
CONTEXT_FIELDS = frozenset({"cluster", "user", "namespace", "extensions"})
CLUSTER_FIELDS = frozenset({"server", "certificate-authority", "certificate-authority-data", "insecure-skip-tls-verify",
                            "tls-server-name", "proxy-url", "disable-compression", "extensions"})
USER_FIELDS = frozenset({"client-certificate", "client-certificate-data", "client-key", "client-key-data", "token",
                         "tokenFile", "username", "password", "exec", "as", "as-uid", "as-groups", "as-user-extra",
                         "extensions"})
EXEC_FIELDS = frozenset({"apiVersion", "command", "args", "env", "installHint", "provideClusterInfo",
                         "interactiveMode"})
#: What to use instead of a refused auth-provider, by its name.
AUTH_PROVIDER_INSTEAD = {"oidc": "an exec credential plugin such as kubelogin",
                         "azure": "the exec credential plugin kubelogin (Azure)",
                         "gcp": "the exec credential plugin gke-gcloud-auth-plugin"}


class ConfigError(Exception):
    """The credentials cannot be loaded: what is missing or wrong, and where."""


@dataclass(frozen=True)
class Credentials:
    """Where the API server is and how to prove who we are: files, never in-memory PEM (ssl needs paths)."""

    server: str
    ca_path: str | None = None
    insecure: bool = False
    tls_server_name: str | None = None
    token: str | None = None
    username: str | None = None
    password: str | None = None
    certificate_path: str | None = None
    private_key_path: str | None = None
    expiration: datetime.datetime | None = None  # an exec plugin's credential: when it must be renewed
    proxy_url: str | None = None  # an http:// proxy, with its user and password if it needs them
    impersonation: tuple[tuple[str, str], ...] = ()  # Impersonate-* headers: one per group and per extra value

    def authorization(self) -> str | None:
        """The `Authorization` header's value, if any: the bearer token, else basic auth."""
        if self.token:
            return f"Bearer {self.token}"
        if self.username is not None and self.password is not None:
            pair = f"{self.username}:{self.password}".encode()
            return f"Basic {base64.b64encode(pair).decode('ascii')}"
        return None

    def headers(self) -> list[tuple[str, str]]:
        """What every request carries: `Authorization` (if any), then the impersonation headers."""
        auth = self.authorization()
        return [*([("Authorization", auth)] if auth else []), *self.impersonation]

    def connection(self) -> tuple[str | None, bool, str | None, str | None, str | None, str | None]:
        """What a connection depends on: a change needs new connections."""
        return (self.ca_path, self.insecure, self.tls_server_name, self.certificate_path, self.private_key_path,
                self.proxy_url)


class CredentialSource:
    """Credentials that can change while the operator runs: `current()` renews what expires (a token file's
    content after a minute, an exec plugin's credential at its expiry); `reload()` reads everything again now
    (after a 401, and on every kopf login). Thread-safe."""

    description = "credentials"

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def current(self) -> Credentials:
        with self._lock:
            return self._current()

    def reload(self) -> Credentials:
        with self._lock:
            return self._reload()

    def _current(self) -> Credentials:
        raise NotImplementedError

    def _reload(self) -> Credentials:
        raise NotImplementedError


class _TokenFile:
    """A token read from a file, read again once older than `TOKEN_FILE_MAX_AGE` (a failed re-read keeps the last
    token: the kubelet writes the file atomically, so that is a passing problem)."""

    def __init__(self, path: str, clock: Callable[[], float]) -> None:
        self.path, self.clock = path, clock
        self.token = self._read()
        self.read_at = clock()

    def _read(self) -> str:
        try:
            token = Path(self.path).read_text().strip()
        except OSError as exc:
            raise ConfigError(f"cannot read the token file {self.path}: {exc}") from exc
        if not token:
            raise ConfigError(f"the token file {self.path} is empty")
        return token

    def get(self) -> str:
        if self.clock() - self.read_at >= TOKEN_FILE_MAX_AGE:
            try:
                self.token = self._read()
            except ConfigError as exc:
                log.warning("Keeping the last token: %s", exc)
            self.read_at = self.clock()
        return self.token


class InCluster(CredentialSource):
    """The pod's ServiceAccount."""

    def __init__(self, environ: Mapping[str, str] | None = None, directory: str = SERVICE_ACCOUNT_DIR,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.environ = os.environ if environ is None else environ
        self.directory, self.clock = directory, clock
        self.description = f"in-cluster ({directory})"
        self._base, self._token = self._load()

    @staticmethod
    def available(environ: Mapping[str, str] | None = None, directory: str = SERVICE_ACCOUNT_DIR) -> bool:
        env = os.environ if environ is None else environ
        return bool(env.get("KUBERNETES_SERVICE_HOST") and env.get("KUBERNETES_SERVICE_PORT")
                    and os.path.isfile(os.path.join(directory, "token")))

    def _load(self) -> tuple[Credentials, _TokenFile]:
        host, port = self.environ.get("KUBERNETES_SERVICE_HOST"), self.environ.get("KUBERNETES_SERVICE_PORT")
        if not host or not port:
            raise ConfigError("in-cluster: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set")
        ca = os.path.join(self.directory, "ca.crt")
        if not os.path.isfile(ca):
            raise ConfigError(f"in-cluster: no CA certificate at {ca}")
        if ":" in host and not host.startswith("["):  # an IPv6 address
            host = f"[{host}]"
        token = _TokenFile(os.path.join(self.directory, "token"), self.clock)
        server = f"https://{host}:{port}"
        return Credentials(server=server, ca_path=ca, proxy_url=environment_proxy(server, self.environ)), token

    def _current(self) -> Credentials:
        return replace(self._base, token=self._token.get())

    def _reload(self) -> Credentials:
        self._base, self._token = self._load()
        return self._current()


# -- proxies, as Go's http.ProxyFromEnvironment (golang.org/x/net/http/httpproxy) chooses them


def _proxy(value: str, what: str) -> str:
    """An http:// proxy URL (`host:port` alone means http://, as in Go); any other scheme is refused."""
    url = value if "://" in value else f"http://{value}"
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ConfigError(f"{what}: {value!r} is not supported; the operator uses http:// proxies only "
                          "(not https:// or socks5://)")
    return url


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def _host_port(value: str) -> tuple[str, str] | None:
    """`host:port` or `[ipv6]:port` split (Go's net.SplitHostPort), else None."""
    if value.startswith("["):
        end = value.find("]")
        return (value[1:end], value[end + 2:]) if end > 0 and value[end + 1:end + 2] == ":" else None
    if value.count(":") != 1:
        return None
    host, port = value.split(":")
    return host, port


def _no_proxy(host: str, port: str, no_proxy: str) -> bool:
    """Whether `host:port` is reached directly: localhost and loopback addresses always, else as NO_PROXY says."""
    ip = _ip(host)
    if host == "localhost" or (ip is not None and ip.is_loopback):
        return True
    for entry in no_proxy.split(","):
        p = entry.strip().lower()
        if not p:
            continue
        if p == "*":
            return True
        if "/" in p:  # a CIDR
            with contextlib.suppress(ValueError):
                if ip is not None and ip in ipaddress.ip_network(p, strict=False):
                    return True
            continue
        phost, pport = _host_port(p) or (p, "")
        if not phost:
            continue
        pip = _ip(phost)
        if pip is not None:
            if pip == ip and pport in ("", port):
                return True
            continue
        if phost.startswith("*."):
            phost = phost[1:]
        exact_too = not phost.startswith(".")  # example.com: itself and its subdomains; .example.com: subdomains
        suffix = f".{phost}" if exact_too else phost
        if (host.endswith(suffix) or (exact_too and host == phost)) and pport in ("", port):
            return True
    return False


def environment_proxy(server: str, environ: Mapping[str, str]) -> str | None:
    """The proxy the environment names for `server` (HTTPS_PROXY for https://, HTTP_PROXY for http://, upper case
    first), unless NO_PROXY (or loopback) exempts it."""
    url = urlsplit(server)
    names = ("HTTPS_PROXY", "https_proxy") if url.scheme == "https" else ("HTTP_PROXY", "http_proxy")
    name, value = next(((n, environ[n]) for n in names if environ.get(n)), ("", ""))
    if not value:
        return None
    no_proxy = next((environ[n] for n in ("NO_PROXY", "no_proxy") if environ.get(n)), "")
    port = str(url.port or (443 if url.scheme == "https" else 80))
    if _no_proxy((url.hostname or "").lower(), port, no_proxy):
        return None
    return _proxy(value, name)


# -- impersonation, as client-go's ImpersonatingRoundTripper sends it

_TOKEN = frozenset(b"!#$&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


def _header_key(key: str) -> str:
    """An extra's key in a header name: bytes outside an HTTP token (and `%`) percent-encoded, as client-go does."""
    return "".join(chr(b) if b in _TOKEN else f"%{b:02X}" for b in key.encode())


def _impersonation(u: Mapping[str, Any], where: str) -> tuple[tuple[str, str], ...]:
    user, uid, groups, extra = u.get("as"), u.get("as-uid"), u.get("as-groups"), u.get("as-user-extra")
    if not user:
        for key in ("as-uid", "as-groups", "as-user-extra"):
            if u.get(key):
                raise ConfigError(f"{where}.{key} needs {where}.as (the user to impersonate)")
        return ()
    if groups is not None and (not isinstance(groups, list) or not all(isinstance(g, str) for g in groups)):
        raise ConfigError(f"{where}.as-groups: expected a list of strings")
    if extra is not None and (not isinstance(extra, dict) or not all(
            isinstance(v, list) and all(isinstance(x, str) for x in v) for v in extra.values())):
        raise ConfigError(f"{where}.as-user-extra: expected a mapping of keys to lists of strings")
    headers = [("Impersonate-User", str(user))]
    if uid:
        headers.append(("Impersonate-Uid", str(uid)))
    headers += [("Impersonate-Group", g) for g in groups or ()]
    headers += [(f"Impersonate-Extra-{_header_key(str(k))}", v) for k, values in (extra or {}).items() for v in values]
    return tuple(headers)


# -- kubeconfig


@dataclass(frozen=True)
class _Entry:
    """One named cluster, user or context, the directory its relative paths are relative to, and where it is
    (`kubeconfig PATH: users[0].user`) for messages."""

    body: dict[str, Any]
    directory: str
    where: str


def kubeconfig_paths(value: str | None) -> list[str]:
    """The files a KUBECONFIG-style value names (`:`-separated, empty parts skipped)."""
    return [p for p in (value or "").split(os.pathsep) if p]


def _read(p: Path) -> Any:
    try:
        text = p.read_bytes().decode()
    except OSError as exc:
        raise ConfigError(f"kubeconfig {p}: cannot read: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"kubeconfig {p}: not UTF-8 text (at byte {exc.start})") from exc
    try:
        return yaml_input.load(text)  # duplicate keys, deep nesting and alias bombs refused with their line
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or " ".join(str(exc).split())
        raise ConfigError(f"kubeconfig {p}: not valid YAML: {problem}{at}") from exc


def _merge(paths: Sequence[str]) -> tuple[str | None, dict[str, dict[str, _Entry]]]:
    current: str | None = None
    named: dict[str, dict[str, _Entry]] = {"clusters": {}, "users": {}, "contexts": {}}
    read = 0
    for path in paths:
        p = Path(path).expanduser()
        if not p.exists():
            continue  # as client-go: a missing file in a list is skipped
        if not p.is_file():
            raise ConfigError(f"kubeconfig {p}: not a file")
        doc = _read(p) or {}
        if not isinstance(doc, dict):
            raise ConfigError(f"kubeconfig {p}: not a mapping")
        read += 1
        current = current or doc.get("current-context") or None
        directory = str(p.resolve().parent)
        for section, key in (("clusters", "cluster"), ("users", "user"), ("contexts", "context")):
            items = doc.get(section) or []
            if not isinstance(items, list):
                raise ConfigError(f"kubeconfig {p}: {section}: expected a list")
            for i, item in enumerate(items):
                where = f"kubeconfig {p}: {section}[{i}]"
                if not isinstance(item, dict) or not isinstance(item.get(key) or {}, dict):
                    raise ConfigError(f"{where}: expected a mapping with a name and a {key} mapping")
                if item.get("name") is not None:
                    named[section].setdefault(str(item["name"]), _Entry(dict(item.get(key) or {}), directory,
                                                                        f"{where}.{key}"))
    if not read:
        where = f"kubeconfig {paths[0]}: no such file" if len(paths) == 1 else \
            f"no kubeconfig found at {os.pathsep.join(paths) or '(none)'}"
        raise ConfigError(where)
    return current, named


def _check_fields(entry: _Entry, fields: frozenset[str]) -> None:
    """Refuses, by name, any key the operator does not honour."""
    for key in entry.body:
        if key == "auth-provider":
            provider = entry.body[key]
            name = str(provider.get("name") or "") if isinstance(provider, dict) else ""
            instead = AUTH_PROVIDER_INSTEAD.get(name, "an exec credential plugin")
            raise ConfigError(f"{entry.where}.auth-provider ({name or 'unnamed'}) is not supported; use {instead}")
        if key not in fields:
            raise ConfigError(f"{entry.where}.{key} is not supported (a field the operator does not know is "
                              "refused, not ignored)")


def _flag(entry: _Entry, key: str) -> bool:
    """A true/false field: the string "false" is no false (client-go refuses it too)."""
    value = entry.body.get(key, False)
    if not isinstance(value, bool):
        raise ConfigError(f"{entry.where}.{key}: expected true or false, got {value!r}")
    return value


def _path(value: Any, directory: str) -> str:
    p = os.path.expanduser(str(value))
    return p if os.path.isabs(p) else os.path.join(directory, p)


def _b64(value: Any, what: str) -> bytes:
    try:
        return base64.b64decode(str(value), validate=False)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{what}: not base64: {exc}") from exc


class KubeConfig(CredentialSource):
    """A kubeconfig's current (or the named) context."""

    def __init__(self, paths: Sequence[str], context: str | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 now: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC),
                 environ: Mapping[str, str] | None = None) -> None:
        super().__init__()
        self.paths, self.context, self.clock, self.now = list(paths), context, clock, now
        self.environ = os.environ if environ is None else environ
        self.description = f"kubeconfig {os.pathsep.join(self.paths)}"
        self._exec_cache: Credentials | None = None
        self._load()

    def _load(self) -> None:
        current, named = _merge(self.paths)
        context_name = self.context or current
        if not context_name:
            raise ConfigError(f"{self.description}: no current-context")
        context = named["contexts"].get(context_name)
        if context is None:
            raise ConfigError(f"{self.description}: no context {context_name!r}")
        _check_fields(context, CONTEXT_FIELDS)
        cluster = named["clusters"].get(str(context.body.get("cluster") or ""))
        if cluster is None:
            raise ConfigError(f"{self.description}: context {context_name!r} names no known cluster "
                              f"({context.body.get('cluster')!r})")
        user_name = str(context.body.get("user") or "")
        user = named["users"].get(user_name, _Entry({}, cluster.directory, f"{self.description}: user {user_name!r}"))
        _check_fields(cluster, CLUSTER_FIELDS)
        _check_fields(user, USER_FIELDS)
        c, d = cluster.body, cluster.directory
        server = str(c.get("server") or "").rstrip("/")
        if not server:
            raise ConfigError(f"{cluster.where}.server: missing")
        ca = None
        if c.get("certificate-authority-data"):
            ca = _private_file(_b64(c["certificate-authority-data"], "certificate-authority-data"), "ca.crt")
        elif c.get("certificate-authority"):
            ca = _existing(_path(c["certificate-authority"], d), "certificate-authority")
        # client-go: the kubeconfig's proxy-url, else the environment's proxy (not both)
        proxy = _proxy(str(c["proxy-url"]), f"{cluster.where}.proxy-url") if c.get("proxy-url") else \
            environment_proxy(server, self.environ)
        base = Credentials(server=server, ca_path=ca, insecure=_flag(cluster, "insecure-skip-tls-verify"),
                           tls_server_name=str(c.get("tls-server-name") or "") or None, proxy_url=proxy)
        u, ud = user.body, user.directory
        cert = key = None
        if u.get("client-certificate-data"):
            cert = _private_file(_b64(u["client-certificate-data"], "client-certificate-data"), "client.crt")
        elif u.get("client-certificate"):
            cert = _existing(_path(u["client-certificate"], ud), "client-certificate")
        if u.get("client-key-data"):
            key = _private_file(_b64(u["client-key-data"], "client-key-data"), "client.key")
        elif u.get("client-key"):
            key = _existing(_path(u["client-key"], ud), "client-key")
        if bool(cert) != bool(key):
            raise ConfigError(f"{self.description}: user {user_name!r} has a client certificate without its key "
                              "or a key without its certificate")
        username, password = u.get("username"), u.get("password")
        self._base = replace(base, certificate_path=cert, private_key_path=key, token=u.get("token") or None,
                             username=None if username is None else str(username),
                             password=None if password is None else str(password),
                             impersonation=_impersonation(u, user.where))
        self._token_file = None if u.get("token") or not u.get("tokenFile") else _TokenFile(
            _path(u["tokenFile"], ud), self.clock)
        self._exec = None
        if u.get("exec"):
            if not isinstance(u["exec"], dict):
                raise ConfigError(f"{user.where}.exec: expected a mapping")
            spec = _Entry(u["exec"], ud, f"{user.where}.exec")
            _check_fields(spec, EXEC_FIELDS)
            self._exec = _ExecPlugin(spec, base, c)
        self._exec_cache = None

    def _current(self) -> Credentials:
        creds = self._base
        if self._token_file is not None:
            creds = replace(creds, token=self._token_file.get())
        if self._exec is not None and not creds.token:
            cached = self._exec_cache
            if cached is None or (cached.expiration is not None and cached.expiration - EXPIRY_MARGIN <= self.now()):
                cached = self._exec_cache = self._exec.run(self.now)
            creds = replace(creds, token=cached.token, expiration=cached.expiration,
                            certificate_path=cached.certificate_path or creds.certificate_path,
                            private_key_path=cached.private_key_path or creds.private_key_path)
        return creds

    def _reload(self) -> Credentials:
        self._load()
        return self._current()


class _ExecPlugin:
    """A client-go credential plugin: a command that prints an ExecCredential."""

    def __init__(self, entry: _Entry, cluster: Credentials, cluster_body: Mapping[str, Any]) -> None:
        spec, directory, where = entry.body, entry.directory, entry.where
        command = str(spec.get("command") or "")
        if not command:
            raise ConfigError(f"{where}.command: missing")
        # As client-go: a relative command with a path separator is relative to the kubeconfig's directory.
        if os.sep in command and not os.path.isabs(command):
            command = os.path.join(directory, command)
        self.argv = [command, *(str(a) for a in spec.get("args") or ())]
        self.env = {str(e["name"]): str(e.get("value", "")) for e in spec.get("env") or () if isinstance(e, dict)}
        self.api_version = str(spec.get("apiVersion") or EXEC_API_VERSIONS[0])
        if self.api_version not in EXEC_API_VERSIONS:
            raise ConfigError(f"{where}.apiVersion: {self.api_version!r} is not one of {', '.join(EXEC_API_VERSIONS)}")
        if spec.get("interactiveMode") not in (None, "Never", "IfAvailable"):
            raise ConfigError(f"{where}.interactiveMode: {spec['interactiveMode']!r} is not supported: the operator "
                              "runs the plugin without a terminal (Never or IfAvailable)")
        self.hint = str(spec.get("installHint") or "")
        info: dict[str, Any] = {"apiVersion": self.api_version, "kind": "ExecCredential",
                                "spec": {"interactive": False}}
        if _flag(entry, "provideClusterInfo"):
            cluster_info: dict[str, Any] = {"server": cluster.server, "insecure-skip-tls-verify": cluster.insecure}
            if cluster.ca_path:
                with contextlib.suppress(OSError):
                    cluster_info["certificate-authority-data"] = base64.b64encode(
                        Path(cluster.ca_path).read_bytes()).decode("ascii")
            if cluster.tls_server_name:
                cluster_info["tls-server-name"] = cluster.tls_server_name
            for key in ("proxy-url", "disable-compression"):  # the kubeconfig's, as client-go passes them
                if cluster_body.get(key):
                    cluster_info[key] = cluster_body[key]
            for ext in cluster_body.get("extensions") or ():
                if isinstance(ext, dict) and ext.get("name") == EXEC_CLUSTER_EXTENSION:
                    cluster_info["config"] = ext.get("extension")
            info["spec"]["cluster"] = cluster_info
        self.exec_info = json.dumps(info)

    def run(self, now: Callable[[], datetime.datetime]) -> Credentials:
        shown = " ".join(self.argv)
        env = {**os.environ, **self.env, "KUBERNETES_EXEC_INFO": self.exec_info}
        try:
            done = subprocess.run(self.argv, env=env, capture_output=True, stdin=subprocess.DEVNULL,
                                  timeout=EXEC_TIMEOUT)
        except FileNotFoundError as exc:
            raise ConfigError(f"exec plugin {shown!r}: command not found{': ' + self.hint if self.hint else ''}") from exc
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ConfigError(f"exec plugin {shown!r}: {exc}") from exc
        if done.returncode != 0:
            err = done.stderr.decode(errors="replace").strip()[-500:]
            raise ConfigError(f"exec plugin {shown!r} exited with {done.returncode}: {err or '(no output)'}")
        try:
            cred = json.loads(done.stdout)
        except ValueError as exc:
            raise ConfigError(f"exec plugin {shown!r}: its output is not an ExecCredential: {exc}") from exc
        if not isinstance(cred, dict) or cred.get("kind") != "ExecCredential":
            raise ConfigError(f"exec plugin {shown!r}: its output is not an ExecCredential")
        if cred.get("apiVersion") != self.api_version:
            raise ConfigError(f"exec plugin {shown!r}: answered apiVersion {cred.get('apiVersion')!r}, "
                              f"asked {self.api_version!r}")
        status = cred.get("status") or {}
        token = status.get("token") or None
        cert_data, key_data = status.get("clientCertificateData"), status.get("clientKeyData")
        if not token and not (cert_data and key_data):
            raise ConfigError(f"exec plugin {shown!r}: its ExecCredential has neither status.token nor "
                              "status.clientCertificateData and clientKeyData")
        expiration = None
        if status.get("expirationTimestamp"):
            try:
                expiration = datetime.datetime.fromisoformat(str(status["expirationTimestamp"]).replace("Z", "+00:00"))
            except ValueError as exc:
                raise ConfigError(f"exec plugin {shown!r}: bad expirationTimestamp: {exc}") from exc
            if expiration.tzinfo is None:
                expiration = expiration.replace(tzinfo=datetime.UTC)
        cert = _private_file(str(cert_data).encode(), "exec-client.crt") if cert_data and key_data else None
        key = _private_file(str(key_data).encode(), "exec-client.key") if cert_data and key_data else None
        log.debug("Ran the exec credential plugin command=%s expires=%s", self.argv[0], expiration)
        return Credentials(server="", token=token, certificate_path=cert, private_key_path=key, expiration=expiration)


# -- files for -data values

_private_dir: str | None = None
_private_lock = threading.Lock()


def _private_file(data: bytes, name: str) -> str:
    """`data` in a file of our private directory (0600), named by its content: the same data, the same file."""
    global _private_dir  # noqa: PLW0603 - one directory per process, removed at exit
    with _private_lock:
        if _private_dir is None:
            _private_dir = tempfile.mkdtemp(prefix="triton-operator-credentials-")
            atexit.register(shutil.rmtree, _private_dir, True)
        path = os.path.join(_private_dir, f"{hashlib.sha256(data).hexdigest()[:16]}-{name}")
        if not os.path.exists(path):
            tmp = f"{path}.{os.getpid()}.{threading.get_ident()}"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        return path


def _existing(path: str, what: str) -> str:
    if not os.path.isfile(path):
        raise ConfigError(f"{what}: no file {path}")
    return path


# -- selection


def load(kubeconfig: str | None = None, *, environ: Mapping[str, str] | None = None,
         service_account_dir: str = SERVICE_ACCOUNT_DIR) -> CredentialSource:
    """As the operator always chose: the kubeconfig asked for, else in-cluster, else `$KUBECONFIG`, else
    `~/.kube/config`."""
    env = os.environ if environ is None else environ
    if kubeconfig:
        return KubeConfig(kubeconfig_paths(kubeconfig))
    if InCluster.available(env, service_account_dir):
        return InCluster(env, service_account_dir)
    paths = kubeconfig_paths(env.get("KUBECONFIG")) or [os.path.join(os.path.expanduser("~"), ".kube", "config")]
    return KubeConfig(paths, environ=env)
