"""Skip tests marked ``gpu`` unless torch sees a CUDA or ROCm device."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items:
        return
    import torch  # only when a gpu test was collected: importing torch takes seconds

    if torch.cuda.is_available():  # true on ROCm builds too
        return
    skip = pytest.mark.skip(reason="needs a CUDA or ROCm GPU; torch.cuda.is_available() is False")
    for item in gpu_items:
        item.add_marker(skip)
