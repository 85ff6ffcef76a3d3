"""Listening sockets, read from the kernel (the tests check that the devcluster's daemons
and its sshd listen on loopback only)."""

from __future__ import annotations

import ipaddress
from pathlib import Path


def listening(port: int) -> set[str]:
    """Addresses with a listening TCP socket on ``port``."""
    return {addr for addr, p in listeners() if p == port}


def listeners() -> set[tuple[str, int]]:
    """(address, port) of every listening TCP socket, from /proc/net/tcp and tcp6."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            addr_hex, port_hex = local.split(":")
            if state != "0A":   # LISTEN
                continue
            raw = bytes.fromhex(addr_hex)
            # the kernel prints each 32-bit word in host (little-endian) order
            raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            found.add((str(ipaddress.ip_address(raw)), int(port_hex, 16)))
    return found
