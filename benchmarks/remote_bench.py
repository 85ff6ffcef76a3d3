"""``status`` over SSH (``--host``) against ``status`` on the login node, in one run.

    .venv/bin/python benchmarks/remote_bench.py [--user hpct-alice] [--runs 15]

Needs ``hpctrain devcluster up --ssh --ssh-user USER`` (the devcluster's real sshd on
127.0.0.1; as root this script re-runs itself as USER, since root may not log in).
Measured in turn (a, b, c, a, b, c, ... after one warm-up each, medians):

- local:  ``hpctrain status`` on the login node (the user's recent jobs, one Slurm call);
- rtt:    ``ssh HOST true`` over the shared connection (one round trip);
- remote: ``hpctrain --host HOST status`` from another directory, through the warm server
  (the default) and over plain ssh (``HPCTRAIN_REMOTE_SERVER=0``: a Python start there);

and the same in Python: ``status_json()`` here against ``Cluster(host).status()``.
The target (issue 15): remote <= local + one round trip, i.e. the ratio
remote / (local + rtt) at most 1, for the CLI and for the API alike.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HOST = "hpctrain-devcluster"
PY = sys.executable
HP = str(Path(PY).with_name("hpctrain"))


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def run(argv: list[str], env: dict[str, str]) -> None:
    res = subprocess.run(argv, env=env, capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {res.stderr[-500:]}")


def interleaved(cases: dict, runs: int) -> dict[str, float]:
    for fn in cases.values():
        fn()                              # warm: .pyc files, the ssh master connection
    times: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(runs):
        for k, fn in cases.items():
            times[k].append(timed(fn))
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--user", default="hpct-alice", help="who logs in (when run as root)")
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if os.geteuid() == 0:
        home = subprocess.run(["getent", "passwd", args.user], capture_output=True,
                              text=True).stdout.split(":")[5]
        os.execvp("runuser", ["runuser", "-u", args.user, "--", "env", f"HOME={home}",
                              f"PATH={Path(PY).parent}:/usr/bin:/bin",
                              f"SLURM_CONF={os.environ.get('SLURM_CONF', '')}",
                              PY, *sys.argv])

    from hpctrain.jobs.listing import status_json
    from hpctrain.remote.client import Cluster
    from hpctrain.remote.ssh import Connection

    env = {**os.environ, "HPCTRAIN_REMOTE_COMMAND": HP}
    cold_env = {**env, "HPCTRAIN_REMOTE_SERVER": "0"}
    os.chdir("/tmp")                       # the laptop's directory: not the cluster's
    conn = Connection(HOST, remote_command=HP)
    cluster = Cluster(host=HOST, remote_command=HP)

    def plain_ssh_api() -> None:
        os.environ["HPCTRAIN_REMOTE_SERVER"] = "0"    # read at each call
        try:
            cluster.status()
        finally:
            del os.environ["HPCTRAIN_REMOTE_SERVER"]

    t = interleaved({
        "local status (CLI)": lambda: run([HP, "status"], env),
        "ssh round trip": lambda: run(conn.ssh_argv(["true"]), env),
        "--host status (CLI, warm)": lambda: run([HP, "--host", HOST, "status"], env),
        "--host status (CLI, plain ssh)": lambda: run([HP, "--host", HOST, "status"], cold_env),
        "local status_json() (API)": lambda: status_json(),
        "Cluster(host).status() (API, warm)": lambda: cluster.status(),
        "Cluster(host).status() (API, plain ssh)": plain_ssh_api,
    }, args.runs)
    rtt = t["ssh round trip"]
    local_cli, local_api = t["local status (CLI)"] + rtt, t["local status_json() (API)"] + rtt
    ratios = {
        "CLI warm: remote / (local + rtt)": t["--host status (CLI, warm)"] / local_cli,
        "CLI plain ssh: remote / (local + rtt)": t["--host status (CLI, plain ssh)"] / local_cli,
        "API warm: remote / (local + rtt)": t["Cluster(host).status() (API, warm)"] / local_api,
        "API plain ssh: remote / (local + rtt)":
            t["Cluster(host).status() (API, plain ssh)"] / local_api,
    }
    cluster.close()
    if args.json:
        print(json.dumps({"seconds": t, "ratios": ratios}))
    else:
        for k, v in t.items():
            print(f"{k:<40} {v * 1000:8.1f} ms")
        for k, v in ratios.items():
            print(f"{k:<40} {v:8.2f} x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
