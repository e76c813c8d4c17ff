"""What ``orchestrator.planning.plan`` may keep between plans in one process: Hydra's compositions, its group list;
and the schemas' registration, once per process.

A ``gpudays`` command plans once, and a plan composes afresh: it reads the config files as they are, and what it
composes twice (its hydra node and its first cell's choices) it composes once, on its own
(``orchestrator.planning.plan.Composer``). Only a process that plans many times gains from keeping compositions
between plans: the tests, which plan hundreds of times and turn it on for their session (:func:`keep_between_plans`,
``tests/conftest.py``).

Kept, each distinct set of overrides is composed once. The key holds everything a composition reads: the config
folders, the overrides and a hash of every config file's path and bytes (an edited, added or removed file is a new
key). What must not be shared is never cached: each caller that may change what it gets gets its own copy, and every
caller gets it with OmegaConf's resolver cache empty, so ``${now:...}`` in the sweep folder and ``${oc.env:...}``
are resolved afresh every time. (Only the folders
gpudays puts on the search path are hashed: ``conf/`` and ``-cd``; a folder that a config file itself adds to
``hydra.searchpath`` is read once per process.)
"""

from __future__ import annotations

import hashlib
import os
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig

from orchestrator.config.schema import ClusterConfig, Config, GpuConfig, MethodConfig, ModelConfig, ProbeConfig

CACHE_MAX = 256
"""Entries per cache; past it the least recently used goes."""
FINGERPRINT_MAX_FILES = 2000
"""Config files hashed at most; a search folder with more is not cached."""

KEPT_BETWEEN_PLANS = False
"""Whether plans share the caches below (:func:`keep_between_plans`); off, every plan composes afresh."""
COMPOSED: OrderedDict[tuple[str, ...], DictConfig] = OrderedDict()
"""Hydra compositions by (config folder, fingerprint, search path, overrides). Callers get copies, except the hydra
node's reader (``plan.Composer.hydra_node``), which only reads it, its resolver cache emptied first."""
GROUPS: OrderedDict[tuple[str, ...], frozenset[str]] = OrderedDict()
"""Hydra's config groups, by config folder and fingerprint."""

T = TypeVar("T")


def keep_between_plans(on: bool) -> None:
    """Keep Hydra's compositions between plans in this process (``on``), or compose afresh for every plan."""
    global KEPT_BETWEEN_PLANS
    KEPT_BETWEEN_PLANS = on


def remember(cache: OrderedDict[tuple[str, ...], T], key: tuple[str, ...], make: Callable[[], T]) -> T:
    """``cache[key]``, made by ``make()`` on a miss; the least recently used entry goes past ``CACHE_MAX``."""
    if key in cache:
        cache.move_to_end(key)
        return cache[key]
    value = make()
    cache[key] = value
    while len(cache) > CACHE_MAX:
        cache.popitem(last=False)
    return value


def register_schemas() -> None:
    """The schemas in Hydra's ConfigStore, registered once per process (registering builds six structured configs,
    about 20 ms; ConfigStore hands out copies, so what is stored never changes)."""
    if "config_schema.yaml" not in ConfigStore.instance().repo:
        register_configs()


def fingerprint(dirs: Sequence[Path]) -> str | None:
    """A hash of the path and bytes of every config file under ``dirs``; None (do not cache) for a huge folder."""
    digest = hashlib.sha256()
    seen = 0
    for top in dirs:
        digest.update(b"\0dir\0" + os.fsencode(str(top)))
        for root, subdirs, files in os.walk(top):
            subdirs.sort()
            digest.update(b"\0d\0" + os.fsencode(os.path.relpath(root, top)))
            for name in sorted(files):
                if not name.endswith((".yaml", ".yml")):
                    continue
                seen += 1
                if seen > FINGERPRINT_MAX_FILES:
                    return None
                path = os.path.join(root, name)
                try:
                    with open(path, "rb") as f:
                        data = f.read()
                except OSError:
                    return None
                digest.update(b"\0f\0" + os.fsencode(os.path.relpath(path, top)) + b"\0" + str(len(data)).encode())
                digest.update(data)
    return digest.hexdigest()


def register_configs() -> None:
    """Register the schemas so that ``conf/`` files can validate against them."""
    cs = ConfigStore.instance()
    cs.store(name="config_schema", node=Config)
    cs.store(group="schema/model", name="model", node=ModelConfig, package="model")
    cs.store(group="schema/gpu", name="gpu", node=GpuConfig, package="gpu")
    cs.store(group="schema/method", name="method", node=MethodConfig, package="method")
    cs.store(group="schema/cluster", name="cluster", node=ClusterConfig, package="cluster")
    cs.store(group="schema/probe", name="probe", node=ProbeConfig, package="probe")
