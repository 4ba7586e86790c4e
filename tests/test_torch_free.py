"""The governor core runs without torch: ``governor``, ``policies``, ``backends`` (
``LocalBackend``'s module, ``RemoteBackend`` and the wire models included) and
``integrations`` import, and a governed call runs, in a
Python where torch and the engine cannot be imported at all, as on an agent-runtime box
that installed plain ``kvgov`` and talks to ``kvgov serve`` elsewhere.

A subprocess, so that this interpreter's torch (imported by other tests) cannot hide an
import: a meta-path finder placed first refuses ``torch`` and ``engine``, and the modules
loaded at the end are checked for either.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_CHECK = r"""
import asyncio, importlib, pkgutil, sys

BLOCKED = ("torch", "engine")


class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"{name} is not installed here (blocked by the test)")
        return None


sys.meta_path.insert(0, Refuse())

names = []
for package in ("offline", "governor", "policies", "backends", "integrations"):
    module = importlib.import_module(package)
    names.append(package)
    for info in pkgutil.walk_packages(module.__path__, prefix=package + "."):
        if ".benchmarks" in info.name:
            continue  # benchmarks compare against the bundled engine: they need it
        importlib.import_module(info.name)
        names.append(info.name)
assert {"backends.local.backend", "backends.remote.backend", "backends.remote.wire"} <= set(names)

from governor import AgentSpec, Governor
from governor.testing import FakeBackend

governor = Governor(FakeBackend(), agents=[AgentSpec(name="agent", ceiling_tokens=400)])
with governor.lease("agent") as lease:
    result = governor.complete(lease, [{"role": "user", "content": "hi"}], max_tokens=3)
assert result.completion_tokens == 3, result


async def main():
    async with governor.lease("agent") as lease:
        return await governor.acomplete(lease, [{"role": "user", "content": "hi"}], max_tokens=2)


assert asyncio.run(main()).completion_tokens == 2

loaded = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
assert not loaded, loaded
print(len(names), "modules")
"""


def test_the_governor_core_imports_and_runs_without_torch() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _CHECK],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.strip().endswith("modules")
