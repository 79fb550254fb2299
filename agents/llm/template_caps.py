"""Length caps on what an untrusted chat template can build, checked before it is allocated.

Workers render inline templates in-process (`template_budget.render_budget`), where the only
other limits are a wall deadline and a cap on the final output, both too late for one huge
allocation: `'x'|center(6000000000)` asked for 6 GB in 0.01 s, and 27 rounds of
`{% set ns.s = ns.s ~ ns.s %}` built 134 M characters (review 1 item 1). Every way of making a
string longer than its inputs that a chat template can reach is estimated first and refused
(`SecurityError`) past `MAX_CHARS`:

- operators: `~` (Jinja compiles it to a join this module's code generator wraps), `+`, `*`
  (already capped by `template_budget`), `%` on a string (widths and precisions count);
- filters: `center`, `indent`, `format`, `join`, `replace`, `wordwrap`;
- string methods called from a template: `center`, `ljust`, `rjust`, `zfill`, `expandtabs`,
  `replace`, `join`, `format`, `format_map`.

Each result is capped at MAX_CHARS and all of one render's checked results together at
TOTAL_CHARS (reset per render by `render_budget`). What is left is text made outside these
paths (the `string`/`tojson` of containers built from capped parts stays within a small
multiple of the total); the submission check renders in a child with RLIMIT_AS.
Installed process-wide on Jinja's ImmutableSandboxedEnvironment (chat templates are the only
sandboxed templates this process compiles) by `template_budget` at import.
"""

from __future__ import annotations

import functools
import re
import threading
from typing import Any

from jinja2 import nodes
from jinja2.compiler import CodeGenerator, Frame
from jinja2.sandbox import SecurityError

MAX_CHARS = 4 * 1024 * 1024  # = template_budget.MAX_OUTPUT_CHARS (the whole output's cap)
TOTAL_CHARS = 16 * MAX_CHARS  # all results checked here in one render, together
_render = threading.local()  # .spent: characters built through the checks in this render
_PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\*|\d*)(?:\.(\*|\d*))?")
_BRACE_SPEC = re.compile(r"\{[^{}]*\}")
_STR_METHODS = {"center", "ljust", "rjust", "zfill", "expandtabs", "replace", "join", "format", "format_map"}


def _refuse_over(size: int, what: str) -> None:
    """Refuse one result over MAX_CHARS, or one that takes the render's total of results
    built through these checks over TOTAL_CHARS (`range(10000)|map('center', 4000000)` is
    10 000 results each under the cap)."""
    if size > MAX_CHARS:
        raise SecurityError(f"{what} would be {size} characters, over the cap of {MAX_CHARS}")
    spent = getattr(_render, "spent", 0) + size
    if spent > TOTAL_CHARS:
        raise SecurityError(
            f"{what}: this render's strings would total {spent} characters, over the cap of {TOTAL_CHARS}"
        )
    _render.spent = spent


def reset() -> None:
    """Start this thread's per-render total afresh (`template_budget.render_budget`)."""
    _render.spent = 0


def _length(value: Any) -> int:
    return len(value) if isinstance(value, str) else len(str(value))


def _int(value: Any) -> int:
    return value if isinstance(value, int) else 0


def _replace_size(text: str, old: Any, new: Any, count: Any = None) -> int:
    old, new = str(old), str(new)
    hits = text.count(old) if old else len(text) + 1
    if isinstance(count, int) and count >= 0:
        hits = min(hits, count)
    return len(text) + hits * max(0, len(new) - len(old))


def _percent_size(fmt: str, args: Any) -> int:
    """An upper bound of `fmt % args`: the text, every argument, every width and precision."""
    values = list(args.values()) if isinstance(args, dict) else (list(args) if isinstance(args, tuple) else [args])
    numbers = sum(int(n) for spec in _PERCENT_SPEC.findall(fmt) for n in spec if n.isdigit())
    return len(fmt) + sum(_length(v) for v in values) + numbers


def _format_size(fmt: str, args: Any, kwargs: Any) -> int:
    """An upper bound of `fmt.format(...)`: numbers inside `{...}` fields count as widths."""
    numbers = sum(int(n) for field in _BRACE_SPEC.findall(fmt) for n in re.findall(r"\d+", field))
    values = [*args, *kwargs.values()]
    return len(fmt) + sum(_length(v) for v in values) + numbers


def check_method(method: Any, args: tuple, kwargs: dict) -> tuple:
    """Refuse a string method call whose result would pass the cap; the args to call with
    (an iterable given to `join` is read once, here)."""
    owner, name = getattr(method, "__self__", None), getattr(method, "__name__", "")
    if not isinstance(owner, str) or name not in _STR_METHODS:
        return args
    what = f"str.{name}"
    if name in ("center", "ljust", "rjust", "zfill") and args:
        _refuse_over(max(len(owner), _int(args[0])), what)
    elif name == "expandtabs":
        size = _int(args[0] if args else kwargs.get("tabsize", 8))
        _refuse_over(len(owner) + owner.count("\t") * size, what)
    elif name == "replace" and len(args) >= 2:
        _refuse_over(_replace_size(owner, *args[:3]), what)
    elif name == "join" and args:
        items = list(args[0])
        _refuse_over(sum(_length(i) for i in items) + len(owner) * max(0, len(items) - 1), what)
        args = (items, *args[1:])
    elif name == "format":
        _refuse_over(_format_size(owner, args, kwargs), what)
    elif name == "format_map" and args and isinstance(args[0], dict):
        _refuse_over(_format_size(owner, (), args[0]), what)
    return args


def check_binop(operator: str, left: Any, right: Any) -> None:
    """`+` of strings or sequences, `*` of one (its items' text counts: `[s] * n` printed is
    n copies of s) and `%` on a string, before they run."""
    if operator == "*":
        seq, times = (left, right) if isinstance(right, int) else (right, left)
        if isinstance(seq, str) and isinstance(times, int):
            _refuse_over(len(seq) * max(times, 0), "a '*' result")
        elif isinstance(seq, (list, tuple)) and isinstance(times, int):
            _refuse_over(sum(_length(i) for i in seq) * max(times, 0), "a '*' result")
    elif operator == "+" and isinstance(left, (str, list, tuple)) and isinstance(right, (str, list, tuple)):
        _refuse_over(len(left) + len(right), "a '+' result")
    elif operator == "%" and isinstance(left, str):
        _refuse_over(_percent_size(left, right), "a '%' result")


def concat(join: Any, parts: tuple) -> Any:
    """`a ~ b ~ ...`: the parts' text lengths are summed before they are joined."""
    texts = tuple(p if isinstance(p, str) else str(p) for p in parts)
    _refuse_over(sum(len(t) for t in texts), "a '~' result")
    return join(parts)


class CappedCodeGenerator(CodeGenerator):
    """Compiles `~` to `environment.raas_concat(<the join Jinja would use>, (parts))`."""

    def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:  # noqa: N802 - Jinja's visitor name
        if frame.eval_ctx.volatile:
            func_name = "(markup_join if context.eval_ctx.volatile else str_join)"
        elif frame.eval_ctx.autoescape:
            func_name = "markup_join"
        else:
            func_name = "str_join"
        self.write(f"environment.raas_concat({func_name}, (")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


def _capped_filters() -> dict[str, Any]:
    from jinja2 import filters as f

    def wrap(original: Any, check: Any) -> Any:
        @functools.wraps(original)  # keeps pass_eval_context / pass_environment markers
        def capped(*args: Any, **kwargs: Any) -> Any:
            return original(*check(*args, **kwargs))

        return capped

    def center(value: Any, width: int = 80) -> tuple:
        _refuse_over(max(_length(value), _int(width)), "the center filter")
        return value, width

    def indent(s: Any, width: Any = 4, first: bool = False, blank: bool = False) -> tuple:
        prefix = len(width) if isinstance(width, str) else _int(width)
        text = str(s)
        _refuse_over(len(text) + (text.count("\n") + 1) * prefix, "the indent filter")
        return s, width, first, blank

    def replace(ctx: Any, s: Any, old: Any, new: Any, count: Any = None) -> tuple:
        _refuse_over(_replace_size(str(s), old, new, count), "the replace filter")
        return ctx, s, old, new, count

    def join(ctx: Any, value: Any, d: str = "", attribute: Any = None) -> tuple:
        items = list(value)
        shown = items
        if attribute is not None:
            shown = list(map(f.make_attrgetter(ctx.environment, attribute), items))
        _refuse_over(sum(_length(i) for i in shown) + len(str(d)) * max(0, len(items) - 1), "the join filter")
        return ctx, items, d, attribute

    def wordwrap(
        env: Any,
        s: str,
        width: int = 79,
        break_long_words: bool = True,
        wrapstring: Any = None,
        break_on_hyphens: bool = True,
    ) -> tuple:
        extra = len(str(wrapstring)) if wrapstring is not None else 2
        _refuse_over(len(s) + (len(s) + 1) * extra, "the wordwrap filter")
        return env, s, width, break_long_words, wrapstring, break_on_hyphens

    capped = {
        "center": wrap(f.do_center, center),
        "indent": wrap(f.do_indent, indent),
        "replace": wrap(f.do_replace, replace),
        "join": wrap(f.do_join, join),
        "wordwrap": wrap(f.do_wordwrap, wordwrap),
    }

    @functools.wraps(f.do_format)
    def format_filter(value: str, *args: Any, **kwargs: Any) -> str:
        _refuse_over(_percent_size(str(value), kwargs or args), "the format filter")
        return f.do_format(value, *args, **kwargs)

    capped["format"] = format_filter
    return capped


def install(env_class: Any) -> None:
    """Cap `env_class` (and every environment made from it) as the module docstring says."""
    if getattr(env_class, "_raas_string_caps", False):
        return
    env_class.code_generator_class = CappedCodeGenerator
    env_class.raas_concat = staticmethod(concat)
    env_class.intercepted_binops = frozenset(env_class.intercepted_binops | {"+", "%"})
    base_binop, base_call, base_init = env_class.call_binop, env_class.call, env_class.__init__
    filters = _capped_filters()

    def call_binop(self: Any, context: Any, operator: str, left: Any, right: Any) -> Any:
        check_binop(operator, left, right)
        return base_binop(self, context, operator, left, right)

    def call(__self: Any, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        args = check_method(__obj, args, kwargs)
        return base_call(__self, __context, __obj, *args, **kwargs)

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:  # noqa: N807
        base_init(self, *args, **kwargs)
        self.filters.update(filters)

    env_class.call_binop, env_class.call, env_class.__init__ = call_binop, call, __init__
    env_class._raas_string_caps = True
