"""The controller's watch cache (`controller.cache.Cache`): primed pods, the resync sweep, forgetting a model."""

from __future__ import annotations


def test_primed_pods_merge_under_the_watch_and_never_revive_a_deleted_pod() -> None:
    from triton_operator.controller.cache import Cache

    def pod(name: str, uid: str, rv: str) -> dict:
        return {"metadata": {"name": name, "uid": uid, "namespace": "ns", "resourceVersion": rv,
                             "labels": {"serving.triton-operator.dev/model": "m"}}}

    cache = Cache()
    cache.put_pod(pod("a", "ua", "7"))  # the watch delivered a newer a ...
    cache.put_pod(pod("b", "ub", "5"), deleted=True)  # ... and b's deletion, before the LIST answered
    cache.prime_pods("ns", "m", [pod("a", "ua", "6"), pod("b", "ub", "4"), pod("c", "uc", "6")])
    bucket = cache.pods[("ns", "m")]
    assert sorted(bucket) == ["a", "c"] and bucket["a"]["metadata"]["resourceVersion"] == "7"
    assert ("ns", "m") in cache.primed


def test_sweep_forgets_what_a_list_lacks_unless_observed_since() -> None:
    import time

    from triton_operator.api.kinds import WATCHED
    from triton_operator.controller.cache import Cache

    def obj(kind: str, name: str, uid: str) -> dict:
        return {"kind": kind, "metadata": {"name": name, "uid": uid, "namespace": "ns",
                                           "labels": {"serving.triton-operator.dev/model": "m"}}}

    cache = Cache()
    cache.put_model(obj("TritonModel", "m", "um"))
    cache.put_model(obj("TritonModel", "gone", "ug"))  # deleted while the watch was down
    cache.put_child(obj("Deployment", "m", "ud"))  # deleted while the watch was down
    cache.put_child(obj("Service", "m", "us"))
    cache.put_pod(obj("Pod", "m-1", "up1"))  # deleted while the watch was down
    since = time.monotonic()
    cache.put_pod(obj("Pod", "m-2", "up2"))  # observed after the LIST was sent: may be newer than it
    listed = {k.kind: set() for k in WATCHED} | {"TritonModel": {"um"}, "Service": {"us"}}

    dropped = cache.sweep("ns", listed, since)
    assert sorted((d["kind"], d["metadata"]["name"]) for d in dropped) == [
        ("Deployment", "m"), ("Pod", "m-1"), ("TritonModel", "gone")]
    assert list(cache.models["ns"]) == ["m"]
    assert list(cache.children) == [("Service", "ns", "m")]
    assert list(cache.pods[("ns", "m")]) == ["m-2"]
    assert cache.sweep("ns", listed, since) == []


def test_forget_model_spares_a_newer_object_of_the_same_name() -> None:
    from triton_operator.controller.cache import Cache

    cache = Cache()
    cache.put_model({"kind": "TritonModel", "metadata": {"name": "m", "uid": "new", "namespace": "ns"}})
    assert not cache.forget_model("ns", "m", "old") and "m" in cache.models["ns"]
    assert cache.forget_model("ns", "m", "new") and "m" not in cache.models["ns"]


def test_the_answer_to_a_status_write_never_revives_a_model_deleted_meanwhile_nor_goes_back_in_time() -> None:
    """Issue 41 (the pool's benchmark): a status write's answer that came after the model's DELETED event put it back
    in the cache, where it stayed a member of its pool until the next resync."""
    from triton_operator.controller.cache import Cache

    def model(uid: str, rv: str, phase: str) -> dict:
        return {"kind": "TritonModel", "metadata": {"name": "m", "uid": uid, "namespace": "ns", "resourceVersion": rv},
                "spec": {"pool": "p"}, "status": {"phase": phase}}

    cache = Cache()
    cache.put_model(model("u1", "5", "Pending"))
    assert cache.answered_model(model("u1", "7", "Ready")), "our write's answer over what the watch delivered"
    assert cache.models["ns"]["m"]["status"] == {"phase": "Ready"}
    cache.put_model(model("u1", "9", "Loading"))  # the watch: someone's newer write
    assert cache.answered_model(model("u1", "8", "Ready")), "still there (its Events are posted)"
    assert cache.models["ns"]["m"]["status"] == {"phase": "Loading"}, "an answer older than the cached version"
    cache.put_model(model("u1", "10", "Loading"), deleted=True)
    assert not cache.answered_model(model("u1", "9", "Ready")) and "m" not in cache.models["ns"], "revived"
    cache.put_model(model("u2", "12", "Pending"))  # made again under the same name
    assert not cache.answered_model(model("u1", "11", "Ready")), "another object's answer"
    assert cache.models["ns"]["m"]["metadata"]["uid"] == "u2"


def test_a_models_children_are_found_through_the_index_however_the_cache_changed() -> None:
    from triton_operator.controller.cache import Cache

    def child(kind: str, name: str, model: str | None, ns: str = "ns") -> dict:
        labels = {"serving.triton-operator.dev/model": model} if model else {}
        return {"kind": kind, "metadata": {"name": name, "uid": f"u-{kind}-{ns}-{name}", "namespace": ns,
                                           "labels": labels}}

    cache = Cache()
    cache.put_child(child("Deployment", "a", "a"))
    cache.put_child(child("Service", "a", "a"))
    cache.put_child(child("Deployment", "b", "b"))
    cache.put_child(child("Deployment", "a", "a", ns="other"))  # the same names in another namespace
    cache.put_child(child("ConfigMap", "loose", None))  # no model label: nobody's
    assert set(cache.children.of_model("ns", "a")) == {("Deployment", "a"), ("Service", "a")}
    assert set(cache.children.of_model("other", "a")) == {("Deployment", "a")}
    # relabelled, deleted by a watch event, popped after our own delete, and added by setdefault (a verify read)
    cache.put_child(child("Service", "a", "b"))
    cache.put_child(child("Deployment", "b", "b"), deleted=True)
    cache.children.pop(("Deployment", "ns", "a"), None)
    cache.children.setdefault(("ConfigMap", "ns", "a-repository"), child("ConfigMap", "a-repository", "a"))
    assert set(cache.children.of_model("ns", "a")) == {("ConfigMap", "a-repository")}
    assert set(cache.children.of_model("ns", "b")) == {("Service", "a")}
    # the index agrees with a scan of every cached child
    for ns, model in (("ns", "a"), ("ns", "b"), ("other", "a"), ("ns", "none")):
        scanned = {(k, n) for (k, s, n), body in cache.children.items()
                   if s == ns and body["metadata"]["labels"].get("serving.triton-operator.dev/model") == model}
        assert set(cache.children.of_model(ns, model)) == scanned, (ns, model)


def test_the_ensembles_of_a_namespace_follow_every_change_of_a_model() -> None:
    from triton_operator.api.steps import dependents
    from triton_operator.controller.cache import Cache

    def model(name: str, *steps: str) -> dict:
        spec = {"ensemble": {"steps": [{"model": s} for s in steps]}} if steps else {"backend": "python"}
        return {"kind": "TritonModel", "metadata": {"name": name, "uid": f"u-{name}", "namespace": "ns"}, "spec": spec}

    cache = Cache()
    for body in (model("a"), model("b"), model("pipe", "a", "b"), model("solo", "b")):
        cache.put_model(body)
    assert set(cache.ensembles["ns"]) == {"pipe", "solo"}
    assert dependents("b", cache.ensembles["ns"]) == dependents("b", cache.models["ns"]) == ["pipe", "solo"]
    cache.put_model(model("solo"))  # no longer an ensemble
    cache.put_model(model("pipe", "a", "b"), deleted=True)
    assert not cache.ensembles["ns"] and dependents("b", cache.models["ns"]) == []
    cache.put_model(model("pipe", "a"))
    assert cache.ensembles["ns"]["pipe"] == cache.models["ns"]["pipe"] == model("pipe", "a")


def test_a_model_is_kept_as_compact_json_read_as_a_copy_and_swept_by_uid() -> None:
    from collections import ChainMap

    from triton_operator.controller.cache import Cache

    body = {"kind": "TritonModel", "metadata": {"name": "m", "namespace": "ns", "uid": "u1", "generation": 2,
                                                "managedFields": [{"manager": "kubectl"}]},
            "spec": {"backend": "python", "parameters": {"note": "ü"}}}
    cache = Cache()
    cache.put_model(body)
    assert isinstance(cache.models["ns"]._bodies["m"], bytes)
    read = cache.model("ns", "m")
    assert read is not None and "managedFields" not in read["metadata"] and read["spec"] == body["spec"]
    read["spec"]["backend"] = "onnxruntime"
    assert cache.model("ns", "m")["spec"]["backend"] == "python", "a reader's change must not reach the cache"
    assert cache.model("ns", "other") is None and cache.model("elsewhere", "m") is None
    assert cache.models["ns"].uid("m") == "u1"
    # The planner overlays a model it just wrote on the namespace's models without copying (decoding) them all.
    overlay = ChainMap({"m": {**read, "status": {"x": 1}}}, cache.models["ns"])
    assert overlay["m"]["status"] == {"x": 1} and cache.model("ns", "m") is not None
    assert "status" not in cache.model("ns", "m")
    # The sweep finds what a LIST no longer has by uid.
    assert [b["metadata"]["uid"] for b in cache.sweep("ns", {"TritonModel": set(), "Pod": set()}, since=float("inf"))
            ] == ["u1"]
    assert cache.model("ns", "m") is None


def test_a_child_is_kept_as_compact_json_and_read_back_as_a_fresh_copy() -> None:
    import json

    from triton_operator.controller.cache import Cache

    body = {"kind": "ConfigMap", "metadata": {"name": "m-repository", "namespace": "ns", "uid": "uc",
                                              "labels": {"serving.triton-operator.dev/model": "m"}},
            "data": {"m__config.pbtxt": "name: \"m\"\nmax_batch_size: 8\n", "m__1__model.py": "ü = 1\n"}}
    cache = Cache()
    cache.put_child(body)
    key = ("ConfigMap", "ns", "m-repository")
    assert cache.children[key] == body and cache.children.get(key) == body
    assert cache.children.of_model("ns", "m") == {("ConfigMap", "m-repository"): body}
    assert cache.children.uid(key) == "uc"
    stored = cache.children._bodies[key]  # what is held: bytes, not Python objects
    assert isinstance(stored, bytes) and json.loads(stored) == body
    read = cache.children[key]
    read["data"]["m__config.pbtxt"] = "changed"
    assert cache.children[key] == body, "a caller's change to what it read must not reach the cache"
    cache.children.update({key: {**body, "metadata": {**body["metadata"], "labels": {}}}})
    assert cache.children.of_model("ns", "m") == {}, "update() goes through item assignment and keeps the index"


def test_a_pool_round_first_lists_the_namespaces_models_under_what_the_watch_delivered() -> None:
    """A pool round decides over all the models of its namespace (what to unload from each replica): at an operator's
    start the watch's first listing may have delivered only some of them, and the round unloaded the others' serving
    copies. The first round in a namespace lists them; the watch's newer bodies and deletions win over the LIST."""
    import asyncio
    from typing import Any

    from triton_operator.controller.cache import Cache
    from triton_operator.controller.pool import PoolReconciler

    def model(name: str, uid: str, rv: str) -> dict[str, Any]:
        return {"apiVersion": "serving.triton-operator.dev/v1alpha1", "kind": "TritonModel",
                "metadata": {"name": name, "namespace": "ns", "uid": uid, "resourceVersion": rv},
                "spec": {"pool": "p"}}

    cache = Cache()
    cache.put_model(model("a", "ua", "7"))  # delivered by the watch so far

    class Kube:
        lists = 0

        def list(self, api_version: str, kind: str, namespace: str, label_selector: str | None = None) -> list:
            assert (kind, namespace) == ("TritonModel", "ns")
            Kube.lists += 1
            # the watch delivers c's deletion while this LIST is under way
            cache.put_model(model("c", "uc", "8"), deleted=True)
            return [model("a", "ua", "6"), model("b", "ub", "6"), model("c", "uc", "6")]

    pools = PoolReconciler(Kube(), cache)  # type: ignore[arg-type]
    asyncio.run(pools._prime("ns"))
    assert sorted(cache.models["ns"]) == ["a", "b"], "b, not yet delivered, is known; c, deleted meanwhile, is not"
    assert cache.models["ns"]["a"]["metadata"]["resourceVersion"] == "7", "the watch's newer body is kept"
    asyncio.run(pools._prime("ns"))
    assert Kube.lists == 1, "listed once per namespace"
    assert not cache.models_listing, "nothing left recording deletions"


def test_a_model_moved_onto_a_pool_loses_the_replicas_of_its_own_and_their_hpa_not_the_pools() -> None:
    """Its own Deployment, repository ConfigMap, PDB and HPA go; its Service stays (the pool applies it again without a
    selector), and what the pool applied (labelled with the pool) is never deleted here."""
    import asyncio
    from typing import Any

    from triton_operator.api.pool import LABEL_POOL
    from triton_operator.controller.cache import Cache
    from triton_operator.controller.reconcile import Reconciler

    def child(api_version: str, kind: str, name: str, pool: bool = False) -> dict[str, Any]:
        labels = {"serving.triton-operator.dev/model": "m", **({LABEL_POOL: "p"} if pool else {})}
        return {"apiVersion": api_version, "kind": kind,
                "metadata": {"name": name, "namespace": "ns", "uid": f"u-{kind}-{name}", "labels": labels}}

    cache = Cache()
    for body in (child("apps/v1", "Deployment", "m"), child("v1", "ConfigMap", "m-repository-1"),
                 child("policy/v1", "PodDisruptionBudget", "m"), child("autoscaling/v2", "HorizontalPodAutoscaler", "m"),
                 child("v1", "Service", "m"), child("autoscaling/v2", "HorizontalPodAutoscaler", "m-pooled", pool=True)):
        cache.put_child(body)

    deleted: list[tuple[str, str]] = []

    class Kube:
        def delete(self, api_version: str, kind: str, namespace: str, name: str) -> None:
            deleted.append((kind, name))

    asyncio.run(Reconciler(Kube(), cache)._drop_own_replicas("ns", "m"))  # type: ignore[arg-type]
    assert sorted(deleted) == [("ConfigMap", "m-repository-1"), ("Deployment", "m"),
                                    ("HorizontalPodAutoscaler", "m"), ("PodDisruptionBudget", "m")]
    assert set(cache.children.of_model("ns", "m")) == {("Service", "m"), ("HorizontalPodAutoscaler", "m-pooled")}


def test_a_model_leaving_its_pool_loses_the_slices_the_pool_wrote_for_it_and_no_other() -> None:
    import asyncio
    from typing import Any

    from triton_operator.controller.cache import Cache
    from triton_operator.controller.pool import PoolReconciler

    def piece(name: str, model: str) -> dict[str, Any]:
        return {"metadata": {"name": name, "labels": {"serving.triton-operator.dev/model": model}}}

    deleted: list[str] = []

    class Kube:
        def delete(self, api_version: str, kind: str, namespace: str, name: str) -> None:
            deleted.append(f"{kind}/{namespace}/{name}")

    pools = PoolReconciler(Kube(), Cache())  # type: ignore[arg-type]
    for ns, name, model in (("ns", "m-ipv4", "m"), ("ns", "m-ipv6", "m"), ("ns", "m-a-ipv4", "m-a"),
                            ("other", "m-ipv4", "m")):
        pools._applied[("EndpointSlice", ns, name)] = piece(name, model)
    asyncio.run(pools.unpooled("ns", "m"))
    assert sorted(deleted) == ["EndpointSlice/ns/m-ipv4", "EndpointSlice/ns/m-ipv6"]
    assert sorted(pools._applied) == [("EndpointSlice", "ns", "m-a-ipv4"), ("EndpointSlice", "other", "m-ipv4")]
