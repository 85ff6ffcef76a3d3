"""``hpctrain devcluster slow``'s checks, before anything is touched (the cgroup itself is
tests/cluster/test_slow_node_cluster.py's, as root on the real CPU controller)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain.cli import main
from hpctrain.devcluster import slownode
from hpctrain.errors import DevclusterError


def test_the_quota_holds_the_group_to_the_cpus_given() -> None:
    assert slownode.quota_us(0.5) == 50_000
    assert slownode.quota_us(2) == 200_000
    assert slownode.quota_us(0.01) == 1000            # the kernel's floor: 1 ms
    for bad in (0, -1, 0.001, 5000):
        with pytest.raises(DevclusterError, match="--cpus .*from 0.01 to 1024"):
            slownode.quota_us(bad)


def test_without_the_cpu_controller_it_says_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(DevclusterError, match="no cgroup v1 CPU controller .*cfs_quota_us"):
        slownode.slow(0, "n2", 0.5, {1}, root=tmp_path)
    assert slownode.restore(0, "n2", root=tmp_path) == 0      # never slowed: nothing to do
    assert slownode.group_path(3, "n2", tmp_path) == tmp_path / "hpctrain-slow-3-n2"


@pytest.mark.parametrize("args", [["n2"], ["n2", "--cpus", "0.5", "--off"]])
def test_the_command_wants_cpus_or_off(args: list[str], capsys: pytest.CaptureFixture) -> None:
    assert main(["devcluster", "slow", *args]) == 2
    assert "give --cpus CPUS to slow the node, or --off" in capsys.readouterr().err
