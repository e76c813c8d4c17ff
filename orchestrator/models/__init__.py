"""Model families: one module per family holds all of that family's arithmetic and its builder.

A family module (``gpt_neox`` today) owns, for its architecture: the parameter count, training FLOPs per token
(with and without activation recomputation), activation bytes, and the transformers config and module that build
it. The probe, the predictor and the report import these from here; nothing else repeats them. Adding a family is
one module here, one entry in ``FAMILIES`` and its ``conf/model`` files.
"""

from __future__ import annotations

from types import ModuleType

from orchestrator.models import gpt_neox

FAMILIES: dict[str, ModuleType] = {"gpt_neox": gpt_neox}
"""``model.family`` in a ``conf/model`` file → the module that implements it."""


def family_module(name: str) -> ModuleType:
    """The module of family ``name``; a ValueError that lists the known families otherwise."""
    try:
        return FAMILIES[name]
    except KeyError:
        raise ValueError(f"unknown model family {name!r}; known: {', '.join(sorted(FAMILIES))}") from None
