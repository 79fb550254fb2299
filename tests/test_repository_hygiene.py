"""What the repository holds stays portable and findable: no path of the machine it was written
on in any tracked file, every page under docs/ in its index, every relative link resolving, and
a README short enough to finish (STYLE.md 19)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# The build machine's data tree and root's home, its shared venvs and notes. Written so that
# this file does not match itself.
MACHINE_PATHS = re.compile(r"/(?:work|root)/|shared[-/](?:venvs|notes)")
LINK = re.compile(r"\]\(([^)\s]+)\)")
README_MAX_LINES = 320


def tracked_files() -> list[Path]:
    """Every file git tracks in this checkout."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True, timeout=60)
    return [REPO / name for name in listed.stdout.decode().split("\0") if name]


def text_lines(path: Path) -> list[str]:
    """The file's lines, or none for a binary (a NUL byte) or vanished file."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:  # deleted in the work tree, not yet in the index
        return []
    if b"\0" in data:
        return []
    return data.decode("utf-8", errors="replace").splitlines()


def test_no_build_machine_paths_in_tracked_files():
    found = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()[:120]}"
        for path in tracked_files()
        for number, line in enumerate(text_lines(path), 1)
        if MACHINE_PATHS.search(line)
    ]
    assert not found, "paths of the build machine (use a variable with a default in the checkout):\n" + "\n".join(found)


def test_the_pattern_finds_what_it_is_for():
    """The check above can fail: these lines are the kind it must report."""
    caught = [("VLLM_VENV=", "work", "/x"), ("see ", "root", "/.cache"), ("(", "work", "/y.md)")]
    for before, folder, after in caught:
        line = f"{before}/{folder}{after}"
        assert MACHINE_PATHS.search(line), line
    for folder in ("venvs", "notes"):
        assert MACHINE_PATHS.search(f"e.g. shared-{folder}/vllm, shared/{folder}/x.md"), folder
    for line in ("Path.home() / '.cache'", "models/smollm2-135m-instruct", "/tmp/raas-evil", "docs/weights.md"):
        assert not MACHINE_PATHS.search(line), line


def pages() -> list[Path]:
    """The Markdown pages a reader opens: the README, BENCHMARKS and every page under docs/."""
    return [REPO / "README.md", REPO / "BENCHMARKS.md", *sorted((REPO / "docs").glob("*.md"))]


def test_every_docs_page_is_in_the_index():
    index = (REPO / "docs" / "README.md").read_text()
    linked = set(LINK.findall(index))
    missing = [p.name for p in sorted((REPO / "docs").glob("*.md")) if p.name != "README.md" and p.name not in linked]
    assert not missing, f"docs/README.md lists every page with one line; add: {missing}"


def test_relative_links_resolve():
    broken = []
    for page in pages():
        for target in LINK.findall(page.read_text()):
            path = target.split("#", 1)[0]
            if not path or re.match(r"[a-z]+:", path):  # an anchor on the page, or a URL
                continue
            if not (page.parent / path).exists():
                broken.append(f"{page.relative_to(REPO)} -> {target}")
    assert not broken, "links to files that do not exist:\n" + "\n".join(broken)


def test_the_readme_stays_short():
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines: keep what it is, the two commands, training, the picture and"
        " where to read on; move the rest to a page under docs/ (and its line to docs/README.md)"
    )
