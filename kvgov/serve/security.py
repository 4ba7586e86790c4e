"""Who may call ``kvgov serve``, and whose cache a request may reuse.

Keys: ``--api-key`` (repeatable), ``--api-key-file`` (one key per line, ``#`` comments)
and the environment (``KVGOV_API_KEY``, or ``KVGOV_API_KEYS`` comma-separated) all add
keys. With at least one key, every route but ``/health`` needs
``Authorization: Bearer KEY``; the key is compared with ``hmac.compare_digest`` against
every configured key, without stopping at a match, so neither which key matched nor how
much of one did shows in the time taken. Without keys every request is let in (only
sensible on loopback; ``kvgov serve`` warns otherwise). ``ApiKeys`` checks them;
``kvgov.serve.gateway`` asks it about each request.

Tenants: each key is a tenant, named by a short hash of the key (never the key, which
appears in no log, event or error). The gateway puts it on ``request.state.kvgov_tenant``
("" without keys). Inside the server a tenant's budget names are scoped
(``scoped_budget``) and its cache salt is its own (``cache_salt_for``), so one tenant's
requests never reuse another's prefix blocks, whatever salt a client sends, except
those of a prefix an admin key pinned as shared (``kvgov.serve.control``).
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from kvgov.serve.errors import ApiError
from kvgov.serve.page import PUBLIC_PATHS

__all__ = [
    "OPEN_PATHS",
    "ApiKeys",
    "load_api_keys",
    "tenant_id",
]

# What needs no key: the health probe (load balancers), and the live page's shell and static
# files (a browser cannot send a bearer key when it opens a page; the figures the page
# shows come from /kvgov/v1/live, which needs the key).
OPEN_PATHS = frozenset({"/health"}) | PUBLIC_PATHS


def load_api_keys(
    keys: Iterable[str] = (),
    *,
    key_file: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> tuple[str, ...]:
    """Every key from the options, the file and the environment, in that order, once each."""
    environ = os.environ if environ is None else environ
    found = [key.strip() for key in keys]
    if key_file is not None:
        try:
            lines = Path(key_file).read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise ValueError(f"cannot read the API key file {key_file}: {exc.strerror}") from exc
        found += [
            line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")
        ]
    if environ.get("KVGOV_API_KEY", "").strip():
        found.append(environ["KVGOV_API_KEY"].strip())
    found += [key.strip() for key in environ.get("KVGOV_API_KEYS", "").split(",") if key.strip()]
    if any(not key for key in found):
        raise ValueError("an API key is empty; pass a non-empty key to --api-key")
    if any(any(c.isspace() for c in key) for key in found):
        raise ValueError("an API key contains whitespace; a bearer key is one word")
    return tuple(dict.fromkeys(found))


def tenant_id(key: str) -> str:
    """A stable short name for a key's tenant; the key cannot be read back from it."""
    return "t" + hashlib.sha256(b"kvgov-tenant\0" + key.encode()).hexdigest()[:15]


class ApiKeys:
    """The server's keys, each with its tenant; ``kvgov.serve.gateway`` asks it about
    every HTTP request but those to ``OPEN_PATHS`` (unknown routes included: an
    unauthenticated caller learns nothing about what exists)."""

    def __init__(self, api_keys: Iterable[str]) -> None:
        self._keys = [(key.encode(), tenant_id(key)) for key in api_keys]

    @property
    def required(self) -> bool:
        """Whether requests need a key (the server has at least one)."""
        return bool(self._keys)

    def tenant(self, authorization: bytes | None) -> str | None:
        """The tenant of the key in an ``Authorization`` header's value; None when it
        names no configured key (or is not ``Bearer KEY``)."""
        given = _bearer(authorization)
        if given is None:
            return None
        found = None
        for key, tenant in self._keys:  # every key, no early exit: timing shows nothing
            if hmac.compare_digest(given, key):
                found = tenant
        return found

    @staticmethod
    def refusal() -> ApiError:
        return ApiError(
            401,
            "a valid API key is needed: send it as 'Authorization: Bearer KEY' (the "
            "keys are those given to kvgov serve with --api-key)",
            code="invalid_api_key",
            headers={"WWW-Authenticate": "Bearer"},
        )


def _bearer(authorization: bytes | None) -> bytes | None:
    if authorization is None:
        return None
    scheme, _, token = authorization.partition(b" ")
    if scheme.lower() == b"bearer" and token.strip():
        return token.strip()
    return None
