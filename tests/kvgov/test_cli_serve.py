"""``kvgov serve``: what it prints before it listens, and a real server process started
with ``python -m kvgov.serve`` that checks keys and exits cleanly on Ctrl-C."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest
from typer.testing import CliRunner, Result

from governor.backend import BackendCapacity
from kvgov.cli import app
from kvgov.cli.serve import startup_lines
from kvgov.serve import ServeSettings
from tests.kvgov.serve.api_support import kept_logging

CAP = BackendCapacity(
    block_size=16,
    num_blocks=64,
    num_free_blocks=64,
    num_pinned_blocks=0,
    bytes_per_block=32_768,
    max_model_len=32_768,
)


def _int8_weights_mib() -> float:
    """The tiny-random preset's weights with int8 projections, built here as the server
    builds them (random values: only the sizes matter)."""
    from engine.attention import ReferenceAttention
    from engine.models import LlamaForCausalLM
    from engine.presets import get_preset
    from engine.quantization import WeightQuantization
    from engine.weights import weights_nbytes

    model = LlamaForCausalLM(
        get_preset("tiny-random").config,
        attention=ReferenceAttention(),
        device="cpu",
        quantization=WeightQuantization.INT8,
    )
    return weights_nbytes(model) / 2**20


def test_startup_lines_say_address_model_capacity_and_security() -> None:
    lines = startup_lines(ServeSettings(api_keys=("sk-secret", "sk-other")), "tiny-random", CAP)
    text = "\n".join(lines)
    assert "http://127.0.0.1:8000" in lines[0]
    assert "model: tiny-random, context 32,768 tokens" in text
    assert "64 blocks of 16 tokens = 1,024 tokens, 2.0 MiB (32,768 bytes per block)" in text
    assert "2 API key(s)" in text and "sk-secret" not in text and "WARNING" not in text


def test_startup_lines_say_how_much_host_swap_and_why() -> None:
    """A real engine's host swap: sized from tiny-random (its 32,768-token context), or
    set by --swap-space (the CLI's wiring is checked in the served process below)."""
    from backends.local.backend import LocalBackend
    from engine.host_swap import SwapSizing

    with LocalBackend(config={"num_blocks": 16, "device": "cpu"}) as backend:
        swap = backend.host_swap
        lines = startup_lines(ServeSettings(), "tiny-random", CAP, host_swap=swap)
    assert swap.sizing is SwapSizing.MODEL
    (line,) = [line for line in lines if line.startswith("host swap: ")]
    assert line.startswith(
        "host swap: 2,048 blocks of 16 tokens = 32,768 tokens, 64.0 MiB (sized from the "
        "model: 32,768 tokens, the larger of 32,768 and its context, at 2,048 bytes a token)"
    )
    assert not any(
        line.startswith("host swap") for line in startup_lines(ServeSettings(), "m", CAP)
    )


def test_a_swap_space_that_is_no_size_is_refused() -> None:
    result = CliRunner().invoke(app, ["serve", "--swap-space", "plenty"])
    assert result.exit_code == 2 and "cannot read a size from 'plenty'" in result.output


def test_listening_beyond_loopback_without_a_key_warns() -> None:
    open_lines = startup_lines(ServeSettings(host="0.0.0.0"), "m", CAP)
    assert open_lines[-1].startswith("WARNING: listening on 0.0.0.0 without an API key")
    keyed = startup_lines(ServeSettings(host="0.0.0.0", api_keys=("k",)), "m", CAP)
    assert not any(line.startswith("WARNING") for line in keyed)
    loopback = startup_lines(ServeSettings(host="::1"), "m", CAP)
    assert "http://[::1]:8000" in loopback[0] and not loopback[-1].startswith("WARNING")


def test_num_blocks_and_kv_budget_exclude_each_other() -> None:
    result = CliRunner().invoke(app, ["serve", "--num-blocks", "8", "--kv-budget", "1MiB"])
    assert result.exit_code == 2 and "not both" in result.output


def test_python_m_kvgov_serve_serves_with_keys_and_stops_on_ctrl_c() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "KVGOV_API_KEY": "sk-env-key"}
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kvgov.serve",
            "--num-blocks",
            "16",
            "--port",
            str(port),
            "--device",
            "cpu",
            "--quantize",
            "int8",
            "--swap-space",
            "8MiB",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            assert process.poll() is None, process.communicate()[0]
            assert time.monotonic() < deadline, "the server did not come up"
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        assert httpx.get(f"{url}/v1/models").status_code == 401
        models = httpx.get(f"{url}/v1/models", headers={"Authorization": "Bearer sk-env-key"})
        assert models.json()["data"][0]["id"] == "tiny-random"
    finally:
        process.send_signal(signal.SIGINT)
        output, _ = process.communicate(timeout=60)
    assert process.returncode == 0, output
    assert f"kvgov serve: http://127.0.0.1:{port}" in output
    assert "KV cache: 16 blocks of 16 tokens = 256 tokens" in output
    # --quantize reaches the engine: the weights it reports are the int8 model's.
    (weights,) = [line for line in output.splitlines() if line.startswith("weights: ")]
    assert weights.endswith("MiB (int8 weight-only, group-wise scales)")
    assert float(weights.split()[1].replace(",", "")) == pytest.approx(
        _int8_weights_mib(), abs=0.05
    )
    assert "1 API key(s)" in output and "sk-env-key" not in output
    assert (
        "host swap: 256 blocks of 16 tokens = 4,096 tokens, 8.0 MiB (set by --swap-space)" in output
    )


def test_admin_api_keys_are_api_keys_that_may_pin_shared(monkeypatch: pytest.MonkeyPatch) -> None:
    import uvicorn

    served: list[ServeSettings] = []
    monkeypatch.setattr(
        uvicorn.Server, "run", lambda self, **_: served.append(self.config.app.settings)
    )
    monkeypatch.delenv("KVGOV_API_KEY", raising=False)
    monkeypatch.delenv("KVGOV_API_KEYS", raising=False)
    args = ["serve", "--num-blocks", "8", "--api-key", "sk-user", "--admin-api-key", "sk-admin"]
    with kept_logging():
        result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    (settings,) = served
    assert (settings.api_keys, settings.admin_api_keys) == (("sk-user", "sk-admin"), ("sk-admin",))
    assert "2 API key(s)" in result.output and "1 may pin prefixes shared" in result.output


def test_quantize_takes_int8_or_int4() -> None:
    result = CliRunner().invoke(app, ["serve", "--quantize", "int2"])
    assert result.exit_code == 2 and "--quantize takes int8 or int4" in result.output


def test_kv_budget_sizes_the_engines_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    """``kvgov serve --kv-budget`` run in process with a real uvicorn server on a thread
    (the command's own ``server.run``, recorded so the test can stop it): the engine's
    pool, read over HTTP, is the budget in whole blocks, not the CPU's 256 MiB default."""
    import uvicorn

    from engine.presets import get_preset

    servers: list[uvicorn.Server] = []
    run = uvicorn.Server.run

    def recorded(self: uvicorn.Server, *args: object, **kwargs: object) -> None:
        servers.append(self)
        run(self, *args, **kwargs)

    monkeypatch.setattr(uvicorn.Server, "run", recorded)
    monkeypatch.delenv("KVGOV_API_KEY", raising=False)
    monkeypatch.delenv("KVGOV_API_KEYS", raising=False)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    budget = int(3.6 * 2**20)  # 3.6 MiB: 115 blocks and a part of one
    args = ["serve", "--kv-budget", "3.6MiB", "--port", str(port), "--device", "cpu"]
    results: list[Result] = []
    command = threading.Thread(target=lambda: results.append(CliRunner().invoke(app, args)))
    url = f"http://127.0.0.1:{port}"
    with kept_logging():
        command.start()
        try:
            deadline = time.monotonic() + 60
            while not (servers and servers[0].started and _healthy(url)):
                assert command.is_alive(), results[0].output if results else "no result"
                assert time.monotonic() < deadline, "the server did not come up"
                time.sleep(0.05)
            capacity = httpx.get(f"{url}/kvgov/v1/capacity", timeout=10).json()
        finally:
            for server in servers:
                server.should_exit = True
            command.join(timeout=30)
    assert not command.is_alive() and results[0].exit_code == 0, results[0].output
    config = get_preset("tiny-random").config
    # K and V, every layer, fp32 on a CPU, 16 tokens a block
    per_block = 2 * config.num_layers * config.num_kv_heads * config.head_dim * 4 * 16
    assert capacity["bytes_per_block"] == per_block
    assert capacity["num_blocks"] == budget // per_block == 115
    blocks = f"{capacity['num_blocks']} blocks of 16 tokens"
    assert f"KV cache: {blocks}" in results[0].output


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    except httpx.TransportError:
        return False
