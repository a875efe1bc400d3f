"""Free TCP ports: rendezvous, serving and Slurm ports must not collide between tests or sessions."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port free now on loopback."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
