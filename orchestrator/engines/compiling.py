"""Regional compilation: ``torch.compile`` of one repeated block, whose code every other block reuses, and of the
loss, instead of the whole model as one graph.

A model's blocks are instances of one class running one ``forward``: Dynamo compiles that code once, for the
first block, and the others pass its guards (their parameters are inputs of the graph, not constants of it), so
a 24-layer model costs the compile of one layer, and Inductor's cache (``orchestrator.job.build_cache`` keeps it per
user) serves every later cell of the same block shape. The loss is the second region: compiled, its fp32 cast
and log-softmax are fused as in a whole-model compile, which the memory model's compiled logits assume
(``orchestrator.models.gpt_neox.COMPILED_LOGIT_BYTES_PER_ENTRY``, fitted to whole-model records; not yet checked
for the regional loss on a GPU). What stays eager (the embeddings, the final
norm, the output projection) is a few kernels per step.

The engines' hooks stay outside the compiled code: FSDP2 wraps each compiled block (``fully_shard`` after
``compile``, as torchtitan does), and DeepSpeed marks its ZeRO-3 gathers ``torch.compiler.disable``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

if TYPE_CHECKING:
    from torch import nn

P = ParamSpec("P")
R = TypeVar("R")


def compile_blocks(blocks: Iterable[nn.Module]) -> None:
    """Compile each block in place (``nn.Module.compile``): one compiled code, shared by every block."""
    for block in blocks:
        block.compile()


def compile_loss(module: Any) -> None:
    """Compile the loss of a transformers model (its ``loss_function``, set back on the model), where it has one."""
    import torch

    loss = getattr(module, "loss_function", None)
    if loss is not None:
        module.loss_function = torch.compile(loss)


def compiled_loss(loss: Callable[P, R]) -> Callable[P, R]:
    """A loss computed outside the model (a pipeline's last stage) as a compiled region of its own."""
    import torch

    return torch.compile(loss)


def compile_regions(module: nn.Module, blocks: Iterable[nn.Module]) -> None:
    """Regional compilation of a transformers model: its blocks, then its loss."""
    compile_blocks(blocks)
    compile_loss(module)


def compiled_regions(module: nn.Module) -> bool:
    """Whether any submodule of ``module`` was compiled in place (the record's ``compiled``)."""
    return any(getattr(m, "_compiled_call_impl", None) is not None for m in module.modules())
