"""``gpudays profile`` on this machine's CPU: two gloo ranks time a tiny model's products, attention, a memory
stream and every collective at three sizes (seconds), keep the profile in the sweep folder, find it again for the
same hardware, and say clearly what is wrong with a damaged one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.cli.main import main
from orchestrator.profile.identity import this_machine
from orchestrator.profile.record import OPS, find_profile, profile_for, profiles_in, read_profile
from orchestrator.profile.runner import message_sizes, profile_here
from orchestrator.store.paths import SweepPaths

QUICK = ["--model", "pythia-tiny", "--precision", "fp32", "--tokens", "64", "--max-message", "4M"]
QUICK += ["--seconds-each", "0.005", "--ranks", "2", "--device", "cpu"]


def test_a_cpu_profile_is_measured_kept_and_found_again(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profile", "--dir", str(tmp_path), *QUICK]) == 0
    [where] = profiles_in(SweepPaths(tmp_path))
    profile = read_profile(where)
    identity = this_machine("gloo", 2, 1)
    assert profile.identity == identity
    assert {(t.label.split()[-1], t.step) for t in profile.matmuls} == {
        (w, s) for w in ("qkv", "out", "ffn", "vocab") for s in ("forward", "backward_input", "backward_weight")
    }
    assert {(t.m, t.k, t.n) for t in profile.matmuls if t.label.endswith("vocab")} == {
        (64, 64, 512), (64, 512, 64), (512, 64, 64),
    }  # fmt: skip
    assert all(t.tflops > 0 for t in profile.matmuls)
    [heads] = profile.attention
    assert (heads.seq_len, heads.heads, heads.head_dim) == (128, 4, 16) and heads.forward_tflops > 0
    assert {s.op for s in profile.memory} == {"copy", "add"} and all(s.gbytes_s > 0 for s in profile.memory)
    assert [c.op for c in profile.collectives] == list(OPS) and {c.link for c in profile.collectives} == {"intra"}
    for c in profile.collectives:
        assert c.sizes_bytes == message_sizes(4096, 4 << 20) and all(s > 0 for s in c.seconds)
        assert c.gbytes_s is not None and c.gbytes_s > 0, f"{c.op}: time did not grow with size {c.seconds}"
    shown = capsys.readouterr().out
    assert "profile written" in shown and "all_reduce" in shown

    # A second run on the same hardware reuses it, and copies it into another sweep folder that asks.
    other = tmp_path / "later"
    assert main(["profile", "--dir", str(other), "--from", str(tmp_path), *QUICK]) == 0
    assert "reusing the profile" in capsys.readouterr().out
    assert read_profile(SweepPaths(other).profile(identity.key())) == profile
    # Another layout of the same machine is other hardware: not found, refused when named.
    one_rank = this_machine("gloo", 1, 1)
    assert find_profile([SweepPaths(tmp_path)], one_rank) is None
    with pytest.raises(ValueError, match="gpus_per_node: 2 != 1"):
        profile_for(where, one_rank)

    # A damaged profile is said, with the file, not passed over.
    where.write_text(json.dumps({"format": 1, "identity": {"gpu_name": "cpu"}}))
    assert main(["profile", "--dir", str(tmp_path), *QUICK]) == 2
    said = capsys.readouterr().err
    assert str(where.name) in said and "identity: missing" in said and "--again" in said


def test_one_rank_profiles_without_collectives(tmp_path: Path) -> None:
    from orchestrator.profile.attention import AttentionShape
    from orchestrator.profile.matmul import LinearShape
    from orchestrator.profile.runner import Plan

    plan = Plan((LinearShape("x", 8, 8, 8),), (AttentionShape(16, 2, 8),), ("fp32",), (4096,), 1 << 16)
    plan = Plan(plan.linear, plan.attention, plan.dtypes, plan.message_bytes, plan.memory_bytes, min_run_s=0.002)
    profile = profile_here(plan, 1, "gloo")
    assert profile.collectives == () and profile.identity.gpus_per_node == 1 and len(profile.matmuls) == 3


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--max-message", "lots"], "--max-message lots: give a size in bytes"),
        (["--max-message", "1K"], "give 4096 bytes (4K) or more"),
        (["--precision", "fp8"], "--precision fp8: unknown fp8"),
        (["--model", "no-such-model"], "--model no-such-model: no such model"),
        (["--tokens", "0"], "--tokens 0: give the rows"),
        (["--ranks", "0"], "--ranks 0: give 1 or more"),
        (["--from", "/no/such/sweep"], "--from /no/such/sweep: no such sweep folder"),
    ],
)
def test_bad_flags_are_said(tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], said: str) -> None:
    assert main(["profile", "--dir", str(tmp_path), "--model", "pythia-tiny", "--device", "cpu", *flags]) == 2
    assert said in capsys.readouterr().err


def test_a_folder_without_cells_needs_models(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profile", "--dir", str(tmp_path), "--device", "cpu"]) == 2
    assert "name the models with --model" in capsys.readouterr().err
