"""Security properties that hold by construction, checked on the code and on what it renders.

- No user string reaches a shell: nothing in the operator calls a shell, and every process the
  operator's objects start is an argument array without `sh -c`.
- Names are validated: hostile names are refused with the field named.
- The rendered pods: the `fetch` init step runs as non-root, with no privilege escalation.
(S3/GCS credentials by Secret name and the ConfigMap size limit: tests/test_children.py.)
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
    m = _model()
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
