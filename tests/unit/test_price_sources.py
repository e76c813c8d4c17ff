"""Every price in conf/gpu names one dated source, every GPU's cloud price is of one kind (the same provider's
list), and the outputs that use a price say where it came from."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from orchestrator.config.prices import CloudPrice, price_note

CONF = Path(__file__).resolve().parents[2] / "conf" / "gpu"
GPUS = {p.stem: yaml.safe_load(p.read_text()) for p in sorted(CONF.glob("*.yaml"))}


@pytest.mark.parametrize("name", sorted(GPUS))
def test_every_price_names_its_source_and_date(name: str) -> None:
    gpu = GPUS[name]
    assert gpu.get("cloud_price_source"), f"{name}: a cloud price, or its absence, needs cloud_price_source"
    if gpu.get("cloud_usd_per_gpu_hour") is not None:
        assert gpu.get("cloud_price_date"), f"{name}: cloud_usd_per_gpu_hour has no cloud_price_date"
    if gpu.get("purchase_price_usd") is not None:
        assert gpu.get("purchase_price_source"), f"{name}: purchase_price_usd has no purchase_price_source"


def test_every_gpu_cloud_price_is_of_one_kind() -> None:
    priced = {n: g for n, g in GPUS.items() if g["accelerator"] == "cuda" and g["cloud_usd_per_gpu_hour"] is not None}
    assert len(priced) >= 6
    assert len({(g["cloud_price_source"], g["cloud_price_date"]) for g in priced.values()}) == 1, {
        n: g["cloud_price_source"] for n, g in priced.items()
    }
    # A GPU with no price says why (not a bare null that the outputs would read as $0).
    for name, gpu in GPUS.items():
        if gpu["cloud_usd_per_gpu_hour"] is None:
            assert gpu["cloud_price_date"] is None and len(gpu["cloud_price_source"]) > 20, name


def test_the_note_names_source_and_date_and_no_price() -> None:
    note = price_note([CloudPrice("a", 2.736, "List X", "2026-11-25"), CloudPrice("b", None, "not listed by X", None),
                       CloudPrice("a", 2.736, "List X", "2026-11-25")])  # fmt: skip
    assert note == "cloud prices: a $2.74/h (List X, read 2026-11-25); b: no price (not listed by X)"


def test_plan_names_the_source_of_its_prices() -> None:
    from orchestrator.cli.display.console import plan_table
    from orchestrator.planning.plan import plan

    table = plan_table(plan(["model=pythia-160m", "gpu=a100-80gb,a100-40gb", "num_gpus=4", "cluster=local"]))
    footer = "\n".join(table.footer)
    assert f"a100-80gb ${GPUS['a100-80gb']['cloud_usd_per_gpu_hour']:.3g}/h" in footer
    assert "docs.runpod.io/serverless/pricing" in footer and "read 2026-11-25" in footer
    assert "a100-40gb: no price (not listed by RunPod" in footer


def test_budget_and_shortest_name_the_source_of_their_prices(capsys: pytest.CaptureFixture[str]) -> None:
    from orchestrator.cli.main import main

    for argv in (["shortest", "--model", "pythia-160m", "--gpu", "a100-80gb"],
                 ["budget", "--gpu-hours", "1e3", "--gpu", "a100-80gb", "--model", "pythia-160m"]):  # fmt: skip
        assert main(argv) == 0
        out = " ".join(capsys.readouterr().out.split())
        assert "cloud prices: a100-80gb $2.74/h (RunPod Serverless" in out and "read 2026-11-25" in out, argv


def test_report_md_names_the_source_of_its_prices() -> None:
    import pandas as pd

    from analysis.report.writer import _prices

    cells = pd.DataFrame({"gpu": ["a100-80gb", "a100-40gb"], "cloud_usd_per_gpu_hour": [2.736, float("nan")],
                          "cloud_price_source": ["RunPod list", "not listed by RunPod"],
                          "cloud_price_date": ["2026-11-25", None]})  # fmt: skip
    assert _prices(cells) == (
        "cloud prices: a100-80gb $2.74/h (RunPod list, read 2026-11-25); a100-40gb: no price (not listed by RunPod)"
    )
