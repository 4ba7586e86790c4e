"""transformers' continuous batching config across the names of its page-size field.

The installed transformers builds it for real; two small dataclasses stand in for the
versions not installed here: ``OlderConfig`` for a transformers whose field is
``block_size`` (what the GPU machine's 5.17 was reported to take), ``NewerConfig`` for
one that has only ``page_size``.
"""

from __future__ import annotations

import dataclasses
import warnings

import pytest

from engine.benchmarks.hf_batching import UnsupportedBatchingConfigError, paged_batching_config


@dataclasses.dataclass
class OlderConfig:
    """Stands in for a transformers that names the page size ``block_size``."""

    block_size: int = 256
    num_blocks: int | None = None


@dataclasses.dataclass
class NewerConfig:
    """Stands in for a transformers that has only ``page_size``."""

    page_size: int = 256
    num_blocks: int | None = None


class KeywordConfig:
    """A plain class (no dataclass): its signature is read instead."""

    def __init__(self, *, num_blocks: int, block_size: int, **options: object) -> None:
        self.num_blocks, self.block_size, self.options = num_blocks, block_size, options


def test_the_installed_transformers_takes_16_token_pages_without_a_warning() -> None:
    configuration_utils = pytest.importorskip("transformers.generation.configuration_utils")
    config_class = configuration_utils.ContinuousBatchingConfig
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a deprecated name would warn
        config = paged_batching_config(config_class, num_blocks=1024, page_size=16)
    assert config.num_blocks == 1024
    page = getattr(config, "page_size", None) or config.block_size
    assert page == 16


def test_an_older_transformers_gets_block_size() -> None:
    config = paged_batching_config(OlderConfig, num_blocks=1024, page_size=16)
    assert config == OlderConfig(block_size=16, num_blocks=1024)


def test_a_newer_transformers_gets_page_size() -> None:
    config = paged_batching_config(NewerConfig, num_blocks=1024, page_size=16)
    assert config == NewerConfig(page_size=16, num_blocks=1024)


def test_a_class_that_is_not_a_dataclass_is_read_by_its_signature() -> None:
    config = paged_batching_config(KeywordConfig, num_blocks=8, page_size=16)
    assert (config.num_blocks, config.block_size, config.options) == (8, 16, {})


def test_a_class_with_neither_name_is_refused_with_its_fields() -> None:
    @dataclasses.dataclass
    class Unknown:
        tokens_per_page: int = 16
        num_blocks: int | None = None

    with pytest.raises(UnsupportedBatchingConfigError, match="tokens_per_page") as caught:
        paged_batching_config(Unknown, num_blocks=8, page_size=16)
    assert caught.value.fields == ("tokens_per_page", "num_blocks")
    assert isinstance(caught.value, TypeError)
