"""Grading `code` solutions by behaviour compared on the host, never by what the solution says.

Two kinds of hidden test, both run in the fresh EVAL sandbox, one process per test:

- **input/output** (`{"input": ..., "output": ...}`, the format of APPS, CodeContests, TACO,
  DeepCoder): the solution runs as a script with the input on stdin; its stdout is read back
  and compared on the host (trailing whitespace per line and trailing blank lines ignored).
- **call** (`{"call": "f(3)", "expected": "[1, 2]", "setup": "...", "raises": "ValueError"}`):
  a harness imports the solution, runs `setup`, evaluates `call` and writes the value back as
  tagged JSON; the host decodes it and compares it with `expected` (a Python literal). With
  `raises`, the call must raise that exception.

The expected output never enters the sandbox, no marker exists that a run could print, and the
exit status decides nothing: whatever the solution prints or forges, it would have to produce
the right values, which is solving the task. Legacy assert snippets (`assert f(3) == [1, 2]`,
`assert f(x)`, `assert not f(x)`) are read as call tests; other snippets are refused at
submission because they could only be graded by trusting the solution's process.
"""

from __future__ import annotations

import ast
import json
import secrets
import shlex
from typing import Any

from core.errors import InvalidRequest

MAX_VALUE_CHARS = 8 * 1024 * 1024
HARNESS_NAME = ".raas_harness.py"
# Runs in the sandbox with `python3 -I`; reads {"module", "setup", "call"} on stdin and writes
# one JSON line with the tagged value (or the raised exception's class names) to the original
# stdout, which the solution no longer holds (its prints go to /dev/null).
HARNESS = r'''
import json, os, sys
_out = os.fdopen(os.dup(1), "w")
_null = os.open(os.devnull, os.O_WRONLY)
os.dup2(_null, 1)
_req = json.loads(sys.stdin.read())
_dumps = json.dumps


def _tag(v, depth=0):
    if depth > 100:
        raise ValueError("value nested too deeply")
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, int):
        return {"int": str(int(v))}
    if isinstance(v, float):
        return {"float": float.__repr__(float(v))}
    if isinstance(v, complex):
        return {"complex": [float(v.real).__repr__(), float(v.imag).__repr__()]}
    if isinstance(v, bytes):
        return {"bytes": list(bytes(v))}
    if isinstance(v, (list, tuple, set, frozenset)):
        kind = "list" if isinstance(v, list) else "tuple" if isinstance(v, tuple) else \
            "frozenset" if isinstance(v, frozenset) else "set"
        return {kind: [_tag(x, depth + 1) for x in list(v)]}
    if isinstance(v, dict):
        return {"dict": [[_tag(k, depth + 1), _tag(x, depth + 1)] for k, x in list(v.items())]}
    raise TypeError("cannot return a %s" % type(v).__name__)


def raised(fn, *args, **kwargs):
    """Name of the exception fn(*args) raises, or None (for tests of several bad inputs)."""
    try:
        fn(*args, **kwargs)
    except Exception as exc:
        return type(exc).__name__
    return None


sys.path.insert(0, os.getcwd())
_env = {"raised": raised}
try:
    exec("from %s import *" % _req["module"], _env)
    exec(_req.get("setup") or "", _env)
    _result = {"value": _tag(eval(_req["call"], _env))}
except BaseException as exc:
    _result = {"raised": [c.__name__ for c in type(exc).__mro__]}
_out.write(_dumps(_result) + "\n")
_out.flush()
os._exit(0)
'''


def normalize_tests(raw: Any) -> list[dict[str, Any]]:
    """The instance's hidden tests as typed dicts; raises InvalidRequest naming the test."""
    if not isinstance(raw, list) or not raw:
        raise InvalidRequest("code instance needs a non-empty list 'hidden_tests'", field="instance.hidden_tests")
    return [_normalize_one(test, i) for i, test in enumerate(raw, start=1)]


def _normalize_one(test: Any, i: int) -> dict[str, Any]:
    field = f"instance.hidden_tests[{i - 1}]"
    if isinstance(test, str):
        test = {"code": test}
    if not isinstance(test, dict):
        raise InvalidRequest(
            "each hidden test is an object (input/output or call/expected) or an assert snippet", field=field
        )
    name = str(test.get("name") or f"test_{i}")
    if "input" in test or "output" in test:
        if not isinstance(test.get("input"), str) or not isinstance(test.get("output"), str):
            raise InvalidRequest("an input/output test needs string 'input' and 'output'", field=field)
        return {"name": name, "kind": "io", "input": test["input"], "output": test["output"]}
    if "code" in test:
        if not isinstance(test["code"], str):
            raise InvalidRequest("a test's 'code' must be a string", field=field)
        return {"name": name, **_from_assert(test["code"], field)}
    call, setup = test.get("call"), test.get("setup") or ""
    if not isinstance(call, str) or not isinstance(setup, str):
        raise InvalidRequest("a call test needs a string 'call' (and optional 'setup')", field=field)
    _parse(call, "eval", field)
    _parse(setup, "exec", field)
    if "raises" in test:
        if not isinstance(test["raises"], str) or not test["raises"].isidentifier():
            raise InvalidRequest("'raises' must be an exception class name", field=field)
        return {"name": name, "kind": "call", "setup": setup, "call": call, "raises": test["raises"]}
    expected = test.get("expected")
    if not isinstance(expected, str):
        raise InvalidRequest("a call test needs 'expected' as a Python literal string", field=field)
    _literal(expected, field)
    return {"name": name, "kind": "call", "setup": setup, "call": call, "expected": expected}


def _parse(source: str, mode: str, field: str) -> ast.AST:
    try:
        return ast.parse(source, mode=mode)
    except SyntaxError as exc:
        raise InvalidRequest(f"test code does not parse: {exc.msg}", field=field) from None


def _literal(source: str, field: str) -> Any:
    try:
        return ast.literal_eval(source)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        raise InvalidRequest("'expected' must be a Python literal", field=field) from None


def _from_assert(code: str, field: str) -> dict[str, Any]:
    """`assert E == LITERAL`, `assert E`, `assert not E` as a call test; anything else refused."""
    tree = _parse(code, "exec", field)
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.Assert):
        raise InvalidRequest(
            "assert snippets are graded only as one `assert CALL == LITERAL`, `assert CALL` or "
            "`assert not CALL`; give other tests as {call, expected, setup} or input/output",
            field=field,
        )
    test = tree.body[0].test
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq):
        expected = ast.get_source_segment(code, test.comparators[0]) or ""
        _literal(expected, field)
        return {"kind": "call", "setup": "", "expected": expected, "call": ast.get_source_segment(code, test.left)}
    negate = isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not)
    inner = test.operand if negate else test
    return {
        "kind": "call",
        "setup": "",
        "expected": "False" if negate else "True",
        "call": f"bool({ast.get_source_segment(code, inner)})",
    }


def decode_value(tagged: Any, depth: int = 0) -> Any:
    """A value tagged by the harness as plain Python (only builtin types can come out)."""
    if depth > 100:
        raise ValueError("value nested too deeply")
    if tagged is None or isinstance(tagged, (bool, str)):
        return tagged
    if not isinstance(tagged, dict) or len(tagged) != 1:
        raise ValueError("not a tagged value")
    ((kind, raw),) = tagged.items()
    if kind == "int":
        return int(raw)
    if kind == "float":
        return float(raw)
    if kind == "complex":
        return complex(float(raw[0]), float(raw[1]))
    if kind == "bytes":
        return bytes(raw)
    items = {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}
    if kind in items:
        return items[kind](decode_value(x, depth + 1) for x in raw)
    if kind == "dict":
        return {decode_value(k, depth + 1): decode_value(v, depth + 1) for k, v in raw}
    raise ValueError(f"unknown tag {kind!r}")


def same_output(got: str, expected: str) -> bool:
    """Contest-style stdout equality: trailing spaces per line and trailing blank lines ignored."""

    def lines(text: str) -> list[str]:
        out = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
        while out and not out[-1]:
            out.pop()
        return out

    return lines(got) == lines(expected)


def run_test(sb: Any, workspace: str, module: str, script: str, test: dict[str, Any], timeout: float) -> str:
    """passed / failed / timeout for one hidden test, in a fresh process of the sandbox."""
    sb.reset()  # nothing a previous test's process left running may touch this one
    tag = secrets.token_hex(6)
    stdin, stdout = f".raas_in_{tag}", f".raas_out_{tag}"
    cd = f"cd {shlex.quote(workspace)} && "
    if test["kind"] == "io":
        sb.write_file(f"{workspace}/{stdin}", test["input"])
        command = f"python3 -I -B {shlex.quote(script)} < {stdin} > {stdout} 2>/dev/null"
    else:
        sb.write_file(f"{workspace}/{HARNESS_NAME}", HARNESS)
        sb.write_file(
            f"{workspace}/{stdin}", json.dumps({"module": module, "setup": test["setup"], "call": test["call"]})
        )
        command = f"python3 -I -B {HARNESS_NAME} < {stdin} 2>/dev/null"
    try:
        result = sb.bash(cd + command, timeout=timeout)
        if result.timed_out:
            return "timeout"
        if test["kind"] == "io":
            return "passed" if same_output(_read(sb, f"{workspace}/{stdout}"), test["output"]) else "failed"
        return "passed" if _call_passed(result.output, test) else "failed"
    finally:
        sb.bash(cd + f"rm -f {stdin} {stdout} {HARNESS_NAME}", timeout=10)


def _read(sb: Any, path: str) -> str:
    try:
        return sb.read_file(path)
    except Exception:  # noqa: BLE001 - no output file, not text: the test failed
        return "\0no output"


def _call_passed(output: str, test: dict[str, Any]) -> bool:
    """Compare the harness's last line with the expectation, on the host."""
    lines = [line for line in output.strip().splitlines() if line.strip()]
    if not lines or len(lines[-1]) > MAX_VALUE_CHARS:
        return False
    try:
        answer = json.loads(lines[-1])
        if "raises" in test:
            return test["raises"] in (answer.get("raised") or [])
        if "value" not in answer:
            return False
        return bool(decode_value(answer["value"]) == ast.literal_eval(test["expected"]))
    except (ValueError, TypeError, AttributeError, RecursionError, MemoryError, SyntaxError):
        return False
