"""The persistent grading process: imported once, per-call timeout, restart after a crash."""

from __future__ import annotations

import threading
import time

import pytest

from agents.handlers.math import answer as math_answer
from agents.warm_worker import WarmWorker, WorkerFailed, warm_pool


def test_a_call_past_its_timeout_kills_the_process_and_the_next_call_restarts_it():
    worker = WarmWorker("time:sleep")
    try:
        worker.call({"args": [0]}, timeout=60)
        first = worker.proc.pid
        started = time.monotonic()
        with pytest.raises(WorkerFailed, match="timed out"):
            worker.call({"args": [30]}, timeout=1)
        assert time.monotonic() - started < 10 and worker.proc is None
        assert worker.call({"args": [0]}, timeout=60) is None
        assert worker.proc.pid != first and worker.restarts == 1
    finally:
        worker.kill()


def test_a_crashing_grader_is_reported_and_replaced():
    worker = WarmWorker("os:_exit")
    try:
        with pytest.raises(WorkerFailed, match="died"):
            worker.call({"args": [3]}, timeout=60)
        with pytest.raises(WorkerFailed, match="died"):
            worker.call({"args": [3]}, timeout=60)
        assert worker.restarts == 1
    finally:
        worker.kill()


def test_a_grader_exception_keeps_the_process():
    worker = WarmWorker("json:loads")
    try:
        with pytest.raises(WorkerFailed, match="JSONDecodeError"):
            worker.call({"args": ["{"]}, timeout=60)
        pid = worker.proc.pid
        assert worker.call({"args": ["[1]"]}, timeout=60) == [1]
        assert worker.proc.pid == pid
    finally:
        worker.kill()


def test_math_grading_off_the_main_thread_reuses_one_warm_process():
    results: list = []

    def grade() -> None:
        for answer in ("sqrt(6)/4", "\\frac{\\sqrt{6}}{4}", "0.6124", "sqrt(6)/3"):
            started = time.monotonic()
            grade = math_answer.grade_math_answer(answer, "\\frac{\\sqrt{6}}{4}")
            results.append((grade.reward, time.monotonic() - started))

    thread = threading.Thread(target=grade)
    thread.start()
    thread.join(300)
    assert [r for r, _ in results] == [1.0, 1.0, 0.0, 0.0]
    assert max(seconds for _, seconds in results[1:]) < 1.0  # warm: no interpreter start
    pool = warm_pool(math_answer._WARM_TARGET)
    assert pool.idle.qsize() == 2 and sum(w.proc is not None for w in pool.idle.queue) == 1
