"""How failures are told apart and reported (what happened, one-line reason, capped traceback), and the one
decision of a record's status from what happened and the job's time-limit signal."""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch

from orchestrator.job.failures import (
    Ending,
    Happened,
    TimeSignal,
    UnsupportedError,
    classify_failure,
    decide_status,
    failure_from,
    one_line,
    outcome_of,
    short_traceback,
)
from orchestrator.store.record import Metrics
from orchestrator.store.states import RecordStatus, State, state_of_record


def _raised(exc: BaseException, cause: BaseException | None = None) -> BaseException:
    try:
        raise exc from cause
    except BaseException as caught:  # noqa: BLE001 - the point is to get a real traceback
        return caught


OOM, COMM, COMPILE, RAISED = Ending.OUT_OF_MEMORY, Ending.COMM_ERROR, Ending.COMPILE_ERROR, Ending.RAISED


@pytest.mark.parametrize(
    ("exc", "ending"),
    [
        (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), OOM),
        (MemoryError(), OOM),
        (RuntimeError("[enforce fail at alloc_cpu.cpp:119] DefaultCPUAllocator: can't allocate memory"), OOM),
        (RuntimeError("NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error"), COMM),
        (RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer"), COMM),
        (torch.distributed.DistStoreError("Timed out after 6 seconds waiting for clients. 1/2 clients joined."),
         COMM),
        (TimeoutError("rendezvous"), COMM),
        (RuntimeError("Error building extension 'cpu_adam'"), COMPILE),
        (ImportError("FlashAttention2 has been toggled on, but it cannot be used"), RAISED),
        (ValueError("something else"), RAISED),
    ],
)  # fmt: skip
def test_failures_are_told_apart(exc: BaseException, ending: Ending) -> None:
    assert classify_failure(_raised(exc)) is ending


def test_the_cause_chain_counts() -> None:
    assert classify_failure(_raised(RuntimeError("step failed"), MemoryError())) is OOM
    assert classify_failure(_raised(RuntimeError("wrapped"), _raised(torch.OutOfMemoryError("x")))) is OOM


def test_a_failure_inside_a_native_op_build_is_a_compile_error() -> None:
    # Code that runs as if it lived in DeepSpeed's op builder: where it was raised decides.
    namespace: dict[str, Any] = {}
    source = "def build():\n    raise FileNotFoundError('ninja')\n"
    exec(compile(source, "/site-packages/deepspeed/ops/op_builder/builder.py", "exec"), namespace)
    try:
        namespace["build"]()
    except FileNotFoundError as exc:
        assert classify_failure(exc) is COMPILE


def test_reason_is_one_line_and_names_the_compiler_error() -> None:
    exc = RuntimeError("C++ compile error\nwarning: overflow\nfoo.cpp:32:26: error: conflicting declaration\n")
    assert one_line(exc) == "RuntimeError: C++ compile error (foo.cpp:32:26: error: conflicting declaration)"
    assert len(one_line(ValueError("x" * 5000))) == 500
    assert one_line(MemoryError()) == "MemoryError"


def test_long_tracebacks_keep_their_ends() -> None:
    text = "Traceback (most recent call last):\n" + "warning\n" * 20_000 + "RuntimeError: the end\n"
    short = short_traceback(text)
    assert len(short) < 33_000 and short.startswith("Traceback") and short.endswith("RuntimeError: the end\n")
    assert short_traceback("short") == "short"


def test_an_unsupported_cell_is_one_line_without_a_traceback() -> None:
    failure = failure_from(_raised(UnsupportedError("method.precision=fp16 is not supported on this cpu")), rank=1)
    assert (failure.ending, failure.traceback, failure.rank) == (RAISED, None, 1)
    assert decide_status(failure.happened()) == (RecordStatus.FAILED, failure.reason)
    assert failure.reason == "UnsupportedError: method.precision=fp16 is not supported on this cpu"
    other = failure_from(_raised(ValueError("bad")), rank=0)
    assert other.traceback is not None and "ValueError: bad" in other.traceback


# ---- the record's status, decided once -------------------------------------------------------------------------

NINJA = Happened(
    COMPILE,
    "RuntimeError: Error building extension 'cpu_adam': ninja: build stopped: subcommand failed "
    "(died with <Signals.SIGUSR2: 12>)",
    "Traceback (most recent call last):\n  ...\nRuntimeError: Error building extension 'cpu_adam'",
)

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


def _now(name: str) -> TimeSignal:
    return TimeSignal(name, time.time())


@pytest.mark.parametrize(
    ("ending", "status"),
    [
        (Ending.COMPLETED, RecordStatus.OK),
        (Ending.NOTHING_FITS, RecordStatus.DOES_NOT_FIT),
        (OOM, RecordStatus.OOM),
        (COMM, RecordStatus.COMM_ERROR),
        (COMPILE, RecordStatus.COMPILE_ERROR),
        (RAISED, RecordStatus.FAILED),
        (Ending.REFUSED, RecordStatus.INVALID),
    ],
)
def test_without_a_signal_what_happened_is_the_status_and_the_reason_stays(
    ending: Ending, status: RecordStatus
) -> None:
    assert decide_status(Happened(ending, "why", None)) == (status, "why")


def test_a_failure_after_the_time_limit_signal_is_a_timeout_whatever_failed() -> None:
    status, reason = decide_status(NINJA, _now("SIGUSR2"))
    assert status is RecordStatus.TIMEOUT
    assert reason is not None and "SLURM's time limit: SIGUSR2" in reason and "compile_error" in reason
    assert decide_status(Happened(COMM, "peer gone"), _now("SIGTERM"))[0] is RecordStatus.TIMEOUT
    assert decide_status(Happened(Ending.REFUSED, "bad"), _now("SIGTERM"))[0] is RecordStatus.TIMEOUT
    # A failure of its own after the warning (the probe rejects its settings) is not the time limit's doing.
    own = Happened(RAISED, "ValueError: probe.max_steps=0", "ValueError: max_steps")
    assert decide_status(own, _now("SIGUSR2")) == (RecordStatus.FAILED, "ValueError: probe.max_steps=0")
    # An answer stands, signal or not; without a signal a compile error is one.
    assert decide_status(Happened(Ending.COMPLETED), _now("SIGTERM"))[0] is RecordStatus.OK
    assert decide_status(Happened(OOM, "x"), _now("SIGUSR2"))[0] is RecordStatus.OOM
    assert decide_status(Happened(Ending.NOTHING_FITS, "x"), _now("SIGTERM"))[0] is RecordStatus.DOES_NOT_FIT
    assert decide_status(NINJA)[0] is RecordStatus.COMPILE_ERROR


def test_a_failure_after_the_sigterm_of_a_cancel_is_cancelled_not_failed_nor_timeout() -> None:
    # scancel 8 s into a 60-minute limit: the compiler died of the SIGTERM, and the record said timeout, then failed.
    cancel = TimeSignal("SIGTERM", time.time(), cancelled=True)
    status, reason = decide_status(NINJA, cancel)
    assert status is RecordStatus.CANCELLED and state_of_record(status) is State.CANCELLED
    assert (
        reason is not None
        and reason.startswith("the job was cancelled (scancel): SIGTERM")
        and "compile_error" in reason
    )
    assert (
        decide_status(Happened(RAISED, "JobCancelled: the scheduler cancelled job 7"), cancel)[0]
        is RecordStatus.CANCELLED
    )
    assert decide_status(Happened(Ending.COMPLETED), cancel)[0] is RecordStatus.OK  # an answer stands


def test_a_config_that_cannot_be_built_is_invalid_with_its_whole_reason() -> None:
    happened = Happened(
        RAISED,
        "StrictDataclassClassValidationError: Class validation error for validator 'validate_architecture':",
        HEADS,
    )
    status, reason = decide_status(happened)
    assert status is RecordStatus.INVALID
    assert reason == (
        "the cell's config cannot be built: StrictDataclassClassValidationError: Class validation error for "
        "validator 'validate_architecture': ValueError: The hidden size is not divisible by the number of "
        "attention heads! Make sure to update them!"
    )
    other = Happened(RAISED, "KeyError: 'x'", "Traceback (most recent call last):\n  "
             'File "a.py", line 1, in f\nKeyError: \'x\'\n')  # fmt: skip
    assert decide_status(other) == (RecordStatus.FAILED, "KeyError: 'x'")


def test_an_outcome_carries_the_decided_status_and_what_was_measured() -> None:
    metrics = Metrics(num_parameters=7, startup_s=1.0)
    done = outcome_of(NINJA, metrics, {"torch": "2.x"}, _now("SIGUSR2"))
    assert done.status is RecordStatus.TIMEOUT and done.traceback == NINJA.traceback
    assert done.metrics is metrics and done.environment == {"torch": "2.x"}
    assert done.to_json()["metrics"] == {"num_parameters": 7, "startup_s": 1.0}
    assert outcome_of(Happened(Ending.COMPLETED, "slept")).to_json() == {
        "status": "ok", "reason": "slept", "traceback": None, "metrics": {}, "environment": {}
    }  # fmt: skip


def test_a_probe_interrupted_by_ctrl_c_is_cancelled_and_rerun_not_failed() -> None:
    # Ctrl-C during a local sweep: the job's KeyboardInterrupt became `failed: KeyboardInterrupt` (or, killed while
    # writing it, no record at all: `lost`).
    from orchestrator.job import entry as jobside
    from orchestrator.store.states import needs_rerun

    ctrl_c = TimeSignal("SIGINT", time.time())
    status, reason = decide_status(Happened(RAISED, "KeyboardInterrupt: interrupted by SIGINT (Ctrl-C)"), ctrl_c)
    assert status is RecordStatus.CANCELLED and needs_rerun(state_of_record(status))
    assert (
        reason is not None and reason.startswith("interrupted (Ctrl-C: SIGINT at ") and "not a probe failure" in reason
    )
    assert "KeyboardInterrupt" not in reason
    # What died of the interrupt (a compiler) is said; an answer the probe reached before it stands.
    status, reason = decide_status(NINJA, ctrl_c)
    assert status is RecordStatus.CANCELLED and reason is not None and "compile_error" in reason
    assert decide_status(Happened(Ending.COMPLETED), ctrl_c)[0] is RecordStatus.OK
    # The job's handler ends the probe once, and ignores the SIGINT submitit's controller forwards after it.
    saved = (jobside._time_limit_signal, jobside._probe_done, jobside._in_probe)
    try:
        jobside._time_limit_signal, jobside._probe_done, jobside._in_probe = None, False, True
        with pytest.raises(KeyboardInterrupt):
            jobside._on_interrupt(2, None)
        first = jobside.time_limit_signal()
        assert first is not None and first.name == "SIGINT"
        jobside._on_interrupt(2, None)  # no raise: the record is being written
        assert jobside.time_limit_signal() is first
        # A Ctrl-C while the job still sets up is held, not raised where nothing would catch it: the probe's
        # guarded part begins by raising it, so the record still says cancelled.
        jobside._time_limit_signal, jobside._in_probe = None, False
        jobside._on_interrupt(2, None)
        assert jobside._interrupted()
    finally:
        jobside._time_limit_signal, jobside._probe_done, jobside._in_probe = saved
