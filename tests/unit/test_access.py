"""Who may read what hpctrain writes (hpctrain.access) and what it refuses to reuse; the
secrets passed through by name; the devcluster's loopback-only daemons. Pure logic and
local files; the same cases as two real users on the cluster: tests/cluster/test_users_cluster.py."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from hpctrain import access
from hpctrain.checkpoint import unpickle
from hpctrain.devcluster import config
from hpctrain.errors import AccessError, CheckpointError, SpecError
from hpctrain.jobs.executor import prepare_folder
from hpctrain.jobs.submit import check_passthrough
from hpctrain.render.script import render_script
from hpctrain.spec.model import JobSpec
from helpers import admin


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_levels_and_their_modes() -> None:
    assert access.modes("private") == access.Modes(0o700, 0o600, 0o077)
    assert access.modes("group") == access.Modes(0o750, 0o640, 0o027)
    with pytest.raises(ValueError, match="access='world' is not an access level"):
        access.modes("world")


def test_new_folders_get_the_mode_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        assert access.own_dir(tmp_path / "a" / "b", 0o700) is None
    finally:
        os.umask(old)
    assert _mode(tmp_path / "a") == _mode(tmp_path / "a" / "b") == 0o700
    (tmp_path / "a").chmod(0o750)  # the user's own choice is kept
    assert access.own_dir(tmp_path / "a", 0o700) is None and _mode(tmp_path / "a") == 0o750


def test_what_is_refused(tmp_path: Path) -> None:
    opened = tmp_path / "opened"
    opened.mkdir()
    opened.chmod(0o777)
    assert "every user may write in it (mode 777)" in access.own_dir(opened, 0o700)
    opened.chmod(0o1777)  # sticky, like /tmp: nobody swaps another's entries
    assert access.own_dir(opened, 0o700) is None
    afile = tmp_path / "file"
    afile.write_text("")
    assert access.own_dir(afile, 0o700) == "it is not a directory"
    own_link = tmp_path / "link"
    own_link.symlink_to(opened)  # the user's own link: its target is judged
    assert access.own_dir(own_link, 0o700) is None


def test_another_users_folder_or_symlink_is_refused_naming_the_owner(tmp_path: Path) -> None:
    admin.require_sudo()
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    admin.chown(theirs, 65534)
    why = access.own_dir(theirs, 0o700)
    me = access.owner_name(os.geteuid())
    assert why == f"it is owned by nobody (uid 65534), not by you ({me})"
    link = tmp_path / "planted"
    link.symlink_to(tmp_path)
    admin.chown(link, 65534, follow=False)
    assert "is a symlink (to " in access.own_dir(link, 0o700) and "made by nobody" in \
        access.own_dir(link, 0o700)
    with pytest.raises(AccessError, match=rf"not using job folder {theirs}: it is owned by "
                                          r"nobody .*HPCTRAIN_JOBS_DIR"):
        prepare_folder(theirs / "job", 0o700)  # its parent, the jobs root, is checked
    assert not (theirs / "job").exists()  # nothing made inside


def test_passthrough_needs_the_variable_and_never_renders_its_value() -> None:
    spec = JobSpec.from_dict({"name": "p", "partition": "debug",
                              "run": {"command": ["python", "t.py"],
                                      "env_passthrough": ["WANDB_API_KEY", "HF_TOKEN"]}})
    with pytest.raises(SpecError, match="names HF_TOKEN, which is not set here: export "
                                        "HF_TOKEN=... in the shell you submit from"):
        check_passthrough(spec, {"WANDB_API_KEY": "x"})
    check_passthrough(spec, {"WANDB_API_KEY": "x", "HF_TOKEN": "y"})
    os.environ["WANDB_API_KEY"] = "value-that-must-not-appear"
    try:
        script = render_script(spec)
    finally:
        del os.environ["WANDB_API_KEY"]
    assert "value-that-must-not-appear" not in script
    assert "if [[ ! -v WANDB_API_KEY ]]; then" in script and "umask 077" in script
    group = JobSpec.from_dict({"name": "p", "partition": "debug",
                               "run": {"command": ["x"], "access": "group"},
                               "checkpoint": {"access": "group"}})
    text = render_script(group)
    assert "umask 027" in text and "export HPCTRAIN_CKPT_ACCESS=group" in text


@pytest.mark.parametrize("module, name, ok", [
    ("builtins", "set", True), ("collections", "OrderedDict", True),
    ("numpy", "dtype", True), ("numpy.dtypes", "Float32DType", True),
    ("numpy.random._pickle", "__randomstate_ctor", True), ("torch", "float16", True),
    ("torch._utils", "_rebuild_tensor_v2", True),
    ("builtins", "eval", False), ("builtins", "getattr", False), ("os", "system", False),
    ("subprocess", "Popen", False), ("torch", "load", False), ("numpy", "load", False),
])
def test_the_unpickler_allowlist(module: str, name: str, ok: bool) -> None:
    assert unpickle.allowed(module, name) is ok


def test_the_safe_unpickler_refuses_code_by_name() -> None:
    import pickle

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    with pytest.raises(CheckpointError, match=r"extras\.pkl holds a pickled posix\.system"):
        unpickle.loads(pickle.dumps(Evil()), "extras.pkl")
    assert unpickle.loads(pickle.dumps({"a": [1, (2, 3)], "b": {4}}), "x") == \
        {"a": [1, (2, 3)], "b": {4}}


def test_devcluster_daemons_bind_loopback_only_when_the_host_name_is_loopback() -> None:
    assert config.comm_params(True) == "CommunicationParameters=NoInAddrAny,NoCtldInAddrAny"
    assert config.comm_params(True, ctld=False) == "CommunicationParameters=NoInAddrAny"
    assert config.comm_params(False).startswith("#")  # never bind the daemons onto the network
    paths = config.Paths(Path("/s"))
    assert paths.munge_socket.parent != paths.munge_key.parent  # the key's dir stays 0700
