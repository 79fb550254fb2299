"""`raas results JOB --follow --out F` resumes a follow: a torn last line is repaired, only
rollouts F lacks are appended, another job's file is refused; `raas submit --wait` ends a lost
follow in one line that says how to resume."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from raas_client.cli import results
from raas_client.follow import ResultsFile, ResultsFileError
from raas_client import RolloutView
from tests.test_sdk_retry import ScriptedGateway, job_view, rollout_row, status


def row(seq: int, job: str = "j") -> RolloutView:
    return RolloutView.model_validate(rollout_row(seq, job))


def line(seq: int, job: str = "j") -> str:
    return row(seq, job).model_dump_json()


def test_torn_last_line_is_cut_and_the_cursor_is_the_gapless_prefix(tmp_path):
    out = tmp_path / "f.jsonl"
    lines = [line(s) for s in (1, 2, 4)]  # 3 missing: cursor stops at 2
    out.write_text("\n".join(lines) + '\n{"rollout_id": "r5", "jo')
    f = ResultsFile.open(out, "j")
    assert f.cursor == 2 and f.ids == {"r1", "r2", "r4"} and f.repaired > 0
    assert f.add(row(3)) and not f.add(row(4)) and f.add(row(5))
    f.close()
    got = [json.loads(line)["seq"] for line in out.read_text().splitlines()]
    assert got == [1, 2, 4, 3, 5]


def test_another_jobs_file_or_a_corrupt_middle_line_is_refused(tmp_path):
    out = tmp_path / "f.jsonl"
    out.write_text(line(1, job="other") + "\n")
    with pytest.raises(ResultsFileError, match="holds rollouts of job other, not j"):
        ResultsFile.open(out, "j")
    out.write_text("garbage\n" + line(1) + "\n")
    with pytest.raises(ResultsFileError, match="f.jsonl:1: not JSON"):
        ResultsFile.open(out, "j")
    assert ResultsFile.open(out, "j", fresh=True).ids == set()  # a new submission starts over


def test_follow_appends_only_what_the_file_lacks(tmp_path):
    out = tmp_path / "f.jsonl"
    out.write_text(line(1) + "\n" + line(2)[:20])
    items = [rollout_row(s, prompt_ids=[1, 2]) for s in (2, 3)]
    gw = ScriptedGateway(
        [
            status(200, {"ok": True}),  # /healthz
            status(200, job_view(n_rollouts=3)),  # GET /v1/jobs/j
            status(503),  # restarting
            status(200, {"job_id": "j", "items": items, "cursor": 3, "done": True}),
        ]
    )
    res = CliRunner().invoke(
        results, ["j", "--follow", "--out", str(out), "--url", gw.url], env={"RAAS_RETRY_TOTAL": "20"}
    )
    gw.server.shutdown()
    assert res.exit_code == 0, res.output
    assert [args.get("after") for _, path, args in gw.seen if path.endswith("/results")] == ["1", "1"]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["seq"] for r in rows] == [1, 2, 3] and rows[2]["prompt_ids"] == [1, 2]
    assert "job j done: 3 rollouts" in res.output


def test_a_follow_that_loses_the_gateway_says_how_to_resume(tmp_path):
    out = tmp_path / "f.jsonl"
    gw = ScriptedGateway([status(200, {"ok": True}), status(200, job_view(n_rollouts=3))] + [status(503)] * 100)
    res = CliRunner().invoke(
        results, ["j", "--follow", "--out", str(out), "--url", gw.url], env={"RAAS_RETRY_TOTAL": "1"}
    )
    gw.server.shutdown()
    assert res.exit_code == 1 and "Traceback" not in res.output
    assert "stopped following job j" in res.output and "for 1s (RAAS_RETRY_TOTAL)" in res.output
    assert f"resume with `raas results j --follow --out {out}`" in res.output
