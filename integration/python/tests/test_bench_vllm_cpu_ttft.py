"""orbitkv.bench.vllm_cpu_ttft's report: each phase's p50 beside native's, and the
connector's hook time a request from the hook trace."""

import json
import os

from orbitkv.bench import vllm_cpu_ttft as b


def _rows(ms_by_phase, t=1000.0):
    rows = []
    for i, (phase, ms) in enumerate((p, m) for p, ms in ms_by_phase.items() for m in ms):
        rows.append({"rep": i, "phase": phase, "ms": ms, "t0": t + i, "t1": t + i + 0.5})
    return rows


def test_report_puts_each_config_beside_native():
    runs = [
        {"config": "native", "run": 1, "rows": _rows({"resident": [10, 10, 12], "evicted": [100, 100, 100]}), "hooks": {}},
        {"config": "orbitkv", "run": 1, "rows": _rows({"resident": [12, 12, 14], "evicted": [40, 40, 40]}),
         "hooks": {"resident": 1.5, "evicted": 3.0}},
    ]
    out = b.report(runs).splitlines()
    res = [l.split() for l in out if " resident " in l]
    assert res[0][:2] == ["native", "resident"] and float(res[0][3]) == 10.0 and float(res[0][5]) == 1.0
    assert res[1][:2] == ["orbitkv", "resident"] and float(res[1][3]) == 12.0 and float(res[1][5]) == 1.2
    assert float(res[1][-1]) == 1.5
    ev = [l.split() for l in out if " evicted " in l]
    assert float(ev[1][5]) == 0.4 and float(ev[1][-1]) == 3.0


def test_report_splits_queue_and_first_step_where_vllm_timed_them():
    rows = _rows({"resident": [12, 12, 14]})
    for r, (q, f) in zip(rows, ((1, 10), (2, 10), (3, 12))):
        r.update(queued_ms=q, first_step_ms=f)
    out = b.report([{"config": "orbitkv", "run": 1, "rows": rows, "hooks": {}}])
    line = next(l for l in out.splitlines() if " resident " in l).split()
    assert line[-3:] == ["2.00", "/", "10.00"]


def test_hook_ms_counts_the_steps_inside_each_request(tmp_path):
    d = tmp_path / "hooks"
    d.mkdir()
    lines = [{"side": "scheduler", "t0": 1000.1, "t1": 1000.2, "hooks": {"get_num_new_matched_tokens": 0.5}},
             {"side": "worker", "t0": 1000.3, "t1": 1000.4, "hooks": {"wait_for_save": 0.25, "get_finished": 0.25}},
             {"side": "scheduler", "t0": 1001.1, "t1": 1001.2, "hooks": {"build_connector_meta": 2.0}},
             {"side": "scheduler", "t0": 1000.7, "t1": 1000.8, "hooks": {"build_connector_meta": 9.0}}]  # between requests
    (d / "hooks-scheduler-1.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    rows = [{"phase": "resident", "ms": 1, "t0": 1000.0, "t1": 1000.5},
            {"phase": "resident", "ms": 1, "t0": 1001.0, "t1": 1001.5}]
    assert b._hook_ms(str(d), rows) == {"resident": 1.5}  # (1.0 + 2.0) / 2
    assert b._hook_ms(os.path.join(str(tmp_path), "none"), rows) == {}
