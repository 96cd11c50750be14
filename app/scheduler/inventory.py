"""What the planner places models on: GPUs (real or hypothetical) and the host.

Real devices come from the ggml backend devices of the loaded llama.cpp build
(CUDA cards, RPC servers), enriched through NVML (nvidia-ml-py, optional) with
PCIe link, NVLink and memory bandwidth. Hypothetical cards come from text
such as "RTX3090:24GiB" so a user can plan before buying. No GPU at all is a
valid inventory: everything then runs on the CPU.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace

from app.scheduler.errors import PlanInputError
from native.ggml_devices import device_props, list_devices

KiB, MiB, GiB = 1024, 1024 ** 2, 1024 ** 3
_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": KiB, "m": 1000 ** 2, "mb": 1000 ** 2, "mib": MiB,
          "g": 1000 ** 3, "gb": 1000 ** 3, "gib": GiB, "t": 1000 ** 4, "tb": 1000 ** 4, "tib": 1024 ** 4}

# Memory bandwidth in GB/s (vendor specifications). Decoding is memory-bound, so a
# layer's time on a card is about its bytes over this figure: it ranks cards by speed.
KNOWN_BANDWIDTH_GBS = {
    "3060": 360, "3060ti": 448, "3070": 448, "3070ti": 608, "3080": 760, "3080ti": 912, "3090": 936, "3090ti": 1008,
    "4060": 272, "4060ti": 288, "4070": 504, "4070super": 504, "4070ti": 504, "4070tisuper": 672, "4080": 717,
    "4080super": 736, "4090": 1008, "5060ti": 448, "5070": 672, "5070ti": 896, "5080": 960, "5090": 1792,
    "a4000": 448, "a5000": 768, "a6000": 768, "l40s": 864, "a100": 1935, "h100": 3350, "h200": 4800,
}
# PCIe payload rate per lane and direction, GB/s, by generation (after line encoding).
PCIE_LANE_GBS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}


def parse_size(text: str) -> int:
    """'24GiB', '24 GB', '12000MiB', '1.5T' -> bytes (a bare number means GiB)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise PlanInputError(f"cannot read {text!r} as a memory size (examples: 24GiB, 12GB, 16000MiB)")
    unit = m.group(2).lower()
    # a bare number is GiB: "--gpu 3090:24" means a 24 GiB card
    return int(float(m.group(1)) * (_UNITS[unit] if unit else GiB))


def known_bandwidth(name: str) -> float | None:
    """Spec memory bandwidth of a card named like 'RTX 3090', 'rtx4090', 'NVIDIA GeForce RTX 3060 Ti'."""
    key = re.sub(r"[^a-z0-9]", "", name.lower())
    for prefix in ("nvidiageforce", "geforce", "nvidia", "rtx", "gtx"):
        key = key.removeprefix(prefix)
    key = re.sub(r"(\d+gb)$", "", key)
    if key in KNOWN_BANDWIDTH_GBS:
        return float(KNOWN_BANDWIDTH_GBS[key])
    # longest known model number inside the name ("rtx3090founders" -> 3090)
    hits = [k for k in KNOWN_BANDWIDTH_GBS if k in key]
    return float(KNOWN_BANDWIDTH_GBS[max(hits, key=len)]) if hits else None


@dataclass(frozen=True)
class DeviceSpec:
    """One GPU-like device: a CUDA card, an RPC server, or a card described by the user."""
    name: str
    memory_total: int
    memory_free: int
    bandwidth_gbs: float | None = None  # memory bandwidth; None: unknown
    pcie_gen: int | None = None
    pcie_width: int | None = None
    nvlink: bool = False
    # async compute + events: llama.cpp then pipelines a multi-device split and keeps 4 input copies
    pipeline_capable: bool = True
    handle: int | None = None  # ggml_backend_dev_t of a real device; None when hypothetical
    description: str = ""
    device_id: str | None = None  # PCI bus id where known

    @property
    def hypothetical(self) -> bool:
        return self.handle is None

    def pcie_gbs(self) -> float | None:
        """One-direction PCIe payload rate of this card's link, GB/s."""
        if self.pcie_gen is None or self.pcie_width is None:
            return None
        return PCIE_LANE_GBS.get(self.pcie_gen, 1.969) * self.pcie_width

    def to_dict(self) -> dict:
        return {"name": self.name, "description": self.description, "memory_total": self.memory_total,
                "memory_free": self.memory_free, "bandwidth_gbs": self.bandwidth_gbs, "pcie_gen": self.pcie_gen,
                "pcie_width": self.pcie_width, "nvlink": self.nvlink, "hypothetical": self.hypothetical,
                "device_id": self.device_id}


@dataclass(frozen=True)
class HostSpec:
    """The CPU side: RAM for the input embeddings, CPU layers and host buffers."""
    ram_total: int
    ram_free: int
    cpu: str = ""
    n_cores: int = 0

    def to_dict(self) -> dict:
        return {"ram_total": self.ram_total, "ram_free": self.ram_free, "cpu": self.cpu, "n_cores": self.n_cores}


@dataclass(frozen=True)
class Inventory:
    gpus: tuple[DeviceSpec, ...]
    host: HostSpec
    sources: tuple[str, ...] = field(default_factory=tuple)  # "ggml", "nvml", "hypothetical"

    def to_dict(self) -> dict:
        return {"gpus": [g.to_dict() for g in self.gpus], "host": self.host.to_dict(), "sources": list(self.sources)}


def parse_gpu_spec(text: str) -> DeviceSpec:
    """A hypothetical card: NAME:SIZE[:bw=GBs][:free=SIZE][:pcie=GENxWIDTH][:nvlink].

    Examples: 'RTX3090:24GiB', '3060:12GB:pcie=4x8', 'mycard:16GiB:bw=600'.
    The bandwidth defaults to the card's specification when the name is known."""
    parts = [p.strip() for p in text.split(":")]
    if len(parts) < 2 or not parts[0]:
        raise PlanInputError(f"--gpu {text!r}: expected NAME:SIZE, e.g. RTX3090:24GiB")
    name, total = parts[0], parse_size(parts[1])
    spec = DeviceSpec(name=name, memory_total=total, memory_free=total, bandwidth_gbs=known_bandwidth(name),
                      pcie_gen=4, pcie_width=16, description="hypothetical")
    for opt in parts[2:]:
        key, _, val = opt.partition("=")
        key = key.lower()
        try:
            if key == "bw":
                spec = replace(spec, bandwidth_gbs=float(val.lower().removesuffix("gb/s")))
            elif key == "free":
                spec = replace(spec, memory_free=min(total, parse_size(val)))
            elif key == "pcie":
                gen, _, width = val.lower().partition("x")
                spec = replace(spec, pcie_gen=int(gen), pcie_width=int(width or 16))
            elif key == "nvlink":
                spec = replace(spec, nvlink=True)
            else:
                raise ValueError(key)
        except ValueError:
            raise PlanInputError(f"--gpu {text!r}: cannot read option {opt!r} "
                                 f"(options: bw=GBs, free=SIZE, pcie=GENxWIDTH, nvlink)") from None
    if total <= 0:
        raise PlanInputError(f"--gpu {text!r}: the memory size must be positive")
    return spec


def host_spec() -> HostSpec:
    """This machine's RAM (MemTotal / MemAvailable) and CPU."""
    total = free = 0
    try:
        with open("/proc/meminfo") as f:
            info = {ln.split(":")[0]: int(ln.split()[1]) * KiB for ln in f if ln.split()}
        total, free = info.get("MemTotal", 0), info.get("MemAvailable", info.get("MemFree", 0))
    except OSError:
        try:
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
            free = total // 2
        except (ValueError, OSError):
            pass
    return HostSpec(ram_total=total, ram_free=free, cpu=_cpu_name(), n_cores=os.cpu_count() or 0)


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for ln in f:
                if ln.startswith("model name"):
                    return ln.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def _nvml_cards() -> dict[str, dict]:
    """PCI bus id -> {pcie_gen, pcie_width, nvlink, bandwidth_gbs, name}; {} without nvidia-ml-py or a driver."""
    try:
        import pynvml  # nvidia-ml-py, optional (the nvml extra): machines with NVIDIA cards
    except ImportError:
        return {}
    try:
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no driver, no GPU: NVML is optional
        return {}
    out: dict[str, dict] = {}
    try:
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            bus = pynvml.nvmlDeviceGetPciInfo(h).busId
            bus = (bus.decode() if isinstance(bus, bytes) else bus).lower()
            card: dict = {"name": pynvml.nvmlDeviceGetName(h)}
            for key, fn in (("pcie_gen", "nvmlDeviceGetCurrPcieLinkGeneration"),
                            ("pcie_width", "nvmlDeviceGetCurrPcieLinkWidth")):
                try:
                    card[key] = int(getattr(pynvml, fn)(h))
                except Exception:  # noqa: BLE001 - not every board reports every field
                    pass
            try:
                # DDR: two transfers per clock; the bus width is in bits
                clock = pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_MEM)
                card["bandwidth_gbs"] = round(clock * 1e6 * 2 * pynvml.nvmlDeviceGetMemoryBusWidth(h) / 8 / 1e9, 1)
            except Exception:  # noqa: BLE001
                pass
            links = 0
            for link in range(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18)):
                try:
                    links += int(pynvml.nvmlDeviceGetNvLinkState(h, link) == pynvml.NVML_FEATURE_ENABLED)
                except Exception:  # noqa: BLE001 - no NVLink on this board
                    break
            card["nvlink"] = links > 0
            # ggml's device_id is "0000:01:00.0"; NVML's busId has 8 domain digits
            out[bus[-12:]] = card
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass
    return out


def detect_inventory() -> Inventory:
    """The GPU-like ggml devices of the loaded build (CUDA, RPC, ...), NVML details where
    available, and the host. A machine without a GPU gives an empty `gpus`."""
    nvml = _nvml_cards()
    gpus = []
    for d in list_devices():
        if d.type not in ("gpu", "igpu"):
            continue
        props = device_props(d.handle)
        dev_id = props.device_id.decode() if props.device_id else None
        spec = DeviceSpec(name=d.name, memory_total=d.memory_total, memory_free=d.memory_free,
                          bandwidth_gbs=known_bandwidth(d.description), handle=d.handle, description=d.description,
                          pipeline_capable=bool(props.caps.async_ and props.caps.events), device_id=dev_id)
        card = nvml.get((dev_id or "")[-12:].lower())
        if card:
            spec = replace(spec, pcie_gen=card.get("pcie_gen"), pcie_width=card.get("pcie_width"),
                           nvlink=card.get("nvlink", False),
                           bandwidth_gbs=card.get("bandwidth_gbs", spec.bandwidth_gbs))
        gpus.append(spec)
    sources = ("ggml", "nvml") if nvml else ("ggml",)
    return Inventory(gpus=unique_names(gpus), host=host_spec(), sources=sources)


def unique_names(gpus: list[DeviceSpec]) -> tuple[DeviceSpec, ...]:
    """Two cards of the same model get #0, #1 suffixes: plans refer to devices by name."""
    counts: dict[str, int] = {}
    for g in gpus:
        counts[g.name] = counts.get(g.name, 0) + 1
    seen: dict[str, int] = {}
    out = []
    for g in gpus:
        if counts[g.name] > 1:
            i = seen.get(g.name, 0)
            seen[g.name] = i + 1
            g = replace(g, name=f"{g.name}#{i}")
        out.append(g)
    return tuple(out)


def hypothetical_inventory(specs: list[str], host: HostSpec | None = None) -> Inventory:
    """Cards described by the user (see parse_gpu_spec); the host is this machine unless given."""
    return Inventory(gpus=unique_names([parse_gpu_spec(s) for s in specs]), host=host or host_spec(),
                     sources=("hypothetical",))
