"""Who may call ``kvgov serve``, and whose cache a request may reuse.

Keys: ``--api-key`` (repeatable), ``--api-key-file`` (one key per line, ``#`` comments)
and the environment (``KVGOV_API_KEY``, or ``KVGOV_API_KEYS`` comma-separated) all add
keys. With at least one key, every route but ``/health`` needs
``Authorization: Bearer KEY``; the key is compared with ``hmac.compare_digest`` against
every configured key, without stopping at a match, so neither which key matched nor how
much of one did shows in the time taken. Without keys every program is let in (only
sensible on loopback; ``kvgov serve`` warns otherwise). ``ApiKeys`` checks them;
``kvgov.serve.gateway`` asks it about each request.

Browsers, without keys (``SameOrigin``): a web page the user visits can make the browser
send requests to the server on loopback. Two ways are closed. DNS rebinding (a page whose
name first resolves to the attacker and then to 127.0.0.1, so the browser lets it read
the answers) sends the attacker's name in ``Host``: a ``Host`` must name this server (an
IP address, a loopback name, ``--host``, the address the request came to, or an
``--allowed-host``; a DNS name is what rebinding needs). A cross-site request (a form
post or ``fetch`` from another site; it cannot read the answer but its ``POST`` acts)
carries ``Sec-Fetch-Site: cross-site`` or ``same-site``, or an ``Origin`` that is not the
server's own: refused. Each refusal is 403. With keys neither applies: a browser never
adds a bearer key to a request on its own.

Tenants: each key is a tenant, named by a short hash of the key (never the key, which
appears in no log, event or error). The gateway puts it on ``request.state.kvgov_tenant``
("" without keys). Inside the server a tenant's budget names are scoped
(``scoped_budget``) and its cache salt is its own (``cache_salt_for``), so one tenant's
requests never reuse another's prefix blocks, whatever salt a client sends, except
those of a prefix an admin key pinned as shared (``kvgov.serve.control``).
"""

from __future__ import annotations

import hmac
import ipaddress
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from starlette.types import Scope

from kvgov.serve.errors import ApiError
from kvgov.serve.page import PUBLIC_PATHS
from kvgov.serve.tenancy import tenant_id

__all__ = [
    "OPEN_PATHS",
    "ApiKeys",
    "SameOrigin",
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


class SameOrigin:
    """Whether a request on a server without keys was addressed to this server and sent
    from it, not from another site in a browser (the module's docstring says why)."""

    _WILDCARDS = frozenset({"0.0.0.0", "::", ""})

    def __init__(self, *, host: str, allowed_hosts: Iterable[str] = ()) -> None:
        names = {"localhost", *allowed_hosts}
        if host not in self._WILDCARDS:
            names.add(host)
        self._names = frozenset(_hostname(name.encode("latin-1")) for name in names)

    def refusal(self, scope: Scope) -> ApiError | None:
        """The 403 for a request this server must not answer; None to let it in."""
        host = origin = fetch_site = None
        for name, value in scope["headers"]:  # the first of each, as a parser would take it
            if name == b"host" and host is None:
                host = value
            elif name == b"origin" and origin is None:
                origin = value
            elif name == b"sec-fetch-site" and fetch_site is None:
                fetch_site = value
        if host is not None and not self._names_server(_hostname(host), scope):
            return _refused(
                "host_not_allowed",
                f"the Host header names {_shown(host)}, not this server: without API keys "
                "kvgov serve answers only requests addressed to it by an IP address, a "
                "loopback name, its --host or an --allowed-host (a web page that reaches it "
                "by DNS rebinding sends its own name); start it with --allowed-host NAME to "
                "use that name, or with --api-key",
            )
        cross = fetch_site is not None and fetch_site.lower() in (b"cross-site", b"same-site")
        if cross or (origin is not None and not _same_origin(origin, host)):
            return _refused(
                "cross_site_request",
                f"a request from another site (Origin {_shown(origin)}, Sec-Fetch-Site "
                f"{_shown(fetch_site)}) is refused: without API keys any web page could "
                "drive this server through its visitor's browser; call it from a program or "
                "this server's own page, or start it with --api-key",
            )
        return None

    def _names_server(self, name: str, scope: Scope) -> bool:
        if name in self._names or name.endswith(".localhost"):  # *.localhost: RFC 6761
            return True
        server = scope.get("server")
        if server and name == str(server[0]).lower():
            return True
        try:
            ipaddress.ip_address(name)
        except ValueError:
            return False
        return True  # an address is no DNS name: nothing to rebind


def _hostname(host: bytes) -> str:
    """``Host``'s name: lower case, no port, no IPv6 brackets, no trailing dot."""
    text = host.decode("latin-1").strip().lower()
    if text.startswith("["):
        text = text[1 : text.find("]")] if "]" in text else text[1:]
    elif text.count(":") == 1:
        text = text.partition(":")[0]
    return text.rstrip(".")


def _same_origin(origin: bytes, host: bytes | None) -> bool:
    """Whether ``Origin`` (``scheme://host[:port]``) is the server's own, as the request's
    ``Host`` names it (any scheme: a TLS proxy in front changes it)."""
    _, sep, netloc = origin.partition(b"://")
    return bool(sep) and host is not None and netloc.lower() == host.strip().lower()


def _shown(value: bytes | None) -> str:
    if value is None:
        return "(none)"
    text = value.decode("latin-1")
    return repr(text if len(text) <= 100 else text[:100] + "...")


def _refused(code: str, message: str) -> ApiError:
    return ApiError(403, message, code=code)
