"""The probe with real DeepSpeed on the CPU: every ZeRO stage, offload, checkpointing, bf16/fp16/fp32, compile,
one and two ranks, the micro-batch search under an imposed memory limit, and each failure status from a real
failure.

Each test composes the real config from conf/ (pythia-tiny, probe=quick) and runs the probe as the job would, one
process per rank (``python -m orchestrator.job.by_hand``), so DeepSpeed's global state never leaks between cells.
Settings are grouped so that each run covers several of them and the file stays short on a two-core machine.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import forked_ranks
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from orchestrator.planning.compose_cache import register_configs

pytestmark = pytest.mark.deepspeed

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
REPO = CONF_DIR.parent
RUN_TIMEOUT_S = 300

# A pythia-tiny whose activations dominate its memory (eager attention keeps the a*s^2 scores, fp32 doubles
# everything): on one rank a trial at micro-batch 16 needs about 0.4 GiB above the resident set before the model
# was built, 8 about 0.2-0.25, 4 about 0.15-0.18, 1 about 0.05-0.09 (measured on this machine kind), and building
# the model 0.009-0.014 (the more in a forked rank, which faults its libraries' pages in again). So 16 never fits
# in 0.3 GiB, and in 0.03 the model builds but nothing trains. Two ZeRO-2 ranks hold more each (DeepSpeed's
# buffers, gloo's): 4 about 0.27-0.30, 2 about 0.19-0.21, 1 about 0.14-0.15 (measured), so 0.245 GiB parts 2 from
# 4 with room either side.
MEMORY_HUNGRY = ["model.seq_length=512", "method.attention=eager", "method.precision=fp32"]


def compose_cell(*overrides: str) -> dict[str, Any]:
    """The resolved config of one cell, composed from conf/ as `gpudays sweep` does, with a short probe."""
    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        # probe=quick, shortened further: these tests check what the probe does, not how precisely it times.
        quick = ["probe=quick", "probe.min_steps=2", "probe.max_steps=4"]
        cfg = compose(config_name="config", overrides=["model=pythia-tiny", "gpu=cpu", *quick, *overrides])
    container = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(container, dict)
    return container


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_probe_ranks(
    cell: dict[str, Any],
    tmp_path: Path,
    world_size: int = 1,
    ranks: list[int] | None = None,
    env: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    """Run ``ranks`` (default: all) of a ``world_size``-rank probe, each its own process; their results.

    The ranks are forked from a process that has imported torch and transformers (``forked_ranks``), unless
    ``env`` adds more than the ranks' own variables: then each is a fresh ``python -m orchestrator.job.by_hand``.
    """
    cell_yaml = tmp_path / "cell.yaml"
    OmegaConf.save(OmegaConf.create(cell), cell_yaml)
    port = str(_free_port())
    fresh = bool(set(env or {}) - RANK_VARIABLES)
    procs: list[tuple[int, Path, Path, Any]] = []
    for rank in ranks if ranks is not None else range(world_size):
        rank_env = {
            **os.environ,
            "DS_ACCELERATOR": "cpu",
            "RANK": str(rank),
            "WORLD_SIZE": str(world_size),
            "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(world_size),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
            "OMP_NUM_THREADS": "1",
            **(env or {}),
        }
        out, log = tmp_path / f"rank{rank}.json", tmp_path / f"rank{rank}.log"
        argv = [str(cell_yaml), "--out", str(out)]
        if fresh:
            with open(log, "w") as stream:
                cmd = [sys.executable, "-m", "orchestrator.job.by_hand", *argv]
                proc: Any = subprocess.Popen(cmd, cwd=REPO, env=rank_env, stdout=stream, stderr=stream)
        else:
            proc = forked_ranks.start_rank(argv, rank_env, str(REPO), str(log))
        procs.append((rank, out, log, proc))
    deadline = time.monotonic() + RUN_TIMEOUT_S
    results = []
    for rank, out, log, proc in procs:
        if not _ended(proc, deadline - time.monotonic()):
            for *_, other in procs:
                other.kill()
            pytest.fail(f"rank {rank} still running after {RUN_TIMEOUT_S} s; log: {log}")
        tail = log.read_text()[-3000:]
        code = proc.returncode if fresh else proc.exitcode
        assert out.exists(), f"rank {rank} wrote no result (exit {code}):\n{tail}"
        results.append(json.loads(out.read_text()))
    return results


RANK_VARIABLES = frozenset({"LOCAL_WORLD_SIZE"})
"""What ``env`` may set and still run forked ranks: a rank's own place, read when the probe starts."""


def _ended(proc: Any, timeout_s: float) -> bool:
    """Whether a rank (a Popen or a forked Process) ended within ``timeout_s``."""
    if isinstance(proc, subprocess.Popen):
        try:
            proc.wait(timeout=max(0.0, timeout_s))
        except subprocess.TimeoutExpired:
            return False
        return True
    proc.join(max(0.0, timeout_s))
    return proc.exitcode is not None


def assert_measured(result: dict[str, Any], cell: dict[str, Any]) -> dict[str, Any]:
    """Checks every successful record must pass; returns its metrics."""
    assert result["status"] == "ok", (result["reason"], result["traceback"])
    m = result["metrics"]
    probe = cell["probe"]
    assert 1 <= m["steps_timed"] <= probe["max_steps"]
    assert m["steps_timed"] >= probe["min_steps"] or m["stop_reason"] == "time_budget"
    assert len(m["step_times_s"]) == m["steps_timed"]
    assert min(m["step_times_s"]) <= m["step_time_s"] <= max(m["step_times_s"])
    assert len(m["step_cpu_times_s"]) == m["steps_timed"] and m["step_cpu_time_s"] > 0
    assert m["per_gpu_batch_size"] == cell["model"]["global_batch_size"] // cell["num_gpus"]
    assert m["micro_batch_size"] * m["grad_accum_steps"] == m["per_gpu_batch_size"]
    assert m["tokens_per_step"] == cell["model"]["global_batch_size"] * cell["model"]["seq_length"]
    assert m["tokens_per_s"] == pytest.approx(m["tokens_per_step"] / m["step_time_s"])
    assert m["tokens_per_s_per_gpu"] == pytest.approx(m["tokens_per_s"] / cell["num_gpus"])
    assert m["num_parameters"] == cell["model"]["num_parameters"]
    assert m["mfu"] is None and m["hfu"] is None, "gpu=cpu has no published peak"
    assert m["model_tflops_per_gpu"] > 0
    # Uniform random tokens: a few steps leave the loss near ln(vocab); it must be a number.
    assert math.isfinite(m["final_loss"]) and abs(m["final_loss"] - math.log(cell["model"]["vocab_size"])) < 2
    assert m["peak_memory_allocated_gib"] > 0 and m["host_rss_gib"] > m["peak_memory_allocated_gib"]
    for phase in ("startup_s", "warmup_s", "timed_s"):
        assert m[phase] > 0, phase
    assert m["probe_wall_s"] >= m["startup_s"] + m["search_s"] + m["warmup_s"] + m["timed_s"] - 1e-6
    env = result["environment"]
    engine = cell["method"].get("engine", "deepspeed")
    assert env["engine"] == engine
    for key in ("torch", engine, "transformers", "python", "hostname", "device_name"):
        assert env[key], key
    assert env["world_size"] == cell["num_gpus"]
    return m


def cpu_supports(precision: str) -> bool:
    """Whether DeepSpeed's CPU accelerator can train in ``precision`` here (fp16 needs AVX-512 FP16)."""
    from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator

    accelerator = CPU_Accelerator()
    checks = {"fp16": accelerator.is_fp16_supported, "bf16": accelerator.is_bf16_supported}
    return precision not in checks or bool(checks[precision]())


def test_zero0_bf16_fixed_micro_batch_composed_timing_one_rank(tmp_path: Path) -> None:
    cell = compose_cell("method.zero_stage=0", "method.precision=bf16", "method.micro_batch_size=1")
    (result,) = run_probe_ranks(cell, tmp_path)
    m = assert_measured(result, cell)
    assert (m["micro_batch_size"], m["grad_accum_steps"]) == (1, 16)
    # 16 micro-steps a step: each sample times 4 inside the cycle and the boundary one, and composes the step.
    assert m["step_time_method"] == "composed"
    assert m["micro_steps_timed"] == 5 * m["steps_timed"]
    assert m["micro_step_time_s"] > 0 and m["boundary_time_s"] is not None
    composed = 16 * m["micro_step_time_s"] + m["boundary_time_s"]
    assert m["step_time_s"] == pytest.approx(composed, rel=0.25), "medians of the parts compose the median step"
    assert m["timed_s"] < sum(m["step_times_s"]), "a composed sample costs less than the step it stands for"
    assert m["search_s"] == 0 and "search_tried" not in m
    assert result["environment"]["compiled"] is False
    ds = result["environment"]["ds_config"]
    assert ds["zero_optimization"] == {"stage": 0}
    assert ds["bf16"] == {"enabled": True}
    assert ds["gradient_accumulation_steps"] == 16 and ds["train_micro_batch_size_per_gpu"] == 1
    assert ds["optimizer"]["params"]["torch_adam"] is True
    assert m["hardware_tflops_per_gpu"] == pytest.approx(m["model_tflops_per_gpu"]), "no recomputation"


@pytest.mark.parametrize("scope", ["regional", "whole"])
def test_zero1_offload_optimizer_fp32_checkpointing_compiled_one_rank(tmp_path: Path, scope: str) -> None:
    # fp32: torch.compile of this model in bf16 hits a C++ code-generation error of Inductor's CPU backend
    # (torch 2.13), which the probe records as compile_error. regional: each block and the loss compiled before
    # DeepSpeed wraps the model; whole: DeepSpeed's engine.compile().
    cell = compose_cell(
        "method.zero_stage=1",
        "method.offload_optimizer=true",
        "method.precision=fp32",
        "method.activation_checkpointing=true",
        "method.compile=true",
        f"method.compile_scope={scope}",
        "method.micro_batch_size=8",
    )
    (result,) = run_probe_ranks(cell, tmp_path)
    m = assert_measured(result, cell)
    assert result["environment"]["compiled"] is True
    assert result["environment"]["compile_scope"] == scope
    assert m["warmup_s"] > max(m["step_times_s"]), "compilation happens in the warm-up, not in the timed steps"
    ds = result["environment"]["ds_config"]
    assert ds["zero_optimization"]["stage"] == 1
    assert ds["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert "bf16" not in ds and "fp16" not in ds
    assert "torch_adam" not in ds["optimizer"]["params"], "offloading needs DeepSpeed's cpu_adam"
    # Full recomputation runs every layer's forward twice: hardware FLOPs exceed model FLOPs.
    assert m["hardware_tflops_per_gpu"] > m["model_tflops_per_gpu"]


def test_zero2_auto_micro_batch_under_a_memory_limit_two_ranks(tmp_path: Path) -> None:
    """The search shrinks below what the limit refuses, and both ranks take the same path and the same steps."""
    cell = compose_cell(
        "num_gpus=2", "method.zero_stage=2", "method.micro_batch_size=auto", "probe.memory_limit_gib=0.245",
        *MEMORY_HUNGRY,
    )  # fmt: skip
    results = run_probe_ranks(cell, tmp_path, world_size=2)
    metrics = [assert_measured(r, cell) for r in results]
    m = metrics[0]
    tried = m["search_tried"]
    assert tried[0]["micro_batch_size"] > 1, "the search starts from the memory estimate, not from 1"
    chosen = m["micro_batch_size"]
    assert chosen < m["per_gpu_batch_size"]
    assert any(t["outcome"] == "ok" and t["micro_batch_size"] == chosen for t in tried)
    refused = [t for t in tried if t["outcome"] == "oom"]
    assert refused and all(t["micro_batch_size"] > chosen for t in refused)
    assert all("memory_limit_gib=0.245" in t["reason"] for t in refused)
    assert all(t["peak_memory_gib"] > 0.245 for t in refused if t["peak_memory_gib"] is not None)
    assert all(t["peak_memory_gib"] <= 0.245 for t in tried if t["outcome"] == "ok")
    assert m["search_s"] > 0
    # Every decision is taken on numbers all ranks share.
    for key in ("search_tried", "micro_batch_size", "step_times_s", "steps_timed", "stop_reason"):
        assert metrics[1][key] == m[key], key
    assert results[0]["environment"]["ds_config"]["zero_optimization"] == {"stage": 2}


def test_zero3_offload_params_and_optimizer_16_bit_whole_steps_two_ranks(tmp_path: Path) -> None:
    # fp16 where this CPU has it (AVX-512 FP16), else bf16: the same ZeRO-3 offload path, with loss scaling or not.
    precision = "fp16" if cpu_supports("fp16") else "bf16"
    cell = compose_cell(
        "probe.step_timing=whole",
        "num_gpus=2",
        "method.zero_stage=3",
        "method.offload_optimizer=true",
        "method.offload_params=true",
        "method.activation_checkpointing=true",
        f"method.precision={precision}",
        "method.micro_batch_size=2",
    )
    results = run_probe_ranks(cell, tmp_path, world_size=2)
    metrics = [assert_measured(r, cell) for r in results]
    assert (metrics[0]["micro_batch_size"], metrics[0]["grad_accum_steps"]) == (2, 4)
    assert metrics[0]["step_time_method"] == "whole" and metrics[0]["micro_step_time_s"] is None
    assert metrics[0]["micro_steps_timed"] == 4 * metrics[0]["steps_timed"]
    assert metrics[0]["step_times_s"] == metrics[1]["step_times_s"]
    zero = results[0]["environment"]["ds_config"]["zero_optimization"]
    assert zero["stage"] == 3 and zero["offload_param"]["device"] == "cpu"
    assert zero["offload_optimizer"]["device"] == "cpu"
    if precision == "fp16":
        assert results[0]["environment"]["ds_config"]["fp16"]["loss_scale"] == 0, "dynamic loss scaling"
    assert metrics[0]["skipped_steps_timed"] >= 0


@pytest.mark.skipif(cpu_supports("fp16"), reason="this CPU has AVX-512 FP16, so an fp16 cell runs here")
def test_fp16_on_a_cpu_without_it_is_refused_in_one_line(tmp_path: Path) -> None:
    cell = compose_cell("method.precision=fp16", "method.micro_batch_size=4")
    (result,) = run_probe_ranks(cell, tmp_path)
    assert result["status"] == "failed"
    assert result["traceback"] is None, "the reason is the whole story"
    reason = result["reason"]
    assert "\n" not in reason and "method.precision=fp16" in reason and "AVX-512 FP16" in reason


def test_auto_micro_batch_when_nothing_fits_is_a_result(tmp_path: Path) -> None:
    cell = compose_cell("method.micro_batch_size=auto", "probe.memory_limit_gib=0.03", *MEMORY_HUNGRY)
    (result,) = run_probe_ranks(cell, tmp_path)
    assert result["status"] == "does_not_fit", (result["reason"], result["traceback"])
    assert result["traceback"] is None
    m = result["metrics"]
    assert m["micro_batch_size"] == 1 and "1" in result["reason"] and "memory_limit_gib=0.03" in result["reason"]
    assert [t["outcome"] for t in m["search_tried"]] == ["oom"] * len(m["search_tried"])
    assert min(t["micro_batch_size"] for t in m["search_tried"]) == 1
    assert "step_time_s" not in m


def test_fixed_micro_batch_over_the_memory_limit_is_oom(tmp_path: Path) -> None:
    cell = compose_cell("method.micro_batch_size=16", "probe.memory_limit_gib=0.3", *MEMORY_HUNGRY)
    (result,) = run_probe_ranks(cell, tmp_path)
    assert result["status"] == "oom", (result["reason"], result["traceback"])
    assert "micro-batch 16" in result["reason"] and "memory_limit_gib=0.3" in result["reason"]
    assert result["traceback"] is None, "an imposed limit raises nothing"
    assert result["metrics"]["micro_batch_size"] == 16


def test_micro_batch_that_does_not_divide_the_per_gpu_batch_is_refused(tmp_path: Path) -> None:
    cell = compose_cell("method.micro_batch_size=3")
    (result,) = run_probe_ranks(cell, tmp_path)
    assert result["status"] == "failed"
    assert "micro_batch_size=3" in result["reason"] and "1, 2, 4, 8, 16" in result["reason"]


@pytest.mark.skipif(
    importlib.util.find_spec("flash_attn") is not None, reason="flash-attn is installed here, so it would run"
)
def test_missing_attention_implementation_is_failed_with_import_error(tmp_path: Path) -> None:
    cell = compose_cell("method.attention=flash_attention_2", "method.micro_batch_size=4")
    (result,) = run_probe_ranks(cell, tmp_path)
    assert result["status"] == "failed"
    assert result["reason"].startswith("ImportError") and "FlashAttention2" in result["reason"]
    assert "build_model" in result["traceback"]


def test_torch_compile_that_cannot_write_its_code_is_a_compile_error(tmp_path: Path) -> None:
    # Inductor generates C++ into its cache folder; an existing folder nothing can be created in makes the
    # compilation itself fail, at the first forward pass.
    cell = compose_cell("method.compile=true", "method.precision=fp32", "method.micro_batch_size=4")
    (result,) = run_probe_ranks(cell, tmp_path, env={"TORCHINDUCTOR_CACHE_DIR": "/proc/self/fdinfo"})
    assert result["status"] == "compile_error", (result["reason"], result["traceback"])
    assert "Inductor" in result["reason"]
    assert "torch/_inductor" in result["traceback"]


def test_native_op_that_cannot_be_built_is_a_compile_error(tmp_path: Path) -> None:
    # DeepSpeed builds its CPU communication op with $CXX when the process group starts.
    cell = compose_cell("method.micro_batch_size=4")
    (result,) = run_probe_ranks(cell, tmp_path, env={"CXX": "/bin/false"})
    assert result["status"] == "compile_error", (result["reason"], result["traceback"])
    assert "/bin/false" in result["reason"]


def test_a_missing_rank_is_a_communication_error(tmp_path: Path) -> None:
    cell = compose_cell("num_gpus=2", "method.micro_batch_size=4")
    (result,) = run_probe_ranks(cell, tmp_path, world_size=2, ranks=[0], env={"GPUDAYS_DIST_TIMEOUT_S": "3"})
    assert result["status"] == "comm_error", (result["reason"], result["traceback"])
    assert "1/2" in result["reason"]
    assert result["traceback"]
