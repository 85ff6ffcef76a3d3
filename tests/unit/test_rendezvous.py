"""The rendezvous port taken at start-up (hpctrain.supervisor.rendezvous): with the port
held by a real socket, a failed step whose output says a bind failed moves to the next
port of the job's range this node can bind; anything else leaves it. The devcluster runs
are tests/cluster/test_render_slurm.py's."""

from __future__ import annotations

import socket

from hpctrain import protocol
from hpctrain.supervisor.rendezvous import Rendezvous, bindable

# what rank 0's TCPStore said on the devcluster when its port was taken (torch 2.13)
EADDRINUSE = ("torch.distributed.DistNetworkError: The server socket has failed to listen on "
              "any local network address. port: {port}, useIpv6: false, code: -98, name: "
              "EADDRINUSE, message: address already in use")


def held() -> socket.socket:
    """A port of the job's range held as another process would: bound, never listening
    (the script's connect test passes it over as free; a bind fails)."""
    for k in range(protocol.PORT_SPAN):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.bind(("0.0.0.0", protocol.port_after(26000, k)))
            if bindable(protocol.port_after(26000, k + 1)):
                return sock
        except OSError:
            pass
        sock.close()
    raise AssertionError("no free pair of ports in the job's range")


def test_a_port_taken_between_the_check_and_the_bind_moves_to_the_next_free_one() -> None:
    sock = held()
    try:
        port = sock.getsockname()[1]
        assert not bindable(port)
        here = Rendezvous("n1", port, "n1")
        assert here.env() == {}
        failed = "Traceback (most recent call last):\n" + EADDRINUSE.format(port=port)
        assert here.moved(failed) == (port, protocol.port_after(port))
        assert here.env() == {"MASTER_PORT": str(protocol.port_after(port))}
        # another crash, another node's supervisor: the port stays
        assert Rendezvous("n1", port, "n1").moved("RuntimeError: boom") is None
        assert Rendezvous("n1", port, "n2").moved(failed) is None
    finally:
        sock.close()
    # the port free again (the holder gone): the failure was something else's
    assert Rendezvous("n1", port, "n1").moved(failed) is None


def test_the_range_wraps_round() -> None:
    assert protocol.port_after(protocol.PORT_BASE + protocol.PORT_SPAN - 1) == protocol.PORT_BASE
    assert protocol.port_after(27001, 3) == 27004
