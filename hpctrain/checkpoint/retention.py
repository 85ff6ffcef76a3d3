"""Which checkpoints to delete (pure: no I/O). Used after every commit and by ``ckpt prune``."""

from __future__ import annotations

from typing import Iterable


def select_deletions(committed: Iterable[int], valid: Iterable[int], keep_last: int,
                     keep_every: int | None = None) -> list[int]:
    """Steps to delete from ``committed`` so the last ``keep_last`` valid steps stay,
    plus every step divisible by ``keep_every``.

    Invariants (tested with hypothesis): the newest valid step is never selected; a
    step newer than the newest valid one (possibly damaged, kept for inspection) is
    never selected; only committed steps are ever selected, so an in-flight save (a
    temporary directory, not a committed step) can never be.
    """
    if not isinstance(keep_last, int) or keep_last < 1:
        raise ValueError(f"keep_last={keep_last!r} must be an int >= 1 (the newest valid "
                         "checkpoint is always kept)")
    if keep_every is not None and (not isinstance(keep_every, int) or keep_every < 1):
        raise ValueError(f"keep_every={keep_every!r} must be None or an int >= 1")
    committed = sorted(set(committed))
    valid = sorted(set(valid) & set(committed))
    if not valid:
        return []  # nothing loadable: deleting anything could lose the only usable data
    keep = set(valid[-keep_last:])
    if keep_every:
        keep |= {s for s in valid if s % keep_every == 0}
    newest_valid = valid[-1]
    return [s for s in committed if s not in keep and s < newest_valid]
