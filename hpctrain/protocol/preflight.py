"""The preflight check's wire: the line each node prints (:mod:`hpctrain.runtime.preflight`
writes it, the supervisor's :mod:`hpctrain.supervisor.slownodes` reads it from srun's
output), one parser.

    hpctrain-preflight node=n2 gflops=41.7 device=cuda gpus=8 seconds=1.02 allreduce_s=0.0021 busbw=9.5

``allreduce_s``, ``busbw``: the all-reduce across the nodes (one task each), its median time
and bus bandwidth in GB/s; absent (0) when it did not run or did not complete.
"""

from __future__ import annotations

from dataclasses import dataclass

PREFIX = "hpctrain-preflight"
MODULE = "hpctrain.runtime.preflight"      # run as ``python -m`` on each node
SECONDS = 1.0                              # each node's GEMM time
ALLREDUCE_TIMEOUT_S = 30.0                 # the nodes joining the all-reduce


@dataclass(frozen=True)
class NodeSpeed:
    """One node's answer: its slowest device's matrix-multiply rate."""

    node: str
    gflops: float
    device: str = "cpu"
    gpus: int = 0
    seconds: float = 0.0
    allreduce_s: float = 0.0     # the all-reduce across the nodes (0: none)
    busbw: float = 0.0           # ...its bus bandwidth, GB/s

    def line(self) -> str:
        return (f"{PREFIX} node={self.node} gflops={self.gflops:.4g} device={self.device} "
                f"gpus={self.gpus} seconds={self.seconds:.3g} "
                f"allreduce_s={self.allreduce_s:.4g} busbw={self.busbw:.4g}")

    @classmethod
    def parse(cls, line: str) -> NodeSpeed | None:
        """The answer in one line of output; None when it is not one."""
        words = line.strip().split()
        if not words or words[0] != PREFIX:
            return None
        fields = dict(w.partition("=")[::2] for w in words[1:])
        try:
            speed = cls(fields["node"], float(fields["gflops"]), fields.get("device", "cpu"),
                        int(fields.get("gpus") or 0), float(fields.get("seconds") or 0),
                        float(fields.get("allreduce_s") or 0), float(fields.get("busbw") or 0))
        except (KeyError, ValueError):
            return None
        return speed if speed.node and speed.gflops > 0 else None


def parse_output(text: str) -> dict[str, NodeSpeed]:
    """Every node's answer in srun's output (other lines: srun's, a failing node's)."""
    return {s.node: s for s in map(NodeSpeed.parse, text.splitlines()) if s is not None}
