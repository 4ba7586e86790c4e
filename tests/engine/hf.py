"""transformers for the tests that compare the engine with it, on any supported torch.

The engine supports torch 2.4 and later; transformers 5 builds models only on torch 2.6
and later (on older torch it imports, but refuses to make a model), and 4.x, which
runs there, takes a model's rotary embedding under other names. ``models()`` skips a
test, saying what to install, where transformers cannot build a model; ``rope_kwargs``
gives the rope config arguments in the installed version's terms.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest
import torch

__all__ = ["models", "rope_kwargs"]


def models() -> ModuleType:
    """transformers, where it can build torch models here; else the test is skipped."""
    transformers = pytest.importorskip("transformers")
    if not transformers.utils.is_torch_available():
        pytest.skip(
            f"transformers {transformers.__version__} builds no models on torch "
            f"{torch.__version__} (it needs a newer torch); on torch 2.4 or 2.5, "
            "pip install 'transformers<5' to run the tests that compare with it"
        )
    return transformers


def rope_kwargs(rope: dict[str, Any]) -> dict[str, Any]:
    """The config keyword arguments for ``rope`` (``rope_type``, ``rope_theta`` and the
    type's own fields, as transformers 5 writes them) on the installed transformers: 4.x
    keeps an unknown ``rope_parameters`` as a plain attribute and ignores it."""
    import transformers

    if int(transformers.__version__.split(".")[0]) >= 5:
        return {"rope_parameters": dict(rope)}
    scaling = {key: value for key, value in rope.items() if key != "rope_theta"}
    default = scaling.get("rope_type", "default") == "default"
    return {"rope_theta": rope["rope_theta"], "rope_scaling": None if default else scaling}
