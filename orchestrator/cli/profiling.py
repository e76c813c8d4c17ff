"""``gpudays profile``: measure this machine's rates once per hardware identity, keep them in a sweep folder's
``profiles/``, and reuse them where a profile of the same hardware is already there (``--again`` measures anew)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.cli.errors import CommandError, Exit

if TYPE_CHECKING:
    from orchestrator.config.schema import ModelConfig
    from orchestrator.profile.record import Profile
    from orchestrator.profile.runner import Plan
    from orchestrator.store.paths import SweepPaths

BUDGET_S = 120.0
"""The most a profile spends measuring on one node type: two GPU-minutes."""
CPU_TOKENS = 128
"""Rows of each product on the CPU, where a model's whole sequence would take minutes (a 128 x 512 @ 512 x 50304
bf16 product takes seconds on one core)."""
CPU_MEMORY_BYTES, GPU_MEMORY_BYTES = 64 * 2**20, 1 << 30
DEFAULT_LARGEST = {"cpu": "4M", "cuda": "64M"}
SMALLEST_MESSAGE = 4 * 1024


def parse_bytes(text: str, flag: str) -> int:
    """``4096``, ``64K``, ``4M``, ``1G`` (binary units) as bytes; CommandError naming the flag otherwise."""
    found = re.fullmatch(r"\s*([0-9]+)\s*([KMG]?)i?B?\s*", text, re.IGNORECASE)
    if not found or int(found[1]) == 0:
        raise CommandError(f"{flag} {text}: give a size in bytes above 0, e.g. 4096, 64K, 4M, 1G")
    power = " KMG".index(found[2].upper() or " ")
    return int(found[1]) * int(1024**power)


def _names(text: str | None) -> list[str]:
    return [n.strip() for n in (text or "").split(",") if n.strip()]


def _conf_models(names: list[str]) -> list[ModelConfig]:
    from orchestrator.config.groups import BadGroupFile, read_group
    from orchestrator.config.places import CONF_DIR
    from orchestrator.config.schema import ModelConfig, to_section

    try:
        known = read_group(CONF_DIR / "model")
    except BadGroupFile as e:
        raise CommandError(str(e)) from None
    out = []
    for name in names:
        if name not in known:
            raise CommandError(f"--model {name}: no such model; known (conf/model): {', '.join(sorted(known))}")
        model = to_section("model", known[name])
        assert isinstance(model, ModelConfig)
        out.append(model)
    return out


def _from_cells(paths: SweepPaths) -> tuple[list[ModelConfig], list[str]]:
    """The models and precisions of the cells already in a sweep folder (each once)."""
    from orchestrator.config.schema import ModelConfig, to_section
    from orchestrator.store.cell_config import BadCellConfig, read_cell_config

    models: dict[str, ModelConfig] = {}
    precisions: dict[str, None] = {}
    for cid in paths.cell_ids():
        try:
            cell = read_cell_config(paths.cell_config(cid))
            model = to_section("model", cell.get("model"))
        except (BadCellConfig, ValueError, TypeError) as e:
            raise CommandError(f"cell {cid} of {paths.root}: {e}; name the models with --model instead") from None
        assert isinstance(model, ModelConfig)
        models.setdefault(model.name, model)
        method = cell.get("method")
        precision = method.get("precision") if isinstance(method, dict) else None
        if isinstance(precision, str):
            precisions.setdefault(precision)
    return list(models.values()), list(precisions)


def plan_of(args: argparse.Namespace, paths: SweepPaths, device: str) -> Plan:
    """What to measure: the shapes of the models named (or of the folder's cells), in the precisions asked."""
    models, precisions = _from_cells(paths)
    if args.model:
        models = _conf_models(_names(args.model))
    if not models:
        raise CommandError(
            f"{paths.root} holds no cells to take model shapes from: name the models with --model "
            "(conf/model names, comma-separated), e.g. --model pythia-160m"
        )
    return plan_for(models, precisions, device, args)


def plan_for(models: list[ModelConfig], precisions: list[str], device: str, args: argparse.Namespace) -> Plan:
    """What to measure for these models (each once), in ``--precision``'s precisions or else these (bf16 where
    none is given), with ``args``' ``tokens``, ``max_message`` and ``seconds_each`` where set (each may be None)."""
    from orchestrator.profile import attention, matmul
    from orchestrator.profile.runner import Plan, message_sizes
    from orchestrator.profile.timing import DTYPES

    models = list({m.name: m for m in models}.values())
    precisions = list(dict.fromkeys(precisions))
    dtypes = _names(args.precision) or precisions or ["bf16"]
    if unknown := [d for d in dtypes if d not in DTYPES]:
        raise CommandError(f"--precision {args.precision}: unknown {', '.join(unknown)}; use {', '.join(DTYPES)}")
    if args.tokens is not None and args.tokens < 1:
        raise CommandError(f"--tokens {args.tokens}: give the rows of each product, 1 or more")
    linear, heads = [], []
    for m in models:
        seq = m.seq_length if device == "cuda" else min(m.seq_length, CPU_TOKENS)
        linear += matmul.shapes_of(m, args.tokens or seq)
        heads.append(attention.shape_of(m, seq))
    largest = parse_bytes(args.max_message or DEFAULT_LARGEST[device], "--max-message")
    if largest < SMALLEST_MESSAGE:
        raise CommandError(f"--max-message {args.max_message}: give {SMALLEST_MESSAGE} bytes (4K) or more")
    memory = CPU_MEMORY_BYTES if device == "cpu" else GPU_MEMORY_BYTES
    plan = Plan(
        tuple(matmul.unique(linear)), tuple(dict.fromkeys(heads)), tuple(dtypes),
        message_sizes(SMALLEST_MESSAGE, largest), memory,
    )  # fmt: skip
    local, per_link = plan.figures()
    # Half of the budget for the products, attention and memory, half for the collectives on two links.
    each = args.seconds_each or min(0.2, BUDGET_S / 2 / local / 2)  # blocked_autorange runs up to about twice it
    collective = args.seconds_each or min(0.1, BUDGET_S / 2 / (2 * per_link) / 2)
    return Plan(plan.linear, plan.attention, plan.dtypes, plan.message_bytes, memory, plan.ops, each, collective)


def run(args: argparse.Namespace) -> int:
    import torch

    from orchestrator.cli.display import console
    from orchestrator.profile.identity import this_machine
    from orchestrator.profile.record import BadProfile, find_profile, write_profile
    from orchestrator.profile.runner import ProfileFailed, in_job, profile_here, profile_in_job
    from orchestrator.store.paths import SweepPaths

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise CommandError("--device cuda: torch sees no CUDA GPU on this machine; use --device cpu")
    backend = "nccl" if device == "cuda" else "gloo"
    if args.ranks is not None and args.ranks < 1:
        raise CommandError(f"--ranks {args.ranks}: give 1 or more")
    paths = SweepPaths(Path(args.dir))
    if paths.root.exists() and not paths.root.is_dir():
        raise CommandError(f"--dir {args.dir}: a file is in the way; give a sweep folder")
    plan = plan_of(args, paths, device)
    if in_job():
        profile = profile_in_job(plan, backend)
        if profile is None:
            return Exit.OK
    else:
        ranks = args.ranks or (torch.cuda.device_count() if device == "cuda" else 2)
        identity = this_machine(backend, ranks, 1)
        others = [SweepPaths(Path(d)) for d in args.sweeps or []]
        if missing := [str(o.root) for o in others if not o.root.is_dir()]:
            raise CommandError(f"--from {', '.join(missing)}: no such sweep folder")
        try:
            found = None if args.again else find_profile([paths, *others], identity)
        except BadProfile as e:
            raise CommandError(f"{e}; remove it, or measure anew with --again") from None
        if found is not None:
            where, profile = found
            if where.parent != paths.profiles_dir:
                where = write_profile(paths, profile)
            console.out(f"reusing the profile of {identity.describe()} measured {profile.measured_at}: {where} "
                        "(--again measures anew)")  # fmt: skip
            show(profile)
            return Exit.OK
        local, per_link = plan.figures()
        console.out(f"profiling {identity.describe()}: {local} products, attention and memory figures, "
                    f"{per_link} collective figures a link")  # fmt: skip
        try:
            profile = profile_here(plan, ranks, backend)
        except ProfileFailed as e:
            raise CommandError(f"{e}; nothing was written", Exit.CELLS_FAILED) from None
        except ValueError as e:
            raise CommandError(str(e)) from None
    where = write_profile(paths, profile)
    show(profile)
    console.out(f"profile written: {where}")
    return Exit.OK


def show(profile: Profile) -> None:
    """The profile's figures, a line each."""
    from analysis.predict.outliers import slow_attention, slow_products
    from orchestrator.cli.display import console
    from orchestrator.cli.display.figures import figure

    console.out(f"{profile.identity.describe()}, measured {profile.measured_at} in {profile.wall_s:.1f} s")
    slow = slow_products(profile.matmuls)
    for i, t in enumerate(profile.matmuls):
        console.out(f"  matmul {t.label:<24} {t.step:<16} ({t.m}x{t.k})@({t.k}x{t.n}) {t.dtype:<5} "
                    f"{figure(t.tflops * 1e3)} GFLOP/s{f': {slow[i]}' if i in slow else ''}")  # fmt: skip
    slow = slow_attention(profile.attention)
    for i, a in enumerate(profile.attention):
        console.out(f"  sdpa seq {a.seq_len} x {a.heads} heads of {a.head_dim} {a.dtype:<5} forward "
                    f"{figure(a.forward_tflops * 1e3)} GFLOP/s, backward {figure(a.backward_tflops * 1e3)} GFLOP/s"
                    f"{f': {slow[i]}' if i in slow else ''}")  # fmt: skip
    for s in profile.memory:
        console.out(f"  memory {s.op:<5} {s.bytes_moved / 2**20:g} MiB moved: {figure(s.gbytes_s)} GB/s")
    for c in profile.collectives:
        rate = "no rate (time did not grow with size)" if c.gbytes_s is None else f"{figure(c.gbytes_s)} GB/s"
        console.out(f"  {c.op:<14} {c.link:<5} {c.ranks} ranks: latency {figure(c.latency_s * 1e6)} us, {rate} "
                    f"(r2 {c.r2:.2f}; {c.sizes_bytes[0]}-{c.sizes_bytes[-1]} bytes)")  # fmt: skip
