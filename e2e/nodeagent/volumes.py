"""Pod volumes for the node agent: what a pod's containers see at their mountPaths.

Owns turning `spec.volumes` into host directories under the pod's directory: ConfigMap, Secret,
downwardAPI and projected (serviceAccountToken, configMap, secret, downwardAPI) volumes are
written with the kubelet's atomic-writer layout (`..<timestamp>/` holding the files, `..data`
pointing at it, user-visible symlinks on top), so a container sees exactly what it would see on
a real node - including the `..data` entries that trip up programs scanning the directory.
emptyDir is a plain directory, hostPath is the host path, a persistentVolumeClaim is a directory
per claim that outlives the pod. Sources are re-read on `refresh()`, like the kubelet's resync.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import logging
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from e2e.kube import ApiError, Kube

log = logging.getLogger("nodeagent.volumes")

DEFAULT_MODE = 0o644


class VolumeError(Exception):
    """A volume cannot be set up yet (missing source) or at all (unsupported kind)."""


Payload = dict[str, tuple[bytes, int]]


@dataclass
class PodVolumes:
    kube: Kube
    pod: dict
    pod_dir: Path
    claims_dir: Path
    paths: dict[str, Path] = field(default_factory=dict)
    _tokens: dict[str, tuple[str, float]] = field(default_factory=dict)

    @property
    def ns(self) -> str:
        return self.pod["metadata"]["namespace"]

    def setup(self) -> dict[str, Path]:
        """Materialises every volume; raises VolumeError naming the first one that cannot be."""
        for vol in self.pod["spec"].get("volumes") or []:
            self.paths[vol["name"]] = self._one(vol)
        return self.paths

    def refresh(self) -> None:
        """Re-reads ConfigMap/Secret/downward/token sources and swaps changed payloads atomically."""
        for vol in self.pod["spec"].get("volumes") or []:
            if any(k in vol for k in ("configMap", "secret", "downwardAPI", "projected")):
                with contextlib.suppress(VolumeError, ApiError, OSError):
                    self._one(vol)

    def _one(self, vol: dict) -> Path:
        name = vol["name"]
        target = self.pod_dir / "volumes" / name
        if "emptyDir" in vol or "ephemeral" in vol:
            target.mkdir(parents=True, exist_ok=True)
            os.chmod(target, 0o777)
            return target
        if "hostPath" in vol:
            return _host_path(vol["hostPath"])
        if "persistentVolumeClaim" in vol:
            claim = self.claims_dir / self.ns / vol["persistentVolumeClaim"]["claimName"]
            claim.mkdir(parents=True, exist_ok=True)
            return claim
        if "configMap" in vol:
            payload = self._configmap(vol["configMap"], vol["configMap"].get("defaultMode", DEFAULT_MODE))
        elif "secret" in vol:
            payload = self._secret(vol["secret"], vol["secret"].get("defaultMode", DEFAULT_MODE))
        elif "downwardAPI" in vol:
            payload = self._downward(vol["downwardAPI"], vol["downwardAPI"].get("defaultMode", DEFAULT_MODE))
        elif "projected" in vol:
            payload = self._projected(vol["projected"])
        else:
            kinds = sorted(k for k in vol if k != "name")
            raise VolumeError(f"volume {name!r}: the e2e node agent does not support volume type {kinds}")
        target.mkdir(parents=True, exist_ok=True)
        atomic_write(target, payload)
        return target

    # -- sources --------------------------------------------------------------------------------

    def _configmap(self, src: dict, default_mode: int) -> Payload:
        name = src.get("name", "")
        cm = self.kube.get_or_none("ConfigMap", name, self.ns)
        if cm is None:
            if src.get("optional"):
                return {}
            raise VolumeError(f'configmap "{name}" not found')
        data = {k: v.encode() for k, v in (cm.get("data") or {}).items()}
        data.update({k: base64.b64decode(v) for k, v in (cm.get("binaryData") or {}).items()})
        return _select(data, src, default_mode, f'configmap "{name}"')

    def _secret(self, src: dict, default_mode: int) -> Payload:
        name = src.get("secretName") or src.get("name", "")
        secret = self.kube.get_or_none("Secret", name, self.ns)
        if secret is None:
            if src.get("optional"):
                return {}
            raise VolumeError(f'secret "{name}" not found')
        data = {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}
        return _select(data, src, default_mode, f'secret "{name}"')

    def _downward(self, src: dict, default_mode: int) -> Payload:
        out: Payload = {}
        for item in src.get("items") or []:
            if "fieldRef" in item:
                value = field_value(self.pod, item["fieldRef"]["fieldPath"])
            else:
                value = resource_value(self.pod, item["resourceFieldRef"])
            out[item["path"]] = (value.encode(), item.get("mode", default_mode))
        return out

    def _projected(self, src: dict) -> Payload:
        mode = src.get("defaultMode", DEFAULT_MODE)
        out: Payload = {}
        for source in src.get("sources") or []:
            if "configMap" in source:
                out.update(self._configmap(source["configMap"], mode))
            elif "secret" in source:
                out.update(self._secret(source["secret"], mode))
            elif "downwardAPI" in source:
                out.update(self._downward(source["downwardAPI"], mode))
            elif "serviceAccountToken" in source:
                tok = source["serviceAccountToken"]
                out[tok["path"]] = (self._token(tok).encode(), mode)
            else:
                raise VolumeError(f"projected source {sorted(source)} is not supported by the e2e node agent")
        return out

    def _token(self, src: dict) -> str:
        """A bound service-account token, re-requested after 80% of its lifetime like the kubelet."""
        key = json.dumps(src, sort_keys=True)
        cached = self._tokens.get(key)
        if cached and time.time() < cached[1]:
            return cached[0]
        md = self.pod["metadata"]
        sa = self.pod["spec"].get("serviceAccountName") or "default"
        expiry = int(src.get("expirationSeconds") or 3600)
        spec: dict[str, Any] = {
            "expirationSeconds": expiry,
            "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": md["name"], "uid": md["uid"]},
        }
        if src.get("audience"):
            spec["audiences"] = [src["audience"]]
        req = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
        try:
            resp = self.kube.request(
                "POST", f"/api/v1/namespaces/{self.ns}/serviceaccounts/{sa}/token", req
            )
        except ApiError as e:
            raise VolumeError(f"failed to fetch token for service account {sa!r}: {e}") from e
        token = resp["status"]["token"]
        self._tokens[key] = (token, time.time() + 0.8 * expiry)
        return token


def _select(data: dict[str, bytes], src: dict, default_mode: int, what: str) -> Payload:
    items = src.get("items")
    if not items:
        return {k: (v, default_mode) for k, v in data.items()}
    out: Payload = {}
    for item in items:
        if item["key"] not in data:
            if src.get("optional"):
                continue
            raise VolumeError(f"{what} has no key {item['key']!r}")
        out[item["path"]] = (data[item["key"]], item.get("mode", default_mode))
    return out


def _host_path(spec: dict) -> Path:
    path = Path(spec["path"])
    kind = spec.get("type", "")
    if kind == "DirectoryOrCreate":
        path.mkdir(parents=True, exist_ok=True)
    elif kind == "FileOrCreate":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(exist_ok=True)
    elif kind in ("Directory", "File", "Socket", "CharDevice", "BlockDevice") and not path.exists():
        raise VolumeError(f"hostPath {path} does not exist (type {kind})")
    return path


# -- the kubelet's atomic writer layout ----------------------------------------------------------


def _digest(payload: Payload) -> str:
    h = hashlib.sha256()
    for k in sorted(payload):
        h.update(k.encode() + b"\0" + payload[k][0] + b"\0" + str(payload[k][1]).encode())
    return h.hexdigest()


def atomic_write(target: Path, payload: Payload) -> bool:
    """Writes `payload` under target/..<ts>/, flips target/..data, links top-level names.

    Returns False (and touches nothing) when the current content is already `payload`.
    """
    data_link = target / "..data"
    digest = _digest(payload)
    stamp = target.parent / f".{target.name}.digest"  # beside the volume: its content stays the kubelet's
    if data_link.is_symlink() and stamp.exists() and stamp.read_text() == digest:
        return False
    ts = time.strftime("..%Y_%m_%d_%H_%M_%S.", time.gmtime()) + digest[:8] + f"{time.time_ns() % 10**6:06d}"
    ts_dir = target / ts
    ts_dir.mkdir()
    for rel, (content, mode) in payload.items():
        rel = rel.lstrip("/")
        if ".." in Path(rel).parts:
            raise VolumeError(f"volume path {rel!r} must not contain '..'")
        dest = ts_dir / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(content)
        os.chmod(dest, mode & 0o777)
    old = os.readlink(data_link) if data_link.is_symlink() else None
    tmp_link = target / "..data_tmp"
    with contextlib.suppress(FileNotFoundError):
        tmp_link.unlink()
    os.symlink(ts, tmp_link)
    os.replace(tmp_link, data_link)
    top = {Path(rel.lstrip("/")).parts[0] for rel in payload}
    for name in top:
        link = target / name
        if not link.is_symlink():
            os.symlink(f"..data/{name}", link)
    for entry in target.iterdir():
        if entry.name.startswith(".."):
            continue
        if entry.is_symlink() and entry.name not in top:
            entry.unlink()
    if old and old != ts:
        shutil.rmtree(target / old, ignore_errors=True)
    stamp.write_text(digest)
    return True


# -- downward API values (shared with env vars) --------------------------------------------------


def field_value(pod: dict, path: str) -> str:
    md, spec, status = pod["metadata"], pod["spec"], pod.get("status") or {}
    if path.startswith(("metadata.labels[", "metadata.annotations[")):
        which, _, key = path.partition("[")
        mapping = md.get(which.split(".")[1]) or {}
        return str(mapping.get(key.rstrip("]").strip("'\""), ""))
    if path in ("metadata.labels", "metadata.annotations"):
        mapping = md.get(path.split(".")[1]) or {}
        return "\n".join(f'{k}="{v}"' for k, v in sorted(mapping.items()))
    simple = {
        "metadata.name": md.get("name"),
        "metadata.namespace": md.get("namespace"),
        "metadata.uid": md.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName"),
        "status.hostIP": status.get("hostIP"),
        "status.podIP": status.get("podIP"),
        "status.hostIPs": ",".join(a["ip"] for a in status.get("hostIPs") or []),
        "status.podIPs": ",".join(a["ip"] for a in status.get("podIPs") or []),
    }
    if path not in simple:
        raise VolumeError(f"unsupported downward API fieldPath {path!r}")
    return str(simple[path] or "")


def resource_value(pod: dict, ref: dict, container_name: str | None = None) -> str:
    name = ref.get("containerName") or container_name
    container = next((c for c in pod["spec"]["containers"] if c["name"] == name), None)
    if container is None:
        raise VolumeError(f"resourceFieldRef names unknown container {name!r}")
    kind, _, res = ref["resource"].partition(".")
    value = ((container.get("resources") or {}).get(kind) or {}).get(res)
    if value is None:
        value = {"cpu": "8", "memory": str(32 * 1024**3), "ephemeral-storage": str(100 * 1024**3)}.get(res, "0")
    divisor = ref.get("divisor") or ("1" if res != "cpu" else "1")
    return str(_ceil_div(_quantity(str(value)), _quantity(str(divisor))))


_SUFFIX = {"m": 1e-3, "": 1, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "Ki": 1024, "Mi": 1024**2, "Gi": 1024**3,
           "Ti": 1024**4}


def _quantity(q: str) -> float:
    for suffix in sorted(_SUFFIX, key=len, reverse=True):
        if suffix and q.endswith(suffix):
            return float(q[: -len(suffix)]) * _SUFFIX[suffix]
    return float(q)


def _ceil_div(a: float, b: float) -> int:
    import math

    return max(1, math.ceil(a / b)) if a else 0
