"""`flashdecode run`: every backend on a small case passes, and a bad case is reported as the API reports it."""

import pytest

from flashdecode.cli import main


def _passed(printed, backend):
    """The run's table has a line for backend, marked ok."""
    return any(line.split()[:1] == [backend] and " yes " in line for line in printed.splitlines())


def test_run_small_case_passes(capsys, device):
    assert main(["run", "--device", device, "--seqlens", "0,1,17,40", "--heads", "4/2", "--head-dim", "16"]) == 0
    printed = capsys.readouterr().out
    assert "seqlens=[0, 1, 17, 40] heads=4/2 D=16" in printed
    for backend in ("reference", "torch_naive", "torch_sdpa", "triton", "triton_splitk", "auto"):
        assert _passed(printed, backend), printed


@pytest.mark.parametrize("argv,message", [
    (["--heads", "3/2"], "error: q's 3 heads must be a multiple of k_cache's 2 KV heads"),
    (["--seqlens", "0,-1"], r"error: cache_seqlens\[1\] must be >= 0, got -1"),
], ids=["group", "negative length"])
def test_run_reports_a_bad_case_in_one_line(argv, message, device):
    with pytest.raises(SystemExit, match=message):
        main(["run", "--device", device, "--head-dim", "16", *argv])


def test_run_rejects_unparsable_lengths(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--seqlens", "0,a"])
    assert exit_info.value.code == 2
    assert "--seqlens must be comma-separated integers, e.g. 0,17,4096, got '0,a'" in capsys.readouterr().err


def test_run_names_the_backends_that_refuse_a_case(capsys, device):
    """head_dim 512: the Triton backends refuse it by name, `auto` and the PyTorch ones still run and pass."""
    assert main(["run", "--device", device, "--seqlens", "3,20", "--heads", "2/1", "--head-dim", "512"]) == 0
    printed = capsys.readouterr().out
    assert "triton_splitk: not run: backend 'triton_splitk' takes head_dim up to 256, got 512" in printed, printed
    for backend in ("auto", "reference", "torch_naive", "torch_sdpa"):
        assert _passed(printed, backend), printed


def test_run_fails_on_an_unexpected_backend_error(monkeypatch, device):
    """Only the known refusals are excused: any other ValueError from a backend ends the run with it."""
    import flashdecode.api as api

    def broken(*args):
        raise ValueError("broken backend")

    monkeypatch.setitem(api._BACKEND_FNS, "triton", broken)
    with pytest.raises(ValueError, match="broken backend"):
        main(["run", "--device", device, "--seqlens", "3,20", "--heads", "2/1", "--head-dim", "16"])
