"""What does not fit the state, on every way a load takes (hpctrain.checkpoint.fit): a
restore from memory (this process's snapshot, a peer copy) follows a load from storage's
rules; a snapshot laid out otherwise is not restored without a word; a refusal by one rank
of ``load(step)`` is raised on every rank."""

from __future__ import annotations

import gc
import io
import json
from contextlib import redirect_stderr
from pathlib import Path
from types import SimpleNamespace

import pytest

from helpers.ckpt import free_port, spawn

pytestmark = pytest.mark.torch

HINT = ("(load's on_unexpected=/on_missing=\"error\" refuses such a load, \"ignore\" quiets "
        "this line)")


@pytest.fixture(autouse=True)
def _fresh() -> None:
    from hpctrain.checkpoint import snapshot

    snapshot._KEPT.clear()


def saved(step: int) -> dict:
    import torch

    return {"model": {"l0": torch.full((3,), float(step)), "l1": torch.full((2,), -float(step))},
            "step": step}


def test_a_snapshot_restore_refuses_warns_or_ignores_what_does_not_fit(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The adversarial report: a newer snapshot restored a state holding a value the step
    lacks ("lr") with on_missing="error": returned 2, wrote the state, said nothing."""
    import torch

    from hpctrain.checkpoint import CheckpointManager
    from hpctrain.errors import CheckpointError

    def with_lr() -> dict:
        return {"model": {"l0": torch.zeros(3), "l1": torch.zeros(2)}, "step": 0, "lr": 0.1}

    with CheckpointManager(tmp_path) as mgr:
        mgr.save(1, saved(1))
        mgr.snapshot(2, saved(2))
        capsys.readouterr()
        untouched = with_lr()
        with pytest.raises(CheckpointError, match=r"step 2 has no value for 1 entry of the "
                                                  r"state: lr; nothing was loaded"):
            mgr.load_latest(untouched, on_missing="error")
        assert torch.equal(untouched["model"]["l0"], torch.zeros(3)) and untouched["step"] == 0
        got = with_lr()
        assert mgr.load_latest(got) == 2                     # "warn": restored, and said
        assert torch.equal(got["model"]["l0"], torch.full((3,), 2.0))
        assert (got["step"], got["lr"]) == (2, 0.1)
        assert capsys.readouterr().err.splitlines() == [
            f"hpctrain: checkpoint step 2: not in the step, kept as the state had it: lr {HINT}"]
        assert mgr.load_latest(with_lr(), on_missing="ignore") == 2
        assert mgr.load_latest(with_lr(), on_unexpected="error",    # nothing unexpected
                               on_missing="ignore") == 2
        assert capsys.readouterr().err == ""


def test_a_snapshot_laid_out_otherwise_is_passed_over_with_a_line_not_silently(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A state without a tensor the newer snapshot holds (or with one of another shape):
    the older step on storage is loaded, and the job log says why the snapshot was not."""
    import torch

    from hpctrain.checkpoint import CheckpointManager

    with CheckpointManager(tmp_path) as mgr:
        mgr.save(1, saved(1))
        mgr.snapshot(2, saved(2))
        capsys.readouterr()
        stage = {"model": {"l0": torch.zeros(3)}, "step": 0}
        assert mgr.load_latest(stage) == 1
        assert torch.equal(stage["model"]["l0"], torch.ones(3)) and stage["step"] == 1
        assert capsys.readouterr().err.splitlines() == [
            "hpctrain: not restoring step 2 from memory: its layout differs from the state's "
            "(model.l1 in the snapshot, not in the state); loading the durable checkpoint (1)",
            f"hpctrain: checkpoint step 1: not loaded, no place in the state: model.l1 {HINT}"]
        grown = {"model": {"l0": torch.zeros(4), "l1": torch.zeros(2)}, "step": 0}
        with pytest.raises(Exception):                  # storage's step 1 fits it no better
            mgr.load_latest(grown)
        assert capsys.readouterr().err.splitlines()[0] == (
            "hpctrain: not restoring step 2 from memory: its layout differs from the state's "
            "(model.l0: float32 [4] in the state, float32 [3] in the snapshot); loading the "
            "durable checkpoint (1)")


def test_a_peer_copy_restore_follows_the_fit_rules(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A peer copy (one rank, one node: the collective's single-process fallback): a value
    the copy lacks is refused for on_missing="error" and named otherwise; a tensor the state
    has no place for (another stage's layer) is not restored, and named or refused."""
    import numpy as np
    import torch

    from hpctrain.checkpoint import peerfile, peerload
    from hpctrain.checkpoint.comm import Comm
    from hpctrain.checkpoint.fit import Fit
    from hpctrain.checkpoint.tree import flatten
    from hpctrain.checkpoint.writer import Staging
    from hpctrain.errors import CheckpointError

    block = torch.zeros(4096, dtype=torch.uint8)
    staged = Staging(lambda n: block[:n]).stage(*flatten(saved(9)))
    data = block.numpy()
    end = np.frombuffer(peerfile.tail(0, 9, staged.chunks, data, staged.extras), np.uint8)
    size = peerfile.meta_of(end)["data_size"]  # type: ignore[index]
    (tmp_path / "0.a.copy").write_bytes(data[:size].tobytes() + end.tobytes())
    copies = SimpleNamespace(comm=Comm(), node="n1", dir=tmp_path, lister=True, rank=0)

    def stage() -> dict:
        return {"model": {"l0": torch.zeros(3)}, "step": 0, "lr": 0.1}

    for fit, said in ((Fit(missing="error"), r"step 9 has no value for 1 entry .*: lr;"),
                      (Fit(unexpected="error"), r"step 9 holds 1 tensor the state has no "
                                                r"place for: model\.l1;")):
        untouched = stage()
        with pytest.raises(CheckpointError, match=said + " nothing was loaded"):
            peerload.restore(copies, untouched, None, "safe", fit)
        assert untouched == {**stage(), "model": untouched["model"]} and \
            torch.equal(untouched["model"]["l0"], torch.zeros(3))
    got = stage()
    capsys.readouterr()
    assert peerload.restore(copies, got, None, "safe", Fit()) == (9, (
        "checkpoint step 9: not loaded, no place in the state: model.l1; not in the step, "
        f"kept as the state had it: lr {HINT}"))
    assert list(got["model"]) == ["l0"]             # not another stage's layer
    assert torch.equal(got["model"]["l0"], torch.full((3,), 9.0)) and got["step"] == 9
    assert peerload.restore(copies, stage(), None, "safe",
                            Fit("ignore", "ignore")) == (9, "")
    fresh: dict = {"model": {}}         # a place left open: both layers are added
    assert peerload.restore(copies, fresh, None, "safe", Fit(unexpected="error"))[0] == 9
    assert torch.equal(fresh["model"]["l1"], torch.full((2,), -9.0)) and fresh["step"] == 9


def test_a_refusal_on_one_rank_is_raised_on_every_rank(tmp_path: Path) -> None:
    """Two ranks (gloo). Rank 1's state holds a value the step lacks, rank 0's does not:
    load(step, on_missing="error") raised on rank 1 only and rank 0 went on (to hang at
    the next collective); now both raise. The same through a snapshot (load_latest), and a
    snapshot laid out otherwise on rank 1 only is said by rank 0."""
    spawn(_two_ranks, (2, str(tmp_path), free_port()), 2)
    got = [json.loads((tmp_path / f"out-{r}.json").read_text()) for r in range(2)]
    for rank, out in enumerate(got):
        for what in ("load", "load_latest"):
            assert out[what].startswith("CheckpointError: step "), (rank, what, out)
            assert "has no value for 1 entry of the state: lr; nothing was loaded" in out[what]
        assert out["untouched"] is True
        assert out["layout"] == 1
    assert ("hpctrain: not restoring step 2 from memory: its layout differs from the state's "
            "on rank 1 (model.l1 in the snapshot, not in the state); loading the durable "
            "checkpoint (1)") in got[0]["said"].splitlines()
    assert "not restoring" not in got[1]["said"]


def _two_ranks(rank: int, world: int, root: str, port: int) -> None:
    import os

    import torch
    import torch.distributed as dist

    from hpctrain.checkpoint import CheckpointManager
    from hpctrain.errors import CheckpointError

    def state() -> dict:
        mine = {"model": {"l0": torch.zeros(3), "l1": torch.zeros(2)}, "step": 0}
        return {**mine, "lr": 0.1} if rank == 1 else mine

    def attempt(load) -> str:   # noqa: ANN001
        try:
            load()
        except CheckpointError as exc:
            return f"CheckpointError: {exc}"
        return "loaded"

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    out: dict = {}
    said = io.StringIO()
    try:
        with CheckpointManager(root) as mgr, redirect_stderr(said):
            mgr.save(1, saved(1))
            untouched = state()
            out["load"] = attempt(lambda: mgr.load(1, untouched, on_missing="error"))
            mgr.snapshot(2, saved(2))
            out["load_latest"] = attempt(
                lambda: mgr.load_latest(untouched, on_missing="error"))
            out["untouched"] = bool(torch.equal(untouched["model"]["l0"], torch.zeros(3))
                                    and untouched["step"] == 0)
            stage = {"model": {"l0": torch.zeros(3)}, "step": 0} if rank == 1 else saved(0)
            out["layout"] = mgr.load_latest(stage)
        out["said"] = said.getvalue()
        Path(root, f"out-{rank}.json").write_text(json.dumps(out))
    finally:
        dist.destroy_process_group()
        gc.collect()  # else the exit can abort (hpctrain/runtime/teardown.py)
