"""The ensemble step graph, walked in one place: who a model's steps are, what they reach, who uses a model,
in which order to render, and the cycles.

Nodes are TritonModel names (metadata.name); an edge goes from an ensemble to each of its step models.
A graph is given as a function `steps(name)`: the step names of `name`, or None when no such model exists.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from .v1alpha1 import TritonModel

Steps = Callable[[str], "Iterable[str] | None"]


def steps_of(body: Mapping[str, Any] | None) -> list[str]:
    """Names of the TritonModels an object's ensemble steps use, as written (an unparsed, even invalid, body)."""
    spec = (body or {}).get("spec") or {}
    ensemble = spec.get("ensemble") if isinstance(spec, Mapping) else None
    steps = ensemble.get("steps") if isinstance(ensemble, Mapping) else None
    return [s["model"] for s in steps or () if isinstance(s, Mapping) and isinstance(s.get("model"), str)]


def of_bodies(bodies: Mapping[str, Mapping[str, Any]]) -> Steps:
    """The graph of raw TritonModel bodies by name."""
    return lambda name: steps_of(bodies[name]) if name in bodies else None


def of_models(models: Mapping[str, TritonModel], *, ensembles_only: bool = False) -> Steps:
    """The graph of parsed TritonModels by name (with `ensembles_only`, only `platform: ensemble` has steps)."""
    def graph(name: str) -> list[str] | None:
        m = models.get(name)
        if m is None:
            return None
        if m.spec.ensemble is None or (ensembles_only and not m.spec.is_ensemble):
            return []
        return [s.model for s in m.spec.ensemble.steps]

    return graph


def closure(start: str | Iterable[str], steps: Steps) -> tuple[list[str], list[str]]:
    """Every model reachable from `start` (included) through steps, sorted; and the step names that do not exist."""
    todo = [start] if isinstance(start, str) else list(start)
    seen: set[str] = set()
    missing: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen or name in missing:
            continue
        following = steps(name)
        if following is None:
            missing.add(name)
            continue
        seen.add(name)
        todo.extend(following)
    return sorted(seen), sorted(missing)


def dependents(name: str, bodies: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The ensembles among `bodies` one of whose steps is `name` (direct users), sorted."""
    return sorted(other for other, body in bodies.items() if name in steps_of(body))


def users(name: str, bodies: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The models among `bodies` whose steps reach `name`, directly or through other ensembles, sorted: every
    ensemble whose replicas load `name` (`name` itself is left out, also in a cycle)."""
    used_by: dict[str, set[str]] = {}
    for other, body in bodies.items():
        spec = body.get("spec")
        if not isinstance(spec, Mapping) or not spec.get("ensemble"):
            continue  # the common case, kept cheap: it runs over the namespace on every reconcile
        for step in steps_of(body):
            used_by.setdefault(step, set()).add(other)
    # The same walk as a model's steps, over the graph turned around (user -> users of it).
    reached, _ = closure(used_by.get(name, ()), lambda n: used_by.get(n, ()))
    return [user for user in reached if user != name]


def order(names: Sequence[str], steps: Steps) -> list[str]:
    """`names` with every model after the steps it uses (among `names`); a cycle is broken where it closes."""
    known = set(names)
    out: list[str] = []
    done: set[str] = set()

    def visit(name: str, stack: tuple[str, ...]) -> None:
        if name in done:
            return
        for step in steps(name) or ():
            if step in known and step not in stack:
                visit(step, (*stack, name))
        if name not in done:
            done.add(name)
            out.append(name)

    for name in names:
        visit(name, ())
    return out


def cycles(names: Iterable[str], steps: Steps) -> Iterator[tuple[str, list[str]]]:
    """Each model of `names` that reaches itself through steps of two or more models, with one such path."""
    for start in names:
        stack = [(start, [start])]
        seen: set[str] = set()
        while stack:
            node, path = stack.pop()
            found = False
            for step in steps(node) or ():
                if step == start:
                    if len(path) > 1:
                        yield start, [*path, start]
                    found = True
                    break
                if step not in seen and steps(step) is not None:
                    seen.add(step)
                    stack.append((step, [*path, step]))
            if found:
                break
