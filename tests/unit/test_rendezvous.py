"""Rank 0's address and port (orchestrator/job/env.py): the same in every task of a job, different for two jobs
that share a node."""

from __future__ import annotations

import pytest

from orchestrator.job.env import PORT_BASE, PORT_SPAN, rendezvous


@pytest.fixture(autouse=True)
def outside_slurm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.delenv("SLURM_LAUNCH_NODE_IPADDR", raising=False)


def test_an_array_task_and_a_job_whose_ids_share_digits_get_different_ports(monkeypatch: pytest.MonkeyPatch) -> None:
    # submitit names task 3 of array 12 "12_3"; SLURM gives the task a job id of its own.
    monkeypatch.setenv("SLURM_JOB_ID", "15")
    _, task_port = rendezvous("12_3", ["node1"])
    monkeypatch.setenv("SLURM_JOB_ID", "123")
    _, job_port = rendezvous("123", ["node1"])
    assert task_port == PORT_BASE + 15 and job_port == PORT_BASE + 123


def test_every_task_of_a_job_meets_at_the_launch_node_on_one_port(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "40017")
    monkeypatch.setenv("SLURM_LAUNCH_NODE_IPADDR", "10.0.0.7")
    assert {rendezvous("40010_7", hosts) for hosts in (["node1", "node2"], ["node2", "node1"])} == {
        ("10.0.0.7", PORT_BASE + 40017 % PORT_SPAN)
    }


def test_outside_slurm_the_port_comes_from_the_job_id_and_rank_0_from_the_first_host() -> None:
    assert rendezvous("4711", ["box", "other"]) == ("box", PORT_BASE + 4711)
    assert rendezvous("local", []) == ("127.0.0.1", PORT_BASE)
