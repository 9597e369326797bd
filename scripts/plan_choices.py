"""What ``plan_decode`` picks for each row of the benchmark presets, next to what ``auto`` alone launches.

    python scripts/plan_choices.py [PRESET,...]   (default anchor,ragged,dims; on CPU the interpreter's 16 SMs)
"""

import sys

sys.path.insert(0, "src")
import torch  # noqa: E402

from flashdecode import api, plan_decode  # noqa: E402
from flashdecode.bench import PRESETS, _torch_dtype  # noqa: E402


def main():
    presets = (sys.argv[1] if len(sys.argv) > 1 else "anchor,ragged,dims").split(",")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"{'row':36s} {'auto':24s} plan")
    for preset in presets:
        for row in PRESETS[preset]():
            batch, hkv, d, page = row.batch, row.num_kv_heads, row.head_dim, row.page_size
            dtype = _torch_dtype(row.dtype)
            # shapes only: a one-page pool, the benchmark's table width (random_paged_case: 2 columns spare)
            pages = -(-max(row.seqlens) // page) + 2
            q = torch.empty(batch, row.num_q_heads, d, dtype=dtype, device=device)
            k = torch.empty(1, page, hkv, d, dtype=dtype, device=device)
            lens = torch.tensor(row.seqlens, dtype=torch.int32, device=device)
            table = torch.zeros(batch, pages, dtype=torch.int32, device=device)
            name, splits = api._choose_backend("auto", None, q, k, table)
            auto = f"{name} {'dual path' if splits is api.DUAL_PATH else ('planned' if splits is None else splits)}"
            plan = plan_decode(q, k, lens, table, window_left=row.window_left)
            print(f"{row.name():36s} {auto:24s} {plan.backend} {plan.num_splits}: {plan.reason}")


if __name__ == "__main__":
    main()
