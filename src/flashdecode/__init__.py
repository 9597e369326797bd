"""flashdecode: paged-KV decode attention kernels in Triton.

Public surface: ``decode_attention`` (with ``plan_decode`` for lengths known on the host), ``merge_states`` and
``BACKENDS``; for serving, ``append_kv`` and ``PagedKVCache`` (custom ops in ``flashdecode.ops``, the transformers
loop in ``flashdecode.integrations``).
Importing does no work and touches no GPU.
"""

from .api import BACKENDS, decode_attention
from .append import append_kv
from .cache import CacheFullError, PagedKVCache
from .merge import merge_states
from .plan import DecodePlan, plan_decode

__all__ = [
    "BACKENDS", "decode_attention", "plan_decode", "DecodePlan", "merge_states", "append_kv", "PagedKVCache",
    "CacheFullError",
]  # fmt: skip
__version__ = "0.1.0"
