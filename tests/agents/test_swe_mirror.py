"""SWE instances as SWE-bench/SWE-Gym publish them: repo slugs and per-instance images."""

from __future__ import annotations

import pytest

from agents.handlers.swe.images import resolve_instance_image
from agents.handlers.swe.repo import NotProvisioned, is_slug, resolve_repo


def test_slugs() -> None:
    assert is_slug("getmoto/moto") and is_slug("python/mypy.v2")
    for not_slug in ("/abs/path", "a/b/c", "../x", "./a", "a/..", "a", "a /b"):
        assert not is_slug(not_slug)


def test_a_slug_resolves_only_in_the_mirror(tmp_path) -> None:
    mirror, root = tmp_path / "mirror", tmp_path / "root"
    (mirror / "getmoto__moto.git").mkdir(parents=True)
    (mirror / "pallets__flask.tar.gz").write_bytes(b"")
    (root / "getmoto" / "moto").mkdir(parents=True)  # a host dir shaped like the slug
    assert resolve_repo("getmoto/moto", root, mirror) == mirror / "getmoto__moto.git"
    assert resolve_repo("pallets/flask", root, mirror) == mirror / "pallets__flask.tar.gz"
    with pytest.raises(NotProvisioned) as err:
        resolve_repo("psf/requests", root, mirror)
    assert str(mirror) in str(err.value) and "psf__requests.git" in str(err.value)
    with pytest.raises(NotProvisioned, match="RAAS_REPO_MIRROR_ROOT"):
        resolve_repo("psf/requests", root, None)


def test_instance_images_by_kind(tmp_path) -> None:
    (tmp_path / "a__b-1.sif").write_bytes(b"")
    (tmp_path / "a__b-2" / "usr").mkdir(parents=True)  # a rootfs
    (tmp_path / "a__b-3").mkdir()
    (tmp_path / "a__b-3" / "pyvenv.cfg").write_text("home = /usr/bin\n")  # a python env
    (tmp_path / "sweb.eval.x86_64.a__b-4").mkdir()
    assert resolve_instance_image("a__b-1", tmp_path, "singularity") == {"image": str(tmp_path / "a__b-1.sif")}
    assert resolve_instance_image("a__b-2", tmp_path, "bwrap") == {"image": str(tmp_path / "a__b-2")}
    assert resolve_instance_image("a__b-3", tmp_path) == {"python_env": str(tmp_path / "a__b-3")}
    assert resolve_instance_image("A__B-4", tmp_path) == {"image": str(tmp_path / "sweb.eval.x86_64.a__b-4")}
    with pytest.raises(NotProvisioned) as err:
        resolve_instance_image("a__b-9", tmp_path)
    assert "a__b-9.sif" in str(err.value) and str(tmp_path) in str(err.value)
    for bad in ("../etc", "x/y", ".hidden"):
        with pytest.raises(NotProvisioned):
            resolve_instance_image(bad, tmp_path)
