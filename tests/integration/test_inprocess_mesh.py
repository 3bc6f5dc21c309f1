"""InProcessMesh: a server that fails to start leaves none of the others running."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from services.common.settings import SettingsError
from services.common.topology import free_ports
from services.devtools.inprocess import InProcessMesh


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            return True
    except ConnectionRefusedError:
        return False


async def test_a_server_that_cannot_start_stops_the_ones_started_before_it(
    tmp_path: Path,
) -> None:
    (retrieval_port,) = free_ports(1)
    env = {
        "RETR_PORT": str(retrieval_port),  # retrieval starts first, on a port the test knows
        "MCP_PROXY_CBR_URL": "http://example.com/x",  # the tools proxy refuses it
    }
    mesh = InProcessMesh(tmp_path, env)
    with pytest.raises(SettingsError, match="MCP_PROXY_CBR_URL"):
        async with mesh:
            pytest.fail("the mesh started")
    assert not _listening(retrieval_port)
    assert mesh.servers == {}
