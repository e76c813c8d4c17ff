"""How failures are told apart and reported: status, one-line reason, capped traceback."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from orchestrator.failures import UnsupportedError, classify_failure, failure_from, one_line, short_traceback


def _raised(exc: BaseException, cause: BaseException | None = None) -> BaseException:
    try:
        raise exc from cause
    except BaseException as caught:  # noqa: BLE001 - the point is to get a real traceback
        return caught


@pytest.mark.parametrize(
    ("exc", "status"),
    [
        (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), "oom"),
        (MemoryError(), "oom"),
        (RuntimeError("[enforce fail at alloc_cpu.cpp:119] DefaultCPUAllocator: can't allocate memory"), "oom"),
        (RuntimeError("NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error"), "comm_error"),
        (RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer"), "comm_error"),
        (torch.distributed.DistStoreError("Timed out after 6 seconds waiting for clients. 1/2 clients joined."),
         "comm_error"),
        (TimeoutError("rendezvous"), "comm_error"),
        (RuntimeError("Error building extension 'cpu_adam'"), "compile_error"),
        (ImportError("FlashAttention2 has been toggled on, but it cannot be used"), "failed"),
        (ValueError("something else"), "failed"),
    ],
)  # fmt: skip
def test_failures_are_told_apart(exc: BaseException, status: str) -> None:
    assert classify_failure(_raised(exc)) == status


def test_the_cause_chain_counts() -> None:
    assert classify_failure(_raised(RuntimeError("step failed"), MemoryError())) == "oom"
    assert classify_failure(_raised(RuntimeError("wrapped"), _raised(torch.OutOfMemoryError("x")))) == "oom"


def test_a_failure_inside_a_native_op_build_is_a_compile_error() -> None:
    # Code that runs as if it lived in DeepSpeed's op builder: where it was raised decides.
    namespace: dict[str, Any] = {}
    source = "def build():\n    raise FileNotFoundError('ninja')\n"
    exec(compile(source, "/site-packages/deepspeed/ops/op_builder/builder.py", "exec"), namespace)
    try:
        namespace["build"]()
    except FileNotFoundError as exc:
        assert classify_failure(exc) == "compile_error"


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
    assert (failure.status, failure.traceback, failure.rank) == ("failed", None, 1)
    assert failure.reason == "UnsupportedError: method.precision=fp16 is not supported on this cpu"
    other = failure_from(_raised(ValueError("bad")), rank=0)
    assert other.traceback is not None and "ValueError: bad" in other.traceback
