"""``ServeChild``: one engine in a child process, served over HTTP as ``kvgov serve`` serves
it and called in process there too, so that ``kvgov bench serve`` can time the same
request both ways against the same engine in the same state.

The child (``python -m kvgov.benchmarks.serve_child``) builds one ``LocalBackend``, puts it
behind the app ``kvgov serve`` runs (``LoadingApp`` around ``create_app``, under uvicorn
with ``kvgov serve``'s own settings: its access log, httptools and uvloop) on a thread, and
answers the parent's commands on a pipe in its main thread: ``generate`` runs
``LocalBackend.generate`` there and sends back the result and the time it took, measured
in the child, so the pipe's own latency is in neither side's time. The parent sends its
HTTP calls to ``base_url`` from its own process, as an agent runtime would.

Why the client lives in another process: ``kvgov serve``'s event loop already shares a
GIL with its engine thread; a client in that process too would add its own hand-offs of
that GIL (each may wait for the holder's switch interval) to every call. That can only
make the served calls slower, so an in-process server would overstate what HTTP costs.
The in-process calls here run while the server's event loop idles in ``epoll``, holding
no GIL, as a ``LocalBackend`` in an agent runtime's process runs beside its other threads.

The lifecycle (spawn, ``wait_ready``, stop on any exit) is ``ServerProcess``'s.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection, Pipe
from typing import TYPE_CHECKING

from governor import GenerationRequest, GenerationResult
from kvgov.benchmarks.server_process import ServerProcess

if TYPE_CHECKING:
    from kvgov.serve.loading import LoadingApp

__all__ = ["LocalCall", "ServeChild"]

_MODULE = "kvgov.benchmarks.serve_child"
_CALL_TIMEOUT_S = 300.0  # one model call on a loaded 2-core host, generously


@dataclass(frozen=True, slots=True)
class LocalCall:
    """A ``LocalBackend.generate`` call in the child: its result, its time, and the
    instance id of the server whose engine ran it (the same engine the HTTP calls reach)."""

    result: GenerationResult
    elapsed_s: float
    instance_id: str


class ServeChild(ServerProcess):
    """``with ServeChild(model=..., num_blocks=..., threads=...) as child:``, then
    ``child.wait_ready()``; HTTP calls go to ``child.base_url``, in-process ones through
    ``child.local_generate(request)``."""

    def __init__(self, *, model: str, num_blocks: int, threads: int, device: str = "cpu") -> None:
        super().__init__(model=model, num_blocks=num_blocks, threads=threads, device=device)
        self._conn: Connection | None = None
        self._child_conn: Connection | None = None

    def command(self) -> list[str]:
        assert self._child_conn is not None
        flags = {
            "--model": self.model,
            "--port": str(self.port),
            "--num-blocks": str(self.num_blocks),
            "--device": self.device,
            "--control-fd": str(self._child_conn.fileno()),
        }
        return [sys.executable, "-m", _MODULE, *(part for flag in flags.items() for part in flag)]

    def spawn(self) -> None:
        self._conn, self._child_conn = Pipe()
        try:
            self.spawn_with(pass_fds=(self._child_conn.fileno(),))
        finally:
            self._child_conn.close()  # the child holds its own copy

    def local_generate(self, request: GenerationRequest) -> LocalCall:
        """``LocalBackend.generate(request)`` in the child, on the engine it serves."""
        assert self._conn is not None, "spawn() first"
        self._conn.send(("generate", request))
        if not self._conn.poll(_CALL_TIMEOUT_S):
            raise TimeoutError(f"the child did not answer a local call in {_CALL_TIMEOUT_S:g} s")
        answer = self._conn.recv()
        if isinstance(answer, BaseException):
            raise answer
        assert isinstance(answer, LocalCall)
        return answer

    def stop(self) -> None:
        if self._conn is not None:
            self._conn.close()  # the child's loop ends on EOF; terminate() follows anyway
            self._conn = None
        super().stop()


# -- the child ------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> None:
    import uvicorn

    from backends import LocalBackend
    from kvgov.cli.serve import uvicorn_config
    from kvgov.serve.loading import LoadingApp
    from kvgov.serve.settings import ServeSettings

    parser = argparse.ArgumentParser(prog=_MODULE)
    parser.add_argument("--model", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--num-blocks", type=int, required=True)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--control-fd", type=int, required=True)
    args = parser.parse_args(argv)
    conn = Connection(args.control_fd)
    config = {"model": args.model, "num_blocks": args.num_blocks, "device": args.device}
    settings = ServeSettings(port=args.port)
    loading = LoadingApp(settings, lambda: LocalBackend(config=config))
    server = uvicorn.Server(uvicorn_config(loading, host=settings.host, port=args.port))
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    loading.start()
    thread.start()
    try:
        _answer(conn, loading)
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        loading.close()


def _answer(conn: Connection, loading: LoadingApp) -> None:
    while True:
        try:
            kind, request = conn.recv()
        except EOFError:  # the parent is done
            return
        backend = loading.backend
        try:
            if kind != "generate" or backend is None:
                raise RuntimeError(f"cannot run {kind!r} (engine loaded: {backend is not None})")
            started = time.perf_counter()
            result = backend.generate(request)
            elapsed = time.perf_counter() - started
            instance = loading.instance_id or ""
            conn.send(LocalCall(result=result, elapsed_s=elapsed, instance_id=instance))
        except Exception as exc:  # handed to the parent, which raises it
            conn.send(exc)


if __name__ == "__main__":
    # Through the module's own name, so that what the child pickles (``LocalCall``) names
    # a module the parent can import, not ``__main__``.
    from kvgov.benchmarks.serve_child import main as _main

    _main()
