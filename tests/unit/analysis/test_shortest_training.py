"""Critical batch and shortest training against the formulas worked by hand."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import yaml

from analysis.planners.shortest import (
    chinchilla_loss,
    critical_batch_sequences,
    critical_batch_tokens,
    shortest_training,
    useful_point,
)
from analysis.predict.network import network_for
from orchestrator.cli.main import main
from orchestrator.config.schema import GpuConfig, ModelConfig

CONF = Path(__file__).resolve().parents[3] / "conf"


def _conf(group: str, name: str, cls: type) -> object:
    return cls(**yaml.safe_load((CONF / group / f"{name}.yaml").read_text()))


def test_chinchilla_loss_by_hand() -> None:
    # 1.69 + 406.4 / (1e9)^0.34 + 410.7 / (2e10)^0.28 = 1.69 + 406.4/1148.15 + 410.7/766.11 = 1.69 + 0.35396 + 0.53609
    assert chinchilla_loss(1e9, 2e10) == pytest.approx(2.58005, abs=1e-4)
    with pytest.raises(ValueError, match="positive"):
        chinchilla_loss(0, 1e9)


def test_critical_batch_by_hand() -> None:
    # B_crit(2.0) = 2e8 / 2^(1/0.21) = 2e8 / 27.1316 = 7.3715e6 tokens
    assert critical_batch_tokens(2.0) == pytest.approx(7.3715e6, rel=1e-4)
    # 7.3715e6 / 2048 = 3599 sequences, rounded down to a power of two
    assert critical_batch_sequences(2.0, 2048) == 2048
    # A higher loss (early in training, smaller models) allows a smaller batch: 2e8/3^4.762 = 1.07e6 tokens
    assert critical_batch_tokens(3.0) == pytest.approx(2e8 / 3.0 ** (1 / 0.21))
    with pytest.raises(ValueError, match="positive"):
        critical_batch_tokens(-1.0)


@pytest.fixture(scope="module")
def a100() -> GpuConfig:
    return _conf("gpu", "a100-80gb", GpuConfig)  # type: ignore[return-value]


def test_shortest_pythia_1b(a100: GpuConfig) -> None:
    model = _conf("model", "pythia-1b", ModelConfig)
    assert isinstance(model, ModelConfig)
    rows = shortest_training(model, a100, network_for(a100), tokens=20 * 1_011_781_632)
    by = {(r.parallelism, r.point): r for r in rows}
    assert set(by) == {(p, q) for p in ("data", "data+tensor+pipeline") for q in ("useful", "fastest")}
    data = by[("data", "fastest")]
    # L(1.01e9, 2.02e10) ~ 2.58 nats -> B_crit 2e8/2.58^4.76 = 2.2e6 tokens -> 1077 sequences -> 1024
    assert data.loss_nats == pytest.approx(2.577, abs=0.01)
    assert data.global_batch_size == 1024
    assert data.max_gpus_by_batch == 1024 and data.num_gpus is not None and data.num_gpus <= 1024
    model_parallel = by[("data+tensor+pipeline", "fastest")]
    assert model_parallel.days is not None and data.days is not None and model_parallel.days <= data.days
    useful = by[("data", "useful")]
    assert useful.num_gpus is not None and useful.num_gpus <= data.num_gpus
    # 20B tokens at 1024 sequences of 2048 a step: ceil(20.2e9 / 2,097,152) steps
    assert data.train_steps == 9650


def test_user_batch_and_loss_override(a100: GpuConfig) -> None:
    model = _conf("model", "pythia-1b", ModelConfig)
    assert isinstance(model, ModelConfig)
    rows = shortest_training(model, a100, network_for(a100), 2e10, loss_nats=2.0, global_batch_size=256)
    assert all(r.global_batch_size == 256 and r.batch_source == "given" for r in rows)
    assert all(r.loss_nats == 2.0 and r.loss_source == "given" for r in rows)
    assert rows[0].critical_batch_tokens == pytest.approx(7.3715e6, rel=1e-4)
    assert all(r.num_gpus is not None and r.num_gpus <= 256 for r in rows if r.parallelism == "data")


def test_useful_point_stops_at_the_first_poor_doubling() -> None:
    class Est:
        def __init__(self, step: float) -> None:
            self.step_time_s = step

    curve = [Est(8.0), Est(4.0), Est(2.5), Est(2.0)]  # 2x, 1.6x, then 1.25x: stop at the third
    assert useful_point(curve) is curve[2]  # type: ignore[arg-type]
    assert useful_point([]) is None


def test_shortest_command_writes_csv(tmp_path: Path) -> None:
    assert main(["shortest", "--model", "pythia-1b", "--gpu", "a100-80gb", "--out", str(tmp_path)]) == 0
    frame = pd.read_csv(tmp_path / "shortest.csv")
    assert len(frame) == 4 and set(frame["source"]) == {"predicted"}
    assert (frame["tokens"] == 143_000 * 1024 * 2048).all()  # the model's own run by default
    # beside the steps' days and GPU-hours, the whole run's at the default goodput (no cluster gives one)
    assert (frame["goodput"] == 0.90).all()
    assert frame["wall_clock_days"].to_numpy() == pytest.approx(frame["days"].to_numpy() / 0.90)
    assert frame["wall_clock_gpu_hours"].to_numpy() == pytest.approx(frame["gpu_hours"].to_numpy() / 0.90)


def test_shortest_command_names_a_bad_model(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["shortest", "--model", "pythia-13b", "--gpu", "a100-80gb"]) == 2
    err = capsys.readouterr().err
    assert "unknown model pythia-13b" in err and "pythia-12b" in err
