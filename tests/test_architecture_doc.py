"""docs/architecture.md names every product module: a module added, moved or renamed without
its line in the module index fails here, so the map a newcomer reads matches the code."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"
PACKAGES = ("core", "sandbox", "agents", "tasks", "app", "sdk/raas_client", "fakellm")
# Package data, not modules of ours to map: example repositories, harness launchers (pip
# installs them into sandboxes), the simulator's data.
DATA_FOLDERS = ("agents/examples", "core/harness_launchers", "fakellm/data")


def product_modules() -> list[Path]:
    """Every product module file (package `__init__.py` files and data folders aside)."""
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT)
            if path.name != "__init__.py" and not any(rel.is_relative_to(data) for data in DATA_FOLDERS):
                found.append(rel)
    return found


def named_in_doc(text: str) -> set[str]:
    """Module paths the doc names: in full anywhere (`tasks/stages.py`), or by file name in
    the table under a folder's heading (### `tasks/writes/`)."""
    named = set(re.findall(r"[\w/]+\.py", text))
    folder = None
    for line in text.splitlines():
        heading = re.match(r"#{2,4} `([\w/]+/)`", line)
        if heading:
            folder = heading.group(1)
        elif line.startswith("#"):
            folder = None
        elif folder and line.startswith("| `"):
            named.add(folder + line.split("`")[1])
    return named


def test_every_product_module_is_named_in_the_architecture_doc():
    named = named_in_doc(DOC.read_text())
    missing = [str(p) for p in product_modules() if str(p) not in named]
    assert missing == [], f"add these to docs/architecture.md's module index: {missing}"


def test_the_doc_names_no_module_that_is_gone():
    named = named_in_doc(DOC.read_text())
    ours = {str(p) for p in product_modules()}
    stale = sorted(n for n in named if n.split("/")[0] in {p.split("/")[0] for p in PACKAGES} and n not in ours)
    assert stale == [], f"docs/architecture.md names modules that no longer exist: {stale}"


def test_the_check_sees_a_missing_module():
    assert "tasks/stages.py" in named_in_doc("see `tasks/stages.py`")
    assert "tasks/writes/lifecycle.py" in named_in_doc("### `tasks/writes/`\n\n| `lifecycle.py` | x |\n")
    assert "tasks/writes/lifecycle.py" not in named_in_doc("### `tasks/writes/`\n\n## other\n| `lifecycle.py` | x |")
