"""Greedy generation with flashdecode on a Llama-3-8B-shaped model (random bf16 weights, built on the GPU), with the
decode step captured in a CUDA graph; prints decode tokens/s next to transformers' generate (SDPA). Needs a CUDA GPU
with room for 8B bf16 weights (16 GB) and the KV cache; examples/generate_tiny_cpu.py is the CPU version.

    .venv/bin/python examples/generate_llama_gpu.py [--batch 8] [--new-tokens 64]
"""

import argparse
import time

import torch

from flashdecode.integrations.transformers import LLAMA3_8B_SHAPE, generate, random_llama

parser = argparse.ArgumentParser()
parser.add_argument("--batch", type=int, default=8)
parser.add_argument("--prompt-len", type=int, default=128)
parser.add_argument("--new-tokens", type=int, default=64)
args = parser.parse_args()

model = random_llama(LLAMA3_8B_SHAPE, torch.bfloat16, "cuda")
ids = torch.randint(0, model.config.vocab_size, (args.batch, args.prompt_len), device="cuda")
prompts = [row.tolist() for row in ids.cpu()]

generate(model, prompts, 4, cuda_graph=True)  # compile the kernels
out = generate(model, prompts, args.new_tokens, cuda_graph=True)
print(f"flashdecode: {out.decode_tokens / out.decode_s:.0f} decode tokens/s (batch {args.batch}, "
      f"CUDA graph {'on' if out.cuda_graph else 'off: ' + '; '.join(out.notes)})")  # fmt: skip

with torch.inference_mode():
    model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=4, do_sample=False, pad_token_id=0)
    times = {}
    for n in (1, args.new_tokens):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False, pad_token_id=0)
        torch.cuda.synchronize()
        times[n] = time.perf_counter() - t0
tok_s = args.batch * (args.new_tokens - 1) / (times[args.new_tokens] - times[1])
print(f"transformers generate (SDPA): {tok_s:.0f} decode tokens/s")
