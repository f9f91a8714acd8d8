"""The op framework: every public op is an annotated signature, a planner and (optionally) a
fallback; ``op(...)`` turns them into the op.

    @op(plan=_plan, fallback=_fallback, alloc=torch.empty)
    def my_gemm(a: torch.Tensor, b: torch.Tensor, *, out: torch.Tensor | None = None,
                config: str = "") -> torch.Tensor:
        '''docstring: shapes, dtypes, rules'''

The framework makes the torch.library custom op ``mxgemm::my_gemm`` (and ``my_gemm_out``,
mutating ``out``, when ``out`` is optional), whose fake impl runs the same planner so guards
fire under tracing; memoises plans (the last few behind torch's C++ tensor guard, the rest on
a key of what guards read of each tensor: shape, strides, dtype, device, and the other
arguments); checks a caller's ``out`` on every call (it must not overlap an input, nor require
grad); runs the op's data checks (``check_data``, e.g. routing metadata) before the launch
unless the call says ``validate=False``; and launches the plan's kernel with its arguments taken by name (registry
``Kernel.args``) from the call's values and ``plan.args``. The planner sees the call as a
namespace (``x.a``, ``x.out``) and returns a Plan after running its guards, which raise
GuardError before anything runs.
"""
from __future__ import annotations

import functools
import inspect
import types
import typing
from dataclasses import dataclass, field

import torch

from .. import build, guards, launcher, registry
from ..hardware import LIMITS


@dataclass
class Plan:
    op: str
    kernel: str | None             # registry name; None: nothing to launch or the fallback
    variant: dict = field(default_factory=dict)
    backend: str = "emu"           # "hip" | "emu" | "fallback" | "none"
    arch: str = launcher.EMU_ARCH  # what the kernel is built for
    grid: tuple = (1, 1, 1)
    block: tuple = (256, 1, 1)
    reason: str = ""
    args: dict = field(default_factory=dict)   # kernel scalar arguments by registry name
    out_shape: tuple = ()          # the output an out-less call allocates
    out_dtype: torch.dtype | None = None
    zero_out: bool = False         # the kernel accumulates into out (e.g. split-K atomics): zero it first
    run: object = field(default=None, repr=False, compare=False)   # run(flat), made at the first execution

    @property
    def fallback(self) -> bool:
        """The call runs the dequantise + torch matmul fallback, no kernel."""
        return self.backend == "fallback"

    def __str__(self):
        if self.fallback:
            return f"{self.op}: fallback (dequantise + torch matmul) because {self.reason}"
        if self.kernel is None:
            return f"{self.op}: nothing to launch; {self.reason}"
        v = ",".join(f"{k}={x}" for k, x in sorted(self.variant.items()))
        return (f"{self.op}: kernel {self.kernel} [{v}] on backend {self.backend} ({self.arch}), "
                f"grid={self.grid} block={self.block}; {self.reason}. Kernel: {registry.get(self.kernel).doc}")


def kernel_plan(op: str, kernel: str, variant: dict, device, reason: str, out_shape=(), out_dtype=None,
                **dims) -> Plan:
    """The plan that runs registry ``kernel`` for problem ``dims`` (grid names and kernel scalar
    arguments) on the backend for ``device``; GuardError [arch] if nothing can run it there."""
    k = registry.get(kernel)
    backend, arch = launcher.backend_for(device, k.archs)
    if variant not in k.variants_for(arch):   # per-arch grids: the planner chose another arch's variant
        guards.fail("arch", f"{kernel} has no {arch} variant {variant}; this op plans for "
                            f"{', '.join(a for a in k.archs if variant in k.variants_for(a))}")
    return Plan(op, kernel, variant, backend, arch, k.launch_grid(variant, **dims),
                (k.threads_for(arch, variant), 1, 1), reason, args=dims, out_shape=out_shape, out_dtype=out_dtype)


NUM_CUS = LIMITS["gfx950"]["cus"]   # the MI355X's compute units: the planners size grids against them
E8M0 = (torch.uint8, torch.float8_e8m0fnu)   # the dtypes an e8m0 scale tensor may have


@dataclass(frozen=True)
class Choice:
    """What a planner's config source (the caller's config, a tuned table, a heuristic) picked:
    the registry kernel, its variant (compile-time parameters), the run-time options of the launch
    (split-K count, tile order, persistent grid) and why."""
    kernel: str
    variant: dict
    why: str
    options: dict = field(default_factory=dict)


@dataclass(frozen=True)
class ConfigGrammar:
    """The one config grammar of the ops: ``"KEY=value,KEY=value"`` or the dict ``{"KEY": value}``,
    with per-op keys and value types; ``""`` / None: no config. Every error names the op, the part
    that is wrong and the allowed keys."""
    op: str
    keys: dict                       # KEY -> int | str
    required: bool = False           # every key must be given

    def fail(self, detail: str):
        allowed = ", ".join(f"{k} ({t.__name__})" for k, t in self.keys.items())
        guards.fail("config", f"{self.op}: config {detail}; expected 'KEY=value,...' or a dict with "
                              f"{'all of' if self.required else 'keys from'}: {allowed}")

    def parse(self, config) -> dict | None:
        if config is None or config == "":
            return None
        if not isinstance(config, (str, dict)):
            self.fail(f"is a {type(config).__name__} ({config!r})")
        if isinstance(config, str):
            parts = [p.partition("=") for p in config.split(",")]
            if any(not sep or not k for k, sep, _ in parts):
                self.fail(f"{config!r} has a part without '='")
            config = {k.strip(): v.strip() for k, _, v in parts}
        unknown = [k for k in config if k not in self.keys]
        if unknown:
            self.fail(f"has unknown key {unknown[0]!r}")
        if self.required and len(config) != len(self.keys):
            self.fail(f"{dict(config)} lacks {', '.join(k for k in self.keys if k not in config)}")
        try:
            return {k: self.keys[k](v) for k, v in config.items()}
        except (TypeError, ValueError):
            self.fail(f"{dict(config)} has a value that is not {'/'.join(t.__name__ for t in set(self.keys.values()))}")

    def text(self, config) -> str:
        """The canonical string of ``config`` (what the custom op's schema carries)."""
        parsed = self.parse(config)
        return ",".join(f"{k}={v}" for k, v in sorted(parsed.items())) if parsed else ""


def empty_plan(op: str, reason: str = "empty output: nothing to launch", **out) -> Plan:
    """The plan of a call with nothing to compute (``out``: out_shape, out_dtype of the result)."""
    return Plan(op, None, backend="none", reason=reason, **out)


OPS: dict = {}
_LIBRARY = torch.library.Library("mxgemm", "DEF")
_SCHEMA_TYPES = {torch.Tensor: "Tensor", int: "int", bool: "bool", str: "str", float: "float",
                 torch.dtype: "ScalarType"}
# the Python values each schema type takes (symbolic ones under torch.compile; no bool for an int;
# a bool also as 0 or 1)
_VALUES = {"int": (int, torch.SymInt), "bool": (bool, torch.SymBool), "str": str,
           "float": (int, float, torch.SymInt, torch.SymFloat), "ScalarType": torch.dtype}


def _schema_type(hint) -> str:
    args = typing.get_args(hint)
    if type(None) in args:
        return _schema_type(next(a for a in args if a is not type(None))) + "?"
    return _SCHEMA_TYPES[hint]


def _key_function(types_):
    """key(flat) of the plan cache for an op with these parameter types: what guards read of
    each tensor (shape, strides, dtype, device; None stays None) and every other argument.
    Generated once per op as straight-line code, so no loop or per-tensor call is added to the
    attribute reads."""
    fields = []
    for i, t in enumerate(types_):
        read = f"t{i}.shape, t{i}.stride(), t{i}.dtype, t{i}.device"
        fields.append(read if t == "Tensor" else f"(None if t{i} is None else ({read}))" if t == "Tensor?"
                      else f"t{i}")
    names = ", ".join(f"t{i}" for i in range(len(types_)))
    scope: dict = {}
    exec(f"def key(flat):\n    {names}, = flat\n    return ({', '.join(fields)},)\n", scope)
    return scope["key"]


RECENT_PLANS = 8


def _plan_function(types_, recent: list, miss):
    """plan(flat) of an op: the fast path, else ``miss(flat, others, tensors)``. Reading shape,
    dtype, device and contiguity from Python costs ~0.6 us per tensor, too much for a 9-tensor
    MoE call, so the last few plans each carry torch's C++ tensor guard (dynamo's TensorGuards:
    type, dispatch keys, dtype, device, requires_grad, sizes, strides), which checks a whole
    call at ~0.15 us per tensor. ``plan`` returns the plan of the first recent entry whose non-tensor
    arguments (and which optional tensors are absent) are equal and whose guard passes over
    the present tensors. Generated once per op as straight-line code: the op's cached path is
    this one call."""
    others, present, optional = [], [], []
    for i, t in enumerate(types_):
        if t == "Tensor":
            present.append(f"t{i}, ")
        elif t == "Tensor?":
            others.append(f"t{i} is None")
            optional.append(f" + (() if t{i} is None else (t{i},))")
        else:
            others.append(f"t{i}")
    tensors = f"({''.join(present)})" + "".join(optional)
    names = ", ".join(f"t{i}" for i in range(len(types_)))
    scope: dict = {"recent": recent, "miss": miss}
    exec(f"def plan(flat):\n    {names}, = flat\n    o, ts = ({', '.join(others)},), {tensors}\n"
         f"    for guard, go, p in recent:\n"
         f"        if go == o and guard.check(*ts):\n            return p\n"
         f"    return miss(flat, o, ts)\n", scope)
    return scope["plan"]


def _tensor_guard(tensors):
    """torch's C++ guard of these tensors' metadata, or None where it cannot be built or could
    never pass (tensor subclasses such as FakeTensor, one tensor passed twice, a torch whose
    guard API differs) or must not (meta tensors: their calls are the fake impl's, never a
    launch): such calls take the Python-key path."""
    if any(type(t) is not torch.Tensor or t.is_meta for t in tensors) or len(set(map(id, tensors))) < len(tensors):
        return None
    try:
        from torch._C._dynamo.guards import TensorGuards
        return TensorGuards(*tensors, tensor_check_names=[f"t{i}" for i in range(len(tensors))],
                            dynamic_dims_sizes=[list(t.shape) for t in tensors],
                            dynamic_dims_strides=[list(t.stride()) for t in tensors])
    except (ImportError, TypeError, RuntimeError):
        return None


class _Default:
    """A default value shown by name in generated code (its repr is the scope name)."""
    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return self.name


class Op:
    def __init__(self, fn, plan, fallback=None, alloc=None, convert=None, check_data=None, fill=None,
                 out_shape=None):
        hints = typing.get_type_hints(fn)
        params = list(inspect.signature(fn).parameters.values())
        self.name, self.__doc__ = fn.__name__, fn.__doc__
        self.names = tuple(p.name for p in params)
        self.n_positional = sum(p.kind == p.POSITIONAL_OR_KEYWORD for p in params)
        self.defaults = tuple(p.default for p in params)
        types_ = [_schema_type(hints[n]) for n in self.names]
        self.tensors = tuple(i for i, t in enumerate(types_) if t.startswith("Tensor"))
        self._required = tuple(i for i, t in enumerate(types_) if t == "Tensor")
        self._scalars = tuple((i, t.rstrip("?"), t.endswith("?")) for i, t in enumerate(types_)
                              if not t.startswith("Tensor"))
        self._key = _key_function(types_)
        self._recent: list = []
        # plan(flat): the memoised plan of a call given one value per parameter (out may be
        # None): a recent plan whose guard passes, else the plan cache, else the planner
        self.plan = _plan_function(types_, self._recent, self._plan_miss)
        self._recent_plan = _plan_function(types_, self._recent, lambda *a: None)
        self._plan_fn, self._fallback, self._alloc = plan, fallback, alloc
        self._convert = convert or {}
        self._fill = fill or {}
        self._check_data = check_data
        self._out_shape = out_shape
        self._plans: dict = {}
        self.out_index = self.names.index("out")
        optional_out = types_[self.out_index] == "Tensor?"
        if optional_out != (out_shape is not None) or (check_data is not None) != ("validate" in self.names):
            raise TypeError(f"{self.name}: an optional out needs out_shape; check_data needs a validate parameter")
        decl = [f"{t} {n}" for n, t in zip(self.names, types_)]
        if optional_out:  # functional op (allocates out) + the mutating _out op
            self._define(self.name, "(" + ", ".join(d for n, d in zip(self.names, decl) if n != "out")
                         + ") -> Tensor", (), self._functional, self._functional_fake)
            out_name = self.name + "_out"
        else:
            out_name = self.name
        decl[self.out_index] = "Tensor(a!) out"
        self._define(out_name, "(" + ", ".join(decl) + ") -> ()", ("out",), self._run, self._plan_flat)
        self._functional_op = getattr(torch.ops.mxgemm, self.name).default if optional_out else None
        self._out_op = getattr(torch.ops.mxgemm, out_name).default
        self._flat_of, call = self._flatten_function(inspect.signature(fn))
        # the op is called as its own class's __call__: no extra frame between user and call
        self.__class__ = type(self.name, (Op,), {"__call__": call})
        OPS[self.name] = self
        launcher.PLAN_CACHES.append(self.clear_plans)

    @staticmethod
    def _define(name, schema, mutates, impl, fake):
        # a schema and one CompositeExplicitAutograd kernel, not torch.library.custom_op, whose
        # Python wrappers cost ~12 us a call; the schema's (a!) marks the mutated out
        _LIBRARY.define(name + schema)
        _LIBRARY.impl(name, impl, "CompositeExplicitAutograd")
        torch.library.register_fake(f"mxgemm::{name}", fake, lib=_LIBRARY)

    # -- the call
    def _flatten_function(self, sig: inspect.Signature):
        """flatten(*args, **kw) -> one value per parameter, converted and filled; and call(op,
        *args, **kw), the whole public call (the op's __call__). Generated once per op with the op's own signature, so
        Python binds the arguments (a generic loop over parameters costs microseconds)."""
        params = str(sig.replace(return_annotation=sig.empty, parameters=[
            p.replace(annotation=p.empty, default=p.default if p.default is p.empty else _Default(f"d{i}"))
            for i, p in enumerate(sig.parameters.values())]))[1:-1]
        scope = {f"d{i}": p.default for i, p in enumerate(sig.parameters.values())}
        body = [f"    flat = [{', '.join(self.names)}]"]
        for n, conv in self._convert.items():
            i = self.names.index(n)
            scope[f"conv{i}"] = conv
            body.append(f"    flat[{i}] = conv{i}(flat[{i}])")
        for n, derive in self._fill.items():   # derive(other params by name), traceable by dynamo
            i = self.names.index(n)
            scope[f"fill{i}"] = derive
            given = ", ".join(f"flat[{self.names.index(p)}]" for p in inspect.signature(derive).parameters)
            body.append(f"    if flat[{i}] is None:\n        flat[{i}] = fill{i}({given})")
        scope.update(functional=self._functional_op, out_op=self._out_op, check_types=self._check_types,
                     recent=self._recent_plan, execute=self._execute, alloc=self._alloc,
                     bump=torch._C._increment_version, compiling=torch.compiler.is_compiling,
                     dispatch_modes=torch._C._len_torch_dispatch_stack,
                     function_modes=torch._C._is_torch_function_mode_enabled, profiler=torch.autograd.profiler)
        o, out = self.out_index, self.names[self.out_index]
        dev = f"flat[{self.tensors[0]}].device"
        exec(f"def flatten({params}):\n" + "\n".join(body) + "\n    return flat\n"
             f"def call(_op, {params}):\n" + "\n".join(body) + "\n"
             # eager calls whose tensors pass a recent plan's guard skip torch's dispatcher, unless
             # something traces, intercepts or records ops (tensor subclasses such as fake or
             # functional tensors never pass the guards)
             f"    p = None if compiling() or dispatch_modes() or function_modes() or "
             f"profiler._is_profiler_enabled else recent(flat)\n"
             f"    if p is None:\n        check_types(flat)\n"
             f"    if {out} is None:\n"
             f"        if p is None:\n            del flat[{o}]\n            return functional(*flat)\n"
             f"        flat[{o}] = {out} = alloc(p.out_shape, dtype=p.out_dtype, device={dev})\n"
             f"    elif p is None:\n        out_op(*flat)\n        return {out}\n"
             f"    else:\n        bump(({out},))\n"
             f"    execute(p, flat)\n    return {out}\n", scope)
        return scope["flatten"], scope["call"]

    def flatten(self, args, kw) -> list:
        """Positional and keyword arguments -> one value per parameter, converted."""
        return self._flat_of(*args, **kw)

    def explain(self, *args, **kw) -> Plan:
        return self.plan(self.flatten(args, kw))

    def check(self, *args, **kw) -> Plan:
        """``explain``, then every other check the call would run before its launch (the
        caller's out, the data checks unless validate=False): GuardError exactly when the call
        would raise one."""
        flat = self.flatten(args, kw)
        p = self.plan(flat)
        if flat[self.out_index] is not None:
            self._check_requires_grad(flat)
            if p.kernel is not None or p.fallback:   # what the bound run checks before writing out
                self._check_overlap(flat)
        check = self._data_check(flat)
        if check is not None:
            check(self.namespace(flat), p)
        return p

    # -- planning
    def _check_types(self, flat) -> None:
        for i in self.tensors:
            if (flat[i] is not None or i in self._required) and not isinstance(flat[i], torch.Tensor):
                guards.fail("type", f"{self.names[i]} must be a torch.Tensor; got {type(flat[i]).__name__}")
        for i, t, optional in self._scalars:
            v = flat[i]
            ok = isinstance(v, _VALUES[t]) and (t != "int" or not isinstance(v, bool)) \
                or t == "bool" and type(v) is int and v in (0, 1)
            if not (ok or v is None and optional):
                guards.fail("type", f"{self.names[i]} must be {'None or ' if optional else ''}"
                                    f"{'a torch.dtype' if t == 'ScalarType' else t}; got {v!r}")

    def _check_requires_grad(self, flat) -> None:
        """A caller's out is not a tensor autograd tracks (an in-place write would bypass it). The
        cached fast path never holds a plan for such an out, so only the planning path checks it."""
        if flat[self.out_index].requires_grad:
            guards.fail("out-requires-grad", f"{self.name}: out requires grad; the op writes it in place, "
                                             "outside autograd (pass a tensor that does not require grad)")

    def _data_check(self, flat):
        """The op's check of tensor contents for this call, or None (no check, or validate=False)."""
        if self._check_data is not None and flat[self.names.index("validate")]:
            return self._check_data
        return None

    def _spans(self, flat) -> dict:
        """Tensor index -> bytes it spans (fixed by the plan's shapes, strides and dtypes)."""
        return {i: _span(flat[i]) for i in self.tensors if flat[i] is not None}

    def _check_overlap(self, flat, spans=None) -> None:
        """GuardError [out-alias] when a caller's out shares a byte with an input (the kernel would
        read what it has written): byte ranges, first to last element, so interleaved views count
        as overlapping. Every bound run that writes out checks it (run(flat) below)."""
        spans = spans or self._spans(flat)
        o = self.out_index
        lo = flat[o].data_ptr()
        hi = lo + spans[o]
        for i, n in spans.items():
            t = flat[i].data_ptr() if i != o and n else 0
            if t and t < hi and lo < t + n:
                guards.fail("out-alias", f"{self.name}: out (bytes {lo:#x}..{hi:#x}) overlaps input "
                                         f"{self.names[i]} (bytes {t:#x}..{t + n:#x}); pass an out that "
                                         "shares no memory with the inputs")

    def _plan_miss(self, flat, others, tensors) -> Plan:
        self._check_types(flat)
        key = self._key(flat)
        p = self._plans.get(key)
        if p is None:
            p = self._plans[key] = self._plan_fn(self.namespace(flat))
        guard = _tensor_guard(tensors)
        out = flat[self.out_index]
        if guard is not None and not (out is not None and out.requires_grad):   # the fast path skips that check
            self._recent.insert(0, (guard, others, p))
            del self._recent[RECENT_PLANS:]
        return p

    def clear_plans(self) -> None:
        """Forget every memoised plan (e.g. after changing what the planner reads)."""
        self._plans.clear()
        self._recent.clear()

    def namespace(self, flat):
        return types.SimpleNamespace(**dict(zip(self.names, flat)))

    def _with_out(self, flat, out):
        flat = list(flat)
        flat.insert(self.out_index, out)
        return flat

    def _plan_flat(self, *flat):   # the out op's fake impl: guards only
        if not _symbolic(flat):
            self.plan(flat)

    # -- custom op impls
    def _functional(self, *flat):
        flat = self._with_out(flat, None)
        p = self.plan(flat)
        flat[self.out_index] = self._alloc(p.out_shape, dtype=p.out_dtype, device=flat[self.tensors[0]].device)
        self._execute(p, flat)
        return flat[self.out_index]

    def _functional_fake(self, *flat):
        """Guards and planning on concrete shapes; on symbolic ones (torch.compile's dynamic
        shapes) only the output's shape arithmetic: the real call plans each size."""
        flat = self._with_out(flat, None)
        if not _symbolic(flat):
            self.plan(flat)
        shape, dtype = self._out_shape(self.namespace(flat))
        return flat[self.tensors[0]].new_empty(shape, dtype=dtype)

    def _run(self, *flat):
        p = self.plan(flat)
        self._check_requires_grad(flat)
        torch._C._increment_version((flat[self.out_index],))   # out changes in place
        self._execute(p, flat)

    def _execute(self, p: Plan, flat) -> None:
        if p.run is None:
            p.run = self._bind(p, flat)
        p.run(flat)

    def _bind(self, p: Plan, flat):
        """``run(flat)``: a plan's execution, made at its first call. Arguments the kernel takes
        from the plan or from non-tensor parameters are constants of the plan (its cache key holds
        them); tensors come from each call."""
        # on a GPU the data checks cost a device-to-host copy and a sync; validate=False skips them
        check = self._data_check(flat)
        if p.kernel is None and not p.fallback:   # nothing to compute, but the data must still be valid
            return (lambda flat: check(self.namespace(flat), p)) if check else (lambda flat: None)
        spans = self._spans(flat)
        if p.fallback:
            def run(flat):
                self._check_overlap(flat, spans)
                x = self.namespace(flat)
                if check:
                    check(x, p)
                self._fallback(x, p)
            return run
        sources = []
        for name in registry.get(p.kernel).args:
            i = self.names.index(name) if name not in p.args else None
            sources.append(("call", i) if i in self.tensors and flat[i] is not None
                           else ("const", p.args[name] if i is None else flat[i]))
        device = flat[self.out_index].device
        # the launch refuses an out that overlaps an input, from the addresses it packs anyway
        launch = launcher.bind(build.artifact(p.kernel, p.variant, p.arch), p.grid, p.block, sources, p.backend,
                               self.out_index, device, spans=spans, overlap=self._check_overlap)
        if not check and not p.zero_out:
            return launch

        def run(flat):
            if p.zero_out:        # zeroing comes before the launch's own check
                self._check_overlap(flat, spans)
            if check:
                check(self.namespace(flat), p)
            if p.zero_out:
                flat[self.out_index].zero_()
            launch(flat)
        return run


def _span(t: torch.Tensor) -> int:
    """Bytes from t's first element to the end of its last (0 when empty)."""
    if t.numel() == 0:
        return 0
    return (sum((n - 1) * s for n, s in zip(t.shape, t.stride())) + 1) * t.element_size()


def _symbolic(flat) -> bool:
    """Does any argument hold a symbolic size (torch.compile's dynamic shapes)?"""
    sym = (torch.SymInt, torch.SymFloat, torch.SymBool)
    return any(isinstance(v, sym) or isinstance(v, torch.Tensor)
               and any(isinstance(d, sym) for d in (*v.shape, *v.stride())) for v in flat)


def op(plan, fallback=None, alloc=None, convert=None, check_data=None, fill=None, out_shape=None):
    """Decorator: the annotated signature function -> the public op (see the module docstring).
    ``alloc``: torch.empty / torch.zeros for out-less calls; ``out_shape(x)``: (shape, dtype) of
    an out-less call's result by shape arithmetic alone (torch.compile's symbolic shapes);
    ``convert``: {param: fn} applied to user values (e.g. a config dict -> its string form);
    ``fill``: {param: fn(other params by name)} computes an argument left None (e.g. group offsets
    from group lengths); ``check_data(x, plan)``: checks of tensor contents before the launch,
    skipped when the call passes ``validate=False`` (the op then has that parameter)."""
    def deco(fn):
        return functools.update_wrapper(Op(fn, plan, fallback, alloc, convert, check_data, fill, out_shape), fn,
                                        updated=())
    return deco


def explain(name: str, *args, **kw) -> Plan:
    """Which kernel, config and backend ``name`` would run for these arguments and why (or why
    it falls back, or the guard it breaks: that GuardError is raised as the op would raise it)."""
    try:
        o = OPS[name]
    except KeyError:
        raise KeyError(f"unknown op {name!r}; ops: {sorted(OPS)}") from None
    return o.explain(*args, **kw)
