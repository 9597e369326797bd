"""The benchmark harness on CPU: outputs are well-formed and the correctness gate rejects a broken backend."""

import json

import pytest

from flashdecode.bench import PRESETS, ProbeLog, Row, compare, l2_state, parse_ints, row_case, run_rows
from flashdecode.cli import main


def test_bench_tiny_writes_json_markdown_and_plots(tmp_path, capsys, device):
    out = tmp_path / "bench"
    backends = "auto,triton,triton_splitk,torch_sdpa,torch_naive"
    argv = ["bench", "--preset", "tiny", "--out", str(out), "--no-progress", "--device", device, "--backends", backends]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert ("these timings mean nothing" in printed) == (device == "cpu")
    data = json.loads((out / "results.json").read_text())
    meta, results = data["meta"], data["results"]
    for key in ("commit", "torch", "triton", "timing", "timestamp", "gpu"):
        assert key in meta
    assert len(results) == len(PRESETS["tiny"]()) * 5
    assert all(r["status"] == "ok" for r in results), [r for r in results if r["status"] != "ok"]
    for r in results:
        assert r["eager_us"] > 0 and r["bytes"] > 0 and r["flops"] > 0 and r["max_err"] <= r["tolerance"]
        if r.get("graph_us"):  # the graph reads every copy, and the L2 label says what it found (GPU only)
            assert r["graph_copies"] == r["copies"]
            assert r["l2"] == l2_state(r["kv_bytes"], r["graph_copies"], meta["l2_bytes"])
        # the host's pace beside each eager timing (it moves with the pace)
        assert r["host_pace"]["python_us"] > 0 and r["host_pace"]["torch_op_us"] > 0
    md = (out / "results.md").read_text()
    assert "host pace over the run (the eager column moves with it): Python" in md
    assert f"({len(results)} records)" in md and "host pace over the run: Python" in printed
    pace = results[0]["host_pace"]["torch_op_us"]
    assert f"| {results[0]['eager_us']:.1f} | {pace:.2f} |" in md  # beside the eager time it was taken after
    assert md.count("\n|") > len(results)
    for png in ("gbps_vs_seqlen.png", "us_vs_batch.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (out / "speedup.png").exists()  # no peer ran
    # redraw from the saved JSON
    assert main(["plot", str(out / "results.json"), "--out", str(tmp_path / "again")]) == 0
    assert (tmp_path / "again" / "us_vs_batch.png").exists()


def test_gate_rejects_a_broken_backend(device):
    rows = [Row([20, 50], 4, 2, head_dim=64, dtype="fp32")]
    results = run_rows(rows, ["triton", "torch_sdpa"], device, progress=False, sabotage={"triton": lambda out: out * 1.001})
    by = {r["backend"]: r for r in results}
    assert by["triton"]["status"] == "wrong" and "eager_us" not in by["triton"]
    assert by["torch_sdpa"]["status"] == "ok"


def test_speedup_plot_against_the_fastest_peer(tmp_path):
    from flashdecode.plots import _speedups, plot_results

    def rec(row, backend, us, status="ok"):
        return dict(row=row, backend=backend, graph_us=us, status=status, seqlens=[8], max_seqlen=8, batch=1,
                    num_q_heads=4, num_kv_heads=2, head_dim=64, page_size=16, dtype="bf16", gbps=1.0)  # fmt: skip

    results = [
        rec("a", "auto", 10.0), rec("a", "auto_plan", 8.0), rec("a", "flashinfer", 12.0), rec("a", "vllm_triton", 16.0),
        rec("b", "auto", 20.0), rec("b", "flashinfer", 10.0), rec("b", "sglang_triton", 5.0, status="wrong"),
        rec("c", "auto", 1.0),  # no peer: no bar
    ]
    assert _speedups(results, ("auto_plan", "auto"), ("flashinfer", "sglang_triton", "vllm_triton")) == [
        ("a", {"auto_plan": 1.5, "auto": 1.2}), ("b", {"auto": 0.5}),
    ]
    paths = plot_results(results, {"gpu": "test GPU", "commit": "abc"}, str(tmp_path))
    assert str(tmp_path / "speedup.png") in paths
    assert (tmp_path / "speedup.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_missing_peer_is_skipped_not_an_error(device):
    pytest.importorskip("torch")
    try:
        import flashinfer  # noqa: F401

        pytest.skip("flashinfer is installed here")
    except ImportError:
        pass
    results = run_rows([Row([8], 4, 2, head_dim=64)], ["flashinfer"], device, progress=False)
    assert results[0]["status"] == "skipped" and "not importable" in results[0]["reason"]


def test_parse_ints_and_compare(tmp_path):
    assert parse_ints("1,8,64") == [1, 8, 64]
    assert parse_ints("1024:8192:x2") == [1024, 2048, 4096, 8192]
    assert parse_ints("128:512:128") == [128, 256, 384, 512]
    old = {"results": [dict(row=r, backend="b", status="ok", graph_us=10.0, eager_us=30.0) for r in "rstuv"]
           + [dict(row="w", backend="b", status="wrong")]}  # fmt: skip
    (tmp_path / "old.json").write_text(json.dumps(old))
    ok = lambda row, **times: dict(row=row, backend="b", status="ok", **times)  # noqa: E731
    now = [ok("r", graph_us=10.4, eager_us=99.0), ok("s", graph_us=11.0), ok("t", eager_us=31.0),
           dict(row="u", backend="b", status="wrong", reason="max |out - ref| = 1 > 0.01; not timed"),
           dict(row="w", backend="b", status="wrong")]  # fmt: skip
    # within 5% (the eager column is not compared where both have graphs), > 5% slower, graph lost, no longer
    # right, missing (v); a row that was not ok before is not a regression
    now.append(dict(row="v", backend="c", status="ok", graph_us=1.0))  # row v ran, but not with backend b
    assert compare(now, tmp_path / "old.json") == [
        "SLOWER s b: 10.0 -> 11.0 us (1.10x)",
        "NO GRAPH t b: graph 10.0 us before, now eager only",
        "NOT OK u b: wrong: max |out - ref| = 1 > 0.01; not timed",
        "MISSING v b: ok before, not in this run",
    ]
    # a run of one row and one backend compares that pair only
    assert compare([ok("r", graph_us=10.0)], tmp_path / "old.json") == []


def test_probe_log_writes_json_lines_as_it_goes_and_the_table_again_last(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OUT", str(tmp_path))
    log = ProbeLog("demo")
    log.line("row      us")
    log.record(dict(row="a", variant="x", us=1.5))
    log.row(dict(row="a", variant="y", us=2.0), "a       2.0")
    # each record is on disk before the probe goes on (a probe killed at its time limit keeps its rows)
    assert [json.loads(x) for x in (tmp_path / "demo.jsonl").read_text().splitlines()] == [
        dict(row="a", variant="x", us=1.5), dict(row="a", variant="y", us=2.0)]
    log.close()
    assert log.file.closed
    assert capsys.readouterr().out == "row      us\na       2.0\n\nrow      us\na       2.0\n"


def test_probe_variants_checks_every_variant_and_times_only_the_right_ones(monkeypatch):
    """probe_variants: each variant's error against the reference, from a NaN-filled output; a wrong one is not timed
    (NaN), the right ones once a round, alternating."""
    import torch

    from flashdecode import bench

    timed = []
    monkeypatch.setattr(bench, "probe_graph_us", lambda fn: timed.append(fn()) or 1.5)
    ref = torch.arange(6, dtype=torch.float64).reshape(2, 3)
    out = torch.empty(2, 3)
    variants = {"right": lambda c: out.copy_(c), "wrong": lambda c: out.copy_(c + 1), "partial": lambda c: out[0].copy_(c[0])}
    errs, times = bench.probe_variants(variants, ref.float(), ref, [ref.float()], out, rounds=2)
    assert errs["right"] == 0 and errs["wrong"] == 1 and errs["partial"] != errs["partial"]  # NaN left in row 1
    assert times["right"] == [1.5, 1.5]
    assert all(t != t for t in times["wrong"] + times["partial"]) and len(timed) == 2


def test_probe_rows_reads_the_probes_rows_argument():
    from flashdecode.bench import probe_rows

    assert probe_rows("64,1024,12,2;16,4096,32,8", [(1, 2)]) == [(64, 1024, 12, 2), (16, 4096, 32, 8)]
    assert probe_rows("", [(1, 2)]) == [(1, 2)]


def test_anchor_preset_is_perf_md_grid():
    rows = PRESETS["anchor"]()
    assert len(rows) == 22
    assert {(r.batch, r.seqlens[0], r.num_q_heads, r.num_kv_heads) for r in rows} >= {(128, 8192, 32, 8), (1, 128, 28, 4)}
    # K+V MB of PERF.md's first and last rows
    assert round(rows[0].kv_bytes() / 1e6) == 403 and round(rows[-1].kv_bytes() / 1e6) == 4295


def test_flex_attention_peer_matches_reference(device):
    """The flex_attention peer computes the right thing (eager on CPU; compiled on a GPU)."""
    pytest.importorskip("torch.nn.attention.flex_attention")
    results = run_rows([Row([20, 50, 0], 8, 2, head_dim=64)], ["flex_attention"], device, progress=False)
    assert results[0]["status"] == "ok", results[0]


def test_feature_rows_are_checked_and_count_only_the_bytes_read(device):
    """fp8 and window rows pass the gate for the backends that have the features (auto with a plan too); the others
    are skipped; bytes count 1-byte fp8 elements and only the window's tokens."""
    rows = [Row([20, 50], 4, 2, head_dim=64, kv_dtype="e4m3"), Row([20, 50], 4, 2, head_dim=64, window_left=9)]
    assert rows[0].kv_bytes() == 2 * 70 * 2 * 64 and rows[1].kv_bytes() == 2 * 20 * 2 * 64 * 2
    results = run_rows(rows, ["triton_splitk", "auto_plan", "torch_sdpa"], device, progress=False)
    by = {(r["row"], r["backend"]): r["status"] for r in results}
    assert by == {
        ("2x20..50 4/2 D64 P16 bf16 kv e4m3", "triton_splitk"): "ok",
        ("2x20..50 4/2 D64 P16 bf16 kv e4m3", "auto_plan"): "ok",
        ("2x20..50 4/2 D64 P16 bf16 kv e4m3", "torch_sdpa"): "skipped",
        ("2x20..50 4/2 D64 P16 bf16 W9", "triton_splitk"): "ok",
        ("2x20..50 4/2 D64 P16 bf16 W9", "auto_plan"): "ok",
        ("2x20..50 4/2 D64 P16 bf16 W9", "torch_sdpa"): "skipped",
    }, by


def test_sglang_split_rule():
    """SGLang's split counts, worked by hand from its rule (peers.sglang_kv_splits' docstring)."""
    from flashdecode.peers import sglang_kv_splits

    # 8 x 2048, 28/4: grid target 132 * log2(2048 / 64) = 660 programs over 8 * 4 head blocks -> 21, capped at 8
    assert sglang_kv_splits([2048] * 8, 28, 4, 8, 132) == [8] * 8
    # ragged: the long sequence gets the cap (chunk 131072 / 8), the short ones one split each
    assert sglang_kv_splits([131072] + [1024] * 63, 32, 8, 8, 132) == [8] + [1] * 63
    # MHA, lengths within 25% of each other: one chunk size, 4096 / 8 = 512 tokens, so 8 and 7 splits
    assert sglang_kv_splits([4096, 3500], 12, 12, 8, 132) == [8, 7]


@pytest.mark.parametrize("backend", ["sglang_triton", "vllm_triton"])
def test_triton_peers_missing_source_is_skipped(backend, device, tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHDECODE_PEER_SRC", str(tmp_path))
    results = run_rows([Row([8], 4, 2, head_dim=64)], [backend], device, progress=False)
    assert results[0]["status"] == "skipped" and "fetch_triton_peers" in results[0]["reason"], results[0]


@pytest.mark.parametrize("backend", ["sglang_triton", "vllm_triton"])
def test_triton_peers_match_reference(backend, device):
    """The peers compute the right thing where their kernel files were fetched (fp16: the interpreter's bf16 dot
    is wrong); group 7 as in the 28/4 rows."""
    import os

    from flashdecode.peers import _peer_dir

    if not os.path.isdir(_peer_dir(backend.split("_")[0])):
        pytest.skip("run scripts/fetch_triton_peers.sh to fetch the peers' kernel files")
    results = run_rows([Row([70, 33, 16], 14, 2, head_dim=64, dtype="fp16")], [backend], device, progress=False)
    assert results[0]["status"] == "ok", results[0]


def test_token_major_v_rows_run_our_backends_and_skip_the_peers(device, monkeypatch):
    """A row with token-major V pages (the fp8 preset's fastest layout) is checked against the reference on the
    flashdecode backends that read it, and skipped for the ones that do not (triton_tma, the peers)."""
    from flashdecode import bench
    from flashdecode.api import v_token_major

    layouts, real = [], bench.make_backend

    def recorded(name, case, row):
        layouts.append(v_token_major(case.v_cache))
        return real(name, case, row)

    monkeypatch.setattr(bench, "make_backend", recorded)
    row = Row([20, 50, 7], 4, 2, head_dim=64, page_size=32, v_layout="token")
    assert row.name() == "3x7..50 4/2 D64 P32 bf16 V token-major"
    results = run_rows([row], ["triton", "auto_plan", "torch_sdpa", "triton_tma", "flashinfer"], device,
                       progress=False)  # fmt: skip
    status = {r["backend"]: r["status"] for r in results}
    assert status == dict(triton="ok", auto_plan="ok", torch_sdpa="ok", triton_tma="skipped", flashinfer="skipped")
    assert layouts == [True] * 5
    assert any(r.v_layout == "token" and r.kv_dtype == "e4m3" for r in PRESETS["fp8"]())
    with pytest.raises(ValueError, match="v_layout"):
        Row([1], 1, 1, v_layout="tokens")


def test_rows_in_a_serving_sized_table(device):
    row = Row([20, 50], 4, 2, head_dim=64, table_tokens=512)
    # the table holds 512 tokens: the longest sequence's 4 pages and 28 more columns
    assert row.extra_table_columns() == 28 and row.name().endswith(" T512")
    assert Row([20, 50], 4, 2).extra_table_columns() == 2
    assert row_case(row, device).block_table.shape == (2, 32)
    with pytest.raises(ValueError, match="table_tokens 40 is shorter than the longest sequence 50"):
        Row([20, 50], 4, 2, table_tokens=40)
    results = run_rows([row], ["auto", "triton_splitk"], device, progress=False)
    assert [r["status"] for r in results] == ["ok", "ok"], results
    assert all(r["table_tokens"] == 512 and r["max_err"] <= r["tolerance"] for r in results)
    assert all(r.table_tokens == 131072 for r in PRESETS["tables"]())


def test_rotation_is_sized_from_the_bytes_a_call_reads():
    """Enough copies that the calls cycle through >= 3x L2 of the K/V they read: a tiny row got at most 32 copies
    (1 x 128 28/4: 8.4 MB cycled against a 60 MB L2, labelled "rotated"), and a window row was sized from its pool."""
    from flashdecode.bench import rotation_copies

    l2 = 60 << 20
    tiny = Row([128], 28, 4)
    copies = rotation_copies(row_case(tiny, "cpu"), l2, tiny.kv_bytes())
    assert len(copies) * tiny.kv_bytes() >= 3 * l2 > (len(copies) - 1) * tiny.kv_bytes()
    assert len(rotation_copies(row_case(tiny, "cpu"), l2, 1000)) == 1024  # the count cap
    assert len({c.k_cache.data_ptr() for c in copies}) == len(copies)
    window = Row([4096], 8, 2, head_dim=64, window_left=255)
    case = row_case(window, "cpu")
    copies = rotation_copies(case, 8 << 20, window.kv_bytes())
    assert len(copies) * window.kv_bytes() >= 3 * (8 << 20)
    # capped by the memory the copies take; the label then says what the calls found
    capped = rotation_copies(case, 8 << 20, window.kv_bytes(), max_bytes=3 * case.k_cache.nbytes * 2)
    assert len(capped) == 3 and l2_state(window.kv_bytes(), len(capped), 8 << 20) == "warm"
    assert l2_state(tiny.kv_bytes(), 32, l2) == "warm"
    assert l2_state(30 << 20, 6, l2) == "rotated" and l2_state(200 << 20, 1, l2) == "cold"


def test_rows_in_two_presets_run_once():
    """anchor and dims both hold 64x4096 32/8: run twice, its records shared one name, so 'vs best other' compared
    a backend with itself and results.md kept one copy."""
    from argparse import Namespace

    from flashdecode.bench import rows_from_args

    args = Namespace(batch=None, seqlen=None, heads="32/8", head_dim=128, page_size=16, dtype="bf16",
                     preset="anchor,dims")  # fmt: skip
    names = [row.name() for row in rows_from_args(args, on_gpu=True)]
    assert len(names) == len(set(names)) and "64x4096 32/8" in names
    assert len(names) == len({r.name() for p in ("anchor", "dims") for r in PRESETS[p]()})


def test_plot_panels_keep_cases_and_batches_apart():
    """One panel per kind of case (an fp8 or windowed row is not a bf16 row), and a line never joins two batches at
    one context length (the 28/4 anchor panel zigzagged between batch 1 and 8)."""
    from flashdecode.plots import _groups, _series

    def rec(seqlen, batch, **kw):
        return dict(Row([seqlen] * batch, 28, 4, **kw).__dict__, status="ok", backend="b", batch=batch,
                    max_seqlen=seqlen, seqlens=[seqlen], graph_us=1.0)  # fmt: skip

    groups = _groups([rec(128, 1), rec(2048, 8), rec(2048, 8, kv_dtype="e4m3"), rec(4096, 1, window_left=127)])
    assert sorted(len(g) for g in groups.values()) == [1, 1, 2]
    assert _series({1: [(128, 5.0), (2048, 9.0)], 8: [(128, 7.0), (2048, 30.0)]}) == [
        [(128, 5.0), (2048, 9.0)], [(128, 7.0), (2048, 30.0)]]
    # rows of equal bytes (batch x length constant): one line across them
    assert _series({64: [(1024, 4.0)], 16: [(4096, 4.1)]}) == [[(1024, 4.0), (4096, 4.1)]]


def test_flash_attn_peer_reads_each_rotated_copy(monkeypatch):
    """flash_attn's 256-token re-paging was built once from the first cache, so every rotated call read that copy
    (timed warm under a "rotated" label). A stand-in flash_attn records the K it is given."""
    import sys
    import types

    import torch

    from flashdecode.bench import make_backend, rotation_copies

    seen = []
    fake = types.ModuleType("flash_attn")
    fake.__version__ = "stand-in"
    fake.flash_attn_with_kvcache = lambda q, k, v, **kw: seen.append(k.data_ptr()) or torch.zeros(q.shape)
    monkeypatch.setitem(sys.modules, "flash_attn", fake)
    for page in (16, 256):
        row = Row([300, 40], 4, 2, head_dim=64, page_size=page)
        case = row_case(row, "cpu")
        copies = rotation_copies(case, l2_bytes=case.k_cache.nbytes, read_bytes=case.k_cache.nbytes * 3 // 4)
        assert len(copies) == 4
        fn = make_backend("flash_attn", case, row)
        seen.clear()
        for c in copies + copies:
            fn(c)
        assert len(set(seen)) == 4 and seen[:4] == seen[4:]
