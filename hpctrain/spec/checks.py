"""Small pure checks shared by the job spec and the renderer.

Each check either returns a normalised value or raises :class:`SpecError` with a
message that names the value and the fix. Nothing here reads the environment or
runs anything.
"""

from __future__ import annotations

import re
from dataclasses import fields
from typing import Any, Iterable, Mapping

from hpctrain.errors import SpecError

# Job, partition, account, QoS and reservation names: what Slurm sites use in practice.
# Kept strict because these land in #SBATCH lines and file names, where quoting is
# not available.
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,127}$")
# A value that can stand unquoted on an #SBATCH line: sbatch splits those lines on
# whitespace and bash must see them as a plain comment (no newline, no quotes).
# Covers node lists (n[1-4]), feature expressions (a100&ib|h100), paths, %j patterns.
DIRECTIVE_VALUE_RE = re.compile(r"^[A-Za-z0-9_@%+=:,./\[\]&|!*^-]+$")
ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MAIL_RE = re.compile(r"^[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+$")
MAIL_TYPES = ("NONE", "BEGIN", "END", "FAIL", "REQUEUE", "ALL", "INVALID_DEPEND",
              "STAGE_OUT", "TIME_LIMIT", "TIME_LIMIT_90", "TIME_LIMIT_80", "TIME_LIMIT_50",
              "ARRAY_TASKS")

# Signals a job may ask Slurm to deliver before its time limit (--signal=B:SIG@lead).
# Signals a job may name as its time-limit warning (requeue.signal). Not CONT: Slurm sends
# SIGCONT with every SIGTERM (preemption, scancel), so it cannot mean "time is nearly up".
SIGNALS = ("USR1", "USR2", "TERM", "INT", "HUP", "QUIT", "ALRM", "URG")

# Long sbatch options a spec may pass through its [sbatch] table (sbatch(1), 22.05).
# Options the spec sets from its own fields are not here: they map to those fields.
EXTRA_SBATCH_OPTIONS = frozenset({
    "acctg-freq", "batch", "bb", "begin", "cluster-constraint", "clusters", "comment",
    "contiguous", "core-spec", "cores-per-socket", "cpu-freq", "cpus-per-gpu",
    "deadline", "delay-boot", "dependency",
    "export", "export-file", "extra-node-info", "get-user-env",
    "gid", "gpu-bind", "gpu-freq", "gpus", "gpus-per-socket", "gpus-per-task",
    "hint", "hold", "ignore-pbs", "licenses", "mcs-label", "mem-bind",
    "mem-per-cpu", "mincpus", "network", "nice", "no-kill", "nodefile",
    "nodelist",
    "ntasks-per-core", "ntasks-per-gpu", "ntasks-per-socket", "overcommit",
    "oversubscribe", "power", "priority", "profile", "propagate", "sockets-per-node",
    "spread-job", "switches", "thread-spec", "threads-per-core", "time-min",
    "tmp", "uid", "use-min-nodes", "wckey", "wait-all-nodes",
})
# sbatch options the spec owns: passing them through [sbatch] would fight the spec.
OWNED_SBATCH_OPTIONS = {
    "job-name": "name", "partition": "partition", "nodes": "nodes", "time": "time",
    "account": "account", "qos": "qos", "constraint": "constraint",
    "exclude": "exclude", "reservation": "reservation", "mail-user": "mail",
    "mail-type": "mail_type", "output": "output", "error": "output",
    "chdir": "workdir", "gpus-per-node": "gpus_per_node", "gres": "gpus_per_node",
    "ntasks": "run.launcher", "ntasks-per-node": "run.launcher",
    "requeue": "requeue.max_requeues", "no-requeue": "requeue.max_requeues",
    "signal": "requeue.signal", "open-mode": "(always append)",
    "cpus-per-task": "resources.cpus_per_task", "mem": "resources.mem_per_node_gb",
    "mem-per-gpu": "resources.mem_per_gpu_gb", "exclusive": "resources.exclusive",
    "distribution": "(always block: a tensor-parallel group stays inside a node)",
}

_TIME_FORMS = (
    # (regex, field names) for every form sbatch --time accepts
    (re.compile(r"^(\d+)$"), ("m",)),
    (re.compile(r"^(\d+):(\d+)$"), ("m", "s")),
    (re.compile(r"^(\d+):(\d+):(\d+)$"), ("h", "m", "s")),
    (re.compile(r"^(\d+)-(\d+)$"), ("d", "h")),
    (re.compile(r"^(\d+)-(\d+):(\d+)$"), ("d", "h", "m")),
    (re.compile(r"^(\d+)-(\d+):(\d+):(\d+)$"), ("d", "h", "m", "s")),
)
UNLIMITED = ("UNLIMITED", "INFINITE")
_UNIT_S = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_LIMIT = {"h": 24, "m": 60, "s": 60}


def check_int(value: Any, where: str, minimum: int, maximum: int | None = None) -> int:
    """A whole number within ``minimum``..``maximum``; SpecError naming ``where`` and the
    fix otherwise (a bool is not a number here)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(f"{where}={value!r} must be a whole number "
                        f"(e.g. {where}={max(minimum, 1)})")
    if value < minimum or (maximum is not None and value > maximum):
        top = f"..{maximum}" if maximum is not None else " or more"
        raise SpecError(f"{where}={value} is out of range: use {minimum}{top}")
    return value


def check_opt_int(value: Any, where: str, minimum: int) -> int | None:
    return None if value is None else check_int(value, where, minimum)


def check_table(data: Any, where: str, cls: type) -> dict[str, Any]:
    """A TOML table for dataclass ``cls`` (``where`` names it, "" for the top level):
    unknown keys name the closest valid one; keys set to None are dropped."""
    if not isinstance(data, Mapping):
        raise SpecError(f"{where} must be a table ([{where}]), not {data!r}")
    known = [f.name for f in fields(cls)]
    for key in data:
        if key not in known:
            full = f"{where}.{key}" if where else str(key)
            raise SpecError(f"unknown key {full!r}{closest(str(key), known, where + '.' if where else '')}; valid keys"
                            f"{' in [' + where + ']' if where else ''}: {', '.join(known)}")
    return {k: v for k, v in data.items() if v is not None}


def closest(word: str, choices: Iterable[str], prefix: str = "") -> str:
    """' (did you mean X?)' for the closest choice, or '' when nothing is close."""
    import difflib  # only on an error: not on every spec load

    match = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.5)
    return f" (did you mean {prefix + match[0]!r}?)" if match else ""


def slurm_time_seconds(value: str, where: str = "time") -> int | None:
    """Seconds in a Slurm time string; None for UNLIMITED/INFINITE.

    Accepts every sbatch form: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S.
    """
    if not isinstance(value, str):
        raise SpecError(f"{where}={value!r} must be a string like \"00:30:00\" or \"1-00:00:00\"")
    if value.upper() in UNLIMITED:
        return None
    for regex, units in _TIME_FORMS:
        m = regex.match(value)
        if m:
            parts = dict(zip(units, (int(g) for g in m.groups())))
            # the leading unit is unbounded ("90:00", "48:00:00"); the others are not
            if any(parts[u] >= _LIMIT[u] for u in units[1:]):
                break
            seconds = sum(_UNIT_S[u] * n for u, n in parts.items())
            if seconds <= 0:
                raise SpecError(f"{where}={value!r} is zero: give a positive time limit")
            return seconds
    raise SpecError(f"{where}={value!r} is not a Slurm time: use minutes (\"30\"), "
                    "\"HH:MM:SS\", \"D-HH\", \"D-HH:MM\" or \"D-HH:MM:SS\"")


def check_name(value: object, where: str) -> str:
    """A Slurm-safe name (letters, digits, . _ + -), or SpecError."""
    if not isinstance(value, str) or not NAME_RE.match(value):
        raise SpecError(f"{where}={value!r} is not a valid name: use 1-128 letters, digits, "
                        "'.', '_', '+' or '-', starting with a letter or digit")
    return value


def check_directive_value(value: object, where: str) -> str:
    """A value that can stand unquoted on an #SBATCH line, or SpecError."""
    if not isinstance(value, str) or not DIRECTIVE_VALUE_RE.match(value):
        raise SpecError(f"{where}={value!r} cannot go on an #SBATCH line: use letters, "
                        "digits and _ @ % + = : , . / [ ] & | ! * ^ - only (no spaces, "
                        "quotes, $ or newlines)")
    return value


def check_text(value: object, where: str, *, newlines: bool = False) -> str:
    """A string that bash can hold once quoted: no NUL; no newline unless allowed."""
    if not isinstance(value, str):
        raise SpecError(f"{where}={value!r} must be a string")
    if "\0" in value:
        raise SpecError(f"{where}={value!r} contains a NUL byte, which a shell script "
                        "cannot carry: remove it")
    if not newlines and ("\n" in value or "\r" in value):
        raise SpecError(f"{where}={value!r} contains a line break: put it on one line")
    return value


def check_signal(value: object, where: str) -> str:
    """A signal name Slurm can deliver, normalised without 'SIG' (USR1, TERM, ...)."""
    name = value.upper().removeprefix("SIG") if isinstance(value, str) else value
    if name not in SIGNALS:
        raise SpecError(f"{where}={value!r} is not a signal hpctrain can trap: "
                        f"use one of {', '.join(SIGNALS)}" + closest(str(name), SIGNALS))
    return str(name)


def check_sbatch_option(option: object, value: object, where: str) -> tuple[str, str | None]:
    """An extra ``--option[=value]`` from the spec's [sbatch] table, checked."""
    if not isinstance(option, str):
        raise SpecError(f"{where}: option name {option!r} must be a string")
    key = option.removeprefix("--")
    owner = OWNED_SBATCH_OPTIONS.get(key)
    if owner is not None and owner.startswith("("):
        raise SpecError(f"{where}.{key}: hpctrain sets --{key} itself {owner}: remove it")
    if owner is not None:
        raise SpecError(f"{where}.{key}: the spec sets --{key} itself: use the field "
                        f"{owner!r} instead")
    if key not in EXTRA_SBATCH_OPTIONS:
        raise SpecError(f"{where}.{key}: --{key} is not an sbatch option hpctrain passes "
                        "through" + closest(key, EXTRA_SBATCH_OPTIONS))
    if value is True:
        return key, None          # a flag such as --contiguous
    if isinstance(value, bool) or value is None:
        raise SpecError(f"{where}.{key}={value!r}: use true for a flag, or a value")
    text = str(value) if isinstance(value, int) else value
    return key, check_directive_value(text, f"{where}.{key}")


def check_mail_type(value: Any) -> str:
    """``mail_type``: a comma list of Slurm mail types."""
    if not isinstance(value, str):
        raise SpecError(f"mail_type={value!r} must be a string such as \"END,FAIL\"")
    for part in value.split(","):
        if part not in MAIL_TYPES:
            raise SpecError(f"mail_type: {part!r} is not a Slurm mail type: use a comma list "
                            f"of {', '.join(MAIL_TYPES)}" + closest(part, MAIL_TYPES))
    return value
