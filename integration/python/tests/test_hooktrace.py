"""orbitkv.hooktrace without an engine: a step's line, the off switch, a
trace that cannot be written, and the summary the GPU scripts print."""

from __future__ import annotations

import json
import time

from orbitkv import hooktrace
from orbitkv.hooktrace import HookTrace


def test_off_by_default_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.delenv(hooktrace.ENV, raising=False)
    t = HookTrace("worker")
    with t.hook("start_load_kv"):
        pass
    t.note("load_start", "r1")
    t.end_step()
    assert not t.enabled and not list(tmp_path.iterdir())


def test_a_step_is_one_line_with_its_hooks_and_notes(tmp_path):
    t = HookTrace("scheduler", str(tmp_path))
    t.end_step()  # no hook ran: no line
    with t.hook("get_num_new_matched_tokens"):
        pass
    with t.hook("get_num_new_matched_tokens"):
        pass
    t.note("lookups", {"req": "r1", "computed": 0, "tokens": 128, "async": True})
    t.note("loads", {"req": "r1", "sync": False})
    t.end_step()
    with t.hook("build_connector_meta"):
        pass
    t.note("scheduled", {"req": "r1", "tokens": 16})
    t.end_step()
    t.close()  # lines are buffered (flushed once a second, and at exit)
    lines = [json.loads(x) for x in open(t.path)]
    assert len(lines) == 2
    assert set(lines[0]["hooks"]) == {"get_num_new_matched_tokens"} and lines[0]["loads"][0]["req"] == "r1"
    assert lines[0]["t0"] <= lines[0]["t1"] <= lines[1]["t1"]
    assert "lookups" not in lines[1]  # notes belong to their step
    events = [w for _, w in hooktrace.timelines(hooktrace.read_lines(str(tmp_path)))["r1"]]
    assert [e.split(" {")[0] for e in events] == ["scheduler lookups", "scheduler loads", "scheduler scheduled"]


def test_a_trace_that_cannot_be_written_stops_and_the_caller_goes_on(tmp_path):
    t = HookTrace("worker", str(tmp_path))
    (tmp_path / f"hooks-worker-{__import__('os').getpid()}.jsonl").mkdir()  # the path is a directory now
    with t.hook("wait_for_save"):
        pass
    t.end_step()
    assert not t.enabled


def test_the_summary_prints_totals_and_timelines(tmp_path, capsys):
    t = HookTrace("worker", str(tmp_path))
    with t.hook("start_load_kv"):
        pass
    t.note("recving", "r9")
    t.end_step()
    t.close()
    assert hooktrace.main([str(tmp_path / "none")]) == 1
    assert hooktrace.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "1 steps" in out and "worker.start_load_kv" in out
    assert "request r9" not in out  # no lookup offered it tokens: no timeline


def test_lines_are_buffered_and_written_out_by_the_flusher_and_at_close(tmp_path, monkeypatch):
    """The file stays open: lines reach it when the flusher runs (every
    FLUSH_S), or at close; a step after close opens it again."""
    monkeypatch.setattr(hooktrace, "FLUSH_S", 3600.0)  # the flusher never runs by itself here
    t = HookTrace("worker", str(tmp_path))
    for _ in range(3):
        with t.hook("wait_for_save"):
            pass
        t.end_step()
    assert open(t.path).read() == "", "buffered: nothing written before a flush"
    t.flush()  # what the flusher thread does every FLUSH_S
    assert len(open(t.path).read().splitlines()) == 3
    with t.hook("wait_for_save"):
        pass
    t.end_step()
    t.close()
    assert len(open(t.path).read().splitlines()) == 4
    with t.hook("wait_for_save"):  # a step after close opens the file again
        pass
    t.end_step()
    t.close()
    assert len(open(t.path).read().splitlines()) == 5


def test_the_flusher_writes_lines_out_while_the_engine_idles(tmp_path, monkeypatch):
    monkeypatch.setattr(hooktrace, "FLUSH_S", 0.01)
    t = HookTrace("scheduler", str(tmp_path))
    with t.hook("build_connector_meta"):
        pass
    t.end_step()  # then no step for a while: an idle engine
    deadline = time.monotonic() + 60  # a bound only: the flusher runs every 10 ms
    while open(t.path).read() == "" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(open(t.path).read().splitlines()) == 1
    t.close()


def test_requests_are_told_apart_by_kind_and_a_resident_ones_steps_are_listed(capsys, tmp_path):
    """restored (the lookup offered tokens), resident (vLLM held a prefix, nothing offered),
    miss: each from its lookup step to the next step that schedules it."""
    S, W = "scheduler", "worker"
    lines = [
        {"side": S, "t0": 10.000, "t1": 10.002, "hooks": {"get_num_new_matched_tokens": 1.5},
         "lookups": [{"req": "res", "computed": 8176, "tokens": 0, "async": False}],
         "scheduled": [{"req": "res", "tokens": 16}]},
        {"side": W, "t0": 10.003, "t1": 10.008, "hooks": {"wait_for_save": 0.01}},
        {"side": S, "t0": 10.010, "t1": 10.011, "hooks": {}, "scheduled": [{"req": "res", "tokens": 1}]},
        {"side": S, "t0": 20.000, "t1": 20.001, "hooks": {},
         "lookups": [{"req": "rst", "computed": 0, "tokens": 8128, "async": True}]},
        {"side": S, "t0": 20.005, "t1": 20.006, "hooks": {}, "scheduled": [{"req": "rst", "tokens": 64}]},
        {"side": S, "t0": 20.040, "t1": 20.041, "hooks": {}, "scheduled": [{"req": "rst", "tokens": 1}]},
        {"side": S, "t0": 30.000, "t1": 30.001, "hooks": {},  # scheduled once only: left out
         "lookups": [{"req": "one", "computed": 0, "tokens": 0, "async": False}], "scheduled": [{"req": "one", "tokens": 8}]},
    ]
    steps = hooktrace.request_steps(lines)
    assert set(steps) == {"res", "rst"} and steps["res"][0] == "resident" and steps["rst"][0] == "restored"
    kinds = hooktrace.kind_summary(lines)
    assert [round(x, 3) for x in kinds["resident"]] == [10.0] and [round(x, 3) for x in kinds["restored"]] == [40.0]
    win = hooktrace.step_window(lines, "res")
    assert [(w[2], w[0]) for w in win] == [("scheduler", 0.0), ("worker", 3.0), ("scheduler", 10.0)]
    assert win[0][3] == {"get_num_new_matched_tokens": 1.5} and win[1][3] == {}  # hooks over 0.05 ms only
    with open(tmp_path / "hooks-all-1.jsonl", "w") as f:
        f.write("".join(json.dumps(d) + "\n" for d in lines))
    assert hooktrace.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "resident  requests    1" in out and "resident request res, its steps" in out
