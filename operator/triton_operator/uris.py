"""How a source's URI is shown: never with what may be a credential in it.

A presigned URL carries its signature in the query (`?X-Amz-Signature=...`, `?sig=...`), and `user:password@`
in the authority is a password. `shown(uri)` is the one form of a URI that fetch's logs and errors, the
TritonModel's status and the CLI print: userinfo, query and fragment replaced by `<redacted>`. `redact(text)` does
the same to every URI inside a free text (a termination message, a library's exception). Standalone (no import
from the package): the `fetch` init step and every layer use it.
"""

from __future__ import annotations

import re

REDACTED = "<redacted>"

#: A URI in free text: a scheme, `://`, then anything up to a space, a quote or a bracket.
_URI = re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>()\[\]{}]+")
#: Punctuation that ends a sentence or a `uri: message` rather than the URI itself.
_TRAILING = ".,:;!"


def has_userinfo(uri: str) -> bool:
    """Whether the URI's authority (between `://` and the first `/`, `?` or `#`) carries `user[:password]@`."""
    _, sep, rest = uri.partition("://")
    return bool(sep) and "@" in re.split(r"[/?#]", rest, maxsplit=1)[0]


def shown(uri: str) -> str:
    """`uri` with its userinfo, query and fragment (if any) replaced by `<redacted>`."""
    scheme, sep, rest = uri.partition("://")
    if not sep:
        return uri
    end = next((i for i, c in enumerate(rest) if c in "/?#"), len(rest))
    authority, tail = rest[:end], rest[end:]
    if "@" in authority:
        authority = f"{REDACTED}@{authority.rsplit('@', 1)[1]}"
    cut = next((i for i, c in enumerate(tail) if c in "?#"), len(tail))
    path, extra = tail[:cut], tail[cut:]
    if len(extra) > 1:  # a bare `?` or `#` hides nothing
        extra = f"{extra[0]}{REDACTED}"
    return f"{scheme}://{authority}{path}{extra}"


def _one(match: re.Match[str]) -> str:
    text = match.group(0)
    core = text.rstrip(_TRAILING)
    return shown(core) + text[len(core):]


def redact(text: str) -> str:
    """`text` with every URI in it shown as `shown` shows it."""
    return _URI.sub(_one, text)


def pvc_claim(uri: str) -> str:
    """The PersistentVolumeClaim a `pvc://<claim>/<path>` uri names (what the `fetch` step mounts read-only)."""
    return uri.removeprefix("pvc://").split("/", 1)[0]
