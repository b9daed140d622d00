"""YAML as people write it, read strictly: the TritonModel files the CLI reads, and the operator's kubeconfig.

PyYAML's safe loader takes a key given twice silently (the last one wins), recurses once per level of nesting (a
document nested a few thousand levels deep ends in a RecursionError), expands aliases without limit (and builds
structures that hold themselves), and turns an unquoted date into a datetime, which no JSON, and so no Kubernetes
object, holds. `load_all` and `load` refuse a duplicate key, nesting deeper than MAX_DEPTH and a document whose
aliases expand past MAX_NODES nodes or into itself, each as a `yaml.YAMLError` with the line and column (which
`validate.yaml_problem` says in one line), and keep a timestamp as the string it was written as, as the API server's
own YAML reading does. Tags that make no JSON (`!!binary`, `!!set`, `!!omap`, `!!pairs`) are refused.
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.composer import ComposerError
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode, Node, SequenceNode

#: Levels of nesting a document may have, aliases expanded. A TritonModel's deepest field (an affinity's
#: `...matchExpressions[].values[]`) is about 10 levels down; a kubeconfig's, 5.
MAX_DEPTH = 100
#: Nodes a document may expand to through its aliases (it has at most that many without them).
MAX_NODES = 100_000

_MERGE = "tag:yaml.org,2002:merge"
_TIMESTAMP = "tag:yaml.org,2002:timestamp"
_NOT_JSON = ("tag:yaml.org,2002:binary", "tag:yaml.org,2002:set", "tag:yaml.org,2002:omap", "tag:yaml.org,2002:pairs")


class StrictLoader(yaml.SafeLoader):
    """The safe loader, refusing duplicate keys, deep nesting and alias bombs; timestamps stay strings."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
                raise ComposerError(None, None, f"nested more than {MAX_DEPTH} levels deep", mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def compose_document(self) -> Node | None:
        node = super().compose_document()
        if node is not None:
            _check_expansion(node)
        return node

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, MappingNode):
            first: dict[Any, Node] = {}
            for key_node, _ in node.value:
                if key_node.tag == _MERGE:
                    continue  # `<<: *base`: the keys given here override the merged ones, as YAML means them to
                key = self.construct_object(key_node, deep=True)
                try:
                    seen = first.setdefault(key, key_node)
                except TypeError:
                    continue  # an unhashable key: the safe loader refuses it itself
                if seen is not key_node:
                    raise ConstructorError(
                        "while constructing a mapping", node.start_mark,
                        f"found duplicate key {key!r} (first at line {seen.start_mark.line + 1})", key_node.start_mark)
        return super().construct_mapping(node, deep)


def _as_written(loader: StrictLoader, node: Node) -> Any:
    return loader.construct_yaml_str(node)


def _refuse(loader: StrictLoader, node: Node) -> Any:
    raise ConstructorError(None, None, f"{node.tag} makes no JSON value, so no Kubernetes object holds it", node.start_mark)


StrictLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != _TIMESTAMP]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
StrictLoader.add_constructor(_TIMESTAMP, _as_written)
for _tag in _NOT_JSON:
    StrictLoader.add_constructor(_tag, _refuse)


def _children(node: Node) -> list[Node]:
    if isinstance(node, MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, SequenceNode):
        return list(node.value)
    return []


def _check_expansion(root: Node) -> None:
    """Refuses a document whose aliases expand deeper than MAX_DEPTH, past MAX_NODES nodes, or into themselves.

    Iterative, over the node graph with each node once: an alias is the node it names, so the graph is what the
    document becomes once expanded, without expanding it."""
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, finished = stack.pop()
        key = id(node)
        if finished:
            on_path.discard(key)
            kids = _children(node)
            size[key] = 1 + sum(size[id(k)] for k in kids)
            depth[key] = 1 + max((depth[id(k)] for k in kids), default=0)
            if depth[key] > MAX_DEPTH:
                raise ComposerError(None, None, f"its aliases expand it more than {MAX_DEPTH} levels deep",
                                    node.start_mark)
            if size[key] > MAX_NODES:
                raise ComposerError(None, None, f"its aliases expand it to more than {MAX_NODES} values",
                                    node.start_mark)
            continue
        if key in size:
            continue
        if key in on_path:
            raise ComposerError(None, None, "an alias names a node that holds it (a structure that holds itself)",
                                node.start_mark)
        on_path.add(key)
        stack.append((node, True))
        stack.extend((k, False) for k in _children(node))


def load_all(text: str) -> list[Any]:
    """Every document of `text` (None for an empty one); a `yaml.YAMLError` says where the first problem is."""
    return list(yaml.load_all(text, Loader=StrictLoader))


def load(text: str) -> Any:
    """The one document of `text`."""
    return yaml.load(text, Loader=StrictLoader)  # noqa: S506 - StrictLoader is a SafeLoader
