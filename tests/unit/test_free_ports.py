"""topology.free_ports: ports for servers started by tests and benchmarks, never handed out
twice at once, never where outgoing connections take theirs."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from services.common import topology
from services.common.topology import free_ports


@pytest.fixture(autouse=True)
def own_state(tmp_path, monkeypatch):
    # A state of its own, in ports the machine-wide turn reaches last (meshes of other test
    # workers start at _FIRST_PORT).
    monkeypatch.setattr(topology, "_PORT_STATE", tmp_path / "ports.json")
    monkeypatch.setattr(topology, "_FIRST_PORT", 62000)


def test_ports_are_distinct_bindable_and_outside_the_ephemeral_range(monkeypatch):
    monkeypatch.setattr(topology, "_ephemeral_ports", lambda: range(62000, 63000))
    ports = free_ports(13)
    assert len(set(ports)) == 13
    assert all(63000 <= p < 65536 for p in ports)
    for p in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))


def test_the_ephemeral_range_is_the_kernels():
    ephemeral = topology._ephemeral_ports()
    low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
    assert (ephemeral.start, ephemeral.stop) == (int(low), int(high) + 1)


def test_a_port_handed_out_is_held_back_until_the_hold_ends(monkeypatch):
    monkeypatch.setattr(topology, "_FIRST_PORT", 65500)  # 36 ports to hand out
    monkeypatch.setattr(topology, "_ephemeral_ports", lambda: range(0))
    # The hold is what is tested: whether another process has one of the 36 bound right now
    # (CI's other workers) is not (test_a_port_something_listens_on_is_passed_over).
    monkeypatch.setattr(topology, "_bindable", lambda port: True)
    first = free_ports(3)
    now = topology.time.time()
    monkeypatch.setattr(topology.time, "time", lambda: now + topology._PORT_HOLD_S - 1)
    rest = free_ports(33)
    assert not set(first) & set(rest)
    with pytest.raises(OSError):
        free_ports(1)  # every port is held
    # The hold over, the turn comes round to the first three again.
    monkeypatch.setattr(topology.time, "time", lambda: now + topology._PORT_HOLD_S + 1)
    assert free_ports(3) == first


def test_a_port_something_listens_on_is_passed_over():
    first = free_ports(1)[0]
    topology._PORT_STATE.write_text(json.dumps({"next": 0, "held": {}}))  # its turn again
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", first))
        busy.listen()
        assert first not in free_ports(2)


def test_processes_asking_at_once_get_different_ports(tmp_path):
    code = (
        "import sys; from pathlib import Path; from services.common import topology;"
        f"topology._PORT_STATE = Path({str(tmp_path / 'ports.json')!r});"
        "topology._FIRST_PORT = 62000;"
        "print(*topology.free_ports(40))"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    got = [int(p) for proc in procs for p in proc.communicate(timeout=60)[0].split()]
    assert all(proc.returncode == 0 for proc in procs)
    assert len(got) == 160
    assert len(set(got)) == 160


def test_too_many_ports_asked_is_an_error(monkeypatch):
    monkeypatch.setattr(topology, "_FIRST_PORT", 65530)
    monkeypatch.setattr(topology, "_ephemeral_ports", lambda: range(0))
    monkeypatch.setattr(topology, "_bindable", lambda port: True)  # as above
    assert free_ports(0) == []
    assert len(free_ports(6)) == 6  # 65530..65535: the limit
    with pytest.raises(OSError, match="not 1 free TCP ports"):
        free_ports(1)  # all six are held
