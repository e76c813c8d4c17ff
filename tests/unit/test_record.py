"""The record: one writer, one reader whose every complaint is a BadRecord; cell.yaml's reader; the job side's
judgement of a probe's result (time-limit signals, configs that cannot be built)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from orchestrator import jobside
from orchestrator.record import (
    RECORD_SCHEMA_VERSION,
    BadCellConfig,
    BadRecord,
    Record,
    read_cell_config,
    read_record,
    write_record,
)
from orchestrator.states import RecordStatus, State

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
        metrics={"step_time_s": 0.5, "search_tried": [{"micro_batch_size": 4}]},  # type: ignore[typeddict-unknown-key]
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
        (json.dumps({**GOOD, "schema_version": 2}).encode(), "schema_version 2, newer than this gpudays reads"),
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


# ---- the job side's judgement ---------------------------------------------------------------------------------

NINJA = {
    "status": "compile_error",
    "reason": "RuntimeError: Error building extension 'cpu_adam': ninja: build stopped: subcommand failed "
    "(died with <Signals.SIGUSR2: 12>)",
    "traceback": "Traceback (most recent call last):\n  ...\nRuntimeError: Error building extension 'cpu_adam'",
}

HEADS = """Traceback (most recent call last):
  File "/x/huggingface_hub/dataclasses.py", line 251, in validate
    validator(self)
ValueError: The hidden size is not divisible by the number of attention heads! Make sure to update them!

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "/x/orchestrator/probe.py", line 300, in setup
    config = GPTNeoXConfig(**kwargs)
             ^^^^^^^^^^^^^^^^^^^^^^^
  File "/x/huggingface_hub/dataclasses.py", line 253, in validate
    raise StrictDataclassClassValidationError(validator=validator.__name__, cause=e) from e
huggingface_hub.errors.StrictDataclassClassValidationError: Class validation error for validator 'validate_architecture':
    ValueError: The hidden size is not divisible by the number of attention heads! Make sure to update them!
"""


def test_a_failure_after_the_time_limit_signal_is_a_timeout_whatever_failed() -> None:
    status, reason = jobside.judge(NINJA, ("SIGUSR2", time.time()))
    assert status is RecordStatus.TIMEOUT
    assert reason is not None and "SLURM's time limit: SIGUSR2" in reason and "compile_error" in reason
    status, _ = jobside.judge({"status": "comm_error", "reason": "peer gone"}, ("SIGTERM", time.time()))
    assert status is RecordStatus.TIMEOUT
    # A failure of its own after the warning (the probe rejects its settings) is not the time limit's doing.
    own = {"status": "failed", "reason": "ValueError: probe.max_steps=0", "traceback": "ValueError: max_steps"}
    assert jobside.judge(own, ("SIGUSR2", time.time())) == (RecordStatus.FAILED, "ValueError: probe.max_steps=0")
    # An answer stands, signal or not; without a signal a compile error is one.
    assert jobside.judge({"status": "ok"}, ("SIGUSR2", time.time()))[0] is RecordStatus.OK
    assert jobside.judge({"status": "oom", "reason": "x"}, ("SIGUSR2", time.time()))[0] is RecordStatus.OOM
    assert jobside.judge(NINJA, None)[0] is RecordStatus.COMPILE_ERROR


def test_a_config_that_cannot_be_built_is_invalid_with_its_whole_reason() -> None:
    result = {
        "status": "failed",
        "reason": "StrictDataclassClassValidationError: Class validation error for validator 'validate_architecture':",
        "traceback": HEADS,
    }
    status, reason = jobside.judge(result, None)
    assert status is RecordStatus.INVALID
    assert reason == (
        "the cell's config cannot be built: StrictDataclassClassValidationError: Class validation error for "
        "validator 'validate_architecture': ValueError: The hidden size is not divisible by the number of "
        "attention heads! Make sure to update them!"
    )
    other = {"status": "failed", "reason": "KeyError: 'x'", "traceback": "Traceback (most recent call last):\n  "
             'File "a.py", line 1, in f\nKeyError: \'x\'\n'}  # fmt: skip
    assert jobside.judge(other, None) == (RecordStatus.FAILED, "KeyError: 'x'")
    assert jobside.judge({"status": "weird"}, None)[0] is RecordStatus.FAILED
