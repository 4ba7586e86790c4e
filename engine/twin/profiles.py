"""Device profiles: what a device can do, taken from its vendor's published specification,
and the efficiency factors the step-time model fits on top of it.

A profile is a frozen value. Every figure that is not fitted is published, and has a
``Source`` naming the vendor page and the figure read from it; ``fitted`` names every field
that is not published: fitted from a measured step-time grid (``kvgov twin fit``), or
assumed until one is (its source says which). Where a vendor gives throughput "with
sparsity" only, the profile holds the dense figure, half of it, and the source says so.
``cpu-here`` is all placeholder until ``kvgov twin fit`` writes a fitted profile file on
the machine it describes; ``load_profile`` reads that file back.

Errors (caller input)::

    InvalidRequestError (engine.errors)
    └── ProfileError              a profile that cannot be used
        ├── UnknownProfileError   no shipped profile with that name
        └── ProfileFileError      a profile file missing, not JSON, or of another shape

Torch-free: a GPU's grid is read and fitted on any machine.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from engine.errors import InvalidRequestError

__all__ = [
    "PROFILES",
    "DeviceProfile",
    "ProfileError",
    "ProfileFileError",
    "Source",
    "UnknownProfileError",
    "get_profile",
    "load_profile",
]

GB = 1e9  # vendors quote decimal gigabytes and GB/s
TERA = 1e12

# What the step-time model fits (engine.twin.step_time); before a fit they are assumed.
FACTOR_FIELDS = (
    "compute_efficiency",
    "memory_efficiency",
    "attention_efficiency",
    "step_overhead_s",
    "sequence_overhead_s",
    "token_overhead_s",
    "prefill_context_passes",
)


class ProfileError(InvalidRequestError):
    """A device profile that cannot be used."""


class UnknownProfileError(ProfileError, KeyError):
    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(
            f"no device profile named {name!r}; use one of {', '.join(sorted(PROFILES))}, "
            "or load a fitted profile file with load_profile(path)"
        )

    def __str__(self) -> str:  # KeyError would print the message quoted
        return str(self.args[0])


class ProfileFileError(ProfileError):
    def __init__(self, path: Path, problem: str) -> None:
        self.path = path
        self.problem = problem
        super().__init__(
            f"device profile file {str(path)!r}: {problem}; write it with "
            "DeviceProfile.save(path) (kvgov twin fit does) rather than by hand"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Source:
    """Where one figure of a profile comes from: ``field`` is the profile field it sets,
    ``figure`` the value as the page states it (and how it was converted)."""

    field: str
    title: str
    url: str
    figure: str

    def to_json(self) -> dict[str, str]:
        return {"field": self.field, "title": self.title, "url": self.url, "figure": self.figure}


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceProfile:
    """One device's speed and size. Throughputs are dense (no sparsity) peak operations a
    second; ``None`` where the vendor publishes none for that kind. ``host_link_*`` is the
    link to host memory per direction; ``copies_overlap_compute`` whether the hardware
    copies while it computes (separate copy engines), not whether an engine uses it."""

    name: str
    description: str
    memory_bytes: int
    memory_bandwidth_bytes_s: float
    fp32_flops_s: float
    fp16_flops_s: float  # bf16 and fp16 alike on every shipped device
    int8_ops_s: float | None
    int4_ops_s: float | None
    host_link_bandwidth_bytes_s: float
    host_link_latency_s: float
    copies_overlap_compute: bool
    # The step-time model's factors (see engine.twin.step_time for the formula).
    compute_efficiency: float
    memory_efficiency: float
    attention_efficiency: float
    step_overhead_s: float
    sequence_overhead_s: float
    token_overhead_s: float
    sources: tuple[Source, ...]
    fitted: tuple[str, ...]
    # Last, with a default: profile files written before it existed still load, and a
    # profile that leaves it at 0 predicts what it did before it existed.
    prefill_context_passes: float = 0.0

    def __post_init__(self) -> None:
        names = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(self.fitted) - names) + sorted({s.field for s in self.sources} - names)
        if unknown:
            raise ProfileError(
                f"device profile {self.name!r} names fields it does not have: "
                f"{', '.join(unknown)}; fitted and sources name DeviceProfile fields"
            )
        for name in _POSITIVE_FIELDS:
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ProfileError(
                    f"device profile {self.name!r}: {name} must be a finite positive "
                    f"number, got {value!r}"
                )
        for name in _NON_NEGATIVE_FIELDS:
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ProfileError(
                    f"device profile {self.name!r}: {name} must be finite and not "
                    f"negative, got {value!r}"
                )

    def flops_s(self, bits: int) -> float:
        """Peak dense throughput for operands ``bits`` wide; a kind the device has no
        published figure for runs at the next wider kind it has."""
        for kind_bits, value in ((4, self.int4_ops_s), (8, self.int8_ops_s)):
            if bits <= kind_bits and value is not None:
                return value
        return self.fp16_flops_s if bits <= 16 else self.fp32_flops_s

    def published_fields(self) -> tuple[str, ...]:
        """The figures that come from a vendor's specification, not from a fit."""
        return tuple(
            name
            for name in _FIGURE_FIELDS
            if name not in self.fitted and getattr(self, name) is not None
        )

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data["sources"] = [source.to_json() for source in self.sources]
        data["fitted"] = list(self.fitted)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DeviceProfile:
        fields = dict(data)
        fields["sources"] = tuple(Source(**source) for source in data["sources"])
        fields["fitted"] = tuple(data["fitted"])
        return cls(**fields)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=2) + "\n", encoding="utf-8")


_NON_NEGATIVE_FIELDS = (
    "host_link_latency_s",
    "step_overhead_s",
    "sequence_overhead_s",
    "token_overhead_s",
    "prefill_context_passes",
)
_FIGURE_FIELDS = (
    "memory_bytes",
    "memory_bandwidth_bytes_s",
    "fp32_flops_s",
    "fp16_flops_s",
    "int8_ops_s",
    "int4_ops_s",
    "host_link_bandwidth_bytes_s",
    "host_link_latency_s",
    "copies_overlap_compute",
)
_POSITIVE_FIELDS = (
    "memory_bytes",
    "memory_bandwidth_bytes_s",
    "fp32_flops_s",
    "fp16_flops_s",
    "int8_ops_s",
    "int4_ops_s",
    "host_link_bandwidth_bytes_s",
    "compute_efficiency",
    "memory_efficiency",
    "attention_efficiency",
)


def load_profile(path: str | Path) -> DeviceProfile:
    """A profile written by ``DeviceProfile.save`` (a fitted ``cpu-here``, or a GPU
    profile refitted from a GPU run's grid)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ProfileFileError(path, "no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ProfileFileError(path, f"not readable as JSON ({error})") from None
    if not isinstance(data, dict):
        raise ProfileFileError(path, f"holds a {type(data).__name__}, not a JSON object")
    try:
        return DeviceProfile.from_json(data)
    except ProfileError as error:
        raise ProfileFileError(path, str(error)) from None
    except (TypeError, KeyError) as error:
        raise ProfileFileError(path, f"not a device profile ({error})") from None


def get_profile(name: str) -> DeviceProfile:
    try:
        return PROFILES[name]
    except KeyError:
        raise UnknownProfileError(name) from None


# Until a GPU run's grid refits them, a GPU profile's factors are assumptions, named as such.
_ASSUMED_GPU_FACTORS = {
    "compute_efficiency": 0.6,  # large GEMMs reach 60-80% of dense peak; prefill chunks less
    "memory_efficiency": 0.8,  # streaming reads reach 80-90% of peak DRAM bandwidth
    "attention_efficiency": 0.5,  # paged attention kernels trail dense GEMMs and copies
    "step_overhead_s": 2e-3,  # a Python engine step: scheduling and kernel launches
    "sequence_overhead_s": 1e-4,  # per sequence: block tables, sampling, detokenizing
    "token_overhead_s": 0.0,  # per token: elementwise work, small beside a GPU's bandwidth
    # A GPU's attention kernel hides its re-reads of a prefill's cached K/V behind the
    # chunk's arithmetic: none beyond the roofline's.
    "prefill_context_passes": 0.0,
}


def _assumed(field: str) -> Source:
    return Source(
        field=field,
        title="assumed until fitted",
        url="",
        figure="a starting value; `kvgov twin fit` on this device's step-time grid replaces it",
    )


def _pcie5_x16(field_bandwidth: str = "host_link_bandwidth_bytes_s") -> tuple[Source, ...]:
    return (
        Source(
            field=field_bandwidth,
            title="PCI-SIG, PCI Express Base Specification Revision 5.0 (32 GT/s per lane)",
            url="https://pcisig.com/specifications",
            figure="32 GT/s x 16 lanes, 128b/130b: about 63 GB/s per direction, held as 64 GB/s "
            "nominal; about 50-55 GB/s is achievable in practice (the link model's concern)",
        ),
        Source(
            field="host_link_latency_s",
            title="assumed until fitted",
            url="",
            figure="10 us per transfer (DMA setup and completion); no vendor publishes one",
        ),
    )


def _gpu(
    *,
    name: str,
    description: str,
    memory_bytes: int,
    memory_bandwidth_bytes_s: float,
    fp32_flops_s: float,
    fp16_flops_s: float,
    int8_ops_s: float | None,
    int4_ops_s: float | None,
    sources: tuple[Source, ...],
    copy_engines: Source,
) -> DeviceProfile:
    return DeviceProfile(
        name=name,
        description=description,
        memory_bytes=memory_bytes,
        memory_bandwidth_bytes_s=memory_bandwidth_bytes_s,
        fp32_flops_s=fp32_flops_s,
        fp16_flops_s=fp16_flops_s,
        int8_ops_s=int8_ops_s,
        int4_ops_s=int4_ops_s,
        host_link_bandwidth_bytes_s=64 * GB,
        host_link_latency_s=10e-6,
        copies_overlap_compute=True,  # every shipped GPU has DMA copy engines
        **_ASSUMED_GPU_FACTORS,
        sources=(
            *sources,
            *_pcie5_x16(),
            copy_engines,
            *(_assumed(field) for field in FACTOR_FIELDS),
        ),
        fitted=("host_link_latency_s", *FACTOR_FIELDS),
    )


_CUDA_OVERLAP = Source(
    field="copies_overlap_compute",
    title="CUDA C++ Programming Guide, Overlap of Data Transfer and Kernel Execution",
    url="https://docs.nvidia.com/cuda/cuda-c-programming-guide/"
    "#overlap-of-data-transfer-and-kernel-execution",
    figure="devices with asyncEngineCount > 0 copy between host and device while kernels run "
    "(H100: 2 or more copy engines)",
)
_HIP_OVERLAP = Source(
    field="copies_overlap_compute",
    title="HIP documentation, Asynchronous concurrent execution",
    url="https://rocm.docs.amd.com/projects/HIP/en/latest/how-to/hip_runtime_api/asynchronous.html",
    figure="host-device copies on their own stream (SDMA engines) overlap kernel execution",
)

_AMD_9070XT_TITLE = "AMD Radeon RX 9070 XT, product specifications (amd.com)"
_AMD_9070XT_URL = (
    "https://www.amd.com/en/products/graphics/desktops/radeon/9000-series/amd-radeon-rx-9070xt.html"
)
_NVIDIA_H100_TITLE = "NVIDIA H100 Tensor Core GPU, specifications (nvidia.com)"
_NVIDIA_H100_URL = "https://www.nvidia.com/en-us/data-center/h100/"
_AMD_MI300X_TITLE = "AMD Instinct MI300X Accelerator, data sheet (amd.com)"
_AMD_MI300X_URL = (
    "https://www.amd.com/content/dam/amd/en/documents/instinct-tech-docs/data-sheets/"
    "amd-instinct-mi300x-data-sheet.pdf"
)


def _cite(title: str, url: str, **figures: str) -> tuple[Source, ...]:
    return tuple(
        Source(field=field, title=title, url=url, figure=figure)
        for field, figure in figures.items()
    )


RX9070XT = _gpu(
    name="rx9070xt",
    copy_engines=_HIP_OVERLAP,
    description="AMD Radeon RX 9070 XT: RDNA 4, 16 GB GDDR6 (256-bit, 20 Gbps), PCIe 5.0 x16; "
    "the reference card",
    memory_bytes=16 * 10**9,
    memory_bandwidth_bytes_s=640 * GB,
    fp32_flops_s=48.7 * TERA,
    fp16_flops_s=194.6 * TERA,
    int8_ops_s=389.3 * TERA,
    int4_ops_s=778.5 * TERA,
    sources=_cite(
        _AMD_9070XT_TITLE,
        _AMD_9070XT_URL,
        memory_bytes="Memory: 16 GB GDDR6",
        memory_bandwidth_bytes_s="Effective memory bandwidth 640 GB/s (20 Gbps x 256-bit)",
        fp32_flops_s="Peak single precision (FP32) 48.7 TFLOPs",
        fp16_flops_s="Peak half precision matrix (FP16) 194.6 TFLOPs dense; the page's 389 "
        "TFLOPs is with structured sparsity",
        int8_ops_s="Peak INT8 matrix 389.3 TOPS dense: half the 779 TOPS the page gives with "
        "sparsity",
        int4_ops_s="Peak INT4 matrix 778.5 TOPS dense: half the 1557 AI TOPS the page gives "
        "with sparsity",
    ),
)

H100_SXM = _gpu(
    name="h100-sxm",
    copy_engines=_CUDA_OVERLAP,
    description="NVIDIA H100 SXM5: Hopper, 80 GB HBM3, host link PCIe 5.0 x16",
    memory_bytes=80 * 10**9,
    memory_bandwidth_bytes_s=3.35e12,
    fp32_flops_s=67 * TERA,
    fp16_flops_s=989.5 * TERA,
    int8_ops_s=1979 * TERA,
    int4_ops_s=None,  # Hopper's tensor cores have no INT4 mode; NVIDIA publishes none
    sources=_cite(
        _NVIDIA_H100_TITLE,
        _NVIDIA_H100_URL,
        memory_bytes="H100 SXM GPU memory 80 GB",
        memory_bandwidth_bytes_s="H100 SXM GPU memory bandwidth 3.35 TB/s",
        fp32_flops_s="H100 SXM FP32 67 teraFLOPS",
        fp16_flops_s="H100 SXM BF16/FP16 Tensor Core 1,979 teraFLOPS with sparsity: 989.5 dense",
        int8_ops_s="H100 SXM INT8 Tensor Core 3,958 TOPS with sparsity: 1,979 dense",
        host_link_bandwidth_bytes_s="H100 SXM interconnect: PCIe Gen5 128 GB/s (both "
        "directions together): 64 GB/s per direction",
    ),
)

H100_PCIE = _gpu(
    name="h100-pcie",
    copy_engines=_CUDA_OVERLAP,
    description="NVIDIA H100 PCIe: Hopper, 80 GB HBM2e, PCIe 5.0 x16",
    memory_bytes=80 * 10**9,
    memory_bandwidth_bytes_s=2.0e12,
    fp32_flops_s=51 * TERA,
    fp16_flops_s=756.5 * TERA,
    int8_ops_s=1513 * TERA,
    int4_ops_s=None,
    sources=_cite(
        _NVIDIA_H100_TITLE,
        _NVIDIA_H100_URL,
        memory_bytes="H100 PCIe GPU memory 80 GB",
        memory_bandwidth_bytes_s="H100 PCIe GPU memory bandwidth 2 TB/s (the PCIe product brief, "
        "PB-11133-001, says 'greater than 2,000 GB/s')",
        fp32_flops_s="H100 PCIe FP32 51 teraFLOPS",
        fp16_flops_s="H100 PCIe BF16/FP16 Tensor Core 1,513 teraFLOPS with sparsity: 756.5 dense",
        int8_ops_s="H100 PCIe INT8 Tensor Core 3,026 TOPS with sparsity: 1,513 dense",
        host_link_bandwidth_bytes_s="H100 PCIe interconnect: PCIe Gen5 128 GB/s (both "
        "directions together): 64 GB/s per direction",
    ),
)

MI300X = _gpu(
    name="mi300x",
    copy_engines=_HIP_OVERLAP,
    description="AMD Instinct MI300X: CDNA 3, 192 GB HBM3, PCIe 5.0 x16 to the host",
    memory_bytes=192 * 10**9,
    memory_bandwidth_bytes_s=5.3e12,
    fp32_flops_s=163.4 * TERA,
    fp16_flops_s=1307.4 * TERA,
    int8_ops_s=2614.9 * TERA,
    int4_ops_s=None,  # CDNA 3 has no INT4 matrix mode; AMD publishes none
    sources=_cite(
        _AMD_MI300X_TITLE,
        _AMD_MI300X_URL,
        memory_bytes="Memory capacity 192 GB HBM3",
        memory_bandwidth_bytes_s="Peak theoretical memory bandwidth 5.3 TB/s",
        fp32_flops_s="Peak single precision (FP32) vector 163.4 TFLOPs",
        fp16_flops_s="Peak half precision (FP16) and bfloat16 matrix 1307.4 TFLOPs dense "
        "(2614.9 with structured sparsity)",
        int8_ops_s="Peak INT8 matrix 2614.9 TOPS dense (5229.8 with structured sparsity)",
        host_link_bandwidth_bytes_s="Bus: PCIe Gen 5 x16, 128 GB/s (both directions "
        "together): 64 GB/s per direction",
    ),
)

_CPU_FIELDS = (
    "memory_bytes",
    "memory_bandwidth_bytes_s",
    "fp32_flops_s",
    "fp16_flops_s",
    "host_link_bandwidth_bytes_s",
    "host_link_latency_s",
    *FACTOR_FIELDS,
)

CPU_HERE = DeviceProfile(
    name="cpu-here",
    description="the CPU kvgov runs on, fitted by measurement (`kvgov twin fit`); until a "
    "fitted profile file is loaded every figure here is a placeholder",
    memory_bytes=8 * 2**30,
    memory_bandwidth_bytes_s=10 * GB,
    fp32_flops_s=100e9,  # two AVX2 cores with FMA, well below their peak
    fp16_flops_s=50e9,  # CPUs without AMX convert bf16 to fp32: slower, not faster
    int8_ops_s=None,
    int4_ops_s=None,
    host_link_bandwidth_bytes_s=5 * GB,  # "host" is the same memory: a swap is a memcpy
    host_link_latency_s=1e-6,
    copies_overlap_compute=False,  # the same cores copy and compute
    compute_efficiency=1.0,
    memory_efficiency=1.0,
    attention_efficiency=1.0,
    step_overhead_s=1e-3,
    sequence_overhead_s=1e-4,
    token_overhead_s=1e-5,
    prefill_context_passes=0.0,
    sources=(
        *(
            Source(
                field=field,
                title="placeholder until fitted",
                url="",
                figure="`kvgov twin fit` measures this machine and writes a fitted profile file",
            )
            for field in _CPU_FIELDS
        ),
        Source(
            field="copies_overlap_compute",
            title="engine.swap_space (this repository)",
            url="",
            figure="on a CPU the host pool is the same memory: a swap is a memcpy on the cores "
            "that run the forward pass, so it never overlaps compute",
        ),
    ),
    fitted=_CPU_FIELDS,
)

PROFILES: MappingProxyType[str, DeviceProfile] = MappingProxyType(
    {p.name: p for p in (CPU_HERE, H100_PCIE, H100_SXM, MI300X, RX9070XT)}
)
