"""Public GPU datasheet figures shared by the forecaster and the twin, and the node labels that
identify each GPU type on a Kubernetes cluster.

Only published peak numbers live here (dense, no sparsity). How much of the peak a kernel really
reaches is a property of the twin's hidden scenario (the truth) or of the forecaster's calibration
(the estimate), never of this catalog.

Datasheet sources (NVIDIA; per-GPU figures, NVIDIA quotes HGX/NVL72 systems with sparsity, halved here):
  H100 / H200  https://www.nvidia.com/en-us/data-center/h100/  https://www.nvidia.com/en-us/data-center/h200/
  B200 / B300  https://www.nvidia.com/en-us/data-center/hgx/   (HGX B200, HGX B300)
  GB200        https://www.nvidia.com/en-us/data-center/gb200-nvl72/
  GB300        https://www.nvidia.com/en-us/data-center/gb300-nvl72/
The same per-GPU numbers are tabulated with their sources at https://www.glennklockwood.com/garden/processors/,
which is also the source for H20 (NVIDIA publishes no H20 datasheet:
https://github.com/sunkx109/GPUs-Specs/issues/2). H800 (SXM) is the H100 SXM die with NVLink cut to
400 GB/s (both directions, 200 GB/s each way) and, on the clusters that publish RL runs on it, one
400 Gb/s InfiniBand NIC per GPU: DeepSeek-V3 technical report, section 3.1 "Compute Clusters"
(https://arxiv.org/abs/2412.19437: "NVLink offers a bandwidth of 160 GB/s [achieved], roughly 3.2
times that of IB (50 GB/s)").

GPU Feature Discovery (GFD, part of the NVIDIA GPU Operator) labels nodes with
`nvidia.com/gpu.product` = the driver's (NVML) device name with spaces replaced by "-"
(https://github.com/NVIDIA/k8s-device-plugin/blob/main/internal/lm/resource.go). The device name
is the SKU, not the marketing name, and one GPU type has several: `gfd_products` lists every
string known for a type, so trial pods select on all of them (never on one guessed string).
Where each string was seen:
  H100   NVIDIA-H100-80GB-HBM3 (SXM): a recorded GFD dump (hack/gfd/labels.yaml); NVIDIA-H100-PCIe:
         the same guide's GFD dump on a 1x H100 PCIe instance
         (https://github.com/cbrownstein-lambda/lambda-docs-mkdocs/blob/03d1ee256626addca634f782e78d9b6c31f1f1cf/docs/education/large-language-models/kubeai-hermes-3.md);
         NVIDIA-H100-NVL: device name "NVIDIA H100 NVL" (https://github.com/fastfetch-cli/fastfetch/issues/1658)
  H200   NVIDIA-H200: NVML name "NVIDIA H200" (https://github.com/NVIDIA/mig-parted/issues/120);
         NVIDIA-H200-SXM5-141GB: the label CoreWeave's H200 nodes carry (GitHub issue 12 of this
         project, from public cluster manifests); NVIDIA-H200-NVL: the PCIe card
         (https://github.com/NVIDIA/mig-parted/pull/146)
  H20    NVIDIA-H20: NVML name "NVIDIA H20" (https://github.com/vllm-project/vllm/issues/19071)
  H800   NVIDIA-H800-80GB-HBM3: NVML name "NVIDIA H800 80GB HBM3" (the SXM part; named like the H100 SXM's
         "NVIDIA H100 80GB HBM3"); NVIDIA-H800-PCIe for the card
  B200   NVIDIA-B200: NVML name "NVIDIA B200" (https://github.com/NVIDIA/TensorRT-LLM/issues/10278)
  B300   NVIDIA-B300-SXM6-AC: NVML name "NVIDIA B300 SXM6 AC"
         (https://github.com/vllm-project/vllm/issues/30441, https://github.com/NVIDIA/cosmos-framework/pull/114)
  GB200  NVIDIA-GB200: NVML name "NVIDIA GB200" (https://github.com/vllm-project/vllm/issues/33543)
  GB300  NVIDIA-GB300: NVIDIA's identifier in the NIM support matrix
         (https://docs.nvidia.com/nim/large-language-models/latest/reference/support-matrix.html)
`family` is GFD's `nvidia.com/gpu.family` (compute capability 9 -> hopper, 10 -> blackwell;
https://github.com/NVIDIA/k8s-device-plugin/pull/1237).
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
    gfd_products: tuple[str, ...]  # every nvidia.com/gpu.product value known for this type
    family: str  # nvidia.com/gpu.family label value
    # The NVLink domain spans nodes (GB200/GB300 NVL72: 18 compute trays of 4 GPUs behind NVLink switch
    # trays, https://www.nvidia.com/en-us/data-center/gb200-nvl72/). A Kubernetes node then holds only
    # 4 GPUs, but GPUs on other trays of the rack are still one NVLink hop away (with an IMEX
    # ComputeDomain), so the domain is a property of the hardware, not of gpusPerNode.
    rack_scale: bool = False

    def nvlink_reach(self, gpus_per_node: int) -> int:
        """GPUs a job's collectives can reach over NVLink: the rack for NVL72 parts, else the node."""
        return self.nvlink_domain if self.rack_scale else min(gpus_per_node, self.nvlink_domain)

    @property
    def gfd_product(self) -> str:
        """The most common product string (the first known one); "" for the CPU pseudo-GPU."""
        return self.gfd_products[0] if self.gfd_products else ""


CATALOG: dict[str, GPU] = {
    "H100": GPU(
        "H100",
        989,
        1979,
        80 * GB,
        3.35e12,
        450e9,
        8,
        400e9 / 8,
        ("NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-PCIe", "NVIDIA-H100-NVL"),
        "hopper",
    ),
    "H200": GPU(
        "H200",
        989,
        1979,
        141 * GB,
        4.8e12,
        450e9,
        8,
        400e9 / 8,
        ("NVIDIA-H200", "NVIDIA-H200-SXM5-141GB", "NVIDIA-H200-NVL"),
        "hopper",
    ),
    "H800": GPU(
        "H800",
        989,
        1979,
        80 * GB,
        3.35e12,
        200e9,
        8,
        400e9 / 8,
        ("NVIDIA-H800-80GB-HBM3", "NVIDIA-H800-PCIe"),
        "hopper",
    ),
    "H20": GPU("H20", 148, 296, 96 * GB, 4.0e12, 450e9, 8, 400e9 / 8, ("NVIDIA-H20",), "hopper"),
    "B200": GPU("B200", 2250, 4500, 180 * GB, 7.7e12, 900e9, 8, 400e9 / 8, ("NVIDIA-B200",), "blackwell"),
    "B300": GPU("B300", 2250, 4500, 288 * GB, 8.0e12, 900e9, 8, 800e9 / 8, ("NVIDIA-B300-SXM6-AC",), "blackwell"),
    "GB200": GPU("GB200", 2250, 4500, 186 * GB, 8.0e12, 900e9, 72, 400e9 / 8, ("NVIDIA-GB200",), "blackwell", True),
    "GB300": GPU("GB300", 2250, 4500, 288 * GB, 8.0e12, 900e9, 72, 800e9 / 8, ("NVIDIA-GB300",), "blackwell", True),
    # The CPU "GPU" of this machine's real-mode trials: used only to size local runs (no GPU node).
    "CPU": GPU("CPU", 1.0, 1.0, 16 * GB, 20e9, 10e9, 1, 10e9, (), "cpu"),
}


def gpu(name: str) -> GPU:
    try:
        return CATALOG[name]
    except KeyError:
        raise ValueError(f"unknown GPU type {name!r}: resources.gpuType must be one of {sorted(CATALOG)}") from None
