"""hpctrain.hostlist: Slurm's host list grammar, one parser for every side.

The expected expansions were printed by ``scontrol show hostnames`` (Slurm 22.05);
tests/cluster/test_hostlist_cluster.py asks the real one again for the same lists.
"""

from __future__ import annotations

import pytest

from hpctrain import hostlist, protocol
from hpctrain.errors import HostlistError, HpctrainError

# what `scontrol show hostnames` printed for each list
SLURM_SAYS = {
    "x": ["x"],
    "n[1-3,5-6]": ["n1", "n2", "n3", "n5", "n6"],
    "n[8-11]": ["n8", "n9", "n10", "n11"],
    "n[09-11]": ["n09", "n10", "n11"],
    "n[01-03,7],m1": ["n01", "n02", "n03", "n7", "m1"],
    "a[1-2]b[3-4]": ["a1b3", "a1b4", "a2b3", "a2b4"],
    "rack[1-2]-n[3-4]": ["rack1-n3", "rack1-n4", "rack2-n3", "rack2-n4"],
    "n[1-2]-ib[0-1]": ["n1-ib0", "n1-ib1", "n2-ib0", "n2-ib1"],
    "a[1-2]b[3-4],c[5]": ["a1b3", "a1b4", "a2b3", "a2b4", "c5"],
    "n-[1-2]": ["n-1", "n-2"],
}


@pytest.mark.parametrize("nodelist", sorted(SLURM_SAYS))
def test_expand_matches_slurm(nodelist: str) -> None:
    assert hostlist.expand(nodelist) == SLURM_SAYS[nodelist]


@pytest.mark.parametrize("nodelist", sorted(SLURM_SAYS))
def test_first_is_the_first_of_the_expansion(nodelist: str) -> None:
    assert hostlist.first(nodelist) == SLURM_SAYS[nodelist][0]


def test_suffix_after_the_last_bracket_is_kept() -> None:
    # Slurm 22.05 refuses these, newer Slurm accepts them: the two copies this module
    # replaced disagreed here (n1 and n1-ib)
    assert hostlist.expand("n[1-2]-ib") == ["n1-ib", "n2-ib"]
    assert hostlist.first("n[1-2]-ib,x") == "n1-ib"


def test_empty_list() -> None:
    assert hostlist.expand("") == [] and hostlist.expand(" ") == []
    assert hostlist.first("") == "127.0.0.1"
    assert hostlist.first("", default="localhost") == "localhost"


@pytest.mark.parametrize("bad", ["n[3-1]", "n[]", "n[1-2", "n[a-b]", "n[1-]", "n]1["])
def test_lists_slurm_refuses_are_refused(bad: str) -> None:
    with pytest.raises(HostlistError, match="host list") as info:
        hostlist.expand(bad)
    assert isinstance(info.value, HpctrainError)


def test_one_port_rule() -> None:
    # the template computes $(( 25000 + SLURM_JOB_ID % 4000 )); runtime and function jobs
    # call protocol.master_port; tests/unit/test_render.py checks the template uses the constants
    assert protocol.master_port("12345") == 25345
    assert protocol.master_port(4000) == 25000
    assert protocol.master_port(None) == 29500 and protocol.master_port("") == 29500
