"""A DeepSpeed engine saved and restored through hpctrain's commit protocol (CPU, world 1)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from helpers.ckpt import child_env, free_port, run_cli

pytestmark = [pytest.mark.deepspeed, pytest.mark.torch, pytest.mark.slow]

SCRIPT = textwrap.dedent("""
    import sys, warnings, torch, deepspeed
    from hpctrain.checkpoint import CheckpointManager, save_deepspeed, load_deepspeed
    root = sys.argv[1]
    def engine(seed):
        torch.manual_seed(seed)
        model = torch.nn.Linear(8, 4)
        cfg = {"train_batch_size": 2, "zero_optimization": {"stage": 0},
               "optimizer": {"type": "Adam", "params": {"lr": 1e-2, "torch_adam": True}}}
        return deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                    config=cfg)[0]
    eng = engine(0)
    mgr = CheckpointManager(root)
    for step in (1, 2):
        loss = eng(torch.randn(2, 8)).sum(); eng.backward(loss); eng.step()
        save_deepspeed(mgr, step, eng, client_state={"step": step})
    want = {k: v.clone() for k, v in eng.module.state_dict().items()}
    # damage step 2: load_deepspeed must skip it and restore step 1
    if sys.argv[2] == "damage":
        import glob
        f = glob.glob(root + "/step_000000002/ds/*model_states.pt")[0]
        data = bytearray(open(f, "rb").read()); data[-20] ^= 1; open(f, "wb").write(data)
    other = engine(1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        step, client = load_deepspeed(mgr, other)
    print("LOADED", step, client.get("step"), len(caught))
    if step == 2:
        for k, v in other.module.state_dict().items():
            assert torch.equal(v, want[k]), k
    mgr.close()
""")


def _run(root: Path, mode: str) -> str:
    env = child_env(DS_ACCELERATOR="cpu", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
                    RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(root), mode], capture_output=True,
                          text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_deepspeed_engine_round_trip_through_commit_protocol(tmp_path: Path) -> None:
    assert "LOADED 2 2 0" in _run(tmp_path, "clean")
    man = json.loads((tmp_path / "step_000000002" / "manifest.json").read_text())
    assert man["layout"] == {"kind": "deepspeed", "tag": "ds"}
    assert any(f["name"].startswith("ds/") and f["size"] > 0 for f in man["files"])
    assert not (tmp_path / "step_000000002" / "latest").exists()  # ours, not DeepSpeed's
    assert run_cli("ckpt", "verify", str(tmp_path)).returncode == 0


def test_damaged_deepspeed_step_is_skipped(tmp_path: Path) -> None:
    assert "LOADED 1 1 1" in _run(tmp_path, "damage")
    out = run_cli("ckpt", "verify", str(tmp_path))
    assert out.returncode == 1 and "step_000000002/ds/" in out.stdout
