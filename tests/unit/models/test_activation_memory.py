"""Activation bytes against the memory a real bf16 training step of the transformers module holds, on the CPU.

No device allocator is needed: a ``TorchDispatchMode`` sees every tensor an operator returns and counts its storage
while any tensor refers to it, so its peak is the peak of memory the step's tensors held (parameters and
gradients, which exist before the step, are left out). Differences between two models isolate one coefficient:
4 layers against 2 give the bytes per layer, a 4,096-entry vocabulary against 1,024 the bytes per logit entry.
Measured (transformers 5.23, torch 2.13, h=128, a=4, s=256, b=2): 36.19·h per layer and token with SDPA,
78.06·h eager, 2.00·h with checkpointing; 12.0 bytes per logit entry at the peak (4.0 still held after the
forward), which settles 12 against 16. The tests repeat this on a smaller model (h=64, s=128) to stay quick.
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Any

import pytest

from orchestrator.config.schema import MethodConfig, ModelConfig
from orchestrator.engines.memory import activation_bytes_per_sequence
from orchestrator.models import enable_activation_checkpointing, gpt_neox

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
python_dispatch = pytest.importorskip("torch.utils._python_dispatch")
pytree = pytest.importorskip("torch.utils._pytree")

BASE = ModelConfig(name="small", num_layers=2, hidden_size=64, num_heads=4, vocab_size=512, seq_length=128)
BATCH = 2
TOKENS = BATCH * BASE.seq_length


class LiveTensorBytes(python_dispatch.TorchDispatchMode):  # type: ignore[misc]
    """Bytes of the storages that operators' outputs hold while any tensor refers to them, and their peak."""

    def __init__(self, untracked: set[int]) -> None:
        super().__init__()
        self.untracked = untracked
        self.live = 0
        self.peak = 0
        self.storages: dict[int, list[int]] = {}  # data pointer -> [referring tensors, bytes]

    def _track(self, tensor: Any) -> None:
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        if storage.nbytes() == 0 or key in self.untracked:
            return
        if key not in self.storages:
            self.storages[key] = [0, storage.nbytes()]
            self.live += storage.nbytes()
            self.peak = max(self.peak, self.live)
        self.storages[key][0] += 1
        weakref.finalize(tensor, self._release, key)

    def _release(self, key: int) -> None:
        entry = self.storages.get(key)
        if entry is None:
            return
        entry[0] -= 1
        if entry[0] == 0:
            self.live -= entry[1]
            del self.storages[key]

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for value in pytree.tree_flatten(out)[0]:
            if isinstance(value, torch.Tensor):
                self._track(value)
        return out


def measure(model: ModelConfig, attention: str = "sdpa", checkpointing: bool = False) -> tuple[int, int]:
    """(bytes held after the forward, peak bytes) of one bf16 forward and backward, gradients already allocated."""
    torch.manual_seed(0)
    module = gpt_neox.build_model(model, attention, torch.bfloat16, torch.device("cpu"))
    module.train()
    if checkpointing:
        enable_activation_checkpointing(module)
    ids = torch.randint(0, model.vocab_size, (BATCH, model.seq_length))
    module(input_ids=ids, labels=ids).loss.backward()  # gradients exist from here on, as in training
    existing = {p.untyped_storage().data_ptr() for p in module.parameters()}
    existing |= {p.grad.untyped_storage().data_ptr() for p in module.parameters() if p.grad is not None}
    tracker = LiveTensorBytes(existing)
    with tracker:
        loss = module(input_ids=ids, labels=ids).loss
        held = tracker.live
        loss.backward()
    return held, tracker.peak


@pytest.fixture(scope="module")
def sdpa() -> dict[str, tuple[int, int]]:
    return {
        "base": measure(BASE),
        "4 layers": measure(dataclasses.replace(BASE, num_layers=4)),
        "vocab 2048": measure(dataclasses.replace(BASE, vocab_size=2048)),
    }


def test_layer_bytes_with_sdpa(sdpa: dict[str, tuple[int, int]]) -> None:
    per_layer_token = (sdpa["4 layers"][1] - sdpa["base"][1]) / 2 / TOKENS
    expected = gpt_neox.activation_bytes_per_token_per_layer(BASE, "sdpa", False)
    assert per_layer_token == pytest.approx(expected, rel=0.01)


def test_logits_take_twelve_bytes_per_entry_at_the_peak_not_sixteen(sdpa: dict[str, tuple[int, int]]) -> None:
    entries = (2048 - 512) * TOKENS
    peak_per_entry = (sdpa["vocab 2048"][1] - sdpa["base"][1]) / entries
    held_per_entry = (sdpa["vocab 2048"][0] - sdpa["base"][0]) / entries
    assert peak_per_entry == pytest.approx(gpt_neox.LOGIT_BYTES_PER_ENTRY, abs=0.25)
    assert held_per_entry == pytest.approx(4.0, abs=0.25)  # the fp32 log-softmax, kept for the backward


def test_whole_step_peak_matches_the_memory_model(sdpa: dict[str, tuple[int, int]]) -> None:
    # What the model leaves out (the embedding's output, the final LayerNorm) is a few percent at this size.
    predicted = BATCH * activation_bytes_per_sequence(BASE, MethodConfig(attention="sdpa"))
    assert sdpa["base"][1] == pytest.approx(predicted, rel=0.05)


def test_checkpointing_keeps_each_layers_input() -> None:
    base = measure(BASE, checkpointing=True)
    deeper = measure(dataclasses.replace(BASE, num_layers=4), checkpointing=True)
    per_layer_token = (deeper[1] - base[1]) / 2 / TOKENS
    assert per_layer_token == pytest.approx(gpt_neox.activation_bytes_per_token_per_layer(BASE, "sdpa", True), rel=0.01)
    predicted = BATCH * activation_bytes_per_sequence(BASE, MethodConfig(activation_checkpointing=True))
    assert base[1] == pytest.approx(predicted, rel=0.05)


def test_eager_attention_keeps_the_attention_probabilities() -> None:
    base = measure(BASE, "eager")
    deeper = measure(dataclasses.replace(BASE, num_layers=4), "eager")
    per_layer_token = (deeper[1] - base[1]) / 2 / TOKENS
    assert per_layer_token == pytest.approx(
        gpt_neox.activation_bytes_per_token_per_layer(BASE, "eager", False), rel=0.01
    )


LLAMA = ModelConfig(
    name="small-llama", family="llama", num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2,
    intermediate_size=176, vocab_size=512, seq_length=128, rotary_pct=1.0,
)  # fmt: skip


def measure_selective(model: ModelConfig) -> int:
    """Peak bytes of one bf16 step of ``model`` under mesh3d's selective checkpointing (after a first step)."""
    from orchestrator.engines.mesh3d.parallelize import selective_checkpointing
    from orchestrator.models import family_module

    torch.manual_seed(0)
    module = family_module(model.family).build_model(model, "sdpa", torch.bfloat16, torch.device("cpu"))
    module.train()
    enable_activation_checkpointing(module, selective_checkpointing())
    ids = torch.randint(0, model.vocab_size, (BATCH, model.seq_length))
    module(input_ids=ids, labels=ids).loss.backward()
    existing = {p.untyped_storage().data_ptr() for p in module.parameters()}
    existing |= {p.grad.untyped_storage().data_ptr() for p in module.parameters() if p.grad is not None}
    tracker = LiveTensorBytes(existing)
    with tracker:
        module(input_ids=ids, labels=ids).loss.backward()
    return tracker.peak


@pytest.mark.parametrize("model", [BASE, LLAMA], ids=["gpt_neox", "llama"])
def test_selective_checkpointing_keeps_the_matrix_products_outputs(model: ModelConfig) -> None:
    # Measured: 1424 bytes a layer and token for GPT-NeoX, 1488 for the gated llama layer, between full
    # checkpointing's 128 (the input) and no checkpointing's 2328 and 2840.
    from orchestrator.engines.memory import selective_layer_bytes

    base, deeper = measure_selective(model), measure_selective(dataclasses.replace(model, num_layers=4))
    assert (deeper - base) / 2 / TOKENS == pytest.approx(selective_layer_bytes(model), rel=0.01)
    method = MethodConfig(engine="mesh3d", activation_checkpointing=True, checkpoint_policy="selective")
    assert base == pytest.approx(BATCH * activation_bytes_per_sequence(model, method), rel=0.08)
