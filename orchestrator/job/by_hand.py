"""One rank of the probe by hand, on a resolved cell config, outside any sweep:

    python -m orchestrator.job.by_hand CELL.yaml [--out record.json]

RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT come from the environment where set, else a world of one.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from collections.abc import Sequence
from pathlib import Path

from orchestrator.config.schema import to_config
from orchestrator.job.probe import run_probe
from orchestrator.store.states import RecordStatus


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m orchestrator.job.by_hand CELL.yaml [--out record.json]``: measure a resolved cell config."""
    parser = argparse.ArgumentParser(prog="python -m orchestrator.job.by_hand", description=main.__doc__)
    parser.add_argument("cell", type=Path, help="a resolved cell config (cells/<id>/cell.yaml of a sweep)")
    parser.add_argument("--out", help="write the result here as JSON; '{rank}' in it is replaced by the rank")
    args = parser.parse_args(argv)

    from omegaconf import OmegaConf

    cell = to_config(OmegaConf.load(args.cell))
    if cell.gpu.accelerator == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("LOCAL_RANK", os.environ["RANK"])
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    ended = run_probe(cell, rank, world_size, int(os.environ["LOCAL_RANK"]))
    result = ended.to_json()
    text = json.dumps(result, indent=2, sort_keys=True, default=str)
    if args.out:
        from orchestrator.store.durable import write_json_atomic

        write_json_atomic(Path(args.out.format(rank=rank)), result)
    if rank == 0:
        print(text)
    return 0 if ended.status is RecordStatus.OK else 1


if __name__ == "__main__":
    sys.exit(main())
