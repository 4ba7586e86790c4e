"""Documentation text about a made-up server: sections of paragraphs, one sentence the answer.

``write`` returns sections whose sentences mark option names with backticks (each
renderer turns them into ``<code>``, keeps them, or drops them). The answer sentence
states an option's default ("`pool_timeout` defaults to 45 seconds"); other sentences
name the same option without that value (what it controls, an older default) or give
other options' values, so that only the answer holds the option and its value together.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

from policies.benchmarks.tool_outputs._common import NOUNS, plant

PROJECTS = ("lanternmq", "quillstore", "tidepool", "harbordb", "kestrel", "fernlog", "otterq")


@dataclass(frozen=True, slots=True)
class Option:
    name: str  # pool_timeout
    concept: str  # "how long a client waits for a free pool connection"
    value: str  # "45 seconds"


_OPTIONS = (
    ("pool_timeout", "how long a client waits for a free pool connection", "seconds", (5, 120)),
    (
        "max_connections",
        "how many client connections the server accepts",
        "connections",
        (64, 10_000),
    ),
    (
        "flush_interval",
        "how often buffered writes are flushed to disk",
        "milliseconds",
        (10, 5_000),
    ),
    ("retention_days", "how long messages are kept before deletion", "days", (1, 400)),
    ("max_message_size", "the largest message the server accepts", "MiB", (1, 512)),
    ("heartbeat_interval", "how often clients send a heartbeat", "seconds", (1, 300)),
    ("replication_factor", "how many copies of each partition are kept", "replicas", (2, 7)),
    ("idle_timeout", "how long an idle connection stays open", "minutes", (1, 180)),
    ("prefetch_count", "how many messages a consumer fetches ahead", "messages", (1, 5_000)),
    ("snapshot_interval", "how often a state snapshot is written", "minutes", (1, 720)),
    ("max_batch_bytes", "the largest batch a producer sends at once", "KiB", (16, 16_384)),
    ("compaction_threshold", "how many segments trigger a compaction", "segments", (2, 64)),
    (
        "election_timeout",
        "how long a follower waits before starting an election",
        "milliseconds",
        (150, 5_000),
    ),
    ("cache_size", "how much memory the block cache may use", "MiB", (64, 65_536)),
)
_HEADINGS = (
    "Overview",
    "Installation",
    "Configuration",
    "Connection pooling",
    "Storage",
    "Replication",
    "Clients",
    "Monitoring",
    "Security",
    "Performance tuning",
    "Upgrading",
    "Troubleshooting",
    "Backups",
    "Limits",
    "Networking",
)
_ANSWERS = (
    "By default, `{name}` is set to {value}.",
    "The default for `{name}` is {value}, which suits most deployments.",
    "`{name}` defaults to {value}; raise it if {concept} matters more than memory use.",
    "Out of the box, {project} uses {value} for `{name}`.",
    "Unless you override it, `{name}` is {value}.",
)
_MENTIONS = (  # the asked option, without its value
    "`{name}` controls {concept}.",
    "Changing `{name}` requires a restart of every node.",
    "The `{name}` setting is ignored when the server runs in embedded mode.",
    "Before version 2.0, `{name}` defaulted to {old}.",
    "Some teams set `{name}` to {old} on small clusters.",
    "Metrics for `{name}` are exported under the `{project}_config` family.",
)
_FILLER = (
    "`{other}` controls {other_concept}.",
    "`{other}` defaults to {other_value}.",
    "If `{other}` is set above {other_value}, {project} logs a warning at startup.",
    "{Project} reads its configuration from `/etc/{project}/{project}.conf` at startup.",
    "Each {noun} is written to the log before it is acknowledged.",
    "Clients reconnect with exponential backoff when the server goes away.",
    "See the section on {heading} for details.",
    "Operators usually watch queue depth and disk usage to decide when to scale out.",
    "Settings given on the command line override the configuration file.",
    "A rolling restart keeps the cluster available while settings change.",
    "The admin API exposes the effective value of every setting.",
    "Most deployments never need to change the {heading_lower} defaults.",
    "When a node falls behind, it catches up from the leader's log before serving reads.",
    "TLS is optional but strongly recommended for traffic between data centers.",
    "Every {noun} carries a monotonically increasing sequence number.",
    "Large {noun}s are split into chunks and reassembled by the client library.",
    "The server refuses to start if the data directory is not writable.",
    "You can reload most settings without a restart by sending SIGHUP.",
    "Benchmarks in this section ran on three nodes with NVMe disks.",
    "Values with units accept suffixes such as ms, s, m and h.",
)


def options(rng: random.Random, k: int) -> list[Option]:
    """``k`` distinct options with their defaults."""
    chosen = rng.sample(_OPTIONS, k)
    return [Option(name, concept, _value(rng, unit, span)) for name, concept, unit, span in chosen]


def _value(rng: random.Random, unit: str, span: tuple[int, int]) -> str:
    return f"{rng.randint(*span)} {unit}"


def write(
    rng: random.Random, project: str, asked: list[Option], num_chars: int
) -> tuple[list[tuple[str, list[list[str]]]], list[str]]:
    """Sections (heading, paragraphs of sentences) of about ``num_chars``, and the answers.

    Each asked option's answer sentence sits at a position drawn uniformly over all the
    sentences; no other sentence holds an asked value.
    """
    others = [o for o in options(rng, 8) if o.name not in {a.name for a in asked}]
    values = [a.value for a in asked]
    headings = rng.sample(_HEADINGS, len(_HEADINGS))

    def sentence() -> str:
        while True:
            template = rng.choice(_MENTIONS if rng.random() < 0.05 else _FILLER)
            other = rng.choice(others)
            text = template.format(
                name=rng.choice(asked).name,
                concept=rng.choice(asked).concept,
                old=_value(rng, *_unit_span(rng.choice(asked))),
                other=other.name,
                other_concept=other.concept,
                other_value=other.value,
                project=project,
                Project=project.title(),
                noun=rng.choice(NOUNS),
                heading=rng.choice(headings),
                heading_lower=rng.choice(headings).lower(),
            )
            if not any(v in text for v in values):
                return text

    sentences: list[str] = []
    total = 0
    while total < num_chars:
        sentences.append(sentence())
        total += len(sentences[-1]) + 1
    answers = [
        rng.choice(_ANSWERS).format(name=a.name, value=a.value, concept=a.concept, project=project)
        for a in asked
    ]
    plant(rng, sentences, answers)
    sections: list[tuple[str, list[list[str]]]] = []
    i = 0
    for heading in _cycle(headings):
        paragraphs = []
        for _ in range(rng.randint(2, 5)):
            n = rng.randint(2, 7)
            paragraphs.append(sentences[i : i + n])
            i += n
            if i >= len(sentences):
                break
        sections.append((heading, [p for p in paragraphs if p]))
        if i >= len(sentences):
            return sections, answers
    raise AssertionError("unreachable")


def _cycle(headings: list[str]) -> Iterator[str]:
    n = 0
    while True:
        base = headings[n % len(headings)]
        yield base if n < len(headings) else f"{base} ({n // len(headings) + 1})"
        n += 1


def _unit_span(option: Option) -> tuple[str, tuple[int, int]]:
    for name, _, unit, span in _OPTIONS:
        if name == option.name:
            return unit, span
    raise AssertionError(option.name)


def question(rng: random.Random, project: str, asked: list[Option]) -> str:
    """The agent's turn: naming the options, or saying what they control."""
    if rng.random() < 0.5:
        names = " and ".join(o.name for o in asked)
        return rng.choice(
            (
                f"What's the default {names} in {project}?",
                f"Does {project} set {names} by default? To what?",
            )
        )
    concepts = ", and ".join(o.concept for o in asked)
    return rng.choice(
        (
            f"I need to know {concepts}, by default, in {project}.",
            f"Can you find out {concepts} in a stock {project} install?",
        )
    )
