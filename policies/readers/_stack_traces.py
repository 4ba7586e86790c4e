"""Stack traces found in lines of text: Python, JVM (Java, Kotlin, Scala), Node, Go.

``find_traces`` finds each trace's extent and its parts: the exception lines (a chain's
causes included), the frames (user code or not, innermost first), the glue between them
(``Traceback (most recent call last):``, chain markers, goroutine headers) and, for Go,
the goroutines other than the panicking one. ``parts`` cuts a trace into the line ranges
a reader ranks: messages, their detail lines, the innermost user frames kept one by one,
and the other frames collapsed into counted runs. The traces reader and the diagnostics
reader (for the tracebacks inside test failures) both rank these parts.

A frame is user code unless its path or name says it belongs to the runtime, the standard
library or a dependency: ``site-packages``, the Python install's ``lib/python3.x``,
``node_modules``, ``node:internal``, ``java.*``, ``org.springframework.*``, Go's
``runtime`` and the module cache, and the like.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

__all__ = [
    "Frame",
    "Goroutine",
    "Part",
    "PartKind",
    "Raised",
    "Trace",
    "find_traces",
    "parts",
    "trace_at",
]

_PY_HEAD = re.compile(r"(.*?)Traceback \(most recent call last\):\s*")
_PY_FRAME = re.compile(r'\s*File "([^"]*)", line \d+')
_PY_CHAIN = re.compile(
    r"\s*(?:During handling of the above exception, another exception occurred"
    r"|The above exception was the direct cause of the following exception):\s*"
)
_PY_EXCEPTION = re.compile(r"(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?::.*)?")
# Lines that start a log entry: a Python exception's message never runs into one.
_LOG_START = re.compile(
    r"\[?\d{4}-\d\d-\d\d[T ]|\[?\d{4}/\d\d/\d\d |\[?\d\d:\d\d:\d\d|[IWEF]\d{4} "
    r"|[A-Z][a-z]{2} [ \d]\d \d\d:\d\d|\[?(?:TRACE|DEBUG|INFO|NOTICE|WARN|WARNING|ERROR"
    r"|FATAL|CRITICAL|SEVERE)\b|(?:time|ts|level)=|\{\""
)
_JVM_FRAME = re.compile(r"\s+at ([\w$.<>/@:`,\[\]-]+)\(([^()]+)\)(?:\s.*)?")  # and .NET; never ()
_JS_FRAME = re.compile(
    r"\s+at (?:(?:.+?) \(([^()\s]+:\d+:\d+|<anonymous>|native|index \d+|unknown location)\)"
    r"|([^()\s]+:\d+:\d+))\s*"
)
_ELIDED_FRAMES = re.compile(r"\s+\.\.\. \d+ (?:more|common frames omitted)\s*")
_CAUSE = re.compile(r"\s*(?:Caused by|Suppressed): .*")
_EXCEPTION_NAME = re.compile(
    r"\s*(?:Exception in thread \"[^\"]*\" |Uncaught |\[)?"
    r"(?:[A-Za-z_$][\w$]*[./])*[A-Z]?[\w$]*(?:Exception|Error|Throwable|Failure|Fault|Exit)"
    r"\b(?::|\s*$|\s*\[|\s*\{| [A-Z]| \()"
)
_JS_SOURCE = re.compile(r"\S+\.[cm]?[jt]sx?:\d+")
_CARET = re.compile(r"\s*\^+\s*")
_GO_START = re.compile(r"panic: |fatal error: |SIG[A-Z]+: |unexpected fault address ")
_GOROUTINE = re.compile(r"goroutine \d+(?: [^\[]*)?\[[^\]]*\]:\s*")
_GO_FILE = re.compile(r"\t(\S.*?):\d+(?: \+0x[0-9a-f]+)?(?: .*)?")
_GO_NUMBERS = re.compile(r"0x[0-9a-f]+|\d+")  # arguments, offsets, goroutine ids
_GO_ELIDED = re.compile(r"\.\.\.\d* ?additional frames elided\.\.\.")

_MAX_MESSAGE = 20  # lines of an exception's message, at most
_MAX_HEADER_GAP = 10  # lines between a JVM or Node exception line and its first frame
_NAME_CHARS = 300  # of a line, enough to hold an exception's name
_DETAIL = 5  # detail lines (a message's continuation) in the first, better-ranked part

_PY_LIBRARY = re.compile(
    r"[/\\](?:site|dist)-packages[/\\]|[/\\]lib[/\\]python\d|[/\\]Lib[/\\]|^<frozen "
    r"|[/\\]\.?venv[/\\]lib[/\\]|^<(?:string|stdin|frozen)"
)
_JVM_LIBRARY = (
    "java.",
    "javax.",
    "jakarta.",
    "sun.",
    "jdk.",
    "com.sun.",
    "kotlin.",
    "kotlinx.",
    "scala.",
    "akka.",
    "org.springframework.",
    "org.apache.",
    "org.junit.",
    "junit.",
    "org.hibernate.",
    "io.netty.",
    "reactor.",
    "org.eclipse.",
    "com.google.common.",
    "com.google.inject.",
    "com.google.protobuf.",
    "com.google.gson.",
    "org.gradle.",
    "org.mockito.",
    "net.bytebuddy.",
    "com.fasterxml.",
    "ch.qos.logback.",
    "org.slf4j.",
    "io.grpc.",
    "io.micrometer.",
    "org.aspectj.",
    "com.zaxxer.",
    "org.postgresql.",
    "com.mysql.",
    "okhttp3.",
    "retrofit2.",
    "io.reactivex.",
    "groovy.",
    "org.codehaus.",
    "org.testng.",
    "org.glassfish.",
    "org.jboss.",
    "io.undertow.",
    "org.h2.",
    "android.",
    "androidx.",
    "dalvik.",
    "com.android.",
    "io.vertx.",
    "io.quarkus.",
    "io.micronaut.",
    "org.opentest4j.",
    "org.assertj.",
    "org.hamcrest.",
    "worker.org.gradle.",
    "System.",
    "Microsoft.",  # .NET prints its frames the same way: "at Ns.Type.Method()"
)
_GO_STD = frozenset(
    re.findall(
        r"\S+",
        "archive bufio builtin bytes cmp compress container context crypto database debug "
        "embed encoding errors expvar flag fmt go hash html image index internal io iter log "
        "maps math mime net os path plugin reflect regexp runtime slices sort strconv strings "
        "structs sync syscall testing text time unicode unique unsafe vendor weak",
    )
)  # the standard library's top-level packages


class PartKind(Enum):
    MESSAGE = "message"  # an exception's type and message (first line)
    DETAIL = "detail"  # the lines that continue a message
    FRAME = "frame"  # a kept frame: user code, or asked for
    FRAMES = "frames"  # a run of other frames
    SOURCE = "source"  # Node's ``file:line``, source line and caret before the error
    GLUE = "glue"  # headers and chain markers
    GOROUTINE = "goroutine"  # a Go goroutine other than the panicking one


@dataclass(frozen=True, slots=True)
class Frame:
    start: int
    end: int
    user: bool
    counted: bool = True  # False for "... 23 more" and the like: no frame of its own


@dataclass(frozen=True, slots=True)
class Raised:
    """One exception of a chain: its lines ``[start, end)`` (the first is the type and
    message), its frames innermost first, and its role: 0 the one raised last (the
    outermost), 1 the root cause, 2 any between or suppressed."""

    start: int
    end: int
    frames: tuple[Frame, ...]
    role: int


@dataclass(frozen=True, slots=True)
class Goroutine:
    start: int
    end: int
    user: bool


@dataclass(frozen=True, slots=True)
class Trace:
    start: int
    end: int
    language: str
    exceptions: tuple[Raised, ...]
    goroutines: tuple[Goroutine, ...] = ()
    source: tuple[int, int] | None = None  # Node's source excerpt before the error line

    def signature(self, lines: list[str]) -> str:
        """Equal for traces that repeat one another (Go's addresses and counts aside)."""
        kept = [lines[e.start] for e in self.exceptions if e.end > e.start]
        for exception in self.exceptions:
            kept.extend(lines[f.start] for f in exception.frames)
        joined = "\n".join(kept)
        return _GO_NUMBERS.sub("#", joined) if self.language == "go" else joined


@dataclass(frozen=True, slots=True)
class Part:
    """Lines ``[start, end)`` of a trace. ``order``: a MESSAGE's role, a FRAME's depth
    among the kept frames of its exception (0 innermost), a DETAIL's chunk (0 first).
    ``role``: the exception a MESSAGE, DETAIL or FRAME belongs to. ``count``: the frames of
    a FRAMES run. ``user``: a GOROUTINE holds user frames."""

    start: int
    end: int
    kind: PartKind
    order: int = 0
    role: int = 0
    count: int = 1
    user: bool = False


def find_traces(lines: list[str], start: int = 0, end: int | None = None) -> list[Trace]:
    """The traces among ``lines[start:end]``, in order, none overlapping."""
    end = len(lines) if end is None else end
    found: list[Trace] = []
    floor = start  # a trace may not reach back past the end of the one before
    i = start
    while i < end:
        line = lines[i]
        trace: Trace | None = None
        if "Traceback (most recent call last)" in line:
            trace = _python(lines, i, end)
        elif line.startswith(("panic: ", "fatal error: ", "SIG", "unexpected fault", "goroutine ")):
            trace = _go(lines, i, end)
        elif line.startswith((" ", "\t")) and line.lstrip().startswith("at "):
            trace = _jvm_or_node(lines, i, floor, end)
        if trace is None:
            i += 1
            continue
        found.append(trace)
        i = floor = trace.end
    return found


def trace_at(lines: list[str], i: int, end: int) -> Trace | None:
    """The trace whose first line is ``lines[i]``, if one is."""
    line = lines[i]
    if "Traceback (most recent call last)" in line:
        return _python(lines, i, end)
    if line.startswith(("panic: ", "fatal error: ", "SIG", "unexpected fault", "goroutine ")):
        return _go(lines, i, end)
    for first in (i, i + 1):
        if first < end and lines[first][:1] in (" ", "\t") and lines[first].lstrip()[:3] == "at ":
            trace = _jvm_or_node(lines, first, i, end)
            return trace if trace is not None and trace.start == i else None
    return None


def parts(
    trace: Trace, lines: list[str], *, num_kept: int, keep: Callable[[str], bool] | None = None
) -> list[Part]:
    """The trace's lines cut into parts, in order. Each exception keeps its ``num_kept``
    innermost user frames (its innermost frame where the trace holds no user code) and
    any frame ``keep`` asks for; the other frames fold into FRAMES runs."""
    kinds: dict[int, Part] = {}  # first line of a part -> the part
    # A trace with no user frame at all keeps each exception's innermost frame instead.
    fallback = not any(f.user for e in trace.exceptions for f in e.frames)
    for exception in trace.exceptions:
        if exception.end > exception.start:
            kinds[exception.start] = Part(
                exception.start,
                exception.start + 1,
                PartKind.MESSAGE,
                exception.role,
                exception.role,
            )
            detail_end = min(exception.end, exception.start + 1 + _DETAIL)
            for chunk, (a, b) in enumerate(
                ((exception.start + 1, detail_end), (detail_end, exception.end))
            ):
                if b > a:
                    kinds[a] = Part(a, b, PartKind.DETAIL, chunk, exception.role)
        kept = [f for f in exception.frames if f.user and f.counted][:num_kept]
        if fallback and num_kept and exception.frames and exception.frames[0].counted:
            kept = [exception.frames[0]]
        depth = {f.start: d for d, f in enumerate(kept)}
        extra = len(kept)
        for frame in exception.frames:
            if frame.start in depth:
                order = depth[frame.start]
            elif keep is not None and keep("\n".join(lines[frame.start : frame.end])):
                order, extra = extra, extra + 1
            else:
                kinds[frame.start] = Part(
                    frame.start, frame.end, PartKind.FRAMES, 0, 0, int(frame.counted)
                )
                continue
            kinds[frame.start] = Part(frame.start, frame.end, PartKind.FRAME, order, exception.role)
    for goroutine in trace.goroutines:
        kinds[goroutine.start] = Part(
            goroutine.start, goroutine.end, PartKind.GOROUTINE, user=goroutine.user
        )
    if trace.source is not None:
        kinds[trace.source[0]] = Part(*trace.source, PartKind.SOURCE)
    out: list[Part] = []
    i = trace.start
    while i < trace.end:
        part = kinds.get(i)
        if part is None:  # glue, up to the next part
            j = i + 1
            while j < trace.end and j not in kinds:
                j += 1
            if any(lines[k].strip() for k in range(i, j)):
                out.append(Part(i, j, PartKind.GLUE))
            i = j
            continue
        if part.kind is PartKind.FRAMES and out and out[-1].kind is PartKind.FRAMES:
            last = out.pop()  # adjacent runs are one run
            part = Part(last.start, part.end, PartKind.FRAMES, count=last.count + part.count)
        out.append(part)
        i = part.end
    return [Part(p.start, p.end, p.kind, count=1) if p.count < 1 else p for p in out]


def _python(lines: list[str], head: int, end: int) -> Trace | None:
    found = _PY_HEAD.fullmatch(lines[head])
    if found is None:
        return None
    prefix = found.group(1)
    if prefix.strip() and not (
        head + 1 < end
        and lines[head + 1].startswith(prefix)
        and _PY_FRAME.match(lines[head + 1][len(prefix) :])
    ):
        return None  # quoted in prose, or each line under its own prefix (a timestamp)

    def body(k: int) -> str | None:
        line = lines[k]
        return line[len(prefix) :] if line.startswith(prefix) else None

    printed: list[tuple[int, int, list[Frame]]] = []  # (message start, end, frames)
    i = head
    while True:
        i += 1
        frames: list[Frame] = []
        while i < end and (text := body(i)) is not None:
            framed = _PY_FRAME.match(text)
            if framed is None and not (text.startswith("  ") and text.strip()):
                break
            j = i + 1
            while j < end and (more := body(j)) is not None and more.startswith("    "):
                if _PY_FRAME.match(more):
                    break
                j += 1
            if framed is None:  # "[Previous line repeated 996 more times]", groups
                frames.append(Frame(i, j, False, counted=False))
            else:
                frames.append(Frame(i, j, _PY_LIBRARY.search(framed.group(1)) is None))
            i = j
        if not frames:
            return None if not printed else _python_trace(printed, head, i)
        start = i
        text = body(i) if i < end else None
        if text is not None and text.strip() and _PY_EXCEPTION.fullmatch(text.split(":", 1)[0]):
            i = _message_end(lines, i + 1, end, body)
        printed.append((start, i, frames))
        j = i
        while j < end and not lines[j].strip():
            j += 1
        if j < end and (text := body(j)) is not None and _PY_CHAIN.fullmatch(text):
            k = j + 1
            while k < end and not lines[k].strip():
                k += 1
            if k < end and (text := body(k)) is not None and text.startswith("Traceback ("):
                i = k
                continue
        return _python_trace(printed, head, i)


def _python_trace(printed: list[tuple[int, int, list[Frame]]], head: int, end: int) -> Trace:
    last = len(printed) - 1  # Python prints the root cause first, the one raised last
    exceptions = tuple(
        Raised(a, b, tuple(reversed(frames)), 0 if k == last else 1 if k == 0 else 2)
        for k, (a, b, frames) in enumerate(printed)
    )
    return Trace(head, end, "python", exceptions)


def _message_end(lines: list[str], i: int, end: int, body: Callable[[int], str | None]) -> int:
    """Where a Python exception's message ends: at a blank line, a log entry or another
    trace; a message that runs on past ``_MAX_MESSAGE`` lines is its first line alone."""
    start = i
    while i < end and i - start < _MAX_MESSAGE:
        text = body(i)
        if text is None or not text.strip() or _LOG_START.match(text):
            return i
        if "Traceback (most recent" in text or _PY_CHAIN.fullmatch(text):
            return i
        i += 1
    return i if i == end else start


def _jvm_or_node(lines: list[str], first: int, floor: int, end: int) -> Trace | None:
    jvm = _JVM_FRAME.fullmatch(lines[first]) is not None
    if not jvm and _JS_FRAME.fullmatch(lines[first]) is None:
        return None
    several = first + 1 < end and _is_frame(lines[first + 1], jvm)
    header = _header(lines, first, floor, guess=several)
    if header is None and not several:
        return None  # one "at ..." line with no exception before it: not a trace
    start = first if header is None else header
    segments: list[tuple[int, int, list[Frame]]] = []
    message = (start, first)
    frames: list[Frame] = []
    i = first
    while i < end:
        line = lines[i]
        if _is_frame(line, jvm):
            frames.append(Frame(i, i + 1, _user_frame(line, jvm)))
        elif _ELIDED_FRAMES.fullmatch(line):
            frames.append(Frame(i, i + 1, False, counted=False))
        elif jvm and _CAUSE.fullmatch(line):
            segments.append((*message, frames))
            j = i + 1  # a cause's message may run over lines before its first frame
            while j < end and j - i <= _MAX_HEADER_GAP and lines[j].strip():
                if _is_frame(lines[j], jvm) or _ELIDED_FRAMES.fullmatch(lines[j]):
                    break
                j += 1
            message, frames = (i, j), []
            i = j
            continue
        else:
            break
        i += 1
    segments.append((*message, frames))
    last = len(segments) - 1  # the JVM prints the outermost first, its causes after
    exceptions = tuple(
        Raised(a, b, tuple(fs), 0 if k == 0 else 1 if k == last else 2)
        for k, (a, b, fs) in enumerate(segments)
    )
    source = None if jvm or header is None else _node_source(lines, header, floor)
    if source is not None:
        start = source[0]
    return Trace(start, i, "java" if jvm else "node", exceptions, source=source)


def _is_frame(line: str, jvm: bool) -> bool:
    return (_JVM_FRAME if jvm else _JS_FRAME).fullmatch(line) is not None


def _header(lines: list[str], first: int, floor: int, *, guess: bool) -> int | None:
    """The exception line above a run of frames: the nearest line naming an exception
    (its message may run over the lines between), else (``guess``) the line just above."""
    k = first - 1
    while k >= floor and first - k <= _MAX_HEADER_GAP and lines[k].strip():
        if _EXCEPTION_NAME.match(lines[k], 0, _NAME_CHARS):
            return k
        k -= 1
    above = first - 1
    if guess and above >= floor and lines[above].strip() and lines[above][0] not in " \t":
        return above
    return None


def _node_source(lines: list[str], header: int, floor: int) -> tuple[int, int] | None:
    """Node's ``/app/a.js:12``, the source line and its caret, printed before the error."""
    k = header - 1
    while k >= floor and not lines[k].strip():
        k -= 1
    if k - 2 >= floor and _CARET.fullmatch(lines[k]) and _JS_SOURCE.fullmatch(lines[k - 2]):
        return (k - 2, header)
    return None


def _user_frame(line: str, jvm: bool) -> bool:
    if jvm:
        found = _JVM_FRAME.fullmatch(line)
        assert found is not None
        where, file = found.group(1).rsplit("/", 1)[-1], found.group(2)
        if file in ("Native Method", "<generated>", "Unknown Source") or "$$" in where:
            return False
        return not where.startswith(_JVM_LIBRARY)
    found = _JS_FRAME.fullmatch(line)
    assert found is not None
    where = found.group(1) or found.group(2)
    return (
        "node_modules" not in where
        and not where.startswith(("node:", "internal/", "<anonymous>", "native", "index "))
        and where != "unknown location"
    )


def _go(lines: list[str], start: int, end: int) -> Trace | None:
    i = start
    message_end = start
    if _GO_START.match(lines[start]):
        i = start + 1
        while i < end and i - start < _MAX_MESSAGE and lines[i].strip():
            if _GOROUTINE.fullmatch(lines[i]):
                break
            i += 1
        message_end = i
        while i < end and not lines[i].strip():
            i += 1
    elif not _GOROUTINE.fullmatch(lines[start]):
        return None
    blocks: list[tuple[int, int, list[Frame]]] = []
    while i < end and _GOROUTINE.fullmatch(lines[i]):
        block_start = i
        i += 1
        frames: list[Frame] = []
        while i < end:
            if _GO_ELIDED.fullmatch(lines[i].strip()):
                frames.append(Frame(i, i + 1, False, counted=False))
                i += 1
            elif i + 1 < end and (file := _GO_FILE.fullmatch(lines[i + 1])) is not None:
                if lines[i].startswith(("\t", " ")) or not lines[i].strip():
                    break
                frames.append(Frame(i, i + 2, _go_user(lines[i], file.group(1))))
                i += 2
            else:
                break
        if not frames:
            break
        blocks.append((block_start, i, frames))
        j = i
        while j < end and not lines[j].strip():
            j += 1
        if j < end and _GOROUTINE.fullmatch(lines[j]):
            i = j
        else:
            break
    if not blocks:
        return None
    first = blocks[0]
    exceptions = (Raised(start, message_end, tuple(first[2]), 0),)
    goroutines = tuple(Goroutine(a, b, any(f.user for f in fs)) for a, b, fs in blocks[1:])
    return Trace(start, blocks[-1][1], "go", exceptions, goroutines)


def _go_user(function: str, path: str) -> bool:
    if "/pkg/mod/" in path or "/vendor/" in path or "/src/runtime/" in path:
        return False
    name = function.removeprefix("created by ").split("(", 1)[0]
    top = name.split("/", 1)[0].split(".", 1)[0]
    return top not in _GO_STD
