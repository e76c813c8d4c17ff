"""The cluster's TCP ports: chosen free once, kept in the state folder, reused while they stay free."""

from __future__ import annotations

import json
import random
import socket
from dataclasses import asdict, dataclass

from orchestrator.cluster.layout import ClusterLayout
from orchestrator.store.durable import write_json_atomic

# Daemon ports are drawn from here: below Linux's ephemeral range (32768-60999), so that no client socket
# opened while the cluster is down takes a port the next `up` expects to reuse.
PORT_RANGE = (20000, 32000)


@dataclass(frozen=True)
class ClusterPorts:
    """TCP ports of the cluster's daemons."""

    slurmctld: int
    slurmdbd: int
    mysql: int
    slurmd: tuple[int, ...]
    """One port per node, in node order."""

    def all(self) -> list[int]:
        return [self.slurmctld, self.slurmdbd, self.mysql, *self.slurmd]


def port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", port))
        except OSError:
            return False
    return True


def pick_free_ports(count: int) -> list[int]:
    ports: list[int] = []
    while len(ports) < count:
        port = random.randrange(*PORT_RANGE)
        if port not in ports and port_is_free(port):
            ports.append(port)
    return ports


def choose_ports(layout: ClusterLayout, num_nodes: int) -> ClusterPorts:
    """The ports of the last start if they are all free (that keeps slurmctld's saved node state valid), else
    new ones, saved for the next start."""
    if layout.ports_file.is_file():
        saved = json.loads(layout.ports_file.read_text())
        ports = ClusterPorts(saved["slurmctld"], saved["slurmdbd"], saved["mysql"], tuple(saved["slurmd"]))
        if len(ports.slurmd) == num_nodes and all(port_is_free(p) for p in ports.all()):
            return ports
    chosen = pick_free_ports(3 + num_nodes)
    ports = ClusterPorts(chosen[0], chosen[1], chosen[2], tuple(chosen[3:]))
    write_json_atomic(layout.ports_file, asdict(ports))
    return ports
