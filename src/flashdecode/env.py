"""The library's on/off environment switches, read one way.

FLASHDECODE_DEBUG, FLASHDECODE_LAUNCH_CACHE, FLASHDECODE_DIRECT_LAUNCH, FLASHDECODE_EARLY_PAGES and
FLASHDECODE_DEFER_SUM: "0", "false", "no" and "off" (any case) turn a switch off, any other value turns it on, and
an unset or empty variable keeps the switch's default (``VAR=`` usually means "unset"). TRITON_INTERPRET is
Triton's: ``triton_common.interpreting`` asks Triton how it reads it.
"""

from __future__ import annotations

import os

OFF = frozenset(("0", "false", "no", "off"))


def env_flag(name: str, default: bool) -> bool:
    """The switch ``name``: ``default`` when unset or empty, else False for the OFF spellings, True for the rest."""
    value = os.environ.get(name, "").strip().lower()
    return default if not value else value not in OFF
