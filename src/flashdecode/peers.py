"""Peer kernels for the benchmark, used when importable: FlashInfer, flash-attn, flex_attention, and the Triton
decode kernels of SGLang and vLLM.

Each factory takes a ``PagedCase`` and returns ``fn(case) -> out [B, Hq, D]``; planning happens once, in the
factory, so that the timed call is the kernel launch alone (what an engine replays every step). A missing
package or an unsupported shape raises ``bench.Skip`` with the reason.
"""

from __future__ import annotations

import math

import torch

from .bench import Skip

# FlashInfer's recommended workspace for its split-K scratch
_FLASHINFER_WORKSPACE_BYTES = 128 << 20


def _import(name: str):
    try:
        return __import__(name)
    except Exception as e:  # ImportError, or a broken install that fails while importing
        raise Skip(f"{name} not importable ({type(e).__name__})") from None


def flashinfer_decode(case, use_tensor_cores: bool):
    """FlashInfer's BatchDecodeWithPagedKVCacheWrapper (NHD layout), planned once for this case's lengths."""
    flashinfer = _import("flashinfer")
    q, k_cache, v_cache, seqlens, table = case.args
    batch, num_q_heads, head_dim = q.shape
    page_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    if not use_tensor_cores and (num_q_heads // num_kv_heads) not in (1, 2, 3, 4, 8):
        raise Skip(f"FlashInfer without tensor cores rejects GQA group {num_q_heads // num_kv_heads}")
    # CSR page lists: indptr [B + 1], indices [total pages], last_page_len [B] (tokens in each last page)
    pages = (seqlens + page_size - 1) // page_size
    indptr = torch.zeros(batch + 1, dtype=torch.int32, device=q.device)
    indptr[1:] = torch.cumsum(pages, 0)
    used = torch.arange(table.shape[1], device=q.device)[None, :] < pages[:, None]
    indices = table[used].to(torch.int32)
    last_page_len = torch.where(seqlens > 0, (seqlens - 1) % page_size + 1, 0).to(torch.int32)
    workspace = torch.empty(_FLASHINFER_WORKSPACE_BYTES, dtype=torch.uint8, device=q.device)
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", use_tensor_cores=use_tensor_cores)
    wrapper.plan(
        indptr, indices, last_page_len, num_q_heads, num_kv_heads, head_dim, page_size,
        pos_encoding_mode="NONE", q_data_type=q.dtype, kv_data_type=k_cache.dtype,
        sm_scale=1.0 / math.sqrt(head_dim),
    )  # fmt: skip

    def run(c):
        return wrapper.run(c.q, (c.k_cache, c.v_cache))

    run.keepalive = (workspace, indptr, indices, last_page_len)
    return run


def flash_attn_decode(case):
    """flash_attn_with_kvcache with a paged cache. It needs page sizes that are multiples of 256, so a cache with
    smaller pages is re-paged into 256-token pages, once per cache copy and outside the timed call; the row's timing
    then reflects flash-attn on its own layout."""
    fa = _import("flash_attn")
    big = 256
    # each cache copy of the rotation (bench.rotation_copies) re-paged once, outside the timed call: keyed by its
    # K address, so that rotated calls read distinct copies as the other backends do
    repaged = {}

    def layout(c):
        if c.k_cache.shape[1] % big == 0:
            return c.k_cache, c.v_cache, c.block_table
        key = c.k_cache.data_ptr()
        if key not in repaged:
            repaged[key] = _repage(c, big)
        return repaged[key]

    def run(c):
        k_cache, v_cache, table = layout(c)
        return fa.flash_attn_with_kvcache(
            c.q[:, None], k_cache, v_cache, cache_seqlens=c.cache_seqlens, block_table=table, causal=False
        )[:, 0]

    return run


def _repage(case, big):
    """(k_cache, v_cache, block_table) of case with its sequences copied into pages of ``big`` tokens."""
    from .reference import gather_sequence

    q, k_cache, v_cache, seqlens, table = case.args
    lens = seqlens.tolist()
    per_seq = [-(-n // big) for n in lens]
    new_table = torch.zeros(len(lens), max(max(per_seq, default=0), 1), dtype=torch.int32, device=q.device)
    shape = (max(sum(per_seq), 1), big, *k_cache.shape[2:])
    new_k, new_v = k_cache.new_zeros(shape), v_cache.new_zeros(shape)
    cursor = 0
    for b, n in enumerate(lens):
        if n == 0:
            continue
        ids = torch.arange(cursor, cursor + per_seq[b], device=q.device)
        new_table[b, : per_seq[b]] = ids.to(torch.int32)
        new_k.view(-1, *shape[2:])[cursor * big : cursor * big + n] = gather_sequence(k_cache, table[b], n)
        new_v.view(-1, *shape[2:])[cursor * big : cursor * big + n] = gather_sequence(v_cache, table[b], n)
        cursor += per_seq[b]
    return new_k, new_v, new_table


def flex_attention_decode(case):
    """PyTorch flex_attention (compiled on a GPU) on a dense copy of each sequence's K/V, with a block mask of the
    lengths. The paged gather and the block mask are built once per cache copy, outside the timed call: the row
    then times flex's decode kernel reading the valid K/V, not a paged kernel."""
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except Exception as e:
        raise Skip(f"flex_attention not importable ({type(e).__name__})") from None
    from .torch_baselines import dense_gather

    q, k_cache, v_cache, seqlens, table = case.args
    batch, num_q_heads, head_dim = q.shape
    lens = seqlens.clone()
    seq_tokens = table.shape[1] * k_cache.shape[1]

    def keep(b, h, q_idx, kv_idx):
        return kv_idx < lens[b]

    mask = create_block_mask(keep, batch, None, 1, seq_tokens, device=q.device)
    attend = torch.compile(flex_attention, dynamic=False) if q.is_cuda else flex_attention
    dense = {}

    def run(c):
        key = c.k_cache.data_ptr()
        if key not in dense:
            k, v, _ = dense_gather(c.k_cache, c.v_cache, c.cache_seqlens, c.block_table)
            # [B, Hkv, T, D]
            dense[key] = (k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous())
        k, v = dense[key]
        out = attend(c.q[:, :, None, :], k, v, block_mask=mask, scale=head_dim**-0.5, enable_gqa=True)
        # an empty sequence has no unmasked key: flex returns 0 there, as flashdecode does
        return out[:, :, 0, :]

    return run


# ------------------------------------------------------------------------------------ Triton peers (source files)
# SGLang's and vLLM's Triton decode kernels, as their engines call them. The packages pull in whole serving stacks,
# so only the kernel files are fetched (scripts/fetch_triton_peers.sh -> .whl/peers, git-ignored) and imported here
# with stand-ins for the few package helpers they use. Their code is not part of flashdecode.

_SM_COUNT_FALLBACK = 132


def _peer_file_module(name: str, path: str, stubs: dict):
    """Import the file ``path`` as module ``name`` after registering the stand-in modules ``stubs``."""
    import importlib.util
    import os
    import sys
    import types

    if not os.path.isfile(path):
        raise Skip(f"{path} missing (run scripts/fetch_triton_peers.sh)")
    if name in sys.modules:
        return sys.modules[name]
    for mod_name, attrs in stubs.items():
        if mod_name in sys.modules:  # the real package, or a stand-in registered before: left as it is
            continue
        parts = mod_name.split(".")
        for i in range(1, len(parts) + 1):
            sys.modules.setdefault(".".join(parts[:i]), types.ModuleType(".".join(parts[:i])))
        for key, value in attrs.items():
            setattr(sys.modules[mod_name], key, value)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _peer_dir(project: str) -> str:
    import os

    return os.path.join(os.environ.get("FLASHDECODE_PEER_SRC", ".whl/peers"), project)


def _sm_count(device) -> int:
    if torch.device(device).type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return _SM_COUNT_FALLBACK


def sglang_kv_splits(seqlens: list[int], num_q_heads: int, num_kv_heads: int, max_splits: int, cores: int):
    """SGLang's split counts per sequence (triton_backend's get_num_kv_splits, dynamic mode), on the host:
    enough splits that the grid covers ``cores · log2(max_len / 64)`` programs, at most ``max_splits``, and the
    chunk size set by the longest sequence so that shorter ones get proportionally fewer splits."""
    max_len, min_len = max(seqlens), max(min(seqlens), 1)
    if max_len * 8 < min_len * 10:
        min_len = max_len
    splits_1 = min(-(-max_len // min_len), max_splits)
    chunk_1 = -(-max_len // splits_1)
    grid_target = int(cores * max(math.log2(max_len / 64.0), 1.0))
    group = num_q_heads // num_kv_heads
    head_blocks = num_q_heads if group == 1 else -(-num_q_heads // min(16, group))
    splits_2 = min(-(-grid_target // (len(seqlens) * head_blocks)), max_splits)
    chunk_2 = -(-max_len // splits_2)
    return [max(-(-n // chunk_1), -(-n // chunk_2)) for n in seqlens]


def sglang_triton_decode(case, max_kv_splits: int = 8):
    """SGLang's Triton decode (``decode_attention_fwd``: split-K stage 1 on a token-level index list, stage 2
    merge), with its server default of at most 8 splits a sequence. SGLang addresses the pool token by token, so the
    page table becomes token slots once, in the plan, as SGLang's ``req_to_token`` holds them."""
    mod = _peer_file_module(
        "_flashdecode_peer_sglang_decode", f"{_peer_dir('sglang')}/decode_attention.py",
        {"sglang.srt.utils": {"is_hip": lambda: False}},
    )  # fmt: skip
    q, k_cache, v_cache, seqlens, table = case.args
    batch, num_q_heads, head_dim = q.shape
    page_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    lens = seqlens.tolist()
    if min(lens) < 1:
        raise Skip("SGLang's split planner needs every sequence non-empty")
    indptr = torch.zeros(batch + 1, dtype=torch.int32, device=q.device)
    indptr[1:] = torch.cumsum(seqlens, 0)
    slots = [
        table[b, torch.arange(n, device=q.device) // page_size].long() * page_size
        + torch.arange(n, device=q.device) % page_size
        for b, n in enumerate(lens)
    ]
    indices = torch.cat(slots).to(torch.int32)
    splits = sglang_kv_splits(lens, num_q_heads, num_kv_heads, max_kv_splits, _sm_count(q.device))
    num_kv_splits = torch.tensor(splits, dtype=torch.int32, device=q.device)
    logits = torch.empty(batch, num_q_heads, max_kv_splits, head_dim, dtype=torch.float32, device=q.device)
    lse = torch.empty(batch, num_q_heads, max_kv_splits, dtype=torch.float32, device=q.device)
    out = torch.empty_like(q)
    scale = 1.0 / math.sqrt(head_dim)

    def run(c):
        k = c.k_cache.view(-1, num_kv_heads, head_dim)
        v = c.v_cache.view(-1, num_kv_heads, head_dim)
        mod.decode_attention_fwd(
            c.q, k, v, out, indptr, indices, logits, lse, num_kv_splits, max_kv_splits, scale, 1.0, 1.0
        )
        return out

    run.keepalive = (indptr, indices, num_kv_splits)
    return run


def _vllm_stubs() -> dict:
    import enum
    import logging

    import triton
    import triton.language as tl

    class KVQuantMode(enum.IntEnum):  # vLLM's values for the members triton_unified_attention names
        NONE = 0
        FP8_PER_TENSOR = 1
        INT8_PER_TOKEN_HEAD = 2
        FP8_PER_TOKEN_HEAD = 3
        INT4_PER_TOKEN_HEAD = 4

    class Platform:  # a CUDA device of capability 9.x
        @staticmethod
        def fp8_dtype():
            return torch.float8_e4m3fn

        @staticmethod
        def is_device_capability_family(major):
            return False

    def init_logger(name):
        log = logging.getLogger(name)
        log.debug_once = log.info_once = log.warning_once = log.debug
        return log

    return {
        "vllm.envs": {"VLLM_BATCH_INVARIANT": False},
        "vllm.logger": {"init_logger": init_logger},
        "vllm.platforms": {"current_platform": Platform()},
        "vllm.triton_utils": {"tl": tl, "triton": triton},
        "vllm.v1.kv_cache_interface": {"KVQuantMode": KVQuantMode},
        "vllm.v1.attention.ops": {},
    }


def vllm_triton_decode(case):
    """vLLM's Triton attention backend (``unified_attention``), set up as its TritonAttentionBackend does for a
    decode batch: the 3D split kernel (16 softmax segments + reduce) when the batch has at most
    ``128 // num_kv_heads`` sequences (moved to the nearest CUDA-graph capture size), else the 2D kernel."""
    import sys

    stubs = _vllm_stubs()
    helpers = _peer_file_module(
        "vllm.v1.attention.ops.triton_attention_helpers", f"{_peer_dir('vllm')}/triton_attention_helpers.py", stubs
    )
    sys.modules["vllm.v1.attention.ops"].triton_attention_helpers = helpers
    mod = _peer_file_module(
        "_flashdecode_peer_vllm_unified", f"{_peer_dir('vllm')}/triton_unified_attention.py", {}
    )
    q, k_cache, v_cache, seqlens, table = case.args
    batch, num_q_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    segments = 16
    capture_sizes = [1, 2, 4] + list(range(8, 513, 8))
    threshold = min(capture_sizes, key=lambda s: abs(s - 128 // num_kv_heads))
    rows = min(threshold, batch)
    padded = 1 << (head_dim - 1).bit_length()
    segm_out = torch.empty(rows, num_q_heads, segments, padded, dtype=torch.float32, device=q.device)
    segm_max = torch.empty(rows, num_q_heads, segments, dtype=torch.float32, device=q.device)
    segm_sum = torch.empty(rows, num_q_heads, segments, dtype=torch.float32, device=q.device)
    cu_seqlens_q = torch.arange(batch + 1, dtype=torch.int32, device=q.device)
    max_seqlen_k = int(seqlens.max())
    descale = torch.ones(1, dtype=torch.float32, device=q.device).expand(batch, num_kv_heads)
    out = torch.empty_like(q)

    def run(c):
        mod.unified_attention(
            q=c.q, k=c.k_cache, v=c.v_cache, out=out, cu_seqlens_q=cu_seqlens_q, max_seqlen_q=1,
            seqused_k=c.cache_seqlens, max_seqlen_k=max_seqlen_k, softmax_scale=1.0 / math.sqrt(head_dim),
            causal=True, window_size=(-1, -1), block_table=c.block_table, softcap=0, q_descale=None,
            k_descale=descale, v_descale=descale, seq_threshold_3D=threshold, num_par_softmax_segments=segments,
            softmax_segm_output=segm_out, softmax_segm_max=segm_max, softmax_segm_expsum=segm_sum,
        )  # fmt: skip
        return out

    run.keepalive = (segm_out, segm_max, segm_sum, cu_seqlens_q, descale)
    return run
