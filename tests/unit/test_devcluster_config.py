"""Pure tests of the devcluster's configuration rendering and input checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain.devcluster import config, ociconf, packages, sshconf, strict
from hpctrain.devcluster.config import Paths, Ports, Shape
from hpctrain.errors import DevclusterError
from hpctrain.slurm.parse import parse_kv_line

PATHS = Paths(Path("/state"))


def conf_lines(shape: Shape) -> list[str]:
    return config.slurm_conf(shape, PATHS, Ports(), "host").splitlines()


def test_nodes_have_own_ports_gres_and_resolve_to_loopback() -> None:
    nodes = [parse_kv_line(line) for line in conf_lines(Shape(nodes=3, gpus_per_node=4, spare=0))
             if line.startswith("NodeName=")]
    assert [n["NodeName"] for n in nodes] == ["n1", "n2", "n3"]
    assert [n["Port"] for n in nodes] == ["17001", "17002", "17003"]
    assert {n["Gres"] for n in nodes} == {"gpu:4"}
    assert {n["NodeAddr"] for n in nodes} == {"127.0.0.1"}


def test_partitions_debug_default_low_urgent_preempts_with_requeue() -> None:
    parts = {p["PartitionName"]: p for p in map(parse_kv_line, conf_lines(Shape()))
             if "PartitionName" in p}
    assert parts["debug"]["Default"] == "YES"
    assert int(parts["urgent"]["PriorityTier"]) > int(parts["debug"]["PriorityTier"])
    assert parts["debug"]["PreemptMode"] == "REQUEUE"
    assert 0 < int(parts["debug"]["GraceTime"]) <= 30
    assert parts["debug"]["Nodes"] == parts["urgent"]["Nodes"] == "n[1-2]"
    # `wide` has the spare node too: room to requeue a job without a bad node
    assert parts["wide"]["Nodes"] == "n[1-3]" and parts["wide"]["PreemptMode"] == "REQUEUE"


def test_fast_failure_detection_and_fast_requeue() -> None:
    text = "\n".join(conf_lines(Shape()))
    assert "SlurmdTimeout=10" in text
    assert "cred_expire=5" in text  # requeued jobs held 6 s, not Slurm's 121 s
    assert "PreemptType=preempt/partition_prio" in text
    assert "AccountingStorageType=accounting_storage/slurmdbd" in text


# this machine kind's mount table, abridged (hybrid: cgroup v1 controllers, cgroup2 beside)
HYBRID = """tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0
cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0
cgroup /sys/fs/cgroup/cpuset cgroup rw,relatime,cpuset 0 0
cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0
"""
UNIFIED = "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid,nodev,noexec,relatime 0 0\n"


def test_the_strict_site_binds_cores_and_memory_with_cgroups_where_v1_is_mounted() -> None:
    assert strict.cgroup_v1_missing(HYBRID) == ""
    assert strict.cgroup_v1_missing(UNIFIED) == (
        "no cgroup v1 hierarchy for cpuset and memory under /sys/fs/cgroup (a cgroup "
        "v2-only host)")
    assert "memory under" in strict.cgroup_v1_missing(HYBRID.replace(",memory", ",blkio"))
    shape = Shape(site="strict", cpus_per_node=2)
    bound = "\n".join(config.slurm_conf(shape, PATHS, Ports(), "host", cgroups=True)
                      .splitlines())
    assert "TaskPlugin=task/affinity,task/cgroup" in bound
    # Slurm refuses to start with the cgroup's limit and the poller's kill both on
    assert "OverMemoryKill" not in bound and "JobAcctGatherFrequency=2" in bound
    assert "SelectTypeParameters=CR_Core_Memory" in bound and "DefMemPerCPU=256" in bound
    polled = "\n".join(conf_lines(shape))        # a host without cgroup v1
    assert "TaskPlugin=task/none" in polled and "JobAcctGatherParams=OverMemoryKill" in polled
    lenient = "\n".join(config.slurm_conf(Shape(), PATHS, Ports(), "host", cgroups=True)
                        .splitlines())
    assert "TaskPlugin=task/none" in lenient and "SelectTypeParameters=CR_Core\n" in lenient
    conf = dict(line.split("=", 1) for line in strict.cgroup_conf().splitlines()
                if line and not line.startswith("#"))
    assert conf == {"CgroupPlugin": "cgroup/v1", "CgroupMountpoint": "/sys/fs/cgroup",
                    "ConstrainCores": "yes", "ConstrainRAMSpace": "yes",
                    "ConstrainDevices": "no"}


def test_a_strict_node_never_declares_cpus_the_machine_cannot_bind() -> None:
    assert [strict.default_cpus(4, n) for n in (1, 2, 4, 64)] == [1, 2, 4, 4]
    strict.check_cpus(2, 2)
    with pytest.raises(DevclusterError, match=r"--cpus-per-node=4 is more than this "
                       r"machine's 2 CPUs: .* use --cpus-per-node 2 or fewer"):
        strict.check_cpus(4, 2)
    assert strict.limits("lenient", "").startswith("none")
    assert strict.limits("strict", "").startswith("cgroups: each task bound to its CPUs")
    assert strict.limits("strict", "no cgroup v1").endswith("no core is bound (no cgroup v1)")


def test_gres_conf_points_each_node_at_its_fake_gpu_files() -> None:
    text = config.gres_conf(Shape(nodes=2, gpus_per_node=2), PATHS)
    assert "NodeName=n1 Name=gpu File=/state/fake-gpus/n1-gpu[0-1]" in text
    assert "NodeName=n2 Name=gpu File=/state/fake-gpus/n2-gpu[0-1]" in text
    single = config.gres_conf(Shape(nodes=1, gpus_per_node=1), PATHS)
    assert "File=/state/fake-gpus/n1-gpu0" in single
    assert "Name=gpu" not in config.gres_conf(Shape(gpus_per_node=0), PATHS)


def test_no_gres_line_when_no_gpus() -> None:
    assert not any("Gres=" in line for line in conf_lines(Shape(gpus_per_node=0))
                   if line.startswith("NodeName="))


def test_hosts_update_is_idempotent_and_removable() -> None:
    base = "127.0.0.1 localhost\n"
    once = config.updated_hosts(base, Shape(nodes=2, spare=0))
    assert once == config.updated_hosts(once, Shape(nodes=2, spare=0))
    assert "127.0.0.1 n1 n2 # hpctrain-devcluster" in once
    three = config.updated_hosts(once, Shape(nodes=3, spare=0))
    assert three.count(config.HOSTS_MARKER) == 1 and " n3 " in three
    assert config.updated_hosts(three, None) == base


def test_instances_side_by_side_have_their_own_ports_job_ids_and_hosts_line() -> None:
    """Parallel test workers each run a devcluster instance: nothing may be shared that a
    test on one changes (ports, job ids, the /etc/hosts line)."""
    ports = [Ports.for_instance(n) for n in range(config.MAX_INSTANCES)]
    assert ports[0] == Ports()
    taken = [p.slurmctld for p in ports] + [p.slurmdbd for p in ports] + \
        [p.mariadb for p in ports] + \
        [p.slurmd_base + i for p in ports for i in range(1, 64 + 8 + 1)]   # the largest shape
    assert len(taken) == len(set(taken))
    firsts = [config.first_job_id(n) for n in range(config.MAX_INSTANCES)]
    assert firsts[0] == 1 and firsts == sorted(firsts)
    # a million ids each, and their rendezvous ports (id mod 4,000) apart
    assert all(b - a > 1_000_000 for a, b in zip(firsts, firsts[1:]))
    assert len({f % 4_000 for f in firsts[:4]}) == 4   # instances 0-3: 1,000 apart
    lines = config.slurm_conf(Shape(), PATHS, ports[3], "host", instance=3).splitlines()
    assert f"FirstJobId={firsts[3]}" in lines and "SlurmctldPort=16847" in lines
    base = "127.0.0.1 localhost\n"
    both = config.updated_hosts(config.updated_hosts(base, Shape(), 0), Shape(nodes=5), 1)
    assert "n1 n2 n3 # hpctrain-devcluster\n" in both and "n6 # hpctrain-devcluster-1" in both
    # instance 1 brought down: instance 0's names still resolve
    assert config.updated_hosts(both, None, 1) == config.updated_hosts(base, Shape(), 0)
    assert config.updated_hosts(both, None, 0).count("hpctrain-devcluster") == 1


@pytest.mark.parametrize("instance", [-1, 8, True, "1"])
def test_an_instance_out_of_range_is_refused_with_the_range(instance: object) -> None:
    with pytest.raises(DevclusterError, match="out of range: use 0..7"):
        Ports.for_instance(instance)   # type: ignore[arg-type]


@pytest.mark.parametrize("field,value", [("nodes", 0), ("nodes", 1000), ("gpus_per_node", -1),
                                         ("cpus_per_node", 0)])
def test_bad_shape_is_refused_with_the_range(field: str, value: int) -> None:
    with pytest.raises(DevclusterError, match=f"{field}={value}.*use"):
        Shape(**{field: value})


def test_slurmdbd_conf_and_sql_carry_the_password() -> None:
    conf = config.slurmdbd_conf(PATHS, Ports(), "s3cret")
    assert "StoragePass=s3cret" in conf and "StoragePort=16306" in conf
    assert "IDENTIFIED BY 's3cret'" in config.db_setup_sql("s3cret")


def test_login_accounts_are_registered_with_the_accounting() -> None:
    # under PrivateData=jobs slurmdbd shows a user nothing, not even their own jobs,
    # unless it knows them: `up` registers the machine's login accounts
    entries = [("root", 0, "/bin/bash"), ("daemon", 1, "/usr/sbin/nologin"),
               ("hpct-alice", 1001, "/bin/bash"), ("svc", 1002, "/usr/sbin/nologin"),
               ("ci", 1003, "/bin/false"), ("nobody", 65534, "/usr/sbin/nologin"),
               ("bob", 59999, "/bin/sh")]
    assert config.login_users(entries) == ["bob", "hpct-alice"]


def test_users_see_only_their_own_jobs_in_squeue_and_sacct() -> None:
    # slurmctld (squeue, scontrol) and slurmdbd (sacct) each apply their own PrivateData
    assert "PrivateData=jobs,usage,users" in conf_lines(Shape())
    assert "PrivateData=jobs,usage,users" in \
        config.slurmdbd_conf(PATHS, Ports(), "x").splitlines()


def test_missing_packages_error_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(packages.BINARIES, "slurmdbd", "/nonexistent/slurmdbd")
    assert "slurmdbd" in packages.missing_packages()
    with pytest.raises(DevclusterError, match="apt-get install -y .*slurmdbd"):
        packages.ensure_packages(install=False)


@pytest.mark.parametrize("state, usable, held", [
    ("IDLE", True, False), ("MIXED", True, False), ("ALLOCATED+COMPLETING", True, False),
    ("IDLE+DRAIN", False, True),            # Slurm's "Duplicate jobid" drain looks like this
    ("MIXED+DRAIN", False, True), ("DOWN+NOT_RESPONDING", False, True),
    ("DOWN", False, True), ("IDLE+NOT_RESPONDING", False, False), ("IDLE+FAIL", False, True),
])
def test_node_states_slurm_places_jobs_on(state: str, usable: bool, held: bool) -> None:
    from hpctrain.devcluster.cluster import node_held, node_usable

    assert (node_usable(state), node_held(state)) == (usable, held)


def test_the_host_image_binds_where_the_python_and_project_live() -> None:
    # CI clones the project to /check/work/main: its venv must be in the container too
    present = {"/usr", "/etc", "/work", "/tmp", "/check", "/var/lib/hpctrain", "/opt"}
    binds = ociconf.image_binds(
        ["/check/work/main/.venv", "/usr/local", "/check/work/main/.venv/bin/python3.11",
         "/var/lib/hpctrain/x/venv", "/opt/py/bin/python"], exists=present.__contains__)
    assert binds == ["/usr", "/etc", "/opt", "/work", "/tmp", "/var/lib/hpctrain", "/check"]
    # the pseudo file systems and /var (which holds the image itself) are never bound whole
    assert ociconf.image_binds(["/proc/1", "/var/cache/x", "/"], exists=lambda d: True) \
        == list(ociconf.HOST_IMAGE_BINDS)


def test_sshd_config_is_loopback_and_keys_only() -> None:
    from hpctrain.devcluster.sshconf import ssh_client_config, sshd_config

    text = sshd_config(Path("/var/lib/x/ssh"), 2222, ["hpct-alice", "bob"])
    lines = set(text.splitlines())
    assert {"Port 2222", "ListenAddress 127.0.0.1", "PasswordAuthentication no",
            "KbdInteractiveAuthentication no", "PermitRootLogin no",
            "AllowUsers hpct-alice bob", "AuthorizedKeysFile /var/lib/x/ssh/authorized_keys/%u",
            "HostKey /var/lib/x/ssh/host_ed25519_key"} <= lines
    assert not any(ln.startswith("ListenAddress") and "127.0.0.1" not in ln for ln in lines)
    client = ssh_client_config(2222, "hpct-alice", "/h/.ssh/k", "/h/.ssh/k.known_hosts")
    assert "Host hpctrain-devcluster\n" in client and "  StrictHostKeyChecking yes" in client


def test_sshd_config_listens_on_loopback_only_with_its_port_and_no_passwords() -> None:
    lines = sshconf.sshd_config(Path("/s/ssh"), 2299, ["hpct-alice"]).splitlines()
    listen = [ln for ln in lines if ln.startswith(("ListenAddress", "Port"))]
    assert listen == ["Port 2299", "ListenAddress 127.0.0.1"]
    settings = dict(ln.split(" ", 1) for ln in lines if ln and not ln.startswith("#"))
    assert settings["AuthenticationMethods"] == "publickey"
    assert {k: settings[k] for k in ("PasswordAuthentication", "KbdInteractiveAuthentication",
                                     "PermitEmptyPasswords", "PermitRootLogin")} == \
        dict.fromkeys(("PasswordAuthentication", "KbdInteractiveAuthentication",
                       "PermitEmptyPasswords", "PermitRootLogin"), "no")
    assert settings["AllowUsers"] == "hpct-alice" and settings["StrictModes"] == "yes"
    assert settings["PidFile"] == "/s/ssh/sshd.pid" and settings["UsePAM"] == "no"
    assert settings["MaxStartups"] == "64:30:128" and settings["MaxSessions"] == "64"
    # -L only (the warm server's socket forward); nothing listens on the cluster's side
    assert settings["AllowTcpForwarding"] == settings["AllowStreamLocalForwarding"] == "local"
    assert settings["X11Forwarding"] == settings["AllowAgentForwarding"] == "no"
    assert sshconf.sshd_settings("\n".join(lines)) == {"port": 2299, "users": ["hpct-alice"]}


@pytest.mark.parametrize("port, users, named", [
    (0, ["hpct-alice"], "--ssh-port 0"), (70000, ["hpct-alice"], "--ssh-port 70000"),
    (2222, [], "--ssh-user NAME"), (2222, ["hpct-alice", "root"], "--ssh-user root"),
    (2222, ["alice bob"], "'alice bob'"),
    (2222, ["x\nPermitRootLogin yes"], "PermitRootLogin yes"),  # no smuggled config line
])
def test_sshd_config_refuses_a_bad_port_or_user_by_name(port: int, users: list[str],
                                                        named: str) -> None:
    with pytest.raises(DevclusterError, match=named.replace("\n", "\\n")):
        sshconf.sshd_config(Path("/s/ssh"), port, users)


def test_ssh_client_files_name_the_alias_port_and_host_key() -> None:
    known = sshconf.ssh_known_hosts(2299, "ssh-ed25519 AAAAkey hpctrain-devcluster\n")
    assert known == ("[127.0.0.1]:2299 ssh-ed25519 AAAAkey\n"
                     "[hpctrain-devcluster]:2299 ssh-ed25519 AAAAkey\n")
    block = sshconf.ssh_client_config(2299, "bob", "/h/.ssh/k", "/h/.ssh/k.known_hosts")
    assert {"  Port 2299", "  User bob", "  IdentitiesOnly yes", "  BatchMode yes",
            "  UserKnownHostsFile /h/.ssh/k.known_hosts"} <= set(block.splitlines())


def test_ssh_packages_are_checked_only_when_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    from hpctrain.devcluster.sshd import SSH_PACKAGES

    monkeypatch.setitem(packages.BINARIES, "openssh-server", "/nonexistent/sshd")
    assert "openssh-server" not in packages.missing_packages()   # plain `up`
    assert "openssh-server" in packages.missing_packages(packages.PACKAGES + SSH_PACKAGES)
    with pytest.raises(DevclusterError, match="apt-get install -y .*openssh-server"):
        packages.ensure_packages(install=False, extra=SSH_PACKAGES)


def test_the_instance_comes_from_the_environment_and_picks_dir_and_ports() -> None:
    from hpctrain.devcluster.cluster import DevCluster, instance_from_env

    assert instance_from_env({}) == 0
    assert instance_from_env({"HPCTRAIN_DEVCLUSTER_INSTANCE": "2"}) == 2
    with pytest.raises(DevclusterError, match="HPCTRAIN_DEVCLUSTER_INSTANCE='gw1'.*0..7"):
        instance_from_env({"HPCTRAIN_DEVCLUSTER_INSTANCE": "gw1"})
    dev = DevCluster(instance=2)
    assert str(dev.paths.root).endswith("/devcluster-2") and dev.ports == Ports.for_instance(2)
