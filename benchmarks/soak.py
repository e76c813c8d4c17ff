"""Soak: a sweep of a few hundred cells on the local SLURM cluster, under faults, then resumed until done.

With the sleep probe (``probe.kind=sleep``), on the local cluster of ``gpudays cluster up`` (started here, and
stopped again, if it is not up), the sweep is split into several array jobs (``cluster.max_array_size``) and
then, while it runs:

- the last array job is cancelled whole before any of its tasks starts;
- a few pending and a few running array tasks are cancelled (``scancel``), chosen at random (``--seed``);
- a few running tasks are requeued (``scontrol requeue``);
- node2's slurmd is killed with its job steps, left down past SlurmdTimeout (its jobs end NODE_FAIL and are
  requeued), and started again.

And gpudays itself is killed (``--kill-gpudays``, on by default): the sweep is SIGKILLed right after the sbatch of
its second array returned, before that array's job ids were written (``GPUDAYS_FAULT=after-sbatch@2``), and the
same ``gpudays sweep`` is run again, which adopts that array by its job name and submits the cells never sent;
later the first ``gpudays resume`` is killed the same way after its first sbatch, and the next one adopts its job.

Once the queue has drained, ``gpudays resume DIR --wait`` runs (again, a bounded number of times, while cells
still need it), and the sweep is checked: every cell ``ok`` with exactly one record.json, written by its latest
attempt; no attempt ran that attempts.jsonl does not list; exactly one job in ``sacct`` per attempt (each job of
the sweep is found by its name, the token its intent wrote, and no attempt has two); no cell lost. Prints the time
until the queue drained, the cells that needed a rerun and the number of reruns; exits 1 if a check failed.

    python benchmarks/soak.py [--cells 300] [--seed 0] [--sleep-s 2] [--no-kill-gpudays] [--keep DIR]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from orchestrator.cli.display import console  # noqa: E402
from orchestrator.cluster import LocalCluster, missing_packages, missing_packages_message  # noqa: E402
from orchestrator.store.attempts import read_attempts  # noqa: E402
from orchestrator.store.paths import SweepPaths  # noqa: E402
from orchestrator.store.record import Record, read_record  # noqa: E402
from orchestrator.submission import faults, status  # noqa: E402

FIRST_SEQ_LENGTH = 64


@dataclass
class SoakSettings:
    """The size of the soak and of its faults."""

    cells: int = 300
    seed: int = 0
    sleep_s: float = 2.0
    """How long each cell's sleep probe sleeps."""
    array_parallelism: int = 8
    array_size: int = 0
    """Cells per array job; 0: a quarter of the cells (at least 2), so that there are four arrays or more."""
    cpus_per_cell: int = 2
    """With the cluster's 2 x 8 CPUs, 2 per cell lets 8 cells run at once: later arrays wait, pending."""
    faults_per_kind: int = 0
    """Tasks cancelled while pending, cancelled while running, requeued; 0: one per 50 cells (at least 1)."""
    node_down_s: float = 25.0
    """How long node2's slurmd stays killed; past SlurmdTimeout (20 s) its jobs end NODE_FAIL."""
    drain_timeout_s: float = 1800.0
    resume_timeout_s: float = 600.0
    max_resumes: int = 3
    kill_gpudays: bool = True
    """SIGKILL the sweep after its second sbatch and the first resume after its first (see the module doc)."""
    name: str = "soak"
    """The sweep's name: its jobs are named ``gpudays-<name>-<token>``, which tells them from other jobs."""

    def __post_init__(self) -> None:
        if self.cells < 4:
            raise ValueError(f"--cells must be at least 4 (two arrays of two), got {self.cells}")
        if self.array_size <= 0:
            self.array_size = max(2, self.cells // 4)
        if self.faults_per_kind <= 0:
            self.faults_per_kind = max(1, self.cells // 50)


@dataclass
class SoakResult:
    """What happened, and what the checks found."""

    cells: int
    drained_s: float | None
    """Seconds from the sweep's start until no job of it was queued or running; None: it never drained."""
    total_s: float
    faults: list[str] = field(default_factory=list)
    states_after_drain: dict[str, int] = field(default_factory=dict)
    drained_state: dict[str, str] = field(default_factory=dict)
    """Each cell's state once the queue had drained, before any resume."""
    resumes: int = 0
    reruns: dict[str, int] = field(default_factory=dict)
    """Cells submitted more than once: cell id -> number of resubmissions."""
    problems: list[str] = field(default_factory=list)


def gpudays(args: list[str], env: dict[str, str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    """Run the gpudays command line in a subprocess, as a user would."""
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli.main", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def sweep_overrides(settings: SoakSettings) -> list[str]:
    return [
        "-m",
        f"name={settings.name}",
        "cluster=slurm",
        "model=pythia-tiny",
        "gpu=cpu",
        "probe.kind=sleep",
        f"probe.sleep_s={settings.sleep_s}",
        f"cluster.array_parallelism={settings.array_parallelism}",
        f"cluster.max_array_size={settings.array_size}",
        f"cluster.cpus_per_gpu={settings.cpus_per_cell}",
        f"model.seq_length=range({FIRST_SEQ_LENGTH},{FIRST_SEQ_LENGTH + settings.cells})",
    ]


def attempts_by_cell(paths: SweepPaths) -> dict[str, list[dict[str, object]]]:
    return {cell_id: status.read_attempts(paths, cell_id) for cell_id in paths.cell_ids()}


def array_ids(paths: SweepPaths) -> list[str]:
    """The array jobs of the sweep's first submission, in submission order."""
    first = {a[0].job_id.split("_")[0] for a in attempts_by_cell(paths).values() if a}
    return sorted(first, key=int)


def queued_tasks(cluster: LocalCluster, arrays: list[str]) -> dict[str, str]:
    """``{task id: squeue state}`` of the tasks of ``arrays`` still in the queue (one line per task)."""
    if not arrays:
        return {}
    out = cluster.run_client(["squeue", "-h", "-r", "-j", ",".join(arrays), "-o", "%i %T"], check=False)
    return dict(line.split() for line in out.splitlines() if line.strip())


def wait_for(condition: Callable[[], bool], timeout_s: float, interval_s: float = 1.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(interval_s)
    return True


def inject_faults(
    cluster: LocalCluster, paths: SweepPaths, settings: SoakSettings, rng: random.Random, log: Callable[[str], None]
) -> list[str]:
    """Cancel an array before it starts, cancel and requeue tasks at random, kill a node for a while."""
    faults: list[str] = []
    arrays = array_ids(paths)
    if len(arrays) < 2:
        raise RuntimeError(f"the sweep went out as {len(arrays)} array job(s); the soak needs at least 2")
    last = arrays[-1]
    tasks = queued_tasks(cluster, [last])
    if tasks and all(state == "PENDING" for state in tasks.values()):
        cluster.run_client(["scancel", last])
        faults.append(f"cancelled array {last} before it started ({len(tasks)} tasks)")
    else:
        faults.append(f"array {last} was not wholly pending ({sorted(set(tasks.values()))}); not cancelled")
    others = arrays[:-1]
    k = settings.faults_per_kind

    def pick(state: str, count: int) -> list[str]:
        candidates = sorted(t for t, s in queued_tasks(cluster, others).items() if s == state and "[" not in t)
        return rng.sample(candidates, min(count, len(candidates)))

    if not wait_for(lambda: len(pick("RUNNING", 2 * k)) >= min(2 * k, settings.array_parallelism), 120):
        faults.append("fewer running tasks than asked for after 120 s")
    pending = pick("PENDING", k)
    running = pick("RUNNING", 2 * k)
    cancel_running, requeue = running[:k], running[k:]
    if pending:
        cluster.run_client(["scancel", *pending], check=False)
        faults.append(f"cancelled pending tasks {', '.join(pending)}")
    if cancel_running:
        cluster.run_client(["scancel", *cancel_running], check=False)
        faults.append(f"cancelled running tasks {', '.join(cancel_running)}")
    if requeue:
        cluster.run_client(["scontrol", "requeue", *requeue], check=False)
        faults.append(f"requeued running tasks {', '.join(requeue)}")
    for line in faults:
        log(f"  {line}")
    wait_for(lambda: "RUNNING" in queued_tasks(cluster, others).values(), 60)
    on_node2 = cluster.run_client(["squeue", "-h", "-w", "node2", "-t", "R", "-o", "%i"], check=False).split()
    cluster.kill_node("node2", with_jobs=True)
    time.sleep(settings.node_down_s)
    cluster.start_node("node2", timeout_s=60)
    faults.append(f"killed node2 with {len(on_node2)} running tasks for {settings.node_down_s:.0f} s, started again")
    log(f"  {faults[-1]}")
    return faults


def killed_at(point: str, args: list[str], env: dict[str, str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    """Run a gpudays command that SIGKILLs itself at fault-injection ``point`` (``orchestrator.submission.faults``)."""
    return gpudays(args, {**env, faults.FAULT_ENV: point}, timeout_s)


def since_arg(epoch_s: float) -> str:
    """``sacct -S``: local time, as the controller reads it."""
    return dt.datetime.fromtimestamp(epoch_s).strftime("%Y-%m-%dT%H:%M:%S")


def sweep_jobs(cluster: LocalCluster, since_s: float, prefix: str) -> list[tuple[str, str, str]]:
    """``(job id, job name, state)`` of every job since ``since_s`` whose name starts with ``prefix``, array tasks
    one by one (``12_[3-5]``: tasks that never started)."""
    out = cluster.run_client(
        ["sacct", "-n", "-P", "-X", "-a", "-S", since_arg(since_s), "-o", "JobID,JobName,State"], check=False
    )
    rows = [line.split("|") for line in out.splitlines() if line.count("|") == 2]
    return [(job, name, state) for job, name, state in rows if name.startswith(prefix)]


def check_jobs(cluster: LocalCluster, paths: SweepPaths, since_s: float, prefix: str) -> list[str]:
    """Exactly one job per attempt: every job of the sweep in ``sacct`` is an attempt's (its name is the token the
    attempt's intent wrote before sbatch, its task the cell's index); no attempt has two; each cell's latest
    attempt has its job."""
    owner: dict[tuple[str, int | None], tuple[str, int]] = {}
    for cell_id in paths.cell_ids():
        for a in read_attempts(paths, cell_id):
            if a.token:
                owner[(a.token, a.index)] = (cell_id, a.attempt)
    problems: list[str] = []
    ran: dict[tuple[str, int], list[str]] = {}
    for job_id, name, state in sweep_jobs(cluster, since_s, prefix):
        if "[" in job_id:  # tasks that never started
            if state.startswith("PENDING"):
                problems.append(f"job {job_id} ({name}) is still queued")
            continue
        _, _, task = job_id.partition("_")
        key = (name, int(task) if task else None)
        if key not in owner:
            problems.append(f"job {job_id} ({name}, {state}) is no attempt's: no intent names its name and task")
            continue
        ran.setdefault(owner[key], []).append(job_id)
    for (cell_id, attempt), ids in sorted(ran.items()):
        if len(ids) > 1:
            problems.append(f"{cell_id}: attempt {attempt} has {len(ids)} jobs in sacct ({', '.join(ids)})")
    for cell_id in paths.cell_ids():
        tries = read_attempts(paths, cell_id)
        if not tries:
            problems.append(f"{cell_id}: never submitted")
        elif (cell_id, tries[-1].attempt) not in ran:
            problems.append(f"{cell_id}: its latest attempt ({tries[-1].attempt}) has no job in sacct")
    return problems


def check_sweep(paths: SweepPaths, settings: SoakSettings, states: list[status.CellState]) -> list[str]:
    """Every cell ok, once; records from the latest attempt; no attempt ran that was not submitted; none lost."""
    problems: list[str] = []
    cell_ids = paths.cell_ids()
    if len(cell_ids) != settings.cells:
        problems.append(f"{len(cell_ids)} cells in {paths.cells_dir}, expected {settings.cells}")
    not_ok = {s.cell_id: s.state for s in states if s.state != "ok"}
    if not_ok:
        shown = ", ".join(f"{c} ({s})" for c, s in sorted(not_ok.items())[:10])
        problems.append(f"{len(not_ok)} cell(s) not ok: {shown}{' ...' if len(not_ok) > 10 else ''}")
    seq_lengths = set()
    for cell_id in cell_ids:
        attempts = status.read_attempts(paths, cell_id)
        numbers = [a.attempt for a in attempts]
        if numbers != list(range(1, len(numbers) + 1)):
            problems.append(f"{cell_id}: attempts.jsonl lists attempts {numbers}, not 1..{len(numbers)}")
        records = sorted(p.name for p in paths.cell_dir(cell_id).glob("record*.json"))
        if "record.json" not in records:
            problems.append(f"{cell_id}: no record.json")
            continue
        record = read_record(paths.record(cell_id), cell_id)
        if not isinstance(record, Record):
            problems.append(f"{cell_id}: record.json unreadable: {getattr(record, 'reason', 'missing')}")
            continue
        seq_lengths.add(record.config["model"]["seq_length"])
        if record.status.value != "ok":
            problems.append(f"{cell_id}: record says {record.status.value}: {record.reason}")
        if attempts and record.attempt != numbers[-1]:
            problems.append(f"{cell_id}: record.json is from attempt {record.attempt}, latest is {numbers[-1]}")
        if attempts and str(record.environment.get("job_id")) != str(attempts[-1].job_id):
            problems.append(
                f"{cell_id}: record.json written by job {record.environment.get('job_id')}, "
                f"the latest attempt is job {attempts[-1].job_id}"
            )
        # More records than attempts would mean a run no submission accounts for.
        if len(records) > max(1, len(attempts)):
            problems.append(f"{cell_id}: {len(records)} records ({records}) for {len(attempts)} attempt(s)")
        ran = {int(p.name.split("-")[0].removeprefix("attempt")) for p in paths.cell_dir(cell_id).glob("ranks/*")}
        if not ran <= set(numbers):
            problems.append(f"{cell_id}: attempts {sorted(ran - set(numbers))} ran but were never submitted")
    expected = set(range(FIRST_SEQ_LENGTH, FIRST_SEQ_LENGTH + settings.cells))
    if cell_ids and seq_lengths != expected:
        problems.append(f"cells lost: no ok record for seq_length {sorted(expected - seq_lengths)[:10]}")
    return problems


def run_soak(
    cluster: LocalCluster, sweep_dir: Path, settings: SoakSettings, log: Callable[[str], None] = print
) -> SoakResult:
    """Run the soak on a cluster that is up; ``sweep_dir`` must not hold a sweep yet."""
    rng = random.Random(settings.seed)
    paths = SweepPaths(sweep_dir)
    os.environ.update(cluster.env())  # status, in this process, asks this cluster
    env = {**os.environ, **cluster.env(), "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    started, since_s = time.monotonic(), time.time() - 1
    sweep_args = ["sweep", *sweep_overrides(settings), "--dir", str(sweep_dir)]
    killed: list[str] = []
    if settings.kill_gpudays:
        # Killed after the second array's sbatch returned, before its job ids were written: the same command
        # again must adopt that array (by its job name) and submit only the cells never sent.
        first = killed_at("after-sbatch@2", sweep_args, env, timeout_s=600)
        if first.returncode != -signal.SIGKILL:
            raise RuntimeError(f"gpudays sweep was to be killed, but it exited {first.returncode}:\n{first.stdout}")
        killed.append(f"killed gpudays sweep after its second sbatch, before the job ids were written "
                      f"({sum(1 for a in attempts_by_cell(paths).values() if a)} cells had an intent)")  # fmt: skip
    sweep = gpudays(sweep_args, env, timeout_s=600)
    if sweep.returncode != 0:
        raise RuntimeError(f"gpudays sweep failed ({sweep.returncode}):\n{sweep.stdout[-3000:]}{sweep.stderr[-3000:]}")
    arrays = array_ids(paths)
    log(f"submitted {settings.cells} cells as arrays {', '.join(arrays)} in {time.monotonic() - started:.1f} s")
    result = SoakResult(cells=settings.cells, drained_s=None, total_s=0.0)
    for line in killed:
        log(f"  {line}")
    result.faults = killed + inject_faults(cluster, paths, settings, rng, log)

    if wait_for(lambda: not queued_tasks(cluster, arrays), settings.drain_timeout_s, 2.0):
        result.drained_s = time.monotonic() - started
        log(f"queue drained after {result.drained_s:.0f} s")
    else:
        left = queued_tasks(cluster, arrays)
        result.problems.append(
            f"the queue did not drain within {settings.drain_timeout_s:.0f} s: {len(left)} task(s) left, "
            f"{sorted(set(left.values()))}"
        )
    states = status.cell_states(paths)
    result.states_after_drain = status.counts(states)
    result.drained_state = {s.cell_id: s.state for s in states}
    log(f"after draining: {console.summary_line(states, markup=False)}")

    if settings.kill_gpudays and any(status.needs_rerun(s.state) for s in states):
        # The first resume dies right after its first sbatch: the next one adopts that job, never submits it again.
        cut = killed_at("after-sbatch", ["resume", str(sweep_dir)], env, settings.resume_timeout_s)
        how = f"exited {cut.returncode}" if cut.returncode != -signal.SIGKILL else "killed"
        result.faults.append(f"gpudays resume {how} after its first sbatch, before the job ids were written")
        log(f"  {result.faults[-1]}")
        states = status.cell_states(paths)

    while any(status.needs_rerun(s.state) for s in states) and result.resumes < settings.max_resumes:
        result.resumes += 1
        try:
            resumed = gpudays(["resume", str(sweep_dir), "--wait", "--interval", "2"], env, settings.resume_timeout_s)
            said = (resumed.stdout + resumed.stderr).strip().splitlines()
            log(f"resume {result.resumes}: exit {resumed.returncode}; {said[0] if said else ''}")
        except subprocess.TimeoutExpired:
            result.problems.append(f"gpudays resume --wait did not return within {settings.resume_timeout_s:.0f} s")
        states = status.cell_states(paths)
        log(f"  {console.summary_line(states, markup=False)}")
        if result.problems:
            break
    result.total_s = time.monotonic() - started
    result.reruns = {
        cell_id: len(attempts) - 1 for cell_id, attempts in attempts_by_cell(paths).items() if len(attempts) > 1
    }
    result.problems += check_sweep(paths, settings, states)
    result.problems += check_jobs(cluster, paths, since_s, f"gpudays-{settings.name}-")
    return result


def report(result: SoakResult) -> str:
    drained = f"{result.drained_s:.0f} s" if result.drained_s is not None else "never"
    lines = [
        f"cells: {result.cells}; queue drained after: {drained}; all done after {result.total_s:.0f} s "
        f"({result.resumes} resume(s))",
        f"states once drained: {json.dumps(result.states_after_drain)}",
        f"cells that needed a rerun: {len(result.reruns)}; reruns: {sum(result.reruns.values())}",
    ]
    lines += [
        f"  {cell_id}: {result.drained_state.get(cell_id, '?')} once drained, {reruns} rerun(s)"
        for cell_id, reruns in sorted(result.reruns.items())
    ]
    lines += [f"PROBLEM: {problem}" for problem in result.problems] or ["every check passed"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0, help="chooses which tasks are cancelled and requeued")
    parser.add_argument("--sleep-s", type=float, default=2.0, help="each cell's sleep (default 2)")
    parser.add_argument("--parallelism", type=int, default=8, help="cluster.array_parallelism (default 8)")
    parser.add_argument("--node-down-s", type=float, default=25.0, help="how long node2 stays down (default 25)")
    parser.add_argument(
        "--resume-timeout-s", type=float, default=600.0, help="give up on one `resume --wait` after this long"
    )
    parser.add_argument(
        "--no-kill-gpudays", action="store_true", help="do not SIGKILL the sweep and a resume mid-submission"
    )
    parser.add_argument("--keep", help="keep the sweep folder here (default: a temporary folder, deleted)")
    args = parser.parse_args(argv)
    try:
        settings = SoakSettings(
            cells=args.cells,
            seed=args.seed,
            sleep_s=args.sleep_s,
            array_parallelism=args.parallelism,
            node_down_s=args.node_down_s,
            resume_timeout_s=args.resume_timeout_s,
            kill_gpudays=not args.no_kill_gpudays,
        )
    except ValueError as error:
        parser.error(str(error))
    missing = missing_packages()
    if missing:
        print(missing_packages_message(missing), file=sys.stderr)
        return 2
    if os.geteuid() != 0:
        print("the local SLURM cluster needs root: run this as root", file=sys.stderr)
        return 2
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="gpudays-soak-"))
    sweep_dir = work / "sweep"
    if sweep_dir.exists():
        print(f"{sweep_dir} exists already: give --keep a new folder", file=sys.stderr)
        return 2
    try:
        with LocalCluster().session() as cluster:
            print(f"soak: {settings}")
            result = run_soak(cluster, sweep_dir, settings)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(report(result))
    return 1 if result.problems else 0


if __name__ == "__main__":
    sys.exit(main())
