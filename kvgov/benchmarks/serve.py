"""``kvgov bench serve``: what serving the engine over HTTP costs, side by side with the same
engine in process.

- ``http_overhead_ms_p50``: a non-streamed chat completion of 16 tokens through
  ``RemoteBackend.generate`` minus the same call through ``LocalBackend.generate`` on the
  same engine, each call less the engine's own time for it (``GenerationResult.engine_s``,
  over HTTP ``usage.kvgov_engine_ms``), the median over alternating pairs (target <= 2
  ms; ``split_overhead``). The engine's time for a 16-token call scatters by tens of
  milliseconds on a shared host, so the whole calls' difference had a standard error of
  0.7-1.9 ms against a difference of about 1-2; less the engine's time, its error is a
  few hundredths. The note also gives the whole calls' difference and the engine's time
  on each side; the figure is NaN with "NOT MEASURED" and the reason where the served
  calls' engine time ran longer (serving slowing the engine, which it would leave out).
  Greedy, the same prompt, warm prefix cache on both sides; every timed call on either
  side must give the same answer (tokens and cached tokens) on one engine instance, or
  the figure is NaN with "NOT MEASURED" and the reason (``why_not_comparable``).
- ``stream_tokens_per_s_32``: tokens per second streamed to 32 concurrent clients over
  HTTP (``RemoteBackend.astream`` on one event loop), over the same 32 calls in process
  (``LocalBackend.astream``, 32 at once on one event loop): the median of the ratios of
  adjacent runs, in the order local, HTTP, HTTP, local, ... (target >= 0.85). Tokens are
  counted from the chunks that arrived; both runs must count the same total (asserted).
- ``governed_remote_over_local``: the integrations benchmark's 20-agent LangGraph run
  (``integrations.benchmarks.integrations.agent_run``) governed by a ``Governor`` on
  ``RemoteBackend`` over the same run governed on ``LocalBackend``: the median of the
  ratios of alternating pairs (target <= 1.10).

The server (``ServeChild``) is kvgov serve's app and uvicorn settings around one
``LocalBackend`` in a child process. The overhead's two sides share that engine: the
in-process call runs in the child (``LocalBackend.generate``, timed there), the HTTP call
comes from this process. So the two sides never differ by engine, cache or host load on
one process, which is what sank the earlier design (the server's engine against a second
engine here: the in-process side came out slower by up to 127 ms). The client is in
another process because that is how HTTP is used, and because a client sharing the
server's GIL would add its own hand-offs (each may wait for the holder's switch interval)
to the served call only: a bias that only adds. The streamed and governed figures compare
the child's engine with a second ``LocalBackend`` here (same config: model, blocks, CPU,
torch threads: ``torch.set_num_threads`` here, ``OMP_NUM_THREADS`` there); they are
throughput ratios over many calls. Each note says what ran. ``measure`` returns the
figures with what a wrong figure would break (the overhead's engine instances and
answers, tokens per call, totals per run, the server's state after the runs, its process
id) for the benchmark's test.

Where the time goes, on a shared 2-core CPU host: a 16-token call takes 70-600 ms of
engine time, which scatters by about 10 ms from one call to the next on a quiet host;
less each call's engine time, the 301 pairs give a standard error of a few hundredths of a
millisecond. A served call outside the engine, timestamped at each hop (200 calls,
2026-12-02, before the two changes below): the client's request to the gateway 0.62 ms
(building and writing it, the loopback, uvicorn's parsing), the gateway to the model call
0.43 ms (its body parsed in one pydantic step, ``openai_schemas.read_body``; the two
generation routes are served by ``kvgov.serve.gateway`` in front of FastAPI), the hand-off
to the engine thread and the prompt's tokenizing there 0.52 ms (the in-process call pays
it too), the engine's end back to the event loop 0.22 ms (``LocalBackend.agenerate``: one
wake-up per call, not one per token), the answer's JSON 0.18 ms, its head 0.32 ms (0.23 of
it uvicorn's access log, now written by the gateway after the answer: 0.10 ms left), and
the answer back to the caller 0.42 ms (``RemoteBackend.generate`` over kvgov's own
HTTP/1.1 transport, ``backends.http._http11``, its answer read as a lean ``Reply``: 35%
less client time than through httpx's ``Response`` against a server that answers at once,
and 1.3 ms through httpx's client and httpcore before that). The in-process call spends
0.7-0.9 ms outside the engine (tokenizing, the hand-offs). Streaming costs the client about
0.075 ms of CPU per token (0.18 ms through httpcore and anyio: a selector registration, a
timeout scope and h11 per read) and the server's event loop under 0.1 ms; the engine's
threads spend the same CPU either way.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import math
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx

from backends import LocalBackend, RemoteBackend
from engine.benchmarks import Direction, Measurement
from governor import BackendMetrics, GenerationRequest, GenerationResult
from integrations.benchmarks.integrations import MODEL_LATENCY_S, NUM_AGENTS, agent_run
from kvgov.benchmarks.figure import spread
from kvgov.benchmarks.serve_child import ServeChild

__all__ = [
    "OverheadSplit",
    "ServeFacts",
    "ServeSizes",
    "measure",
    "run",
    "split_overhead",
    "why_not_comparable",
]

_BENCH = "serve"
_MODEL = "tiny-random"
# The governed run's leases at their ceilings: 20 workers of 8,000 tokens and a planner of
# 4,000 take 10,250 blocks of 16 tokens; the integrations benchmark gives it 16,384.
_NUM_BLOCKS = 16_384
_CLIENTS = 32
_OVERHEAD_TOKENS = 16
_PROMPT = "Summarize the build log of module 7 in one line."


@dataclass(frozen=True, slots=True, kw_only=True)
class ServeSizes:
    pairs: int  # http_overhead's pairs of calls
    stream_tokens: int  # max tokens of each of the 32 streamed calls
    stream_pairs: int  # pairs of stream runs (a local and an HTTP run each)
    governed_pairs: int
    warmups: int  # untimed calls of each side before http_overhead's pairs

    @classmethod
    def of(cls, *, quick: bool) -> ServeSizes:
        if quick:
            return cls(pairs=3, stream_tokens=16, stream_pairs=1, governed_pairs=2, warmups=1)
        return cls(pairs=301, stream_tokens=64, stream_pairs=8, governed_pairs=21, warmups=3)


@dataclass(slots=True)
class ServeFacts:
    """The figures, and what the test checks a wrong figure would break."""

    measurements: list[Measurement] = field(default_factory=list)
    completion_tokens: list[int] = field(default_factory=list)  # every overhead call's
    # The overhead's sides and the engine instance each ran on; every distinct answer.
    overhead_instances: set[tuple[str, str]] = field(default_factory=set)
    overhead_answers: dict[str, set[GenerationResult]] = field(default_factory=dict)
    # (whole call, engine) seconds of each timed overhead call, per side
    overhead_calls: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    stream_totals: dict[str, list[int]] = field(default_factory=dict)  # tokens per run
    server_after: BackendMetrics | None = None  # the server's metrics after every run
    server_budgets_after: int = -1
    leases_held: bool = False  # a governor still holds a lease after its runs
    server_pid: int | None = None


def run(*, quick: bool = False) -> Iterator[Measurement]:
    yield from measure(quick=quick).measurements


def measure(*, quick: bool = False) -> ServeFacts:
    import torch

    sizes = ServeSizes.of(quick=quick)
    threads = torch.get_num_threads()
    torch.set_num_threads(threads)  # the server process gets the same (OMP_NUM_THREADS)
    config = {"model": _MODEL, "num_blocks": _NUM_BLOCKS, "device": "cpu"}
    what = f"{_MODEL} on CPU, {_NUM_BLOCKS:,} blocks, {threads} torch threads in each process"
    facts = ServeFacts()
    with (
        ServeChild(model=_MODEL, num_blocks=_NUM_BLOCKS, threads=threads) as server,
        LocalBackend(config=config) as local,  # built while the server starts
        RemoteBackend(server.base_url) as remote,
    ):
        facts.server_pid = server.pid
        server.wait_ready()
        facts.measurements.append(_http_overhead(server, remote, sizes, what, facts))
        facts.measurements.append(_stream_ratio(local, remote, sizes, what, facts))
        facts.measurements.append(_governed_ratio(local, remote, sizes, what, facts))
        facts.server_after = remote.metrics()
        facts.server_budgets_after = len(remote.kv_map().budgets)
    return facts


# -- http_overhead_ms_p50 ------------------------------------------------------------------
def _http_overhead(
    server: ServeChild, remote: RemoteBackend, sizes: ServeSizes, what: str, facts: ServeFacts
) -> Measurement:
    request = GenerationRequest(
        messages=[{"role": "user", "content": _PROMPT}], max_tokens=_OVERHEAD_TOKENS
    )

    def local_call() -> tuple[float, GenerationResult]:
        call = server.local_generate(request)  # timed in the server's process
        facts.overhead_instances.add(("local", call.instance_id))
        return call.elapsed_s, call.result

    def remote_call() -> tuple[float, GenerationResult]:
        started = time.perf_counter()
        result = remote.generate(request)
        return time.perf_counter() - started, result

    calls = {"local": local_call, "remote": remote_call}
    answers: dict[str, set[GenerationResult]] = {"local": set(), "remote": set()}

    def timed(name: str, *, warm: bool = True) -> tuple[float, float]:
        elapsed, result = calls[name]()
        facts.completion_tokens.append(result.completion_tokens)
        if warm:  # the first calls fill the prefix cache: their cached_tokens differ
            answers[name].add(result)
        engine_s = result.engine_s if result.engine_s is not None else math.nan
        return elapsed, engine_s

    for _ in range(sizes.warmups):  # warm-up: connections, the prefix cache, the tokenizer
        timed("local", warm=False), timed("remote", warm=False)
    calls_s: dict[str, list[tuple[float, float]]] = {"local": [], "remote": []}
    for i in range(sizes.pairs):
        order = ("local", "remote") if i % 2 == 0 else ("remote", "local")
        gc.collect()
        for name in order:
            calls_s[name].append(timed(name))
    facts.overhead_instances.add(("remote", _instance_of(remote.base_url)))
    facts.overhead_answers = answers
    facts.overhead_calls = calls_s
    unlike = why_not_comparable(answers, facts.overhead_instances, tokens=_OVERHEAD_TOKENS)
    split = split_overhead(calls_s["local"], calls_s["remote"])
    overhead, invalid = (math.nan, unlike) if unlike else (split.overhead_s, split.invalid)
    round_trip = _round_trip_s(remote.base_url, sizes.pairs)
    return Measurement(
        bench=_BENCH,
        metric="http_overhead_ms_p50",
        value=overhead * 1e3,
        unit="ms",
        target=2.0,
        direction=Direction.LOWER_IS_BETTER,
        note=(
            invalid
            + f"median over {sizes.pairs} alternating pairs of a non-streamed chat completion "
            f"of {_OVERHEAD_TOKENS} tokens (greedy, same prompt, warm prefix cache; one answer "
            f"and one engine on both sides, checked), RemoteBackend.generate from the benchmark's "
            f"process minus LocalBackend.generate inside the server's process, both on the "
            f"server's one engine, each call less its engine's own time for it "
            f"(usage.kvgov_engine_ms; GenerationResult.engine_s): "
            f"{split.outside_ms('remote')} ms remote vs {split.outside_ms('local')} ms local "
            f"outside the engine, whose time for the call was {split.engine_ms('remote')} ms vs "
            f"{split.engine_ms('local')} ms (medians; the pairs' engine times differ by "
            f"{split.engine_difference_s * 1e3:+.2f} ms, standard error "
            f"{split.engine_error_s * 1e3:.2f} ms). Whole calls: {split.wall_ms('remote')} ms vs "
            f"{split.wall_ms('local')} ms, a median difference of "
            f"{split.wall_difference_s * 1e3:.2f} ms whose standard error is "
            f"{split.wall_error_s * 1e3:.2f} ms (the engine's time scattering on a shared host; "
            f"less it, {split.overhead_error_s * 1e3:.2f} ms). A bare GET /version round trip "
            f"takes {round_trip * 1e3:.2f} ms (median); kvgov serve's app and uvicorn settings "
            f"on 127.0.0.1, the access log on as kvgov serve writes it (after each answer); {what}"
        ),
    )


def why_not_comparable(
    answers: dict[str, set[GenerationResult]], instances: set[tuple[str, str]], *, tokens: int
) -> str:
    """ "" when both sides ran the same engine and did the same work on it (one instance;
    one answer, cached tokens included, so the same cache state; ``tokens`` tokens ending
    at the length limit), else why the difference of their times would not be HTTP's
    cost: "NOT MEASURED: ..." for the note."""
    engines = {instance for _, instance in instances}
    sides = {side for side, _ in instances}
    if sides != {"local", "remote"} or len(engines) != 1 or "" in engines:
        return f"NOT MEASURED: the two sides did not run on one engine ({sorted(instances)}). "
    every = answers.get("local", set()) | answers.get("remote", set())
    if len(every) != 1 or not answers.get("local") or not answers.get("remote"):
        return (
            f"NOT MEASURED: the two sides gave {len(every)} different answers to one greedy "
            "call on one engine (tokens or cached tokens), so they did not do the same work. "
        )
    (answer,) = every
    if answer.completion_tokens != tokens or answer.finish_reason != "length":
        return (
            f"NOT MEASURED: the calls made {answer.completion_tokens} tokens "
            f"({answer.finish_reason}), not {tokens}. "
        )
    return ""


@dataclass(frozen=True, slots=True)
class OverheadSplit:
    """Paired calls' times split into the engine's own and the rest; ``overhead_s`` is the
    median over pairs of remote's time outside the engine minus local's."""

    calls: dict[str, list[tuple[float, float]]]  # side: (whole call, engine) seconds per call
    overhead_s: float
    overhead_error_s: float
    engine_difference_s: float  # median over pairs of remote's engine time minus local's
    engine_error_s: float
    wall_difference_s: float  # median over pairs of whole-call differences
    wall_error_s: float
    invalid: str  # "" when the overhead measures HTTP's cost, else "NOT MEASURED: ..."

    def outside_ms(self, side: str) -> str:
        return f"{statistics.median(w - e for w, e in self.calls[side]) * 1e3:.2f}"

    def engine_ms(self, side: str) -> str:
        return f"{statistics.median(e for _, e in self.calls[side]) * 1e3:.1f}"

    def wall_ms(self, side: str) -> str:
        return f"{statistics.median(w for w, _ in self.calls[side]) * 1e3:.1f}"


def split_overhead(
    local: list[tuple[float, float]], remote: list[tuple[float, float]]
) -> OverheadSplit:
    """HTTP's cost from paired calls of (whole call, engine time) seconds.

    Each call less its engine's own time leaves what the path around the engine took (the
    hand-offs, and for the served call the client, the network and the server): pairing
    those removes the engine's time, which scatters by tens of milliseconds on a shared
    host, from a difference of about one. The figure is NaN with the reason when it would
    not be HTTP's cost: an engine time missing (a server that does not report it); the
    served calls' engine time longer by over three standard errors (serving slowed the
    engine, which the figure would leave out); or the served calls faster outside the
    engine by over two (HTTP never speeds a call up: the two sides' hosts differed)."""
    pairs = list(zip(local, remote, strict=True))
    wall = [rw - lw for (lw, _), (rw, _) in pairs]
    missing = any(math.isnan(e) for _, e in (*local, *remote))
    outside = [] if missing else [(rw - re) - (lw - le) for (lw, le), (rw, re) in pairs]
    engine = [] if missing else [re - le for (_, le), (_, re) in pairs]
    split = OverheadSplit(
        calls={"local": local, "remote": remote},
        overhead_s=statistics.median(outside) if outside else math.nan,
        overhead_error_s=_median_error(outside) if outside else math.nan,
        engine_difference_s=statistics.median(engine) if engine else math.nan,
        engine_error_s=_median_error(engine) if engine else math.nan,
        wall_difference_s=statistics.median(wall),
        wall_error_s=_median_error(wall),
        invalid="",
    )
    if missing:
        invalid = "NOT MEASURED: a call came back without the engine's time for it. "
        return dataclasses.replace(split, invalid=invalid)
    invalid = ""
    if split.engine_difference_s > 3 * split.engine_error_s:
        invalid = (
            f"NOT MEASURED: the served calls' engine time was longer by "
            f"{split.engine_difference_s * 1e3:.1f} ms (median, standard error "
            f"{split.engine_error_s * 1e3:.1f} ms): serving may have slowed the engine, "
            "which a figure outside the engine would not count; run again on a quiet machine. "
        )
    elif split.overhead_s < -2 * split.overhead_error_s:
        invalid = (
            f"NOT MEASURED: the served calls took {-split.overhead_s * 1e3:.2f} ms less "
            f"outside the engine (median, standard error {split.overhead_error_s * 1e3:.2f} "
            "ms), and HTTP never speeds a call up: the two sides' hosts did not run alike; "
            "run again on a quiet machine. "
        )
    return dataclasses.replace(split, overhead_s=math.nan, invalid=invalid) if invalid else split


# -- stream_tokens_per_s_32 -----------------------------------------------------------------
def _stream_ratio(
    local: LocalBackend, remote: RemoteBackend, sizes: ServeSizes, what: str, facts: ServeFacts
) -> Measurement:
    requests = [
        GenerationRequest(
            messages=[{"role": "user", "content": f"Client {i}: {_PROMPT}"}],
            max_tokens=sizes.stream_tokens,
        )
        for i in range(_CLIENTS)
    ]
    backends: dict[str, LocalBackend | RemoteBackend] = {"local": local, "remote": remote}
    totals: dict[str, list[int]] = {"local": [], "remote": []}
    rates: dict[str, list[float]] = {"local": [], "remote": []}

    async def client(backend: LocalBackend | RemoteBackend, request: GenerationRequest) -> int:
        tokens = 0
        async for chunk in backend.astream(request):
            tokens += len(chunk.token_ids)
            if chunk.result is not None and chunk.result.completion_tokens != tokens:
                raise AssertionError("a stream's chunks and its result disagree on its tokens")
        return tokens

    async def one_run(name: str) -> tuple[int, float]:
        started = time.perf_counter()
        counts = await asyncio.gather(*(client(backends[name], r) for r in requests))
        return sum(counts), time.perf_counter() - started

    async def runs() -> None:
        await one_run("local")  # warm-up of each: the batch's shapes, connections
        await one_run("remote")
        for i in range(2 * sizes.stream_pairs):
            name = ("local", "remote")[(i + i // 2) % 2]  # local, remote, remote, local, ...
            gc.collect()
            total, elapsed = await one_run(name)
            totals[name].append(total)
            rates[name].append(total / elapsed)

    asyncio.run(runs())
    facts.stream_totals = totals
    every = {*totals["local"], *totals["remote"]}
    if len(every) != 1:
        raise AssertionError(f"the runs streamed different totals: {totals}")
    ratios = [r / lo for lo, r in zip(rates["local"], rates["remote"], strict=True)]
    return Measurement(
        bench=_BENCH,
        metric="stream_tokens_per_s_32",
        value=statistics.median(ratios),
        unit="x",
        target=0.85,
        direction=Direction.HIGHER_IS_BETTER,
        note=(
            f"HTTP over in-process streamed tokens/s, median of {sizes.stream_pairs} ratios of "
            f"adjacent runs (local, HTTP, HTTP, local, ...; one ratio scatters by "
            f"{spread(ratios) * 100:.0f}%, standard deviation): {_CLIENTS} concurrent clients, "
            f"{sizes.stream_tokens} max tokens each, {every.pop():,} tokens per run counted "
            f"from the chunks (equal in every run); {statistics.median(rates['remote']):,.0f} "
            f"tok/s over HTTP (RemoteBackend.astream, SSE) vs "
            f"{statistics.median(rates['local']):,.0f} tok/s in process (LocalBackend.astream), "
            f"medians; {what}"
        ),
    )


# -- governed_remote_over_local -------------------------------------------------------------
def _governed_ratio(
    local: LocalBackend, remote: RemoteBackend, sizes: ServeSizes, what: str, facts: ServeFacts
) -> Measurement:
    runs = {"local": agent_run(local), "remote": agent_run(remote)}
    times: dict[str, list[float]] = {"local": [], "remote": []}

    async def measure_all() -> None:
        for name in runs:  # warm-up: imports, caches, the tokenizer
            await runs[name].once()
        for i in range(sizes.governed_pairs):
            order = ("local", "remote") if i % 2 == 0 else ("remote", "local")
            for name in order:
                wall, _ = await runs[name].once()
                times[name].append(wall)

    asyncio.run(measure_all())
    facts.leases_held = any(each.leases_held for each in runs.values())
    ratios = [r / lo for lo, r in zip(times["local"], times["remote"], strict=True)]
    return Measurement(
        bench=_BENCH,
        metric="governed_remote_over_local",
        value=statistics.median(ratios),
        unit="x",
        target=1.10,
        direction=Direction.LOWER_IS_BETTER,
        note=(
            f"median of {sizes.governed_pairs} alternating pairs (one pair's ratio scatters by "
            f"{spread(ratios) * 100:.0f}%, standard deviation): the integrations benchmark's "
            f"run (planner + {NUM_AGENTS} ReAct workers, a fake model sleeping "
            f"{MODEL_LATENCY_S * 1e3:g} ms per call) governed on RemoteBackend vs on "
            f"LocalBackend; runs of {statistics.median(times['remote']) * 1e3:.1f} ms vs "
            f"{statistics.median(times['local']) * 1e3:.1f} ms (medians). The backend serves "
            f"the governor's bookkeeping and counting, not the fake model's calls; "
            f"RemoteBackend counts each distinct conversation once (an LRU of the server's "
            f"counts) where LocalBackend tokenizes it again at every count; {what}"
            + ("; leases left held" if facts.leases_held else "")
        ),
    )


def _instance_of(base_url: str) -> str:
    """The serving engine's instance id, as ``/version`` names it."""
    return str(httpx.get(f"{base_url}/version", timeout=10.0).json().get("instance_id", ""))


def _round_trip_s(base_url: str, repeats: int) -> float:
    """The median time of ``GET /version`` on a kept-alive connection: HTTP and the
    framework with no engine in it, beside the overhead of a model call."""
    with httpx.Client(base_url=base_url) as client:
        client.get("/version").raise_for_status()
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            client.get("/version").raise_for_status()
            times.append(time.perf_counter() - started)
    return statistics.median(times)


def _median_error(values: list[float]) -> float:
    """The standard error of the median of ``values`` (about 1.25 times the mean's)."""
    return 1.2533 * spread(values) / math.sqrt(len(values))
