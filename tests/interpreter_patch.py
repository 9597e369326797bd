"""A faster Triton interpreter for the CPU suite, with the same results.

Triton 3.6's interpreter re-patches ``triton.language`` at every call of a ``@triton.jit`` helper
(``InterpretedFunction.__call__`` runs ``_patch_lang``: ``inspect.getmembers`` over the language modules, ~2 ms),
though the kernel's own patch is still in force: for a module already patched in the running launch the repeat finds
no builtin left to wrap and sets the same attributes again. It took ~40% of the interpreter's time on the split-K
kernels (cProfile, 2026-11-29). ``patch_lang_once`` makes a helper's call patch only the language modules not yet
patched in the running launch (``tl.core``, reached from ``tl.zeros`` and friends, is the one the kernel's patch
leaves for them); the kernel's own patch and its restore are Triton's. tests/test_interpreter_patch.py checks that
the kernels' outputs are bit-identical with and without it.
"""

import triton.language as tl
from triton.runtime import interpreter


def patch_lang_once() -> bool:
    """Install the memoised ``_patch_lang`` into Triton's interpreter; False (nothing done) on a Triton without it."""
    original = getattr(interpreter, "_patch_lang", None)
    if original is None or not hasattr(interpreter, "_LangPatchScope") or hasattr(original, "__wrapped_once__"):
        return False
    patched = None  # ids of the language modules patched since the running launch's own patch; None between launches
    langs_of = {}  # function -> ids of tl / tl.core among its globals (what Triton's _patch_lang patches)

    def patch_lang(fn):
        nonlocal patched
        langs = langs_of.get(fn)
        if langs is None:
            langs = langs_of[fn] = frozenset(id(v) for v in fn.__globals__.values() if v is tl or v is tl.core)
        if patched is not None and langs <= patched:
            return interpreter._LangPatchScope()  # a helper's call: its modules are patched already
        scope = original(fn)
        if patched is not None:  # a helper's call that reached a module first (its patch outlives the launch, as in Triton)
            patched |= langs
            return scope
        patched = set(langs)  # the launch's own patch (GridExecutor), restored when the launch ends
        restore = scope.restore

        def restore_and_forget():
            nonlocal patched
            patched = None
            restore()

        scope.restore = restore_and_forget
        return scope

    patch_lang.__wrapped_once__ = original
    interpreter._patch_lang = patch_lang
    return True
