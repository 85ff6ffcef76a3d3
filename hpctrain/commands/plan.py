"""``hpctrain plan``: will it fit? Memory and layout planner, optionally writing a job spec."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import click

from hpctrain.commands.options import json_option
from hpctrain.errors import PlanError
from hpctrain.planner import Hardware, Recommendation, Request, Workload, recommend, resolve_arch
from hpctrain.planner.memory import MODES
from hpctrain.planner.scaling import INTER_NODE, INTRA_NODE, curve_for
from hpctrain.planner.sizes import parse_count, parse_gb
from hpctrain.spec.partitions import Partition


def _hardware(partition: str | None, gpus_per_node: int | None, gpu_mem: str | None,
              gpu_tflops: float | None, intra: str | None, inter: str | None,
              templates: tuple[str, ...]) -> tuple[Hardware, Partition | None]:
    """The GPU facts: a partition's, or the ones given on the command line."""
    if partition is not None:
        if any(v is not None for v in (gpus_per_node, gpu_mem, intra, inter)):
            raise PlanError("give --partition NAME or --gpus-per-node N --gpu-mem SIZE "
                            "[--intra-node-link, --inter-node-link], not both: the partition's "
                            "facts already say what a node has")
        from hpctrain.jobs.facts import site
        from hpctrain.spec.site import template_dirs
        part = site(template_dirs(templates)).partition(partition)
        if part.gpus_per_node < 1 or part.gpu_mem_gb <= 0:
            raise PlanError(f"partition {part.name!r} has gpus_per_node={part.gpus_per_node}, "
                            f"gpu_mem_gb={part.gpu_mem_gb}: plan for a GPU partition (or fix "
                            f"{part.source})")
        curve = curve_for(part.intra_node_link, part.inter_node_link, part.scaling)
        return Hardware(part.gpus_per_node, part.gpu_mem_gb, gpu_tflops or part.gpu_peak_tflops,
                        curve, part.max_nodes, part.name), part
    if gpus_per_node is None or gpu_mem is None:
        raise PlanError("say what the GPUs are: --partition NAME (see `hpctrain templates "
                        "list`) or --gpus-per-node N --gpu-mem SIZE (e.g. 8 and 80GB)")
    if gpus_per_node < 1:
        raise PlanError(f"--gpus-per-node={gpus_per_node} must be >= 1")
    return Hardware(gpus_per_node, parse_gb(gpu_mem), gpu_tflops or 312.0,
                    curve_for(intra or "nvlink", inter or "infiniband", {})), None


@click.command()
@click.option("--params", required=True, help="Model size, e.g. 7B, 350M, 1.5T.")
@click.option("--mode", type=click.Choice(MODES), default="train", show_default=True)
@click.option("--partition", help="Partition whose facts to plan for.")
@click.option("--gpus-per-node", type=int, help="Instead of --partition: GPUs per node.")
@click.option("--gpu-mem", help="Instead of --partition: memory per GPU, e.g. 80GB, 80GiB.")
@click.option("--gpu-tflops", type=float,
              help="Peak dense bf16 TFLOPS per GPU [default: the partition's, else 312].")
@click.option("--intra-node-link", type=click.Choice(sorted(INTRA_NODE)),
              help="With --gpus-per-node: link between a node's GPUs [default: nvlink].")
@click.option("--inter-node-link", type=click.Choice(sorted(INTER_NODE)),
              help="With --gpus-per-node: network between nodes [default: infiniband].")
@click.option("--nodes", type=int, help="Plan for exactly N nodes.")
@click.option("--max-nodes", type=int,
              help="Plan for up to N nodes [default: the partition's max_nodes, else 64].")
@click.option("--seq-len", type=int, default=2048, show_default=True)
@click.option("--micro-batch", type=int, default=1, show_default=True)
@click.option("--layers", type=int, help="Transformer layers [default: assumed from --params].")
@click.option("--hidden", type=int, help="Hidden size [default: assumed from --params].")
@click.option("--heads", type=int, help="Attention heads [default: assumed from --params].")
@click.option("--zero", type=int, help="Pin the ZeRO stage 0-3 [default: best per layout].")
@click.option("--recompute", type=click.Choice(["auto", "none", "selective", "full"]),
              default="auto", show_default=True, help="Activation recomputation.")
@click.option("--adapter-fraction", type=float, default=0.01, show_default=True,
              help="LoRA/QLoRA: trainable adapter params as a fraction of all params.")
@click.option("--tokens", help="Tokens to train on, e.g. 1T, for GPU-hours and cost.")
@click.option("--price-per-gpu-hour", type=float, help="Price of one GPU-hour, for cost.")
@click.option("--mfu", type=float, default=0.40, show_default=True,
              help="Model-FLOPs utilisation assumed for GPU-hours.")
@json_option
@click.option("--all", "show_all", is_flag=True, help="List every candidate layout.")
@click.option("--write-spec", type=click.Path(dir_okay=False),
              help="Write a job spec for the recommended layout (needs --partition).")
@click.option("--force", is_flag=True, help="Overwrite the --write-spec file if it exists.")
@click.option("--name", help="Job name in the spec [default: MODE-SIZE, e.g. train-7b].")
@click.option("--time", help="Time limit in the spec [default: the partition's max_time].")
@click.option("--command", "command",
              help='Training command in the spec [default: "python train.py"].')
@click.option("--checkpoint-dir", help="Absolute checkpoint directory in the spec.")
@click.option("--templates", multiple=True, type=click.Path(file_okay=False),
              help="Site template directory (partition facts), before the built-in ones.")
def plan(params: str, mode: str, partition: str | None, gpus_per_node: int | None,
         gpu_mem: str | None, gpu_tflops: float | None, intra_node_link: str | None,
         inter_node_link: str | None, nodes: int | None, max_nodes: int | None, seq_len: int,
         micro_batch: int, layers: int | None, hidden: int | None, heads: int | None,
         zero: int | None, recompute: str, adapter_fraction: float, tokens: str | None,
         price_per_gpu_hour: float | None, mfu: float, as_json: bool, show_all: bool,
         write_spec: str | None, force: bool, name: str | None, time: str | None,
         command: str | None, checkpoint_dir: str | None, templates: tuple[str, ...]) -> None:
    """Will it fit? Per-GPU memory, candidate layouts, a recommendation and its cost.

    Memory is in SI GB (1 GB = 1e9 bytes). See docs/will-it-fit.md.
    """
    if write_spec is not None and partition is None:
        raise PlanError("--write-spec needs --partition NAME: a job spec names the partition "
                        "it runs on")
    if write_spec is not None and Path(write_spec).exists() and not force:
        raise PlanError(f"--write-spec {write_spec!r} exists: pass --force to overwrite it or "
                        "choose another file")
    if gpu_tflops is not None and gpu_tflops <= 0:
        raise PlanError(f"--gpu-tflops={gpu_tflops} must be > 0, e.g. 312 for an A100 (bf16)")
    if write_spec is not None and not Path(write_spec).parent.is_dir():
        raise PlanError(f"--write-spec {write_spec!r}: directory {str(Path(write_spec).parent)!r} "
                        "does not exist: create it first")
    hw, part = _hardware(partition, gpus_per_node, gpu_mem, gpu_tflops, intra_node_link,
                         inter_node_link, templates)
    # a model the planner can reason about: 1M to 100T parameters (a larger count is a
    # typo, and would make the layout search run for minutes)
    size = parse_count(params, "--params", within=(1e6, 1e14))
    workload = Workload(size, mode, seq_len, micro_batch, resolve_arch(size, layers, hidden, heads),
                        adapter_fraction)
    request = Request(workload, nodes, max_nodes, zero, None if recompute == "auto" else recompute,
                      None if tokens is None else parse_count(tokens, "--tokens"),
                      price_per_gpu_hour, mfu)
    result = recommend(request, hw)

    from hpctrain.planner import report
    from hpctrain.planner.specfile import requests_for
    written, requests = None, None
    if part is not None:
        # the recommended job as a spec: what it asks Slurm for (checked as `render`
        # checks it), and the file --write-spec writes
        spec = _spec(result, part, name, time, command, checkpoint_dir)
        requests = requests_for(spec, part)
        if write_spec is not None:
            written = _write_spec(result, spec, write_spec)
    if as_json:
        out = report.to_dict(result, show_all)
        out["requests"] = None if requests is None else {
            "launcher": spec["run"]["launcher"], **requests.to_json()}
        out["spec_written"] = written
        click.echo(json.dumps(out, indent=2))
    else:
        click.echo(report.to_text(result, show_all))
        if requests is not None:
            click.echo(f"\nunder {spec['run']['launcher']} on partition {part.name}, the job "
                       f"{requests.describe()}")
        if written:
            click.echo(f"\nwrote job spec {written}; render it with: hpctrain render {written}")


def _spec(result: Recommendation, part: Partition, name: str | None, time: str | None,
          command: str | None, checkpoint_dir: str | None) -> dict[str, Any]:
    """The recommended job as a spec dict on ``part`` (the time: given, else the
    partition's limit)."""
    from hpctrain.planner.specfile import DEFAULT_TIME, spec_dict
    limit = time or (part.max_time if part.max_time != "UNLIMITED" else DEFAULT_TIME)
    return spec_dict(result, partition=part.name, name=name, time=limit,
                     command=shlex.split(command) if command else None,
                     checkpoint_dir=checkpoint_dir)


def _write_spec(result: Recommendation, spec: dict[str, Any], path: str) -> str:
    """Write ``spec`` (checked by :func:`requests_for` as `render` will); returns the path."""
    from hpctrain.commands.options import write_atomically
    from hpctrain.planner.specfile import spec_toml
    write_atomically(Path(path), spec_toml(result, spec))
    return path
