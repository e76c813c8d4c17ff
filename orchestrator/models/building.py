"""Building a transformers causal LM with random weights, the same way for every family."""

from __future__ import annotations

from typing import Any


def build_from_config(config: Any, causal_lm: Any, attention: str, dtype: Any, device: Any, init_context: Any) -> Any:
    """A randomly initialised ``causal_lm`` from ``config``, nothing downloaded, built where it will run.

    It is built directly on ``device`` in the training dtype: initialising a billion parameters on the host in fp32
    would take minutes of the probe's time and four bytes a parameter on every rank. ``init_context`` (e.g.
    ``deepspeed.zero.Init`` for ZeRO stage 3) builds it already partitioned, so no rank holds the whole model.
    transformers sets the default dtype to ``dtype`` while it builds. A missing attention implementation
    (flash-attn not installed) raises ImportError.
    """
    with init_context if init_context is not None else device:
        return causal_lm._from_config(config, attn_implementation=attention, dtype=dtype)
