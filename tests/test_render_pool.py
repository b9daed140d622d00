"""A pool's objects (`render.pool`, issue 29), byte for byte and by what they must say: the pool's Deployment of
examples/pool.yaml (as written, and with a repository master key), each pooled model's selectorless Service, and
their EndpointSlices for one placement of the example on three replicas, some not Ready, one terminating, some not
serving a model yet, equal to tests/golden/pool.json. A change that means to alter them regenerates the file
(`.venv/bin/python -m tests.test_render_pool`) and the diff shows what changed."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from triton_operator.api.pool import ENDPOINTSLICE_MANAGER, HANDOVER_CONDITION, LABEL_POOL_TEMPLATE, TritonPool
from triton_operator.api.v1alpha1 import TritonModel
from triton_operator.files import load_paths
from triton_operator.plan.placement import PoolReplica, place
from triton_operator.render.kubernetes import Options
from triton_operator.render.pool import (
    ReplicaPod,
    render_endpoint_slices,
    render_model_service,
    render_pool_children,
    render_pool_deployment,
    template_digest,
)
from triton_operator.render.repository_key import RepositoryKeys
from triton_operator.validate import check_documents

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden" / "pool.json"
UID = "00000000-0000-0000-0000-0000000000c2"
KEYS = RepositoryKeys(b"golden-master-key-of-32-bytes-ok")
REPLICAS = [PoolReplica("shared-a", "node-0"), PoolReplica("shared-b", "node-0"), PoolReplica("shared-c", "node-1")]
PODS = {
    "shared-a": ReplicaPod("shared-a", "uid-a", "198.18.200.10", "node-0", ready=True, terminating=False),
    "shared-b": ReplicaPod("shared-b", "uid-b", "198.18.200.11", "node-0", ready=False, terminating=False),
    "shared-c": ReplicaPod("shared-c", "uid-c", "198.18.201.10", "node-1", ready=True, terminating=True),
}


def _example() -> tuple[TritonPool, list[TritonModel]]:
    loaded = check_documents(load_paths([ROOT / "examples" / "pool.yaml"]))
    assert not loaded.errors, [str(e) for e in loaded.errors]
    ((_, pool),) = loaded.pools
    return pool, [m for _, m in loaded.models]


def rendered() -> dict[str, Any]:
    pool, models = _example()
    placement = place(pool, REPLICAS, models, {})
    out: dict[str, Any] = {
        "children": render_pool_children(pool, UID, "golden"),
        "deployment-keys": render_pool_deployment(pool, UID, "golden", Options(repository_keys=KEYS)),
        "placement": {name: list(where) for name, where in placement.copies.items()},
    }
    for m in sorted(models, key=lambda m: m.name):
        where = placement.copies[m.name]
        serving = where[:1]  # the first copy serves, the others are still loading
        out[f"service/{m.name}"] = render_model_service(m, UID, "golden")
        out[f"slices/{m.name}"] = render_endpoint_slices(m, UID, "golden", where, PODS, serving)
    return out


def _text(objects: dict[str, Any]) -> str:
    return json.dumps(objects, indent=1) + "\n"


def test_the_pool_example_renders_as_before() -> None:
    objects = rendered()
    golden = json.loads(GOLDEN.read_text())
    assert sorted(objects) == sorted(golden), "the same objects as the golden file"
    for key, value in objects.items():
        assert value == golden[key], f"{key}: differs from tests/golden/pool.json"
    assert _text(objects) == GOLDEN.read_text(), "byte for byte, key order included"


def test_a_pool_replica_starts_tritonserver_with_no_model_in_explicit_mode() -> None:
    pool, _ = _example()
    deployment = render_pool_deployment(pool, UID, "ns")
    spec = deployment["spec"]["template"]["spec"]
    triton, probe, fetcher = spec["containers"]
    args = triton["args"]
    assert "--model-control-mode=explicit" in args and not any(a.startswith("--load-model") for a in args)
    assert "--strict-readiness=false" in args, "one model loading must not make the replica unready for the others"
    assert any(a.startswith("--http-restricted-api=model-repository,shared-memory,logging,trace:") for a in args), \
        "the repository and admin APIs are keyed"
    assert spec["readinessGates"] == [{"conditionType": HANDOVER_CONDITION}], \
        "readiness is per model, in the slices; the pod's gate is its handover in a rollout (plan.pool.rollout)"
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    template = {**deployment["spec"]["template"], "metadata": {
        **deployment["spec"]["template"]["metadata"],
        "labels": {k: v for k, v in labels.items() if k != LABEL_POOL_TEMPLATE}}}
    assert labels[LABEL_POOL_TEMPLATE] == template_digest(template), "the label is a digest of the rest of the template"
    assert LABEL_POOL_TEMPLATE not in deployment["spec"]["selector"]["matchLabels"], "never in the selector"
    assert probe["name"] == "probe" and "--model" not in probe["args"]
    # The probe holds the pool's key, from the Secret tritonserver reads it from: its /status answers only the
    # operator (issue 39).
    key_env = next(e for e in triton["env"] if e["name"] == "TRITON_OPERATOR_REPOSITORY_KEY")
    assert probe["env"] == [key_env] and key_env["valueFrom"]["secretKeyRef"]["name"].startswith("shared-pool-")
    assert deployment["metadata"]["name"] == "shared-pool", "apart from a TritonModel's Deployment named shared"
    assert deployment["spec"]["replicas"] == 3 and deployment["spec"]["selector"]["matchLabels"] == {
        "serving.triton-operator.dev/pool": "shared"}
    assert triton["resources"] == {"requests": {"cpu": "500m", "memory": "2Gi"}, "limits": {"memory": "3Gi"}}
    # The fetch-server sidecar writes the repository volume tritonserver reads, on the operator's keyed request.
    assert fetcher["name"] == "fetch-server" and fetcher["args"][0] == "fetch-server"
    mounts = {m["name"]: m for c in (triton, fetcher) for m in c["volumeMounts"] if m["name"] == "models"}
    assert [m.get("readOnly", False) for c in (triton, fetcher) for m in c["volumeMounts"]
            if m["name"] == "models"] == [True, False] and mounts
    assert {m["mountPath"] for c in (triton, fetcher) for m in c["volumeMounts"] if m["name"] == "models"} == {
        "/models"}, "the same path in both: the links are relative, but the operator's logs name one path"
    assert any(e["name"] == "TRITON_OPERATOR_REPOSITORY_KEY" for e in fetcher["env"])
    assert fetcher["securityContext"]["runAsNonRoot"] and fetcher["securityContext"]["readOnlyRootFilesystem"]
    assert fetcher["resources"]["limits"]["memory"]


def test_a_pool_replica_has_the_response_cache_its_cache_size_gives_and_none_with_0() -> None:
    """One local cache per replica for every pooled model with responseCache. With cacheSize 0 no --cache-config at all:
    Triton 2.51 given `local,size=0` fails to initialize the cache and stays not ready, refusing every load."""
    pool, _ = _example()

    def caches(size: str) -> list[str]:
        sized = pool.model_copy(update={"spec": pool.spec.model_copy(update={
            "server": pool.spec.server.model_copy(update={"cache_size": size})})})
        triton = render_pool_deployment(sized, UID, "ns")["spec"]["template"]["spec"]["containers"][0]
        return [a for a in triton["args"] if a.startswith("--cache-config")]

    assert caches("16Mi") == [f"--cache-config=local,size={16 << 20}"]
    assert caches("0") == [], "no cache, rather than one Triton cannot make"


def test_a_pooled_models_service_has_no_selector() -> None:
    _, models = _example()
    service = render_model_service(models[0], UID, "ns")
    assert "selector" not in service["spec"]
    assert [p["port"] for p in service["spec"]["ports"]] == [8000, 8001]


def _model(name: str = "pool-scale") -> TritonModel:
    _, models = _example()
    (m,) = [m for m in models if m.name == name]
    return m


def _conditions(slices: list[dict[str, Any]]) -> dict[str, dict[str, bool]]:
    return {e["targetRef"]["name"]: e["conditions"] for s in slices for e in s["endpoints"]}


def test_an_endpoint_is_ready_only_where_the_pod_is_ready_and_the_model_serves() -> None:
    where = ["shared-a", "shared-b", "shared-c"]
    slices = render_endpoint_slices(_model(), UID, "ns", where, PODS, serving={"shared-a", "shared-b", "shared-c"})
    assert _conditions(slices) == {
        "shared-a": {"ready": True, "serving": True, "terminating": False},
        "shared-b": {"ready": False, "serving": False, "terminating": False},  # pod not Ready
        "shared-c": {"ready": False, "serving": True, "terminating": True},  # being deleted
    }
    slices = render_endpoint_slices(_model(), UID, "ns", where, PODS, serving=set())
    assert not any(c["ready"] or c["serving"] for c in _conditions(slices).values()), "not READY at the digest yet"


def test_slices_are_the_operators_and_name_their_service() -> None:
    (only,) = render_endpoint_slices(_model(), UID, "ns", [], PODS, serving=())
    labels = only["metadata"]["labels"]
    assert labels["kubernetes.io/service-name"] == "pool-scale"
    assert labels["endpointslice.kubernetes.io/managed-by"] == ENDPOINTSLICE_MANAGER
    assert not ENDPOINTSLICE_MANAGER.endswith("k8s.io"), "Kubernetes' own controllers' values end in k8s.io"
    assert only["metadata"]["name"] == "pool-scale-ipv4" and only["endpoints"] == [], "an empty slice, not none"
    assert only["metadata"]["ownerReferences"][0]["kind"] == "TritonModel"


def test_a_replica_without_an_address_is_left_out_and_ipv6_gets_its_own_slice() -> None:
    pods = {**PODS, "v6": ReplicaPod("v6", "uid-6", "fd00::6", "node-1", ready=True, terminating=False),
            "new": ReplicaPod("new", "uid-n", None, None, ready=False, terminating=False)}
    slices = render_endpoint_slices(_model(), UID, "ns", ["shared-a", "v6", "new", "gone"], pods, serving={"v6"})
    assert [(s["addressType"], [e["addresses"] for e in s["endpoints"]]) for s in slices] == [
        ("IPv4", [["198.18.200.10"]]), ("IPv6", [["fd00::6"]])]


def test_a_replica_pod_is_read_from_the_pod_object() -> None:
    pod = {"metadata": {"name": "shared-a", "uid": "u", "deletionTimestamp": "2026-11-26T14:00:00Z"},
           "spec": {"nodeName": "node-0"},
           "status": {"podIP": "198.18.200.10", "conditions": [{"type": "Ready", "status": "True"}]}}
    assert ReplicaPod.of(pod) == ReplicaPod("shared-a", "u", "198.18.200.10", "node-0", ready=True, terminating=True)
    assert ReplicaPod.of({"metadata": {"name": "p"}}) == ReplicaPod("p", "", None, None, ready=False, terminating=False)
    # Which tritonserver runs: its container's ID, another after a restart (a pool round trusts a record only from
    # the container that made it: plan.pool.as_last_seen); none while it is not running.
    statuses = [{"name": "probe", "containerID": "containerd://p1", "state": {"running": {}}},
                {"name": "tritonserver", "containerID": "containerd://t2", "state": {"running": {}}}]
    assert ReplicaPod.of({**pod, "status": {**pod["status"], "containerStatuses": statuses}}).triton == "containerd://t2"
    statuses[1]["state"] = {"waiting": {"reason": "CrashLoopBackOff"}}
    assert ReplicaPod.of({**pod, "status": {**pod["status"], "containerStatuses": statuses}}).triton == ""


def test_a_pool_without_an_image_runs_the_operators_default_triton_image() -> None:
    """issue 39 item 3: an unset spec.server.image is the operator's --default-triton-image (Options), else the
    API's DEFAULT_TRITON_IMAGE; a pool's own image wins."""
    from triton_operator import DEFAULT_TRITON_IMAGE
    from triton_operator.render.kubernetes import Options

    def image(pool: TritonPool, options: Options | None = None) -> str:
        deployment = render_pool_children(pool, UID, "ns", options or Options())[0]
        return next(c["image"] for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "tritonserver")

    pool, _ = _example()
    assert pool.spec.server.image is None and image(pool) == DEFAULT_TRITON_IMAGE
    mirror = "registry.example/mirror/tritonserver:26.03-py3"
    assert image(pool, Options(default_triton_image=mirror)) == mirror
    own = pool.model_copy(update={"spec": pool.spec.model_copy(update={
        "server": pool.spec.server.model_copy(update={"image": "registry.example/own:1"})})})
    assert image(own, Options(default_triton_image=mirror)) == "registry.example/own:1"


def test_a_pool_of_several_replicas_has_a_disruption_budget_of_one() -> None:
    pool, _ = _example()
    deployment, pdb = render_pool_children(pool, UID, "ns")
    assert pdb["kind"] == "PodDisruptionBudget" and pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"] == deployment["spec"]["selector"]


@st.composite
def _pods(draw: st.DrawFn) -> dict[str, ReplicaPod]:
    names = draw(st.lists(st.sampled_from([f"p{i}" for i in range(6)]), unique=True))
    return {n: ReplicaPod(n, f"uid-{n}", draw(st.sampled_from([None, f"198.18.200.{i}", f"fd00::{i}"])),
                          draw(st.sampled_from([None, "node-0", "node-1"])), draw(st.booleans()), draw(st.booleans()))
            for i, n in enumerate(names)}


@functools.cache
def _scale_model() -> TritonModel:
    """The example's pool-scale model, read once for every example of the property below (reading and checking
    examples/pool.yaml took three quarters of its time); the renderer only reads it."""
    return _model()


@settings(max_examples=300, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
@given(pods=_pods(), placement=st.lists(st.sampled_from([f"p{i}" for i in range(8)])),
       serving=st.sets(st.sampled_from([f"p{i}" for i in range(8)])))
def test_no_endpoint_is_ready_unless_its_pod_is_ready_and_the_model_serves_there(
        pods: dict[str, ReplicaPod], placement: list[str], serving: set[str]) -> None:
    """The gate audit, on the renderer: whatever the pods and verdicts, a ready endpoint is a placed replica whose pod
    is Ready, not terminating, and where the model serves; every placed replica with an address is listed once."""
    slices = render_endpoint_slices(_scale_model(), UID, "ns", placement, pods, serving)
    listed = [e["targetRef"]["name"] for s in slices for e in s["endpoints"]]
    assert sorted(listed) == sorted({n for n in placement if n in pods and pods[n].ip})
    for s in slices:
        for e in s["endpoints"]:
            pod = pods[e["targetRef"]["name"]]
            assert e["addresses"] == [pod.ip] and (":" in pod.ip) == (s["addressType"] == "IPv6")
            if e["conditions"]["ready"]:
                assert pod.ready and not pod.terminating and pod.name in serving, e


if __name__ == "__main__":
    GOLDEN.write_text(_text(rendered()))
    print(f"wrote {GOLDEN}")


def test_a_pooled_models_own_failed_request_threshold_is_in_its_config_and_only_when_it_is_not_the_default() -> None:
    """Issue 39: the pool's probe (one for every model) reads each model's threshold from the config Triton loaded; a
    model at the default renders as before (its config digest, and every other model's, unchanged)."""
    from tests.documents import python_model
    from triton_operator.api.pod import THRESHOLD_PARAMETER
    from triton_operator.render.modelconfig import render_model

    def params(threshold: int | None, pool: str | None = "p") -> tuple[dict[str, str], str]:
        gate = {} if threshold is None else {"warmupGate": {"failedRequestThreshold": threshold}}
        body = python_model("m", **({"pool": pool, "memory": "64Mi"} if pool else {}), **gate)
        rendered = render_model(TritonModel.model_validate(body))
        return {k: v.string_value for k, v in rendered.config.parameters.items()}, rendered.digest

    default, digest = params(None)
    assert THRESHOLD_PARAMETER not in default
    assert params(3) == (default, digest), "the default, written out: the same config"
    assert params(0)[0][THRESHOLD_PARAMETER] == "0" and params(10)[0][THRESHOLD_PARAMETER] == "10"
    assert params(10)[1] != digest, "a new threshold is a new config: loaded in place on the pool's replicas"
    assert THRESHOLD_PARAMETER not in params(10, pool=None)[0], "a model's own replicas get it as --fail-threshold"
