"""The runtime layer of kvgov: leases, admission, fan-out, ceilings and shared prefixes.

governor/ drives any inference engine through its own small ``Backend`` protocol and
never imports engine/ at module level; see DESIGN.md for the import rules.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

__all__ = ["__version__"]

try:
    __version__ = version("kvgov")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0.0.0+unknown"
