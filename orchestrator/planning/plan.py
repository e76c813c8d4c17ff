"""From Hydra overrides to a checked list of cells, before anything is submitted.

Hydra's own multirun syntax is kept: comma lists, ``range()``, ``glob()``, ``+key=``, ``~key``, group choices, and
``hydra.sweeper.params`` in the primary config or an ``experiment/`` file. Hydra's BasicSweeper expands the
overrides into one override list per cell; each cell is then composed against the typed schema.

Composing a full Hydra config costs about 80 ms, so composing 1,000 cells one by one would take over a minute. Cells
that differ only in plain values (``num_gpus=1,2,4``, ``method.zero_stage=0,1``) share their config-group choices,
so each distinct set of group choices is composed once by Hydra and the plain values are applied on a copy with
``OmegaConf.update``, which is what Hydra itself does with them after composition; struct mode and the typed schema
still reject a misspelt key or a wrongly typed value.

A plan composes afresh, reading the config files as they are (its hydra node is its first cell's composition). A
process that plans many times (the tests) may keep Hydra's compositions between plans (``compose_cache``), keyed by
the config files' bytes and the overrides; each caller gets its own copy, resolved afresh.
"""

from __future__ import annotations

import copy
import os
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import cast

from hydra import compose, initialize_config_dir
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, OverrideType
from hydra.errors import HydraException
from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from orchestrator.cells import cell as cells_mod
from orchestrator.config.places import CONF_DIR
from orchestrator.config.refusal import Refusal
from orchestrator.config.schema import Config, to_config
from orchestrator.config.values import ConfigValue, Container, Row
from orchestrator.engines.registry import engine_spec
from orchestrator.planning import compose_cache
from orchestrator.planning.compose_cache import CACHE_MAX, COMPOSED, GROUPS, fingerprint, register_schemas, remember
from orchestrator.slurm import templates as sbatch_template

DEMO_OVERRIDES = ["+experiment=demo"]
CONFIG_NAME = "config"

_BASES: OrderedDict[tuple[str, ...], _Base] = OrderedDict()
"""Bases without any interpolation (their container is final), by the composition's key; read only, never changed.
Shared between plans only where compositions are kept (``compose_cache.KEPT_BETWEEN_PLANS``)."""


class SweepError(Exception):
    """Bad input found while planning a sweep; nothing has been submitted."""


@dataclass
class Cell:
    """One point of the grid, composed and judged."""

    overrides: list[str]
    config: Container
    """The resolved config as plain data, as written to the cell's cell.yaml."""
    typed: Config
    """The same config as the schema's dataclasses: what the code past planning reads."""
    cell_id: str
    refusals: list[Refusal] = field(default_factory=list)
    prediction: Row = field(default_factory=dict)
    """Predicted fit, micro-batch, peak memory per GPU (GiB), step time (s), days, GPU-hours (analysis.predict.predictor)."""

    @property
    def label(self) -> str:
        return cells_mod.label(self.typed)


@dataclass
class Plan:
    """What a sweep command asked for, checked: the cells to run and the cells refused, with reasons."""

    sweep_dir: Path
    name: str
    overrides: list[str]
    cells: list[Cell]
    skipped: list[Cell]
    duplicates: int = 0
    notes: list[str] = field(default_factory=list)
    """What planning changed to cost a cell, said with the plan (e.g. the nodes it spread the GPUs over)."""


def _first_choice(override: Override) -> str:
    """The override with its first sweep value, to compose a representative config."""
    if not override.is_sweep_override():
        return override.input_line or ""
    first = next(iter(override.sweep_string_iterator()))
    return f"{override.get_key_element()}={first}"


@dataclass
class _Base:
    """One Hydra composition shared by every cell with the same config-group choices."""

    cfg: DictConfig
    choices: dict[str, str]
    container: Container
    has_interpolation: bool


def _copy_tree(node: ConfigValue) -> ConfigValue:
    """A deep copy of plain dicts and lists (several times faster than copy.deepcopy on a config tree)."""
    if isinstance(node, dict):
        return {k: _copy_tree(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_copy_tree(v) for v in node]
    return node


def _set_path(tree: Container, dotted: str, value: ConfigValue) -> None:
    *parents, leaf = dotted.split(".")
    for key in parents:
        child = tree[key]
        assert isinstance(child, dict), f"{key} of {dotted} is a group of the composed config"
        tree = child
    tree[leaf] = _copy_tree(value)


class Composer:
    """Composes cell configs against conf/ and the schema, caching by config-group choices."""

    def __init__(self, search_dirs: Sequence[Path] = ()) -> None:
        folders = [Path(d).absolute() for d in search_dirs]
        self.search_overrides = (
            [f"hydra.searchpath=[{','.join('file://' + str(d) for d in folders)}]"] if search_dirs else []
        )
        # Only a process that keeps compositions between plans hashes the config files (None: nothing is shared).
        self.fingerprint = fingerprint([CONF_DIR, *folders]) if compose_cache.KEPT_BETWEEN_PLANS else None
        loader = GlobalHydra.instance().config_loader()
        self.parser = OverridesParser.create(config_loader=loader)
        if self.fingerprint is None:
            self.groups: frozenset[str] = frozenset(loader.list_groups(""))
        else:
            key = (str(CONF_DIR), self.fingerprint)
            self.groups = remember(GROUPS, key, lambda: frozenset(loader.list_groups("")))
        self._composed: dict[tuple[str, ...], DictConfig] = {}
        self._bases: dict[tuple[str, ...], _Base] = {}
        self._parsed: dict[str, Override] = {}
        self._values: dict[tuple[tuple[str, ...], str], ConfigValue] = {}

    def compose(self, overrides: Sequence[str], copied: bool = True) -> DictConfig:
        """Hydra's composition of ``overrides`` (hydra node included): a copy the caller may change and resolve,
        or (``copied=False``) the kept composition itself, for a caller that only reads it (resolved afresh:
        ``${now:}`` is today's).

        Hydra composes each distinct set once per plan: the hydra node's first choices are the first cell's."""
        full = (*self.search_overrides, *overrides)
        if full not in self._composed:
            self._composed[full] = self._hydra_compose(full)
        cfg = copy.deepcopy(self._composed[full]) if copied else self._composed[full]
        OmegaConf.clear_cache(cfg)
        cfg.hydra.runtime.cwd = os.getcwd()  # the one value Hydra takes from the process rather than the files
        return cfg

    def _hydra_compose(self, full: tuple[str, ...]) -> DictConfig:
        """Hydra's composition, or the one kept from an earlier plan where compositions are kept (never changed)."""
        if self.fingerprint is None:
            return compose(CONFIG_NAME, overrides=list(full), return_hydra_config=True)
        key = (str(CONF_DIR), self.fingerprint, *full)
        return remember(COMPOSED, key, lambda: compose(CONFIG_NAME, overrides=list(full), return_hydra_config=True))

    def parse(self, overrides: Sequence[str]) -> list[Override]:
        try:
            return self.parser.parse_overrides(list(overrides))
        except HydraException as e:
            raise SweepError(f"cannot parse the overrides {' '.join(overrides)}: {e}") from e

    def _parse_one(self, text: str) -> Override:
        # A sweep repeats the same few override strings across all its cells: parse each once.
        if text not in self._parsed:
            self._parsed[text] = self.parse([text])[0]
        return self._parsed[text]

    def _is_plain_value(self, o: Override, sweeps_too: bool = False) -> bool:
        """A ``key=value`` override of a config value (not a group choice, not an addition or deletion)."""
        key = o.key_or_group
        return (
            o.type is OverrideType.CHANGE
            and o.package is None
            and "/" not in key
            and key not in self.groups
            and not key.startswith("hydra.")
            and (sweeps_too or not o.is_sweep_override())
        )

    def _base(self, structural: tuple[str, ...]) -> _Base:
        if structural not in self._bases:
            key = (str(CONF_DIR), str(self.fingerprint), *self.search_overrides, "\0", *structural)
            shared = _BASES.get(key) if self.fingerprint is not None else None
            if shared is None:
                cfg = self.compose(structural)
                choices = dict(cfg.hydra.runtime.choices)
                with open_dict(cfg):
                    del cfg["hydra"]
                raw = OmegaConf.to_container(cfg, resolve=False)
                container = cast(Container, OmegaConf.to_container(cfg, resolve=True))
                shared = _Base(cfg, choices, container, "${" in repr(raw))
                if self.fingerprint is not None and not shared.has_interpolation:
                    # Nothing in it is resolved at use, so other plans may share it.
                    _BASES[key] = shared
                    while len(_BASES) > CACHE_MAX:
                        _BASES.popitem(last=False)
            self._bases[structural] = shared
        return self._bases[structural]

    def hydra_node(self, overrides: Sequence[str]) -> DictConfig:
        """The hydra node (sweep dir, sweeper params) of a representative config: the kept composition's, to be read
        only."""
        parsed = self.parse(overrides)
        # Plain values are left out here: compose_cell checks them, with messages that name the accepted keys.
        firsts = [_first_choice(o) for o in parsed if not self._is_plain_value(o, sweeps_too=True)]
        try:
            cfg = self.compose(firsts, copied=False)
        except (HydraException, OmegaConfBaseException) as e:
            raise SweepError(_explain(e, firsts)) from e
        return cast(DictConfig, cfg.hydra)

    def _checked_value(
        self, structural: tuple[str, ...], base: _Base, o: Override, overrides: Sequence[str]
    ) -> ConfigValue:
        """The override's value as the typed config holds it, checked once per distinct override and base."""
        cache_key = (structural, o.input_line or "")
        if cache_key not in self._values:
            key = o.key_or_group
            # Only the key's top-level section is copied, not the whole config (most of planning's time, once a
            # copy per value of a swept key): a copied node keeps its parent, so the root's struct and read-only
            # flags, and its types, still judge the value.
            top, _, rest = key.partition(".")
            section = base.cfg._get_node(top) if rest else None
            cfg, path = (copy.deepcopy(section), rest) if isinstance(section, DictConfig) else (None, key)
            if cfg is None:
                cfg = copy.deepcopy(base.cfg)
            try:
                OmegaConf.update(cfg, path, o.value(), merge=True)
            except OmegaConfBaseException as e:
                raise SweepError(_explain_key(base.cfg, key, e, base.choices, overrides)) from e
            node = OmegaConf.select(cfg, path)
            if isinstance(node, (DictConfig, ListConfig)):
                node = OmegaConf.to_container(node, resolve=True)
            self._values[cache_key] = cast(ConfigValue, node)
        return self._values[cache_key]

    def origin(self, overrides: Sequence[str], key: str) -> str:
        """Where the cell's value of ``key`` comes from: the command line (``key=``, ``+key=``, ``++key=``), or the
        config-group file chosen."""
        parsed = [self._parse_one(text) for text in overrides]
        added = (OverrideType.ADD, OverrideType.FORCE_ADD)
        if any(o.key_or_group == key and (self._is_plain_value(o, True) or o.type in added) for o in parsed):
            return "set on the command line"
        structural = tuple(o.input_line or "" for o in parsed if not self._is_plain_value(o))
        choices = self._base(structural).choices
        group = key.split(".")[0]
        where = f"conf/{group}/{choices[group]}.yaml" if choices.get(group) else "conf/config.yaml"
        if choices.get("experiment"):
            where += f" or conf/experiment/{choices['experiment']}.yaml"
        return f"from {where}"

    def compose_cell(self, overrides: Sequence[str]) -> Container:
        """The cell's resolved config as a plain dict, exactly as Hydra would compose it."""
        parsed = [self._parse_one(text) for text in overrides]
        structural = tuple(o.input_line or "" for o in parsed if not self._is_plain_value(o))
        try:
            base = self._base(structural)
        except (HydraException, OmegaConfBaseException) as e:
            raise SweepError(_explain(e, overrides)) from e
        plain = [o for o in parsed if self._is_plain_value(o)]
        if base.has_interpolation:
            # A value may feed an interpolation elsewhere: apply the overrides to the config itself and resolve.
            cfg = copy.deepcopy(base.cfg)
            for o in plain:
                try:
                    OmegaConf.update(cfg, o.key_or_group, o.value(), merge=True)
                except OmegaConfBaseException as e:
                    raise SweepError(_explain_key(cfg, o.key_or_group, e, base.choices, overrides)) from e
            return cast(Container, OmegaConf.to_container(cfg, resolve=True))
        cell = _copy_tree(base.container)
        assert isinstance(cell, dict)
        for o in plain:
            _set_path(cell, o.key_or_group, self._checked_value(structural, base, o, overrides))
        return cell


def _explain(e: Exception, overrides: Sequence[str]) -> str:
    # Hydra appends its whole search path to a missing-config error; the list of options before it is what helps.
    msg = str(e).split("\nConfig search path:")[0].strip()
    return f"in the cell {' '.join(overrides)}: {msg}"


def _explain_key(cfg: DictConfig, key: str, e: Exception, choices: dict[str, str], overrides: Sequence[str]) -> str:
    """Name the bad key, the file it would come from, and the keys accepted there."""
    parent_key, _, leaf = key.rpartition(".")
    parent = OmegaConf.select(cfg, parent_key) if parent_key else cfg
    where = f"conf/{parent_key}/{choices[parent_key]}.yaml" if parent_key in choices else "conf/config.yaml"
    if isinstance(parent, DictConfig) and leaf not in parent:
        accepted = ", ".join(str(k) for k in parent.keys())
        return (
            f"unknown key '{key}' (in the cell {' '.join(overrides)}): {where} has no '{leaf}'. "
            f"Accepted keys{' under ' + parent_key if parent_key else ''}: {accepted}"
        )
    msg = str(e).splitlines()[0]
    return f"bad value for '{key}' (in the cell {' '.join(overrides)}; {where}): {msg}"


def expand(composer: Composer, overrides: Sequence[str], sweeper_params: dict[str, str]) -> list[list[str]]:
    """Hydra's BasicSweeper expansion: sweeper params first, command-line overrides win on the same key."""
    params = [f"{k}={v}" for k, v in sweeper_params.items()]
    parsed = composer.parse([*params, *overrides])
    try:
        batches = BasicSweeper.split_arguments(parsed, None)
    except HydraException as e:
        raise SweepError(str(e)) from e
    return [list(cell) for cell in batches[0]]


def _spread_over_nodes(typed: Config, container: Container) -> tuple[Config, str | None]:
    """For ``gpudays plan``: a cell with more GPUs than a node holds, on one node, costed on the nodes it needs.

    A plan submits nothing, so it costs what the user asked where a sweep would refuse it; the note says what a
    sweep would need. The cell is then another cell (its id names its nodes), as the sweep of that command is."""
    per_node = typed.cluster.gpus_per_node
    if typed.num_nodes != 1 or typed.num_gpus <= per_node or typed.num_gpus % per_node:
        return typed, None
    nodes = typed.num_gpus // per_node
    container["num_nodes"] = nodes
    note = (
        f"{cells_mod.label(typed)}: costed on {nodes} nodes of {per_node} GPUs (cluster.gpus_per_node); "
        f"a sweep needs num_nodes={nodes}"
    )
    return replace(typed, num_nodes=nodes), note


def plan(
    overrides: Sequence[str], search_dirs: Sequence[Path] = (), sweep_dir: Path | None = None, costing: bool = False
) -> Plan:
    """Compose and judge every cell the overrides describe. Raises SweepError on bad input.

    ``costing`` (``gpudays plan``, which submits nothing): a cell is costed on whatever cluster it names, so what
    only a submission needs (a multi-node cell on ``cluster=local``) is not refused, and GPUs past one node are
    spread over the nodes they need rather than refused."""
    overrides = list(overrides) or list(DEMO_OVERRIDES)
    register_schemas()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="gpudays"):
        composer = Composer(search_dirs)
        hydra_node = composer.hydra_node(overrides)
        sweeper_params = dict(hydra_node.sweeper.params or {})
        root = Path(sweep_dir) if sweep_dir is not None else Path(str(hydra_node.sweep.dir))
        cell_overrides = expand(composer, overrides, sweeper_params)

        errors: list[str] = []
        notes: list[str] = []
        by_id: dict[str, Cell] = {}
        duplicates = 0
        for ov in cell_overrides:
            try:
                container = composer.compose_cell(ov)
            except SweepError as e:
                errors.append(str(e))
                continue
            except OmegaConfBaseException as e:
                errors.append(_explain(e, ov))
                continue
            assert isinstance(container, dict)
            typed = cells_mod.for_its_gpu(sbatch_template.resolved(to_config(container), search_dirs))
            bad = cells_mod.check_values(typed)
            if bad:
                errors.extend(f"in the cell {' '.join(ov)}: {r} ({composer.origin(ov, r.key)})" for r in bad)
                continue
            if costing:
                typed, note = _spread_over_nodes(typed, container)
                notes += [note] if note else []
            cid = cells_mod.cell_id(typed)
            if cid in by_id:
                duplicates += 1
                continue
            by_id[cid] = Cell(ov, container, typed, cid, cells_mod.check_runnable(typed, submitting=not costing))
    GlobalHydra.instance().clear()
    if errors:
        unique = list(dict.fromkeys(errors))
        shown = "\n  ".join(unique[:20])
        more = f"\n  ... and {len(unique) - 20} more" if len(unique) > 20 else ""
        raise SweepError(f"{len(unique)} problem(s) in the sweep; nothing was submitted:\n  {shown}{more}")
    runnable = [c for c in by_id.values() if not c.refusals]
    skipped = [c for c in by_id.values() if c.refusals]
    name = runnable[0].typed.name if runnable else (skipped[0].typed.name if skipped else "gpudays")
    return Plan(root, name, list(overrides), runnable, skipped, duplicates, notes)


def refuse_unfit(p: Plan, margin: float) -> None:
    """Refuse the runnable cells whose prediction says they do not fit even at micro-batch 1 (with ``margin``, the
    share of GPU memory kept free). The prediction is attached by the command line (``orchestrator.cli.display.prediction``):
    planning judges what it is given and never calls the predictor itself."""
    kept: list[Cell] = []
    for cell in p.cells:
        if cell.prediction.get("predicted_fits") is False:
            peak = cell.prediction.get("predicted_peak_memory_gib")
            micro = cell.prediction.get("predicted_micro_batch_size")
            # The probe's own limit where the cell sets one, as the predictor judged it (and as the probe will).
            limit = cell.typed.probe.memory_limit_gib
            usable = (
                f"{limit:.3g} GiB usable (probe.memory_limit_gib)"
                if limit
                else f"{cell.typed.gpu.memory_gib * (1 - margin):.1f} GiB usable ({margin:.0%} margin)"
            )
            fixed = cell.typed.method.micro_batch_size
            # A smaller micro-batch is offered only where micro-batch 1 would fit (else auto is refused too).
            at_one = cell.prediction.get("predicted_fits_at_micro_batch_1")
            smaller = (
                "method.micro_batch_size=auto (a smaller micro-batch), "
                if str(fixed) not in ("auto", "1") and at_one is not False
                else ""
            )
            shard = engine_spec(cell.typed.method.engine).not_fit_advice
            build = cell.prediction.get("predicted_build_peak_gib")
            if isinstance(build, float) and isinstance(peak, float) and build > peak:  # the build is what fails
                need = f"about {build:.3g} GiB per GPU while building the model, {usable}"
                advice = f"try more GPUs or {shard}, or run it anyway (--run-unfit)"
            else:
                need = f"about {peak:.3g} GiB per GPU at micro-batch {micro:.0f}, {usable}"
                advice = f"try {smaller}more GPUs, {shard} or activation checkpointing, or run it anyway (--run-unfit)"
            cell.refusals.append(Refusal("prediction", f"predicted not to fit: {need}; {advice}"))
            p.skipped.append(cell)
        else:
            kept.append(cell)
    p.cells = kept


def compose_one(overrides: Sequence[str], search_dirs: Sequence[Path] = ()) -> DictConfig:
    """Compose a single cell (with its hydra node), for ``--cfg``."""
    register_schemas()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="gpudays"):
        composer = Composer(search_dirs)
        parsed = composer.parse(list(overrides))
        firsts = [_first_choice(o) for o in parsed]
        try:
            return compose(CONFIG_NAME, overrides=[*composer.search_overrides, *firsts], return_hydra_config=True)
        except (HydraException, OmegaConfBaseException) as e:
            raise SweepError(_explain(e, firsts)) from e
        finally:
            GlobalHydra.instance().clear()
