"""`controller.heal`'s choices, pure: which models a heal reloads, and which config it loads (the desired one only).
Against a real cluster and tritonserver: e2e/test_heal.py."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from triton_operator.api.kinds import LABEL_MODEL
from triton_operator.api.pod import ANNOTATION_DIGEST, ANNOTATION_STEPS, ANNOTATION_TRITON_NAME
from triton_operator.controller.heal import desired_configs, to_reload
from triton_operator.render.kubernetes import configmap_key


def _pod(steps: str = "", digest: str = "d2", volume: str = "m-repository-1") -> dict[str, Any]:
    ann = {ANNOTATION_TRITON_NAME: "ens", ANNOTATION_DIGEST: digest}
    if steps:
        ann[ANNOTATION_STEPS] = steps
    return {"metadata": {"name": "p", "namespace": "ns", "annotations": ann, "labels": {LABEL_MODEL: "ens"}},
            "spec": {"volumes": [{"name": "repository", "configMap": {"name": volume}}]}}


def test_a_broken_step_is_reloaded_not_the_ensemble_that_fails_because_of_it():
    pod = _pod("tok,cls")
    assert to_reload(pod, {"ens": "failed", "tok": "stub died"}) == ("tok",)
    assert to_reload(pod, {"ens": "failed", "cls": "x", "tok": "y"}) == ("tok", "cls"), "the gate's order"
    assert to_reload(pod, {"ens": "not loaded"}) == ("ens",)
    assert to_reload(pod, {"tritonserver": "did not answer"}) == (), "a hung tritonserver has nothing to reload"
    assert to_reload(_pod(), {"other": "x"}) == ()


def _config(name: str, digest: str) -> str:
    return (f'name: "{name}"\nbackend: "python"\nparameters {{\n  key: "triton-operator.config-digest"\n'
            f'  value {{\n    string_value: "{digest}"\n  }}\n}}\n')


class FakeKube:
    """ConfigMaps by name: the two calls `desired_configs` makes."""

    def __init__(self, maps: dict[str, dict[str, str]]) -> None:
        self.maps = maps

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return {"metadata": {"name": name}, "data": self.maps[name]} if name in self.maps else None

    def list(self, api_version: str, kind: str, namespace: str, label_selector: str | None = None) -> list[dict]:
        assert label_selector == f"{LABEL_MODEL}=ens"
        return [{"metadata": {"name": n}, "data": d} for n, d in self.maps.items()]


def test_the_config_loaded_is_the_one_that_carries_the_pods_digest():
    old = {configmap_key("ens/config.pbtxt"): _config("ens", "d1"), configmap_key("tok/config.pbtxt"): _config("tok", "t1")}
    new = {configmap_key("ens/config.pbtxt"): _config("ens", "d2"), configmap_key("tok/config.pbtxt"): _config("tok", "t2")}
    kube = FakeKube({"m-repository-1": old, "m-repository-2": new})
    # The pod mounts the old ConfigMap but was reloaded in place to d2: the newer one is found by its digest.
    got = asyncio.run(desired_configs(kube, _pod("tok"), ["tok"]))  # type: ignore[arg-type]
    assert got is not None and json.loads(got["tok"])["parameters"]["triton-operator.config-digest"]["string_value"] == "t2"
    # Its own ConfigMap carries the digest: that one.
    got = asyncio.run(desired_configs(kube, _pod("tok", digest="d1"), ["ens"]))  # type: ignore[arg-type]
    assert got is not None and json.loads(got["ens"])["parameters"]["triton-operator.config-digest"]["string_value"] == "d1"
    # No ConfigMap carries it: nothing is loaded.
    assert asyncio.run(desired_configs(kube, _pod("tok", digest="d3"), ["tok"])) is None  # type: ignore[arg-type]


def _gated(name: str, ready: bool, model: str = "ens") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "labels": {LABEL_MODEL: model}},
            "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def test_a_replica_is_deleted_only_within_the_models_budget_and_with_back_off():
    from triton_operator.controller import gate as gate_module
    from triton_operator.controller.gate import DELETE_BACKOFF, WarmupGate, _PodGate

    budgets = {"ens": 1}
    g = WarmupGate(kube=None, budget_of=lambda ns, name: budgets[name])  # type: ignore[arg-type]
    for name, ready in (("a", False), ("b", True), ("c", True)):
        g.pods[("ns", name)] = _PodGate("ns", name, _gated(name, ready))
    g.pods[("ns", "x")] = _PodGate("ns", "x", _gated("x", False, model="other"))
    a, b = g.pods[("ns", "a")], g.pods[("ns", "b")]
    assert g._delete_wait(a) == 0.0, "one replica out (this one): within maxUnavailable 1"
    b.body = _gated("b", False)
    assert g._delete_wait(a) > 0, "two out at once would exceed maxUnavailable 1"
    budgets["ens"] = 2
    assert g._delete_wait(a) == 0.0
    # Deletions of one model's replicas back off.
    now = gate_module.time.monotonic()
    g.deletions[("ns", "ens")] = [now]
    assert DELETE_BACKOFF[1] - 1 < g._delete_wait(a) <= DELETE_BACKOFF[1]
    g.deletions[("ns", "ens")] = [now - gate_module.DELETE_MEMORY - 1]
    assert g._delete_wait(a) == 0.0, "deletions long ago are forgotten"


def test_a_heal_keeps_the_gates_reason_and_says_each_step_once():
    """The gate's reason stays the cause while the replica heals (a status reading Degraded/ModelLoadFailed during a
    stalled rollout keeps reading so); the phase changes once per step, so the gate is written per step only."""
    import asyncio

    from triton_operator.controller import gate as gate_module
    from triton_operator.controller.gate import WarmupGate, _PodGate
    from triton_operator.triton.replica import ReplicaVerdict

    async def scenario() -> list[tuple[str, str, str]]:
        g = WarmupGate(kube=None)  # type: ignore[arg-type]
        pg = _PodGate("ns", "a", _gated("a", False))
        pg.body["metadata"]["annotations"] = {ANNOTATION_TRITON_NAME: "ens"}
        pg.broken = {"ens": "model ens is not in Triton's statistics (UNAVAILABLE)"}
        started: list[tuple[str, ...]] = []
        g._start_heal = lambda gate, names, why: started.append(names)  # type: ignore[method-assign]
        bad = ReplicaVerdict(False, "ModelLoadFailed", "model ens is UNAVAILABLE: boom")
        seen = []
        v, phase = g._heal(pg, bad)
        seen.append((v.reason, phase, v.message))
        # While it runs, the reload makes the model LOADING: the gate still says the cause, in the same words.
        pg.heal = asyncio.get_running_loop().create_future()  # type: ignore[assignment]
        loading = ReplicaVerdict(False, "ModelWarming", "model ens is loading and warming up")
        v, phase = g._heal(pg, loading)
        assert (v.reason, phase, v.message) == seen[0], "a heal under way keeps the cause's reason and message"
        crashed = ReplicaVerdict(False, "TritonNotRunning", "tritonserver exited (code 137)")
        assert g._heal(pg, crashed) == (crashed, ""), "tritonserver crashing meanwhile is said as such"
        pg.heal.cancel()
        # LOADING was seen while the heal ran, and the heal ended (its load failed) before the verdict was judged:
        # still the heal's verdict, said as the cause (not ModelWarming, which would flip Degraded for a moment).
        v, phase = g._heal(pg, loading, True)
        assert (v.reason, phase, v.message) == seen[0], "a verdict taken during a heal that has just ended"
        assert started == [("ens",)], "no second heal from a verdict taken during the first"
        # The heal ran and failed: the next round waits for the back-off, under the same reason.
        pg.healed_at, pg.heal_ok, pg.heal_note = gate_module.time.monotonic(), False, "heal 1 failed: boom"
        for _ in range(2):
            v, phase = g._heal(pg, bad)
            seen.append((v.reason, phase, v.message))
        assert started == [("ens",)], "one heal started; the back-off holds the next"
        return seen

    seen = asyncio.run(scenario())
    assert {reason for reason, _, _ in seen} == {"ModelLoadFailed"}, seen
    assert seen[0][1] == "heal 1" and "healing: unloading and loading ens again (heal 1)" in seen[0][2], seen
    assert seen[1][1] == seen[2][1] == "wait 1" and seen[1][2] == seen[2][2], "one message per step: " + repr(seen)
    assert "heal 1 failed: boom; next heal at " in seen[1][2], seen


def test_a_not_loaded_from_the_probe_older_than_tritons_ready_is_not_a_break(monkeypatch: pytest.MonkeyPatch) -> None:
    """The gate asks the probe's /status while the container is not ready (after a Drain's unload and load, say).
    When Triton has just said the model serves the desired config, the probe's "not loaded" is older than that (it
    checks every 0.1 s): no break, no heal (CI rehearsal at d2326eb: a Drain-reloaded replica was healed for it, then
    replaced). A dead stub the probe reports beside a READY model is still one; and "not loaded" while Triton says
    the model is not READY is kept."""
    from triton_operator.api.pod import NOT_LOADED
    from triton_operator.controller import gate as gate_module
    from triton_operator.triton.replica import ReplicaVerdict

    answers: list[dict[str, str]] = []

    async def fake_status(ip: str, port: int, key: str | None = None, timeout: float = 1.0) -> dict[str, str]:
        return answers[-1]

    monkeypatch.setattr(gate_module, "probe_status", fake_status)
    pod = {"metadata": {"name": "p", "namespace": "ns"}, "status": {"podIP": "198.18.0.9"},
           "spec": {"containers": [{"name": "tritonserver"}, {"name": "probe"}]}}

    class Owner:
        def _key(self, gate: object) -> str:
            return "k"

    def ask(verdict: ReplicaVerdict, said: dict[str, str]) -> tuple[ReplicaVerdict, dict[str, str]]:
        answers.append(said)
        g = gate_module._PodGate("ns", "p", pod)
        out = asyncio.run(gate_module.WarmupGate._ask_probe(Owner(), g, verdict, {"ready": False}))  # type: ignore[arg-type]
        return out, g.broken

    ready = ReplicaVerdict(True, "ModelWarmed", "READY", ready_seen=True)
    out, broken = ask(ready, {"m": f"model m {NOT_LOADED}"})
    assert out.ok and broken == {}, (out, broken)
    dead = "the Python stub of model m (pid 7) has exited; every request to it fails"
    out, broken = ask(ready, {"m": dead})
    assert (out.ok, out.reason) == (False, "ModelFailing") and broken == {"m": dead}, (out, broken)
    unreachable = ReplicaVerdict(False, "TritonUnreachable", "no answer")
    out, broken = ask(unreachable, {"m": f"model m {NOT_LOADED}"})
    assert broken == {"m": f"model m {NOT_LOADED}"}, broken


@pytest.mark.parametrize(("warmed", "counted"), [(False, "retry"), (True, "reload")])
def test_a_replica_that_never_served_has_its_load_retried_and_counted_apart_from_heals(
        monkeypatch: pytest.MonkeyPatch, warmed: bool, counted: str) -> None:
    """A model that never loaded is retried with back-off, as a heal reloads a broken one, but its replica did not stop
    serving: triton_operator_heals_total counts it under action `retry`, which the chart's TritonReplicaHealsRepeating
    leaves out (a model that never loads made it fire within a minute: heals at 0, 2, 6 and 14 s). A replica that
    served (its gate True once) and broke counts under `reload`."""
    from prometheus_client import REGISTRY

    from triton_operator.api.pod import WARMED_CONDITION
    from triton_operator.controller import gate as gate_module
    from triton_operator.controller.gate import WarmupGate, _PodGate
    from triton_operator.controller.heal import Healed
    from triton_operator.triton.replica import ReplicaVerdict

    async def load_fails(*_: Any, **__: Any) -> Healed:
        return Healed(False, ("ens",), "loading ens again failed: boom", 0.1)

    async def no_event(*_: Any) -> None:
        pass

    def failed(action: str) -> float:
        return REGISTRY.get_sample_value("triton_operator_heals_total", {"action": action, "result": "failed"}) or 0.0

    monkeypatch.setattr(gate_module, "reload_models", load_fails)
    before = {a: failed(a) for a in ("retry", "reload")}

    async def scenario() -> None:
        g = WarmupGate(kube=None)  # type: ignore[arg-type]
        g._event = no_event  # type: ignore[method-assign]
        pg = _PodGate("ns", "a", _gated("a", False))
        pg.body["metadata"]["annotations"] = {ANNOTATION_TRITON_NAME: "ens"}
        pg.body["status"]["conditions"].append({"type": WARMED_CONDITION, "status": "True" if warmed else "False"})
        pg.broken = {"ens": "model ens is UNAVAILABLE: boom"}
        g._heal(pg, ReplicaVerdict(False, "ModelLoadFailed", "model ens is UNAVAILABLE: boom"))
        assert pg.heal is not None
        await pg.heal
        assert pg.heals == 1 and not pg.heal_ok and "heal 1 failed" in pg.heal_note

    asyncio.run(scenario())
    other = "reload" if counted == "retry" else "retry"
    assert failed(counted) == before[counted] + 1 and failed(other) == before[other]


def test_every_heal_action_is_exposed_at_zero_before_the_first_heal() -> None:
    """A fresh operator process serves triton_operator_heals_total (and the pool's load and round counters) for every
    action and result at 0: the chart's TritonReplicaHealsRepeating takes increase() of it, and a series that first
    appeared at 1 showed no increase for that heal, so each action's first heal after a start went uncounted. Read in
    a new interpreter: this process's registry has counted the other tests' heals."""
    import subprocess
    import sys

    code = ("import triton_operator.controller.metrics\n"
            "from prometheus_client import REGISTRY\n"
            "for m in REGISTRY.collect():\n"
            "    for s in m.samples:\n"
            "        if s.name in ('triton_operator_heals_total', 'triton_operator_pool_loads_total',\n"
            "                      'triton_operator_pool_rounds_total'):\n"
            "            print(s.name, ','.join(f'{k}={v}' for k, v in sorted(s.labels.items())), s.value)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.splitlines()
    heals = {line.split()[1] for line in out if line.startswith("triton_operator_heals_total ")}
    assert heals == {f"action={a},result={r}" for a in ("reload", "delete", "retry") for r in ("ok", "failed")}, out
    assert {line.split()[1] for line in out if line.startswith("triton_operator_pool_loads_total ")} == {
        f"result={r},verb={v}" for v in ("load", "unload") for r in ("ok", "error")}, out
    assert {line.split()[1] for line in out if line.startswith("triton_operator_pool_rounds_total ")} == {
        "result=ok", "result=error"}, out
    assert all(line.endswith(" 0.0") for line in out), out
