"""Greedy generation with flashdecode's paged cache on a tiny random Llama, on the CPU, checked against generate().

    .venv/bin/python examples/generate_tiny_cpu.py
"""

import time

import torch

from flashdecode.integrations.transformers import generate, random_llama

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=128, max_position_embeddings=512)  # fmt: skip

torch.set_num_threads(1)
torch.manual_seed(0)
model = random_llama(TINY, torch.float32, "cpu", std=0.1)
prompts = [torch.randint(0, 128, (n,)).tolist() for n in (5, 12, 30, 7)]

t0 = time.perf_counter()
# two batch rows for four prompts: finished sequences free their pages, queued prompts join
out = generate(model, prompts, 24, max_batch=2, page_size=8)
elapsed = time.perf_counter() - t0
print(f"flashdecode loop: {sum(map(len, out.tokens))} tokens in {elapsed:.2f} s "
      f"({out.decode_tokens / out.decode_s:.0f} decode tokens/s, {out.decode_steps} batched steps)")  # fmt: skip
for prompt, tokens in zip(prompts, out.tokens):
    ids = torch.tensor([prompt])
    ref = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, do_sample=False, pad_token_id=0)
    print(f"prompt of {len(prompt):2d} tokens -> {tokens[:8]}...  equal to generate(): {ref[0, len(prompt):].tolist() == tokens}")
