"""The README's set-up commands, CI running exactly the README's test command, and every
Python block of the README and docs/ run as written."""

from __future__ import annotations

import contextlib
import io
import os
import re
from pathlib import Path
from typing import Any

from governor import Governor

ROOT = Path(__file__).resolve().parent.parent
CI_RUN = ROOT / ".ci" / "run"
MAIN_JOB = "pip install torch==2.13.0 && pip install -e '.[engine]' && kvgov demo"
TEST_COMMAND = "pip install torch==2.13.0 && pip install -e '.[dev]' && python -m pytest"


def _set_up_commands() -> list[str]:
    """The fenced blocks of the README's "Set up" section, in order."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## Set up\n", 1)[1].split("\n## ", 1)[0]
    return [block.strip() for block in re.findall(r"```\w*\n(.*?)```", section, re.DOTALL)]


def test_set_up_shows_the_main_job_then_the_test_command() -> None:
    assert _set_up_commands() == [MAIN_JOB, TEST_COMMAND]


def test_ci_runs_exactly_the_readme_test_command() -> None:
    test_command = _set_up_commands()[1]
    ci_lines = [line.strip() for line in CI_RUN.read_text(encoding="utf-8").splitlines()]
    assert test_command in ci_lines


def test_docs_need_nothing_outside_the_repository() -> None:
    """A user's clone has only the repository: no file may send readers beyond it."""
    outside = ("../" + "shared", "DESIGN" + ".md")  # spelled apart: this file is read too
    folders = ("engine", "governor", "policies", "integrations", "examples", "tests")
    paths = [ROOT / "README.md", ROOT / "CONTRIBUTING.md"]
    paths += [path for folder in folders for path in (ROOT / folder).rglob("*.py")]
    for path in paths:
        text = path.read_text(encoding="utf-8")
        assert not any(name in text for name in outside), path
    assert "](CONTRIBUTING.md)" in (ROOT / "README.md").read_text(encoding="utf-8")


def test_ci_script_is_strict_and_executable() -> None:
    assert os.access(CI_RUN, os.X_OK)
    assert "set -euo pipefail" in CI_RUN.read_text(encoding="utf-8").splitlines()


def _documents() -> list[Path]:
    """The README and every page of docs/: where the Python blocks a reader copies live."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _python_blocks() -> list[tuple[str, str]]:
    """Each Python block, with the document it is in (relative to the repository)."""
    return [
        (str(path.relative_to(ROOT)), block)
        for path in _documents()
        for block in re.findall(r"```python\n(.*?)```", path.read_text(encoding="utf-8"), re.DOTALL)
    ]


# Every fenced block of the README and docs/ says what it is; only Python runs here.
# docs/readers.md is generated (docs/readers/render.py) and checked by tests/test_docs_readers.py:
# its blocks are captured tool outputs.
NOT_RUN = {
    "bash": "commands that install packages, start servers or need a GPU machine: the set-up "
    "commands are CI's own (checked above), the others are run by hand where they say",
    "text": "output, a diagram or a layout: nothing to run",
    "py": "a Python fragment for a server on another machine or with parts left out "
    "(KEY, agents=[...]): its imports are run, by the test below",
}
GENERATED = {"docs/readers.md"}


def _fenced_blocks() -> list[tuple[str, str, str]]:
    """(document, language, body) of every fenced block, indented ones included."""
    found = []
    for path in _documents():
        where = str(path.relative_to(ROOT))
        if where in GENERATED:
            continue
        text = path.read_text(encoding="utf-8")
        for match in re.finditer(r"^( *)```(\w*)\n(.*?)^\1```", text, re.DOTALL | re.MULTILINE):
            found.append((where, match.group(2), match.group(3)))
    return found


def test_every_fenced_block_is_run_or_says_why_not() -> None:
    blocks = _fenced_blocks()
    assert len(blocks) > 20  # the pattern above still finds the blocks
    unknown = [(where, language) for where, language, _ in blocks if language != "python"]
    unknown = [(where, language) for where, language in unknown if language not in NOT_RUN]
    assert not unknown, f"blocks neither python nor one of {sorted(NOT_RUN)}: {unknown}"
    python = [body for _where, language, body in blocks if language == "python"]
    assert sorted(python) == sorted(block for _where, block in _python_blocks())


def test_fragments_imports_work() -> None:
    """A ``py`` fragment cannot run here, but every name it imports must import."""
    fragments = [(w, b) for w, language, b in _fenced_blocks() if language == "py"]
    imports = [
        (where, line.strip())
        for where, body in fragments
        for line in body.splitlines()
        if re.match(r"\s*(from \S+ import |import )", line)
    ]
    assert len(fragments) >= 5 and len(imports) >= 4
    for where, line in imports:
        exec(compile(line, where, "exec"), {})


def _run_block(where: str, block: str) -> tuple[dict[str, Any], str]:
    """Runs one block as written; its namespace and what it printed."""
    namespace: dict[str, Any] = {}
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(block, where, "exec"), namespace)
    return namespace, printed.getvalue()


def _block_with(text: str) -> tuple[str, str]:
    (found,) = [(where, block) for where, block in _python_blocks() if text in block]
    return found


def _nothing_held(governor: Governor) -> None:
    """Every lease returned: none active or waiting."""
    active, waiting, _peak = governor.admission.counts()
    assert (active, waiting) == (0, 0)


def test_docs_have_the_python_blocks_these_tests_check() -> None:
    """Each block below is checked by a test of its own: a new one needs its test."""
    blocks = [block for _where, block in _python_blocks()]
    checked = ("app = govern(", "Engine.from_pretrained", "governor.fanout(", "call.reduce(")
    assert len(blocks) == len(checked)
    assert all(sum(text in block for block in blocks) == 1 for text in checked)


def test_quickstart_prints_the_reply_and_returns_its_lease() -> None:
    namespace, printed = _run_block(*_block_with("app = govern("))
    governor = namespace["governor"]
    _nothing_held(governor)
    assert governor.admission.counts()[2] == 1  # the coder's lease was admitted
    assert governor.backend.metrics().num_blocks_in_use == 0
    assert printed.count("\n") == 1  # the reply, on one line
    namespace["governor"].backend.close()


def test_engine_block_reuses_the_pinned_prefix() -> None:
    namespace, printed = _run_block(*_block_with("Engine.from_pretrained"))
    engine, prefix, done = namespace["engine"], namespace["prefix"], namespace["done"]
    metrics = engine.metrics()
    assert done.finish_reason.name == "LENGTH" and len(done.token_ids) == 32
    # every pinned block of the system prompt is a cache hit; nothing else is held
    assert done.num_cached_tokens == prefix.num_tokens == len(prefix.block_ids) * 16
    assert metrics.num_blocks_in_use == metrics.num_blocks_pinned == len(prefix.block_ids)
    assert printed.split() == [
        str(done.finish_reason),
        str(prefix.num_tokens),
        str(metrics.kv_cache_usage),
    ]


def test_fanout_block_runs_eight_workers_three_at_a_time() -> None:
    namespace, printed = _run_block(*_block_with("governor.fanout("))
    governor = namespace["governor"]
    _nothing_held(governor)
    # the planner, parked while its workers run, and at most max_fanout=3 workers
    assert governor.admission.counts()[2] == 3
    lines = printed.splitlines()
    assert lines[0] == "1 planner at 512 tokens, each with 8 workers at 256 tokens, max_fanout 3"
    rows = [line.split() for line in lines if line.startswith(("guaranteed", "overcommit"))]
    assert len(rows) == 4 and all(row[2] == "yes" and row[-1] == "no" for row in rows)


def test_tool_output_block_reduces_the_log_and_reuses_the_held_kv() -> None:
    namespace, printed = _run_block(*_block_with("call.reduce("))
    _nothing_held(namespace["governor"])
    kinds = [line.split(" ", 1)[0] for line in printed.splitlines()]
    assert kinds == [
        "run.started",
        "requested",
        "admitted",
        "call.started",
        "call.finished",
        "tool.started",
        "retained",
        "tool.finished",
        "summarized",
        "call.started",
        "call.finished",
        "released",
        "run.finished",
    ]
    reduced = namespace["reduced"]
    assert "KeyError: 'user'" in reduced.text
    assert namespace["backend"].counter.count(reduced.text) <= 120
    # the second call found the first call's KV held while the tool ran
    second = [line for line in printed.splitlines() if line.startswith("call.finished")][1]
    assert "'cached_tokens': 0," not in second
