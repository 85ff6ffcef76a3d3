"""hpctrain.slurm.client: typed errors and bounded, safe retries.

Controller timeouts cannot be produced on demand on the real cluster without
disturbing other tests, so these use a recorded-behaviour stand-in: a script named
like the SLURM binary that prints the message Slurm 22.05 prints, and counts its calls.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hpctrain.errors import SlurmError, SlurmNotFound, SlurmTimeout
from hpctrain.slurm import client


def standin(tmp_path: Path, name: str, message: str, fail_times: int) -> Path:
    counter = tmp_path / "calls"
    script = tmp_path / name
    script.write_text(f"""#!/bin/bash
# recorded-behaviour stand-in for {name}: fails {fail_times} time(s), then succeeds
n=$(( $(cat {counter} 2>/dev/null || echo 0) + 1 )); echo $n > {counter}
if (( n <= {fail_times} )); then echo "{name}: error: {message}" >&2; exit 1; fi
echo 42
""")
    script.chmod(0o755)
    return counter


@pytest.fixture
def on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    return tmp_path


def test_unreached_controller_is_retried_even_for_sbatch(on_path: Path) -> None:
    calls = standin(on_path, "sbatch", "Unable to contact slurm controller (connect failure)", 1)
    res = client.run(["sbatch", "x"], retries=2, retry_delay_s=0, idempotent=False)
    assert res.stdout.strip() == "42" and calls.read_text().strip() == "2"


def test_socket_timeout_is_not_retried_for_sbatch(on_path: Path) -> None:
    calls = standin(on_path, "sbatch", "Socket timed out on send/recv operation", 1)
    with pytest.raises(SlurmError, match="Socket timed out"):
        client.run(["sbatch", "x"], retries=2, retry_delay_s=0, idempotent=False)
    assert calls.read_text().strip() == "1"


def test_socket_timeout_is_retried_for_queries(on_path: Path) -> None:
    calls = standin(on_path, "squeue", "Socket timed out on send/recv operation", 2)
    assert client.run(["squeue"], retries=2, retry_delay_s=0).stdout.strip() == "42"
    assert calls.read_text().strip() == "3"


def test_retries_are_bounded(on_path: Path) -> None:
    calls = standin(on_path, "squeue", "Socket timed out on send/recv operation", 99)
    with pytest.raises(SlurmError):
        client.run(["squeue"], retries=2, retry_delay_s=0)
    assert calls.read_text().strip() == "3"


def test_refusal_is_not_retried_and_keeps_slurms_message(on_path: Path) -> None:
    calls = standin(on_path, "sbatch", "Batch job submission failed: Invalid account", 5)
    with pytest.raises(SlurmError, match="Invalid account"):
        client.run(["sbatch", "x"], retry_delay_s=0)
    assert calls.read_text().strip() == "1"


def test_missing_binary_says_no_slurm_client(monkeypatch: pytest.MonkeyPatch,
                                             tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SlurmNotFound, match="no SLURM client on this machine"):
        client.run(["sbatch", "x"])


def test_hang_becomes_slurm_timeout(on_path: Path) -> None:
    script = on_path / "scontrol"
    script.write_text("#!/bin/bash\nsleep 5\n")
    script.chmod(0o755)
    with pytest.raises(SlurmTimeout, match="did not answer within 0.2s"):
        client.run(["scontrol", "ping"], timeout=0.2, retries=0)
