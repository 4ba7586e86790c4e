"""What the LLMSummarizer tests share (``test_llm_summarizer.py``,
``test_llm_summarizer_budgets.py``, ``test_llm_summarizer_models.py``): a pytest log of
400 results with one failure in it, the call's arguments, a summary a model might write of
it, the extractive fallback's text for a budget, and the check that a backend holds nothing
after a summary."""

from __future__ import annotations

from backends import LocalBackend
from governor import TokenCounter, ToolOutputReduction
from governor.testing import FakeBackend
from policies.extractive_summarizer import ExtractiveSummarizer
from policies.llm_summarizer import LLMSummarizer

COUNTER = TokenCounter()
ARGUMENTS = {"path": "src/config.py", "verbose": True}
SUMMARY = "pytest: 1 failed, 399 passed. ValueError: missing key: port in src/config.py line 12."


def pytest_log(passing: int = 400) -> str:
    lines = [f"tests/test_mod.py::test_case_{i} PASSED" for i in range(passing)]
    lines[passing // 2 : passing // 2] = [
        "tests/test_config.py::test_parse_config FAILED",
        "Traceback (most recent call last):",
        '  File "src/config.py", line 12, in parse_config',
        '    raise ValueError("missing key: port")',
        "ValueError: missing key: port",
    ]
    return "\n".join([*lines, f"=== 1 failed, {passing - 1} passed in 3.20s ==="])


LOG = pytest_log()


def _fallback_text(budget: int) -> str:
    return (
        ExtractiveSummarizer(COUNTER)
        .reduce(LOG, budget_tokens=budget, tool_name="pytest", arguments=ARGUMENTS)
        .text
    )


# What the extractive fallback calls its reduction of LOG (the reader that read it).
FALLBACK = (
    ExtractiveSummarizer(COUNTER)
    .reduce(LOG, budget_tokens=60, tool_name="pytest", arguments=ARGUMENTS)
    .method
)


def _reduce(summarizer: LLMSummarizer, budget: int = 60) -> ToolOutputReduction:
    return summarizer.reduce(LOG, budget_tokens=budget, tool_name="pytest", arguments=ARGUMENTS)


def _assert_nothing_held(backend: FakeBackend | LocalBackend) -> None:
    metrics = backend.metrics()
    assert (metrics.num_blocks_in_use, metrics.num_requests_running) == (0, 0)
