"""Putting a SWE instance's repository at its base commit into a host directory.

An instance's `repo` is a git directory, a tarball (of a git checkout or of plain sources) or a
plain source directory, or, as SWE-bench / SWE-Gym publish it, a GitHub slug (`getmoto/moto`)
resolved against the operator's repository mirror (`RAAS_REPO_MIRROR_ROOT`): a bare git dir,
a `.git` dir or a tarball named `owner__name` under it. A slug that is not there is a
`NotProvisioned` error at INIT naming what was looked up and where. Plain sources are committed
with a fixed author, date and message, so
the same files always give the same commit id: the example repos ship as sources and their
`base_commit` in `examples/swe/instances.jsonl` is reproducible
(`python examples/swe/build_instances.py` rebuilds that file). Git runs on the host with a sanitized
environment so the user's git config and hooks never leak in.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from agents.shipped_examples import SHIPPED_EXAMPLES, SHIPPED_ROOT
from core.errors import InfraError, InvalidRequest, RaasError

TARBALL_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz")
_FIXED_DATE = "2024-01-01T00:00:00+00:00"
_SKIP = {"__pycache__", ".pytest_cache", ".git"}


def git_env() -> dict[str, str]:
    """Environment for host-side git: no user/system config, fixed identity and dates."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(
        GIT_CONFIG_NOSYSTEM="1",
        GIT_CONFIG_GLOBAL=os.devnull,
        GIT_TERMINAL_PROMPT="0",
        GIT_AUTHOR_NAME="raas",
        GIT_AUTHOR_EMAIL="raas@localhost",
        GIT_AUTHOR_DATE=_FIXED_DATE,
        GIT_COMMITTER_NAME="raas",
        GIT_COMMITTER_EMAIL="raas@localhost",
        GIT_COMMITTER_DATE=_FIXED_DATE,
        LC_ALL="C",
    )
    return env


def git(cwd: Path, *args: str, check: bool = True) -> str:
    """Run host git in `cwd` and return stdout; a failure is an InfraError with stderr."""
    # safe.directory: a root service hands fresh workspaces to the sandbox's uid (bwrap.py);
    # host git never runs on a workspace the agent has touched (swe_diff compares files).
    proc = subprocess.run(
        ["git", "-c", "core.hooksPath=/dev/null", "-c", "safe.directory=*", *args],
        cwd=cwd,
        env=git_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    if check and proc.returncode != 0:
        raise InfraError(f"git {' '.join(args)} failed: {proc.stderr.strip()[:2000]}")
    return proc.stdout


_SLUG = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")


class NotProvisioned(RaasError, LookupError):
    """A repository or image the instance needs is not on this node (operator's mirror/root).

    Not retried: another attempt on the same node finds the same directory listing.
    """

    code = "not_provisioned"


def is_slug(repo: str) -> bool:
    """True for a GitHub-style `owner/name` (what SWE-bench and SWE-Gym put in `repo`)."""
    return bool(_SLUG.match(repo)) and not repo.startswith(".") and ".." not in repo


def mirror_candidates(slug: str) -> list[str]:
    """Names an `owner/name` slug may have in the mirror, in lookup order."""
    base = slug.replace("/", "__")
    return [base, f"{base}.git", *(base + suffix for suffix in TARBALL_SUFFIXES)]


def resolve_slug(slug: str, mirror_root: str | Path | None) -> Path:
    """The mirror entry of `slug`, or NotProvisioned naming the names and the root."""
    names = mirror_candidates(slug)
    if mirror_root is None:
        raise NotProvisioned(
            f"repo {slug!r} is a repository slug but no repository mirror is "
            f"configured on this node (set RAAS_REPO_MIRROR_ROOT)",
            repo=slug,
        )
    for name in names:
        path = Path(mirror_root) / name
        if path.exists():
            return path
    raise NotProvisioned(
        f"repo {slug!r} is not in the repository mirror {mirror_root} (looked for {', '.join(names)})",
        repo=slug,
        looked_for=names,
    )


def check_repo_name(repo: str) -> None:
    """A job names a repository relative to the operator's repo root (or by slug), never by
    host path."""
    parts = Path(repo).parts
    if not parts or Path(repo).is_absolute() or repo.startswith("~") or ".." in parts:
        raise InvalidRequest(
            f"repo {repo!r} must be a path relative to the operator's repo "
            "root or an owner/name slug (no absolute path, `~` or `..`)",
            field="repo",
        )


def resolve_repo(repo: str, root: str | Path | None = None, mirror_root: str | Path | None = None) -> Path:
    """An instance's `repo` as an absolute path: a slug from the mirror (only from there when a
    mirror is configured), else a path inside the operator's repo `root` (default: the shipped
    examples, `examples/swe/...`; symlinks may not lead out)."""
    check_repo_name(repo)
    base = Path(root).resolve() if root else SHIPPED_ROOT
    fence = base if root else SHIPPED_EXAMPLES
    path = (base / repo).resolve()
    inside = path.is_relative_to(fence)
    if is_slug(repo) and (mirror_root is not None or not (inside and path.exists())):
        return resolve_slug(repo, mirror_root)
    if not inside:
        raise InvalidRequest(f"repo {repo!r} is outside the operator's repo root", field="repo")
    if not path.exists():
        raise InvalidRequest(f"repo {repo!r} does not exist in the operator's repo root", field="repo")
    return path


def _copy_sources(src: Path, dest: Path) -> None:
    """Copy a source tree with normalized permissions, leaving out caches and .git."""
    for dirpath, dirnames, filenames in os.walk(src):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP)
        target = dest / Path(dirpath).relative_to(src)
        target.mkdir(parents=True, exist_ok=True)
        for name in sorted(filenames):
            shutil.copyfile(Path(dirpath) / name, target / name)
            executable = os.access(Path(dirpath) / name, os.X_OK)
            os.chmod(target / name, 0o755 if executable else 0o644)


def commit_sources(src: Path, dest: Path) -> str:
    """Make `dest` a git repo holding `src`'s files in one deterministic commit; its id."""
    _copy_sources(src, dest)
    git(dest, "init", "-q", "-b", "main")
    git(dest, "add", "-A")
    git(dest, "commit", "-q", "--no-gpg-sign", "-m", "Initial import")
    return git(dest, "rev-parse", "HEAD").strip()


def _checkout_base(dest: Path, base_commit: str) -> None:
    """Detach at `base_commit` and drop every other ref so later history is unreachable."""
    if git(dest, "cat-file", "-t", base_commit, check=False).strip() != "commit":
        raise InvalidRequest(f"base_commit {base_commit} is not in the repo", field="base_commit")
    git(dest, "checkout", "-q", "--force", "--detach", base_commit)
    for ref in git(dest, "for-each-ref", "--format=%(refname)").split():
        git(dest, "update-ref", "-d", ref)
    git(dest, "remote", "remove", "origin", check=False)
    git(dest, "checkout", "-q", "-B", "main")
    git(dest, "reflog", "expire", "--expire=now", "--all")
    git(dest, "gc", "-q", "--prune=now")


def _extract(tarball: Path, dest: Path) -> Path:
    """Unpack a tarball into `dest`; the single top-level folder if it has one."""
    with tarfile.open(tarball) as archive:
        archive.extractall(dest, filter="data")
    entries = list(dest.iterdir())
    return entries[0] if len(entries) == 1 and entries[0].is_dir() else dest


def _is_git(path: Path) -> bool:
    """A checkout (`.git` inside) or a bare repository (HEAD + objects/ at the top)."""
    return (path / ".git").exists() or ((path / "HEAD").is_file() and (path / "objects").is_dir())


def materialize(
    repo: str, base_commit: str, dest: str | Path, root: str | Path | None = None, mirror_root: str | Path | None = None
) -> None:
    """Fill the empty directory `dest` with `repo` checked out at `base_commit`."""
    src, dest = resolve_repo(repo, root, mirror_root), Path(dest)
    with tempfile.TemporaryDirectory(prefix="raas-swe-") as scratch:
        if src.is_file() and src.name.endswith(TARBALL_SUFFIXES):
            src = _extract(src, Path(scratch))
        elif src.is_file():
            raise InvalidRequest(f"repo {repo!r} is neither a directory nor a tarball", field="repo")
        if _is_git(src):
            git(dest, "clone", "-q", "--no-hardlinks", str(src), ".")
            _checkout_base(dest, base_commit)
            return
        head = commit_sources(src, dest)
    if head != base_commit:
        raise InvalidRequest(
            f"the sources of {repo!r} commit to {head}, not base_commit {base_commit}", field="base_commit"
        )


def example_instances(examples_dir: str | Path) -> list[dict[str, Any]]:
    """SWE-bench-shaped instances for every example folder (repo/, problem.md, patches)."""
    examples_dir = Path(examples_dir).resolve()
    instances = []
    for folder in sorted(p for p in examples_dir.iterdir() if (p / "repo").is_dir()):
        tests = json.loads((folder / "tests.json").read_text())
        with tempfile.TemporaryDirectory() as scratch:
            base = commit_sources(folder / "repo", Path(scratch))
        try:  # a shipped example (or a link to one) is named as a job names it: examples/swe/...
            repo = str((folder / "repo").resolve().relative_to(SHIPPED_ROOT))
        except ValueError:
            repo = str(folder / "repo")
        instances.append(
            {
                "instance_id": f"raas-examples__{folder.name}-1",
                "repo": repo,
                "base_commit": base,
                "problem_statement": (folder / "problem.md").read_text(),
                "test_patch": (folder / "test.patch").read_text(),
                "patch": (folder / "fix.patch").read_text(),
                "FAIL_TO_PASS": tests["FAIL_TO_PASS"],
                "PASS_TO_PASS": tests["PASS_TO_PASS"],
            }
        )
    return instances
