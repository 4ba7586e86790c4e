"""A real llama.cpp ``llama-server`` for tests: a tiny random-weight GGUF model written with
the ``gguf`` package, and the server process on a free loopback port.

The model is a 2-layer llama (F32 tensors, 64-wide) with a SentencePiece-style (``llama``)
vocabulary: ``<unk>``, ``<s>``, ``</s>``, the 256 ``<0xNN>`` byte tokens and a few hundred
word pieces, and a plain chat template. Its replies are random tokens; what the tests
check is the server's bookkeeping (slots, context, cached tokens), never the text.

The binary is found through ``KVGOV_LLAMA_SERVER`` or ``llama-server`` on ``PATH``;
``llama_server_binary()`` is None without it. ``need_llama_server()`` is what a test calls:
the binary, else a skip that says how to provide it, except under CI (``CI`` set), where
a missing binary fails the test: a CI run that skipped them would pass having tested no
llama.cpp server at all.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.serve_process import free_port

SKIP_REASON = (
    "llama-server (llama.cpp) is not installed: set KVGOV_LLAMA_SERVER to its binary or put "
    "it on PATH to run the tests against a real llama.cpp server"
)
CI_REASON = (
    "; CI must run them: set KVGOV_LLAMA_SERVER to a llama-server binary (.ci/run sets it "
    "where the workspace keeps a build beside the checkout; llama.cpp's CPU build of "
    "llama-server serves)"
)
_START_TIMEOUT_S = 60.0
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
_WORDS: Any = """the a of to and in is it for on that with as was be by this are or from at an
not agent test tool call file line error fail pass plan merge worker find read write run
code model token memory block slot server client request answer turn user system"""
_WORDS = _WORDS.split()


def llama_server_binary() -> str | None:
    found = os.environ.get("KVGOV_LLAMA_SERVER") or shutil.which("llama-server")
    return found if found and os.access(found, os.X_OK) else None


def need_llama_server() -> str:
    """The llama-server binary; without one, skip (fail under CI) saying how to provide it."""
    found = llama_server_binary()
    if found is not None:
        return found
    if os.environ.get("CI"):
        pytest.fail(SKIP_REASON + CI_REASON, pytrace=False)
    pytest.skip(SKIP_REASON)


def write_tiny_gguf(path: Path, *, context_length: int = 4096, seed: int = 0) -> Path:
    import gguf
    import numpy as np

    rng = np.random.default_rng(seed)
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    types += [gguf.TokenType.BYTE] * 256
    letters = set("abcdefghijklmnopqrstuvwxyz")
    pieces = sorted({"\u2581" + w for w in _WORDS} | set(_WORDS) | letters)
    pieces += ["\u2581", "<|", "|>", "user", "assistant", "system", ":", ".", "\n"]
    pieces = list(dict.fromkeys(pieces))
    tokens += pieces
    types += [gguf.TokenType.NORMAL] * len(pieces)
    scores = [0.0] * 259 + [-float(i) for i in range(len(pieces))]
    n_vocab, n_embd, n_ff, n_head, n_layer = len(tokens), 64, 128, 4, 2

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(context_length)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head)
    writer.add_rope_dimension_count(n_embd // n_head)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(True)
    writer.add_chat_template(CHAT_TEMPLATE)

    def tensor(name: str, *shape: int) -> None:
        writer.add_tensor(name, (rng.standard_normal(shape) * 0.02).astype(np.float32))

    tensor("token_embd.weight", n_vocab, n_embd)
    writer.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    tensor("output.weight", n_vocab, n_embd)
    for i in range(n_layer):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
        for part in ("q", "k", "v", "output"):
            tensor(f"blk.{i}.attn_{part}.weight", n_embd, n_embd)
        tensor(f"blk.{i}.ffn_gate.weight", n_ff, n_embd)
        tensor(f"blk.{i}.ffn_up.weight", n_ff, n_embd)
        tensor(f"blk.{i}.ffn_down.weight", n_embd, n_ff)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


class LlamaServer:
    """``llama-server`` serving ``model`` on a free loopback port; ``start``/``stop``."""

    def __init__(self, binary: str, model: Path, *, args: Sequence[str] = ()) -> None:
        self.binary = binary
        self.model = model
        self.args = list(args)
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the server

    def start(self) -> None:
        command = [self.binary, "-m", str(self.model), "--host", "127.0.0.1"]
        command += ["--port", str(self.port), "-t", "1", "--no-webui", *self.args]
        self.process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + _START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"llama-server exited:\n{self.output()}")
            try:
                if httpx.get(f"{self.base_url}/health", timeout=1.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        self.stop()
        raise TimeoutError(f"llama-server did not answer /health within {_START_TIMEOUT_S} s")

    def kill(self) -> None:
        assert self.process is not None
        self.process.kill()
        self.process.wait(timeout=10)

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
def llama_server(binary: str, model: Path, *, args: Sequence[str] = ()) -> Iterator[LlamaServer]:
    server = LlamaServer(binary, model, args=args)
    server.start()
    try:
        yield server
    finally:
        server.stop()
        server.log.close()
