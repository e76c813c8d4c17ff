"""DeepSpeed as the probe's engine: a GPT-NeoX model wrapped by ``deepspeed.initialize`` with the method's ZeRO
stage, offload, precision and activation checkpointing, optionally ``torch.compile``-d.

One engine serves the whole micro-batch search: DeepSpeed's forward takes a batch of any size, and the batch keys
of its config (micro-batch, accumulation) only drive its own data loader and loss scaling, which
``resize`` updates; so trials neither rebuild the model nor recompile it (while it searches, the probe marks the
batch dimension of its data dynamic, so ``torch.compile`` builds one graph for every size).
"""

from __future__ import annotations

import contextlib
import io
import logging
import sys
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, TypeVar

from orchestrator.engines.base import UnsupportedError, free_device_memory
from orchestrator.engines.compiling import compile_regions, compiled_regions
from orchestrator.engines.deepspeed.config import DeepSpeedConfig, build_ds_config
from orchestrator.engines.deepspeed.memory import estimate_micro_batch_size
from orchestrator.models import enable_activation_checkpointing, family_module, implementation

if TYPE_CHECKING:
    from collections.abc import Mapping

    import deepspeed
    import torch

    from orchestrator.config.batch import BatchPlan
    from orchestrator.config.schema import Config

DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
T = TypeVar("T")


def check_precision_supported(precision: str) -> None:
    """Refuse, in one line, a 16-bit type DeepSpeed's accelerator says this device cannot train in.

    DeepSpeed's CPU accelerator asks oneDNN: fp16 needs AVX-512 FP16 (or AMX-FP16), which many x86-64 CPUs lack;
    without this check DeepSpeed fails deep inside ``initialize`` with "Type fp16 is not supported on your device".
    """
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    supported = {"fp16": accelerator.is_fp16_supported, "bf16": accelerator.is_bf16_supported}
    if precision in supported and not supported[precision]():
        device = accelerator.device_name()
        feature = "AVX-512 FP16 (oneDNN fp16)" if device == "cpu" and precision == "fp16" else f"{precision} support"
        raise UnsupportedError(
            f"method.precision={precision} is not supported on this {device}: DeepSpeed's {device} accelerator "
            f"reports no {feature}; use {' or '.join(p for p in ('bf16', 'fp32') if p != precision)}"
        )


OP_BUILT = " built successfully"
"""The end of the line DeepSpeed's communication backends print on stdout, on every rank, each time they load their
op (``DeepSpeed shm_comm_op built successfully``): one per rank in every cell's log, saying nothing."""


def quiet_op_builds() -> None:
    """Drop DeepSpeed's ``... built successfully`` line where it is printed, its backends' op loaders
    (``deepspeed.comm.torch.build_shm_op``, ``deepspeed.comm.ccl.build_ccl_op``); everything else they print is
    printed as before, and a failed build still raises. Idempotent."""
    import importlib

    for module_name, name in (("deepspeed.comm.torch", "build_shm_op"), ("deepspeed.comm.ccl", "build_ccl_op")):
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        original = getattr(module, name, None)
        if original is None or getattr(original, "quiet", False):
            continue
        setattr(module, name, _quiet(original))


def _quiet(load: Callable[[], T]) -> Callable[[], T]:
    def quiet_load() -> T:
        said = io.StringIO()
        try:
            with contextlib.redirect_stdout(said):
                return load()
        finally:
            kept = [line for line in said.getvalue().splitlines(keepends=True) if not line.rstrip().endswith(OP_BUILT)]
            sys.stdout.write("".join(kept))

    quiet_load.quiet = True  # type: ignore[attr-defined]
    return quiet_load


class DeepSpeedEngine:
    """The DeepSpeed engine of one rank (see ``orchestrator.engines.base.Engine`` for the protocol)."""

    def __init__(self, config: Config, device: torch.device, rank: int) -> None:
        self.config = config
        self.device = device
        self.rank = rank
        self.engine: deepspeed.DeepSpeedEngine | None = None
        self.ds_config: DeepSpeedConfig | None = None
        self._num_parameters = 0

    def init_distributed(self, timeout: timedelta) -> None:
        import deepspeed
        from deepspeed.accelerator import get_accelerator

        logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
        quiet_op_builds()
        accelerator = get_accelerator().device_name()
        if accelerator != self.device.type:
            raise RuntimeError(
                f"gpu.accelerator={self.config.gpu.accelerator}, but DeepSpeed chose accelerator {accelerator!r}: "
                f"DS_ACCELERATOR={self.device.type} must be set before deepspeed is first imported"
            )
        deepspeed.init_distributed(
            dist_backend="nccl" if self.device.type == "cuda" else "gloo",
            auto_mpi_discovery=False,
            timeout=timeout,
            verbose=False,
        )

    def preload(self) -> None:
        import deepspeed.runtime.engine  # noqa: F401
        import deepspeed.runtime.zero.stage3  # noqa: F401
        import deepspeed.runtime.zero.stage_1_and_2  # noqa: F401
        import transformers.models.gpt_neox.modeling_gpt_neox  # noqa: F401

    def build(self, plan: BatchPlan) -> None:
        import deepspeed
        import torch

        self.release()
        method = self.config.method
        check_precision_supported(method.precision)
        self.ds_config = build_ds_config(method, plan, float(self.config.model.lr), self.config.gpu.accelerator)
        dtype = getattr(torch, DTYPES[method.precision])
        torch.manual_seed(self.config.probe.seed)  # the same initial weights on every rank
        zero3_init = None
        if method.zero_stage == 3:
            # Parameters go where the config's offload_param says (the host when offloading).
            zero3_init = deepspeed.zero.Init(config_dict_or_path=self.ds_config)
        module = family_module(self.config.model.family).build_model(
            self.config.model, method.attention, dtype, self.device, zero3_init
        )
        if method.activation_checkpointing:
            enable_activation_checkpointing(module)
        module.train()
        if method.compile and method.compile_scope == "regional":
            # Compiled lazily, at the first forward (inside the search or the warm-up): one block, then the loss.
            compile_regions(module, family_module(self.config.model.family).blocks(module))
        self._num_parameters = sum(int(getattr(p, "ds_numel", p.numel())) for p in module.parameters())
        engine, _, _, _ = deepspeed.initialize(
            model=module, model_parameters=[p for p in module.parameters() if p.requires_grad], config=self.ds_config
        )
        self.engine = engine
        if method.compile and method.compile_scope == "whole":
            engine.compile()  # the whole model as one graph, compiled lazily at the first forward

    def estimate_micro_batch_size(self, memory_gib: float) -> int:
        return estimate_micro_batch_size(self.config, memory_gib)

    def resize(self, plan: BatchPlan) -> None:
        # Micro-batch first (DeepSpeed keeps the accumulation), then the global batch (it recomputes accumulation).
        assert self.engine is not None, "build() makes the engine"
        self.engine.set_train_micro_batch_size(plan.micro_batch_size)
        self.engine.set_train_batch_size(plan.global_batch_size)
        if self.ds_config is not None:
            self.ds_config["train_batch_size"] = plan.global_batch_size
            self.ds_config["train_micro_batch_size_per_gpu"] = plan.micro_batch_size
            self.ds_config["gradient_accumulation_steps"] = plan.grad_accum_steps

    def micro_step(self, batch: Mapping[str, torch.Tensor], boundary: bool) -> torch.Tensor:
        engine = self.engine
        assert engine is not None, "build() makes the engine"
        engine.set_gradient_accumulation_boundary(boundary)
        loss: torch.Tensor = engine(**batch).loss
        engine.backward(loss)
        engine.step()  # the reduction and the optimizer step happen only at the boundary
        return loss

    def release(self) -> None:
        engine, self.engine = self.engine, None
        if engine is not None:
            with contextlib.suppress(Exception):
                engine.destroy()
            del engine
        free_device_memory(self.device)

    @property
    def num_parameters(self) -> int:
        return self._num_parameters

    @property
    def skipped_steps(self) -> int:
        return int(getattr(self.engine, "skipped_steps", 0))

    def describe(self) -> dict[str, object]:
        import deepspeed

        whole = bool(getattr(self.engine, "is_compiled", False))
        regional = self.engine is not None and compiled_regions(self.engine.module)
        return {
            "engine": "deepspeed",
            "deepspeed": deepspeed.__version__,
            "ds_config": dict(self.ds_config or {}),
            "compiled": whole or regional,
            "compile_scope": "whole" if whole else "regional" if regional else None,
            "model_implementation": implementation(self.config.model, self.engine.module) if self.engine else {},
        }


def create(config: Config, device: torch.device, rank: int) -> DeepSpeedEngine:
    """The engine ``orchestrator.engines.base.create_engine`` returns for ``method.engine: deepspeed``."""
    return DeepSpeedEngine(config, device, rank)
