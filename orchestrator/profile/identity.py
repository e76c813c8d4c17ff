"""Which hardware a profile measured: the key under which it is kept and found again.

Two runs of ``gpudays profile`` share an identity when they ran the same GPU model, as many GPUs a node, as many
nodes, on the same CPU model, with the same torch build and communication backend: a profile measured under one
identity is never used for another (a different torch or NCCL can move every figure).
"""

from __future__ import annotations

import hashlib
import json
import platform
import re
from dataclasses import asdict, dataclass
from pathlib import Path

CPU_INFO = Path("/proc/cpuinfo")
BACKENDS = ("gloo", "nccl")


@dataclass(frozen=True)
class Identity:
    """The hardware and software one profile holds for."""

    gpu_name: str
    """``torch.cuda.get_device_name()`` (``NVIDIA H100 80GB HBM3``), or ``cpu`` where host cores stand in."""
    gpus_per_node: int
    """Ranks on each node: GPUs, or CPU processes."""
    nodes: int
    cpu_model: str
    """The host CPU's model name (``/proc/cpuinfo``)."""
    torch_version: str
    """``torch.__version__``, with its CUDA build (``2.5.1+cu124``)."""
    backend: str
    """``gloo`` or ``nccl``."""

    def key(self) -> str:
        """A file name for this identity: readable, and unique through a hash of every field."""
        words = f"{self.gpu_name}-x{self.gpus_per_node}-n{self.nodes}-{self.backend}-torch{self.torch_version}"
        slug = re.sub(r"[^a-z0-9.+]+", "-", words.lower()).strip("-")[:80]
        digest = hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:8]
        return f"{slug}-{digest}"

    def describe(self) -> str:
        nodes = f" on {self.nodes} nodes" if self.nodes > 1 else ""
        return (
            f"{self.gpus_per_node} x {self.gpu_name}{nodes} ({self.cpu_model}; torch {self.torch_version}, "
            f"{self.backend})"
        )

    def differences(self, other: Identity) -> list[str]:
        """``field: mine != theirs`` for every field where ``other`` differs."""
        mine, theirs = asdict(self), asdict(other)
        return [f"{name}: {mine[name]!r} != {theirs[name]!r}" for name in mine if mine[name] != theirs[name]]


def cpu_model() -> str:
    """The host CPU's model name: ``/proc/cpuinfo``'s ``model name``, else what Python's platform module says."""
    try:
        for line in CPU_INFO.read_text(errors="replace").splitlines():
            name, _, value = line.partition(":")
            if name.strip() == "model name" and value.strip():
                return " ".join(value.split())
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def this_machine(backend: str, gpus_per_node: int, nodes: int) -> Identity:
    """The identity of this machine for a profile over ``gpus_per_node`` ranks a node on ``nodes`` nodes."""
    import torch

    if backend not in BACKENDS:
        raise ValueError(f"backend {backend!r}: use one of {', '.join(BACKENDS)}")
    gpu = torch.cuda.get_device_name(0) if backend == "nccl" else "cpu"
    return Identity(gpu, gpus_per_node, nodes, cpu_model(), str(torch.__version__), backend)
