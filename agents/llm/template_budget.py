"""Untrusted chat templates run with a budget: a bounded child at submission, a deadline after.

Jinja's sandbox stops escapes but not cost: nested `range()` loops rendered 64 M iterations in
4.4 s inside one gateway request, and `'x' * 50000000` was accepted (issue 22.6). Two layers:

- `check_template`: at submission, an inline template is rendered on a sample conversation
  (system, user, assistant with a tool call, tool result; tool schemas) in a forked child with
  RLIMIT_CPU and RLIMIT_AS limits and a wall deadline. A render over budget, a template that
  does not compile or one the sandbox refuses is `InvalidRequest` naming
  `llm.chat_template_text` (a 400), never a stuck request thread. It forks, so it runs in a
  process of one thread: the gateway asks `template_checker`'s process.
- `render_budget`: every later render (workers, each turn) is in-process, where a child per
  turn would cost too much: `range()` is capped at `MAX_RANGE` items, strings a template
  builds are capped before they are allocated (`template_caps`), and a render that runs
  past `RENDER_SECONDS` gets `TemplateOverBudget` raised inside it (the pure-Python loop
  Jinja compiles to sees it at its next bytecode). The cost per render is one dict insert and
  delete under a lock; the watchdog thread polls every `WATCH_INTERVAL` seconds.
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from core.errors import InvalidRequest

FIELD = "llm.chat_template_text"
CHILD_CPU_SECONDS = 2  # the hard limit (RLIMIT_CPU counts whole seconds)
CHILD_BUDGET_CPU = 0.5  # the budget: real templates render the sample in a few ms
# The whole child (fork, template setup, sample) takes a few ms of CPU honestly; the wall
# deadline only stops a child that cannot run (RLIMIT_CPU stops one that computes), so it is
# generous: on a loaded node a few ms of CPU can take seconds of wall time.
CHILD_WALL_SECONDS = 10.0
CHILD_MEMORY_BYTES = 512 * 1024 * 1024  # on top of what the process already maps
MAX_OUTPUT_CHARS = 4 * 1024 * 1024
RENDER_SECONDS = 5.0
MAX_RANGE = 10_000
WATCH_INTERVAL = 0.05

SAMPLE_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a command",
            "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
        },
    }
]
SAMPLE_MESSAGES = [
    {"role": "system", "content": "You are a helpful agent."},
    {"role": "user", "content": "List the files."},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": "bash", "arguments": {"cmd": "ls"}}}],
    },
    {"role": "tool", "content": "a.txt\nb.txt", "name": "bash"},
    {"role": "assistant", "content": "Two files."},
]


class TemplateOverBudget(InvalidRequest):
    """An untrusted chat template used more time or memory than its budget."""


class _Interrupt(BaseException):
    """Raised inside a render past its deadline (a BaseException: no `except Exception` on
    the way out swallows it); `render_budget` turns it into TemplateOverBudget."""


def _cap_jinja_ranges() -> None:
    """Lower the sandbox's `range()` cap and refuse `*` / `**` results larger than the
    output cap (process-wide, for every sandboxed template: chat templates are the only ones
    this process compiles; it must run before they compile, so it runs at import)."""
    import jinja2.sandbox
    from jinja2.sandbox import ImmutableSandboxedEnvironment as Env

    jinja2.sandbox.MAX_RANGE = min(jinja2.sandbox.MAX_RANGE, MAX_RANGE)
    if getattr(Env, "_raas_capped", False):
        return
    from agents.llm.template_caps import install
    from agents.llm.template_render import install_fast_lookups

    install(Env)  # string-producing operators, filters and methods: capped before allocating
    install_fast_lookups(Env)  # the same lookups and verdicts, cheaper (speed only)
    Env.intercepted_binops = frozenset(Env.intercepted_binops | {"*", "**"})
    base = Env.call_binop

    def call_binop(self: Any, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "*":
            size, times = (left, right) if isinstance(right, int) else (right, left)
            if isinstance(size, (str, list, tuple)) and isinstance(times, int) and len(size) * times > MAX_OUTPUT_CHARS:
                raise jinja2.sandbox.SecurityError(f"a repeated sequence longer than {MAX_OUTPUT_CHARS} items")
        elif (
            operator == "**" and isinstance(right, int) and abs(right) > 64 and isinstance(left, int) and abs(left) > 1
        ):
            raise jinja2.sandbox.SecurityError("a power with an exponent above 64")
        return base(self, context, operator, left, right)

    Env.call_binop = call_binop
    Env._raas_capped = True


def check_template(render_sample: Callable[[], str]) -> None:
    """Run `render_sample` (it renders the untrusted template) in a forked child with CPU,
    memory and wall limits; InvalidRequest naming `llm.chat_template_text` if it fails."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: limits first, then the untrusted work, then _exit
        os.close(read_fd)
        code = _child(render_sample, write_fd)
        os._exit(code)
    os.close(write_fd)
    try:
        message, status, cpu = _wait_child(pid, read_fd)
    finally:
        os.close(read_fd)
    if status == 0 and not message and cpu > CHILD_BUDGET_CPU:
        message = f"{cpu:.2f} s CPU"
    if status == 0 and not message:
        return
    if message.startswith("invalid:"):
        raise InvalidRequest(
            f"{FIELD}: the template is invalid or unsafe: {message.removeprefix('invalid:')[:300]}", field=FIELD
        )
    raise TemplateOverBudget(
        f"{FIELD}: rendering a sample conversation went over the budget "
        f"({CHILD_BUDGET_CPU} s CPU, {CHILD_MEMORY_BYTES // 2**20} MiB, "
        f"{MAX_OUTPUT_CHARS} characters){': ' + message if message else ''}",
        field=FIELD,
    )


def _child(render_sample: Callable[[], str], write_fd: int) -> int:
    try:
        signal.signal(signal.SIGXCPU, signal.SIG_DFL)
        resource.setrlimit(resource.RLIMIT_CPU, (CHILD_CPU_SECONDS, CHILD_CPU_SECONDS + 1))
        mapped = _mapped_bytes()
        resource.setrlimit(resource.RLIMIT_AS, (mapped + CHILD_MEMORY_BYTES,) * 2)
        global RENDER_SECONDS
        RENDER_SECONDS = CHILD_WALL_SECONDS  # the parent's wall deadline bounds the child
        _cap_jinja_ranges()
        text = render_sample()
        result = "" if len(text) <= MAX_OUTPUT_CHARS else f"{len(text)} characters rendered"
    except MemoryError:
        result = "out of memory"
    except TemplateOverBudget as exc:
        result = exc.message.removeprefix(f"{FIELD}: ")
    except RecursionError:
        result = "recursion too deep"
    except BaseException as exc:  # noqa: BLE001 - the template's error goes to the parent
        result = f"invalid:{type(exc).__name__}: {exc}"
    try:
        os.write(write_fd, result.encode()[:2000])
    except OSError:
        pass
    return 0 if not result else 3


def _mapped_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def _wait_child(pid: int, read_fd: int) -> tuple[str, int, float]:
    """(what the child wrote, its exit status, its CPU seconds); killed at the wall deadline."""
    deadline = time.monotonic() + CHILD_WALL_SECONDS
    while True:
        done, status, usage = os.wait4(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return "wall time", -1, 0.0
        time.sleep(0.005)
    data = b""
    while chunk := os.read(read_fd, 4096):
        data += chunk
    cpu = usage.ru_utime + usage.ru_stime
    if os.WIFSIGNALED(status):
        return f"stopped by signal {signal.Signals(os.WTERMSIG(status)).name}", -1, cpu
    return data.decode(errors="replace"), os.WEXITSTATUS(status), cpu


class _Watchdog:
    """One thread per process that raises TemplateOverBudget in renders past their deadline."""

    def __init__(self) -> None:
        self._deadlines: dict[int, float] = {}
        self._fired: set[int] = set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def enter(self, ident: int, seconds: float) -> None:
        with self._lock:
            self._deadlines[ident] = time.monotonic() + seconds
            if self._thread is None or not self._thread.is_alive():  # first use, or forked
                self._thread = threading.Thread(target=self._run, name="raas-template-budget", daemon=True)
                self._thread.start()

    def leave(self, ident: int) -> bool:
        """Forget `ident`; True when its deadline fired (any pending exception is cleared)."""
        with self._lock:
            self._deadlines.pop(ident, None)
            fired = ident in self._fired
            self._fired.discard(ident)
        if fired:
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), None)
        return fired

    def after_fork(self) -> None:
        """In a forked child: the lock afresh (another thread may have held it at the fork),
        no deadlines (the threads that set them are not here), the thread started on next use."""
        self._lock = threading.Lock()
        self._deadlines.clear()
        self._fired.clear()
        self._thread = None

    def _run(self) -> None:
        while True:
            time.sleep(WATCH_INTERVAL)
            now = time.monotonic()
            with self._lock:
                for ident, deadline in list(self._deadlines.items()):
                    if deadline < now and ident not in self._fired:
                        self._fired.add(ident)
                        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(_Interrupt))


_watchdog = _Watchdog()
os.register_at_fork(after_in_child=_watchdog.after_fork)


@contextmanager
def render_budget(seconds: float | None = None) -> Iterator[None]:
    """Renders in this block stop with TemplateOverBudget after `seconds` (RENDER_SECONDS)."""
    from agents.llm.template_caps import reset

    seconds = seconds or RENDER_SECONDS
    ident = threading.get_ident()
    reset()  # the per-render total of strings the template builds
    _watchdog.enter(ident, seconds)
    try:
        yield
    except _Interrupt:
        _watchdog.leave(ident)
        raise TemplateOverBudget(f"{FIELD}: rendering took longer than {seconds} s", field=FIELD) from None
    except BaseException:
        # The template's own error (`raise_exception`, a bad value): the deadline goes with
        # it, or it would fire later into whatever runs on this thread, or on a new thread
        # that got its id.
        _watchdog.leave(ident)
        raise
    if _watchdog.leave(ident):
        raise TemplateOverBudget(f"{FIELD}: rendering took longer than {seconds} s", field=FIELD)


def capped_output(text: str) -> str:
    """`text` if within the output cap, else TemplateOverBudget."""
    if len(text) > MAX_OUTPUT_CHARS:
        raise TemplateOverBudget(
            f"{FIELD}: the template rendered {len(text)} characters (cap {MAX_OUTPUT_CHARS})", field=FIELD
        )
    return text


_cap_jinja_ranges()


def render_sample(tokenizer: Any) -> str:
    """The sample conversation through `tokenizer` (a ChatTokenizer), for `check_template`."""
    return tokenizer.render(SAMPLE_MESSAGES, tools=SAMPLE_TOOLS, add_generation_prompt=True)
