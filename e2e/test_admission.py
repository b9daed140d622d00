"""Admission through a real API server: the CRD schema and CEL refuse what one object shows, the
operator's validating webhook (TLS, its own CA, failurePolicy Fail) refuses the rest.

`kubectl apply` of every spec in tests/corpus/invalid is refused with the field path and leaves
nothing behind. A corpus file's first document is the change under test (a TritonModel, or a TritonPool); the
others are what the namespace already holds (applied first, at `replicas: 0`: they are context, not workload; a
pooled model's pool among them).
"""

from __future__ import annotations

import copy
import json
import re
import uuid
from pathlib import Path

import pytest
import yaml

from e2e.kube import ApiError, Kube, condition, wait_for
from e2e.operator_fixtures import (
    SESSION_LABEL,
    OperatorHandle,
    as_stream,
    kubectl,
    load_examples,
    record,
    wait_model,
)
from tests.corpus_counts import ADMISSION_SPLIT
from triton_operator.api.kinds import OWNED_SELECTOR
from triton_operator.api.steps import steps_of

pytestmark = pytest.mark.cluster

CORPUS = Path(__file__).resolve().parent.parent / "tests" / "corpus" / "invalid"
VWC = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"


def apply(kubeconfig: Path, namespace: str, *docs: dict, check: bool = True) -> str:
    proc = kubectl(kubeconfig, "apply", "--validate=strict", "-n", namespace, "-f", "-", stdin=as_stream(list(docs)),
                   check=check)
    return proc.stderr if proc.returncode else ""


def denials(op: OperatorHandle) -> float:
    """Reviews the webhook denied, on every replica: the webhook Service sends each review to any of them."""
    return sum(v for k, v in op.samples_of_every_replica("triton_operator_admission_reviews_total").items()
               if dict(k)["verdict"] == "denied")


def placeholder(ensemble: dict) -> dict:
    """A plain model with an ensemble's name and tensors: what a name was before it became an ensemble."""
    spec = ensemble["spec"]
    return {"apiVersion": ensemble["apiVersion"], "kind": ensemble["kind"], "metadata": {"name": ensemble["metadata"]["name"]},
            "spec": {"backend": "python", "maxBatchSize": spec.get("maxBatchSize", 0), "replicas": 0,
                     "inputs": spec["inputs"], "outputs": spec["outputs"], "instanceGroups": [{"kind": "CPU", "count": 1}],
                     "source": {"inline": {"model.py": "# placeholder"}}}}


def corpus() -> list[tuple[str, str, list[dict], dict | None]]:
    """Each file's stem, expected field, documents, and `# previous-spec:` (JSON merged over the subject's spec: what
    the namespace held under the subject's name before the change, for a change that only an update can make)."""
    out = []
    for path in sorted(CORPUS.glob("*.yaml")):
        text = path.read_text()
        expect = re.search(r"^# expect: (\S+)$", text, re.M).group(1)  # type: ignore[union-attr]
        previous = re.search(r"^# previous-spec: (.+)$", text, re.M)
        out.append((path.stem, expect, [d for d in yaml.safe_load_all(text) if d],
                    json.loads(previous.group(1)) if previous else None))
    return out


def previous_of(subject: dict, previous: dict | None) -> dict:
    """What the namespace held under the subject's name before the change: `previous` merged over its spec, or else
    a placeholder (an ensemble's name as a plain model)."""
    if previous is None:
        return placeholder(subject)
    doc = copy.deepcopy(subject)
    doc["spec"].update(previous, replicas=0)
    return doc


def fresh_namespace(kube: Kube, base: str) -> str:
    name = f"{base[:50]}-{uuid.uuid4().hex[:5]}"
    # Served by the session operator (`op-*`) and reviewed by its webhook (the session label).
    kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {
        "name": name, "labels": {"e2e.triton-operator.io/test": "true", SESSION_LABEL[0]: SESSION_LABEL[1]}}})
    return name


def test_every_invalid_corpus_spec_is_refused_at_apply_naming_its_field_and_nothing_is_created(
        kube: Kube, kubeconfig: Path, namespace: str, operator: OperatorHandle) -> None:
    cases = corpus()
    by_layer = {"schema/CEL": 0, "webhook": 0}
    extra: list[str] = []
    try:
        for stem, expect, (subject, *context), previous in cases:
            ns = namespace
            before: dict | None = None
            name = subject["metadata"]["name"]
            if context:  # a namespace of its own holding the context: names repeat across corpus files
                ns = fresh_namespace(kube, f"{namespace}-{stem[:2]}")
                extra.append(ns)
                context = [copy.deepcopy(d) for d in context]
                for d in context:
                    d["spec"]["replicas"] = 0
                if any(name in steps_of(d) for d in context):
                    # The context uses the subject (a cycle): it can only have been admitted while the subject's
                    # name was a plain model; the subject's change is what closes the cycle.
                    apply(kubeconfig, ns, previous_of(subject, previous))
                    before = kube.get("TritonModel", name, ns)
                # Dependency order: a context model is applied after the models its steps use.
                pending = list(context)
                while pending:
                    names = {p["metadata"]["name"] for p in pending}
                    ready = [d for d in pending if not names & set(steps_of(d))]
                    assert ready, f"{stem}: the context's ensembles use each other"
                    apply(kubeconfig, ns, *ready)
                    pending = [d for d in pending if d not in ready]
            denied = denials(operator)
            stderr = apply(kubeconfig, ns, subject, check=False)
            assert stderr, f"{stem}: the API server accepted it"
            layer = "webhook" if denials(operator) > denied else "schema/CEL"
            by_layer[layer] += 1
            # The webhook names the exact field; a CEL rule can name a list but not an index in it.
            field = expect if layer == "webhook" else expect.split("[", 1)[0]
            assert re.search(re.escape(field) + r'[:\["]', stderr), f"{stem}: refused without naming {field}: {stderr}"
            # Nothing created: no such TritonModel (or TritonPool; or the earlier one untouched), no child of that name.
            now = kube.get_or_none(subject["kind"], name, ns)
            if before is None:
                assert now is None, f"{stem}: a {subject['kind']} {name} exists after the refusal"
                for kind in ("ConfigMap", "Deployment", "Service"):
                    child = kube.get_or_none(kind, name, ns)
                    # (a context pool's own Deployment may bear the name: corpus 140 is a model named after it)
                    owners = {r.get("kind") for r in ((child or {}).get("metadata") or {}).get("ownerReferences") or ()}
                    assert child is None or owners == {"TritonPool"}, f"{stem}: a {kind} {name} exists"
            else:
                assert now is not None and now["metadata"]["generation"] == before["metadata"]["generation"]
                assert now["spec"] == before["spec"], f"{stem}: the refused change was stored"
        assert not kube.items("TritonModel", namespace) and not kube.items("TritonPool", namespace)
        assert not kube.items("ConfigMap", namespace, label_selector=OWNED_SELECTOR)
    finally:
        for ns in extra:
            try:
                kube.delete("Namespace", ns)
            except ApiError:
                pass
    record("admission: invalid corpus specs refused at kubectl apply",
           f"{len(cases)} of {len(cases)} ({by_layer['schema/CEL']} by the CRD schema/CEL, "
           f"{by_layer['webhook']} by the webhook)")
    assert sum(by_layer.values()) == len(cases)
    # The docs state this split (docs/concepts/validation.md and healing.md: `make docs` writes it from
    # tests/corpus_counts.py, which records it).
    split = ADMISSION_SPLIT
    assert (by_layer["schema/CEL"], by_layer["webhook"]) == (split.schema_cel, split.webhook), (
        f"measured {by_layer['schema/CEL']} by the schema/CEL and {by_layer['webhook']} by the webhook, the docs say "
        f"{split.schema_cel} and {split.webhook}: record the measured split in tests/corpus_counts.py "
        "(ADMISSION_SPLIT) and run `make docs`")


def test_cross_object_rules_through_the_webhook(kube: Kube, kubeconfig: Path, namespace: str,
                                                 operator: OperatorHandle) -> None:
    docs = {d["metadata"]["name"]: d for d in load_examples("sentiment-ensemble")}
    for d in docs.values():
        d["spec"]["replicas"] = 0

    # An ensemble before its steps: refused, naming each missing step; nothing stored.
    stderr = apply(kubeconfig, namespace, docs["sentiment"], check=False)
    assert "spec.ensemble.steps[0].model" in stderr and "TritonModel 'tokenizer' is not defined" in stderr, stderr
    assert "TritonModel 'classifier' is not defined" in stderr, stderr
    assert kube.get_or_none("TritonModel", "sentiment", namespace) is None

    # Steps first, then the ensemble, in one kubectl apply (the example's document order): accepted.
    apply(kubeconfig, namespace, docs["tokenizer"], docs["classifier"], docs["sentiment"])

    # A step change that would break the ensemble using it: refused, naming the ensemble's field.
    tokenizer = kube.get("TritonModel", "tokenizer", namespace)
    broken = copy.deepcopy(docs["tokenizer"])
    broken["spec"]["outputs"][0]["dataType"] = "INT32"
    stderr = apply(kubeconfig, namespace, broken, check=False)
    assert "would break ensemble sentiment: spec.ensemble.steps[1].inputMap[TOKEN_IDS]" in stderr, stderr
    assert kube.get("TritonModel", "tokenizer", namespace)["metadata"]["generation"] == tokenizer["metadata"]["generation"]

    # A step that uses its ensemble: a cycle, refused.
    cls = docs["classifier"]
    cyclic = {**cls, "spec": {"platform": "ensemble", "maxBatchSize": cls["spec"]["maxBatchSize"],
                              "inputs": cls["spec"]["inputs"], "outputs": cls["spec"]["outputs"],
                              "ensemble": {"steps": [{"model": "sentiment", "inputMap": {"TEXT": "TOKEN_IDS"},
                                                      "outputMap": {"SCORE": "SCORE", "LABEL": "LABEL"}}]}}}
    stderr = apply(kubeconfig, namespace, cyclic, check=False)
    assert "spec.ensemble.steps" in stderr and "cycle" in stderr, stderr

    # Deleting a step is never blocked (GC and namespace deletion must work); the ensemble is then reported,
    # and a metadata-only change to it is still allowed, while a spec change is refused.
    kubectl(kubeconfig, "delete", "-n", namespace, "tritonmodel/classifier", "--wait=true")
    kubectl(kubeconfig, "label", "-n", namespace, "tritonmodel/sentiment", "team=a")
    proc = kubectl(kubeconfig, "patch", "-n", namespace, "tritonmodel/sentiment", "--type=merge",
                   "-p", '{"spec":{"maxBatchSize":4}}', check=False)
    assert proc.returncode != 0 and "TritonModel 'classifier' is not defined" in proc.stderr, proc.stderr


def test_webhook_configuration_and_failure_policy(kube: Kube, operator: OperatorHandle) -> None:
    """What the operator registered: its own CA, TritonModel and TritonPool CREATE/UPDATE only (a pool's delete is
    never refused: its models report PoolNotFound), failurePolicy Fail."""
    vwc = kube.request("GET", f"{VWC}/{operator.webhook_configuration}")
    [hook, own] = vwc["webhooks"]
    assert own["name"] == "operator-writes.serving.triton-operator.dev"  # the operator's own writes (issue 39)
    assert hook["failurePolicy"] == "Fail" and hook["sideEffects"] == "None"
    assert hook["rules"] == [{"apiGroups": ["serving.triton-operator.dev"], "apiVersions": ["*"],
                              "operations": ["CREATE", "UPDATE"],
                              "resources": ["tritonmodels", "tritonpools", "tritonpools/scale"], "scope": "Namespaced"}]
    # The chart's Service in front of the operator pod, and the CA the operator issued and published.
    assert hook["clientConfig"]["service"]["name"].endswith("-webhook") and hook["clientConfig"]["caBundle"]


def test_while_the_operator_is_down_changes_are_refused_and_deletes_are_not(
        kube: Kube, kubeconfig: Path, namespace: str, operator: OperatorHandle) -> None:
    """failurePolicy Fail, as documented: no TritonModel change is admitted unreviewed; deleting still works."""
    docs = {d["metadata"]["name"]: d for d in load_examples("sentiment-ensemble")}
    for d in docs.values():
        d["spec"]["replicas"] = 0
    apply(kubeconfig, namespace, docs["tokenizer"])
    operator.freeze()  # SIGSTOP: the pod is there, its webhook answers nothing (a hung or overloaded operator)
    try:
        stderr = apply(kubeconfig, namespace, docs["classifier"], check=False)
        assert "failed calling webhook" in stderr and "tritonmodels.serving.triton-operator.dev" in stderr, stderr
        assert kube.get_or_none("TritonModel", "classifier", namespace) is None
        kubectl(kubeconfig, "delete", "-n", namespace, "tritonmodel/tokenizer", "--wait=true")
    finally:
        operator.thaw()
    # Frozen past its renew deadline, the leader steps down and its container restarts as a follower: wait until
    # both replicas serve the webhook again and one leads, so that the next test starts from a settled operator.
    operator.start()
    apply(kubeconfig, namespace, docs["classifier"])
    assert kube.get("TritonModel", "classifier", namespace)


# -- pools (issue 29) ---------------------------------------------------------------------------


def _pool_docs() -> tuple[dict, dict]:
    """examples/pool.yaml's pool (small requests, so that its replicas fit the test nodes) and pool-add-sub (256Mi, 2
    copies)."""
    docs = load_examples("pool")
    pool = next(d for d in docs if d["kind"] == "TritonPool")
    pool["spec"]["server"]["resources"] = {"requests": {"cpu": "100m", "memory": "256Mi"}}
    model = next(d for d in docs if d["metadata"]["name"] == "pool-add-sub")
    return pool, model


def test_a_pooled_model_larger_than_a_replica_of_its_pool_is_refused_and_one_before_its_pool_is_not(
        kube: Kube, kubeconfig: Path, namespace: str, operator: OperatorHandle) -> None:
    pool, model = _pool_docs()
    pool["spec"]["replicas"] = 0  # what it holds is the point, not its pods
    pool["spec"]["capacity"] = {"memoryPerReplica": "1Gi"}
    apply(kubeconfig, namespace, pool)
    big = copy.deepcopy(model)
    big["metadata"]["name"], big["spec"]["memory"], big["spec"]["replicas"] = "big", "2Gi", 0
    denied = denials(operator)
    stderr = apply(kubeconfig, namespace, big, check=False)
    assert denials(operator) > denied, f"not refused by the webhook: {stderr}"
    # A create carries no proof that its sender may read the pool: the field and the rule, not the pool's figures.
    assert re.search(r"spec\.memory: .*fits one replica of its pool", stderr), stderr
    assert kube.get_or_none("TritonModel", "big", namespace) is None
    # Applied again as the API server sends an update (the stored object's uid): the figures.
    small = copy.deepcopy(big)
    small["spec"]["memory"] = "512Mi"
    apply(kubeconfig, namespace, small)
    stderr = apply(kubeconfig, namespace, big, check=False)
    assert "spec.memory: a copy takes 2Gi, more than a replica of pool 'shared' holds " \
           "(spec.capacity.memoryPerReplica gives 1Gi)" in stderr, stderr
    assert kube.get("TritonModel", "big", namespace)["spec"]["memory"] == "512Mi"
    # A pool that is not there yet refuses nothing (GitOps applies in any order); the operator says PoolNotFound.
    early = copy.deepcopy(big)
    early["metadata"]["name"], early["spec"]["pool"], early["spec"]["memory"] = "early", "later", "600Gi"
    apply(kubeconfig, namespace, early)
    # What a pool replica cannot fetch, refused by name: a claim (it mounts none of a model's), a model's own Secret
    # (its sidecar fetches for every model of the pool). An s3:// uri with the pool's credentials is taken.
    fetched = copy.deepcopy(small)
    fetched["metadata"]["name"] = "fetched"
    fetched["spec"]["source"] = {"uri": "pvc://models/pool-add-sub/"}
    stderr = apply(kubeconfig, namespace, fetched, check=False)
    assert "spec.source.uri: a pool replica mounts no model's PersistentVolumeClaim" in stderr, stderr
    fetched["spec"]["source"] = {"uri": "s3://models/pool-add-sub/", "credentialsSecret": "s3-keys"}
    stderr = apply(kubeconfig, namespace, fetched, check=False)
    assert "spec.source.credentialsSecret: a pool replica's fetch-server sidecar fetches for every model" in stderr, \
        stderr
    assert kube.get_or_none("TritonModel", "fetched", namespace) is None, "refused: nothing created"


def test_a_pool_change_that_would_strand_placed_models_is_refused_naming_the_field(
        kube: Kube, kubeconfig: Path, namespace: str, operator: OperatorHandle) -> None:
    """The placement is the operator's own (status.placement, recorded by the pool reconcile on real pool replicas);
    the webhook reads it from the API server."""
    pool, model = _pool_docs()
    pool["spec"]["replicas"] = 2
    apply(kubeconfig, namespace, pool, model)
    try:
        tm = wait_model(kube, namespace, "pool-add-sub", lambda t: len((t.get("status") or {}).get("placement") or ()) == 2,
                        "placed on both replicas", 300)
    except TimeoutError:
        print(operator.log_tail(namespace, 120))
        raise
    placed = tm["status"]["placement"]
    # Its children and the model's slice, written by the operator under the chart's operator-writes policy.
    wait_for("the operator's EndpointSlice of pool-add-sub",
             lambda: kube.get_or_none("EndpointSlice", "pool-add-sub-ipv4", namespace), 120)
    assert kube.get_or_none("Deployment", "shared-pool", namespace) is not None
    assert kube.get_or_none("PodDisruptionBudget", "shared-pool", namespace) is not None
    assert not [ln for ln in operator.log_since().splitlines() if "ValidatingAdmissionPolicy" in ln], (
        "the policy refused one of the operator's own writes")
    stored = kube.get("TritonPool", "shared", namespace)
    for change, field, says in (
            ({"capacity": {"memoryPerReplica": "128Mi"}}, "spec.capacity.memoryPerReplica",
             f"would strand placed models: replica {sorted(placed)[0]} holds 256Mi of them (pool-add-sub)"),
            ({"replicas": 1}, "spec.replicas",
             "would strand placed models: pool-add-sub has 2 copies on distinct replicas, more than 1 replicas")):
        changed = copy.deepcopy(pool)
        changed["spec"].update(change)
        denied = denials(operator)
        stderr = apply(kubeconfig, namespace, changed, check=False)
        assert denials(operator) > denied, f"{field}: not refused by the webhook: {stderr}"
        assert f"{field}: {says}" in stderr, stderr
        now = kube.get("TritonPool", "shared", namespace)
        assert now["metadata"]["generation"] == stored["metadata"]["generation"], f"{field}: the change was stored"
    # The same through the scale subresource (`kubectl scale`, as an HPA would).
    proc = kubectl(kubeconfig, "scale", "-n", namespace, "tritonpool/shared", "--replicas=1", check=False)
    assert proc.returncode != 0 and "spec.replicas: would strand placed models: pool-add-sub has 2 copies" \
        in proc.stderr, (proc.stdout, proc.stderr)
    assert kube.get("TritonPool", "shared", namespace)["spec"]["replicas"] == 2
    # More room strands nothing.
    roomier = copy.deepcopy(pool)
    roomier["spec"]["capacity"] = {"memoryPerReplica": "2Gi"}
    apply(kubeconfig, namespace, roomier)
    # Deleting the pool is not refused: its models report PoolNotFound.
    kubectl(kubeconfig, "delete", "-n", namespace, "tritonpool/shared", "--wait=true")
    wait_model(kube, namespace, "pool-add-sub",
               lambda t: ((condition(t, "Ready") or {}).get("reason")) == "PoolNotFound", "PoolNotFound", 120)
    record("admission: pool changes", f"a capacity and a replicas change stranding pool-add-sub on {placed} refused "
           "naming the field; more room allowed; the pool's delete allowed, its model PoolNotFound")
