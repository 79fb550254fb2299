"""The inline-template check runs in a checker process of one thread, never forked from a threaded one.

A fork copies every lock as it stood. CI once refused a sound template as "wall time": the
bounded child, forked from the (threaded) gateway, waited on a lock another thread held at the
fork. Holding the render watchdog's lock in a thread here reproduced that every time before
the checker.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from agents.llm import template_budget, template_checker
from agents.llm.template_budget import TemplateOverBudget
from agents.llm.template_checker import CheckerPool, TemplateChecker
from agents.llm.template_checker import check_untrusted_template
from core.errors import InvalidRequest

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
SMOLLM2 = str(FIXTURES / "smollm2-tokenizer")
QWEN = (FIXTURES / "qwen-style-template" / "chat_template.jinja").read_text()
NESTED_RANGES = (
    "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    "{% for a in range(400) %}{% for b in range(400) %}{% for c in range(400) %}{% endfor %}"
    "{% endfor %}{% endfor %}"
)


@pytest.fixture
def checker():
    c = TemplateChecker()
    yield c
    c.close()


def test_a_lock_held_by_another_thread_does_not_fail_a_sound_template(checker) -> None:
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with template_budget._watchdog._lock:  # what a render in a gateway thread holds
            held.set()
            release.wait()

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    held.wait()
    try:
        reply = checker.check(SMOLLM2, QWEN)
    finally:
        release.set()
        thread.join()
    assert reply["verdict"] == "ok", reply
    assert reply["threads"] == 1  # the checker forked with nothing else running


def test_the_checker_still_refuses_what_the_bounded_child_refuses(checker) -> None:
    with pytest.raises(TemplateOverBudget, match="llm.chat_template_text: rendering a sample") as err:
        checker.check(SMOLLM2, NESTED_RANGES)
    assert err.value.details["field"] == "llm.chat_template_text"
    with pytest.raises(InvalidRequest, match="invalid or unsafe") as err:
        checker.check(SMOLLM2, "{% for %}")
    assert err.value.details["field"] == "llm.chat_template_text"
    assert not isinstance(err.value, TemplateOverBudget)
    with pytest.raises(InvalidRequest, match="llm.tokenizer: cannot load") as err:
        checker.check(str(FIXTURES / "no-such-tokenizer"), QWEN)
    assert err.value.details["field"] == "llm.tokenizer"
    assert checker.check(SMOLLM2, QWEN)["verdict"] == "ok"  # the checker outlived all three


def test_a_killed_checker_is_started_again(checker) -> None:
    assert checker.check(SMOLLM2, QWEN)["verdict"] == "ok"
    first = checker._proc
    first.kill()
    first.wait()
    assert checker.check(SMOLLM2, QWEN)["verdict"] == "ok"
    assert checker._proc is not None and checker._proc.pid != first.pid


def test_a_closed_stdin_stops_the_checker(checker) -> None:
    checker.check(SMOLLM2, QWEN)
    proc = checker._proc
    proc.stdin.close()  # what the gateway's exit does to it
    assert proc.wait(timeout=30) == 0


def test_a_forked_copy_starts_its_own_checker() -> None:
    """A process forked after a check (a prefork pool) must not share its parent's pipes."""
    check_untrusted_template(SMOLLM2, QWEN)
    [parent_checker] = template_checker._checker.pids()
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        code = 1
        try:
            check_untrusted_template(SMOLLM2, QWEN)
            [mine] = template_checker._checker.pids()
            os.write(write_fd, str(mine).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_fd)
    _, status = os.waitpid(pid, 0)
    child_checker = int(os.read(read_fd, 64) or b"0")
    os.close(read_fd)
    assert os.waitstatus_to_exitcode(status) == 0
    assert child_checker not in (0, parent_checker)
    check_untrusted_template(SMOLLM2, QWEN)
    assert template_checker._checker.pids() == [parent_checker]  # the parent's is untouched


def test_a_fork_while_a_thread_holds_the_watchdogs_lock_still_renders_in_the_child() -> None:
    """The render watchdog's lock is made afresh in a forked child (prefork pools fork too)."""
    from agents.llm.tokenizer import load_chat_tokenizer

    tok = load_chat_tokenizer(SMOLLM2, QWEN)
    tok.render([{"role": "user", "content": "hi"}])  # the watchdog thread runs here
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with template_budget._watchdog._lock:
            held.set()
            release.wait()

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    held.wait()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child answers with its exit status
        code = 1
        try:
            code = 0 if tok.render([{"role": "user", "content": "hi"}]).startswith("<|im_start|>user") else 2
        finally:
            os._exit(code)
    release.set()
    thread.join()
    for _ in range(300):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        threading.Event().wait(0.1)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail("the forked child hung on the watchdog's lock")
    assert os.waitstatus_to_exitcode(status) == 0


def test_one_owners_checks_wait_for_each_other_and_never_for_another_owners() -> None:
    """A tenant whose checks hold the checker (bomb templates: up to the child's wall deadline
    each) queues behind itself: another tenant's check runs on another checker meanwhile, and
    the first tenant's next check does not take that checker while its own turn is held."""
    pool = CheckerPool(size=2)
    try:
        pool.check(SMOLLM2, QWEN, owner="a")  # one warm checker
        [stuck] = pool.pids()
        os.kill(stuck, signal.SIGSTOP)  # owner a's first check will hang on it until SIGCONT
        results: dict[str, object] = {}

        def check(name: str, owner: str) -> threading.Thread:
            def run() -> None:
                results[name] = pool.check(SMOLLM2, QWEN, owner=owner)["verdict"]

            thread = threading.Thread(target=run, daemon=True)
            thread.start()
            return thread

        first = check("a1", "a")
        deadline = time.monotonic() + 30
        while pool._idle:  # a1 took the stopped checker
            assert time.monotonic() < deadline
            time.sleep(0.01)
        second = check("a2", "a")
        time.sleep(0.5)
        check("b", "b").join(timeout=60)
        assert results == {"b": "ok"}  # b was answered while both of a's waited
        assert first.is_alive() and second.is_alive()
        assert len(pool.pids()) == 2  # b's checker, now idle: a2 waits for a's turn, not for it
        os.kill(stuck, signal.SIGCONT)
        first.join(timeout=60)
        second.join(timeout=60)
        assert results == {"a1": "ok", "a2": "ok", "b": "ok"}
        assert len(pool.pids()) == 2 and pool._turns == {}  # no owner's turn is left behind
    finally:
        for pid in pool.pids():
            os.kill(pid, signal.SIGCONT)
        pool.close()


def test_a_full_pool_makes_the_next_owner_wait_for_a_checker() -> None:
    pool = CheckerPool(size=1)
    try:
        pool.check(SMOLLM2, QWEN, owner="a")
        [stuck] = pool.pids()
        os.kill(stuck, signal.SIGSTOP)
        done: list[str] = []
        threads = [
            threading.Thread(target=lambda o=o: done.append(pool.check(SMOLLM2, QWEN, owner=o)["verdict"]), daemon=True)
            for o in ("a", "b")
        ]
        for thread in threads:
            thread.start()
            time.sleep(0.3)
        assert done == [] and pool.pids() == [stuck]  # b waits: no second checker past the size
        os.kill(stuck, signal.SIGCONT)
        for thread in threads:
            thread.join(timeout=60)
        assert done == ["ok", "ok"] and pool.pids() == [stuck]
    finally:
        for pid in pool.pids():
            os.kill(pid, signal.SIGCONT)
        pool.close()
