"""Benchmark `gate`: how long after a replica's Triton reports the model READY does the pod turn Ready?

On our own cluster (control plane, one real node: containerd + kubelet, the operator): the TritonModel
examples/add-sub.yaml (warm-up sample, Python backend) scaled 0 -> WAVE replicas -> 0, WAVES times;
alternately, the usual approach: the same tritonserver, model and repository as a plain Deployment with the
probes of Triton's own Helm charts, copied with their values (bench/peers.py: deploy/gcp, aws and
fleetcommand's readiness probe httpGet /v2/health/ready, initialDelaySeconds 5, periodSeconds 5; and
deploy/k8s-onprem's, whose startup probe every 10 s comes first), and no gate. For every replica the
bench polls ModelReady on podIP:8001 itself every 15 ms (TCP connect first, so no gRPC reconnect
back-off hides the moment) and watches the pod: Ready's watch-event time minus the READY time is the figure.
Ready's lastTransitionTime (1 s resolution) is kept as a cross-check.

Then the issue's end-to-end figure: `kubectl apply` of a new model -> its first replica ready in the
Service's EndpointSlice, against tritonserver's own load + warm-up (its process start -> READY).
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path
from typing import Any

from e2e.kube import Kube, wait_for
from e2e.testing import metric_samples
from triton_operator.api.kinds import LABEL_MODEL

from . import gate_floor
from .common import CpuMeter, Result, Row, log, ms, summary, write_result
from .kubeenv import BackgroundWatch
from .models import checked, example
from .peers import TRITON_CHART, TRITON_ONPREM_CHART, Peer, describe, describe_all
from .pods import PodTimeline, PodWatch, plain_children, pod_cluster, replica_rss_mb, scale_to, tritonmodel, wait_no_pods

NAMESPACE = "bench-gate"
#: Waves of WAVE replicas per approach; BENCH_GATE_WAVES and BENCH_GATE_APPLIES lower the sample counts (a shorter run,
#: which the result's method text then states through the counts it names).
WAVES, WAVE = int(os.environ.get("BENCH_GATE_WAVES", "4")), 5
APPLIES = int(os.environ.get("BENCH_GATE_APPLIES", "6"))  # per model, for kubectl apply -> first replica ready
# The baselines, plain Deployments with no gate: add-sub with Triton's charts' probes (`plain`) and with the
# k8s-onprem chart's (`onprem`); examples/warmup.yaml with Triton's charts' probes (`plainwarm`).
PLAIN = {"plain": TRITON_CHART, "onprem": TRITON_ONPREM_CHART, "plainwarm": TRITON_CHART}


def process_started_at(pid: int) -> float:
    """A process's start as a Unix time, from /proc (clock ticks since boot: 10 ms resolution)."""
    ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    return time.time() - age


class SliceWatch(BackgroundWatch):
    """The first time each Service of the namespace has a ready endpoint in its EndpointSlices (watch events)."""

    kind = "EndpointSlice"

    def __init__(self, kube: Kube, namespace: str) -> None:
        super().__init__(kube, namespace)
        self.first_ready: dict[str, float] = {}

    def _on_event(self, typ: str, es: dict[str, Any], t: float) -> None:
        svc = ((es.get("metadata") or {}).get("labels") or {}).get("kubernetes.io/service-name")
        if typ == "DELETED" or not svc or svc in self.first_ready:
            return
        if any((e.get("conditions") or {}).get("ready") for e in es.get("endpoints") or ()):
            self.first_ready[svc] = t


def measure_applies(env: Any, watch: PodWatch, doc: dict[str, Any]) -> dict[str, list[dict[str, float]]]:
    """`kubectl apply` of a new model with one replica -> its Service's first ready endpoint, APPLIES times each for
    add-sub and examples/warmup.yaml as TritonModels and add-sub the usual way; with tritonserver's own part
    (its process start -> READY) and the steps between. Images are on the node already."""
    kube, ns = env.kube, env.namespace
    out: dict[str, list[dict[str, float]]] = {"add-sub": [], "warmup": [], "plain": []}
    rng = random.Random(17)
    with SliceWatch(kube, ns) as slices:
        for i in range(APPLIES):
            for variant, src in (("add-sub", doc), ("warmup", example("warmup")), ("plain", doc)):
                name = f"apply-{variant}-{i}"
                watch.model_of[name] = name
                # The previous model's pods went away on a kubelet sync, which follows a PLEG relist (every 1 s):
                # without this the apply would come at the same phase of the relist every time.
                time.sleep(rng.uniform(0.0, 1.0))
                applied = time.time()
                if variant == "plain":
                    objs = plain_children(checked(tritonmodel(src, name, ns)), name, ns, TRITON_CHART.probes)
                    for obj in objs:
                        if obj["kind"] == "Deployment":
                            obj["spec"]["replicas"] = 1
                        kube.create(obj)
                    selector = {"app": name}
                else:
                    kube.create(tritonmodel(src, name, ns, replicas=1))
                    selector = {LABEL_MODEL: name}
                endpoint = wait_for(f"{name} ready in its EndpointSlice", lambda n=name: slices.first_ready.get(n),
                                    300, 0.05)
                tl = watch.wait(f"{name}-", 1, "model_ready_at", 30)[0]
                pod = next(p for p in kube.items("Pod", ns) if p["metadata"]["uid"] == tl.uid)
                started = process_started_at(env.cluster.container_pid(pod, "tritonserver"))
                assert tl.model_ready_at is not None
                row = {"apply_to_endpoint": endpoint - applied, "apply_to_pod": tl.seen - applied,
                       "pod_to_start": started - tl.seen, "triton_own": tl.model_ready_at - started,
                       "ready_to_endpoint": endpoint - tl.model_ready_at}
                row["overhead"] = row["apply_to_endpoint"] - row["triton_own"]
                out[variant].append(row)
                log(f"Apply {name}: ready in its EndpointSlice {ms(row['apply_to_endpoint'])} after the apply; "
                    f"tritonserver's own start -> READY {ms(row['triton_own'])}, the rest {ms(row['overhead'])}")
                if variant == "plain":
                    for kind, obj_name in (("Deployment", name), ("Service", name), ("ConfigMap", f"{name}-repository")):
                        kube.delete(kind, obj_name, ns)
                else:
                    kube.delete("TritonModel", name, ns)
                wait_no_pods(kube, ns, selector)
    return out


def apply_rows(applies: dict[str, list[dict[str, float]]]) -> list[Row]:
    def cell(variant: str, key: str) -> str:
        st = summary([a[key] for a in applies.get(variant) or ()])
        return f"p50 {ms(st['p50'])}, p95 {ms(st['p95'])}, max {ms(st['max'])} (n={st['n']})" if st.get("n") else "-"

    def met(variant: str) -> bool:
        rows = applies.get(variant) or ()
        return bool(rows) and max(a["overhead"] for a in rows) <= 1.0

    rows = [
        Row("kubectl apply -> first replica ready in the EndpointSlice, add-sub (one replica, images on the node)",
            cell("add-sub", "apply_to_endpoint"), cell("plain", "apply_to_endpoint")),
        Row("  of which tritonserver's own load + warm-up (its process start -> READY)", cell("add-sub", "triton_own"),
            cell("plain", "triton_own")),
        Row("  the rest: apply -> endpoint minus tritonserver's own", cell("add-sub", "overhead"),
            cell("plain", "overhead"), "<= 1 s (every run)", met("add-sub")),
        Row("kubectl apply -> first replica ready in the EndpointSlice, examples/warmup.yaml",
            cell("warmup", "apply_to_endpoint"), "-"),
        Row("  of which tritonserver's own load + warm-up", cell("warmup", "triton_own"), "-"),
        Row("  the rest: apply -> endpoint minus tritonserver's own", cell("warmup", "overhead"), "-",
            "<= 1 s (every run)", met("warmup")),
    ]
    for variant in ("add-sub", "warmup"):
        rows += [
            Row(f"  {variant}: apply -> pod created (operator, Deployment and ReplicaSet controllers)",
                cell(variant, "apply_to_pod"), cell("plain", "apply_to_pod") if variant == "add-sub" else "-"),
            Row(f"  {variant}: pod created -> tritonserver started (scheduler, sandbox, kubelet; no init container)",
                cell(variant, "pod_to_start"), cell("plain", "pod_to_start") if variant == "add-sub" else "-"),
            Row(f"  {variant}: READY -> ready in the EndpointSlice", cell(variant, "ready_to_endpoint"),
                cell("plain", "ready_to_endpoint") if variant == "add-sub" else "-"),
        ]
    return rows


def latencies(pods: list[PodTimeline], attr: str) -> list[float]:
    return [getattr(p, attr) - p.model_ready_at for p in pods
            if getattr(p, attr) is not None and p.model_ready_at is not None]


def run(waves: int = WAVES, wave: int = WAVE) -> Path:
    started, meter = time.monotonic(), CpuMeter()
    doc = example("add-sub")
    approaches = {
        "gated": {"kind": "TritonModel", "selector": {LABEL_MODEL: "gated"}},
        "plain": {"kind": "Deployment", "selector": {"app": "plain"}},
        "onprem": {"kind": "Deployment", "selector": {"app": "onprem"}},
        # examples/warmup.yaml as is: its warm-up sample pays a 2.5 s lazy initialisation before READY, so READY
        # comes seconds after the container starts, as with most real models (add-sub is READY about a second in).
        "warm": {"kind": "TritonModel", "selector": {LABEL_MODEL: "warm"}},
        "plainwarm": {"kind": "Deployment", "selector": {"app": "plainwarm"}},
    }
    timelines: dict[str, list[PodTimeline]] = {a: [] for a in approaches}
    rss: dict[str, list[float]] = {a: [] for a in approaches}
    probe_rss: list[float] = []
    op_metric: dict[str, float] = {}
    probes: dict[str, Any] = {}
    with pod_cluster(NAMESPACE) as env:
        kube, ns = env.kube, env.namespace
        kube.create(tritonmodel(doc, "gated", ns))
        kube.create(tritonmodel(example("warmup"), "warm", ns))
        for name, peer in PLAIN.items():
            src = example("warmup") if name == "plainwarm" else doc
            for obj in plain_children(checked(tritonmodel(src, name, ns)), name, ns, peer.probes):
                kube.create(obj)
        dep = wait_for("the operator's Deployment gated", lambda: kube.get_or_none("Deployment", "gated", ns), 60)
        triton = next(c for c in dep["spec"]["template"]["spec"]["containers"] if c["name"] == "tritonserver")
        probes = {k: triton.get(k) for k in ("startupProbe", "readinessProbe", "livenessProbe")}
        with PodWatch(kube, ns, {a: a for a in approaches}) as watch:
            for i in range(waves):
                order = (("gated", "plain", "onprem", "warm", "plainwarm") if i % 2 == 0
                         else ("onprem", "plain", "gated", "plainwarm", "warm"))
                for name in order:
                    a = approaches[name]
                    before = set(watch.pods)
                    t0 = time.time()
                    scale_to(kube, a["kind"], name, ns, wave)

                    def ready(before: set[str] = before, name: str = name) -> list[PodTimeline] | None:
                        with watch.lock:
                            new = [p for n, p in watch.pods.items() if n not in before and n.startswith(f"{name}-")]
                        done = [p for p in new if p.ready_at and p.model_ready_at]
                        return done if len(done) >= wave else None

                    pods = wait_for(f"{wave} {name} replicas Ready", ready, 300, 0.2)
                    if i == 0:
                        rss[name] = replica_rss_mb(env.cluster, pods)
                        if name == "gated":
                            probe_rss = replica_rss_mb(env.cluster, pods, "probe")
                    timelines[name].extend(pods)
                    lat = [p.ready_at - p.model_ready_at for p in pods]
                    log(f"Wave {i + 1}/{waves} {name}: {wave} replicas Ready in {time.time() - t0:.1f}s; "
                        f"READY->Ready {', '.join(ms(x) for x in sorted(lat))}")
                    scale_to(kube, a["kind"], name, ns, 0)
                    wait_no_pods(kube, ns, a["selector"])
            applies = measure_applies(env, watch, doc)
        # The kubelet's own floor, on the same node: a readiness gate's condition patched by the bench -> pod Ready.
        floor = gate_floor.measure(kube, ns, triton["image"], triton.get("imagePullPolicy"))
        text = env.operator.metrics()
        for key in ("sum", "count"):
            op_metric[key] = sum(metric_samples(text, f"triton_operator_ready_to_gate_seconds_{key}").values())

    stats: dict[str, Any] = {
        name: {
            "ready": summary(latencies(tl, "ready_at")),
            "containers_ready": summary(latencies(tl, "containers_ready_at")),
            "warmed": summary(latencies(tl, "warmed_at")),
            "http_open": summary(latencies(tl, "http_open_at")),
            "ready_last_transition": summary(latencies(tl, "ready_ltt")),
            "containers_ready_to_ready": summary([x.ready_at - x.containers_ready_at for x in tl
                                                  if x.ready_at and x.containers_ready_at]),
            "load": summary([x.model_ready_at - x.ip_at for x in tl if x.model_ready_at and x.ip_at]),
            "containers_ready_to_model_ready": summary([x.model_ready_at - x.containers_ready_at for x in tl
                                                        if x.model_ready_at and x.containers_ready_at]),
            "tcp_open_to_model_ready": summary([x.model_ready_at - x.tcp_open_at for x in tl
                                                if x.model_ready_at and x.tcp_open_at]),
        }
        for name, tl in timelines.items()
    }
    sg, sp, so, sw, swp = stats["gated"], stats["plain"], stats["onprem"], stats["warm"], stats["plainwarm"]

    floor_stats = summary([f["ready_at"] - f["patched_at"] for f in floor])

    def cell(s: dict[str, Any]) -> str:
        if not s.get("n"):
            return "-"
        return f"p50 {ms(s['p50'])}, p95 {ms(s['p95'])}, max {ms(s['max'])} (n={s['n']})"

    result = Result(
        name="gate",
        title="Warm-up gate latency: Triton READY -> pod Ready",
        method=(
            f"Our own cluster (control plane, one real node: containerd + kubelet running real tritonserver pods, "
            f"the operator). examples/add-sub.yaml scaled 0 -> {wave} -> 0, {waves} times, as a TritonModel "
            "(warm-up gate) and, alternating, as a plain Deployment of the same tritonserver and repository with no "
            f"gate and the probes of Triton's own Helm charts, copied with their values: the usual approach is "
            f"{TRITON_CHART.label} ({describe_all(TRITON_CHART)}; {TRITON_CHART.source}); a second baseline is "
            f"{TRITON_ONPREM_CHART.label} ({describe_all(TRITON_ONPREM_CHART)}; {TRITON_ONPREM_CHART.source}). "
            "examples/warmup.yaml likewise as a TritonModel and as a plain Deployment with the usual approach's "
            "probes. "
            "The bench polls gRPC "
            "ModelReady on podIP:8001 every 15 ms (after a TCP connect succeeds) and watches the pods; latency = "
            "the watch event showing Ready=True minus the first READY answer. Then, APPLIES times each, a new "
            "TritonModel with one replica (add-sub, examples/warmup.yaml) and add-sub the usual way are created "
            "(with the usual approach's probes) and deleted, each at a random phase of the kubelet's 1 s relist: "
            "apply -> the first ready endpoint "
            "in the Service's EndpointSlices (a watch), against tritonserver's own load + warm-up (its process "
            "start, from /proc with 10 ms resolution, -> READY)."
            .replace("APPLIES", str(APPLIES))
            + f" The kubelet's floor, after those on the same node: a pod of the tritonserver image running `sleep` "
            f"(no probes) with a readiness gate of type {gate_floor.CONDITION}, which the bench patches True on "
            f"pods/status itself (no operator), {gate_floor.SAMPLES} times, each after patching it False and seeing "
            "Ready fall, at a random phase of the kubelet's 1 s relist: the patch request's start -> the watch event "
            "showing Ready=True."
        ),
    )
    result.rows = [
        Row("probes of the tritonserver container (usual: copied from Triton's Helm charts)",
            f"{describe_all(Peer('', '', {k: v for k, v in probes.items() if v}))} (answered by the pod's `probe` "
            "container) and the readiness gate", f"{describe_all(TRITON_CHART)} ({TRITON_CHART.source})"),
        Row("model READY -> pod Ready", cell(sg["ready"]), cell(sp["ready"]), "p95 <= 250 ms",
            bool(sg["ready"].get("n")) and sg["ready"]["p95"] <= 0.25),
        Row("  kubelet floor: a readiness gate's condition patched True by the bench -> pod Ready (no operator, "
            "same node, same run)", cell(floor_stats), "-"),
        Row("model READY -> pod Ready, usual = the k8s-onprem chart's probes (its startup probe, every 10 s, first; "
            f"{TRITON_ONPREM_CHART.source})", cell(sg["ready"]), cell(so["ready"])),
        Row("model READY -> pod Ready, examples/warmup.yaml (READY seconds after its container starts)",
            cell(sw["ready"]), cell(swp["ready"]), "p95 <= 250 ms",
            bool(sw["ready"].get("n")) and sw["ready"]["p95"] <= 0.25),
        Row("model READY -> gate condition True (the operator's part)", cell(sg["warmed"]), "- (no gate)"),
        Row("model READY over gRPC -> HTTP port open (tritonserver opens HTTP after gRPC; the gate asks over HTTP)",
            cell(sg["http_open"]), cell(sp["http_open"])),
        Row("model READY -> ContainersReady (kubelet probes)", cell(sg["containers_ready"]), cell(sp["containers_ready"])),
        Row("model READY -> ContainersReady, examples/warmup.yaml", cell(sw["containers_ready"]),
            cell(swp["containers_ready"])),
        Row("ContainersReady -> pod Ready (kubelet pod sync)", cell(sg["containers_ready_to_ready"]),
            cell(sp["containers_ready_to_ready"])),
        Row("Ready lastTransitionTime - READY (1 s resolution)", cell(sg["ready_last_transition"]),
            cell(sp["ready_last_transition"])),
        Row("pod IP -> model READY (load + warm-up)", cell(sg["load"]), cell(sp["load"])),
        Row("pod IP -> model READY (load + warm-up), k8s-onprem chart's probes", cell(sg["load"]), cell(so["load"])),
        Row("pod IP -> model READY, examples/warmup.yaml", cell(sw["load"]), cell(swp["load"])),
        Row("RSS per replica (tritonserver + Python stub)",
            f"{', '.join(f'{x:.0f}' for x in rss['gated'])} MB", f"{', '.join(f'{x:.0f}' for x in rss['plain'])} MB"),
        *apply_rows(applies),
        Row("RSS of the `probe` container per replica (gated only)",
            f"{', '.join(f'{x:.1f}' for x in probe_rss)} MB" if probe_rss else "-", "- (none)"),
    ]
    if (waves, APPLIES) != (4, 6):
        result.notes.append(
            f"A shorter run than the default: {waves} waves (BENCH_GATE_WAVES; default 4) and {APPLIES} applies per "
            "model (BENCH_GATE_APPLIES; default 6), so fewer samples per figure than `make bench` takes.")
    negative = {name: [x for x in latencies(tl, "ready_at") if x < 0] for name, tl in timelines.items()}
    if any(negative.values()):
        result.notes.append(
            "Some pods turned Ready before the bench's own poll saw READY (the gate asks Triton itself, so READY "
            "came first): the poll ran late, as it does when the CPU is busy (see contention). Those figures "
            "understate the time: " + "; ".join(f"{name} {len(xs)} of {len(latencies(timelines[name], 'ready_at'))}, "
                                               f"down to {ms(min(xs))}" for name, xs in negative.items() if xs) + ".")
    if op_metric.get("count"):
        result.notes.append(
            f"The operator's own histogram triton_operator_ready_to_gate_seconds (from its first READY answer to "
            f"the gate patch) averages {ms(op_metric['sum'] / op_metric['count'])} over {op_metric['count']:.0f} gates.")
    if sg["ready"].get("n") and sg["warmed"].get("n"):
        result.notes.append(
            f"Where the time goes (ours): the gate condition turns True {ms(sg['warmed']['p50'])} (p50) / "
            f"{ms(sg['warmed']['p95'])} (p95) after READY: while tritonserver still refuses connections (it opens "
            "its ports only after loading and warming the model) the operator tries a TCP connect to the HTTP port "
            "every 20 ms, and asks over HTTP as soon as one is accepted; tritonserver opens HTTP after gRPC "
            f"({ms(sg['http_open'].get('p50'))} p50 / {ms(sg['http_open'].get('p95'))} p95 after gRPC's READY "
            "here). Pod Ready also needs the container ready. The "
            f"operator's pod template has startupProbe {describe(probes['startupProbe'])} and readinessProbe "
            f"{describe(probes['readinessProbe'])}, answered by the pod's `probe` container: it holds each probe while "
            "tritonserver's HTTP port refuses connections and, once the port is open, passes it 30 ms after the "
            "operator's notice that it has set the gate (POST /gate; else 0.5 s after the port opened), so that the "
            "kubelet has synced the gate first. ContainersReady "
            f"came {ms(sg['containers_ready']['p50'])} (p50) / {ms(sg['containers_ready']['p95'])} (p95) after READY "
            f"for add-sub, {ms(sw['containers_ready'].get('p50'))} / {ms(sw['containers_ready'].get('p95'))} for "
            "examples/warmup.yaml. A probe's success sets Ready at once from the conditions of the kubelet's last "
            "pod sync; if that sync predates the gate, Ready waits for the sync the gate's pod update brings, and "
            "each sync first waits for a PLEG relist (every 1 s) that began after the previous sync ended. So "
            f"add-sub turns Ready {ms(sg['ready']['p50'])} / {ms(sg['ready']['p95'])} after READY, "
            f"examples/warmup.yaml {ms(sw['ready'].get('p50'))} / {ms(sw['ready'].get('p95'))}. Traced in "
            "kubelet 1.35 at --v=4 (issue 17).")
    if sp["ready"].get("n"):
        rp = TRITON_CHART.probes["readinessProbe"]
        result.notes.append(
            f"The usual approach's readiness probe ({TRITON_CHART.label}) first fires initialDelaySeconds "
            f"({rp['initialDelaySeconds']} s) after the container starts, then every periodSeconds "
            f"({rp['periodSeconds']} s). A model READY before the first probe (add-sub is READY about a second in) "
            f"turns Ready at that probe, about {rp['initialDelaySeconds']} s minus its load time after READY; "
            f"in general anywhere in 0-{rp['periodSeconds']} s after READY.")
    if so["ready"].get("n"):
        result.notes.append(
            f"{TRITON_ONPREM_CHART.label}'s startup probe (every 10 s from the container's start) must pass before "
            "the kubelet runs its readiness probe, which then passes on its next period (every 5 s): READY -> "
            "Ready is up to 10 s for the startup probe plus up to 5 s for the readiness probe.")
    result.data = {"applies": applies, "stats": stats, "rss_mb": rss, "operator_probes": probes, "operator_ready_to_gate": op_metric,
                   "baselines": {name: {"label": p.label, "source": p.source, "probes": p.probes}
                                 for name, p in PLAIN.items()},
                   "timelines": {**{n: [tl.__dict__ for tl in tls] for n, tls in timelines.items()},
                                 # bench/plots.py draws it as the floor: READY stands for the bench's patch here.
                                 "kubelet_floor": [{"model_ready_at": f["patched_at"], "ready_at": f["ready_at"]}
                                                   for f in floor]}}
    return write_result(result, started, meter)
