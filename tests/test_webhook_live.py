"""Which TritonModels the webhook reads, and what it tells whom (issue 12, #8; issue 32).

The webhook reads the models around a change from its replica's own list+watch of them (`informer`), never
with a LIST per review; a cache that lags (an ensemble applied right after its steps, a step changed a
moment ago) must not refuse a good change, so what the object names and the cache lacks, or what refused it,
is read again with a GET. Its answer names nothing the object does not name unless the review shows that its
sender has read the object (an UPDATE carrying the stored uid, as the API server's do).

The API here is `FakeModelsApi`, which answers what the webhook's `Kube` is asked; its watch delivers nothing,
so changing its models after the first list is a cache that lags. The same verdicts through a real API server:
e2e/test_admission.py.
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.webhook_server import FakeModelsApi
from triton_operator.render.webhook import WebhookTarget
from triton_operator.servers.webhook import AdmissionWebhook

EXAMPLES = Path(__file__).parent.parent / "examples"


class Reviewer:
    """An `AdmissionWebhook` whose watch has listed `api` once; `review` answers as to the API server."""

    def __init__(self, api: FakeModelsApi) -> None:
        self.api = api
        self.loop = asyncio.new_event_loop()
        self.hook = AdmissionWebhook(api, WebhookTarget(url="https://127.0.0.1:9443"),  # type: ignore[arg-type]
                                     configuration="t", failure_policy="Fail", namespaces=[], clusterwide=True,
                                     address="127.0.0.1", port=0)
        self.hook.informer.start()
        assert self.loop.run_until_complete(self.hook.informer.wait_synced(10)), "the informer never listed"

    def review(self, obj: dict, old: dict | None = None, namespace: str = "team-a") -> dict[str, Any]:
        req = {"uid": "u", "namespace": namespace, "operation": "UPDATE" if old else "CREATE", "object": obj,
               "oldObject": old}
        return self.loop.run_until_complete(self.hook._review(req))

    def close(self) -> None:
        self.hook.informer.stop()
        self.hook._dir.cleanup()
        self.loop.close()


@pytest.fixture
def reviewer(request: pytest.FixtureRequest) -> Iterator[Any]:
    made: list[Reviewer] = []

    def make(api: FakeModelsApi) -> Reviewer:
        made.append(Reviewer(api))
        return made[-1]

    yield make
    for r in made:
        r.close()


def _sentiment(namespace: str = "team-a") -> dict[str, dict]:
    docs = [d for d in yaml.safe_load_all((EXAMPLES / "sentiment-ensemble.yaml").read_text()) if d]
    for d in docs:
        d["metadata"].update(namespace=namespace, uid=f"uid-{d['metadata']['name']}", resourceVersion="1")
    return {d["metadata"]["name"]: d for d in docs}


def _breaking(tokenizer: dict) -> dict:
    new = copy.deepcopy(tokenizer)
    new["spec"]["outputs"][0]["dataType"] = "INT32"  # TOKEN_IDS: the classifier step reads INT64
    return new


def test_a_step_change_that_breaks_an_ensemble_is_refused_in_full_to_the_api_server(reviewer) -> None:
    docs = _sentiment()
    api = FakeModelsApi(list(docs.values()))
    r = reviewer(api)
    response = r.review(_breaking(docs["tokenizer"]), docs["tokenizer"])  # the old object carries the stored uid
    assert response.get("allowed") is False, response
    assert "would break ensemble sentiment: spec.ensemble.steps[1].inputMap[TOKEN_IDS]" in response["status"]["message"]
    assert api.count("list ") == 0, api.calls


def test_reviews_read_the_cache_not_a_list_per_review(reviewer) -> None:
    docs = _sentiment()
    api = FakeModelsApi(list(docs.values()))
    r = reviewer(api)
    for replicas in range(1, 21):
        new = copy.deepcopy(docs["tokenizer"])
        new["spec"]["replicas"] = replicas
        assert r.review(new, docs["tokenizer"]).get("allowed") is not False
    ens = copy.deepcopy(docs["sentiment"])
    ens["spec"]["replicas"] = 3
    assert r.review(ens, docs["sentiment"]).get("allowed") is not False
    assert api.count("list ") == 0 and api.count("get ") == 0, f"21 reviews asked the API server: {api.calls}"
    assert api.count("informer-list") == 1, api.calls


def test_an_ensemble_applied_right_after_its_steps_is_allowed_though_the_cache_lacks_them(reviewer) -> None:
    docs = _sentiment()
    api = FakeModelsApi([])
    r = reviewer(api)  # listed while the namespace was empty
    for name in ("tokenizer", "classifier"):
        api.models[("team-a", name)] = docs[name]  # applied a moment ago: the watch has not delivered them
    response = r.review(docs["sentiment"])
    assert response.get("allowed") is not False, response
    assert sorted(c for c in api.calls if c.startswith("get ")) == ["get team-a/classifier", "get team-a/tokenizer"]
    # Gone for real: refused, naming the step.
    del api.models[("team-a", "classifier")]
    r2 = reviewer(api)
    response = r2.review(docs["sentiment"])
    assert response.get("allowed") is False and "spec.ensemble.steps[1].model" in response["status"]["message"]


def test_a_step_the_cache_holds_stale_does_not_refuse_its_ensemble(reviewer) -> None:
    docs = _sentiment()
    stale = copy.deepcopy(docs["classifier"])
    stale["spec"]["inputs"][0]["dataType"] = "INT32"  # as it was; the API server has INT64 since a moment ago
    api = FakeModelsApi([docs["tokenizer"], stale, docs["sentiment"]])
    r = reviewer(api)
    api.models[("team-a", "classifier")] = docs["classifier"]
    ens = copy.deepcopy(docs["sentiment"])
    ens["spec"]["replicas"] = 2
    response = r.review(ens, docs["sentiment"])
    assert response.get("allowed") is not False, response
    assert "get team-a/classifier" in api.calls, api.calls


def _fraud_scorer() -> dict:
    return {"apiVersion": "serving.triton-operator.dev/v1alpha1", "kind": "TritonModel",
            "metadata": {"name": "fraud-scorer", "namespace": "payments", "uid": "uid-fraud", "resourceVersion": "7"},
            "spec": {"backend": "onnxruntime", "maxBatchSize": 16,
                     "inputs": [{"name": "card_velocity_7d", "dataType": "FP32", "dims": [12]},
                                {"name": "merchant_risk_band", "dataType": "INT32", "dims": [1]}],
                     "outputs": [{"name": "chargeback_probability", "dataType": "FP32", "dims": [1]}],
                     "source": {"uri": "https://models.example/fraud.onnx",
                                "sha256": "0" * 64}}}


def _probe_ensemble() -> dict:
    """What a caller without access to `payments` sends to learn about fraud-scorer (issue 32's finding)."""
    return {"apiVersion": "serving.triton-operator.dev/v1alpha1", "kind": "TritonModel",
            "metadata": {"name": "probe", "namespace": "payments"},
            "spec": {"platform": "ensemble", "maxBatchSize": 64,
                     "inputs": [{"name": "X", "dataType": "BYTES", "dims": [1]}],
                     "outputs": [{"name": "Y", "dataType": "BYTES", "dims": [1]}],
                     "ensemble": {"steps": [{"model": "fraud-scorer", "inputMap": {"guess": "X"},
                                             "outputMap": {"guess_out": "Y"}}]}}}


SECRETS = ("card_velocity_7d", "merchant_risk_band", "chargeback_probability", "FP32", "INT32", "16", "12")


def test_a_review_without_proof_of_reading_the_namespace_learns_nothing_of_its_models(reviewer) -> None:
    api = FakeModelsApi([_fraud_scorer()])
    r = reviewer(api)
    response = r.review(_probe_ensemble(), namespace="payments")
    assert response.get("allowed") is False, response
    told = json.dumps(response)
    assert not [s for s in SECRETS if s in told], f"the answer discloses fraud-scorer's fields: {told}"
    assert "spec.ensemble.steps[0].inputMap[guess]" in response["status"]["message"], "the field is still named"
    # An UPDATE with a made-up old object is no proof either.
    old = _fraud_scorer() | {"metadata": {"name": "fraud-scorer", "namespace": "payments", "uid": "guessed"}}
    new = copy.deepcopy(old)
    new["spec"]["outputs"][0]["dataType"] = "INT64"
    ens = _probe_ensemble()
    ens["metadata"]["name"] = "uses-it"
    ens["spec"]["ensemble"]["steps"][0].update(inputMap={"card_velocity_7d": "X"},
                                               outputMap={"chargeback_probability": "Y"})
    api.models[("payments", "uses-it")] = ens | {"metadata": {"name": "uses-it", "namespace": "payments", "uid": "u2"}}
    r2 = reviewer(api)
    response = r2.review(new, old, namespace="payments")
    told = json.dumps(response)
    assert response.get("allowed") is False and "uses-it" not in told, told


def test_the_same_review_with_the_stored_uid_gets_the_whole_answer(reviewer) -> None:
    api = FakeModelsApi([_fraud_scorer()])
    r = reviewer(api)
    ens = _probe_ensemble()
    ens["metadata"]["uid"] = "uid-probe"
    api.models[("payments", "probe")] = ens
    r2 = reviewer(api)
    changed = copy.deepcopy(ens)
    changed["spec"]["maxBatchSize"] = 32
    response = r2.review(changed, ens, namespace="payments")
    assert response.get("allowed") is False
    assert "merchant_risk_band" in response["status"]["message"], response
    del r
