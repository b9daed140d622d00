"""The operator's log lines as JSON (`triton-operator run --log-format json`): one object per line, for log pipelines
that index fields rather than parse text.

The format is kopf's own (`kopf.configure(log_format=LogFormat.JSON)`, python-json-logger underneath): kopf's
per-object records carry the object's reference, and it writes that reference under `object`. The operator's own
records name their object in the message instead, as Kubernetes' log style asks (`Applied Deployment
namespace=team-a name=add-sub`, `Healed replica pod=team-a/add-sub-5f9c-x2`); `ObjectFields` reads those pairs back
into the same reference, so every record about one object, kopf's or ours, carries `object.namespace` and
`object.name`.
"""

from __future__ import annotations

import logging
import re

import kopf

_NAMESPACE = re.compile(r"\bnamespace=(?P<namespace>[a-z0-9][-a-z0-9]*)(?=[\s,;]|$)")
#: The key that names the object after `namespace=`, first found first, with the kind it implies.
_NAME = re.compile(r"\b(?P<key>name|pool|model|pod)=(?P<name>[a-z0-9][-.a-z0-9]*)(?=[\s,;]|$)")
_KINDS = {"pool": "TritonPool", "model": "TritonModel", "pod": "Pod"}
_POD = re.compile(r"\bpod=(?P<namespace>[a-z0-9][-a-z0-9]*)/(?P<name>[a-z0-9][-.a-z0-9]*)")


class ObjectFields(logging.Filter):
    """Gives a record that names its object in key=value pairs the reference kopf's records carry (`k8s_ref`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "k8s_ref"):
            ref = object_of(record.getMessage())
            if ref is not None:
                record.k8s_ref = ref
        return True


def object_of(message: str) -> dict[str, str] | None:
    """The object a log message names: `namespace=NS name=N` (or `pool=`, `model=`, `pod=` for `name=`), or
    `pod=NS/N`; None when it names none."""
    pod = _POD.search(message)
    if pod:
        return {"kind": "Pod", "namespace": pod["namespace"], "name": pod["name"]}
    namespace = _NAMESPACE.search(message)
    if namespace is None:
        return None
    name = _NAME.search(message, namespace.end())
    if name is None:
        return {"namespace": namespace["namespace"]}
    kind = _KINDS.get(name["key"])
    ref = {"namespace": namespace["namespace"], "name": name["name"]}
    return ref if kind is None else {"kind": kind, **ref}


def log_as_json(level: int) -> None:
    """Every record of the process, to stderr, as one JSON object a line (kopf's format), at `level`."""
    kopf.configure(log_format=kopf.LogFormat.JSON)
    # kopf.configure also mutes the asyncio logger; the text format does not, and neither should this one.
    quiet = logging.getLogger("asyncio")
    quiet.handlers.clear()
    quiet.propagate = True
    root = logging.getLogger()
    for handler in root.handlers:
        handler.addFilter(ObjectFields())
    root.setLevel(level)
