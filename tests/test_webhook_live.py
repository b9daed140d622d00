"""The webhook reads the TritonModels around a change live from the API server, never the operator's watch
cache (issue 12, #8): a cache that lags (a `kubectl apply` of an ensemble a moment ago, a watch that is
restarting) must not admit a change that breaks an ensemble. The API here is a fake that answers what the
operator's `Kube` is asked; the cache is empty, as a stale one would be.
"""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

import yaml

from triton_operator.api.v1alpha1 import GROUP, VERSION
from triton_operator.controller.webhook import AdmissionWebhook
from triton_operator.render.webhook import WebhookTarget

EXAMPLES = Path(__file__).parent.parent / "examples"


class FakeApi:
    """The TritonModels of one namespace, as `Kube.list` returns them."""

    def __init__(self, models: list[dict[str, Any]]) -> None:
        self.models = {m["metadata"]["name"]: m for m in models}
        self.calls: list[str] = []

    def list(self, api_version: str, kind: str, namespace: str, label_selector: str | None = None) -> list[dict]:
        assert (api_version, kind) == (f"{GROUP}/{VERSION}", "TritonModel"), (api_version, kind)
        self.calls.append(f"list {kind} {namespace}")
        return [copy.deepcopy(m) for m in self.models.values()]


def _review(api: FakeApi, obj: dict, old: dict | None) -> dict[str, Any]:
    async def run() -> dict[str, Any]:
        webhook = AdmissionWebhook(api, WebhookTarget(url="https://127.0.0.1:9443"),  # type: ignore[arg-type]
                                   configuration="t", failure_policy="Fail", namespaces=[], clusterwide=True,
                                   address="127.0.0.1", port=0)
        try:
            return await webhook._review({"namespace": "team-a", "operation": "UPDATE" if old else "CREATE",
                                          "object": obj, "oldObject": old})
        finally:
            webhook._dir.cleanup()

    return asyncio.run(run())


def _sentiment() -> dict[str, dict]:
    docs = [d for d in yaml.safe_load_all((EXAMPLES / "sentiment-ensemble.yaml").read_text()) if d]
    for d in docs:
        d["metadata"]["namespace"] = "team-a"
    return {d["metadata"]["name"]: d for d in docs}


def test_a_step_change_that_breaks_an_ensemble_the_cache_has_not_seen_is_refused() -> None:
    docs = _sentiment()
    api = FakeApi(list(docs.values()))
    old = docs["tokenizer"]
    new = copy.deepcopy(old)
    new["spec"]["outputs"][0]["dataType"] = "INT32"  # TOKEN_IDS: the classifier step reads INT64
    response = _review(api, new, old)
    assert response.get("allowed") is False, response
    assert "would break ensemble sentiment: spec.ensemble.steps[1].inputMap[TOKEN_IDS]" in response["status"]["message"]
    assert "list TritonModel team-a" in api.calls, api.calls


def test_a_harmless_step_change_is_allowed() -> None:
    docs = _sentiment()
    old = docs["tokenizer"]
    new = copy.deepcopy(old)
    new["spec"]["replicas"] = 3
    assert _review(FakeApi(list(docs.values())), new, old).get("allowed") is not False


def test_an_ensemble_whose_steps_exist_is_allowed_and_one_whose_step_is_gone_is_refused() -> None:
    docs = _sentiment()
    ens = docs.pop("sentiment")
    assert _review(FakeApi(list(docs.values())), ens, None).get("allowed") is not False
    del docs["classifier"]
    response = _review(FakeApi(list(docs.values())), ens, None)
    assert response.get("allowed") is False and "spec.ensemble.steps[1].model" in response["status"]["message"]
