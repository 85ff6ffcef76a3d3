"""A destroyed process group must be freed so that its connections close for its peers
(hpctrain.runtime.groups). Pure parts: a group held in a function's default arguments is
released from them; the end-to-end case is tests/unit/test_runtime_restart.py's plainest
DP loop."""

from __future__ import annotations

import gc
import weakref

from hpctrain.runtime import groups


class Group:
    """Stands in for a torch ProcessGroup (any object: the release looks at identity)."""


def test_a_group_held_by_default_arguments_is_released_and_freed() -> None:
    group = Group()
    # as torch.distributed.nn.functional does at import: def f(..., group=group.WORLD)
    # (exec: functions defined at run time, as a module import defines them)
    exec("def broadcast(tensor, src, group=G):\n    return group\n"  # noqa: S102
         "def reduce(tensor, *, group=G):\n    return group\n", namespace := {"G": group})
    broadcast, reduce = namespace["broadcast"], namespace["reduce"]
    del namespace["G"]
    gc.collect()          # the defaults tuple of untracked objects is untracked now
    ref = weakref.ref(group)
    del group
    assert ref() is not None
    released = groups.release_defaults(ref())
    assert sorted(n.rsplit(".", 1)[-1] for n in released) == ["broadcast", "reduce"]
    gc.collect()
    assert ref() is None                          # the connections would close now
    assert broadcast(1, 0) is None and reduce(1) is None   # None: the default group


def test_functions_without_the_group_are_left_alone() -> None:
    def f(a, b=3, *, c=4):
        return a, b, c

    assert groups.release_defaults(Group()) == []
    assert f.__defaults__ == (3,) and f.__kwdefaults__ == {"c": 4}


def test_preload_names_the_modules_that_capture_the_first_group() -> None:
    assert "torch.distributed.nn.functional" in groups.CAPTURES_WORLD_AT_IMPORT
    groups.preload()       # never raises, torch or not
