"""``--host`` end to end (issue 15): alice on her "laptop" (a directory of her own, any
working directory) reaches the devcluster through a real OpenSSH server (``devcluster up
--ssh``), with her key, her ~/.ssh/config and rsync, as she would a cluster's login node.

- the CLI: submit from the project directory (the code goes along as a snapshot), edit the
  source, have Slurm requeue the job: the requeued run still runs the code of submission
  time; a second submission runs the edited code; status shows the run id and snapshot;
  logs --follow streams; cancel; a sweep;
- the notebook: ``hpctrain.Cluster(host=...).submit_function`` with a ``__main__`` function
  (pickled by value) and a function of a module of the project (by reference, from the
  snapshot), results back on the laptop;
- what goes wrong names the host and the fix: unknown host key, no key, unknown host.
"""

from __future__ import annotations

import json
import re
import stat
import sys
import time
import uuid
from pathlib import Path

import pytest

from helpers import admin, users
from helpers.slurm import wait_until
from helpers.ssh import ensure_ssh

# alone: the SSH login is the machine's (one port, one alias in each user's ~/.ssh/config)
pytestmark = [pytest.mark.slurm, pytest.mark.alone]
HOST = "hpctrain-devcluster"   # the alias ensure_ssh returns (checked in the fixture)
# the cluster's hpctrain: the project's venv (a login shell over ssh has no venv on PATH)
REMOTE = {"HPCTRAIN_REMOTE_COMMAND": str(Path(sys.executable).parent / "hpctrain")}

TRAIN = """\
import os, sys, time
VERSION = "{version}"
print(f"version {{VERSION}} restart {{os.environ.get('SLURM_RESTART_COUNT', '0')}} "
      f"snapshot {{os.environ.get('HPCTRAIN_SNAPSHOT_ID')}} cwd {{os.getcwd()}}", flush=True)
time.sleep(float(sys.argv[1]))
"""
SPEC = """\
name = "{name}"
partition = "debug"
time = "00:10:00"
gpus_per_node = 1
[requeue]
signal_lead_s = 10
[run]
launcher = "srun"
command = ["python3", "train.py", "{sleep}"]
"""


@pytest.fixture(scope="module")
def alice(cluster) -> users.User:
    user = users.ensure(users.ALICE)
    assert ensure_ssh(user.name) == HOST
    return user


def write(user: users.User, path: Path, text: str) -> None:
    """A file of the user's, written by the user (the tests may run as root or as her)."""
    user.run([sys.executable, "-c", "import sys, pathlib; p = pathlib.Path(sys.argv[1]); "
              "p.parent.mkdir(parents=True, exist_ok=True); p.write_text(sys.argv[2])",
              str(path), text], check=True)


def project(user: users.User, sleep: float, version: str = "v1") -> tuple[Path, str]:
    name = f"remote-{uuid.uuid4().hex[:6]}"
    root = user.home / "laptop" / name
    write(user, root / "train.py", TRAIN.format(version=version))
    write(user, root / "job.toml", SPEC.format(name=name, sleep=sleep))
    write(user, root / "mymod.py", "def triple(x):\n    return 3 * x\n")
    return root, name


def host(user: users.User, root: Path, *args: str, timeout: float = 120):
    return user.hpctrain("--host", HOST, *args, cwd=root, env=REMOTE, timeout=timeout)


def remote_log(user: users.User, root: Path, job_id: str) -> str:
    return host(user, root, "logs", job_id).stdout


def remote_waiters(job_id: str) -> list[str]:
    """Command lines of the cluster-side processes waiting on the job for a client
    (`hpctrain ... logs JOB --follow`, `hpctrain ... _serve wait JOB`)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            words = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if "--client-version" in words and job_id in words and \
                ("logs" in words or "wait" in words):
            found.append(" ".join(words))
    return found


def test_requeued_job_runs_its_snapshot_not_the_edited_tree(alice: users.User) -> None:
    root, name = project(alice, sleep=300)
    res = host(alice, root, "submit", "job.toml", "--json")
    assert res.returncode == 0, res.stderr
    job = json.loads(res.stdout)
    jid = job["job_id"]
    folder = Path(job["paths"]["folder"])
    assert folder == alice.home / "hpctrain-jobs" / name
    wait_until(lambda: "restart 0" in remote_log(alice, root, jid), 90, "the first run")
    first = re.search(r"version (\S+) restart 0 snapshot (\S+) cwd (\S+)",
                      remote_log(alice, root, jid))
    assert first and first.group(1) == "v1"
    sid = first.group(2)
    assert first.group(3) == str(folder / "snapshots" / sid)
    # the researcher keeps editing; then Slurm requeues the job (an operator, a preemption)
    write(alice, root / "train.py", TRAIN.format(version="v2"))
    admin.run(["scontrol", "requeue", jid])
    wait_until(lambda: "restart 1" in remote_log(alice, root, jid), 120, "the requeued run")
    log = remote_log(alice, root, jid)
    assert re.search(rf"version v1 restart 1 snapshot {sid} ", log), log
    assert "version v2" not in log
    # status over ssh: the run id (stable across the requeue) and the snapshot
    status = host(alice, root, "status", jid, "--json")
    row = json.loads(status.stdout)["jobs"][0]
    assert row["snapshot"] == sid and re.fullmatch(r"[0-9a-f]{32}", row["run_id"])
    # the job folder records where it came from (the tests run as alice, or as root)
    provenance = json.loads((folder / f"{jid}_provenance.json").read_text())
    assert provenance["snapshot_id"] == sid and provenance["git"] == {}
    assert provenance["submitted_from"].endswith(f":{root}")
    assert (folder / f"{jid}_requirements.txt").read_text().count("==") > 10
    # Ctrl-C on a follow of the quiet job, or on a notebook's wait for it: what waited on
    # the cluster ends too, at once (else at the job's next line or state change, hours
    # later; timeout sends the client SIGINT)
    stopped = alice.run(["timeout", "-s", "INT", "6", sys.executable, "-m", "hpctrain",
                         "--host", HOST, "logs", jid, "--follow"], cwd=root, env=REMOTE,
                        timeout=60)
    assert "following" in stopped.stderr, stopped.stderr
    waited = alice.run(["timeout", "-s", "INT", "6", sys.executable, "-c",
                        "import sys, hpctrain; hpctrain.Cluster(host=sys.argv[1])"
                        ".job(sys.argv[2]).wait()", HOST, jid], cwd=root, env=REMOTE,
                       timeout=60)
    assert "KeyboardInterrupt" in waited.stderr, waited.stderr
    wait_until(lambda: not remote_waiters(jid), 10, "the cluster's follower and waiter to end")
    assert host(alice, root, "cancel", jid).returncode == 0
    # the staging copy is gone once the job folder has its own; what is left is hers alone
    staging = alice.home / ".cache/hpctrain/staging"
    assert not (staging / sid).exists()
    assert stat.S_IMODE(staging.stat().st_mode) == 0o700

    # the next submission sends the edited tree: another snapshot, and logs --follow streams
    write(alice, root / "job.toml", SPEC.format(name=name, sleep=1))
    second = json.loads(host(alice, root, "submit", "job.toml", "--json").stdout)
    follow = host(alice, root, "logs", second["job_id"], "--follow", timeout=120)
    assert follow.returncode == 0, follow.stderr
    assert "version v2 restart 0" in follow.stdout and sid not in follow.stdout
    assert "hpctrain: job" in follow.stdout and "completed" in follow.stdout


def test_sweep_over_ssh(alice: users.User) -> None:
    root, _ = project(alice, sleep=0)
    res = host(alice, root, "sweep", "job.toml", "--grid", "checkpoint.keep_last=1,2", "--json")
    assert res.returncode == 0, res.stderr
    sweep = json.loads(res.stdout)
    assert sweep["points"] == 2 and re.fullmatch(r"[0-9a-f]{12}", sweep["snapshot"])

    def states() -> list[str]:
        out = host(alice, root, "status", sweep["sweep_id"], "--expand", "--json").stdout
        return [j["state"] for j in json.loads(out)["jobs"]]
    wait_until(lambda: states() == ["COMPLETED", "COMPLETED"], 120, "both points")


SITE_TEMPLATE = """\
{% extends "base.sbatch.j2" %}
{% block environment %}
{{ super() }}
# rendered with alice's template directory on the cluster
{% endblock %}
"""


def test_templates_named_with_host_are_the_clusters(alice: users.User) -> None:
    root, _ = project(alice, sleep=0)
    tag = uuid.uuid4().hex[:6]
    # on the cluster, relative to her home there (the devcluster's home is the laptop's)
    write(alice, alice.home / f"site-{tag}" / "partitions" / "debug.sbatch.j2", SITE_TEMPLATE)
    dry = host(alice, root, "submit", "job.toml", "--dry-run", "--templates", f"site-{tag}")
    assert dry.returncode == 0, dry.stderr
    assert "# rendered with alice's template directory on the cluster" in dry.stdout
    # a dry run names the snapshot it would send, and sends (and reads there) nothing
    named = re.search(r"(?m)^snapshot: ([0-9a-f]{12}) \(would be copied to ", dry.stdout)
    assert named and f"would run from snapshot {named.group(1)}" in dry.stderr, dry.stderr
    assert not (alice.home / ".cache/hpctrain/staging" / named.group(1)).exists()
    missing = host(alice, root, "sweep", "job.toml", "--grid", "checkpoint.keep_last=1,2",
                   "--dry-run", "--templates", f"nowhere-{tag}")
    assert missing.returncode != 0
    assert f"template directory 'nowhere-{tag}' does not exist" in missing.stderr, missing.stderr


NOTEBOOK = """\
import json, os, sys
import hpctrain
import mymod

def shout(word, times=1):           # a notebook cell's function: pickled by value
    return (word.upper() + "!") * times, int(os.environ["WORLD_SIZE"])

with hpctrain.Cluster(host={host!r}) as cluster:
    by_value = cluster.submit_function(shout, "hi", times=2, partition="debug",
                                       gpus_per_node=2, snapshot=False)
    by_reference = cluster.submit_function(mymod.triple, 7, partition="debug",
                                           gpus_per_node=1)
    out = {{"by_value": by_value.result(timeout_s=120),
           "by_reference": by_reference.result(timeout_s=120),
           "state": str(by_reference.state), "job": repr(by_reference),
           "status": [j["job_id"] for j in cluster.status(by_value.job_id)]}}
print(json.dumps(out))
"""


def test_notebook_submit_function_over_ssh(alice: users.User) -> None:
    root, _ = project(alice, sleep=0)
    write(alice, root / "nb.py", NOTEBOOK.format(host=HOST))
    res = alice.run([sys.executable, "nb.py"], cwd=root, env=REMOTE, timeout=240)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.splitlines()[-1])
    assert out["by_value"] == [["HI!HI!", 2], ["HI!HI!", 2]]      # one value per rank
    assert out["by_reference"] == 21 and out["state"] == "COMPLETED"
    assert "RemoteJob(job_id=" in out["job"] and len(out["status"]) == 1


def test_failures_name_the_host_and_the_fix(alice: users.User, tmp_path: Path) -> None:
    root, _ = project(alice, sleep=0)
    ssh = alice.home / ".ssh"
    wrong_key = "[127.0.0.1]:2222 ssh-ed25519 " \
        "AAAAC3NzaC1lZDI1NTE5AAAAIHnYBqzuAf/7XrOTL3SUvZOGOZyQm8wB9tWQ1eTRcVeq\n"
    write(alice, root / "bad_hosts", wrong_key)
    base = f"  HostName 127.0.0.1\n  Port 2222\n  User {alice.name}\n  BatchMode yes\n"
    write(alice, root / "ssh_config",
          f"Host badkey\n{base}  IdentityFile {ssh}/hpctrain-devcluster\n"
          f"  UserKnownHostsFile {root}/bad_hosts\n  StrictHostKeyChecking yes\n"
          f"Host nokey\n{base}  IdentityFile {root}/missing\n  IdentitiesOnly yes\n"
          f"  UserKnownHostsFile {ssh}/hpctrain-devcluster.known_hosts\n")
    code = ("import sys, hpctrain\n"
            "from hpctrain.errors import RemoteError\n"
            "for h in ('badkey', 'nokey', 'no-such-host.invalid'):\n"
            "    try:\n"
            "        hpctrain.Cluster(host=h, ssh_config=sys.argv[1]).status()\n"
            "    except RemoteError as e:\n"
            "        print(h, '|', e)\n")
    res = alice.run([sys.executable, "-c", code, str(root / "ssh_config")], cwd=root,
                    env=REMOTE, timeout=120)
    lines = dict(line.split(" | ", 1) for line in res.stdout.splitlines() if " | " in line)
    assert "host key verification failed" in lines["badkey"], res.stdout + res.stderr
    assert "ssh-keygen -R" in lines["badkey"]
    assert "authentication failed" in lines["nokey"] and "ssh-add" in lines["nokey"]
    assert "cannot resolve no-such-host.invalid" in lines["no-such-host.invalid"]
    # and from the CLI: exit 7, one line naming the host
    cli = alice.hpctrain("--host", "no-such-host.invalid", "status", cwd=root, env=REMOTE)
    assert cli.returncode == 7 and "cannot resolve no-such-host.invalid" in cli.stderr
    started = time.monotonic()
    missing = alice.hpctrain("--host", HOST, "--remote-command", "/nonexistent/hpctrain",
                             "status", cwd=root)
    assert missing.returncode == 7 and "hpctrain is not installed on hpctrain-devcluster" \
        in missing.stderr and time.monotonic() - started < 30


def serve_log(user: users.User) -> str:
    """Every warm server's log of the user's on the devcluster's login node (this machine;
    sshd's sessions have no XDG_RUNTIME_DIR, so /tmp/hpctrain-serve-UID)."""
    return user.run(["sh", "-c", f"cat /tmp/hpctrain-serve-{user.uid}/*.log"]).stdout


def warm_server(user: users.User, remote_command: str) -> dict:
    """The ping answer of the user's warm server for ``remote_command`` (its pid)."""
    code = ("import json, sys\n"
            "from hpctrain.remote.frames import ask\n"
            "from hpctrain.remote.ssh import Connection\n"
            "w = Connection(sys.argv[1], remote_command=sys.argv[2]).warm\n"
            "print(json.dumps(ask(w.local, {'ping': True})))\n")
    res = user.run([sys.executable, "-c", code, HOST, remote_command], check=True)
    return json.loads(res.stdout) or {}


def test_short_commands_are_answered_by_the_warm_server(alice: users.User) -> None:
    root, _ = project(alice, sleep=0)
    plain = {**REMOTE, "HPCTRAIN_REMOTE_SERVER": "0"}
    cases = [("status", "--json", "999999"), ("logs", "999999")]
    for args in cases:
        warm = host(alice, root, *args)
        cold = alice.hpctrain("--host", HOST, *args, cwd=root, env=plain, timeout=120)
        # the same bytes, streams and exit code as over plain ssh
        assert (warm.returncode, warm.stdout, warm.stderr) == \
            (cold.returncode, cold.stdout, cold.stderr), args
    assert host(alice, root, "logs", "999999").returncode == 6
    log = serve_log(alice)
    assert "status --json: exit 0" in log and "logs 999999: exit 6" in log, log
    # a server gone (killed, or ended while idle) is started again by the next command
    pid = warm_server(alice, REMOTE["HPCTRAIN_REMOTE_COMMAND"])["pid"]
    alice.run(["kill", "-KILL", str(pid)], check=True)
    res = host(alice, root, "status", "--json", "999999")
    assert res.returncode == 0 and json.loads(res.stdout)["jobs"][0]["state"] == "UNKNOWN"
    assert warm_server(alice, REMOTE["HPCTRAIN_REMOTE_COMMAND"])["pid"] != pid


def test_a_cluster_without_the_warm_server_is_served_over_plain_ssh(alice: users.User) -> None:
    root, _ = project(alice, sleep=0)
    # an hpctrain there that has no `_serve daemon` (an older release, a site that
    # forbids it): every command still answers, and the client stops asking for a while
    calls = alice.home / "laptop" / f"calls-{uuid.uuid4().hex[:6]}"
    wrapper = alice.home / f"old-hpctrain-{uuid.uuid4().hex[:6]}"
    write(alice, wrapper, "#!/bin/sh\n"
          f"echo \"$*\" >> {calls}\n"
          "case \"$*\" in *'_serve daemon'*) echo \"Error: No such command 'daemon'.\" >&2;"
          " exit 2;; esac\n"
          f"exec {REMOTE['HPCTRAIN_REMOTE_COMMAND']} \"$@\"\n")
    alice.run(["chmod", "0700", str(wrapper)], check=True)
    env = {"HPCTRAIN_REMOTE_COMMAND": str(wrapper)}
    for _ in range(2):
        res = alice.hpctrain("--host", HOST, "status", "--json", "999999", cwd=root, env=env)
        assert res.returncode == 0 and res.stderr == "", res.stderr
        assert json.loads(res.stdout)["jobs"][0]["job_id"] == "999999"
    lines = alice.run(["cat", str(calls)], check=True).stdout.splitlines()
    assert sum("_serve daemon" in line for line in lines) == 1, lines
    assert sum(line.endswith("status --json 999999") for line in lines) == 2, lines
