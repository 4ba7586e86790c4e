"""Which of kvgov's optional parts this install has, and what to install for the rest.

``pip install kvgov`` is the governor alone (no torch): an agent runtime talking to a
remote engine. The bundled engine is the ``engine`` extra, ``kvgov serve`` the ``serve``
extra. A command that needs a missing part says what to install instead of a traceback.
"""

from __future__ import annotations

import importlib.util

__all__ = ["missing_for"]

_NEEDS = {
    "engine": ("torch", "safetensors", "tokenizers"),
    "serve": ("torch", "safetensors", "tokenizers", "fastapi", "uvicorn", "prometheus_client"),
}
_TORCH_FIRST = "pip install torch==2.13.0 (or the build for your GPU), then "


def missing_for(extra: str) -> str | None:
    """None when the install has what ``extra`` needs; else what to run to get it."""
    absent = [name for name in _NEEDS[extra] if not _installed(name)]
    if not absent:
        return None
    first = _TORCH_FIRST if "torch" in absent else ""
    return (
        f"this needs kvgov's {extra} extra ({', '.join(absent)} not installed): "
        f"{first}pip install 'kvgov[{extra}]'"
    )


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a broken install, or an import hook refusing it
        return False
