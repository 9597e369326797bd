"""A faster Triton interpreter for the CPU suite, with the same results: two pieces of work whose result Triton 3.6's
interpreter throws away, skipped (``install``, called by tests/conftest.py under TRITON_INTERPRET=1).

``patch_lang_once``: the interpreter re-patches ``triton.language`` at every call of a ``@triton.jit`` helper
(``InterpretedFunction.__call__`` runs ``_patch_lang``: ``inspect.getmembers`` over the language modules, ~2 ms),
though the kernel's own patch is still in force: for a module already patched in the running launch the repeat finds
no builtin left to wrap and sets the same attributes again. It took 42% of a small ``triton_splitk`` call's time
(cProfile, 2026-11-29). ``patch_lang_once`` makes a helper's call patch only the language modules not yet patched in
the running launch (``tl.core``, reached from ``tl.zeros`` and friends, is the one the kernel's patch leaves for
them); the kernel's own patch and its restore are Triton's.

``skip_discarded_overflow_checks``: every 32-bit integer add, sub and mul builds Triton's overflow check (both sides
cast to int64, the operation again, two compares, an and), then hands it to ``device_assert``, which returns without
looking unless ``options.debug`` is set, and the interpreter's options (``InterpreterOptions()``) never set it. 37%
of the fuzz test's ``triton_splitk`` examples' time once the first was gone. Skipped only while ``debug`` is off, so
a Triton that turned it on would get its check back.

tests/test_interpreter_patch.py checks that the kernels' outputs are bit-identical with and without both.
"""

import triton.language as tl
from triton.language.semantic import TritonSemantic
from triton.runtime import interpreter


def install() -> None:
    patch_lang_once()
    skip_discarded_overflow_checks()


def skip_discarded_overflow_checks() -> bool:
    """Make ``binary_op_sanitize_overflow_impl`` return at once for the interpreter's builder while its options'
    ``debug`` is off (``device_assert`` would discard the check); False (nothing done) on a Triton without it."""
    original = getattr(TritonSemantic, "binary_op_sanitize_overflow_impl", None)
    if original is None or hasattr(original, "__wrapped_once__"):
        return False

    def sanitize(self, lhs, rhs, binary_op):
        if isinstance(self.builder, interpreter.InterpreterBuilder) and not self.builder.options.debug:
            return None
        return original(self, lhs, rhs, binary_op)

    sanitize.__wrapped_once__ = original
    TritonSemantic.binary_op_sanitize_overflow_impl = sanitize
    return True


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
        if patched is not None:  # a helper reached a module first; its patch outlives the launch, as in Triton
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
