"""File tools with str_replace_editor semantics, confined to the workspace."""

from __future__ import annotations

import os

from .protocol import EditRequest, ToolUsage

_SNIPPET_LINES = 4
_MAX_VIEW_CHARS = 64 * 1024


class Editor:
    """view/create/str_replace/insert/undo_edit plus raw read/write, all inside `root`."""

    def __init__(self, root: str) -> None:
        self.root = os.path.realpath(root)
        self.history: dict[str, list[str]] = {}

    # -- paths ---------------------------------------------------------------------------
    def resolve(self, path: str) -> str:
        """Absolute real path inside the workspace, or a ToolUsage error for the model."""
        if not path:
            raise ToolUsage("The path is empty.")
        full = os.path.realpath(os.path.join(self.root, path))  # joins keep absolute paths
        if full != self.root and not full.startswith(self.root + os.sep):
            raise ToolUsage(f"The path {path} is outside the workspace {self.root}.")
        return full

    def _read(self, full: str, shown: str) -> str:
        if not os.path.isfile(full):
            raise ToolUsage(f"The path {shown} does not exist or is not a file.")
        try:
            with open(full, encoding="utf-8") as handle:
                return handle.read()
        except UnicodeDecodeError:
            raise ToolUsage(f"The file {shown} is not UTF-8 text.") from None

    def _write(self, full: str, text: str) -> None:
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w", encoding="utf-8") as handle:
            handle.write(text)

    # -- raw file access -----------------------------------------------------------------
    def read_file(self, path: str) -> str:
        """File content as text."""
        return self._read(self.resolve(path), path)

    def write_file(self, path: str, content: str) -> None:
        """Create or overwrite a file (parents created)."""
        full = self.resolve(path)
        if os.path.isdir(full):
            raise ToolUsage(f"The path {path} is a directory.")
        self._write(full, content)

    # -- str_replace_editor --------------------------------------------------------------
    def run(self, req: EditRequest) -> str:
        """Dispatch one editor command."""
        _check_types(req)
        handler = getattr(self, f"_cmd_{req.command}", None)
        if handler is None:
            raise ToolUsage(
                f"Unknown command {req.command!r}; use one of: view, create, str_replace, insert, undo_edit."
            )
        return handler(req, self.resolve(req.path))

    def _cmd_view(self, req: EditRequest, full: str) -> str:
        if os.path.isdir(full):
            if req.view_range:
                raise ToolUsage("view_range is not allowed when path is a directory.")
            return self._list_dir(full)
        lines = self._read(full, req.path).split("\n")
        start, end = 1, len(lines)
        if req.view_range:
            if len(req.view_range) != 2:
                raise ToolUsage("view_range must be [start, end] (end -1 means to the end).")
            start, end = req.view_range
            end = len(lines) if end == -1 else end
            if not 1 <= start <= len(lines) or not start <= end <= len(lines):
                raise ToolUsage(
                    f"Invalid view_range {req.view_range}: the file has "
                    f"{len(lines)} lines; use 1 <= start <= end <= {len(lines)}."
                )
        text = _numbered(lines[start - 1 : end], start)
        if len(text) > _MAX_VIEW_CHARS:
            text = text[:_MAX_VIEW_CHARS] + "\n<response clipped: use view_range to see more>"
        return f"Here's the result of running `cat -n` on {req.path}:\n{text}\n"

    def _list_dir(self, full: str) -> str:
        entries = []
        for dirpath, dirnames, filenames in os.walk(full):
            depth = dirpath[len(full) :].count(os.sep)
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            if depth >= 2:
                dirnames[:] = []
            for name in dirnames + sorted(f for f in filenames if not f.startswith(".")):
                entries.append(os.path.join(dirpath, name))
        listing = "\n".join(sorted(entries)[:2000])
        return f"Files and directories up to 2 levels deep in {full}, excluding hidden items:\n{full}\n{listing}\n"

    def _cmd_create(self, req: EditRequest, full: str) -> str:
        if req.file_text is None:
            raise ToolUsage("Parameter `file_text` is required for command: create.")
        if os.path.exists(full):
            raise ToolUsage(f"File already exists at: {req.path}. Cannot overwrite files using command `create`.")
        self._write(full, req.file_text)
        self.history.setdefault(full, []).append(None)
        return f"File created successfully at: {req.path}"

    def _cmd_str_replace(self, req: EditRequest, full: str) -> str:
        if req.old_str is None:
            raise ToolUsage("Parameter `old_str` is required for command: str_replace.")
        text = self._read(full, req.path)
        count = text.count(req.old_str)
        if count == 0:
            raise ToolUsage(
                f"No replacement was performed, old_str `{req.old_str}` did not appear verbatim in {req.path}."
            )
        if count > 1:
            lines = [i + 1 for i, line in enumerate(text.split("\n")) if req.old_str in line]
            raise ToolUsage(
                f"No replacement was performed. Multiple occurrences of old_str "
                f"`{req.old_str}` in lines {lines}. Please ensure it is unique."
            )
        new = req.new_str or ""
        self.history.setdefault(full, []).append(text)
        self._write(full, text.replace(req.old_str, new))
        line = text.split(req.old_str)[0].count("\n") + 1
        return self._snippet(req.path, full, line, new.count("\n"))

    def _cmd_insert(self, req: EditRequest, full: str) -> str:
        if req.insert_line is None or req.new_str is None:
            raise ToolUsage("Parameters `insert_line` and `new_str` are required for command: insert.")
        text = self._read(full, req.path)
        lines = text.split("\n")
        if not 0 <= req.insert_line <= len(lines):
            raise ToolUsage(f"Invalid `insert_line` {req.insert_line}: it should be within [0, {len(lines)}].")
        self.history.setdefault(full, []).append(text)
        new_lines = req.new_str.split("\n")
        self._write(full, "\n".join(lines[: req.insert_line] + new_lines + lines[req.insert_line :]))
        return self._snippet(req.path, full, req.insert_line + 1, len(new_lines) - 1)

    def _cmd_undo_edit(self, req: EditRequest, full: str) -> str:
        stack = self.history.get(full)
        if not stack:
            raise ToolUsage(f"No edit history found for {req.path}.")
        previous = stack.pop()
        if previous is None:  # undoing a create removes the file
            os.remove(full)
            return f"Undid the creation of {req.path}; the file is removed."
        self._write(full, previous)
        return f"Last edit to {req.path} undone successfully. " + self._cmd_view(EditRequest("view", req.path), full)

    def _snippet(self, shown: str, full: str, line: int, added: int) -> str:
        lines = self._read(full, shown).split("\n")
        start = max(1, line - _SNIPPET_LINES)
        end = min(len(lines), line + added + _SNIPPET_LINES)
        body = _numbered(lines[start - 1 : end], start)
        return (
            f"The file {shown} has been edited. Here's the result of running `cat -n` on a "
            f"snippet of {shown}:\n{body}\nReview the changes and make sure they are as "
            "expected. Edit the file again if necessary."
        )


def _check_types(req: EditRequest) -> None:
    """Model-supplied arguments of the wrong type are the model's mistake, said plainly."""
    for name in ("command", "path", "file_text", "old_str", "new_str"):
        value = getattr(req, name)
        if value is not None and not isinstance(value, str):
            raise ToolUsage(f"Parameter `{name}` must be a string.")
    line = req.insert_line
    if line is not None and (isinstance(line, bool) or not isinstance(line, int)):
        raise ToolUsage("Parameter `insert_line` must be an integer.")
    if req.view_range is not None and (
        not isinstance(req.view_range, list) or not all(isinstance(v, int) for v in req.view_range)
    ):
        raise ToolUsage("Parameter `view_range` must be a list of two integers, e.g. [1, 20].")


def _numbered(lines: list[str], first: int) -> str:
    return "\n".join(f"{i:6}\t{line}" for i, line in enumerate(lines, first))
