"""A throwaway differential driver for the plan-pool branch (delete before merging; not a test: it stands in for the
API server and the replicas' Tritons). It runs the same 12 scripted pool rounds against the controller tree given on
PYTHONPATH and prints every call in order; NOTES-plan-pool-cmp.py compares two runs round by round, as multisets
(the order of concurrent writes and detached Events varies from run to run, main's too).

    cd /tmp && PYTHONPATH=/work/main/operator python /work/wt-plan-pool/NOTES-plan-pool-drive.py > old.txt
    PYTHONPATH=/work/wt-plan-pool/operator python /work/wt-plan-pool/NOTES-plan-pool-drive.py > new.txt
    python /work/wt-plan-pool/NOTES-plan-pool-cmp.py old.txt new.txt
"""
import asyncio, copy, datetime as dt, json, sys
from typing import Any
sys.path.insert(0, "/work/wt-plan-pool")  # tests.documents
from tests.documents import pool_document, python_model
import triton_operator.controller.pool as cp
from triton_operator.controller.cache import Cache
from triton_operator.triton.pool import Served
from triton_operator.api.pod import TRITON_CONTAINER

CALLS: list[Any] = []
T = dt.datetime(2026, 11, 29, 7, 0, tzinfo=dt.UTC)
cp.utc_now = lambda: T
TRITON: dict[str, dict[str, str]] = {}  # ip -> name -> digest READY
FAIL: set[tuple[str, str]] = set()  # (ip, name) whose loads fail
REQS: dict[str, int] = {}

def pod(name, ip, node, ready=True):
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "ns", "uid": "u-" + name,
            "labels": {"serving.triton-operator.dev/pool": "p"}},
            "spec": {"nodeName": node}, "status": {"podIP": ip, "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            "containerStatuses": [{"name": TRITON_CONTAINER, "state": {"running": {}}, "containerID": "c-" + name}]}}

PODS = [pod("r1", "198.18.0.1", "n1"), pod("r2", "198.18.0.2", "n2")]
POOL = {**pool_document("p"), "metadata": {"name": "p", "namespace": "ns", "uid": "pool-uid", "generation": 1}}
MODELS: dict[str, dict[str, Any]] = {}

def model(name, gen=1, **spec):
    b = python_model(name, pool="p", memory="1Gi", **spec)
    b["metadata"].update(namespace="ns", uid="uid-" + name, generation=gen, creationTimestamp="2026-11-29T06:00:00Z")
    return b

class Kube:
    def list(self, api_version, kind, namespace, selector=None):
        CALLS.append(("list", kind))
        return copy.deepcopy(PODS if kind == "Pod" else list(MODELS.values()))
    def get(self, *a):
        CALLS.append(("get",) + a); return copy.deepcopy(POOL)
    def apply(self, obj):
        CALLS.append(("apply", obj["kind"], obj["metadata"]["name"], json.dumps(obj, sort_keys=True)))
        return copy.deepcopy(obj)
    def create_if_absent(self, obj):
        CALLS.append(("create", obj["kind"], obj["metadata"]["name"])); return True
    def delete(self, api_version, kind, namespace, name):
        CALLS.append(("delete", kind, name))
    def patch_pod_annotations(self, namespace, name, ann):
        CALLS.append(("podann", name, json.dumps(ann, sort_keys=True)))
    def patch_custom_status(self, group, version, plural, namespace, name, patch):
        CALLS.append(("status", plural, name, json.dumps(patch, sort_keys=True)))
        if plural == "tritonpools":
            st = {k: v for k, v in {**(POOL.get("status") or {}), **patch}.items() if v is not None}
            POOL["status"] = st
            return copy.deepcopy(POOL)
        b = MODELS[name]
        b["status"] = {k: v for k, v in {**(b.get("status") or {}), **patch}.items() if v is not None}
        return copy.deepcopy(b)
    def event(self, body, reason, message, type_):
        CALLS.append(("event", body["metadata"]["name"], reason, type_, message))

def ip_of(address):
    return address.split(":")[0]

async def served_all(address, asks, key, timeout=5.0):
    CALLS.append(("served_all", ip_of(address), tuple(a[0] for a in asks)))
    return [await _served(address, n, d, also) for n, d, also in asks]

SILENT: set[str] = set()

async def _served(address, name, digest, also):
    if ip_of(address) in SILENT:
        return Served(False, None, "TritonUnreachable", cp.triton_pool.NO_ANSWER + " within 5s")
    d = TRITON.get(ip_of(address), {}).get(name)
    if d is not None and d in (digest, also):
        return Served(True, d, "", "")
    return Served(False, None, "ModelNotReady", f"{name} not READY")

async def served(address, name, digest, also, key, timeout=5.0):
    CALLS.append(("served", ip_of(address), name))
    return await _served(address, name, digest, also)

async def load(grpc_address, name, config, files, key, timeout=600.0):
    ip = ip_of(grpc_address)
    CALLS.append(("load", ip, name))
    if (ip, name) in FAIL:
        return "load failed: boom"
    digest = json.loads(config)["parameters"]["triton-operator.config-digest"]["string_value"]
    TRITON.setdefault(ip, {})[name] = digest
    return None

async def unload(grpc_address, name, key, timeout=120.0):
    ip = ip_of(grpc_address)
    CALLS.append(("unload", ip, name))
    TRITON.get(ip, {}).pop(name, None)
    return None

async def heard_of(address, name, timeout=5.0):
    CALLS.append(("heard_of", ip_of(address), name)); return True

async def probe_news(*a, **k):
    await asyncio.sleep(3600)

async def requests_seen(address, name):
    CALLS.append(("requests_seen", ip_of(address), name)); return 7

SIDECAR: dict[str, dict[str, Any]] = {}  # ip -> Triton name -> Held
SIDECAR_DOWN: set[str] = set()

async def holdings(ip, key):
    CALLS.append(("holdings", ip))
    if ip in SIDECAR_DOWN:
        raise cp.triton_fetcher.FetcherError(f"the fetch-server sidecar at {ip} answered 503")
    return dict(SIDECAR.get(ip, {}))

async def fetch(ip, key, name, digest, request, volume_bytes=None):
    CALLS.append(("fetch", ip, name, digest))
    h = SIDECAR.get(ip, {}).get(name)
    if h is not None and h.digest == digest:
        return True
    SIDECAR.setdefault(ip, {})[name] = cp.triton_fetcher.Held(None, digest)
    return False

async def fetch_delete(ip, key, name):
    CALLS.append(("fetch_delete", ip, name))
    return 200 if SIDECAR.get(ip, {}).pop(name, None) is not None else 404

async def prune(ip, key, name):
    CALLS.append(("prune", ip, name))

cp.triton_fetcher.holdings = holdings
cp.triton_fetcher.fetch = fetch
cp.triton_fetcher.delete = fetch_delete
cp.triton_fetcher.prune = prune
cp.triton_pool.served_all = served_all
cp.triton_pool.served = served
cp.triton_pool.load = load
cp.triton_pool.unload = unload
cp.triton_pool.heard_of = heard_of
cp.probe_news = probe_news
cp.requests_seen = requests_seen

async def settle():
    await asyncio.sleep(0.2)

async def main():
    cache = Cache()
    rec = cp.PoolReconciler(Kube(), cache)
    rec.put_pool(POOL)
    async def rnd(label):
        CALLS.append(("--- round", label))
        wake = await rec.reconcile("ns", "p")
        await settle()
        CALLS.append(("wake", wake))
        rec.put_pool(POOL)
    for n in ("a", "b"):
        MODELS[n] = model(n, replicas=2)
    MODELS["c"] = model("c", replicas=1, rollout={"mode": "Drain"})
    await rnd("fresh")
    await rnd("again")
    # c updated (Drain), a updated (Swap), b fails on r2
    MODELS["c"] = model("c", gen=2, replicas=1, rollout={"mode": "Drain"}, maxBatchSize=8)
    MODELS["a"] = model("a", gen=2, replicas=2, maxBatchSize=8)
    for n in ("a", "c"):
        cache.put_model(MODELS[n])
    TRITON.get("198.18.0.2", {}).pop("b", None)
    FAIL.add(("198.18.0.2", "b"))
    await rnd("updates and a failure")
    await rnd("updates 2")
    # a deleted: unloaded from both (drained first)
    del MODELS["a"]
    cache.put_model({"metadata": {"namespace": "ns", "name": "a", "uid": "uid-a"}}, deleted=True)
    await rnd("a deleted")
    await rnd("final")
    FAIL.clear()
    rec._broken[("ns", "p", "r1")] = {"b": "stub dead"}
    await rnd("broken b on r1")
    rec._broken[("ns", "p", "r1")] = {}
    await rnd("healed")
    MODELS["d"] = model("d", replicas=1)
    cache.put_model(MODELS["d"])
    digest = cp.pool_plan.members("p", {n: cache.model("ns", n) for n in MODELS})["d"].digest
    rows = POOL["status"]["replicaModels"]
    for row in rows:
        row["loading"] = {"d": {"digest": digest, "since": "2026-11-29T06:59:50Z"}}
    await rnd("a previous operator's load of d in flight")
    PODS[1]["status"]["conditions"][0]["status"] = "False"
    await rnd("r2 not ready")
    PODS[1]["status"]["conditions"][0]["status"] = "True"
    await rnd("r2 back")
    await rnd("last")
    u = model("u", replicas=1)
    u["spec"]["source"] = {"uri": "https://example.invalid/m.tgz", "sha256": "0" * 64}
    MODELS["u"] = u
    cache.put_model(u)
    SIDECAR["198.18.0.1"] = {"stale": cp.triton_fetcher.Held("x", None)}
    await rnd("uri model u: fetch asked, stale files deleted")
    await rnd("u under way")
    ud = cp.pool_plan.members("p", {n: cache.model("ns", n) for n in MODELS})["u"].digest
    ip = next(i for i, held in SIDECAR.items() if "u" in held)
    SIDECAR[ip]["u"] = cp.triton_fetcher.Held(None, None, ud, "404 Not Found", 1)
    await rnd("u failed")
    await rnd("u failed, counted")
    SIDECAR[ip]["u"] = cp.triton_fetcher.Held(ud, None)
    SIDECAR_DOWN.add(ip)
    await rnd("sidecar down")
    SIDECAR_DOWN.clear()
    for k in list(rec._held):
        rec._held[k].until = 0.0
    await rnd("u on disk: loaded")
    await rnd("u settled")
    SILENT.add("198.18.0.2")
    await rnd("r2 silent: its record stands")
    PODS[1]["status"]["containerStatuses"][0]["containerID"] = "c-r2-restarted"
    await rnd("r2 silent and restarted: nothing stands for it")
    SILENT.clear()
    await rnd("r2 answers again")

asyncio.run(main())
for c in CALLS:
    print(json.dumps(c, default=str))
