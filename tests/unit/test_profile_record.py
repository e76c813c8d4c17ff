"""The machine profile's record, lookup and fit, on profiles made up here (no ranks are started: the measured
profile of this machine is tests/integration/test_profile_cpu.py's)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from orchestrator.profile.collectives import fit
from orchestrator.profile.identity import Identity, cpu_model
from orchestrator.profile.rates import Link, Product, rates
from orchestrator.profile.record import (
    AttentionTime,
    BadProfile,
    CollectiveFit,
    MatmulTime,
    MemoryTime,
    Profile,
    find_profile,
    profile_for,
    read_profile,
    write_profile,
)
from orchestrator.profile.runner import message_sizes
from orchestrator.store.paths import SweepPaths

CPU = Identity("cpu", 2, 1, "AMD EPYC", "2.13.0+cpu", "gloo")


def made_up(identity: Identity = CPU, when: str = "2026-11-27T05:00:00+00:00") -> Profile:
    sizes, seconds = (4096, 65536, 1048576), (1e-4, 1.3e-4, 6e-4)
    latency, rate, r2 = fit(list(sizes), list(seconds))
    return Profile(
        identity,
        when,
        3.5,
        (MatmulTime("m qkv", "forward", 128, 64, 192, "fp32", 2e-5),),
        (AttentionTime(128, 4, 16, 1, "fp32", 1e-4, 3e-4),),
        (MemoryTime("copy", 2 << 20, 1e-4), MemoryTime("add", 3 << 20, 2e-4)),
        (CollectiveFit("all_reduce", "intra", 2, sizes, seconds, latency, rate, r2),),
    )


def test_a_written_profile_reads_back_the_same(tmp_path: Path) -> None:
    paths = SweepPaths(tmp_path)
    where = write_profile(paths, made_up())
    assert where.parent == tmp_path / "profiles" and where.name == f"{CPU.key()}.json"
    assert read_profile(where) == made_up()


def test_the_lookup_finds_the_newest_profile_of_the_same_hardware_only(tmp_path: Path) -> None:
    old, new = SweepPaths(tmp_path / "old"), SweepPaths(tmp_path / "new")
    write_profile(old, made_up(when="2026-11-01T00:00:00+00:00"))
    write_profile(new, made_up(when="2026-11-27T00:00:00+00:00"))
    found = find_profile([old, new], CPU)
    assert found is not None and found[1].measured_at.startswith("2026-11-27")
    other = replace(CPU, gpus_per_node=4)
    assert find_profile([old, new], other) is None
    assert find_profile([SweepPaths(tmp_path / "nothing")], CPU) is None
    with pytest.raises(BadProfile, match="gpus_per_node: 2 != 4"):
        profile_for(found[0], other)


def test_identities_differ_in_key_where_any_field_differs() -> None:
    keys = {CPU.key(), replace(CPU, torch_version="2.12.0").key(), replace(CPU, cpu_model="Intel Xeon").key()}
    assert len(keys) == 3
    assert cpu_model()  # this machine's, from /proc/cpuinfo or the platform module


@pytest.mark.parametrize(
    ("damage", "said"),
    [
        (lambda text: text[: len(text) // 2], "not valid JSON"),
        (lambda text: "[]", "expected a JSON object"),
        (lambda text: text.replace('"format": 1', '"format": 9'), "format 9 is not a profile"),
        (lambda text: text.replace('"seconds": 2e-05', '"seconds": -1'), r"matmuls\[0\]\.seconds: -1 is negative"),
        (lambda text: text.replace('"m": 128', '"m": "128"'), r"matmuls\[0\]\.m: expected a positive int"),
        (lambda text: text.replace('"backend": "gloo",', ""), "identity: missing backend"),
        (lambda text: text.replace('"wall_s"', '"wall"'), "unknown key"),
    ],
)
def test_a_damaged_profile_is_refused_naming_the_file_and_key(tmp_path: Path, damage: object, said: str) -> None:
    where = write_profile(SweepPaths(tmp_path), made_up())
    data = json.loads(where.read_text())
    where.write_text(damage(json.dumps(data, indent=1)))  # type: ignore[operator]
    with pytest.raises(BadProfile, match=said) as caught:
        read_profile(where)
    assert str(where) in str(caught.value)


def test_a_damaged_profile_stops_the_lookup(tmp_path: Path) -> None:
    paths = SweepPaths(tmp_path)
    write_profile(paths, made_up()).write_text("{")
    with pytest.raises(BadProfile, match="damaged"):
        find_profile([paths], CPU)


def test_the_fit_reads_latency_and_rate_off_a_line() -> None:
    sizes = [4096 * 4**i for i in range(6)]
    latency, rate, r2 = fit(sizes, [20e-6 + s / 5e9 for s in sizes])
    assert latency == pytest.approx(20e-6, rel=1e-6) and rate == pytest.approx(5.0, rel=1e-6) and r2 > 0.999
    latency, rate, _ = fit(sizes, [1e-3 - s * 1e-12 for s in sizes])
    assert rate is None  # time falling with size: no rate can be read
    assert fit([4096], [1e-5]) == (1e-5, None, 0.0)


def test_the_rates_a_predictor_reads() -> None:
    profile = made_up()
    got = rates(profile)
    assert got.matmul_tflops[Product(128, 64, 192, "fp32")] == pytest.approx(2 * 128 * 64 * 192 / 2e-5 / 1e12)
    assert got.memory_gbytes_s == pytest.approx((2 << 20) / 1e-4 / 1e9)
    forward, backward = got.attention_tflops[(128, 4, 16, "fp32")]
    assert forward > 0 and backward > 0
    link = got.collectives[("all_reduce", "intra")]
    assert link.gbytes_s is not None and link.gbytes_s > 0 and link.latency_s >= 0
    assert link.seconds(1 << 20) == pytest.approx(link.latency_s + (1 << 20) / (link.gbytes_s * 1e9))
    assert Link(1e-5, None).seconds(1 << 20) is None
    assert "cpu" in got.source


def test_message_sizes_go_up_by_four() -> None:
    assert message_sizes(4096, 64 << 20) == tuple(4096 * 4**i for i in range(8))
    assert message_sizes(4096, 4096) == (4096,)
    with pytest.raises(ValueError, match="0 < smallest <= largest"):
        message_sizes(8192, 4096)


def test_the_profile_times_grouped_query_attentions_own_key_value_width() -> None:
    from orchestrator.config.schema import ModelConfig
    from orchestrator.profile.matmul import shapes_of

    gqa = ModelConfig(name="m", family="llama", num_layers=2, hidden_size=96, num_heads=3, num_kv_heads=1,
                      intermediate_size=256, vocab_size=1000)  # fmt: skip
    widths = {s.label.split()[-1]: s.fan_out for s in shapes_of(gqa, 128)}
    assert widths == {"qkv": 288, "out": 96, "ffn": 256, "vocab": 1000, "kv": 32}
    full = ModelConfig(name="n", family="gpt_neox", num_layers=2, hidden_size=96, num_heads=3, vocab_size=1000)
    assert {s.label.split()[-1] for s in shapes_of(full, 128)} == {"qkv", "out", "ffn", "vocab"}


def test_the_profile_times_an_experts_product_over_the_rows_routed_to_it() -> None:
    from orchestrator.config.schema import ModelConfig
    from orchestrator.profile.matmul import shapes_of

    moe = ModelConfig(name="e", family="olmoe", num_layers=2, hidden_size=64, num_heads=4, intermediate_size=64,
                      vocab_size=512, num_experts=8, num_experts_per_token=2)  # fmt: skip
    expert = [s for s in shapes_of(moe, 2048) if s.label.endswith("expert")]
    assert [(s.tokens, s.fan_in, s.fan_out) for s in expert] == [(512, 64, 64)]  # 2,048 rows x 2 of 8 experts


def test_collectives_on_the_cpu_are_timed_with_the_cores_busy() -> None:
    import threading

    import torch

    from orchestrator.profile.collectives import LOAD_THREAD, cores_busy

    def loaders() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name == LOAD_THREAD]

    with cores_busy(torch.device("cpu")):
        [thread] = loaders()
        assert thread.is_alive()
    assert not loaders() and not thread.is_alive()
    # On a GPU the collectives run on the device: the host's cores are left as they are.
    with cores_busy(torch.device("cuda")):
        assert not loaders()
