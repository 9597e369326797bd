"""The cached launcher: an eager call's host work done once per argument metadata, not on every call.

``decode_attention`` with the Triton backends spends most of an eager call's time on the host: choosing the
backend, building ~40 launch arguments per kernel, and Triton's ``JITFunction.run`` binding and specialising them
again (docs/design.md). None of that depends on the tensors' contents or addresses, only on their metadata, which
``api._validate`` already turns into a key. So the first call of a key runs as usual while this module records its
launches, and later calls replay them:

- ``launch(kernel, grid, *args, **kwargs)`` is ``kernel[grid](*args, **kwargs)``; while a call is recorded it also
  keeps the compiled kernel, the grid and every argument. ``workspace(shape, dtype, device)`` is ``torch.empty``,
  noted the same way.
- ``Replay`` resolves each recorded tensor argument to the call input it points at (by address: the backends pass
  views of the inputs that start where they do) or to a workspace. A launch with an argument it cannot resolve (a
  tensor that is neither, or an object that holds an address, like a TMA descriptor) makes the key uncacheable.
- A replay allocates the workspaces (one buffer) and hands the arguments straight to each compiled kernel's
  launcher, the call that ``JITFunction.run`` ends with, from one generated straight-line function per recording;
  where that launcher is Triton's thin Python wrapper, to the C function under it (``_direct_launch``).
  Under the interpreter it calls ``kernel[grid]`` with the rebuilt arguments, so the CPU tests exercise the same
  resolution. ``append_kv`` records and replays its launch the same way.

What makes a replay valid: the key holds everything the host work reads (the caller's options and the metadata of
every input), and how the inputs' addresses relate: which of them are the same address (out = q), and each address
modulo 16, which Triton specialises pointer arguments on. Module constants (the tile tables, the planner's knobs)
are read while recording: a script that changes one between calls must call ``clear()``.
"""

from __future__ import annotations

import functools
import inspect
import threading

import torch

from .env import env_flag

# FLASHDECODE_LAUNCH_CACHE=0 turns replays off (every call runs the backend's host code and Triton's binding)
ENABLED = env_flag("FLASHDECODE_LAUNCH_CACHE", True)
# keys remembered; cleared when full (a caller cycling through more shapes than this pays the slow path)
MAX_ENTRIES = 256
# replays call the C launch function under Triton's launcher wrapper where that is safe (``_direct_launch``);
# FLASHDECODE_DIRECT_LAUNCH=0 (or False here, then ``clear()``): always the wrapper
DIRECT = env_flag("FLASHDECODE_DIRECT_LAUNCH", True)
# a key whose launches could not be resolved: always the slow path
UNCACHEABLE = object()
# byte alignment of each workspace in a compiled replay's single buffer (the allocator's own blocks are 512-aligned;
# Triton specialises pointers on 16)
_WORKSPACE_ALIGN = 256
# argument values a replay may pass on unchanged: anything else (a tensor it cannot place, a descriptor) is refused
_CONSTANT_TYPES = (int, float, bool, str, type(None), torch.dtype)

_cache: dict = {}
_local = threading.local()


def clear() -> None:
    """Forget every recorded call (after changing a module constant that the backends read on the host)."""
    _cache.clear()


# shared memory the GPU keeps per resident program (sm_80 and newer), on top of the kernel's own
_SMEM_RESERVED_PER_PROGRAM = 1024
# ...its allocation unit, and the most a launch may ask for without opting in per kernel
_SMEM_UNIT, _SMEM_DEFAULT_MAX = 128, 48 * 1024
# compiled kernel -> the programs per SM it was capped at (``cap_programs_per_sm``)
_capped: dict = {}


def launch(kernel, grid, *args, programs_per_sm=None, **kwargs):
    """``kernel[grid](*args, **kwargs)``, noted by the call being recorded, if any. Returns what Triton returns.
    programs_per_sm: at most this many of the compiled kernel's programs share an SM from its next launch on
    (``cap_programs_per_sm``)."""
    compiled = kernel[grid](*args, **kwargs)
    if programs_per_sm and compiled is not None and _capped.get(compiled) != programs_per_sm:
        cap_programs_per_sm(compiled, programs_per_sm)
        _capped[compiled] = programs_per_sm
    recording = getattr(_local, "recording", None)
    if recording is not None:
        recording.launches.append((kernel, compiled, tuple(grid), args, kwargs))
    return compiled


def padded_shared_memory(shared: int, programs: int, smem_per_sm: int) -> int:
    """The dynamic shared memory (bytes) a kernel that uses `shared` should ask for so that at most `programs` of
    its programs fit an SM of smem_per_sm bytes: `shared` if that already holds, else the least multiple of the
    allocation unit past smem_per_sm / (programs + 1), less what the GPU reserves per program."""
    def units(n):  # bytes rounded up to the allocation unit
        return -(-n // _SMEM_UNIT) * _SMEM_UNIT

    if (programs + 1) * (units(shared) + _SMEM_RESERVED_PER_PROGRAM) > smem_per_sm:
        return shared
    return units(smem_per_sm // (programs + 1) + 1 - _SMEM_RESERVED_PER_PROGRAM)


def cap_programs_per_sm(compiled, programs: int) -> bool:
    """Launch a compiled Triton kernel with its dynamic shared memory padded (``padded_shared_memory``) so that at
    most `programs` of its programs share an SM, whatever its registers allow. A grid that is larger than the
    programs with work (the planned split-K grid's unused chunk slots, which return at once) is dispatched by
    filling SMs up to what fits: when ptxas's registers let one more program fit than the planner's target, the
    programs with work pile onto fewer SMs (docs/design.md, "Programs per SM"). Returns whether it padded; it
    does not where the padding would need the per-kernel opt-in above 48 KB that the kernel lacks (Triton's loader
    opts a kernel of more than 48 KB in to all of an SM's shared memory, and one of less not at all), or without a
    CUDA kernel (the interpreter)."""
    meta = getattr(compiled, "packed_metadata", None)
    if meta is None or len(meta) != 3:
        return False
    from triton.runtime import driver

    props = driver.active.utils.get_device_properties(driver.active.get_current_device())
    smem_per_sm = props["max_shared_mem"] + _SMEM_RESERVED_PER_PROGRAM
    shared = padded_shared_memory(compiled.metadata.shared, programs, smem_per_sm)
    if shared > _SMEM_DEFAULT_MAX >= compiled.metadata.shared:
        return False
    compiled.packed_metadata = (meta[0], meta[1], shared)
    return shared != compiled.metadata.shared


def workspace(shape, dtype, device) -> torch.Tensor:
    """``torch.empty(shape, dtype, device)``, noted by the call being recorded, if any (a replay allocates it anew)."""
    t = torch.empty(shape, dtype=dtype, device=device)
    recording = getattr(_local, "recording", None)
    if recording is not None:
        recording.workspaces.append(t)
    return t


def addresses(inputs) -> list | None:
    """Each input's address (None for None), or None when an input is not a plain tensor (a subclass such as a fake
    tensor may have no address): not replayed."""
    ptrs = []
    for t in inputs:
        if t is not None and type(t) is not torch.Tensor:
            return None
        ptrs.append(t.data_ptr() if t is not None else None)
    return ptrs


def address_key(ptrs) -> tuple:
    """How the inputs' addresses (``addresses``) relate, as a replay needs them unchanged: each address modulo 16
    (None for a missing input), and which inputs share an address (None when none do, the common case; else the
    index of the first input at each one's address)."""
    align = tuple([p & 15 if p is not None else None for p in ptrs])
    distinct = set(ptrs)
    distinct.discard(None)
    if len(distinct) == len(ptrs) - ptrs.count(None):
        return align, None
    first = {}
    return align, tuple(first.setdefault(p, i) if p is not None else None for i, p in enumerate(ptrs))


class _Recording:
    def __init__(self):
        self.launches, self.workspaces = [], []


class recording:
    """Context manager: record the launches of one call under ``key`` (None: record nothing), then store a Replay,
    or UNCACHEABLE when a launch cannot be replayed. ``inputs``: the call's tensors (None allowed), in the order
    ``Replay.__call__`` takes them."""

    def __init__(self, key, inputs):
        # a key already stored (uncacheable, or a replay that declined: a profiler's hooks) is not recorded again
        self.key, self.inputs = (None if key in _cache else key), inputs

    def __enter__(self):
        if self.key is not None:
            self.previous = getattr(_local, "recording", None)
            _local.recording = self.rec = _Recording()
        return self

    def __exit__(self, exc_type, exc, tb):
        if self.key is None:
            return False
        _local.recording = self.previous
        if exc_type is None:
            if len(_cache) >= MAX_ENTRIES:
                _cache.clear()
            try:
                _cache[self.key] = Replay(self.rec, self.inputs) if self.rec.launches else UNCACHEABLE
            except _Unresolved:
                _cache[self.key] = UNCACHEABLE
        return False


def replay(key, inputs, device=None, ptrs=None) -> bool:
    """Run the launches recorded under ``key`` with these inputs (device: the current CUDA device's index, ptrs:
    the inputs' addresses, if known); False (nothing launched) when there is none."""
    entry = _cache.get(key)
    if entry is None or entry is UNCACHEABLE:
        return False
    return entry(inputs, device, ptrs)


class _Unresolved(Exception):
    """A recorded argument that a replay could not rebuild."""


class Replay:
    """The launches of one recorded call, each as (compiled kernel, grid, argument list with the per-call slots
    marked). Slots number the call's inputs first, then its workspaces."""

    def __init__(self, rec: _Recording, inputs):
        ptrs = [t.data_ptr() if t is not None else None for t in inputs]
        workspace_slot = {id(t): len(inputs) + i for i, t in enumerate(rec.workspaces)}
        self.workspaces = [(tuple(t.shape), t.dtype, t.device) for t in rec.workspaces]
        # a compiled replay allocates the workspaces as one buffer, each at a 256-byte aligned offset
        self.offsets, size = [], 0
        for t in rec.workspaces:
            assert t.device == rec.workspaces[0].device, "workspaces of one call on one device"
            self.offsets.append(size)
            size += -(-t.numel() * t.element_size() // _WORKSPACE_ALIGN) * _WORKSPACE_ALIGN
        self.workspace_bytes = size
        self.launches = []
        for kernel, compiled, grid, args, kwargs in rec.launches:
            # every kernel parameter in order, defaults filled, as JITFunction.run hands them to the launcher
            signature = inspect.signature(kernel.fn)
            names = set(signature.parameters)
            bound = signature.bind(*args, **{k: v for k, v in kwargs.items() if k in names})
            bound.apply_defaults()
            values = list(bound.arguments.values())
            # launch options (num_warps, num_stages, launch_pdl, maxnreg): compiled into the kernel already
            options = {k: v for k, v in kwargs.items() if k not in names}
            slots = []
            for pos, v in enumerate(values):
                if isinstance(v, torch.Tensor):
                    slot = workspace_slot.get(id(v))
                    if slot is None and v.data_ptr() in ptrs:
                        slot = ptrs.index(v.data_ptr())
                    if slot is None:
                        raise _Unresolved(f"argument {pos} of {kernel.fn.__name__}: a tensor of no input")
                    slots.append((pos, slot))
                    values[pos] = None
                elif not isinstance(v, _CONSTANT_TYPES) and not _is_constexpr_value(v):
                    raise _Unresolved(f"argument {pos} of {kernel.fn.__name__}: {type(v).__name__}")
            if compiled is not None and hasattr(compiled, "result"):
                compiled = compiled.result()
            grid3 = tuple(grid) + (1,) * (3 - len(grid))
            self.launches.append((kernel, compiled, grid3, values, slots, options))
        self.interpreted = any(compiled is None for _, compiled, *_ in self.launches)
        self.launch_all = None if self.interpreted else _straight_line(self.launches)

    def __call__(self, inputs, device=None, ptrs=None) -> bool:
        """Launch with these inputs (device: the current CUDA device's index, ptrs: the inputs' addresses, if the
        caller has them)."""
        runtime = _knobs().runtime
        if _hooked(runtime.launch_enter_hook) or _hooked(runtime.launch_exit_hook):
            return False  # a profiler wants launch metadata: the JIT path builds it
        if self.interpreted:
            # the interpreter: kernel[grid] with tensors
            objects = list(inputs) + [torch.empty(s, dtype=d, device=dev) for s, d, dev in self.workspaces]
            for kernel, _, grid, values, slots, options in self.launches:
                args = list(values)
                for pos, slot in slots:
                    args[pos] = objects[slot]
                kernel[grid](*args, **options)
            return True
        # the compiled launchers take raw addresses (no per-argument cuPointerGetAttribute); one allocation for the
        # workspaces, alive until every launch is queued (then freed in stream order, as a torch.empty would be)
        ptrs = list(ptrs) if ptrs is not None else [t.data_ptr() if t is not None else None for t in inputs]
        if self.workspaces:
            buffer = torch.empty(self.workspace_bytes, dtype=torch.uint8, device=self.workspaces[0][2])
            base = buffer.data_ptr()
            ptrs += [base + offset for offset in self.offsets]
        get_stream, get_device = _stream_functions()
        self.launch_all(ptrs, get_stream(get_device() if device is None else device))
        return True


def _straight_line(launches):
    """One Python function that makes every recorded launch as JITFunction.run ends it (the compiled launcher with
    the grid, stream, function, metadata, no hooks, then every kernel argument), constants by name and each slot as
    ``ptrs[i]``: no per-call loop over ~50 arguments a kernel. Where the compiled launcher is Triton's thin Python
    wrapper (``_direct_launch``), the line calls the C function under it with the two flags and the empty scratch
    buffers the wrapper would add."""
    names, lines = {}, []
    for i, (_, compiled, grid, values, slots, _) in enumerate(launches):
        names.update({f"function{i}": compiled.function, f"metadata{i}": compiled.packed_metadata})
        args = [f"c{i}_{pos}" for pos in range(len(values))]
        names.update({f"c{i}_{pos}": v for pos, v in enumerate(values)})
        for pos, slot in slots:
            args[pos] = f"ptrs[{slot}]"
        direct = _direct_launch(compiled.run) if DIRECT else None
        if direct is None:
            names[f"run{i}"] = compiled.run
            head = f"run{i}({grid[0]}, {grid[1]}, {grid[2]}, stream, function{i}"
        else:
            # what CudaLauncher.__call__ passes: cooperative-grid and PDL flags, no global or profile scratch
            names[f"run{i}"], cooperative, pdl = direct
            head = f"run{i}({grid[0]}, {grid[1]}, {grid[2]}, stream, function{i}, {cooperative!r}, {pdl!r}, None, None"
        lines.append(f"    {head}, metadata{i}, None, None, None, " + ", ".join(args) + ")")
    exec("def launch_all(ptrs, stream):\n" + "\n".join(lines), names)  # noqa: S102 - source built above
    return names["launch_all"]


# the source line of Triton's CudaLauncher.__call__ (3.6) that ``_direct_launch`` stands in for, spaces collapsed
_THIN_WRAPPER_CALL = (
    "self.launch(gridX, gridY, gridZ, stream, function, self.launch_cooperative_grid, self.launch_pdl, "
    "global_scratch, profile_scratch, *args)"
)


def _direct_launch(run):
    """(C launch function, cooperative-grid flag, PDL flag) of a compiled kernel's launcher when a replay may call
    the C function itself: the launcher's class is a thin wrapper whose ``__call__`` ends in exactly
    ``_THIN_WRAPPER_CALL`` (checked in its source, so another Triton's wrapper is never bypassed blind), and the
    kernel needs no global or profile scratch (the wrapper would allocate it). Else None: call ``run``. Skipping the
    wrapper saves 1.0-1.2 µs of host time a launch on the H200's host (scripts/host_pieces.py)."""
    if not all(hasattr(run, a) for a in ("launch", "launch_cooperative_grid", "launch_pdl")):
        return None
    if getattr(run, "global_scratch_size", 1) or getattr(run, "profile_scratch_size", 1):
        return None
    if not _thin_wrapper(type(run)):
        return None
    return run.launch, run.launch_cooperative_grid, run.launch_pdl


@functools.cache
def _thin_wrapper(cls) -> bool:
    """Whether cls.__call__'s source makes the one launch call ``_direct_launch`` replaces."""
    try:
        source = inspect.getsource(cls.__call__)
    except (OSError, TypeError):
        return False
    return _THIN_WRAPPER_CALL in " ".join(source.split()).replace("( ", "(").replace(" )", ")")


@functools.cache
def _knobs():
    """triton.knobs, imported on first replay: importing flashdecode imports no triton."""
    from triton import knobs

    return knobs


@functools.cache
def _stream_functions():
    """The active GPU driver's current-stream and current-device functions (compiled replays only: the
    interpreter has no driver)."""
    from triton.runtime.driver import driver

    return driver.active.get_current_stream, driver.active.get_current_device


def _hooked(hook) -> bool:
    """Whether a Triton launch hook is set: None or an empty HookChain (triton >= 3.5 always has one) is not."""
    return bool(getattr(hook, "calls", hook))


def _is_constexpr_value(v) -> bool:
    """Triton's constexpr wrappers and dtypes (tl.float32 ...) passed as kernel arguments."""
    return type(v).__module__.startswith("triton.")
