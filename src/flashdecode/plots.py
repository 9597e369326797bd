"""Plots of benchmark results: GB/s against context length and µs against batch, one line per backend; and, where
peers ran, each row's speed against the fastest peer of the same run."""

from __future__ import annotations

import os

__all__ = ["plot_results"]


def _groups(results):
    """Uniform-length rows that ran, grouped by everything but their shape: head geometry, head dim, page size,
    dtype and the features (fp8 cache, window, token-major V, table capacity), so one panel holds one kind of case."""
    groups = {}
    for r in results:
        if r["status"] != "ok" or len(r["seqlens"]) != 1:
            continue
        key = f"{r['num_q_heads']}/{r['num_kv_heads']} heads, D{r['head_dim']}, page {r['page_size']}, {r['dtype']}"
        key += f", kv {r['kv_dtype']}" if r.get("kv_dtype") else ""
        key += f", W{r['window_left']}" if r.get("window_left") is not None else ""
        key += ", V token-major" if r.get("v_layout") == "token" else ""
        key += f", table {r['table_tokens']}" if r.get("table_tokens") else ""
        groups.setdefault(key, []).append(r)
    return groups


def _series(pts_by_other):
    """Lines of one backend in one panel: {other coordinate: [(x, y)]} -> one line of all points when no x repeats
    (a sweep, or rows of equal bytes), else one line per value of the other coordinate (rows of batch 1 and 8 at one
    context length are not joined)."""
    pts = [p for group in pts_by_other.values() for p in group]
    if len({x for x, _ in pts}) == len(pts):
        return [sorted(pts)]
    return [sorted(group) for _, group in sorted(pts_by_other.items())]


def _time(r):
    return r.get("graph_us") or r.get("eager_us")


def _speedups(results, ours, peers):
    """[(row, {our backend: fastest peer's time / its time})] in the results' row order, for rows where a peer and
    one of ours ran."""
    by_row = {}
    for r in results:
        if r["status"] == "ok" and _time(r):
            by_row.setdefault(r["row"], {})[r["backend"]] = _time(r)
    rows = []
    for row, times in by_row.items():
        peer = min((t for b, t in times.items() if b in peers), default=None)
        mine = {b: peer / times[b] for b in ours if b in times} if peer else {}
        if mine:
            rows.append((row, mine))
    return rows


def _plot_speedup(plt, speedups, title, path):
    """Horizontal bars, one group per row: our backends' speed over the fastest peer's (1 = as fast)."""
    backends = list(dict.fromkeys(b for _, mine in speedups for b in mine))
    height = 0.8 / len(backends)
    fig, ax = plt.subplots(figsize=(8, 1.2 + 0.32 * len(speedups) * max(1, len(backends) / 2)))
    for i, backend in enumerate(backends):
        ys = [k + i * height for k, (_, mine) in enumerate(speedups) if backend in mine]
        xs = [mine[backend] for _, mine in speedups if backend in mine]
        ax.barh(ys, xs, height=height, label=backend)
    ax.axvline(1.0, color="gray", linestyle="--", linewidth=1, label="fastest peer")
    ax.set_yticks([k + 0.4 - height / 2 for k in range(len(speedups))], [row for row, _ in speedups], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("speed over the fastest peer of the same run (its time / ours)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, axis="x", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_results(results, meta, out_dir) -> list[str]:
    """Write gbps_vs_seqlen.png and us_vs_batch.png into out_dir, and speedup.png where peers and flashdecode's
    backends timed the same rows; returns the paths written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out_dir, exist_ok=True)
    groups = _groups(results) or {"no uniform rows": []}
    where = meta.get("gpu") or "CPU (Triton interpreter: timings meaningless)"
    peak = meta.get("read_bandwidth_gbps")
    # one colour per backend across every panel
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    colors = {b: palette[i % len(palette)] for i, b in enumerate(dict.fromkeys(r["backend"] for r in results))}
    paths = []
    for fname, x_key, other_key, y_fn, y_label, x_label in (
        (
            "gbps_vs_seqlen.png", "max_seqlen", "batch", lambda r: r.get("gbps"), "GB/s (K+V+q+out over time)",
            "context length (tokens)",
        ),
        ("us_vs_batch.png", "batch", "max_seqlen", _time, "µs per call", "batch size"),
    ):
        n = len(groups)
        fig, axes = plt.subplots(1, n, figsize=(6 * n, 4.5), squeeze=False)
        for ax, (title, recs) in zip(axes[0], groups.items()):
            for backend in dict.fromkeys(r["backend"] for r in recs):
                by_other = {}
                for r in recs:
                    if r["backend"] == backend and y_fn(r):
                        by_other.setdefault(r[other_key], []).append((r[x_key], y_fn(r)))
                for i, pts in enumerate(_series(by_other) if by_other else []):
                    ax.plot(*zip(*pts), marker="o", label=backend if i == 0 else None, color=colors[backend])
            if peak and fname.startswith("gbps"):
                ax.axhline(peak, color="gray", linestyle="--", linewidth=1, label=f"measured read peak {peak:.0f}")
            ax.set_xscale("log", base=2)
            if fname.startswith("us"):
                ax.set_yscale("log")
            ax.set_title(title, fontsize=10)
            ax.set_xlabel(x_label)
            ax.set_ylabel(y_label)
            ax.grid(True, alpha=0.3)
            if recs:
                ax.legend(fontsize=8)
        commit = str(meta.get("commit"))[:10]
        fig.suptitle(f"flashdecode decode attention on {where} (commit {commit})", fontsize=11)
        fig.tight_layout()
        path = os.path.join(out_dir, fname)
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    from .bench import FLASHDECODE_BACKENDS, PEERS, PLANNED

    speedups = _speedups(results, (PLANNED,) + FLASHDECODE_BACKENDS, PEERS)
    if speedups:
        path = os.path.join(out_dir, "speedup.png")
        _plot_speedup(plt, speedups, f"flashdecode against its peers on {where} (commit {commit})", path)
        paths.append(path)
    return paths
