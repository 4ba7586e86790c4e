"""Skip tests marked ``gpu`` unless torch sees a CUDA or ROCm device; queue the child
processes of ``background`` tests when collection ends, run one at a time
(``tests/background.py``); ``kvgov_server``, a real ``kvgov serve`` process for the
remote backend's tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests import background
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


def pytest_collection_finish(session: pytest.Session) -> None:
    """Queue the children of the modules whose ``background`` tests were collected
    (``tests/background.py``): they run one at a time on the core the serial suite
    leaves idle."""
    for item in session.items:
        module = getattr(item, "module", None)
        if item.get_closest_marker("background") is None or module is None:
            continue
        child = module.background_child()
        if child is not None:
            background.start(module.__name__, child)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    lines = background.summary()
    if lines:
        terminalreporter.section("background children")
        for line in lines:
            terminalreporter.write_line(line)


def pytest_sessionfinish(session: pytest.Session) -> None:
    background.stop_all()


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
