"""scripts/anchor_report.py's geomean in PERF.md's conditions: the rows under PERF.md's L2 from the warm run, the
others from the rotated one."""

import importlib.util
import json
import math
import pathlib

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "scripts" / "anchor_report.py"


@pytest.fixture(scope="module")
def report():
    spec = importlib.util.spec_from_file_location("anchor_report", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _results(path, times):
    meta = {"gpu": "test", "commit": "x", "torch": "t", "triton": "t", "read_bandwidth_gbps": 4000.0}
    results = [
        {"row": row, "backend": "auto_plan", "graph_us": us, "status": "ok", "kv_bytes": mb * 1e6, "gbps": 1.0}
        for row, (us, mb) in times.items()
    ]  # fmt: skip
    path.write_text(json.dumps({"meta": meta, "results": results}))
    return str(path)


def test_perf_conditions_take_the_warm_times_of_the_rows_under_l2(report, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(report, "OURS", "auto_plan")
    # every anchor row at PERF.md's time when rotated; the 28/4 rows (under 60 MB) half that warm
    mb = {"1x128 28/4": 0.3, "1x2048 28/4": 4.2, "8x128 28/4": 2.1, "8x2048 28/4": 33.6}
    rotated = {row: {"auto_plan": us, "kv_mb": mb.get(row, 400.0)} for row, us in report.PERF_PEER_US.items()}
    rows = {row: e for row, e in rotated.items() if row in report.ANCHOR_ROWS}
    # the warm run also times a large row, 10x faster: it must not be used
    warm = {row: (report.PERF_PEER_US[row] / 2, m) for row, m in mb.items()}
    warm["64x4096 32/8"] = (report.PERF_PEER_US["64x4096 32/8"] / 10, 1073.7)
    report.perf_conditions(rows, report.graph_times(_results(tmp_path / "warm.json", warm)))
    line = capsys.readouterr().out.strip().splitlines()[-1]
    expected = math.exp(4 * math.log(2.0) / 22)
    assert f"{expected:.4f}× PERF.md's best peer over 22 rows (22 at least as fast)" in line, line
    assert "8x2048 28/4 7.0 µs" in line, line


def test_perf_conditions_name_a_missing_warm_row(report, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(report, "OURS", "auto_plan")
    rows = {row: {"auto_plan": us, "kv_mb": 400.0} for row, us in report.PERF_PEER_US.items()}
    rows["8x2048 28/4"]["kv_mb"] = 33.6
    report.perf_conditions(rows, report.graph_times(_results(tmp_path / "warm.json", {})))
    assert "no warm time for 8x2048 28/4: not computed" in capsys.readouterr().out
