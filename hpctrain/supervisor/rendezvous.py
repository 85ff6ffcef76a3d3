"""The rendezvous port taken at start-up: another port of the job's range, not a crash.

The script passes over a port another process listens on when it starts
(templates/base.sbatch.j2, "rendezvous"), but a port can still be taken between that check
and the bind: by another job's rendezvous, by any process that binds it in between. Then
the step's start-up fails where the rendezvous binds (torchrun's c10d store, hosted by the
first node's agent; rank 0's TCPStore under srun, in ``hpctrain.runtime`` or a plain
script's ``init_process_group``) with EADDRINUSE. The supervisor runs on that first node:
when the failed step's output says a bind failed and this node still cannot bind the port
now that the step's processes are gone, the port was taken, and the step is started again
with ``MASTER_PORT`` on the next port this node can bind (the decision table's row
``port_taken``: a restart in place counted against no limit, a few times at most).
"""

from __future__ import annotations

import re
import socket

from hpctrain import protocol

# what torch says when a store cannot bind its port (DistNetworkError, code -98), and the
# kernel's words for it
BIND_FAILED = re.compile(r"EADDRINUSE|[Aa]ddress already in use")
PORTS_TRIED = 8      # ports tried after a taken one (as many as the script's own check)


def bindable(port: int) -> bool:
    """Can a rendezvous store bind ``port`` on this node now (as torch's TCPStore does: every
    address, SO_REUSEADDR, so a closed connection's TIME_WAIT does not count)?"""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


class Rendezvous:
    """The step's rendezvous address and port across the attempts of one run."""

    def __init__(self, addr: str, port: int, node: str) -> None:
        self.addr, self.port, self.node = addr, port, node
        self.first = port       # the port the script chose

    def moved(self, log: str) -> tuple[int, int] | None:
        """After a failed step whose output ``log`` says a bind failed: (the port, the next
        one of the job's range this node can bind) when this node hosts the rendezvous and
        still cannot bind the port; the next step gets the new one. Else None."""
        if not self.port or self.node != self.addr or not BIND_FAILED.search(log) or \
                bindable(self.port):
            return None
        for k in range(1, PORTS_TRIED + 1):
            port = protocol.port_after(self.port, k)
            if bindable(port):
                taken, self.port = self.port, port
                return taken, port
        return None

    def env(self) -> dict[str, str]:
        """The step's MASTER_PORT once the port moved (else the script's stands)."""
        return {} if self.port == self.first else {"MASTER_PORT": str(self.port)}
