"""benchmarks/suite_cpu.py: each kind of process is named, and a command's own CPU is counted under its kind."""

from __future__ import annotations

import sys
from types import ModuleType

import pytest
from benchmark_loader import load_benchmark


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_benchmark("suite_cpu")


def test_each_kind_of_process_is_named(bench: ModuleType) -> None:
    assert bench.kind("/x/.venv/bin/python -u -m submitit.core._submit /tmp/s/jobs/%j") == "sweep job (submitit)"
    assert bench.kind("/x/python -c from multiprocessing.forkserver import main; main(...)") == "forked probe rank"
    assert bench.kind("/x/python -u -c import sys;exec(eval(sys.stdin.readline()))") == "pytest worker"
    assert bench.kind("/x/.venv/bin/python -m orchestrator.cli.main status /tmp/s") == "gpudays command"
    assert bench.kind("slurmstepd: [12.0]") == "SLURM daemon or step"
    assert bench.kind("/usr/bin/cc1plus -quiet x.cpp") == "other (cc1plus)"
    assert bench.kind("") == "other (no command line)"


def test_a_commands_own_cpu_is_counted(bench: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    # Two seconds of CPU: the watcher looks every half second plus the time a look over every process takes, and on
    # a busy machine (the unit tier beside other work) the spinner's last look may come a second of wall before
    # it ends.
    spin = "import time; t = time.process_time(); [0 for _ in iter(lambda: time.process_time() - t < 2.0, False)]"
    monkeypatch.setattr(sys, "argv", ["suite_cpu.py", "--", sys.executable, "-c", spin])
    with pytest.raises(SystemExit) as exited:
        bench.main()
    assert exited.value.code == 0
    rows = {line.split(None, 2)[2]: float(line.split()[0]) for line in capsys.readouterr().out.splitlines()[3:]}
    # The kind is named after the interpreter's file: python, or python3 where pytest was started as a script.
    own = sum(seconds for name, seconds in rows.items() if name.startswith("other (python"))
    assert own >= 0.3, rows
