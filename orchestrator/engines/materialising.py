"""Building a model without storage and giving each rank only its share: the build of the FSDP and mesh3d engines.

Built whole, a model needs four bytes a parameter on every rank before it is split (280 GB for a 70B model), so
these engines build it on the meta device, apply their parallelism there (``fully_shard``, tensor-parallel plans,
the pipeline's stages), and only then give the parameters storage (``to_empty``): each rank allocates its shards.

Initialisation is deterministic per unit, so a rank's shard holds exactly what the unsplit model holds. A unit is
a block of the family (a decoder layer) or a module outside the blocks that owns tensors (an embedding, the final
norm, the output layer); it is initialised by the family's own ``_init_weights`` (transformers' per-module scheme,
children before their parent) on a full-size copy of it (from a copy of the meta model kept aside, never split),
with the random generator seeded from the probe's seed and the unit's name in the model; the copy's values go into
the rank's shards (``DTensor`` placements decide which part) and its storage is dropped before the next unit. A
rank therefore holds at most one unit's whole tensors beside its shards (what
:func:`orchestrator.engines.memory.largest_unit` counts), and the same model on one rank, unsplit
(:func:`materialised`), has the same values, whatever the layout.

A tensor shared by two modules (an output layer tied to the input embedding) is written once, by the module that
names it first; a module made after the split to stand for another (mesh3d's copy of a tied output layer on the
last stage) is :meth:`MetaModel.adopt`-ed and takes that module's values.
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import zlib
from typing import TYPE_CHECKING, Any

from orchestrator.models import family_module

if TYPE_CHECKING:
    import torch
    from torch import nn

    from orchestrator.config.schema import Config

META = "meta"


def module_seed(seed: int, name: str) -> int:
    """The generator's seed for the module named ``name``: the probe's seed and the name, mixed."""
    return (int(seed) * 1_000_003 + zlib.crc32(name.encode())) % (2**63 - 1)


def build_meta(config: Config) -> tuple[nn.Module, MetaModel]:
    """The cell's model on the meta device in fp32 (no storage), and what materialises it later."""
    import torch

    family = family_module(config.model.family)
    module = family.build_model(config.model, config.method.attention, torch.float32, torch.device(META))
    return module, MetaModel(module, list(family.blocks(module)))


def materialised(config: Config, device: torch.device) -> nn.Module:
    """The cell's model unsplit on ``device``, initialised as every split of it is (the reference of a split)."""
    module, meta = build_meta(config)
    meta.materialise([module], device, config.probe.seed)
    return module


class MetaModel:
    """A meta model's full-size template and the names of its modules, to initialise its split parts by.

    The unit of initialisation is a block of the family (a decoder layer: its modules initialised children first,
    as transformers does, so a layer's own scheme, e.g. Mamba's mixer's, overrides its parts'), or a module
    outside every block that owns tensors (an embedding, the final norm, the output layer).
    """

    def __init__(self, module: nn.Module, blocks: list[nn.Module]) -> None:
        from transformers import PreTrainedModel

        self.template = copy.deepcopy(module)
        """Never split: each unit's full tensors are made from it, one unit at a time."""
        self.names: dict[int, str] = {}
        for name, m in module.named_modules(remove_duplicate=False):
            self.names.setdefault(id(m), name)
        self.blocks = {self.names[id(b)] for b in blocks}
        models = {n: m for n, m in self.template.named_modules() if isinstance(m, PreTrainedModel)}
        self.owners: dict[str, Any] = {}
        """Each module's nearest transformers model (whose ``_init_weights`` is its family's), by the module's name."""
        for name, _ in self.template.named_modules(remove_duplicate=False):
            within = [n for n in models if n == "" or name == n or name.startswith(n + ".")]
            self.owners[name] = models[max(within, key=len)] if within else self.template
        self.units = [
            name for name, m in self.template.named_modules()
            if name in self.blocks or (_direct_tensors(m) and not any(_within(name, b) for b in self.blocks))
        ]  # fmt: skip
        first: dict[int, str] = {}
        for name, t in self.template.named_parameters(remove_duplicate=False):
            first.setdefault(id(t), name)
        self.ties = {
            name: first[id(t)] for name, t in self.template.named_parameters(remove_duplicate=False)
            if first[id(t)] != name
        }  # fmt: skip
        """Each parameter tied to one named before it, with that first name: written under the first only."""

    def adopt(self, module: nn.Module, like: nn.Module) -> None:
        """``module``, made after the split, takes the values of ``like``, a module of the model."""
        self.names[id(module)] = self.names[id(like)]

    def materialise(self, roots: list[nn.Module], device: torch.device, seed: int) -> None:
        """Give ``roots`` (the model, or a rank's stages of it) storage on ``device`` and initialise every module
        that owns tensors as the unsplit model's is. Raises ValueError for a tensor-owning module not of the model."""
        import torch
        from transformers import initialization

        for root in roots:
            root.to_empty(device=device)
        here: dict[str, list[nn.Module]] = {}
        for root in roots:
            for m in root.modules():
                if _direct_tensors(m) and id(m) not in self.names:
                    raise ValueError(f"{type(m).__name__} owns tensors but is not a module of the model")
                if id(m) in self.names and all(m is not other for other in here.get(self.names[id(m)], [])):
                    here.setdefault(self.names[id(m)], []).append(m)
        self._retie(here)
        with torch.no_grad(), initialization.guard_torch_init_functions():
            for unit in self.units:
                if unit in here:
                    self._initialise(unit, here, device, seed)

    def _retie(self, here: dict[str, list[nn.Module]]) -> None:
        """Tie again what ``to_empty`` untied (it gives each module its own tensor), where both ends are here."""
        for alias, first in self.ties.items():
            (alias_module, alias_key), (first_module, first_key) = _split(alias), _split(first)
            for module in here.get(alias_module, []):
                for source in here.get(first_module, [])[:1]:
                    module._parameters[alias_key] = source._parameters[first_key]

    def _initialise(self, unit: str, here: dict[str, list[nn.Module]], device: torch.device, seed: int) -> None:
        import torch

        block = unit in self.blocks
        full = self.template.get_submodule(unit)
        modules = [(_qualified(unit, n), m) for n, m in full.named_modules()] if block else [(unit, full)]
        if not any(_qualified(name, key) not in self.ties for name, m in modules for key in _direct_tensors(m)):
            return  # only tensors tied to another module's, written there
        full.to_empty(device=device, recurse=block)
        forked = [device] if device.type == "cuda" else []
        try:
            with torch.random.fork_rng(devices=forked, device_type=device.type):
                torch.manual_seed(module_seed(seed, unit))
                for name, m in reversed(modules):  # children before their parent, as transformers initialises
                    self.owners[name]._init_weights(m)
            for name, m in modules:
                for key, value in _direct_tensors(m).items():
                    if _qualified(name, key) in self.ties:
                        continue  # a tensor tied to another module's is written there
                    for target in here.get(name, []):
                        if key in _direct_tensors(target):
                            _copy_into(_direct_tensors(target)[key], value)
        finally:
            full.to_empty(device=torch.device(META), recurse=block)
            if device.type == "cpu":
                _trim_heap()


def _trim_heap() -> None:
    """Give the unit's freed copy back to the system on the CPU: glibc keeps freed blocks of a few MB in its heap
    once a larger one was freed, so the process would grow by every unit's copy, the whole model's in the end (a
    GPU's caching allocator reuses them instead)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _within(name: str, block: str) -> bool:
    return name == block or name.startswith(block + ".")


def _split(name: str) -> tuple[str, str]:
    """A tensor's module's name and its key there."""
    module, _, key = name.rpartition(".")
    return module, key


def _qualified(name: str, key: str) -> str:
    return ".".join(part for part in (name, key) if part)


def _direct_tensors(module: nn.Module) -> dict[str, torch.Tensor]:
    """The parameters and buffers ``module`` holds itself (not its children's)."""
    out: dict[str, torch.Tensor] = {k: v for k, v in module._parameters.items() if v is not None}
    out.update({k: v for k, v in module._buffers.items() if v is not None})
    return out


def _copy_into(target: torch.Tensor, full: torch.Tensor) -> None:
    """Write a rank's part of ``full`` (the whole tensor) into ``target``: its shard for a DTensor, else all."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    if isinstance(target, DTensor):
        # Every rank holds the same ``full``: each takes its own part, no communication (src_data_rank=None).
        part = distribute_tensor(full, target.device_mesh, target.placements, src_data_rank=None)
        target.to_local().copy_(part.to_local())
    else:
        target.copy_(full)
