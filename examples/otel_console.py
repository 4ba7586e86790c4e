"""OpenTelemetry traces of a governed workflow, printed to the console and kept as JSON lines.

What it shows: ``integrations.instrument(governor, tracer_provider=...)`` turns the
governor's decisions into GenAI spans. One ``governor.run`` is an ``invoke_workflow``
span, each lease an ``invoke_agent`` span under it, each model call a ``chat`` span and
each ``governor.tool_call`` an ``execute_tool`` span under its agent, with ``gen_ai.*``
and ``kvgov.*`` attributes and span events (admission, summarization, held KV). The
OpenTelemetry SDK's ``ConsoleSpanExporter`` prints every span as it ends;
``integrations.JsonLinesSpanExporter`` writes them to a file that ``kvgov report`` reads.
The model calls are real generations on the bundled engine (``LocalBackend``,
``tiny-random``: random weights, so the text is noise).

    python examples/otel_console.py                 # spans in ./triage-spans.jsonl
    python examples/otel_console.py --fast          # shorter replies
    kvgov report triage-spans.jsonl                 # the run's report from that file
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

from backends import LocalBackend
from governor import AgentSpec, Governor
from integrations import JsonLinesSpanExporter, SpanRecord, instrument, read_spans

LOG = "".join(f"tests/test_api.py::test_{i} PASSED\n" for i in range(400)) + (
    "tests/test_auth.py::test_login FAILED\nE   KeyError: 'user'\n1 failed, 400 passed\n"
)


def triage(governor: Governor, reply_tokens: int) -> None:
    """A small governed workflow: one lease, two model calls and a tool call between them."""
    with governor.run("triage"), governor.lease("triager") as lease:
        history = [{"role": "user", "content": "The login test fails. Find out why."}]
        reply = governor.complete(lease, history, max_tokens=reply_tokens)
        history.append({"role": "assistant", "content": reply.text})
        with governor.tool_call(lease, "pytest", {"path": "tests/"}) as call:
            output = LOG  # run the tool here
        reduced = call.reduce(output)  # the FAILED and KeyError lines are kept
        history.append({"role": "user", "content": f"pytest output:\n{reduced.text}"})
        governor.complete(lease, history, max_tokens=reply_tokens)


def print_tree(spans: list[SpanRecord]) -> None:
    """Each span's name, indented under its parent, with its token counts and events."""
    children: dict[str | None, list[SpanRecord]] = defaultdict(list)
    for span in sorted(spans, key=lambda s: s.start_ns):
        children[span.parent_span_id].append(span)

    def show(span: SpanRecord, depth: int) -> None:
        attributes = span.attributes
        tokens = [
            f"{label} {attributes[key]:,}"
            for label, key in (
                ("input", "gen_ai.usage.input_tokens"),
                ("output", "gen_ai.usage.output_tokens"),
                ("peak", "kvgov.seq.tokens"),
                ("summarized away", "kvgov.summarize.tokens_saved"),
            )
            if key in attributes
        ]
        print(f"{'  ' * depth}{span.name}" + (f"  ({', '.join(tokens)})" if tokens else ""))
        for event in span.events:
            print(f"{'  ' * depth}  - event {event.name}")
        for child in children[span.span_id]:
            show(child, depth + 1)

    for root in children[None]:
        show(root, 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="4-token replies instead of 32")
    parser.add_argument("--out", type=Path, default=Path("triage-spans.jsonl"))
    args = parser.parse_args()

    provider = TracerProvider(resource=Resource.create({"service.name": "kvgov-example"}))
    provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
    provider.add_span_processor(SimpleSpanProcessor(JsonLinesSpanExporter(args.out)))
    triager = AgentSpec(name="triager", ceiling_tokens=1_024, tool_output_tokens=96)
    with LocalBackend(config={"num_blocks": 128}) as backend:
        governor = Governor(backend, agents=[triager])
        with instrument(governor, tracer_provider=provider):  # uninstruments at the end
            triage(governor, reply_tokens=4 if args.fast else 32)
    provider.shutdown()  # flushes and closes both exporters

    print(f"\nSpan tree (also in {args.out}):")
    print_tree(read_spans(args.out))


if __name__ == "__main__":
    main()
