"""Security properties that hold by construction, checked on the code and on what it renders.

- No user string reaches a shell: nothing in the operator calls a shell, and every process the
  operator's objects start is an argument array without `sh -c`.
- Names are validated: hostile names are refused with the field named.
- The rendered pods: the `fetch` init step runs as non-root, with no privilege escalation; every pod
  passes the Pod Security Standards' "restricted" profile (checked here as the profile's rules; by the API
  server's own admission in e2e/test_defects.py).
(S3/GCS credentials by Secret name and the ConfigMap size limit: tests/test_render_children.py.)
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from triton_operator.api.v1alpha1 import TritonModel
from triton_operator.render.kubernetes import render_children
from triton_operator.render.modelconfig import render_repository
from triton_operator.validate.admission import review

SOURCE = Path(__file__).resolve().parent.parent / "operator" / "triton_operator"
SHELLS = {"sh", "bash", "/bin/sh", "/bin/bash", "dash", "zsh"}
HOSTILE = "$(touch${IFS}/tmp/pwned);`id`|x&&y>/etc/passwd"  # no blanks: a URI has none


def _calls(tree: ast.AST) -> list[tuple[str, ast.Call]]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            base = f.value.id if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) else ""
            out.append((f"{base}.{name}" if base else name, node))
    return out


def test_the_operator_never_calls_a_shell() -> None:
    offenders = []
    files = sorted(SOURCE.rglob("*.py"))
    assert len(files) > 20
    for path in files:
        tree = ast.parse(path.read_text(), filename=str(path))
        for name, call in _calls(tree):
            where = f"{path.relative_to(SOURCE)}:{call.lineno} {name}"
            if name in ("os.system", "os.popen", "create_subprocess_shell", "subprocess.getoutput",
                        "subprocess.getstatusoutput"):
                offenders.append(where)
            for kw in call.keywords:
                if kw.arg == "shell" and not (isinstance(kw.value, ast.Constant) and kw.value.value is False):
                    offenders.append(f"{where} shell=...")
            if call.args and isinstance(call.args[0], ast.Constant) and isinstance(call.args[0].value, str) and \
                    name.startswith("subprocess."):
                offenders.append(f"{where} with a command string")
    assert not offenders, offenders


def _model(**spec: object) -> TritonModel:
    return TritonModel.model_validate({
        "apiVersion": "serving.triton-operator.dev/v1alpha1", "kind": "TritonModel", "metadata": {"name": "m"},
        "spec": {"backend": "python", "source": {"inline": {"model.py": "pass\n"}}, **spec}})


def test_rendered_containers_are_argument_arrays_without_a_shell() -> None:
    for source in ({"inline": {"model.py": "pass\n"}}, {"uri": f"s3://bucket/{HOSTILE}", "credentialsSecret": "creds"},
                   {"uri": f"https://models.example/{HOSTILE}"}):
        m = _model(source=source)
        dep = next(c for c in render_children(m, render_repository([m]), "uid", "ns") if c["kind"] == "Deployment")
        pod = dep["spec"]["template"]["spec"]
        for c in [*pod.get("initContainers", []), *pod["containers"]]:
            argv = [*c.get("command", []), *c.get("args", [])]
            assert all(isinstance(a, str) for a in argv), c["name"]
            assert not (set(argv) & SHELLS) and "-c" not in argv, f"{c['name']} runs a shell: {argv}"
            carrying = [a for a in argv if HOSTILE in a]
            assert carrying in ([], [f"m={source.get('uri')}"]), f"{c['name']}: the URI is not one whole argument: {argv}"
        if "uri" in source:  # the user's URI travels as exactly one argument of `fetch`
            (fetch,) = pod["initContainers"]
            assert f"m={source['uri']}" in fetch["args"]


def test_the_fetch_init_step_runs_as_non_root_without_privileges() -> None:
    m = _model(source={"uri": "https://example.com/m.tar.gz", "sha256": "a" * 64})
    dep = next(c for c in render_children(m, render_repository([m]), "uid", "ns") if c["kind"] == "Deployment")
    (fetch,) = dep["spec"]["template"]["spec"]["initContainers"]
    sc = fetch["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc.get("runAsUser", 65532) != 0


@pytest.mark.parametrize(("path", "value", "field"), [
    (("metadata", "name"), "m;reboot", "metadata.name"),
    (("spec", "modelName"), "$(reboot)", "spec.modelName"),
    (("spec", "modelName"), "../../etc", "spec.modelName"),
    (("spec", "source", "inline"), {"../model.py": "x"}, "spec.source.inline"),
    (("spec", "source", "uri"), "file:///etc/passwd", "spec.source.uri"),
    (("spec", "source", "credentialsSecret"), "Creds With Spaces", "spec.source.credentialsSecret"),
    (("spec", "inputs"), [{"name": "x;y", "dataType": "FP32", "dims": [1]}], "spec.inputs[0].name"),
])
def test_hostile_names_are_refused_with_the_field_named(path: tuple[str, ...], value: object, field: str) -> None:
    body = {"apiVersion": "serving.triton-operator.dev/v1alpha1", "kind": "TritonModel", "metadata": {"name": "m"},
            "spec": {"backend": "python", "source": {"inline": {"model.py": "pass\n"}}}}
    node: dict = body
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    if path[-1] == "credentialsSecret":
        body["spec"]["source"] = {"uri": "s3://bucket/m", "credentialsSecret": value}
    verdict = review(body, None, {})
    assert not verdict.allowed
    assert any(e.path.startswith(field) for e in verdict.errors), verdict.errors


# -- Pod Security Standards "restricted" ----------------------------------------------------------

#: Volume types the "restricted" profile allows (pod-security-admission, policy/restricted_volumes.go).
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected",
                      "secret"}


def restricted_violations(pod: dict) -> list[str]:
    """What the Pod Security Standards "restricted" profile (latest) refuses in a pod spec: the baseline
    controls our pods could touch, and every restricted one."""
    out = []
    psc = pod.get("securityContext") or {}
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(key):
            out.append(f"pod {key}")
    for v in pod.get("volumes") or ():
        kinds = set(v) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            out.append(f"volume {v['name']}: {sorted(kinds - RESTRICTED_VOLUMES)}")
    if psc.get("runAsUser") == 0:
        out.append("pod runAsUser 0")
    pod_seccomp = (psc.get("seccompProfile") or {}).get("type")
    if pod_seccomp is not None and pod_seccomp not in ("RuntimeDefault", "Localhost"):
        out.append(f"pod seccompProfile {pod_seccomp}")
    for c in [*pod.get("initContainers", []), *pod["containers"]]:
        sc, name = c.get("securityContext") or {}, c["name"]
        if sc.get("privileged"):
            out.append(f"{name}: privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{name}: allowPrivilegeEscalation != false")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or ()):
            out.append(f"{name}: capabilities.drop lacks ALL")
        if set(caps.get("add") or ()) - {"NET_BIND_SERVICE"}:
            out.append(f"{name}: capabilities.add {caps['add']}")
        if sc.get("runAsNonRoot", psc.get("runAsNonRoot")) is not True:
            out.append(f"{name}: runAsNonRoot != true")
        if sc.get("runAsUser") == 0:
            out.append(f"{name}: runAsUser 0")
        seccomp = (sc.get("seccompProfile") or {}).get("type") or pod_seccomp
        if seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(f"{name}: seccompProfile {seccomp}")
        if any(p.get("hostPort") for p in c.get("ports") or ()):
            out.append(f"{name}: hostPort")
    return out


@pytest.mark.parametrize("source", [
    {"inline": {"model.py": "pass\n"}},
    {"uri": "pvc://models/m"},
    {"uri": "gs://bucket/m/", "credentialsSecret": "gcs"},
    {"uri": "s3://bucket/m/", "credentialsSecret": "s3"},
], ids=["inline", "pvc", "gcs", "s3"])
def test_rendered_pods_pass_pod_security_restricted(source: dict) -> None:
    m = _model(source=source)
    dep = next(c for c in render_children(m, render_repository([m]), "uid", "ns") if c["kind"] == "Deployment")
    pod = dep["spec"]["template"]["spec"]
    assert not restricted_violations(pod), restricted_violations(pod)
    # tritonserver runs as the same unprivileged user as fetch, on a read-only root filesystem: the Python
    # backend's /tmp/python_env_* (and HOME) go to an emptyDir.
    triton, probe = pod["containers"]
    assert probe["securityContext"]["readOnlyRootFilesystem"] is True and probe["name"] == "probe"
    assert pod["securityContext"]["runAsUser"] == 65532 and pod["securityContext"]["runAsNonRoot"] is True
    assert triton["securityContext"]["readOnlyRootFilesystem"] is True
    tmp = next(m["name"] for m in triton["volumeMounts"] if m["mountPath"] == "/tmp")
    assert {"name": tmp, "emptyDir": {"sizeLimit": "4Gi"}} in pod["volumes"]
    assert {"name": "HOME", "value": "/tmp"} in triton["env"]


def test_every_example_renders_pods_that_pass_pod_security_restricted() -> None:
    from triton_operator.files import load_paths
    from triton_operator.validate import check_documents

    loaded = check_documents(load_paths([Path(__file__).resolve().parent.parent / "examples"]))
    models = [m for _, m in loaded.models]
    rendered = render_repository(models)
    assert len(models) >= 9
    for m in models:
        dep = next(c for c in render_children(m, rendered, "uid", "ns") if c["kind"] == "Deployment")
        assert not restricted_violations(dep["spec"]["template"]["spec"]), (m.name, restricted_violations(
            dep["spec"]["template"]["spec"]))


def test_every_example_replica_restricts_the_repository_api_to_a_key_it_reads_from_a_secret() -> None:
    """Issue 32: no replica leaves Triton's repository API (load, unload, index) open to its Service's clients, and
    none carries the key in its pod spec (tests/test_repository_key.py has the details)."""
    from triton_operator.files import load_paths
    from triton_operator.render.kubernetes import Options
    from triton_operator.render.repository_key import RepositoryKeys
    from triton_operator.validate import check_documents

    keys = RepositoryKeys(b"s" * 32)
    loaded = check_documents(load_paths([Path(__file__).resolve().parent.parent / "examples"]))
    models = [m for _, m in loaded.models]
    rendered = render_repository(models)
    for m in models:
        dep = next(c for c in render_children(m, rendered, "uid", "ns", Options(repository_keys=keys))
                   if c["kind"] == "Deployment")
        (triton,) = [c for c in dep["spec"]["template"]["spec"]["containers"] if c["name"] == "tritonserver"]
        restricted = [a.split("=", 1)[1] for a in triton["args"]
                      if a.startswith(("--http-restricted-api=", "--grpc-restricted-protocol="))]
        assert restricted == ["model-repository,shared-memory,logging,trace:triton-operator-key="
                              "$(TRITON_OPERATOR_REPOSITORY_KEY)"] * 2, m.name
        assert keys.key("ns", m.name, "uid") not in str(dep), m.name
