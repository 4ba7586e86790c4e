"""``read_listing``: the entry the call asks for, the rest counted by directory or file."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from governor import TokenCounter
from policies.readers import Query, fit
from policies.readers.listing import read_listing
from tests.policies.readers.samples import find_listing, others

COUNTER = TokenCounter()
PLANTED = "./deploy/helm/templates/ingress-controller.yaml"


@pytest.mark.parametrize("seed", range(4))
def test_the_asked_entry_is_kept_and_the_rest_counted(seed: int) -> None:
    text = find_listing(seed, planted=PLANTED)
    query = Query.of("shell", {"cmd": "find . -type f"}, "Where is the ingress controller config?")
    reading = read_listing(text, query)
    assert reading is not None and reading.method == "listing"
    fitted = fit(reading, 200, COUNTER)
    assert fitted is not None and PLANTED in fitted.text.split("\n")
    summary = fitted.text.split("\n")[0]
    paths = text.split("\n")
    directories = {path.rsplit("/", 1)[0] for path in paths}
    assert summary.startswith(f"[{len(paths):,} entries in {len(directories)} directories")
    named = re.findall(r"(\./[\w/]+) (\d+)", summary)
    assert len(named) == 4
    for directory, n in named:  # each named with its own count
        assert sum(1 for path in paths if path.startswith(directory + "/")) == int(n)


def test_a_glob_in_the_arguments_picks_entries() -> None:
    text = find_listing(3, planted="./deploy/k8s/secrets.enc")
    fitted = fit(
        read_listing(text, Query.of("glob", {"pattern": "*.enc"})) or pytest.fail(), 120, COUNTER
    )
    assert fitted is not None and "./deploy/k8s/secrets.enc" in fitted.text


def test_tree_entries_come_with_their_ancestors() -> None:
    lines = ["."]
    for d in range(30):
        lines.append(f"├── pkg{d}")
        lines += [f"│   ├── file{d}_{k}.go" for k in range(8)]
        lines.append(f"│   └── {'router_config.yaml' if d == 17 else f'last{d}.go'}")
    query = Query.of("tree", {"path": "."}, "where is the router config?")
    fitted = fit(read_listing("\n".join(lines), query) or pytest.fail(), 120, COUNTER)
    assert fitted is not None
    kept = fitted.text.split("\n")
    assert kept.index("├── pkg17") < kept.index("│   └── router_config.yaml")


def test_search_matches_are_counted_by_file() -> None:
    rng_lines = [f"src/app/{'abc'[k % 3]}.py:{k}:    value = compute(x, {k})" for k in range(800)]
    rng_lines.insert(555, "src/app/retry.py:88:    RETRY_BACKOFF_MS = 250")
    query = Query.of(
        "grep", {"pattern": "compute|RETRY", "path": "src"}, "What is the retry backoff?"
    )
    fitted = fit(read_listing("\n".join(rng_lines), query) or pytest.fail(), 150, COUNTER)
    assert fitted is not None and "src/app/retry.py:88:    RETRY_BACKOFF_MS = 250" in fitted.text
    counts = dict(re.findall(r"(src/app/\w+\.py) (\d+)", fitted.text.split("\n")[0]))
    assert counts == {"src/app/a.py": "267", "src/app/b.py": "267", "src/app/c.py": "266"}
    assert fitted.text.split("\n")[0].endswith(", 1 more]")  # a file of one match, not named


def test_du_keeps_the_largest() -> None:
    lines = [f"{k % 90 + 4}K\t./cache/shard_{k}" for k in range(300)]
    lines[123] = "48G\t./cache/shard_123"
    fitted = fit(
        read_listing("\n".join(lines), Query.of("du", {"path": "./cache"})) or pytest.fail(),
        60,
        COUNTER,
    )
    assert fitted is not None and "48G\t./cache/shard_123" in fitted.text


@pytest.mark.parametrize("kind", ["diff", "log", "prose", "html", "json", "csv", "pytest"])
def test_other_outputs_are_not_listings(kind: str) -> None:
    assert read_listing(others(2)[kind], Query.of()) is None


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(max_size=40), max_size=40), st.integers(5, 80))
def test_any_lines_are_read_or_refused_and_fit(extra: list[str], budget: int) -> None:
    text = find_listing(1, entries=40) + "\n" + "\n".join(extra)
    reading = read_listing(text, Query.of("t", {"q": "*.py"}, "where"))
    if reading is not None:
        fitted = fit(reading, budget, COUNTER)
        assert fitted is None or fitted.tokens <= budget


def test_where_a_searched_name_is_defined_comes_first() -> None:
    lines = [f"./docs/clients.md:{k}:Set `REQUEST_TIMEOUT_MS` per service." for k in range(40)]
    lines += [f"./src/search/client.py:{k}:    timeout=REQUEST_TIMEOUT_MS," for k in range(40)]
    lines.insert(57, "./src/search/cache/config.py:244:REQUEST_TIMEOUT_MS = 21")
    query = Query.of("shell", {"command": "grep -rn REQUEST_TIMEOUT_MS ."}, "Where is it defined?")
    fitted = fit(read_listing("\n".join(lines), query) or pytest.fail(), 90, COUNTER)
    assert (
        fitted is not None
        and "./src/search/cache/config.py:244:REQUEST_TIMEOUT_MS = 21" in fitted.text
    )


def test_rg_heading_hits_are_read_with_their_file() -> None:
    blocks = []
    for k in range(30):
        name = f"src/{'gateway' if k == 17 else f'svc{k}'}/events.ts"
        value = (
            "export const HEALTHCHECK_INTERVAL_S = 43;"
            if k == 17
            else "  await sleep(HEALTHCHECK_INTERVAL_S);"
        )
        imported = f"{k * 7 + 3}:import {{ HEALTHCHECK_INTERVAL_S }} from './config';"
        blocks.append(f"{name}\n{imported}\n{k + 100}:{value}")
    text = "\n\n".join(blocks)
    query = Query.of(
        "shell",
        {"command": "rg --heading -n HEALTHCHECK_INTERVAL_S"},
        "Where is HEALTHCHECK_INTERVAL_S defined for the gateway client?",
    )
    reading = read_listing(text, query)
    assert reading is not None and reading.pieces[0].text.startswith("[60 matches in 30 files")
    fitted = fit(reading, 90, COUNTER)
    assert fitted is not None
    kept = fitted.text.split("\n")
    assert kept.index("src/gateway/events.ts") < kept.index(
        "117:export const HEALTHCHECK_INTERVAL_S = 43;"
    )


def test_a_question_about_size_keeps_the_largest_file() -> None:
    lines = [f"{k % 90 + 4}K\t./src/mod{k % 7}/file_{k}.py" for k in range(300)]
    lines += [f"{400 + k}K\t./src/mod{k}" for k in range(7)]
    lines.insert(150, "58G\t./data/exports/debug-99397.log")
    lines += ["58G\t./data/exports", "58G\t./data", "58G\t."]
    query = Query.of("shell", {"command": "du -ah ."}, "Find the biggest file; the disk is full.")
    fitted = fit(read_listing("\n".join(lines), query) or pytest.fail(), 100, COUNTER)
    assert fitted is not None and "58G\t./data/exports/debug-99397.log" in fitted.text


def test_timestamped_logs_are_not_search_results() -> None:
    lines = [
        f"2024-04-19 13:48:{k % 60:02d}.089  INFO 1 --- [exec-{k}] b.events : GET /x 200"
        for k in range(60)
    ]
    assert read_listing("\n".join(lines), Query.of()) is None
    nginx = [
        f'10.0.0.{k} - - [01/Jul/2024:03:18:{k % 60:02d} +0000] "GET /a HTTP/1.1" 200 5'
        for k in range(60)
    ]
    assert read_listing("\n".join(nginx), Query.of()) is None
