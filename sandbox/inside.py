"""What every runtime shows inside a sandbox: where the tool server and its socket live, and
the minimal environment (shared by the bwrap, Singularity and local runtimes)."""
from __future__ import annotations

from pathlib import Path

import ptyprocess

from sandbox.spec import SandboxSpec

TOOLSERVER_DIR = str(Path(__file__).resolve().parent / "toolserver")
PTYPROCESS_DIR = str(Path(ptyprocess.__file__).resolve().parent)
OPT = "/opt/raas"
SOCKET_DIR = "/run/raas"
# A model endpoint's folder (`SandboxSpec.model_endpoint`): the host's per-sandbox folder
# holding the endpoint's Unix socket, bound read-only here; `relay.py` bridges a loopback
# port of the sandbox's own network namespace to the socket in it.
ENDPOINT_DIR = "/run/raas-model"
ENDPOINT_SOCKET = "model.sock"


def sandbox_env(spec: SandboxSpec, env_dir: str | None) -> dict[str, str]:
    """The environment inside: minimal and explicit, so host variables never leak in."""
    path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    env = {"PATH": path, "HOME": "/tmp", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "TERM": "dumb",
           "PAGER": "cat", "GIT_PAGER": "cat", "MANPAGER": "cat", "NO_COLOR": "1",
           "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PYTHONUNBUFFERED": "1", "TMPDIR": "/tmp"}
    if env_dir:
        env.update(PATH=f"{env_dir}/bin:{path}", VIRTUAL_ENV=env_dir)
    env.update(spec.env)
    return env
