"""Greedy generation for Hugging Face transformers causal LMs over flashdecode's paged KV cache.

How it plugs in, through transformers' public extension points only (transformers 5.x):

* ``AttentionInterface.register(ATTENTION_NAME, paged_attention_forward)``: every attention layer of a model whose
  ``config._attn_implementation`` is ATTENTION_NAME calls our function with the rotated query/key/value
  ([B, H, S, D]). The name must not contain "flash" (transformers then treats it as a flash-attention kernel),
  start with "paged|" (its own paged implementations) or contain "/" (a hub kernel repository).
* ``AttentionMaskInterface.register(ATTENTION_NAME, paged_attention_mask)``: the mask under the same name builds
  nothing. Prefill runs prompts of one length together (causal, no padding), decode masks by the cache's lengths.
* Explicit ``position_ids`` on every forward: the model runs with ``use_cache=False`` (its own cache would be
  filled too), so without them every decode step would be rotated as position 0.
* Our state reaches the attention layers through the forward's ``**kwargs`` (``flashdecode_step=StepContext``).

The loop (``generate``): each prompt gets a batch row of a ``PagedKVCache``; the prompts admitted together are
prefilled in groups of equal length (no padding, so each group is one batched forward with the model's causal SDPA
attention, the same computation as ``model.generate`` on those prompts) while their K/V is written into their
pages (``append_kv``); decode steps then run the whole batch
(fixed size ``max_batch``, inactive rows masked) through ``torch.ops.flashdecode.append_kv`` and
``torch.ops.flashdecode.decode_attention``. A sequence that reaches ``max_new_tokens`` (or ``eos_token_id``) frees
its pages and row at once, and queued prompts join at the next step (continuous batching). On CUDA the decode step
(cache step tensors, model forward, argmax) can be captured once in a CUDA graph and replayed while lengths grow.
``model.generate`` cannot carry this cache, so the loop is ours.
"""

from __future__ import annotations

import collections
import math
import time
from dataclasses import dataclass, field

import torch
import transformers
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface

from .. import ops  # noqa: F401 (registers torch.ops.flashdecode.*)
from ..cache import CacheFullError, PagedKVCache

__all__ = [
    "ATTENTION_NAME", "StepContext", "GenerateOutput", "register", "generate", "paged_attention_forward",
    "random_llama", "LLAMA3_8B_SHAPE",
]  # fmt: skip

ATTENTION_NAME = "fd_paged"
# most prompt tokens in one prefill forward (bounds its activations; prompts longer than this run alone)
PREFILL_TOKENS = 16384


@dataclass
class StepContext:
    """What the attention layers need for one forward: the cache, the slots of this forward's tokens and the mode.

    slot_mapping: [N] int32, N = G x prompt length (prefill of G prompts of one length, row-major) or max_batch
        (decode; -1 for inactive rows).
    longest: the most tokens a query of the loop attends to (the longest prompt + max_new_tokens - 1: the last
        token is generated, never fed back); None: the cache's max_seq_len. A sliding window at least this long
        masks nothing.
    """

    cache: PagedKVCache
    slot_mapping: torch.Tensor
    prefill: bool
    attention_backend: str = "auto"
    append_backend: str = "auto"
    longest: int | None = None


def paged_attention_forward(
    module, query, key, value, attention_mask, scaling=None, dropout=0.0, flashdecode_step=None, **kwargs
):
    """The attention function transformers calls for ATTENTION_NAME.

    Args:
        module: the attention layer (its ``layer_idx`` picks the cache's pools).
        query: [B, Hq, S, D]; key, value: [B, Hkv, S, D], rotary embedding applied.
        attention_mask: ignored (paged_attention_mask builds none).
        scaling: the softmax scale.
        flashdecode_step: the StepContext passed to the model's forward.
        kwargs: the layer's other attention arguments. Those that change the result and that this function does
            not implement raise ValueError: ``softcap``, ``s_aux`` (sinks), and a ``sliding_window`` shorter than
            ``flashdecode_step.longest`` (a window that long masks nothing).

    Returns:
        (attn_output [B, S, Hq, D], None).
    """
    step = flashdecode_step
    if step is None:
        raise ValueError(
            f"attention {ATTENTION_NAME!r} needs flashdecode_step=StepContext(...) in the model's forward kwargs; "
            "use flashdecode.integrations.transformers.generate"
        )
    if dropout:
        raise ValueError(f"attention {ATTENTION_NAME!r} is for inference, got dropout={dropout}")
    cache, layer = step.cache, module.layer_idx
    _refuse_unsupported(kwargs, step.longest or cache.max_seq_len)
    k_pool, v_pool = cache.k_pools[layer], cache.v_pools[layer]
    if step.prefill:
        groups, num_kv_heads, length, head_dim = key.shape
        if step.slot_mapping.numel() != groups * length:
            raise ValueError(f"prefill of {groups} x {length} tokens got {step.slot_mapping.numel()} slots")
        # [G, Hkv, L, D] -> [G * L, Hkv, D], row-major like the slots
        flat = lambda t: t.transpose(1, 2).reshape(groups * length, num_kv_heads, head_dim)  # noqa: E731
        torch.ops.flashdecode.append_kv(flat(key), flat(value), k_pool, v_pool, step.slot_mapping, step.append_backend)
        # unpadded prompts of one length: causal SDPA over the prompts themselves, as transformers' own prefill
        # computes it (its all-ones mask is skipped for is_causal=True)
        return sdpa_attention_forward(module, query, key, value, None, dropout=0.0, scaling=scaling)
    # decode: one token per row; [B, H, 1, D] -> [B, H, D]
    torch.ops.flashdecode.append_kv(
        key[:, :, 0], value[:, :, 0], k_pool, v_pool, step.slot_mapping, step.append_backend
    )
    out = torch.ops.flashdecode.decode_attention(
        query[:, :, 0], k_pool, v_pool, cache.seqlens, cache.block_table, scaling, step.attention_backend, None
    )
    return out[:, None], None


def _refuse_unsupported(attention_kwargs, longest):
    """ValueError for an attention argument that would change the result and that the paged path ignores; a
    sliding window (Hugging Face's: a query sees that many tokens, itself included) of at least ``longest`` tokens
    masks nothing."""
    for name in ("softcap", "s_aux"):
        if attention_kwargs.get(name) is not None:
            raise ValueError(f"attention {ATTENTION_NAME!r} does not implement {name}; the model's layers pass {name}")
    window = attention_kwargs.get("sliding_window")
    if window is not None and window < longest:
        raise ValueError(
            f"attention {ATTENTION_NAME!r} does not implement sliding windows: sliding_window={window} is shorter "
            f"than the {longest} tokens a query attends to (the longest prompt + max_new_tokens - 1)"
        )


def paged_attention_mask(*args, **kwargs):
    """The mask for ATTENTION_NAME: none (prefill is causal SDPA on unpadded prompts; decode reads cache lengths)."""
    return None


def register() -> str:
    """Register the attention and mask functions under ATTENTION_NAME (idempotent); returns the name."""
    AttentionInterface.register(ATTENTION_NAME, paged_attention_forward)
    AttentionMaskInterface.register(ATTENTION_NAME, paged_attention_mask)
    return ATTENTION_NAME


@dataclass
class GenerateOutput:
    """Result of ``generate``.

    tokens: the new tokens of each prompt, in the prompts' order.
    prefill_s / decode_s: wall time of prefills (with their first tokens) and of decode steps, synchronised.
    decode_steps: batched decode steps run. decode_tokens: tokens those steps produced (active rows only).
    cuda_graph: whether decode steps replayed a CUDA graph.
    """

    tokens: list[list[int]]
    prefill_s: float = 0.0
    decode_s: float = 0.0
    decode_steps: int = 0
    decode_tokens: int = 0
    cuda_graph: bool = False
    notes: list[str] = field(default_factory=list)


def generate(
    model,
    prompts,
    max_new_tokens,
    *,
    max_batch=None,
    page_size=16,
    num_pages=None,
    eos_token_id=None,
    attention_backend="auto",
    append_backend="auto",
    cuda_graph=False,
):
    """Greedy decoding of every prompt with flashdecode's paged cache and kernels; continuous batching.

    Args:
        model: a transformers causal LM using the AttentionInterface (Llama, Qwen2, Mistral, ...), in eval mode.
            Its attention implementation is switched to ATTENTION_NAME for the call and restored afterwards.
        prompts: a non-empty list of non-empty 1-D token sequences (lists of ints or integer tensors, [1, L] ones
            too, as a tokenizer returns them), of any lengths, or a 2-D integer tensor of prompts of one length.
        max_new_tokens: tokens to generate per prompt (fewer if an ``eos_token_id`` comes first; it is kept).
        max_batch: batch rows, i.e. sequences resident at once (default: all prompts). Further prompts wait in a
            queue and join when a sequence finishes.
        page_size, num_pages: the cache's pages; num_pages defaults to enough for max_batch sequences of the
            longest prompt + max_new_tokens. A prompt is admitted only when the pool can hold it to the end.
        eos_token_id: an int or a list of ints that end a sequence; None: no token does. (``model.generate``
            reads ``model.generation_config.eos_token_id`` when given none: pass it here for the same stops.)
        attention_backend: ``decode_attention``'s backend for decode steps ("auto": Triton on CUDA).
        append_backend: ``append_kv``'s backend ("auto": Triton on CUDA).
        cuda_graph: capture the decode step in a CUDA graph once and replay it (CUDA only). If capture fails, the
            loop runs eagerly and says why in ``notes``.

    Returns:
        GenerateOutput; ``tokens[i]`` equals ``model.generate(prompts[i], do_sample=False)``'s new tokens with the
        same eos ids, up to floating-point near-ties between the top two logits.

    Raises:
        ValueError / TypeError naming the argument for a bad one; ValueError for a model split over devices
        (``device_map``; ``decode_attention`` itself takes tensors on any GPU), for a model with sliding-window layers
        (``layer_types``, or a ``sliding_window`` shorter than the longest prompt + max_new_tokens - 1, the most
        tokens a query attends to), logit softcapping or sinks.
    """
    prompts = _prompt_ids(prompts)
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
    for name, value in dict(page_size=page_size, max_batch=max_batch, num_pages=num_pages).items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{name} must be an int >= 1{'' if name == 'page_size' else ' or None'}, got {value!r}")
    eos = _eos_ids(eos_token_id)
    config = model.config
    layer_types = getattr(config, "layer_types", None) or []
    if any(t != "full_attention" for t in layer_types):
        raise ValueError(f"only full-attention layers are supported, got layer_types {sorted(set(layer_types))}")
    devices = sorted({str(p.device) for p in model.parameters()})
    if len(devices) > 1:
        # one paged cache on model.device: the layers elsewhere would get a device-mismatch error mid-prefill
        raise ValueError(f"the loop keeps one cache on model.device and takes a model on one device, got {devices}")
    device, dtype = model.device, model.dtype
    if cuda_graph and device.type != "cuda":
        raise ValueError(f"cuda_graph=True needs a model on CUDA, got {device}")
    max_batch = max_batch or len(prompts)
    max_seq_len = max(p.numel() for p in prompts) + max_new_tokens
    pages_per_seq = math.ceil(max_seq_len / page_size)
    cache = PagedKVCache(
        config.num_hidden_layers,
        config.num_key_value_heads,
        getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads,
        num_pages=num_pages or max_batch * pages_per_seq,
        page_size=page_size,
        max_batch=max_batch,
        max_seq_len=max_seq_len,
        dtype=dtype,
        device=device,
    )
    # models without layer_types (Mistral, Phi3, ...) pass the config's window to every layer: refuse it up front
    # rather than at the first forward (the forward checks what each layer passes, whatever the model)
    if not layer_types:
        _refuse_unsupported(dict(sliding_window=getattr(config, "sliding_window", None)), max_seq_len - 1)
    previous = config._attn_implementation
    model.set_attn_implementation(register())
    try:
        with torch.inference_mode():
            return _Loop(model, cache, prompts, max_new_tokens, eos, attention_backend, append_backend).run(
                cuda_graph
            )
    finally:
        model.set_attn_implementation(previous)


def _prompt_ids(prompts):
    """The prompts as a list of 1-D int64 CPU tensors; ValueError / TypeError naming the prompt at fault."""
    if isinstance(prompts, torch.Tensor) and prompts.dim() != 2:
        raise ValueError(f"prompts as one tensor must be 2-D [num_prompts, length], got shape {tuple(prompts.shape)}")
    ids = []
    for i, prompt in enumerate(prompts):
        t = torch.as_tensor(prompt)
        if t.dim() == 2 and t.shape[0] == 1:  # one prompt as a tokenizer returns it, [1, L]
            t = t[0]
        if t.dim() != 1 or t.numel() == 0:
            raise ValueError(f"prompts[{i}] must be a non-empty 1-D token sequence, got shape {tuple(t.shape)}")
        if t.dtype == torch.bool or t.is_floating_point() or t.is_complex():
            raise TypeError(f"prompts[{i}] must hold integer token ids, got {t.dtype}")
        ids.append(t.to(torch.long).cpu())
    if not ids:
        raise ValueError("prompts must hold at least one prompt, got none")
    return ids


def _eos_ids(eos_token_id):
    """eos_token_id (None, an int, or ints in a list / tuple / set / tensor) as a frozenset of ints."""
    if eos_token_id is None:
        return frozenset()
    ids = eos_token_id.flatten().tolist() if isinstance(eos_token_id, torch.Tensor) else eos_token_id
    ids = [ids] if isinstance(ids, int) else ids
    if not isinstance(ids, (list, tuple, set, frozenset)) or not all(
        isinstance(x, int) and not isinstance(x, bool) for x in ids
    ):
        raise TypeError(f"eos_token_id must be an int, a list of ints or None, got {eos_token_id!r}")
    return frozenset(ids)


class _Loop:
    """State of one ``generate`` call: the queue, the running rows, the static decode-step buffers."""

    def __init__(self, model, cache, prompts, max_new_tokens, eos, attention_backend, append_backend):
        self.model, self.cache, self.prompts = model, cache, prompts
        # eos: frozenset of token ids that end a sequence
        self.max_new_tokens, self.eos = max_new_tokens, eos
        # what every StepContext of the loop carries besides the cache, the slots and the mode
        longest = max(p.numel() for p in prompts) + max_new_tokens - 1
        self.step_fields = dict(attention_backend=attention_backend, append_backend=append_backend, longest=longest)
        self.out = GenerateOutput(tokens=[[] for _ in prompts])
        self.queue = collections.deque(range(len(prompts)))
        # row -> prompt index
        self.running: dict[int, int] = {}
        # [max_batch] the token each row feeds to the next decode step, updated in place by the step
        self.next_tokens = torch.zeros(cache.max_batch, dtype=torch.long, device=model.device)
        self.decode_step = StepContext(cache, cache.slot_mapping, prefill=False, **self.step_fields)
        self.graph = None

    def run(self, cuda_graph):
        if cuda_graph:
            self._capture()
        while self.queue or self.running:
            t0 = self._now()
            while self.queue and self._fits(self.queue[0]):
                admitted = []  # (row, prompt index)
                while self.queue and self._fits(self.queue[0]):
                    i = self.queue.popleft()
                    row = self.cache.add_sequence(self.prompts[i].numel())
                    self.running[row] = i
                    admitted.append((row, i))
                self._prefill(admitted)  # sequences done at their first token free their rows: admit again
            self.out.prefill_s += self._now() - t0
            if not self.running:
                if not self.queue:
                    break
                i = self.queue[0]
                raise CacheFullError(
                    f"prompt {i} ({self.prompts[i].numel()} tokens + {self.max_new_tokens} new) needs "
                    f"{self._pages_to_finish(i)} pages, the pool has {self.cache.num_pages}"
                )
            t0 = self._now()
            self.cache.grow()
            if self.graph is not None:
                self.graph.replay()
            else:
                self._step()
            tokens = self.next_tokens.tolist()
            self.out.decode_steps += 1
            self.out.decode_tokens += len(self.running)
            for row, i in list(self.running.items()):
                self._emit(row, i, tokens[row])
            self.out.decode_s += self._now() - t0
        return self.out

    def _now(self):
        if self.model.device.type == "cuda":
            torch.cuda.synchronize(self.model.device)
        return time.perf_counter()

    def _pages_to_finish(self, i):
        return self.cache.pages_needed(self.prompts[i].numel() + self.max_new_tokens)

    def _fits(self, i):
        """A free row, and pages for prompt i to the end on top of what the running sequences will still take."""
        if not self.cache.num_free_rows:
            return False
        promised = sum(self._pages_to_finish(j) - len(self.cache.pages_of(r)) for r, j in self.running.items())
        return self._pages_to_finish(i) <= self.cache.num_free_pages - promised

    def _prefill(self, admitted):
        """Admitted prompts through the model, one forward per group of equal length (at most PREFILL_TOKENS
        tokens, in admission order): K/V into their rows' pages, first tokens from the last logits."""
        groups = collections.defaultdict(list)
        for row, i in admitted:
            groups[self.prompts[i].numel()].append((row, i))
        device = self.model.device
        for length, members in groups.items():
            per_forward = max(1, PREFILL_TOKENS // length)
            for start in range(0, len(members), per_forward):
                chunk = members[start : start + per_forward]
                rows = [row for row, _ in chunk]
                # [G, L] tokens, [G * L] slots row-major
                ids = torch.stack([self.prompts[i] for _, i in chunk]).to(device)
                slots = torch.cat([self.cache.slots(row, 0, length) for row in rows])
                step = StepContext(self.cache, slots, prefill=True, **self.step_fields)
                logits = self.model(
                    input_ids=ids,
                    position_ids=torch.arange(length, device=device)[None].expand(len(chunk), length),
                    use_cache=False,
                    logits_to_keep=1,
                    flashdecode_step=step,
                ).logits
                tokens = logits[:, -1].argmax(-1)  # [G]
                self.next_tokens.index_copy_(0, torch.tensor(rows, device=device), tokens)
                for (row, i), token in zip(chunk, tokens.tolist()):
                    self._emit(row, i, token)

    def _emit(self, row, i, token):
        """Record prompt i's next token; a finished sequence frees its row and pages."""
        self.out.tokens[i].append(token)
        if len(self.out.tokens[i]) >= self.max_new_tokens or token in self.eos:
            del self.running[row]
            self.cache.free(row)

    def _step(self):
        """One decode step on the device: cache step tensors, forward of every row, greedy tokens in place."""
        positions = self.cache.update_step_tensors()
        logits = self.model(
            input_ids=self.next_tokens[:, None],
            position_ids=positions[:, None],
            use_cache=False,
            logits_to_keep=1,
            flashdecode_step=self.decode_step,
        ).logits
        self.next_tokens.copy_(torch.where(self.cache.active, logits[:, -1].argmax(-1), 0))

    def _capture(self):
        """Capture _step in a CUDA graph while every row is inactive (so warm-up runs change no state)."""
        assert not self.running, "capture before any sequence is admitted"
        try:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):
                    self._step()
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                self._step()
            self.graph = graph
            self.out.cuda_graph = True
        except Exception as exc:  # a model whose forward cannot be captured still generates, eagerly
            self.out.notes.append(f"CUDA graph capture failed, decoding eagerly: {type(exc).__name__}: {exc}")
            torch.cuda.synchronize()


# Llama-3-8B's architecture (the weights are random: see random_llama)
LLAMA3_8B_SHAPE = dict(
    hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
    vocab_size=128256, max_position_embeddings=8192, rope_theta=500000.0, rms_norm_eps=1e-5,
)  # fmt: skip


def random_llama(shape, dtype=torch.bfloat16, device="cuda", *, seed=0, std=0.02):
    """A LlamaForCausalLM of the given config fields with random weights, made directly on ``device``.

    Built on the meta device, materialised with ``to_empty`` and initialised in place (matrices normal(0, std),
    norm weights 1) from a seeded generator on ``device``: an 8B model never touches host memory, nothing is
    downloaded. eos/bos/pad are unset, so generation never stops early; attention starts as "sdpa".
    """
    config = transformers.LlamaConfig(
        **shape, eos_token_id=None, bos_token_id=None, pad_token_id=None, tie_word_embeddings=False,
        attn_implementation="sdpa",
    )  # fmt: skip
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config)
    model = model.to(dtype=dtype).to_empty(device=device).eval()
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            # 1-D parameters are the RMSNorm weights
            if p.dim() == 1:
                p.fill_(1.0)
            else:
                p.normal_(0.0, std, generator=gen)
    # to_empty left the non-persistent rotary buffers uninitialised: rebuild them (fp32, as from_pretrained has)
    with torch.device(device):
        model.model.rotary_emb = type(model.model.rotary_emb)(config=config)
    return model
