"""transformers' continuous batching config, built in the installed version's terms.

``kvgov bench engine`` compares the engine with transformers' ``generate_batch``, which
takes a ``ContinuousBatchingConfig``. Its field for the tokens a KV page holds has two
names across versions: ``page_size`` in the newer ones (5.25 has both and warns that
``block_size`` is deprecated), ``block_size`` in the older ones. The config is built with
whichever the class declares, read off the class, so the comparison runs on either and
never passes the deprecated name where the new one exists.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import TypeVar

__all__ = ["UnsupportedBatchingConfigError", "paged_batching_config"]

T = TypeVar("T")

_PAGE_FIELDS = ("page_size", "block_size")  # newest first


class UnsupportedBatchingConfigError(TypeError):
    """The config class takes neither name for its page size."""

    def __init__(self, config_class: type, fields: tuple[str, ...]) -> None:
        self.config_class = config_class
        self.fields = fields
        super().__init__(
            f"{config_class.__module__}.{config_class.__qualname__} takes none of "
            f"{', '.join(_PAGE_FIELDS)} for its page size (its fields: {', '.join(fields)}); "
            "install a transformers this benchmark knows (pip install -e '.[dev]') or name "
            "the new field in engine.benchmarks.hf_batching"
        )


def paged_batching_config(config_class: type[T], *, num_blocks: int, page_size: int) -> T:
    """``config_class(num_blocks=..., <its page field>=page_size)``."""
    fields = _field_names(config_class)
    build: Callable[..., T] = config_class
    for name in _PAGE_FIELDS:
        if name in fields:
            return build(num_blocks=num_blocks, **{name: page_size})
    raise UnsupportedBatchingConfigError(config_class, fields)


def _field_names(config_class: type) -> tuple[str, ...]:
    if dataclasses.is_dataclass(config_class):
        return tuple(f.name for f in dataclasses.fields(config_class))
    parameters = inspect.signature(config_class).parameters.values()
    return tuple(p.name for p in parameters if p.kind is not inspect.Parameter.VAR_KEYWORD)
