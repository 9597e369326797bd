"""flashdecode: paged-KV decode attention kernels in Triton.

Public surface: ``decode_attention``, ``merge_states`` and ``BACKENDS``. Importing does no work and touches no GPU.
"""

from .api import BACKENDS, decode_attention
from .merge import merge_states

__all__ = ["BACKENDS", "decode_attention", "merge_states"]
__version__ = "0.1.0"
