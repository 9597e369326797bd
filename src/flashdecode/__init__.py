"""flashdecode: paged-KV decode attention kernels in Triton.

Public surface: ``decode_attention``, ``merge_states`` and ``BACKENDS``; for serving, ``append_kv`` and
``PagedKVCache`` (custom ops in ``flashdecode.ops``, the transformers loop in ``flashdecode.integrations``).
Importing does no work and touches no GPU.
"""

from .api import BACKENDS, decode_attention
from .append import append_kv
from .cache import CacheFullError, PagedKVCache
from .merge import merge_states

__all__ = ["BACKENDS", "decode_attention", "merge_states", "append_kv", "PagedKVCache", "CacheFullError"]
__version__ = "0.1.0"
