"""hpctrain.hostlist against the real Slurm: the same lists, expanded by ``scontrol show
hostnames`` and by the one parser every side of hpctrain uses (tests/unit/test_hostlist.py
has the recorded answers)."""

from __future__ import annotations

import pytest

from hpctrain import hostlist
from hpctrain.slurm import client

pytestmark = pytest.mark.slurm

LISTS = ["n1", "n[1-3,5-6]", "n[8-11]", "n[09-11]", "n[01-03,7],m1", "a[1-2]b[3-4]",
         "rack[1-2]-n[3-4]", "n[1-2]-ib[0-1]", "a[1-2]b[3-4],c[5]", "n-[1-2]",
         "gpu[007-010,3]", "x,y,z"]
REFUSED = ["n[3-1]", "n[]"]


def scontrol_hostnames(nodelist: str) -> list[str]:
    return client.run(["scontrol", "show", "hostnames", nodelist], retries=1).stdout.split()


def test_the_parser_expands_like_scontrol(cluster) -> None:
    # one scontrol call per list: scontrol joins a comma list into one, dropping the borders
    for nodelist in LISTS:
        assert hostlist.expand(nodelist) == scontrol_hostnames(nodelist), nodelist
        assert hostlist.first(nodelist) == scontrol_hostnames(nodelist)[0], nodelist


def test_what_slurm_refuses_the_parser_refuses(cluster) -> None:
    for nodelist in REFUSED:
        res = client.run(["scontrol", "show", "hostnames", nodelist], check=False)
        assert res.returncode != 0 or not res.stdout.split(), nodelist
        with pytest.raises(hostlist.HostlistError):
            hostlist.expand(nodelist)


def test_the_clusters_own_node_lists(cluster) -> None:
    # lists as the controller writes them (sinfo: n[1-3] here), the kind jobs get
    nodes = client.run(["sinfo", "-h", "-o", "%N"], retries=1).stdout.split()
    for nodelist in nodes:
        assert hostlist.expand(nodelist) == scontrol_hostnames(nodelist)
