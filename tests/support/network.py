"""Ports for servers a test or a benchmark starts, so parallel runs never collide on a fixed one."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on right now (the kernel's pick, released at once).

    Good for a child process that needs its port on the command line, and for "a port nobody
    listens on" (connection refused). Another process could take it in between; on a test machine
    that race has not been seen, and a bind error would name the port.
    """
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
