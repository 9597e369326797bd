"""The transformers greedy loop produces exactly model.generate(do_sample=False)'s tokens on tiny random models.

Weights are drawn with initializer_range 0.1 (logits spread widely, so a wrong K/V, position or mask changes the
tokens within a few steps) in fp32, eos disabled. Each prompt is compared with generate() on that prompt alone.
"""

import pytest
import torch

transformers = pytest.importorskip("transformers")  # CI installs it ([test] extra); a guard for bare GPU images

from flashdecode import CacheFullError  # noqa: E402
from flashdecode.integrations.transformers import ATTENTION_NAME, generate  # noqa: E402

TINY = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    vocab_size=128, initializer_range=0.1, max_position_embeddings=256,
    eos_token_id=None, bos_token_id=None, pad_token_id=None,
)  # fmt: skip
ARCHS = {
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
    "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
}


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny matmuls: a second intra-op thread only adds wake-ups (10x slower on a loaded 2-core CI machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny_model(arch, seed=0, **overrides):
    config_cls, model_cls = ARCHS[arch]
    torch.manual_seed(seed)
    return model_cls(config_cls(**{**TINY, **overrides}, attn_implementation="sdpa")).eval()


def prompts_of(lengths, vocab=128, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in lengths]


def hf_greedy(model, prompt, max_new_tokens):
    """model.generate on one unpadded prompt (an explicit mask: token 0 would otherwise count as padding)."""
    ids = torch.tensor([prompt], device=model.device)
    out = model.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False,
        eos_token_id=None, pad_token_id=0,
    )  # fmt: skip
    return out[0, len(prompt) :].tolist()


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_single_prompt_equals_generate(arch):
    model = tiny_model(arch)
    [prompt] = prompts_of([11])
    res = generate(model, [prompt], 16, page_size=4, attention_backend="torch_sdpa", append_backend="torch")
    assert res.tokens == [hf_greedy(model, prompt, 16)]
    assert model.config._attn_implementation == "sdpa"  # restored
    # a prompt as a tokenizer returns it, [1, L]
    again = generate(model, [torch.tensor([prompt])], 16, page_size=4, attention_backend="torch_sdpa",
                     append_backend="torch")  # fmt: skip
    assert again.tokens == res.tokens


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_batched_prompts_continuous_batching_equal_generate(arch):
    """Four prompts of lengths 1 .. 33 through two batch rows: rows are freed and reused as sequences finish; a
    pool of 2 sequences' pages forces admission to wait for pages too."""
    model = tiny_model(arch, seed=1)
    prompts = prompts_of([5, 17, 1, 33], seed=2)
    new = 14
    pages_per_seq = -(-(33 + new) // 4)
    res = generate(model, prompts, new, max_batch=2, page_size=4, num_pages=2 * pages_per_seq,
                   attention_backend="torch_sdpa", append_backend="torch")  # fmt: skip
    assert res.tokens == [hf_greedy(model, p, new) for p in prompts]
    # 4 prompts x 13 decode tokens, never more than 2 rows per step: at least 26 steps
    assert res.decode_tokens == 4 * (new - 1) and res.decode_steps >= 2 * (new - 1)


def test_equal_length_prompts_prefill_together(monkeypatch):
    """Prompts of one length share a prefill forward (chunked by PREFILL_TOKENS: here 2 prompts of 6 per forward),
    mixed with other lengths: tokens equal generate() per prompt and generate() on the equal-length batch."""
    import flashdecode.integrations.transformers as integration

    monkeypatch.setattr(integration, "PREFILL_TOKENS", 12)
    model = tiny_model("llama", seed=3)
    prompts = prompts_of([6, 6, 9, 6, 6, 6], seed=4)
    forwards = []
    model.register_forward_pre_hook(lambda mod, args, kw: forwards.append(kw["input_ids"].shape), with_kwargs=True)
    res = generate(model, prompts, 10, page_size=4, attention_backend="torch_sdpa", append_backend="torch")
    prefills = [tuple(shape) for shape in forwards if shape[1] > 1]
    assert sorted(prefills) == [(1, 6), (1, 9), (2, 6), (2, 6)]
    assert res.tokens == [hf_greedy(model, p, 10) for p in prompts]
    ids = torch.tensor([p for p in prompts if len(p) == 6])
    batched = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=10, do_sample=False,
                             eos_token_id=None, pad_token_id=0)  # fmt: skip
    assert [t for t, p in zip(res.tokens, prompts) if len(p) == 6] == batched[:, 6:].tolist()


def test_one_new_token_with_more_prompts_than_rows():
    """Sequences that finish at their prefill token free their rows at once, so the queue keeps draining."""
    model = tiny_model("llama")
    prompts = prompts_of([3, 3, 3, 5, 3], seed=5)
    res = generate(model, prompts, 1, max_batch=2, page_size=4, attention_backend="torch_sdpa", append_backend="torch")
    assert res.tokens == [hf_greedy(model, p, 1) for p in prompts] and res.decode_steps == 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter runs without a GPU; test_gpu_serving covers it")
def test_triton_kernels_through_interpreter():
    """The Triton append and decode kernels (interpreter on CPU) inside the loop, on a one-layer model."""
    model = tiny_model("llama", seed=3, num_hidden_layers=1)
    prompts = prompts_of([3, 6], seed=4)
    res = generate(model, prompts, 5, page_size=4, attention_backend="triton", append_backend="triton")
    assert res.tokens == [hf_greedy(model, p, 5) for p in prompts]


def test_eos_stops_and_frees():
    model = tiny_model("llama", seed=5)
    prompts = prompts_of([4, 9, 2], seed=6)
    want = [hf_greedy(model, p, 10) for p in prompts]
    eos = want[1][4]  # the fifth token of the second prompt
    res = generate(model, prompts, 10, max_batch=2, page_size=4, eos_token_id=eos,
                   attention_backend="torch_sdpa", append_backend="torch")  # fmt: skip
    for got, full in zip(res.tokens, want):
        cut = full.index(eos) + 1 if eos in full else len(full)
        assert got == full[:cut]
    # Hugging Face's own form (a list, as in generation_config) and a tensor stop at the same tokens
    for eos_ids in ([eos, 10**6], torch.tensor([eos])):
        again = generate(model, prompts, 10, max_batch=2, page_size=4, eos_token_id=eos_ids,
                         attention_backend="torch_sdpa", append_backend="torch")  # fmt: skip
        assert again.tokens == res.tokens


def test_sliding_window_refused_unless_it_masks_nothing():
    """Mistral passes its config's sliding_window to every layer (no layer_types): a window shorter than the
    sequences is refused (the loop attended to every token, giving other tokens); a window longer than them masks
    nothing, and the tokens equal generate()'s."""
    prompt = prompts_of([12])
    # 12 + 8 - 1 = 19 tokens at most a query attends to (the last token is never fed back), whatever the page size
    for window in (4, 18):
        with pytest.raises(ValueError, match=rf"sliding_window={window} is shorter than the 19 tokens"):
            generate(tiny_model("mistral", sliding_window=window), prompt, 8, attention_backend="torch_sdpa",
                     append_backend="torch")  # fmt: skip
    model = tiny_model("mistral", sliding_window=19)
    res = generate(model, prompt, 8, page_size=16, attention_backend="torch_sdpa", append_backend="torch")
    assert res.tokens == [hf_greedy(model, prompt[0], 8)]


@pytest.mark.parametrize("kwargs, match", [
    (dict(softcap=30.0), "does not implement softcap"),
    (dict(s_aux=torch.zeros(4)), "does not implement s_aux"),
    (dict(sliding_window=8), "sliding_window=8 is shorter than the 16 tokens"),
])  # fmt: skip
def test_attention_refuses_arguments_it_would_ignore(kwargs, match):
    """Whatever the model, a layer passing logit softcapping, sinks or a window that masks something is refused
    at its forward rather than computed without them."""
    from types import SimpleNamespace

    from flashdecode import PagedKVCache
    from flashdecode.integrations.transformers import StepContext, paged_attention_forward

    cache = PagedKVCache(1, 2, 16, num_pages=4, page_size=4, max_batch=1, max_seq_len=16, device="cpu")
    step = StepContext(cache, torch.full((1,), -1, dtype=torch.int32), prefill=False)
    q, kv = torch.randn(1, 4, 1, 16), torch.randn(1, 2, 1, 16)
    with pytest.raises(ValueError, match=match):
        paged_attention_forward(SimpleNamespace(layer_idx=0), q, kv, kv, None, flashdecode_step=step, **kwargs)
    out, _ = paged_attention_forward(SimpleNamespace(layer_idx=0), q, kv, kv, None, flashdecode_step=step,
                                     sliding_window=16, softcap=None)  # fmt: skip
    assert out.shape == (1, 1, 4, 16)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(prompts=[]), ValueError, "prompts must hold at least one prompt"),
    (dict(prompts=torch.tensor([1, 2, 3])), ValueError, r"must be 2-D \[num_prompts, length\], got shape \(3,\)"),
    (dict(prompts=[[1, 2], [1.5, 2.0]]), TypeError, r"prompts\[1\] must hold integer token ids, got torch.float32"),
    (dict(prompts=[[1, 2], []]), ValueError, r"prompts\[1\] must be a non-empty 1-D token sequence"),
    (dict(prompts=[[[1, 2], [3, 4]]]), ValueError, r"prompts\[0\] must be a non-empty 1-D token sequence, got shape \(2, 2\)"),
    (dict(page_size=0), ValueError, "page_size must be an int >= 1, got 0"),
    (dict(max_batch=0), ValueError, "max_batch must be an int >= 1 or None, got 0"),
    (dict(num_pages=2.0), ValueError, "num_pages must be an int >= 1 or None, got 2.0"),
    (dict(eos_token_id="2"), TypeError, "eos_token_id must be an int, a list of ints or None, got '2'"),
    (dict(eos_token_id=True), TypeError, "eos_token_id must be an int, a list of ints or None, got True"),
])  # fmt: skip
def test_generate_argument_errors(kwargs, error, match):
    args = dict(prompts=[[1, 2, 3]], page_size=4, attention_backend="torch_sdpa", append_backend="torch") | kwargs
    model = tiny_model("llama")
    with pytest.raises(error, match=match):
        generate(model, args.pop("prompts"), 2, **args)
    assert model.config._attn_implementation == "sdpa"


def test_model_split_over_devices_is_refused():
    """One paged cache on model.device: a model whose layers sit on several devices is refused up front."""
    model = tiny_model("llama")
    model.model.layers[-1].to("meta")  # parameters on cpu and meta, as a device_map split leaves them
    with pytest.raises(ValueError, match=r"takes a model on one device, got \['cpu', 'meta'\]"):
        generate(model, [[1, 2, 3]], 2, attention_backend="torch_sdpa", append_backend="torch")
    assert model.config._attn_implementation == "sdpa"


def test_prompt_too_long_for_the_pool():
    model = tiny_model("llama")
    with pytest.raises(CacheFullError, match=r"prompt 1 \(20 tokens \+ 4 new\) needs 6 pages, the pool has 5"):
        generate(model, prompts_of([3, 20]), 4, page_size=4, num_pages=5, attention_backend="torch_sdpa")


def test_attention_name_follows_transformers_rules():
    assert "flash" not in ATTENTION_NAME and not ATTENTION_NAME.startswith("paged|") and "/" not in ATTENTION_NAME


def test_decode_step_of_a_model_compiles_fullgraph():
    """A whole model's decode step through the registered attention (custom ops inside) compiles with
    fullgraph=True, and the compiled step gives the eager step's logits and cache writes."""
    from flashdecode import PagedKVCache
    from flashdecode.integrations.transformers import StepContext, register

    model = tiny_model("llama", seed=7)
    model.set_attn_implementation(register())
    gen = torch.Generator().manual_seed(8)
    pools = torch.randn(2, 2, 16, 4, 2, 16, generator=gen)  # [layers, k/v, pages, page, Hkv, D]
    ids = torch.tensor([3, 77])

    def run(compile_):
        cache = PagedKVCache(2, 2, 16, num_pages=16, page_size=4, max_batch=2, max_seq_len=32, device="cpu")
        for layer in range(2):
            cache.k_pools[layer].copy_(pools[layer, 0])
            cache.v_pools[layer].copy_(pools[layer, 1])
        for length in (5, 8):
            cache.add_sequence(length)
        cache.grow()
        step = StepContext(cache, cache.slot_mapping, prefill=False, attention_backend="torch_sdpa",
                           append_backend="torch")  # fmt: skip

        def decode(ids):
            positions = cache.update_step_tensors()
            return model(input_ids=ids[:, None], position_ids=positions[:, None], use_cache=False,
                         logits_to_keep=1, flashdecode_step=step).logits  # fmt: skip

        torch._dynamo.reset()
        fn = torch.compile(decode, fullgraph=True, backend="aot_eager") if compile_ else decode
        with torch.no_grad():
            return fn(ids), cache

    (eager, eager_cache), (compiled, compiled_cache) = run(False), run(True)
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-6)
    for layer in range(2):
        assert torch.equal(compiled_cache.k_pools[layer], eager_cache.k_pools[layer])
        assert not torch.equal(eager_cache.k_pools[layer], pools[layer, 0])  # the step did write
    assert compiled_cache.seqlens.tolist() == eager_cache.seqlens.tolist() == [6, 9]
