"""The launch path: backend choice, kernarg packing, and the two backends.

Backend per call, decided once by ``backend_for`` (and carried by the op's plan): CPU tensors
-> "emu" (mxgemm.emu executes the gfx950 assembly), tensors on a ROCm GPU -> "hip"
(hipModuleLaunchKernel through the C++ host extension; with ``MXGEMM_HIP_LIB=mock`` CPU
tensors take this path too, through mxgemm.mock_hip). ``MXGEMM_BACKEND=emu`` forces the
emulator for GPU tensors too (they are copied to the CPU and the outputs back): that is how a
GPU user cross-checks a kernel. Both backends get the same kernarg bytes, packed by
mxgemm.kernarg from the kernel's own metadata.
"""
from __future__ import annotations

import contextlib
import functools
import threading

import torch

from . import env, guards, kernarg, toolchain

# the arch ops run on the emulator: gfx950, or any mxgemm.emu target via MXGEMM_EMU_ARCH (e.g. gfx1250)
EMU_ARCH = env.get("MXGEMM_EMU_ARCH")

_EMU_SETTINGS = threading.local()
# strict_buffer_oob: mxgemm's own kernels must not depend on whether soffset is range checked
_DEFAULT_EMU = dict(race_check=True, wg_order="linear", seed=0, workgroups=None, asm_edit=None,
                    strict_buffer_oob=True, timing=None, timing_rounds=None, timing_xcd0=False)


@contextlib.contextmanager
def emulator_settings(**kw):
    """Temporarily change emulator options for launches: race_check, wg_order, seed, and
    workgroups (iterable of (x, y, z) ids: run only those workgroups of each grid; None = all),
    asm_edit (a function assembly text -> text applied before loading, e.g. to delete one
    s_waitcnt; edited programs are not cached), strict_buffer_oob and timing (a machine of
    mxgemm.timing, e.g. "mi355x": each launch of the block is also timed there; ``timings()``
    lists them) (mxgemm.emu.Emulator). timing_rounds: run only that many rounds of the
    workgroups XCD 0 receives (its first, then one per stratum of the rest) and extrapolate its
    time (mxgemm.timing.rounds_sample); the outputs are then incomplete. timing_xcd0: with
    timing_rounds, run only XCD 0's workgroups even when the rounds cover its share (the same
    time, an eighth of the emulation; mxgemm.timing.xcd0_rounds)."""
    unknown = set(kw) - set(_DEFAULT_EMU)
    if unknown:
        raise TypeError(f"unknown emulator settings {sorted(unknown)}; known: {sorted(_DEFAULT_EMU)}")
    old = getattr(_EMU_SETTINGS, "value", dict(_DEFAULT_EMU))
    old_timings = getattr(_EMU_SETTINGS, "timings", [])
    _EMU_SETTINGS.value = {**old, **kw}
    if kw.get("timing"):
        _EMU_SETTINGS.timings = []
    try:
        yield
    finally:
        _EMU_SETTINGS.value = old
        if kw.get("timing"):
            _EMU_SETTINGS.timings = old_timings


def timings() -> list:
    """(kernel symbol, mxgemm.timing result) of each launch timed in this thread's innermost
    ``emulator_settings(timing=...)`` block, in launch order."""
    return list(getattr(_EMU_SETTINGS, "timings", []))


def _emu_settings():
    return getattr(_EMU_SETTINGS, "value", _DEFAULT_EMU)


# ---------------------------------------------------------------------------------------------
# Backend choice
# ---------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def forced_backend() -> str | None:
    """``MXGEMM_BACKEND`` (emu|hip), read once per process; None when unset."""
    return env.get("MXGEMM_BACKEND")


def default_backend() -> str:
    """The backend for tensors on the default device: hip on a ROCm GPU, else emu."""
    return forced_backend() or ("hip" if toolchain.gpu_arch() else "emu")


def backend_problem() -> str | None:
    """Why ops cannot run on the default backend, or None: MXGEMM_BACKEND=hip forced with no ROCm
    GPU and no mock runtime to launch on."""
    if forced_backend() == "hip" and not toolchain.gpu_arch() and hip_library() not in MOCKS:
        return ("MXGEMM_BACKEND=hip forces the hip backend, but no ROCm GPU / HIP runtime is found; "
                "unset it to run on the emulator, or set MXGEMM_HIP_LIB=mock for the mock runtime")
    return None


def backend_for(device: torch.device, archs: tuple) -> tuple[str, str]:
    """(backend, arch) that runs a kernel built for ``archs`` on tensors on ``device``, or
    GuardError [arch] / [backend] naming the device and what it is."""
    forced = forced_backend()
    if device.type == "cpu" and forced != "emu" and hip_library() in MOCKS:
        if EMU_ARCH not in archs:
            guards.fail("arch", f"the mock HIP runtime runs {EMU_ARCH} code; this kernel is built for {archs}")
        return "hip", EMU_ARCH
    if device.type == "cpu" or (device.type == "cuda" and forced == "emu"):
        if forced == "hip":
            guards.fail("backend", f"MXGEMM_BACKEND=hip needs tensors on a ROCm GPU; they are on {device}")
        if EMU_ARCH not in archs:
            guards.fail("arch", f"the emulator runs {EMU_ARCH} code; this kernel is built for {archs}")
        return "emu", EMU_ARCH
    gpu = toolchain.gpu_arch() if device.type == "cuda" else None
    if gpu in archs:
        return "hip", gpu
    what = gpu or ("a CUDA/non-ROCm GPU" if device.type == "cuda" else device.type)
    guards.fail("arch", f"the kernel runs on {'/'.join(archs)} GPUs or on the emulator (CPU tensors); "
                        f"tensors are on {device} ({what})")


# ---------------------------------------------------------------------------------------------
# Kernarg layout (packing: mxgemm.kernarg)
# ---------------------------------------------------------------------------------------------
_LAYOUTS: dict = {}


def layout(art):
    """(kernarg slots (offset, size, value_kind), kernarg size) of an artefact, read once."""
    got = _LAYOUTS.get(art.asm_path)
    if got is None:
        got = _LAYOUTS[art.asm_path] = kernarg.layout(art.isa())
    return got


def last_emulator_stats() -> dict | None:
    """Counters (mxgemm.emu.stats) of this thread's last emulator launch through ``launch``."""
    return getattr(_EMU_SETTINGS, "last_stats", None)


# ---------------------------------------------------------------------------------------------
# Backends
# ---------------------------------------------------------------------------------------------
def launch(art, grid, block, args, backend: str, writes=(), dynamic_lds: int = 0) -> None:
    """Run artefact ``art`` (mxgemm.build.Artifact) with ``args`` in kernel-argument order.
    ``writes``: the tensors the kernel writes (copied back when GPU tensors run on the emulator)."""
    grid = tuple(grid) + (1,) * (3 - len(grid))
    block = tuple(block) + (1,) * (3 - len(block))
    slots, size = layout(art)
    if backend == "emu":
        _emu_launch(art, grid, block, slots, size, args, writes, dynamic_lds)
        return
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    device = tensors[0].device if tensors else torch.device("cpu")
    kernel = hip_kernel(art, grid, block, dynamic_lds, kernarg.pack(slots, size, args, grid, block, dynamic_lds),
                        device=device)
    stream = 0 if device.type == "cpu" else _raw_stream(device.index or 0)
    if _mock_active():
        from . import mock_hip
        mock_hip.run(kernel, (stream,), tensors)
    else:
        kernel(stream)


def bind(art, grid, block, sources, backend: str, out_index: int, device, dynamic_lds: int = 0, spans=None,
         overlap=None):
    """``run(flat)``: the launch of ``art`` for one plan, on tensors on ``device``. ``sources``
    gives each kernel argument in order: ("call", i), the tensor flat[i] of the call, or
    ("const", value), the same in every call of the plan. On the hip backend the kernarg segment
    is packed once with the constants in place; a call writes only the tensors' addresses and
    launches, as straight-line code made here. ``spans`` ({i: bytes}) and ``overlap(flat)`` (it
    raises): a call whose flat[out_index] meets another tensor's bytes calls ``overlap`` instead of
    launching (on hip, from the addresses the call packs anyway)."""
    grid = tuple(grid) + (1,) * (3 - len(grid))
    block = tuple(block) + (1,) * (3 - len(block))
    if backend == "emu":
        def run(flat):
            if overlap:
                overlap(flat, spans)
            launch(art, grid, block, [flat[v] if how == "call" else v for how, v in sources], "emu",
                   writes=(flat[out_index],), dynamic_lds=dynamic_lds)
        return run
    slots, size = layout(art)
    explicit = [s for s in slots if not s[2].startswith("hidden_")]
    if len(explicit) != len(sources) or any(how == "call" and kind != "global_buffer"
                                            for (_, _, kind), (how, _) in zip(explicit, sources)):
        raise TypeError(f"{art.kernel}: arguments {sources} do not match its kernel arguments {explicit}")
    template = kernarg.pack(slots, size, [None if how == "call" else v for how, v in sources], grid, block,
                            dynamic_lds)
    calls = [(off, v) for (off, _, _), (how, v) in zip(explicit, sources) if how == "call"]
    scope = {"k": hip_kernel(art, grid, block, dynamic_lds, template, [off for off, _ in calls], device),
             "raw_stream": _raw_stream, "Tensor": torch.Tensor}
    # torch's current stream on the tensors' GPU, so launches order with torch's work; the null
    # stream for host memory (the mock runtime)
    stream = "0" if device.type == "cpu" else f"raw_stream({device.index or 0})"
    ptrs = "".join(f"    p{i} = flat[{i}].data_ptr()\n" for _, i in calls)
    args = ", ".join([stream] + [f"p{i}" for _, i in calls])
    o, ins = out_index, [i for _, i in calls if i != out_index and spans and spans.get(i)]
    meets = " or ".join(f"p{i} < p{o} + {spans[o]} and p{o} < p{i} + {spans[i]}" for i in ins) if overlap else ""
    check = f"    if {meets}:\n        overlap(flat, spans)\n" if meets and spans.get(o) else ""
    scope.update(overlap=overlap, spans=spans)
    if _mock_active():
        from . import mock_hip
        scope["mock"] = mock_hip.run
        body = f"mock(k, ({args},), [t for t in flat if isinstance(t, Tensor)])"
    else:
        body = f"k({args})"
    exec(f"def run(flat):\n{ptrs}{check}    {body}\n", scope)
    return scope["run"]


def _raw_stream(index: int) -> int:
    return torch._C._cuda_getCurrentRawStream(index)


def launch_variant(kernel: str, variant: dict, arch: str, backend: str, writes=(), **values) -> None:
    """Run registered ``kernel``'s ``variant`` built for ``arch``, without an op's plan: grid and
    workgroup size from the registry, ``values`` = its kernel arguments and grid dims by name."""
    from . import build, registry
    k = registry.get(kernel)
    launch(build.artifact(kernel, variant, arch), k.launch_grid(variant, **values), (k.threads_for(arch, variant),),
           k.ordered_args(**values), backend, writes=writes)


_PROGRAMS: dict = {}


def _emu_launch(art, grid, block, slots, size, args, writes, dynamic_lds):
    from .emu.launch import TARGETS
    if art.arch not in TARGETS:
        raise ValueError(f"the emulator runs {'/'.join(TARGETS)} code; {art.kernel} was built for {art.arch}")
    # GPU tensors (MXGEMM_BACKEND=emu on a ROCm machine) run on CPU copies
    host = [a.cpu() if isinstance(a, torch.Tensor) and a.device.type != "cpu" else a for a in args]
    emu = emulator(art.arch)
    kernarg_bytes = kernarg.pack(slots, size, host, grid, block, dynamic_lds, runtime=emu.hidden_runtime)
    emulate(emu, art.asm_path, lambda: art.asm, art.symbol, grid, block, kernarg_bytes,
            [a for a in host if isinstance(a, torch.Tensor)], dynamic_lds)
    for a, h in zip(args, host):
        if h is not a and any(a is w for w in writes):
            a.copy_(h)


def emulator(arch: str):
    """An Emulator for ``arch`` with this thread's emulator settings."""
    from .emu import Emulator
    settings = _emu_settings()
    return Emulator(arch=arch, race_check=settings["race_check"], wg_order=settings["wg_order"],
                    seed=settings["seed"], strict_buffer_oob=settings["strict_buffer_oob"],
                    timing=settings["timing"])


def emulate(emu, key, asm, symbol, grid, block, kernarg_bytes, buffers, dynamic_lds) -> None:
    """Run kernel ``symbol`` of the program ``asm()`` (loaded once per ``key`` and race mode,
    unless the settings edit the assembly) on ``emu`` with a packed kernarg segment."""
    settings = _emu_settings()
    if settings["asm_edit"]:
        prog = emu.load(settings["asm_edit"](asm()))
    else:
        prog = _PROGRAMS.get((key, emu.race))
        if prog is None:
            prog = _PROGRAMS[(key, emu.race)] = emu.load(asm())
    workgroups = settings["workgroups"]
    if settings["timing"] and settings["timing_rounds"] and workgroups is None:
        from .timing import rounds_sample, xcd0_rounds
        pick = xcd0_rounds if settings["timing_xcd0"] else rounds_sample
        workgroups = pick(settings["timing"], prog, symbol, grid, block, dynamic_lds, settings["timing_rounds"])
    emu.launch_kernarg(prog, symbol, grid, block, kernarg_bytes, buffers, dynamic_lds, workgroups)
    _EMU_SETTINGS.last_stats = emu.last_stats
    if emu.last_timing is not None:
        _EMU_SETTINGS.timings.append((symbol, emu.last_timing))


def run_handed_over(arch, asm_path, symbol, slots, grid, block, dynamic_lds, kernarg_bytes, buffers) -> None:
    """A launch a HIP runtime hands over (mxgemm.mock_hip), run on the emulator. The runtime's
    own part first: the hidden arguments, from the launch's grid, block and LDS size."""
    emu = emulator(arch)
    buf = bytearray(kernarg_bytes)
    kernarg.write_hidden(buf, slots, grid, block, dynamic_lds, emu.hidden_runtime)
    emulate(emu, asm_path, asm_path.read_text, symbol, grid, block, bytes(buf), buffers, dynamic_lds)


# ---------------------------------------------------------------------------------------------
# The HIP runtime
# ---------------------------------------------------------------------------------------------
MOCKS = ("mock", "mock-noop")   # mxgemm.mock_hip: launches on the emulator, or none
_HIP_LIBRARY: list = []   # a library set by use_hip_library, over MXGEMM_HIP_LIB


def hip_library() -> str:
    """The HIP runtime the hip backend loads: ``MXGEMM_HIP_LIB`` (a path; "mock": the mock
    runtime of mxgemm.mock_hip, which runs launches of CPU tensors on the emulator; "mock-noop":
    the same, launching nothing), else libamdhip64.so."""
    return _HIP_LIBRARY[-1] if _HIP_LIBRARY else env.get("MXGEMM_HIP_LIB")


def _mock_active() -> bool:
    return hip_library() == "mock"


PLAN_CACHES: list = []   # clear() of every cache of plans (each op's): plans hold a backend


@contextlib.contextmanager
def use_hip_library(name: str):
    """Launch on the hip backend through ``name`` (a library path, or "mock") in this block;
    plans made before or inside it are forgotten at both ends."""
    _HIP_LIBRARY.append(name)
    for clear in PLAN_CACHES:
        clear()
    try:
        yield
    finally:
        _HIP_LIBRARY.pop()
        for clear in PLAN_CACHES:
            clear()


@functools.lru_cache(maxsize=None)
def hip_runtime(name: str):
    """The loaded HIP runtime ``name`` (mxgemm_host.Runtime)."""
    if name in MOCKS:
        from . import mock_hip
        return host_ext().Runtime(str(mock_hip.library(run_handed_over) if name == "mock" else mock_hip.noop_library()))
    return host_ext().Runtime(name)


_FUNCTIONS: dict = {}


def hip_kernel(art, grid, block, dynamic_lds, template: bytes, pointer_offsets=(), device=None):
    """A launchable kernel of ``art`` (mxgemm_host.Kernel) whose kernarg segment is ``template``
    with the addresses at ``pointer_offsets`` written per call; the code object is loaded once
    per runtime and GPU (a module belongs to the device current at its load, so it is loaded with
    ``device`` current). Errors name the kernel."""
    name = hip_library()
    gpu = device is not None and device.type == "cuda"
    try:
        rt = hip_runtime(name)
        key = (name, str(art.hsaco_path), device.index or 0 if gpu else None)
        fn = _FUNCTIONS.get(key)
        if fn is None:
            with torch.cuda.device(device) if gpu else contextlib.nullcontext():
                fn = _FUNCTIONS[key] = rt.function(art.hsaco_path.read_bytes(), art.symbol)
    except (OSError, RuntimeError) as e:
        raise RuntimeError(f"cannot launch {art.kernel} ({registry_id(art)}) on the hip backend: {e}") from e
    return host_ext().Kernel(rt, fn, f"{art.kernel} ({registry_id(art)})", tuple(grid), tuple(block), dynamic_lds,
                             template, tuple(pointer_offsets))


def registry_id(art) -> str:
    from .registry import variant_id
    return f"{variant_id(art.variant)}, {art.arch}"


@functools.lru_cache(maxsize=1)
def host_ext():
    """The HIP launcher (csrc/host/mxgemm_host.cpp), a Python extension built once with the host
    C++ compiler (it needs neither torch nor HIP headers: the runtime is loaded with dlopen)."""
    import importlib.util

    from .registry import source_root
    path = toolchain.host_library(source_root() / "csrc" / "host" / "mxgemm_host.cpp", python_ext=True)
    spec = importlib.util.spec_from_file_location("mxgemm_host", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
