"""Build the search agent's corpus from the Python standard library's own docstrings.

No network is needed and the text may be shipped (the Python documentation is under the PSF
license). Run it with the system interpreter, not the project venv, so the corpus describes the
stdlib every machine has; the interpreter's version is recorded next to the corpus:

    /usr/bin/python3 examples/search/build_corpus.py            # writes corpus.jsonl + meta

Each passage is one documented object (a module, a function, a class or a method), split into
chunks of at most MAX_WORDS words at paragraph breaks so BM25 scores comparable lengths.
Output order and ids are deterministic for a given interpreter.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import platform
import re
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
MAX_WORDS = 180
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")

# Commonly used, import-safe modules (no GUI, no import-time side effects).
MODULES = (
    "abc argparse array ast asyncio base64 bisect bz2 calendar cmath collections "
    "collections.abc colorsys configparser contextlib copy csv dataclasses datetime decimal "
    "difflib enum errno filecmp fnmatch fractions functools gc getopt gettext glob gzip hashlib "
    "heapq hmac html html.parser http http.client inspect io ipaddress itertools json keyword "
    "linecache locale logging lzma math mimetypes numbers operator os os.path pathlib pickle "
    "platform pprint queue random re sched secrets select selectors shlex shutil signal socket "
    "sqlite3 stat statistics string struct subprocess sys tarfile tempfile textwrap threading "
    "time timeit tokenize traceback types typing unicodedata unittest urllib.parse uuid "
    "warnings weakref zipfile zlib"
).split()


def _signature(obj: object) -> str:
    """`(a, b=1)` when inspect can tell, else empty (many C functions have no signature)."""
    try:
        # Sentinel defaults print as `<... object at 0x7f...>`: the address changes every run.
        return _ADDRESS.sub("", str(inspect.signature(obj)))
    except (TypeError, ValueError):
        return ""


def _chunks(text: str) -> Iterator[str]:
    """Split at blank lines into pieces of at most MAX_WORDS words (a long paragraph is cut)."""
    piece: list[str] = []
    size = 0
    for para in text.split("\n\n"):
        words = para.split()
        while len(words) > MAX_WORDS:  # a paragraph too long on its own: cut it by words
            if piece:
                yield "\n\n".join(piece)
                piece, size = [], 0
            yield " ".join(words[:MAX_WORDS])
            words = words[MAX_WORDS:]
        if piece and size + len(words) > MAX_WORDS:
            yield "\n\n".join(piece)
            piece, size = [], 0
        if words:
            piece.append(para.strip() if len(words) == len(para.split()) else " ".join(words))
            size += len(words)
    if piece:
        yield "\n\n".join(piece)


def _documented(module_name: str) -> Iterator[tuple[str, str, str]]:
    """(qualified name, kind, signature + docstring) for the module and its public members."""
    module = importlib.import_module(module_name)
    doc = inspect.getdoc(module)
    if doc:
        yield module_name, "module", doc
    exported = set(getattr(module, "__all__", ()))
    for name in sorted(exported or dir(module)):
        if name.startswith("_") or not hasattr(module, name):
            continue
        obj = getattr(module, name)
        if inspect.ismodule(obj):
            continue
        home = getattr(obj, "__module__", None)
        if name not in exported and home not in (module_name, f"_{module_name}", None):
            continue  # imported from elsewhere (documented there); `_bisect` & co. are ours
        kind = "class" if inspect.isclass(obj) else "function" if callable(obj) else None
        doc = inspect.getdoc(obj) if kind else None
        if not doc:
            continue
        yield f"{module_name}.{name}", kind, f"{name}{_signature(obj)}\n\n{doc}"
        if kind == "class":
            yield from _methods(f"{module_name}.{name}", obj)


def _methods(qualname: str, cls: type) -> Iterator[tuple[str, str, str]]:
    """Public methods defined on `cls` itself (inherited ones are documented on their base)."""
    for name, member in sorted(vars(cls).items()):
        if name.startswith("_") or not callable(member):
            continue
        doc = inspect.getdoc(member)
        if doc:
            yield f"{qualname}.{name}", "method", f"{name}{_signature(member)}\n\n{doc}"


def build(modules: list[str]) -> list[dict[str, str]]:
    """Every passage of `modules`, in module order then name order."""
    passages: list[dict[str, str]] = []
    seen: set[str] = set()
    for module_name in modules:
        for qualname, kind, text in _documented(module_name):
            if qualname in seen:
                continue
            seen.add(qualname)
            for i, chunk in enumerate(_chunks(text)):
                pid = qualname if i == 0 else f"{qualname}#{i}"
                passages.append({"id": pid, "title": qualname, "kind": kind, "text": chunk})
    return passages


def main() -> None:
    """Write corpus.jsonl and corpus.meta.json (interpreter version, counts)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE / "corpus.jsonl")
    parser.add_argument("--modules", nargs="*", default=list(MODULES))
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    passages = build(args.modules)
    with args.out.open("w", encoding="utf-8") as fh:
        for passage in passages:
            fh.write(json.dumps(passage, ensure_ascii=False) + "\n")
    meta = {
        "python": platform.python_version(),
        "implementation": sys.implementation.name,
        "modules": args.modules,
        "passages": len(passages),
        "max_words": MAX_WORDS,
    }
    args.out.with_suffix(".meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"wrote {len(passages)} passages to {args.out}")


if __name__ == "__main__":
    main()
