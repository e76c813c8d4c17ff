"""The record: one writer, one reader whose every complaint is a BadRecord; typed metrics that read every record
the probe ever wrote; cell.yaml's reader."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

import pytest

from orchestrator.config.schema import Config
from orchestrator.store.record import (
    CHECKED_METRICS,
    RECORD_SCHEMA_VERSION,
    BadCellConfig,
    BadRecord,
    Metrics,
    Record,
    Trial,
    read_cell_config,
    read_record,
    record_from_json,
    write_record,
)
from orchestrator.store.states import RecordStatus, State

GOOD = {"schema_version": 1, "cell_id": "c1", "attempt": 2, "status": "ok", "metrics": {"step_time_s": 1.5}}


def test_a_record_written_is_read_back_whole(tmp_path: Path) -> None:
    rec = Record(
        "c1",
        RecordStatus.COMPILE_ERROR,
        attempt=3,
        reason="ninja failed",
        traceback="Traceback ...",
        settings={"model": "pythia-70m"},
        config={"name": "x", "model": {"lr": 1e-5}},
        metrics=Metrics(step_time_s=0.5, search_tried=[Trial(4, "oom", None, "out of memory")]),
        environment={"hostnames": ["n1"]},
        started_at="2026-11-22T00:00:00+00:00",
    )
    path = tmp_path / "record.json"
    write_record(path, rec)
    back = read_record(path, "c1")
    assert back == rec and isinstance(back, Record)
    assert back.state is State.FAILED and json.loads(path.read_text())["schema_version"] == RECORD_SCHEMA_VERSION
    assert not list(tmp_path.glob(".*.tmp")), "the atomic writer leaves no temporary file"


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b"\x00\xff garbage", "not UTF-8"),
        (b"", "is empty"),
        (b'{"schema_version": 1, "status": "ok", "metr', "not valid JSON"),
        (b'["a", "list"]', "holds a JSON list"),
        (b'{"status": "ok"}', "lacks required field(s) schema_version, cell_id, attempt"),
        (json.dumps({**GOOD, "status": "exploded"}).encode(), "unknown status 'exploded'"),
        (json.dumps({**GOOD, "schema_version": 3}).encode(), "schema_version 3, newer than this gpudays reads"),
        (json.dumps({**GOOD, "schema_version": "1"}).encode(), "schema_version '1' is not a whole number"),
        (json.dumps({**GOOD, "attempt": "2"}).encode(), "attempt '2' is not a whole number"),
        (json.dumps({**GOOD, "attempt": True}).encode(), "attempt True is not a whole number"),
        (json.dumps({**GOOD, "cell_id": "c2"}).encode(), "belongs to cell 'c2'"),
        (json.dumps({**GOOD, "metrics": []}).encode(), "field 'metrics' is a list, expected an object"),
        (json.dumps({**GOOD, "reason": 3}).encode(), "field 'reason' is a int, expected a string"),
        (json.dumps({**GOOD, "metrics": {"mfu": "high"}}).encode(), "metric 'mfu' is 'high'"),
        (json.dumps({**GOOD, "metrics": {"mfu": True}}).encode(), "metric 'mfu' is True"),
    ],
)
def test_whatever_is_wrong_with_a_record_is_a_bad_record_never_an_exception(
    tmp_path: Path, content: bytes, why: str
) -> None:
    path = tmp_path / "record.json"
    path.write_bytes(content)
    got = read_record(path, "c1")
    assert isinstance(got, BadRecord) and got.state is State.CORRUPT
    assert why in got.reason


def test_no_file_is_no_record_and_an_older_schema_or_extra_fields_are_fine(tmp_path: Path) -> None:
    assert read_record(tmp_path / "record.json") is None
    (tmp_path / "record.json").write_text(json.dumps({**GOOD, "schema_version": 0, "new_field": 1, "reason": None}))
    assert isinstance(read_record(tmp_path / "record.json"), Record)


def test_cell_config_reads_floats_as_json_writes_them_and_names_the_file_when_bad(tmp_path: Path) -> None:
    path = tmp_path / "cell.yaml"
    path.write_text('{"model": {"lr": 1e-05, "name": "x"}, "num_gpus": 2}')
    assert read_cell_config(path) == {"model": {"lr": 1e-05, "name": "x"}, "num_gpus": 2}
    path.write_text("model:\n  lr: 1.0e-05\n  seq: 64\n")
    assert read_cell_config(path)["model"] == {"lr": 1e-05, "seq": 64}
    for content, why in ((b"- a list", "expected a mapping"), (b"a: [", "not valid YAML"), (b"\xff", "not UTF-8")):
        path.write_bytes(content)
        with pytest.raises(BadCellConfig, match=why) as err:
            read_cell_config(path)
        assert str(path) in str(err.value)
    with pytest.raises(BadCellConfig, match="is missing"):
        read_cell_config(tmp_path / "none.yaml")


# ---- the metrics: typed, and every record on disk still reads -------------------------------------------------

GPU_RECORDS = sorted((Path(__file__).resolve().parents[1] / "data" / "gpu-records").glob("*/*.json"))
"""Real records of two probe versions: the composed timing's (every metric of today) and an older one's."""


@pytest.mark.parametrize("path", GPU_RECORDS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_records_of_earlier_probes_read_with_typed_metrics_and_config(path: Path) -> None:
    data = json.loads(path.read_text())
    record = read_record(path)
    assert isinstance(record, Record) and record.status is RecordStatus.OK
    m = record.metrics
    assert m.step_time_s == data["metrics"]["step_time_s"] and isinstance(m.steps_timed, int)
    assert m.step_times_s == data["metrics"]["step_times_s"]
    if "search_tried" in data["metrics"]:
        assert m.search_tried and all(isinstance(t, Trial) for t in m.search_tried)
        assert [t.micro_batch_size for t in m.search_tried] == [
            t["micro_batch_size"] for t in data["metrics"]["search_tried"]
        ]
    typed = record.typed_config()
    assert isinstance(typed, Config) and typed.model.name == data["config"]["model"]["name"]
    # Every key written comes back under its own name; only today's probe writes them all.
    written = m.to_json()
    assert {k: v for k, v in written.items() if k in data["metrics"] and k != "search_tried"} == {
        k: v for k, v in data["metrics"].items() if k != "search_tried"
    }
    if path.parent.name.endswith("composed"):
        assert written == data["metrics"], "today's record is written back key for key"
        searched = {"micro_batch_estimate", "search_tried"} if "_auto" in path.name else set()
        # These records predate the families whose samples are not tokens, and the two metrics that came with them,
        # and the build's peak.
        later = {"throughput_unit", "samples_per_s", "build_peak_memory_gib"}
        assert set(written) | {"micro_batch_estimate", "search_tried"} | later == {f.name for f in fields(Metrics)}
        assert searched <= set(written), "a record of today holds every metric (a searched one, the search's too)"


def test_the_json_keys_are_what_the_probe_reached() -> None:
    early = Metrics(startup_s=0.5, search_s=0.0, warmup_s=0.0, timed_s=0.0, probe_wall_s=0.6)
    assert set(early.to_json()) == {"startup_s", "search_s", "warmup_s", "timed_s", "probe_wall_s"}
    limited = Metrics(per_gpu_batch_size=8)
    assert limited.to_json() == {"per_gpu_batch_size": 8, "memory_limit_gib": None}, "no limit, said as null"
    timed = Metrics(steps_timed=3, step_time_s=1.0).to_json()
    assert timed["mfu"] is None and timed["micro_step_time_s"] is None, "the timed figures go together"
    assert "num_parameters" not in timed and "search_tried" not in timed, "what was not measured is left out"
    assert Metrics().to_json() == {} and Metrics.from_json({}) == Metrics()


def test_old_or_odd_metrics_read_without_a_complaint_or_an_exception() -> None:
    odd = {
        "step_time_s": 2,  # an int where a float is expected is a number all the same
        "steps_timed": 4.0,  # a whole float counts
        "micro_steps_timed": 4.5,  # not whole: no count
        "stop_reason": 5,  # not a word
        "step_times_s": [1.0, "x"],  # not all numbers
        "final_loss": float("nan"),  # a diverged loss stays what it was
        "search_tried": [{"micro_batch_size": 2, "outcome": "ok", "peak_memory_gib": 1.0}, 7, {"outcome": "ok"}],
        "renamed_long_ago": 1.0,  # a key this version does not know
        "skipped_steps_timed": 10**400,  # beyond any float
    }
    m = Metrics.from_json(odd)
    assert (m.step_time_s, m.steps_timed, m.micro_steps_timed, m.stop_reason, m.step_times_s) == (
        2,
        4,
        None,
        None,
        None,
    )
    assert m.final_loss is not None and m.final_loss != m.final_loss
    assert m.search_tried == [Trial(2, "ok", 1.0)], "entries that are no trial are left out; rest_memory_gib: None"
    assert m.skipped_steps_timed is None and m.get("renamed_long_ago") is None and m.get("step_time_s") == 2
    record = record_from_json({**GOOD, "metrics": odd, "config": {"model": {"name": "x"}, "gone": 1}})
    assert isinstance(record, Record) and record.metrics == m
    assert record.typed_config() is None, "a config that is no cell of this version"


def test_the_checked_metrics_are_those_checked_before_and_a_huge_number_is_no_crash(tmp_path: Path) -> None:
    assert set(CHECKED_METRICS) == {
        "step_time_s", "step_time_mean_s", "step_time_std_s", "step_time_iqr_s", "step_time_ci95_pct", "steps_timed",
        "micro_batch_size", "grad_accum_steps", "per_gpu_batch_size", "tokens_per_step", "tokens_per_s",
        "tokens_per_s_per_gpu", "model_tflops_per_gpu", "hardware_tflops_per_gpu", "mfu", "hfu",
        "peak_memory_allocated_gib", "peak_memory_reserved_gib", "host_rss_gib", "num_parameters", "probe_wall_s",
        "startup_s", "search_s", "warmup_s", "timed_s",
    }  # fmt: skip
    path = tmp_path / "record.json"
    path.write_text(json.dumps(GOOD).replace("1.5", "1" + "0" * 400))
    got = read_record(path, "c1")
    assert isinstance(got, BadRecord) and "metric 'step_time_s'" in got.reason


def test_schema_2_carries_the_gpudays_version_and_host_load_and_1_reads_as_before(tmp_path: Path) -> None:
    from orchestrator.store.record import RECORD_SCHEMA_VERSION, read_record, write_record

    assert RECORD_SCHEMA_VERSION == 2
    old = tmp_path / "old.json"
    old.write_text(json.dumps(GOOD))
    back = read_record(old, "c1")
    assert isinstance(back, Record) and back.schema_version == 1
    assert back.gpudays_version is None and back.host_load == {} and back.metrics.step_time_s == 1.5
    load = {"load_avg_1m_start": 0.5, "load_avg_1m_end": 1.5, "host_cpus_given": 4, "other_cpu_use": 0.25}
    new = tmp_path / "new.json"
    write_record(new, Record("c1", RecordStatus.OK, gpudays_version="0.1.0+git.abc", host_load=load))
    again = read_record(new, "c1")
    assert isinstance(again, Record) and again.gpudays_version == "0.1.0+git.abc" and again.host_load == load
    bad = dict(GOOD, schema_version=2, host_load=[1])
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    assert not isinstance(read_record(tmp_path / "bad.json", "c1"), Record)
