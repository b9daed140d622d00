"""Placing pooled models on a pool's replicas (`plan.placement`, issue 29): best fit, distinct replicas per copy,
node spread, an ensemble with its steps, stickiness, and the figures of a shortfall; the two strategies (issue 41
item 4): Spread over a fixed pool's replicas, Pack (best fit) where the pool autoscales, and which a pool gets unless
it says; then properties over random pools, models and histories (hypothesis), under both strategies: never over
capacity, copies distinct, closures together, previous copies kept when they still fit, and a shortfall only where
no replica could take the copy."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.documents import pool_document
from triton_operator.api.pool import PlacementStrategy, TritonPool
from triton_operator.api.v1alpha1 import API_VERSION, TritonModel
from triton_operator.plan.placement import (
    Demand,
    Placement,
    PoolReplica,
    format_bytes,
    place,
    place_demands,
    replica_status,
)

GI = 1 << 30
MI = 1 << 20
STRATEGIES: tuple[PlacementStrategy, ...] = ("Spread", "Pack")


def replicas(*nodes: str | None) -> list[PoolReplica]:
    return [PoolReplica(f"r{i}", node) for i, node in enumerate(nodes)]


def one(name: str, gib: int, copies: int = 1) -> Demand:
    return Demand(name, copies, {name: gib * GI})


def test_best_fit_puts_a_copy_where_it_leaves_the_least_room() -> None:
    got = place_demands(10 * GI, replicas("n0", "n0"), [one("big", 7), one("small", 2)], {})
    assert got.copies["big"] == ("r0",)
    assert got.copies["small"] == ("r0",), "r0 has 3Gi left, r1 10Gi: the tighter fit"
    assert got.used == {"r0": 9 * GI, "r1": 0}


def test_copies_go_on_distinct_replicas_spread_across_nodes() -> None:
    got = place_demands(10 * GI, replicas("n0", "n0", "n1"), [one("m", 1, copies=2)], {})
    (first, second) = got.copies["m"]
    assert first != second
    assert {first, second} & {"r2"}, f"one copy on each node: {got.copies}"


def test_more_copies_than_replicas_is_a_shortfall_saying_so() -> None:
    got = place_demands(10 * GI, replicas("n0", "n1"), [one("m", 1, copies=3)], {})
    assert len(got.copies["m"]) == 2
    short = got.shortfalls["m"]
    assert (short.wanted, short.placed, short.replicas) == (3, 2, 2)
    assert "distinct replicas, and the pool has 2" in short.message


def test_a_model_larger_than_any_room_left_reports_the_figures() -> None:
    got = place_demands(4 * GI, replicas("n0", "n1"), [one("a", 3), one("b", 3), one("c", 2)], {})
    assert got.copies["c"] == ()
    short = got.shortfalls["c"]
    assert (short.needed, short.largest_free) == (2 * GI, 1 * GI)
    assert "a copy needs 2Gi, and the most any replica without one has free is 1Gi" in short.message


def test_an_ensemble_loads_its_steps_with_it_and_a_shared_step_counts_once() -> None:
    ens = Demand("ens", 1, {"ens": 0, "pre": 1 * GI, "net": 3 * GI})
    pre = Demand("pre", 1, {"pre": 1 * GI})
    got = place_demands(5 * GI, replicas("n0", "n1"), [ens, pre], {})
    (where,) = got.copies["ens"]
    assert {"ens", "pre", "net"} <= got.loaded[where]
    assert got.copies["pre"] == (where,), "the step's own copy joins the replica that loads it already: no new bytes"
    assert got.used[where] == 4 * GI


def test_a_placed_copy_stays_where_it_is() -> None:
    """Best fit alone would put m on r1 (the tighter fit); the recorded copy on r0 stays."""
    got = place_demands(10 * GI, replicas("n0", "n1"), [one("m", 2), one("other", 7)], {"m": ["r0"], "other": ["r1"]})
    assert got.copies == {"m": ("r0",), "other": ("r1",)}


def test_a_copy_on_a_replica_that_is_gone_is_placed_again_and_the_rest_stay() -> None:
    previous = {"m": ["r0", "gone"], "n": ["r1"]}
    got = place_demands(10 * GI, replicas("n0", "n1"), [one("m", 1, copies=2), one("n", 1)], previous)
    assert got.copies["m"] == ("r0", "r1") and got.copies["n"] == ("r1",)


def test_fewer_copies_drop_the_ones_placed_last() -> None:
    got = place_demands(10 * GI, replicas("n0", "n1", "n2"), [one("m", 1, copies=1)], {"m": ["r2", "r0", "r1"]})
    assert got.copies["m"] == ("r2",)


def test_a_recorded_copy_that_no_longer_fits_is_placed_again() -> None:
    """The pool's capacity went down under what r0 held (the webhook refuses it, but a forced change happens)."""
    got = place_demands(3 * GI, replicas("n0", "n1"), [one("a", 2), one("b", 2)], {"a": ["r0"], "b": ["r0"]})
    assert got.copies == {"a": ("r0",), "b": ("r1",)}


def test_spread_shares_small_models_among_a_fixed_pools_replicas_and_pack_fills_one() -> None:
    """Issue 41: six models of 64Mi on a fixed pool of three 1Gi replicas all went on one replica."""
    small = [Demand(f"m{i}", 1, {f"m{i}": 64 * MI}) for i in range(6)]
    spread = place_demands(GI, replicas("n0", "n0", "n0"), small, {}, "Spread")
    assert sorted(len(models) for models in spread.loaded.values()) == [2, 2, 2], spread.copies
    assert sorted(spread.used.values()) == [128 * MI] * 3
    pack = place_demands(GI, replicas("n0", "n0", "n0"), small, {}, "Pack")
    assert pack.used == {"r0": 6 * 64 * MI, "r1": 0, "r2": 0}, pack.copies
    assert place_demands(GI, replicas("n0", "n0", "n0"), small, {}) == pack, "Pack unless told"


def test_spread_goes_to_the_replica_with_fewest_models_then_the_least_used() -> None:
    """r0 holds one large model, r1 two small ones: fewest models wins over most room (r1 has less used)."""
    previous = {"big": ["r0"], "s1": ["r1"], "s2": ["r1"]}
    base = [one("big", 6), Demand("s1", 1, {"s1": 1 * GI}), Demand("s2", 1, {"s2": 1 * GI})]
    got = place_demands(10 * GI, replicas("n0", "n0"), [*base, one("new", 1)], previous, "Spread")
    assert got.copies["new"] == ("r0",), "r0 loads one model, r1 two"
    previous = {"a": ["r0"], "b": ["r1"]}
    got = place_demands(10 * GI, replicas("n0", "n0"), [one("a", 3), one("b", 1), one("new", 1)], previous, "Spread")
    assert got.copies["new"] == ("r1",), "one model each: the least used"
    packed = place_demands(10 * GI, replicas("n0", "n0"), [one("a", 3), one("b", 1), one("new", 1)], previous, "Pack")
    assert packed.copies["new"] == ("r0",), "best fit: the least room left"


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_replica_that_loads_a_step_already_is_preferred_under_either_strategy(strategy: PlacementStrategy) -> None:
    """Fewest new bytes comes before the strategy: r0 has the step (and more models), and adding the ensemble there
    costs nothing new."""
    ens = Demand("ens", 1, {"ens": 0, "step": 1 * GI})
    got = place_demands(10 * GI, replicas("n0", "n0"), [one("step", 1), one("x", 1), ens],
                        {"step": ["r0"], "x": ["r0"]}, strategy)
    assert got.copies["ens"] == ("r0",)
    assert got.used["r0"] == 2 * GI


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_node_spread_comes_first_under_either_strategy(strategy: PlacementStrategy) -> None:
    """m's first copy is on r0 (node n0); its second goes to n1, although r1 (n0) is empty and r2 (n1) is full."""
    previous = {"m": ["r0"], "full": ["r2"], "x": ["r2"]}
    demands = [one("m", 1, copies=2), one("full", 5), one("x", 1)]
    got = place_demands(8 * GI, replicas("n0", "n0", "n1"), demands, previous, strategy)
    assert got.copies["m"] == ("r0", "r2")


@pytest.mark.parametrize(("spec", "strategy"), [
    ({}, "Spread"),
    ({"autoscaling": {"maxReplicas": 4}}, "Pack"),
    ({"placement": {"strategy": "Pack"}}, "Pack"),
    ({"placement": {}}, "Spread"),
    ({"autoscaling": {"maxReplicas": 4}, "placement": {"strategy": "Spread"}}, "Spread"),
], ids=["fixed", "autoscaling", "fixed-pack", "fixed-unset", "autoscaling-spread"])
def test_a_pool_spreads_while_its_size_is_fixed_packs_while_it_autoscales_unless_it_says(
        spec: dict[str, Any], strategy: PlacementStrategy) -> None:
    pool = TritonPool.model_validate(pool_document("p", replicas=3, capacity={"memoryPerReplica": "1Gi"}, **spec))
    assert pool.spec.placement_strategy == strategy
    models = [_model(f"m{i}", pool="p", memory="64Mi") for i in range(6)]
    got = place(pool, replicas("n0", "n0", "n0"), models, {})
    assert sorted(len(m) for m in got.loaded.values()) == ([2, 2, 2] if strategy == "Spread" else [0, 0, 6])


def test_an_unknown_strategy_is_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match=r"placement\.strategy\n.*'Spread' or 'Pack'"):
        TritonPool.model_validate(pool_document("p", placement={"strategy": "Balanced"}))


def test_bytes_are_shown_as_quantities() -> None:
    assert [format_bytes(n) for n in (0, 100, 1536 << 20, 2 * GI, 1 << 40)] == ["0", "100", "1536Mi", "2Gi", "1Ti"]


def _model(name: str, **spec: Any) -> TritonModel:
    return TritonModel.model_validate({
        "apiVersion": API_VERSION, "kind": "TritonModel", "metadata": {"name": name},
        "spec": {"backend": "python", "source": {"inline": {"model.py": "#"}}, **spec}})


def test_place_reads_the_pool_and_the_models() -> None:
    pool = TritonPool.model_validate({"apiVersion": API_VERSION, "kind": "TritonPool", "metadata": {"name": "p"},
                                      "spec": {"replicas": 2, "capacity": {"memoryPerReplica": "4Gi"}}})
    ensemble = TritonModel.model_validate({
        "apiVersion": API_VERSION, "kind": "TritonModel", "metadata": {"name": "ens"},
        "spec": {"platform": "ensemble", "pool": "p", "replicas": 2, "ensemble": {"steps": [
            {"model": "step", "inputMap": {"I": "I"}, "outputMap": {"O": "O"}}]}}})
    models = [ensemble, _model("step", pool="p", memory="1Gi", replicas=0), _model("mine", pool="p", memory="3Gi"),
              _model("elsewhere", pool="q", memory="1Gi"), _model("own")]
    got = place(pool, replicas("n0", "n1"), models, {})
    assert set(got.copies) == {"ens", "mine", "step"}
    assert len(got.copies["ens"]) == 2 and got.copies["step"] == ()
    assert sorted(got.used.values()) == [1 * GI, 4 * GI]
    status = replica_status(got, replicas("n0", "n1"))
    assert {s["used"] for s in status} == {"1Gi", "4Gi"} and all(s["node"] for s in status)


# ---------------------------------------------------------------- properties


@st.composite
def worlds(draw: st.DrawFn) -> tuple[int, list[PoolReplica], list[Demand]]:
    capacity = draw(st.integers(1, 16)) * GI
    nodes = draw(st.integers(1, 3))
    pool = [PoolReplica(f"r{i}", draw(st.sampled_from([f"n{j}" for j in range(nodes)] + [None])))
            for i in range(draw(st.integers(0, 6)))]
    sizes = {f"s{i}": draw(st.integers(0, 6)) * GI for i in range(draw(st.integers(0, 4)))}
    demands = []
    for i in range(draw(st.integers(0, 8))):
        name = f"m{i}"
        steps = draw(st.lists(st.sampled_from(sorted(sizes)), unique=True)) if sizes else []
        demands.append(Demand(name, draw(st.integers(0, 4)),
                              {name: draw(st.integers(0, 8)) * GI, **{s: sizes[s] for s in steps}}))
    demands.extend(Demand(s, draw(st.integers(0, 2)), {s: size}) for s, size in sizes.items())
    return capacity, pool, demands


def _check_invariants(got: Placement, pool: list[PoolReplica], demands: list[Demand]) -> None:
    names = {r.name for r in pool}
    size = {m: b for d in demands for m, b in d.closure.items()}
    for replica, used in got.used.items():
        assert used <= got.capacity, f"{replica} over capacity: {used} > {got.capacity}"
        assert used == sum(size[m] for m in got.loaded[replica]), f"{replica}: used is not what it loads"
    for d in demands:
        where = got.copies[d.name]
        assert len(set(where)) == len(where) <= d.copies, f"{d.name}: copies not distinct or too many: {where}"
        assert set(where) <= names
        for replica in where:
            assert set(d.closure) <= got.loaded[replica], f"{d.name}'s closure is not all on {replica}"
        if len(where) < d.copies:
            short = got.shortfalls[d.name]
            assert short.placed == len(where)
            for r in names - set(where):  # a shortfall is real: no replica without a copy had the room
                missing = sum(b for m, b in d.closure.items() if m not in got.loaded[r])
                assert got.used[r] + missing > got.capacity, f"{d.name} would fit on {r}: {got}"
        else:
            assert d.name not in got.shortfalls


_SETTINGS = settings(max_examples=300, deadline=None, derandomize=True, database=None,
                     suppress_health_check=list(HealthCheck))


@pytest.mark.parametrize("strategy", STRATEGIES)
@_SETTINGS
@given(world=worlds())
def test_every_placement_holds_its_invariants_and_placing_again_changes_nothing(
        strategy: PlacementStrategy, world: tuple[int, list[PoolReplica], list[Demand]]) -> None:
    capacity, pool, demands = world
    first = place_demands(capacity, pool, demands, {}, strategy)
    _check_invariants(first, pool, demands)
    again = place_demands(capacity, pool, demands, {k: list(v) for k, v in first.copies.items()}, strategy)
    assert again.copies == first.copies, "a placement read back from the statuses is kept as it is"
    other = "Pack" if strategy == "Spread" else "Spread"
    switched = place_demands(capacity, pool, demands, {k: list(v) for k, v in first.copies.items()}, other)
    assert switched.copies == first.copies, "a change of strategy moves no copy that is placed"


@pytest.mark.parametrize("strategy", STRATEGIES)
@_SETTINGS
@given(world=worlds(), lost=st.sets(st.integers(0, 5)), more=st.integers(0, 2), shrink=st.booleans(), data=st.data())
def test_copies_whose_replica_is_left_are_kept_after_replicas_go_and_come(
        strategy: PlacementStrategy, world: tuple[int, list[PoolReplica], list[Demand]], lost: set[int], more: int,
        shrink: bool, data: st.DataObject) -> None:
    """Replicas die (a node is lost) and new ones come; copies change; the capacity may fall (what the webhook
    refuses, forced): the invariants hold, and with the capacity as it was every copy still wanted on a replica that
    is still there stays where it was."""
    capacity, pool, demands = world
    before = place_demands(capacity, pool, demands, {}, strategy)
    left = [r for i, r in enumerate(pool) if i not in lost] + [PoolReplica(f"new{i}", "n9") for i in range(more)]
    changed = [Demand(d.name, data.draw(st.integers(max(0, d.copies - 1), d.copies + 1)), d.closure) for d in demands]
    after_capacity = max(GI, capacity // 2) if shrink else capacity
    after = place_demands(after_capacity, left, changed, {k: list(v) for k, v in before.copies.items()}, strategy)
    _check_invariants(after, left, changed)
    if shrink:
        return
    names = {r.name for r in left}
    for d in changed:
        kept = [r for r in before.copies[d.name] if r in names][:d.copies]
        assert after.copies[d.name][:len(kept)] == tuple(kept), f"{d.name} moved: {before.copies[d.name]} -> " \
            f"{after.copies[d.name]} (replicas left: {sorted(names)})"
