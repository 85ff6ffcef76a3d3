"""hpctrain as two ordinary users of one shared cluster (issue 19), on the real devcluster.

alice submits, watches, is preempted by her neighbour bob's urgent job, is requeued and
resumes from her checkpoint; bob can neither read nor alter anything of hers, and cannot
cancel her job. Then the planted-file cases: every path a neighbour could have put where
hpctrain writes is refused with its path and owner named. Everything here runs as the two
users; the tests themselves run as alice under ``./dev.sh test`` (as root elsewhere, they
reach both users through ``runuser``).
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import sys
import uuid
from pathlib import Path

import pytest

from helpers import admin, users
from helpers.jobs import SHARED
from helpers.jsonl import read_jsonl
from helpers.slurm import sacct_states, wait_done, wait_until
from helpers.specs import write_spec

pytestmark = pytest.mark.slurm
STEPS_PROGRAM = Path(__file__).resolve().parents[1] / "programs" / "runtime_steps.py"


@pytest.fixture(scope="module")
def alice(cluster) -> users.User:
    return users.ensure(users.ALICE)


@pytest.fixture(scope="module")
def bob(cluster) -> users.User:
    return users.ensure(users.BOB)


def _as_owner(user: users.User, path: Path) -> Path:
    """A file the tests wrote, handed to ``user`` (a no-op when the tests run as her)."""
    if os.stat(path).st_uid != user.uid:
        admin.chown(path, user.uid)
    return path


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_a_job_of_alice_survives_bobs_preemption_and_bob_sees_nothing_of_it(
        alice: users.User, bob: users.User) -> None:
    tag = uuid.uuid4().hex[:8]
    ckpt = SHARED / f"alice-ckpt-{tag}"
    alice.run(["mkdir", "-m", "700", str(ckpt)], check=True)
    events = alice.home / f"events-{tag}.jsonl"
    secret = f"s3cr3t-{uuid.uuid4().hex}"
    digest = hashlib.sha256(secret.encode()).hexdigest()[:16]
    spec = _as_owner(alice, write_spec(
        alice.home / f"job-{tag}.toml", name=f"alice-{tag}", gpus=2, checkpoint_dir=str(ckpt),
        command=["bash", "-c", 'echo "secret-sha=$(printf %s "$HPCT_SECRET" | sha256sum '
                 '| cut -c1-16)"; exec "$0" "$@"', sys.executable, str(STEPS_PROGRAM),
                 "--steps", "8", "--save-every", "2", "--step-sleep", "1",
                 "--ckpt-dir", str(ckpt), "--events", str(events)]))
    spec.write_text(spec.read_text().replace("env_passthrough = []",
                                             'env_passthrough = ["HPCT_SECRET"]'))

    # the secret must be in the submitting environment, and render never shows it
    refused = alice.hpctrain("submit", str(spec))
    assert refused.returncode == 2 and "HPCT_SECRET" in refused.stderr, refused.stderr
    sub = alice.hpctrain("submit", str(spec), "--json", env={"HPCT_SECRET": secret})
    assert sub.returncode == 0, sub.stderr
    submitted = json.loads(sub.stdout)
    job = submitted["job_id"]

    wait_until(lambda: any(e["event"] == "step" and e["step"] >= 2 for e in read_jsonl(events)),
               90, "alice's job to pass step 2")
    # bob's urgent job takes alice's node: Slurm preempts her job, which is requeued
    node = alice.run(["squeue", "-h", "-j", job, "-o", "%N"], check=True).stdout.strip()
    # PrivateData=jobs: bob's squeue, scontrol and sacct do not show her job, not even its
    # name, while her own do (hpctrain only ever asks about the user's own jobs)
    queue = bob.run(["squeue", "-h", "-o", "%i %j"], check=True).stdout.split()
    assert job not in queue and f"alice-{tag}" not in queue, queue
    assert bob.run(["scontrol", "show", "job", job]).returncode != 0
    assert bob.run(["sacct", "-n", "-X", "-a", "-j", job, "-o", "JobName%40"],
                   check=True).stdout.strip() == ""
    urgent = bob.run(["sbatch", "--parsable", "-p", "urgent", f"--nodelist={node}",
                      "--gres=gpu:2", "-o", "/dev/null", "--wrap", "sleep 1"], check=True)
    urgent_id = urgent.stdout.strip().split(";")[0]
    # and alice sees nothing of bob's: his job is waited for as him
    assert alice.run(["squeue", "-h", "-j", urgent_id, "-o", "%j"]).stdout.strip() == ""
    wait_until(lambda: bob.run(["sacct", "-n", "-X", "-P", "-j", urgent_id, "-o", "State"])
               .stdout.strip() == "COMPLETED", 120, "bob's urgent job")
    # bob cannot cancel it: Slurm's refusal, said plainly
    cancel = bob.hpctrain("cancel", job)
    assert cancel.returncode == 3 and f"Slurm refused to cancel {job}: Access/permission " \
        "denied (only the job's owner" in cancel.stderr, cancel.stderr
    assert wait_done(job, 180) == "COMPLETED", alice.hpctrain("logs", job).stdout[-3000:]

    found = read_jsonl(events)
    starts = [e for e in found if e["event"] == "start"]
    assert [s["step"] for s in starts][0] == 0 and len(starts) == 2 and starts[1]["step"] > 0
    assert starts[1]["last"] == "preemption" and found[-1] == {**found[-1], "event": "done"}
    assert "PREEMPTED" in sacct_states(job) or "REQUEUED" in sacct_states(job)
    owner = alice.run(["sacct", "-n", "-X", "-j", job, "-o", "User%20"], check=True)
    assert set(owner.stdout.split()) == {users.ALICE}

    status = alice.hpctrain("status", job, "--json")
    assert status.returncode == 0 and json.loads(status.stdout)["jobs"][0]["state"] == \
        "COMPLETED", status.stderr
    logs = alice.hpctrain("logs", job)
    assert logs.returncode == 0 and f"secret-sha={digest}" in logs.stdout

    # what alice's job left: private, and the secret's value in no file
    folder = Path(submitted["paths"]["folder"])
    assert _mode(folder) == 0o700 and os.stat(folder).st_uid == alice.uid
    written = [p for p in folder.rglob("*") if p.is_file() and not p.is_symlink()]
    assert written and {_mode(p) for p in written} == {0o600}, \
        {str(p): oct(_mode(p)) for p in written}
    steps = sorted(ckpt.glob("step_*"))
    assert steps and {_mode(s) for s in steps} == {0o700}
    assert {_mode(f) for s in steps for f in s.iterdir()} == {0o600}
    for path in [*written, *[f for f in ckpt.rglob("*") if f.is_file()], spec]:
        assert secret.encode() not in path.read_bytes(), path

    # bob can neither read nor alter any of it
    for path in (Path(submitted["paths"]["submission_file"]), Path(submitted["paths"]["log"]),
                 steps[-1] / "manifest.json", spec):
        assert bob.run(["cat", str(path)]).returncode != 0, path
    for target in (folder, ckpt, steps[-1]):
        assert bob.run(["touch", str(target / "planted")]).returncode != 0, target
        assert bob.run(["ls", str(target)]).returncode != 0, target


def test_alice_sweeps_and_cancels_her_own_job(alice: users.User) -> None:
    tag = uuid.uuid4().hex[:8]
    spec = _as_owner(alice, write_spec(
        alice.home / f"sweep-{tag}.toml", name=f"sweep-{tag}",
        command=["bash", "-c", "echo point P=$P"]))
    sweep = alice.hpctrain("sweep", str(spec), "--grid", "run.env.P=1,2", "--json")
    assert sweep.returncode == 0, sweep.stderr
    assert wait_done(str(json.loads(sweep.stdout)["sweep_id"]), 120) == "COMPLETED"

    sleeper = _as_owner(alice, write_spec(alice.home / f"sleep-{tag}.toml", name=f"sleep-{tag}",
                                          command=["sleep", "300"]))
    job = json.loads(alice.hpctrain("submit", str(sleeper), "--json", check=True).stdout)["job_id"]
    cancel = alice.hpctrain("cancel", job)
    assert cancel.returncode == 0, cancel.stderr
    assert wait_done(job, 60) == "CANCELLED"


def test_alices_function_job_payloads_are_hers_alone(alice: users.User,
                                                    bob: users.User) -> None:
    """A notebook user's submit_function: the pickled function and its arguments (a token,
    here) are in a private job folder, and the result comes back to her only."""
    code = ("import hpctrain, json, os\n"
            "def train(token):\n"
            "    return {'uid': os.getuid(), 'token_len': len(token)}\n"
            "job = hpctrain.submit_function(train, 'tok-' + 'x' * 20, partition='debug',\n"
            "                               gpus_per_node=1, time='00:10:00')\n"
            "print(json.dumps({'folder': str(job.folder), 'result': job.result(),\n"
            "                  'id': job.job_id}))\n")
    res = alice.python(code, timeout=180)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["result"] == {"uid": alice.uid, "token_len": 24}
    folder = Path(out["folder"])
    pickles = sorted(folder.glob(f"{out['id']}_*.pkl"))
    assert pickles and _mode(folder) == 0o700 and {_mode(p) for p in pickles} == {0o600}
    for path in pickles:
        assert bob.run(["cat", str(path)]).returncode != 0, path


def test_paths_a_neighbour_planted_are_refused_with_path_and_owner(
        alice: users.User, bob: users.User) -> None:
    tag = uuid.uuid4().hex[:8]
    spec = _as_owner(alice, write_spec(alice.home / f"p-{tag}.toml", name=f"p-{tag}",
                                       command=["true"]))

    def submit_with_jobs_dir(jobs_dir: Path) -> str:
        res = alice.hpctrain("submit", str(spec), env={"HPCTRAIN_JOBS_DIR": str(jobs_dir)})
        assert res.returncode == 13, (res.returncode, res.stdout, res.stderr)
        return res.stderr

    # bob made the jobs folder alice asked for, on shared scratch
    bobs = SHARED / f"bob-made-{tag}"
    bob.run(["mkdir", "-m", "777", str(bobs)], check=True)
    err = submit_with_jobs_dir(bobs)
    assert f"{bobs}" in err and f"owned by {users.BOB}" in err
    # ... or a symlink there, to a folder of his
    link = SHARED / f"bob-link-{tag}"
    bob.run(["ln", "-s", str(bobs), str(link)], check=True)
    assert "is a symlink" in submit_with_jobs_dir(link)
    # alice's own folder, opened to every user
    opened = SHARED / f"alice-open-{tag}"
    alice.run(["mkdir", "-m", "777", str(opened)], check=True)
    assert "every user may write in it" in submit_with_jobs_dir(opened)

    # checkpoint roots: bob's, and alice's own with a lock file bob planted
    code = ("from hpctrain.checkpoint import CheckpointManager\n"
            "import sys\nCheckpointManager(sys.argv[1], lock_wait_s=0)\n")
    res = alice.run([sys.executable, "-c", code, str(bobs)])
    assert res.returncode != 0 and f"owned by {users.BOB}" in res.stderr and "trust=True" \
        in res.stderr, res.stderr
    sticky = SHARED / f"alice-sticky-{tag}"
    alice.run(["mkdir", "-m", "1777", str(sticky)], check=True)
    bob.run(["ln", "-s", str(alice.home / ".bashrc"), str(sticky / ".hpctrain-ckpt.lock")],
            check=True)
    res = alice.run([sys.executable, "-c", code, str(sticky)])
    assert res.returncode != 0 and "lock file" in res.stderr and "symlink" in res.stderr, \
        res.stderr

    # the supervisor's state directory, planted by bob where alice's job keeps its state
    state_base = SHARED / f"alice-submit-{tag}"
    alice.run(["mkdir", "-m", "1777", str(state_base)], check=True)
    bob.run(["mkdir", "-p", str(state_base / ".hpctrain" / "jobs")], check=True)
    job_spec = _as_owner(alice, write_spec(alice.home / f"s-{tag}.toml", name=f"s-{tag}",
                                           command=["true"], checkpoint_dir=str(state_base)))
    job = json.loads(alice.hpctrain("submit", str(job_spec), "--json", check=True).stdout)
    assert wait_done(job["job_id"], 90) == "FAILED"
    log = Path(job["paths"]["log"]).read_text()
    assert "not using the job's state directory" in log and users.BOB in log, log[-2000:]
