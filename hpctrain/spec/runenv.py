"""The [run] table's environment and the access levels: variable names and values,
secrets passed through by name, who may read what the job writes. Pure checks; each
error names the key and the fix."""

from __future__ import annotations

from typing import Any, Mapping

from hpctrain.access import ACCESS_LEVELS
from hpctrain.errors import SpecError
from hpctrain.spec.checks import ENV_KEY_RE, check_text

# Variables the rendered script sets itself; run.env must not fight them.
RESERVED_ENV_PREFIXES = ("HPCTRAIN_", "SLURM_")
RESERVED_ENV = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE",
                "LOCAL_WORLD_SIZE", "PATH")


def passthrough_names(names: tuple[str, ...], env: Mapping[str, str]) -> tuple[str, ...]:
    """``run.env_passthrough``: variable names (checked like env's), none also in env."""
    for i, name in enumerate(names):
        env_key(name, f"run.env_passthrough[{i}]")
        if name in env:
            raise SpecError(f"run.env_passthrough[{i}]: {name} is also set in run.env; keep "
                            "one: a secret belongs in env_passthrough only (its value then "
                            "never lands in the script)")
    if len(set(names)) != len(names):
        raise SpecError(f"run.env_passthrough={list(names)!r} names a variable twice")
    return names


def access_level(value: Any, where: str) -> str:
    """``[run] access`` / ``[checkpoint] access``: who may read (hpctrain.access)."""
    if value not in ACCESS_LEVELS:
        raise SpecError(f"{where}={value!r} is not an access mode: use \"private\" (only you, "
                        "the default) or \"group\" (your group may read, never write)")
    return value


def env_key(key: Any, where: str | None = None) -> str:
    """A ``run.env`` (or passthrough) name: a shell variable the script does not set."""
    where = where or f"run.env.{key}"
    if not isinstance(key, str) or not ENV_KEY_RE.match(key):
        raise SpecError(f"{where}: {key!r} is not a shell variable name: use letters, "
                        "digits and _, not starting with a digit")
    if key in RESERVED_ENV or key.startswith(RESERVED_ENV_PREFIXES):
        raise SpecError(f"{where}: the rendered script sets {key} itself; pick another "
                        "name (HPCTRAIN_*, SLURM_* and the launcher's variables are reserved)")
    return key


def env_value(key: str, value: Any) -> str:
    """A ``run.env`` value: text or a number, as text."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise SpecError(f"run.env.{key}={value!r} must be a string or a number")
    return check_text(str(value), f"run.env.{key}", newlines=True)
