"""triton_read, the benchmark's read ceiling: its sum is the tensor's sum for every size around a program's block
(a wrong mask or offset drops or repeats elements), in every dtype, into a reused NaN-filled buffer; and the bench
labels which read its % peak column is against."""

import pytest
import torch

from flashdecode import bench
from flashdecode.triton_read import BLOCK, read_partials, read_sum

SIZES = [0, 1, 7, BLOCK - 1, BLOCK, BLOCK + 1, 3 * BLOCK + 5]


@pytest.mark.parametrize("numel", SIZES, ids=lambda n: f"n{n}")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_read_sum_is_the_sum(numel, dtype, device):
    g = torch.Generator().manual_seed(numel)
    # positive values, so that a dropped or repeated element cannot cancel out
    x = (torch.rand(numel, generator=g) + 0.5).to(dtype).to(device)
    want = x.double().sum().item()
    got = read_sum(x).item()
    # fp32 partial sums of at most BLOCK elements, then a sum of the partials: ~log2(n) fp32 roundings a term
    assert got == pytest.approx(want, rel=1e-5, abs=1e-6)


def test_read_partials_fill_a_reused_buffer(device):
    x = torch.arange(2 * BLOCK + 3, dtype=torch.float32, device=device).reshape(-1, 1)  # any shape, contiguous
    partial = torch.full((8,), float("nan"), device=device)
    got = read_partials(x, partial)
    assert got.shape == (3,)
    torch.testing.assert_close(got.double(), torch.stack([c.double().sum() for c in x.flatten().split(BLOCK)]))
    assert torch.isnan(partial[3:]).all(), "elements past the programs are not written"


def test_read_partials_refuses_a_strided_tensor_and_a_short_buffer(device):
    with pytest.raises(AssertionError, match="contiguous"):
        read_partials(torch.ones(4, 2 * BLOCK, device=device)[:, ::2])
    with pytest.raises(AssertionError, match="one element a program"):
        read_partials(torch.ones(2 * BLOCK + 1, device=device), torch.empty(2, device=device))
    with pytest.raises(AssertionError, match="contiguous fp32"):
        read_partials(torch.ones(2 * BLOCK + 1, device=device), torch.empty(3, 2, device=device)[:, 0])


def test_measure_read_bandwidth_names_a_bad_read():
    with pytest.raises(ValueError, match="how must be 'stream' or 'torch.sum', got 'sum'"):
        bench.measure_read_bandwidth("cpu", "sum")


def test_read_bandwidths_text_names_both_reads():
    new = {"read_bandwidth_gbps": 4570.4, "torch_sum_gbps": 4210.2}
    assert bench.read_bandwidths(new) == "read bandwidth 4570 GB/s (triton_read; torch.sum 4210)"
    # results.json files before 2026-11-30 recorded torch.sum's read as read_bandwidth_gbps
    assert bench.read_bandwidths({"read_bandwidth_gbps": 4163.0}) == "read bandwidth (torch.sum) 4163 GB/s"
    # a CPU run measures neither; scripts/bench_cp.py measures torch.sum's alone
    assert bench.read_bandwidths(bench.provenance("cpu", None, "t")) == "read bandwidth not measured"
    assert bench.read_bandwidths(bench.provenance("cpu", None, "t", 4.2e12)) == "read bandwidth (torch.sum) 4200 GB/s"


def test_provenance_files_each_read_under_its_own_key():
    meta = bench.provenance("cpu", 4.63e12, "t", 4.21e12)
    assert (meta["read_bandwidth_gbps"], meta["torch_sum_gbps"]) == (4630.0, 4210.0)
