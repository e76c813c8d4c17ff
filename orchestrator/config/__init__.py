"""Typed config and its vocabulary: the schema, domains, values, refusals, batch arithmetic, prices; no Hydra, no I/O."""
