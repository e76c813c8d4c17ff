"""Hydra overrides to a checked ``Plan``: the only user of Hydra."""
