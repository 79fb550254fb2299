"""Per-instance environments for SWE instances, looked up by instance id (SWE-bench/SWE-Gym style).

ProRL runs every SWE-Gym/SWE-bench instance in its own image. raas finds an instance's image
under the operator's image root (`RAAS_IMAGE_ROOT`) by the instance id: `<id>.sif` for
Singularity, a directory `<id>/` for bwrap, which is either a Python environment (a venv of the
system interpreter: `pyvenv.cfg` inside; bound read-only as the sandbox's `python_env`) or a
root filesystem (mounted as the sandbox's `/`). SWE-bench's own image name
`sweb.eval.x86_64.<id>` is tried too. A missing image is a `NotProvisioned` error at INIT that
names the instance, the names tried and the root.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agents.handlers.swe.repo import NotProvisioned


def image_names(instance_id: str) -> list[str]:
    """Names an instance's image may have under the root, in lookup order."""
    lower = instance_id.lower()
    names = [instance_id, lower, f"sweb.eval.x86_64.{lower}"]
    return list(dict.fromkeys(names))


def resolve_instance_image(instance_id: str, image_root: str | Path, runtime: str | None = None) -> dict[str, Any]:
    """Sandbox options for the instance's environment: {"image": ...} or {"python_env": ...}."""
    if "/" in instance_id or instance_id.startswith("."):
        raise NotProvisioned(f"instance id {instance_id!r} cannot name an image")
    root = Path(image_root)
    tried = []
    for name in image_names(instance_id):
        kinds = [f"{name}.sif", name] if runtime == "singularity" else [name, f"{name}.sif"]
        for entry in kinds:
            tried.append(entry)
            path = root / entry
            if path.is_file() and entry.endswith(".sif"):
                return {"image": str(path.resolve())}
            if path.is_dir():
                if (path / "pyvenv.cfg").is_file():
                    return {"python_env": str(path.resolve())}
                return {"image": str(path.resolve())}
    raise NotProvisioned(
        f"no image for instance {instance_id!r} under the image root {root} (looked for {', '.join(tried)})",
        instance_id=instance_id,
        looked_for=tried,
    )
