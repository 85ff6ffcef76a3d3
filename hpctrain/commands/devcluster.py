"""``hpctrain devcluster up|status|slow|down``: the local SLURM cluster from the command line."""

from __future__ import annotations

import json
import os

import click

from hpctrain.commands.options import json_option
from hpctrain.devcluster import strict
from hpctrain.devcluster.cluster import DevCluster
from hpctrain.devcluster.config import MAX_INSTANCES, SITES, Shape
from hpctrain.devcluster.sshconf import SSH_PORT

state_dir_option = click.option(
    "--state-dir", type=click.Path(file_okay=False), default=None,
    help="Where configs, logs, databases and shared storage live "
         "[default: $HPCTRAIN_DEVCLUSTER_DIR or /var/lib/hpctrain/devcluster, -N for "
         "instance N].")
instance_option = click.option(
    "--instance", type=click.IntRange(0, MAX_INSTANCES - 1), default=None, metavar="N",
    help="Which of several independent devclusters on this machine (own daemons, ports, "
         "job ids; the parallel test suite runs one per worker) [default: "
         "$HPCTRAIN_DEVCLUSTER_INSTANCE or 0].")


def _cluster(state_dir: str | None, instance: int | None) -> DevCluster:
    return DevCluster(state_dir, instance=instance)


@click.group()
def devcluster() -> None:
    """A real multi-node SLURM cluster on this machine (emulated nodes, fake GPUs)."""


@devcluster.command()
@click.option("--nodes", default=Shape.nodes, show_default=True, help="Emulated nodes.")
@click.option("--gpus-per-node", default=Shape.gpus_per_node, show_default=True,
              help="Fake GPUs (real GRES) per node.")
@click.option("--cpus-per-node", type=int, default=None,
              help=f"CPUs each node declares (may exceed this machine's, but not on a strict "
                   f"site with cgroups) [default: {Shape.cpus_per_node}; strict: "
                   f"{Shape.cpus_per_node} or this machine's CPUs, the fewer].")
@click.option("--spare", default=Shape.spare, show_default=True,
              help="Extra nodes only partition `wide` has (room to exclude a bad node).")
@click.option("--site", type=click.Choice(SITES), default=Shape.site, show_default=True,
              help="How it counts: lenient (CPUs only) or strict, like a real site (CPUs and "
                   "memory per job, DefMemPerCPU, steps over their memory killed, a partition "
                   "`gpu` no facts file describes).")
@click.option("--ssh", is_flag=True,
              help="Also start an SSH login on 127.0.0.1 (keys only) for --ssh-user, to try "
                   "`hpctrain --host hpctrain-devcluster`; on a cluster that is up, only that.")
@click.option("--ssh-port", type=click.IntRange(1, 65535), default=None, metavar="PORT",
              help=f"Its port (with --ssh) [default: {SSH_PORT}].")
@click.option("--ssh-user", "ssh_users", multiple=True, metavar="USER",
              help="Who may log in (with --ssh; repeatable; added to those set up before) "
                   "[default: $SUDO_USER].")
@state_dir_option
@instance_option
def up(nodes: int, gpus_per_node: int, cpus_per_node: int | None, spare: int, site: str,
       ssh: bool, ssh_port: int | None, ssh_users: tuple[str, ...], state_dir: str | None,
       instance: int | None) -> None:
    """Install (as root), configure and start the cluster; when already up, only resume
    nodes an earlier run left DOWN or DRAIN. With --ssh, also its SSH login."""
    if not ssh and (ssh_port is not None or ssh_users):
        raise click.UsageError("--ssh-port and --ssh-user go with --ssh "
                               "(`hpctrain devcluster up --ssh --ssh-user NAME`)")
    dev = _cluster(state_dir, instance)
    # `up --ssh` on a cluster that is up adds the login; it does not reshape it to defaults
    current = dev.shape() if ssh and not _shape_given() else None
    if cpus_per_node is None:   # a strict site's node cannot bind CPUs the machine lacks
        cpus_per_node = strict.default_cpus(Shape.cpus_per_node, os.cpu_count() or 1) \
            if site == "strict" else Shape.cpus_per_node
    shape = current or Shape(nodes=nodes, gpus_per_node=gpus_per_node,
                             cpus_per_node=cpus_per_node, spare=spare, site=site)
    result = dev.up(shape)
    named = f" (instance {dev.instance})" if dev.instance else ""
    click.echo(f"devcluster{named} {result.outcome}: {shape.nodes} nodes x "
               f"{shape.gpus_per_node} GPUs "
               f"(+{shape.spare} spare), partitions debug (default), urgent and wide "
               "(all nodes)" + (", gpu (no facts file); strict: CPUs and memory counted "
                                "per job" if shape.site == "strict" else ""))
    if shape.site == "strict":
        click.echo(f"  limits:         {strict.limits(shape.site, strict.host_missing())}")
    for note in result.resumed:
        click.echo(f"  resumed node {note}")
    click.echo(f"  Slurm config:   {dev.paths.slurm_conf}  (export SLURM_CONF={dev.paths.slurm_conf}"
               " if /etc/slurm/slurm.conf is not ours)")
    click.echo(f"  shared storage: {dev.shared_dir}")
    if ssh:
        for note in dev.up_ssh(SSH_PORT if ssh_port is None else ssh_port,
                               list(ssh_users) or _sudo_user()):
            click.echo(f"  {note}")


def _shape_given() -> bool:
    """Whether the command line named any of the cluster's shape options."""
    ctx = click.get_current_context()
    return any(ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE
               for name in ("nodes", "gpus_per_node", "cpus_per_node", "spare", "site"))


def _sudo_user() -> list[str]:
    """The user who ran `sudo hpctrain devcluster up --ssh` (not root), if any."""
    name = os.environ.get("SUDO_USER", "")
    return [name] if name not in ("", "root") else []


@devcluster.command()
@json_option
@state_dir_option
@instance_option
def status(as_json: bool, state_dir: str | None, instance: int | None) -> int:
    """Nodes, states, GRES, partitions and whether each daemon is alive."""
    info = _cluster(state_dir, instance).status()
    if as_json:
        click.echo(json.dumps(info, indent=2))
    else:
        click.echo(_format_status(info))
    up_ = info["daemons"] and all(d["alive"] for d in info["daemons"])
    return 0 if up_ else 1


def _format_status(info: dict) -> str:
    if info["shape"] is None:
        return f"devcluster: never brought up (state dir {info['state_dir']})"
    lines = [f"state dir: {info['state_dir']}", f"config:    {info['slurm_conf']}",
             f"shared:    {info['shared_dir']}", f"limits:    {info['limits']}", "daemons:"]
    lines += [f"  {d['name']:<12} {'alive pid ' + str(d['pid']) if d['alive'] else 'DOWN'}"
              for d in info["daemons"]]
    if info.get("ssh"):
        ssh = info["ssh"]
        lines.insert(4, f"ssh:       127.0.0.1:{ssh['port']} (`ssh {ssh['alias']}`), users "
                        f"{' '.join(ssh['users'])}")
    if info["nodes"]:
        lines.append("nodes:")
        lines += [f"  {n['name']:<4} {n['state']:<12} gres={n['gres']} cpus={n['cpus']} "
                  f"partitions={n['partitions']}" for n in info["nodes"]]
        lines.append("partitions:")
        lines += [f"  {p['name']:<8}{'*' if p['default'] else ' '} nodes={p['nodes']} "
                  f"priority_tier={p['priority_tier']} preempt_mode={p['preempt_mode']} "
                  f"grace_time={p['grace_time']}" for p in info["partitions"]]
    else:
        lines.append("nodes: (slurmctld is not running)")
    return "\n".join(lines)


@devcluster.command()
@click.argument("node")
@click.option("--cpus", type=float, default=None, metavar="CPUS",
              help="The CPU time the node's processes may use together, in CPUs (0.5: half "
                   "of one): the node's slurmd, every job process on it, and what they start.")
@click.option("--off", is_flag=True, help="The node at full speed again.")
@state_dir_option
@instance_option
def slow(node: str, cpus: float | None, off: bool, state_dir: str | None,
         instance: int | None) -> None:
    """Make emulated NODE slow for real (its processes held to --cpus through the cgroup v1
    CPU controller; as root), or --off. Slowed before a job, the node is slow from its
    first step; while a job runs, its ranks there slow down at once (docs/devcluster.md)."""
    if off == (cpus is not None):
        raise click.UsageError("give --cpus CPUS to slow the node, or --off to restore it")
    cluster = _cluster(state_dir, instance)
    if off:
        moved = cluster.restore_node(node)
        click.echo(f"{node}: full speed ({moved} process(es) moved back)" if moved
                   else f"{node} was not slow")
        return
    assert cpus is not None
    moved = cluster.slow_node(node, cpus)
    click.echo(f"{node}: held to {cpus:g} CPU(s) ({moved} process(es) now, and what they "
               f"start); `hpctrain devcluster slow {node} --off` restores it")


@devcluster.command()
@state_dir_option
@instance_option
def down(state_dir: str | None, instance: int | None) -> None:
    """Stop exactly the daemons `up` started (by their pid files), nothing else."""
    stopped = _cluster(state_dir, instance).down()
    click.echo("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))
