"""Each example in examples/ rendered by the operator and served by a REAL tritonserver, with the
feature it shows observed working (batches formed, cache hits, streamed responses, …), not just READY.

One server per example (module-scoped), plus one server that loads every example at once.
"""

from __future__ import annotations

import queue
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.timing import scaled
from tests.triton_helpers import EXAMPLES, Served, ServerPool, load_models, tensor, variant
from triton_operator.api.v1alpha1 import quantity_bytes

pytestmark = pytest.mark.triton

EXAMPLE_FILES = sorted(p.name for p in EXAMPLES.glob("*.yaml"))


@pytest.fixture(scope="module")
def pool():
    """Every server this module starts; stopped together at the end."""
    servers = ServerPool()
    yield servers
    servers.close()


def _collect(results: queue.Queue, n: int, timeout: float, served: Served, what: str) -> list:
    """n items from a callback queue, or fail saying how many arrived."""
    out = []
    deadline = time.monotonic() + scaled(timeout)
    while len(out) < n:
        try:
            out.append(results.get(timeout=max(0.0, deadline - time.monotonic())))
        except queue.Empty:
            raise AssertionError(served.why(f"only {len(out)} of {n} {what} arrived within {scaled(timeout):.0f}s")) from None
    return out


def _param(served: Served, model: str, key: str) -> float:
    """A model parameter from the spec (the models read the same value from their config)."""
    for r in served.rendered.values():
        if r.name == model:
            return float(r.model.spec.parameters[key])
    raise KeyError(model)


# ---------------------------------------------------------------- add-sub


@pytest.fixture(scope="module")
def add_sub(pool: ServerPool, tmp_path_factory: pytest.TempPathFactory) -> Served:
    return pool.serve_example("add-sub.yaml", tmp_path_factory.mktemp("add-sub"))


def test_add_sub_warms_up_and_infers(add_sub: Served) -> None:
    warm = add_sub.rendered["add-sub"].config.model_warmup[0]
    before = add_sub.stats("add-sub")
    # warm-up sample `zeros` has count 2: two executions before any client request
    assert before.execution_count == warm.count == 2, add_sub.why(
        f"expected {warm.count} warm-up executions before any request, statistics show {before.execution_count}"
    )

    rng = np.random.default_rng(0)
    a = rng.standard_normal((3, 4)).astype(np.float32)
    b = rng.standard_normal((3, 4)).astype(np.float32)
    res = add_sub.client.infer("add-sub", [tensor("INPUT0", a), tensor("INPUT1", b)])
    np.testing.assert_allclose(res.as_numpy("OUTPUT0"), a + b, rtol=1e-6, err_msg="OUTPUT0 is not INPUT0 + INPUT1")
    np.testing.assert_allclose(res.as_numpy("OUTPUT1"), a - b, rtol=1e-6, err_msg="OUTPUT1 is not INPUT0 - INPUT1")
    after = add_sub.wait_for(
        "the request to show in the statistics",
        lambda: (s := add_sub.stats("add-sub")).execution_count > before.execution_count and s,
    )
    assert after.inference_stats.success.count >= 1, add_sub.why(f"no successful inference counted: {after}")


# ---------------------------------------------------------------- 1. dynamic batching


@pytest.fixture(scope="module")
def dynamic_batching(pool: ServerPool, tmp_path_factory: pytest.TempPathFactory) -> Served:
    return pool.serve_example("dynamic-batching.yaml", tmp_path_factory.mktemp("dyn"))


def test_dynamic_batching_forms_batches_under_concurrent_load(dynamic_batching: Served) -> None:
    s = dynamic_batching
    cfg = s.client.get_model_config("dynamic-batching").config
    assert cfg.dynamic_batching.max_queue_delay_microseconds == 20000, s.why(f"loaded config: {cfg}")
    assert s.batch_sizes("dynamic-batching") == {}, s.why("the model executed before the test sent anything")

    n = 32
    results: queue.Queue = queue.Queue()
    for i in range(n):  # all in flight at once; the model sleeps 40 ms per execute, so they queue up
        s.client.async_infer(
            "dynamic-batching",
            [tensor("INPUT", np.array([[float(i)]], dtype=np.float32))],
            callback=lambda result, error, i=i: results.put((i, result, error)),
        )
    got = _collect(results, n, 30, s, "responses")
    errors = [(i, e) for i, _r, e in got if e is not None]
    assert not errors, s.why(f"requests failed: {errors[:3]}")
    together = {}
    for i, r, _e in got:
        np.testing.assert_allclose(r.as_numpy("OUTPUT"), [[2.0 * i]], err_msg=f"request {i}: wrong OUTPUT")
        together[i] = int(r.as_numpy("BATCHED_WITH")[0, 0])

    sizes = s.wait_for(
        f"batch statistics covering all {n} requests",
        lambda: (b := s.batch_sizes("dynamic-batching")) and sum(k * v for k, v in b.items()) == n and b,
    )
    stats = s.stats("dynamic-batching")
    assert max(sizes) > 1, s.why(f"no batch larger than 1 formed under {n} concurrent requests: batch_stats {sizes}")
    assert stats.execution_count < stats.inference_count == n, s.why(
        f"{stats.inference_count} inferences took {stats.execution_count} executions: requests were not batched"
    )
    # the model saw the same thing from the inside: several requests in one execute() call
    assert max(together.values()) > 1, s.why(f"every execute() got a single request: {together}")
    print(f"dynamic batching: {n} requests in {stats.execution_count} executions, batch sizes {dict(sorted(sizes.items()))}")


# ---------------------------------------------------------------- 2. response cache


@pytest.fixture(scope="module")
def response_cache(pool: ServerPool, tmp_path_factory: pytest.TempPathFactory) -> Served:
    models = load_models(EXAMPLES / "response-cache.yaml")
    size = quantity_bytes(models[0].spec.server.cache_size)  # spec.server.cacheSize -> --cache-config local,size=
    return pool.serve(models, tmp_path_factory.mktemp("cache") / "response-cache", cache_size=size)


def test_response_cache_answers_repeated_requests(response_cache: Served) -> None:
    s = response_cache
    assert s.server.cache_size == 16 * 2**20, f"server started with cache size {s.server.cache_size}, spec says 16Mi"
    assert s.client.get_model_config("response-cache").config.response_cache.enable, s.why("cache not enabled in config")

    x = np.array([[1.0, 2.0, 3.0, 4.0]], dtype=np.float32)
    repeats = 5
    for _ in range(repeats):
        res = s.client.infer("response-cache", [tensor("INPUT", x)])
        np.testing.assert_allclose(res.as_numpy("SQUARED"), x**2, err_msg="cached or not, the answer must be x**2")

    stats = s.wait_for(
        f"{repeats} requests in the statistics",
        lambda: (st := s.stats("response-cache")).inference_stats.success.count >= repeats and st,
    )
    hits, misses = stats.inference_stats.cache_hit.count, stats.inference_stats.cache_miss.count
    assert misses == 1 and hits == repeats - 1, s.why(
        f"{repeats} identical requests: expected 1 miss then {repeats - 1} hits, got {misses} misses, {hits} hits"
    )
    assert stats.execution_count == 1, s.why(
        f"the model executed {stats.execution_count} times; cached requests should not reach it"
    )

    # a different input is a miss and runs the model; repeating it is a hit again
    y = x + 1
    for _ in range(2):
        np.testing.assert_allclose(s.client.infer("response-cache", [tensor("INPUT", y)]).as_numpy("SQUARED"), y**2)
    stats = s.wait_for(
        "the second input in the statistics",
        lambda: (st := s.stats("response-cache")).inference_stats.success.count >= repeats + 2 and st,
    )
    assert (stats.inference_stats.cache_miss.count, stats.inference_stats.cache_hit.count) == (2, repeats), s.why(
        f"after a new input twice: misses {stats.inference_stats.cache_miss.count}, hits {stats.inference_stats.cache_hit.count}"
    )
    print(f"response cache: hits {stats.inference_stats.cache_hit.count}, misses {stats.inference_stats.cache_miss.count}, "
          f"executions {stats.execution_count} for {stats.inference_stats.success.count} requests")


# ---------------------------------------------------------------- 3. decoupled


@pytest.fixture(scope="module")
def decoupled(pool: ServerPool, tmp_path_factory: pytest.TempPathFactory) -> Served:
    return pool.serve_example("decoupled.yaml", tmp_path_factory.mktemp("decoupled"))


def _stream(s: Served, count: int, request_id: str) -> list[int]:
    """Send one request over a gRPC stream; the INDEX of every data response until the FINAL one."""
    client = grpcclient.InferenceServerClient(s.server.grpc_url)
    got: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    try:
        client.async_stream_infer(
            "decoupled",
            [tensor("COUNT", np.array([count], dtype=np.int32))],
            request_id=request_id,
            enable_empty_final_response=True,  # so the FINAL flag reaches the client as its own response
        )
        indices = []
        deadline = time.monotonic() + scaled(15)
        while True:
            try:
                result, error = got.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(s.why(f"no FINAL response within {scaled(15):.0f}s; data responses so far {indices}")) from None
            assert error is None, s.why(f"stream error: {error}")
            resp = result.get_response()
            assert resp.id == request_id, s.why(f"response for request {resp.id!r}, sent {request_id!r}")
            if resp.outputs:
                indices.append(int(result.as_numpy("INDEX")[0]))
            if resp.parameters["triton_final_response"].bool_param:
                return indices
    finally:
        client.stop_stream()
        client.close()


def test_decoupled_model_streams_many_responses_for_one_request(decoupled: Served) -> None:
    s = decoupled
    assert s.client.get_model_config("decoupled").config.model_transaction_policy.decoupled, s.why("not decoupled")
    assert _stream(s, 5, "five") == [0, 1, 2, 3, 4], s.why("one request should get exactly 5 responses, in order")
    assert _stream(s, 0, "none") == [], s.why("COUNT 0 should give no data responses, only FINAL")
    # statistics are updated when Triton releases a request, just after its FINAL response
    s.wait_for("both streamed requests in the statistics", lambda: s.stats("decoupled").inference_count == 2)


# ---------------------------------------------------------------- 4. warm-up


def _no_warmup(doc: dict) -> None:
    doc["metadata"]["name"] = "warmup-cold"
    del doc["spec"]["modelWarmup"]


@pytest.fixture(scope="module")
def warmup(pool: ServerPool, tmp_path_factory: pytest.TempPathFactory) -> Served:
    # the example, and the same spec without modelWarmup under another name, in one server
    models = load_models(EXAMPLES / "warmup.yaml") + variant(EXAMPLES / "warmup.yaml", _no_warmup)
    return pool.serve(models, tmp_path_factory.mktemp("warmup") / "warmup")


def _first_request_seconds(s: Served, model: str) -> float:
    x = np.ones((1, 4), dtype=np.float32)
    t0 = time.monotonic()
    res = s.client.infer(model, [tensor("INPUT", x)])
    elapsed = time.monotonic() - t0
    np.testing.assert_allclose(res.as_numpy("OUTPUT"), [[1, 2, 3, 4]], err_msg=f"{model}: wrong OUTPUT")
    return elapsed


def test_warmup_pays_lazy_init_before_ready(warmup: Served) -> None:
    s = warmup
    lazy = _param(s, "warmup", "lazyInitSeconds")
    assert s.rendered["warmup-cold"].config.model_warmup == [] and s.rendered["warmup"].config.model_warmup

    # before any client request: warm-up executions in the statistics of the warmed model only
    warm_before, cold_before = s.stats("warmup"), s.stats("warmup-cold")
    assert warm_before.execution_count >= 1, s.why(f"no warm-up execution before the first request: {warm_before}")
    assert cold_before.execution_count == 0, s.why(f"the model without warm-up executed already: {cold_before}")
    # the lazy init happened during the load (before READY), not later
    assert s.loads["warmup"].seconds >= lazy, s.why(
        f"warmed model loaded in {s.loads['warmup'].seconds:.2f}s, less than its {lazy}s lazy init"
    )

    warm_first = _first_request_seconds(s, "warmup")
    cold_first = _first_request_seconds(s, "warmup-cold")
    assert cold_first >= lazy * 0.95, s.why(
        f"without warm-up the first request took {cold_first:.2f}s, expected to pay the {lazy}s lazy init"
    )
    assert warm_first < lazy / 2, s.why(
        f"with warm-up the first request took {warm_first:.2f}s; lazy init is {lazy}s and should be paid already"
    )
    print(
        f"warm-up: {warm_before.execution_count} warm-up execution(s); load {s.loads['warmup'].seconds:.2f}s vs "
        f"{s.loads['warmup-cold'].seconds:.2f}s; first request {warm_first * 1000:.1f} ms warmed vs "
        f"{cold_first * 1000:.0f} ms cold"
    )


# ---------------------------------------------------------------- 5. priority levels and queue policy


@pytest.fixture(scope="module")
def priority_queue(pool: ServerPool, tmp_path_factory: pytest.TempPathFactory) -> Served:
    return pool.serve_example("priority-queue.yaml", tmp_path_factory.mktemp("prio"))


def test_priority_queue_rejects_flood_and_serves_high_priority(priority_queue: Served) -> None:
    s = priority_queue
    db = s.client.get_model_config("priority-queue").config.dynamic_batching
    assert (db.priority_levels, db.default_priority_level, db.priority_queue_policy[2].max_queue_size) == (2, 2, 1), (
        s.why(f"loaded dynamic_batching: {db}")
    )

    results: queue.Queue = queue.Queue()
    done_order: list[str] = []

    def send(tag: str, value: int, priority: int = 0) -> None:
        s.client.async_infer(
            "priority-queue",
            [tensor("INPUT", np.array([[value]], dtype=np.int32))],
            callback=lambda result, error: (done_order.append(tag), results.put((tag, value, result, error))),
            priority=priority,
        )

    flood = 8  # default level 2: one executes (300 ms), one may wait, the rest overflow the queue
    for i in range(flood):
        send(f"low{i}", i)
    for i in range(2):  # level 1 has its own queue (size 8)
        send(f"high{i}", 100 + i, priority=1)
    got = _collect(results, flood + 2, 30, s, "responses")

    ok = {tag: int(r.as_numpy("OUTPUT")[0, 0]) for tag, _v, r, e in got if e is None}
    rejected = {tag: str(e) for tag, _v, _r, e in got if e is not None}
    assert rejected, s.why(f"{flood} concurrent level-2 requests against a queue of 1: none rejected ({ok})")
    assert all("queue" in msg.lower() for msg in rejected.values()), s.why(f"rejected for other reasons: {rejected}")
    assert all(tag.startswith("low") for tag in rejected), s.why(f"high-priority requests rejected: {rejected}")
    low_ok = [t for t in ok if t.startswith("low")]
    assert 1 <= len(low_ok) <= 2, s.why(f"expected 1 executing + at most 1 queued level-2 request to succeed: {ok}")
    assert ok.get("high0") == 100 and ok.get("high1") == 101, s.why(f"level-1 requests should succeed: {ok}")
    # a level-2 request that waited in the queue is overtaken by the later level-1 requests
    if len(low_ok) == 2:
        waited = low_ok[-1]
        assert done_order.index("high0") < done_order.index(waited) and done_order.index("high1") < done_order.index(
            waited
        ), s.why(f"level-1 requests did not overtake the queued level-2 request: completion order {done_order}")
    print(f"priority queue: {len(rejected)} rejected ({next(iter(rejected.values()))!r}), "
          f"succeeded in order {[t for t in done_order if t in ok]}")


# ---------------------------------------------------------------- 6. ensemble


@pytest.fixture(scope="module")
def ensemble(pool: ServerPool, tmp_path_factory: pytest.TempPathFactory) -> Served:
    return pool.serve_example("sentiment-ensemble.yaml", tmp_path_factory.mktemp("ensemble"))


def test_sentiment_ensemble_end_to_end(ensemble: Served) -> None:
    s = ensemble
    assert s.client.get_model_config("sentiment").config.platform == "ensemble", s.why("sentiment is not an ensemble")
    # Triton needs the ensemble's version directory even though it holds no files of its own
    assert any(f.startswith("sentiment/1/") for f in s.rendered["sentiment"].files), s.rendered["sentiment"].files
    texts = {
        "This is great, really good!": "positive",
        "bad and awful": "negative",
        "I love it, the best": "positive",
        "The worst. Terrible, boring film.": "negative",
        "a table and a chair": "neutral",
    }
    batch = np.array([[t.encode()] for t in texts], dtype=object)  # [5, 1] BYTES
    res = s.client.infer("sentiment", [tensor("TEXT", batch)])
    labels = [x.decode() for x in res.as_numpy("LABEL").reshape(-1)]
    scores = res.as_numpy("SCORE").reshape(-1)
    assert labels == list(texts.values()), s.why(f"labels {dict(zip(texts, labels, strict=True))}, scores {scores}")
    assert scores[0] > 0 > scores[1], s.why(f"scores do not match the labels: {scores}")
    single = s.client.infer("sentiment", [tensor("TEXT", np.array([[b"great good"]], dtype=object))])
    assert single.as_numpy("LABEL")[0, 0] == b"positive", s.why(f"'great good' -> {single.as_numpy('LABEL')}")
    # the steps really ran, behind the one call
    for step in ("tokenizer", "classifier"):
        st = s.wait_for(f"{step} statistics", lambda step=step: (x := s.stats(step)).inference_count >= 2 and x)
        assert st.execution_count >= 1, s.why(f"step {step} never executed: {st}")
    print(f"ensemble: {dict(zip(texts, zip(labels, scores.round(2).tolist(), strict=True), strict=True))}")


# ---------------------------------------------------------------- 7. sequence batching


@pytest.fixture(scope="module")
def sequence(pool: ServerPool, tmp_path_factory: pytest.TempPathFactory) -> Served:
    return pool.serve_example("sequence-accumulator.yaml", tmp_path_factory.mktemp("seq"))


def test_sequence_batcher_keeps_state_per_correlation_id(sequence: Served) -> None:
    s = sequence

    def send(seq_id: int, value: int, start: bool = False, end: bool = False) -> int:
        res = s.client.infer(
            "sequence-accumulator",
            [tensor("VALUE", np.array([[value]], dtype=np.int32))],
            sequence_id=seq_id,
            sequence_start=start,
            sequence_end=end,
        )
        return int(res.as_numpy("SUM")[0, 0])

    a, b = 1001, 2002
    sums = {a: [], b: []}
    sums[a].append(send(a, 1, start=True))
    sums[b].append(send(b, 10, start=True))  # interleaved: a second, independent sequence
    sums[a].append(send(a, 2))
    sums[b].append(send(b, 20, end=True))
    sums[a].append(send(a, 3, end=True))
    assert sums[a] == [1, 3, 6], s.why(f"sequence {a} sent 1, 2, 3; running sums {sums[a]}")
    assert sums[b] == [10, 30], s.why(f"sequence {b} sent 10, 20; running sums {sums[b]}")
    # a new sequence reusing a's correlation id starts from zero
    assert send(a, 7, start=True, end=True) == 7, s.why("a restarted sequence kept old state")

    # without a started sequence the batcher refuses the request (no state to attach it to)
    with pytest.raises(InferenceServerException) as exc:
        send(3003, 5)
    assert "sequence" in str(exc.value).lower(), s.why(f"unexpected error for a request outside a sequence: {exc.value}")


# ---------------------------------------------------------------- 8. non-batching


@pytest.fixture(scope="module")
def non_batching(pool: ServerPool, tmp_path_factory: pytest.TempPathFactory) -> Served:
    return pool.serve_example("non-batching.yaml", tmp_path_factory.mktemp("nb"))


def test_non_batching_model_renders_zero_and_serves_unbatched_shapes(non_batching: Served) -> None:
    s = non_batching
    text = s.rendered["non-batching"].config_pbtxt
    assert "\nmax_batch_size: 0\n" in text, f"config.pbtxt must say max_batch_size: 0 explicitly:\n{text}"
    on_disk = (s.server.model_repository / "non-batching" / "config.pbtxt").read_text()
    assert on_disk == text
    loaded = s.client.get_model_config("non-batching").config
    assert loaded.max_batch_size == 0 and list(loaded.input[0].dims) == [2, 3], s.why(f"loaded config: {loaded}")

    m = np.arange(6, dtype=np.float32).reshape(2, 3)  # the full request shape: no batch dimension
    res = s.client.infer("non-batching", [tensor("MATRIX", m)])
    np.testing.assert_array_equal(res.as_numpy("TRANSPOSED"), m.T)
    np.testing.assert_array_equal(res.as_numpy("ROW_SUMS"), m.sum(axis=1))
    assert list(res.as_numpy("TRANSPOSED").shape) == [3, 2]

    with pytest.raises(InferenceServerException) as exc:  # a batched shape is not the model's shape
        s.client.infer("non-batching", [tensor("MATRIX", m[None])])
    assert "shape" in str(exc.value).lower(), s.why(f"a [1, 2, 3] request failed for another reason: {exc.value}")


# ---------------------------------------------------------------- every example


@pytest.mark.parametrize("example", EXAMPLE_FILES)
def test_example_passes_operator_checks(example: str) -> None:
    models = load_models(EXAMPLES / example)  # schema + every rule, as `triton-operator validate` runs them
    assert all(m.spec.instance_groups or m.spec.is_ensemble for m in models), f"{example}: set CPU instanceGroups"
    assert all(g.kind == "CPU" for m in models for g in m.spec.instance_groups or ()), f"{example}: CPU only"


def test_all_examples_load_in_one_server(pool: ServerPool, tmp_path: Path) -> None:
    assert len(EXAMPLE_FILES) >= 9, f"examples missing: {EXAMPLE_FILES}"
    # Every file together (names must not clash); examples/sources/ fetch their files from S3 and a PVC at pod
    # start, which is proven on the real node (e2e/test_sources.py), not in a bare tritonserver.
    models = [m for f in EXAMPLE_FILES for m in load_models(EXAMPLES / f)]
    s = pool.serve(models, tmp_path / "all")  # explicit mode; each model loaded, asserted READY
    index = {m.name: m for m in s.client.get_model_repository_index().models}
    expected = sorted(r.name for r in s.rendered.values())
    assert sorted(index) == expected, s.why(f"repository index {sorted(index)} != rendered {expected}")
    not_ready = {n: (m.state, m.reason) for n, m in index.items() if m.state != "READY"}
    assert not not_ready, s.why(f"models not READY: {not_ready}")
    for name in expected:
        assert s.client.is_model_ready(name), s.why(f"{name} is not ready")
    print(f"all examples: {len(expected)} models READY in one server: {expected}")
