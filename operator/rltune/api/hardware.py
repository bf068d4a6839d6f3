"""Public GPU datasheet figures shared by the forecaster and the twin.

Only published peak numbers live here (shared/REFERENCE.md section 1, NVIDIA datasheets as
summarised by glennklockwood.com). How much of the peak a kernel really reaches is a property of
the twin's hidden scenario (the truth) or of the forecaster's calibration (the estimate), never of
this catalog.
"""

from __future__ import annotations

from dataclasses import dataclass

GB = 1e9
GiB = 2**30


@dataclass(frozen=True)
class GPU:
    name: str
    bf16_tflops: float
    fp8_tflops: float
    hbm_bytes: float
    hbm_bw: float  # bytes/s
    nvlink_bw: float  # bytes/s per GPU per direction
    nvlink_domain: int  # GPUs that share one NVLink domain
    nic_bw: float  # bytes/s scale-out per GPU
    gfd_product: str  # nvidia.com/gpu.product label value
    family: str  # nvidia.com/gpu.family label value


CATALOG: dict[str, GPU] = {
    "H100": GPU("H100", 989, 1979, 80 * GB, 3.35e12, 450e9, 8, 400e9 / 8, "NVIDIA-H100-80GB-HBM3", "hopper"),
    "H200": GPU("H200", 989, 1979, 141 * GB, 4.8e12, 450e9, 8, 400e9 / 8, "NVIDIA-H200", "hopper"),
    "H20": GPU("H20", 148, 296, 96 * GB, 4.0e12, 450e9, 8, 400e9 / 8, "NVIDIA-H20", "hopper"),
    "B200": GPU("B200", 2250, 4500, 180 * GB, 7.7e12, 900e9, 8, 400e9 / 8, "NVIDIA-B200", "blackwell"),
    "B300": GPU("B300", 2250, 4500, 288 * GB, 8.0e12, 900e9, 8, 800e9 / 8, "NVIDIA-B300", "blackwell"),
    "GB200": GPU("GB200", 2250, 4500, 186 * GB, 8.0e12, 900e9, 72, 400e9 / 8, "NVIDIA-GB200", "blackwell"),
    "GB300": GPU("GB300", 2250, 4500, 288 * GB, 8.0e12, 900e9, 72, 800e9 / 8, "NVIDIA-GB300", "blackwell"),
    # The CPU "GPU" of this machine's real-mode trials: used only to size local runs.
    "CPU": GPU("CPU", 1.0, 1.0, 16 * GB, 20e9, 10e9, 1, 10e9, "none", "cpu"),
}


def gpu(name: str) -> GPU:
    try:
        return CATALOG[name]
    except KeyError:
        raise ValueError(
            f"unknown GPU type {name!r}: resources.gpuType must be one of {sorted(CATALOG)}"
        ) from None
