"""Skip tests marked ``gpu`` unless torch sees a CUDA or ROCm device; ``kvgov_server``,
a real ``kvgov serve`` process for the remote backend's tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.serve_process import ServerProcess, serve_process


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


# One kvgov serve process for the whole session (tests/serve_process.py): starting one
# takes seconds (torch, the engine), so every test that runs the governor against
# RemoteBackend shares it. Its pool matches the 64-block, 16-token LocalBackend the
# behaviour tests it mirrors build; each test leaves it as it found it (no budget, pin,
# hold or call left behind), as those tests already check.
REMOTE_CONFIG = {"num_blocks": 64, "block_size": 16}


@pytest.fixture(scope="session")
def kvgov_server() -> Iterator[ServerProcess]:
    with serve_process(REMOTE_CONFIG) as server:
        yield server
