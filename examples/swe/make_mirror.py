"""Lay the example SWE repos out as SWE-Gym/SWE-bench data: a repository mirror, an image per
instance, and the instances as those datasets publish them.

    python examples/swe/make_mirror.py OUT [--env PYTHON_ENV]

writes, from the folders next to this script (nothing binary is committed; this builds it):

- `OUT/mirror/raas-examples__<name>.git`: a bare git repository of each example (the same
  deterministic commit as `instances.jsonl`'s `base_commit`); the first example is a tarball
  `raas-examples__<name>.tar.gz` of its bare repository instead, so both mirror forms are used.
  Point `RAAS_REPO_MIRROR_ROOT` at `OUT/mirror`.
- `OUT/images/<instance_id>`: the instance's environment for bwrap: a link to PYTHON_ENV (a
  venv of the system interpreter with pytest; `raas env build pytest --package pytest` makes
  one), or, without `--env`, to such a venv built once under `OUT/envs/pytest`.
  Point `RAAS_IMAGE_ROOT` at `OUT/images`.
- `OUT/swegym.jsonl`: the instances in SWE-Gym's row shape: `repo` is the slug
  `raas-examples/<name>`, FAIL_TO_PASS/PASS_TO_PASS are JSON strings, `data_source` is
  `swe-gym`, plus SWE-Gym's other columns.
"""

from __future__ import annotations

import argparse
import json
import sys
import tarfile
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from agents.handlers.swe.repo import commit_sources, example_instances, git  # noqa: E402

OWNER = "raas-examples"


def build_mirror(out: Path, env: Path | None = None) -> list[dict]:
    """Write mirror/, images/ and swegym.jsonl under `out`; return the SWE-Gym rows."""
    mirror, images = out / "mirror", out / "images"
    if env is None:  # a venv of the system interpreter with pytest, built once under OUT
        from sandbox.environments import build_environment

        env = build_environment("pytest", ["pytest"], root=out / "envs")
    if not (env / "bin" / "python3").exists():
        raise SystemExit(f"{env} is not a built Python environment (no bin/python3)")
    mirror.mkdir(parents=True, exist_ok=True)
    images.mkdir(parents=True, exist_ok=True)
    rows = []
    for k, inst in enumerate(example_instances(HERE)):
        name = inst["instance_id"].split("__", 1)[1].rsplit("-", 1)[0]
        _mirror_repo(HERE / name / "repo", mirror, name, as_tarball=k == 0)
        _image(images / inst["instance_id"], env)
        rows.append(swegym_row(inst, name))
    (out / "swegym.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def swegym_row(inst: dict, name: str) -> dict:
    """An example instance as a SWE-Gym row."""
    return {
        "instance_id": inst["instance_id"],
        "repo": f"{OWNER}/{name}",
        "base_commit": inst["base_commit"],
        "problem_statement": inst["problem_statement"],
        "patch": inst["patch"],
        "test_patch": inst["test_patch"],
        "FAIL_TO_PASS": json.dumps(inst["FAIL_TO_PASS"]),
        "PASS_TO_PASS": json.dumps(inst["PASS_TO_PASS"]),
        "hints_text": "",
        "created_at": "2024-01-01T00:00:00Z",
        "version": "1.0",
        "environment_setup_commit": inst["base_commit"],
        "data_source": "swe-gym",
    }


def _mirror_repo(sources: Path, mirror: Path, name: str, as_tarball: bool) -> None:
    """A bare repository of `sources` (one deterministic commit) in the mirror."""
    base = f"{OWNER}__{name}"
    with tempfile.TemporaryDirectory() as scratch:
        work, bare = Path(scratch) / "work", Path(scratch) / f"{base}.git"
        work.mkdir()
        commit_sources(sources, work)
        git(Path(scratch), "clone", "-q", "--bare", str(work), str(bare))
        if as_tarball:
            with tarfile.open(mirror / f"{base}.tar.gz", "w:gz") as archive:
                archive.add(bare, arcname=f"{base}.git")
        else:
            target = mirror / f"{base}.git"
            if not target.exists():
                bare.rename(target)


def _image(target: Path, env: Path) -> None:
    """The instance's environment: a link to the shared venv with pytest."""
    if not (target.exists() or target.is_symlink()):
        target.symlink_to(env.resolve())


def main() -> int:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="Folder to write mirror/, images/, swegym.jsonl")
    parser.add_argument(
        "--env", type=Path, default=None, help="A built Python environment with pytest to link as each image"
    )
    args = parser.parse_args()
    rows = build_mirror(args.out, args.env)
    print(
        f"{len(rows)} instances: mirror {args.out / 'mirror'}, images {args.out / 'images'}, "
        f"rows {args.out / 'swegym.jsonl'}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
