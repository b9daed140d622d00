"""The API server's answers that are errors, as the operator's client (`platform.kube`) raises them.

What a failed call means for a reconcile (retry soon, back off, tell the user) is decided in `controller.errors`.
"""

from __future__ import annotations


class ApiError(Exception):
    """An answer of the API server that is an error: its HTTP status, reason and body (status 0: no answer)."""

    def __init__(self, status: int = 0, reason: str = "", body: str | bytes | None = None) -> None:
        super().__init__(status, reason)
        self.status, self.reason, self.body = status, reason, body

    def __str__(self) -> str:
        return f"({self.status}) {self.reason}" + (f": {self.body!r}"[:400] if self.body else "")


class ApiCallError(ApiError):
    """A call the API server answered with an error: what was asked (verb, kind, object) and what it said."""

    def __init__(self, verb: str, kind: str, namespace: str | None, name: str | None, status: int, reason: str,
                 message: str) -> None:
        super().__init__(status=status, reason=reason)
        self.verb, self.kind, self.namespace, self.name, self.message = verb, kind, namespace, name, message

    def __str__(self) -> str:
        return f"{self.verb} {self.kind} {self.namespace}/{self.name}: {self.status} {self.reason}: {self.message}"
