"""Shared by the scripts that compile the kernels for sm_90 without a GPU (ttgir_ops.py, sass_loop_counts.py): the
signature and divisibility attributes a launch would give a kernel.

    from sm90_compile import signature   # scripts/ is on sys.path when a script there runs
"""

FLOATS = ("qk_scale", "softcap", "K_SCALE", "V_SCALE")


def signature(kernel, consts, pointers, unaligned=()):
    """(signature, attrs) for ``ASTSource`` / ``GluonASTSource``: constexprs from consts, the FLOATS as fp32,
    upper-case names as pointers (``pointers`` gives their types, else ``*i32``), the rest i32; every pointer and
    ``stride_*`` argument marked divisible by 16 (as a launch specialises them on an aligned cache) except the names
    in ``unaligned``."""
    sig = {}
    for name in kernel.arg_names:
        if name in consts:
            sig[name] = "constexpr"
        elif name in FLOATS:
            sig[name] = "fp32"
        elif name.isupper():
            sig[name] = pointers.get(name, "*i32")
        else:
            sig[name] = "i32"
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(kernel.arg_names)
             if name not in consts and name not in unaligned and (sig[name].startswith("*") or name.startswith("stride_"))}  # fmt: skip
    return sig, attrs
