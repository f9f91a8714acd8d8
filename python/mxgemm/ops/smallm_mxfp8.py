"""Small-M (decode-regime) MXFP8 GEMM and MoE grouped GEMM on gfx950.

    smallm_mxfp8_gemm(a, a_scale, b, b_scale)            -> [M, N] bf16
    moe_mxfp8_grouped_gemm(a, a_scale, w, w_scale, sorted_token_ids, sorted_expert_ids,
                           num_valid_ids, block_m=...)   -> [S, N] bf16 | fp32

Formats (OCP MX-FP8): payload float8_e4m3fn (K contiguous), scales e8m0 as uint8 or
float8_e8m0fnu, one per 32 consecutive K (0xFF = NaN).

Kernel choice (``mxgemm.explain`` prints it): a tuned CSV row for (arch, M, N, K) if one exists
(exact M, else the nearest tuned M above with the same N, K), else the heuristic rule of
``heuristic_config``. Shapes outside every kernel's envelope, arch other than gfx950 and
tensors over the 2 GB raw-buffer limit run the fallback (dequantise to fp32 + torch matmul on
the tensors' device) unless ``fallback="error"``, which raises ``GuardError`` instead.
Malformed calls (dtype, shape, K % 32, contiguity, device) always raise, before any launch.

Fallback numerics: operands are dequantised to fp32 (exact unless a scaled element leaves the
fp32 range: below 2^-149 it flushes to 0) and multiplied with torch's fp32 matmul, so results
agree with the kernels to within the fp32-reordering bound, not bit for bit.
"""
from __future__ import annotations

import csv
import functools
import time
from pathlib import Path

import torch

from .. import build, guards, launcher, registry
from ..dispatch import Plan, planner, tensor_key

ARCH = "gfx950"
NUM_CUS = 256                 # MI355X compute units: the heuristic sizes grids against this
MX_BLOCK = 32
MFMA_K = 128                  # K per v_mfma_scale_f32_16x16x128_f8f6f4 step
THREADS = 256                 # every kernel of the family runs 256-thread workgroups
GEMV, MFMA, MOE = "smallm_mxfp8_gemv", "smallm_mxfp8_mfma", "smallm_mxfp8_moe_grouped_gemm"
# Kernel envelopes: M (rows of A) each kernel serves, and its K alignment.
M_RANGE = {GEMV: (1, 16), MFMA: (8, 64)}
K_ALIGN = {GEMV: MX_BLOCK, MFMA: MFMA_K, MOE: MX_BLOCK}
PAYLOAD = (torch.float8_e4m3fn,)
SCALES = (torch.uint8, torch.float8_e8m0fnu)
CONFIG_CSV = Path(__file__).resolve().parent.parent / "configs" / "smallm_mxfp8_gfx950.csv"
CSV_PARAMS = ("M_TILE", "N_SUB", "SPLIT_K")   # variant columns of the CSV (blank = unused)
FALLBACK_MODES = ("auto", "error")
_VOFFSET_LIMIT = guards.VOFFSET_LIMIT


# ------------------------------------------------------------------------------------------
# Config choice
# ------------------------------------------------------------------------------------------
def _pow2_at_least(x: int, choices) -> int:
    return next(c for c in choices if c >= x)


def heuristic_config(M: int, N: int, K: int):
    """(kernel, variant, why) for a dense shape, or None when no kernel serves it.

    Rule (written before any hardware timing; op_tests/tune_smallm_mxfp8.py replaces it with
    measurements on an MI355X):
      * M < 8, or K % 128 != 0 with M <= 16: GEMV. Its VALU work grows with M while the weight
        stream does not, so from M = 8 (the MFMA kernel's envelope) the scaled MFMA wins.
        M_TILE = next power of two >= M; N_SUB = 2 (two weight rows per lane group, reusing the
        decoded A block) once N gives at least 2 workgroups per CU with it, else 1.
      * 8 <= M <= 64 and K % 128 == 0: MFMA, M_TILE = smallest of 16/32/64 >= M, SPLIT_K = the
        smallest of 1/2/4 that gives >= NUM_CUS workgroups (4 when none does), capped by the
        number of 128-wide K steps so no wave idles.
    """
    if M < 1 or M > 64 or K % MX_BLOCK:
        return None
    if M < 8 or (K % MFMA_K and M <= 16):
        m_tile = _pow2_at_least(M, (1, 2, 4, 8, 16))
        n_sub = 2 if m_tile <= 8 and N >= 2 * NUM_CUS * 32 else 1
        return GEMV, {"M_TILE": m_tile, "N_SUB": n_sub}, "heuristic: GEMV (M < 8 or K % 128 != 0)"
    if K % MFMA_K:
        return None
    m_tile = _pow2_at_least(M, (16, 32, 64))
    steps = K // MFMA_K
    split = 4
    for s in (1, 2, 4):
        if -(-N // (64 // s)) * -(-M // m_tile) >= NUM_CUS:
            split = s
            break
    while split > 1 and split > steps:
        split //= 2
    return MFMA, {"M_TILE": m_tile, "SPLIT_K": split}, "heuristic: scaled MFMA (8 <= M <= 64, K % 128 == 0)"


def _variant_of(kernel: str, row: dict) -> dict:
    keys = {GEMV: ("M_TILE", "N_SUB"), MFMA: ("M_TILE", "SPLIT_K")}[kernel]
    return {k: int(row[k]) for k in keys}


@functools.lru_cache(maxsize=1)
def tuned_table() -> dict:
    """CSV rows keyed (arch, N, K) -> sorted list of (M, kernel, variant, source). Read once."""
    table: dict = {}
    if not CONFIG_CSV.exists():
        return table
    with open(CONFIG_CSV, newline="") as f:
        for row in csv.DictReader(f):
            key = (row["arch"], int(row["N"]), int(row["K"]))
            table.setdefault(key, []).append(
                (int(row["M"]), row["kernel"], _variant_of(row["kernel"], row), row["source"]))
    for rows in table.values():
        rows.sort(key=lambda r: r[0])
    return table


def tuned_config(M: int, N: int, K: int, arch: str = ARCH):
    """CSV config for the nearest tuned M >= M with the same (N, K), if its kernel serves M."""
    for m, kernel, variant, source in tuned_table().get((arch, N, K), ()):
        if m >= M:
            lo, hi = M_RANGE[kernel]
            if lo <= M <= hi and K % K_ALIGN[kernel] == 0:
                return kernel, variant, f"tuned CSV row M={m} N={N} K={K} (source={source})"
            return None
    return None


def parse_config(config) -> tuple | None:
    """A user config as {"kernel": name, PARAM: value, ...} or "name:P=v,P=v" -> (kernel, variant)."""
    if config is None or config == "":
        return None
    if isinstance(config, str):
        name, _, params = config.partition(":")
        config = {"kernel": name, **{k: int(v) for k, v in
                                     (p.split("=") for p in params.split(",") if p)}}
    config = dict(config)
    kernel = config.pop("kernel", None)
    if kernel not in (GEMV, MFMA):
        guards.fail("config", f"config kernel must be {GEMV!r} or {MFMA!r}; got {kernel!r}")
    variant = {k: int(v) for k, v in config.items()}
    if variant not in registry.get(kernel).variants:
        guards.fail("config", f"{kernel} has no variant {variant}; registered: "
                              f"{list(registry.get(kernel).variants)}")
    return kernel, variant


def _config_str(config) -> str:
    parsed = parse_config(config)
    if parsed is None:
        return ""
    kernel, variant = parsed
    return kernel + ":" + ",".join(f"{k}={v}" for k, v in sorted(variant.items()))


# ------------------------------------------------------------------------------------------
# Guards
# ------------------------------------------------------------------------------------------
def _check_mx_operand(x, x_scale, name, ndim, K=None):
    """x [..., K] (ndim dims) e4m3 with x_scale [..., K/32] e8m0, both contiguous; returns K."""
    guards.check_dtype(x, name, PAYLOAD)
    guards.check_dtype(x_scale, f"{name}_scale", SCALES)
    guards.check_shape(x, name, (None,) * (ndim - 1) + (K,))
    K = x.shape[-1]
    guards.check_multiple(K, "K", MX_BLOCK, "K%32")
    guards.check_shape(x_scale, f"{name}_scale", (*x.shape[:-1], K // MX_BLOCK))
    guards.check_contiguous(x, name)
    guards.check_contiguous(x_scale, f"{name}_scale")
    return K


def _check_out(out, shape, dtypes):
    if out is not None:
        guards.check_dtype(out, "out", dtypes)
        guards.check_shape(out, "out", shape)
        guards.check_contiguous(out, "out")


def _envelope(fallback: str, op: str, rule: str, detail: str) -> Plan:
    """Out of every kernel's envelope: the fallback plan, or GuardError when asked to."""
    if fallback == "error":
        guards.fail(rule, detail + ' (fallback="error")')
    return Plan(op, None, backend="fallback", fallback=True, reason=f"{rule}: {detail}")


def _kernel_checks(fallback, op, named, backend_tensor):
    """2 GB voffset and arch: the two envelope rules shared by both ops. -> Plan | backend."""
    try:
        for n, t in named:
            if t is not None:
                guards.check_voffset(t, n, _VOFFSET_LIMIT)
        return guards.check_arch(backend_tensor)
    except guards.GuardError as e:
        return _envelope(fallback, op, e.rule, e.detail)


def _check_fallback_mode(fallback):
    if fallback not in FALLBACK_MODES:
        guards.fail("fallback", f"fallback must be one of {FALLBACK_MODES}; got {fallback!r}")


# Cached plans: key = everything a guard or the config choice reads (shapes, dtypes, device,
# contiguity, config, fallback mode), so a hit needs no guard re-run and no file I/O.
_PLANS: dict = {}


def _config_key(config):
    return config if config is None or isinstance(config, str) else tuple(sorted(dict(config).items()))


# ------------------------------------------------------------------------------------------
# Dense small-M GEMM
# ------------------------------------------------------------------------------------------
@planner("smallm_mxfp8_gemm")
def plan_smallm_mxfp8_gemm(a, a_scale, b, b_scale, *, out=None, config=None, fallback="auto") -> Plan:
    key = ("gemm", tensor_key(a), tensor_key(a_scale), tensor_key(b), tensor_key(b_scale),
           tensor_key(out), _config_key(config), fallback)
    plan = _PLANS.get(key)
    if plan is None:
        plan = _PLANS[key] = _plan_gemm(a, a_scale, b, b_scale, out, config, fallback)
    return plan


def _plan_gemm(a, a_scale, b, b_scale, out, config, fallback) -> Plan:
    op = "smallm_mxfp8_gemm"
    _check_fallback_mode(fallback)
    K = _check_mx_operand(a, a_scale, "a", 2)
    _check_mx_operand(b, b_scale, "b", 2, K)
    M, N = a.shape[0], b.shape[0]
    _check_out(out, (M, N), (torch.bfloat16,))
    guards.check_same_device(a=a, a_scale=a_scale, b=b, b_scale=b_scale, out=out)
    if M == 0 or N == 0:
        return Plan(op, None, backend="none", reason="empty output: nothing to launch")
    backend = _kernel_checks(fallback, op, (("a", a), ("a_scale", a_scale), ("b", b),
                                             ("b_scale", b_scale), ("out", out)), a)
    if isinstance(backend, Plan):
        return backend
    forced = parse_config(config)
    if forced is not None:
        kernel, variant = forced
        lo, hi = M_RANGE[kernel]
        if not lo <= M <= hi:
            guards.fail("M-range", f"M = {M} is outside {kernel}'s envelope [{lo}, {hi}]")
        guards.check_multiple(K, "K", K_ALIGN[kernel], f"K%{K_ALIGN[kernel]}")
        why = "config given by the caller"
    else:
        choice = tuned_config(M, N, K) or heuristic_config(M, N, K)
        if choice is None:
            if M > 64:
                return _envelope(fallback, op, "M-range", f"M = {M} is outside the small-M "
                                                          f"kernels' envelope [1, 64]")
            return _envelope(fallback, op, "K%128", f"M = {M} > 16 needs the MFMA kernel, which "
                                                    f"requires K % 128 == 0; K = {K}")
        kernel, variant, why = choice
    if kernel == GEMV:
        block_n = THREADS // 16 * variant["N_SUB"]
    else:
        block_n = 16 * (4 // variant["SPLIT_K"])
    grid = (-(-N // block_n), -(-M // variant["M_TILE"]), 1)
    return Plan(op, kernel, variant, backend, grid, (THREADS, 1, 1), reason=why)


def _dequant(x, x_scale):
    """[..., K] e4m3 + [..., K/32] e8m0 -> fp32 on x's device (0xFF -> NaN)."""
    e = x_scale.view(torch.uint8).to(torch.int32)
    s = torch.ldexp(torch.ones_like(e, dtype=torch.float32), e - 127)
    s = torch.where(e == 255, torch.full_like(s, float("nan")), s)
    K = x.shape[-1]
    return (x.float().reshape(*x.shape[:-1], K // MX_BLOCK, MX_BLOCK) * s[..., None]).reshape(x.shape)


def _run_gemm(a, a_scale, b, b_scale, out, config, fallback) -> None:
    plan = plan_smallm_mxfp8_gemm(a, a_scale, b, b_scale, out=out, config=config or None,
                                  fallback=fallback)
    if plan.fallback:
        out.copy_(_dequant(a, a_scale) @ _dequant(b, b_scale).T)
    elif plan.kernel is not None:
        launcher.launch(build.artifact(plan.kernel, plan.variant, ARCH), plan.grid, plan.block,
                        [a.view(torch.uint8), a_scale.view(torch.uint8), b.view(torch.uint8),
                         b_scale.view(torch.uint8), out, a.shape[0], b.shape[0], a.shape[1]],
                        backend=plan.backend)


@torch.library.custom_op("mxgemm::smallm_mxfp8_gemm_out", mutates_args=("out",))
def _gemm_out_op(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor,
                 out: torch.Tensor, config: str, fallback: str) -> None:
    _run_gemm(a, a_scale, b, b_scale, out, config, fallback)


# Fake (meta) implementations run the planner too, so guards fire while tracing and on devices
# that only reach the fake kernel (e.g. "meta").
@_gemm_out_op.register_fake
def _(a, a_scale, b, b_scale, out, config, fallback):
    plan_smallm_mxfp8_gemm(a, a_scale, b, b_scale, out=out, config=config or None, fallback=fallback)


@torch.library.custom_op("mxgemm::smallm_mxfp8_gemm", mutates_args=())
def _gemm_op(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor,
             config: str, fallback: str) -> torch.Tensor:
    out = torch.empty((a.shape[0], b.shape[0]), dtype=torch.bfloat16, device=a.device)
    _run_gemm(a, a_scale, b, b_scale, out, config, fallback)
    return out


@_gemm_op.register_fake
def _(a, a_scale, b, b_scale, config, fallback):
    plan_smallm_mxfp8_gemm(a, a_scale, b, b_scale, config=config or None, fallback=fallback)
    return a.new_empty((a.shape[0], b.shape[0]), dtype=torch.bfloat16)


def smallm_mxfp8_gemm(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor,
                      b_scale: torch.Tensor, *, out: torch.Tensor | None = None, config=None,
                      fallback: str = "auto") -> torch.Tensor:
    """Decode-regime MXFP8 GEMM: out[m, n] = sum_k A[m, k] * B[n, k] with 1x32 e8m0 K-block
    scales, fp32 accumulation, bf16 (RNE) output.

    a: [M, K] float8_e4m3fn, a_scale: [M, K/32] uint8 | float8_e8m0fnu
    b: [N, K] float8_e4m3fn (weights, K contiguous), b_scale: [N, K/32]
    out: optional [M, N] bf16 (contiguous), written in place and returned.
    config: force a kernel, e.g. {"kernel": "smallm_mxfp8_gemv", "M_TILE": 4, "N_SUB": 1}.
    fallback: "auto" runs dequantise + torch matmul outside the kernels' envelope (M > 64,
    K % 128 != 0 with M > 16, non-gfx950 device, a tensor >= 2 GB); "error" raises instead.
    Kernels: GEMV for M <= 16 (K % 32 == 0), scaled MFMA for 8 <= M <= 64 (K % 128 == 0).
    """
    cfg = _config_str(config)
    if out is None:
        return torch.ops.mxgemm.smallm_mxfp8_gemm(a, a_scale, b, b_scale, cfg, fallback)
    torch.ops.mxgemm.smallm_mxfp8_gemm_out(a, a_scale, b, b_scale, out, cfg, fallback)
    return out


# ------------------------------------------------------------------------------------------
# MoE grouped GEMM
# ------------------------------------------------------------------------------------------
def moe_heuristic_config(num_tokens: int, N: int):
    """BLOCK_N = 16 (fewer, fuller workgroups) unless that leaves under 2 workgroups per CU per
    sorted block column, then 8; M_CHUNK = 4 when an expert gets >= 4 rows on average (T >= 4),
    else 2 so padding-heavy decode blocks skip more."""
    block_n = 16 if N >= 2 * NUM_CUS * 16 else 8
    return {"BLOCK_N": block_n, "M_CHUNK": 4 if num_tokens >= 4 else 2}


@planner("moe_mxfp8_grouped_gemm")
def plan_moe_mxfp8_grouped_gemm(a, a_scale, w, w_scale, sorted_token_ids, sorted_expert_ids,
                                num_valid_ids, *, topk_weights=None, block_m, out=None,
                                out_dtype=torch.bfloat16, config=None, fallback="auto") -> Plan:
    key = ("moe", *map(tensor_key, (a, a_scale, w, w_scale, sorted_token_ids, sorted_expert_ids,
                                    num_valid_ids, topk_weights, out)),
           block_m, out_dtype, _config_key(config), fallback)
    plan = _PLANS.get(key)
    if plan is None:
        plan = _PLANS[key] = _plan_moe(a, a_scale, w, w_scale, sorted_token_ids, sorted_expert_ids,
                                       num_valid_ids, topk_weights, block_m, out, out_dtype,
                                       config, fallback)
    return plan


def _plan_moe(a, a_scale, w, w_scale, sorted_token_ids, sorted_expert_ids, num_valid_ids,
              topk_weights, block_m, out, out_dtype, config, fallback) -> Plan:
    op = "moe_mxfp8_grouped_gemm"
    _check_fallback_mode(fallback)
    if a.dim() not in (2, 3):
        guards.fail("shape", f"a must be [T, K] or [T, topk, K]; got shape {list(a.shape)}")
    K = _check_mx_operand(a, a_scale, "a", a.dim())
    _check_mx_operand(w, w_scale, "w", 3, K)
    T, N = a.shape[0], w.shape[1]
    for n, t in (("sorted_token_ids", sorted_token_ids), ("sorted_expert_ids", sorted_expert_ids),
                 ("num_valid_ids", num_valid_ids)):
        guards.check_dtype(t, n, torch.int32)
        if t.dim() != 1:
            guards.fail("shape", f"{n} must be 1-D; got shape {list(t.shape)}")
        guards.check_contiguous(t, n)
    if num_valid_ids.numel() < 1:
        guards.fail("shape", "num_valid_ids must hold at least one element")
    if not isinstance(block_m, int) or block_m < 1:
        guards.fail("block_m", f"block_m must be a positive int; got {block_m!r}")
    S = sorted_token_ids.shape[0]
    if sorted_expert_ids.shape[0] < -(-S // block_m):
        guards.fail("shape", f"sorted_expert_ids has {sorted_expert_ids.shape[0]} blocks; "
                             f"{S} sorted rows / block_m {block_m} need {-(-S // block_m)}")
    topk = a.shape[1] if a.dim() == 3 else None
    if topk_weights is not None:
        guards.check_dtype(topk_weights, "topk_weights", torch.float32)
        guards.check_shape(topk_weights, "topk_weights", (T, topk))
        guards.check_contiguous(topk_weights, "topk_weights")
        topk = topk_weights.shape[1]
    if out_dtype not in (torch.bfloat16, torch.float32):
        guards.fail("dtype", f"out_dtype must be torch.bfloat16 or torch.float32; got {out_dtype}")
    _check_out(out, (S, N), (out_dtype,))
    guards.check_same_device(a=a, a_scale=a_scale, w=w, w_scale=w_scale,
                             sorted_token_ids=sorted_token_ids, sorted_expert_ids=sorted_expert_ids,
                             num_valid_ids=num_valid_ids, topk_weights=topk_weights, out=out)
    if S == 0 or N == 0:
        return Plan(op, None, backend="none", reason="empty output: nothing to launch")
    # One resource per expert slice: the weights are rebased per expert in the kernel.
    named = (("a", a), ("a_scale", a_scale), ("w[expert]", w[0]), ("w_scale[expert]", w_scale[0]),
             ("out", out))
    backend = _kernel_checks(fallback, op, named, a)
    if isinstance(backend, Plan):
        return backend
    if config:
        variant = dict(config) if not isinstance(config, str) else \
            {k: int(v) for k, v in (p.split("=") for p in config.split(",") if p)}
        if variant not in registry.get(MOE).variants:
            guards.fail("config", f"{MOE} has no variant {variant}; registered: "
                                  f"{list(registry.get(MOE).variants)}")
        why = "config given by the caller"
    else:
        variant, why = moe_heuristic_config(T, N), "heuristic (see moe_heuristic_config)"
    if block_m % variant["M_CHUNK"]:
        guards.fail("block_m", f"block_m = {block_m} must be a multiple of M_CHUNK = {variant['M_CHUNK']}")
    grid = (-(-N // variant["BLOCK_N"]), -(-S // block_m), 1)
    return Plan(op, MOE, variant, backend, grid, (THREADS, 1, 1), reason=why,
                extra={"topk": topk or 1})


def _moe_fallback(a, a_scale, w, w_scale, sorted_token_ids, sorted_expert_ids, num_valid_ids,
                  topk_weights, block_m, out):
    """Per-expert dequantise + matmul (reads num_valid_ids and the experts on the host)."""
    n = int(num_valid_ids[0])
    ids = sorted_token_ids[:n].long()
    tok, slot = ids & 0xFFFFFF, ids >> 24
    exp = sorted_expert_ids.long()[torch.arange(n, device=ids.device) // block_m]
    real = (tok < a.shape[0]) & (exp >= 0)
    vals = torch.zeros(n, w.shape[1], dtype=torch.float32, device=a.device)
    a2 = a.reshape(-1, a.shape[-1])
    s2 = a_scale.reshape(-1, a_scale.shape[-1])
    row = tok * a.shape[1] + slot if a.dim() == 3 else tok
    for e in exp[real].unique().tolist():
        r = (real & (exp == e)).nonzero().squeeze(1)
        vals[r] = _dequant(a2[row[r]], s2[row[r]]) @ _dequant(w[e], w_scale[e]).T
    if topk_weights is not None:
        wt = topk_weights[tok.clamp(max=a.shape[0] - 1), slot.clamp(max=topk_weights.shape[1] - 1)]
        vals = vals * torch.where(real, wt, torch.zeros_like(wt))[:, None]
    out[:n].copy_(vals)


def _op_plan(a, a_scale, w, w_scale, sorted_token_ids, sorted_expert_ids, num_valid_ids,
             topk_weights, block_m, out, out_dtype, config, fallback) -> Plan:
    """The planner called with the custom ops' flat arguments (config "" = none)."""
    return plan_moe_mxfp8_grouped_gemm(a, a_scale, w, w_scale, sorted_token_ids, sorted_expert_ids,
                                       num_valid_ids, topk_weights=topk_weights, block_m=block_m,
                                       out=out, out_dtype=out_dtype, config=config or None,
                                       fallback=fallback)


def _run_moe(a, a_scale, w, w_scale, sorted_token_ids, sorted_expert_ids, num_valid_ids,
             topk_weights, block_m, out, config, fallback) -> None:
    plan = _op_plan(a, a_scale, w, w_scale, sorted_token_ids, sorted_expert_ids, num_valid_ids,
                    topk_weights, block_m, out, out.dtype, config, fallback)
    if plan.fallback:
        _moe_fallback(a, a_scale, w, w_scale, sorted_token_ids, sorted_expert_ids, num_valid_ids,
                      topk_weights, block_m, out)
        return
    if plan.kernel is None:
        return
    flags = (1 if topk_weights is not None else 0) | (2 if a.dim() == 3 else 0) | \
            (4 if out.dtype == torch.float32 else 0)
    K = a.shape[-1]
    a_rows = a.numel() // K
    launcher.launch(build.artifact(plan.kernel, plan.variant, ARCH), plan.grid, plan.block,
                    [a.view(torch.uint8), a_scale.view(torch.uint8), w.view(torch.uint8),
                     w_scale.view(torch.uint8), sorted_token_ids, sorted_expert_ids, num_valid_ids,
                     topk_weights if topk_weights is not None else num_valid_ids,  # unread if unset
                     out, a.shape[0], plan.extra["topk"], w.shape[1], K, a_rows, block_m, flags],
                    backend=plan.backend)


@torch.library.custom_op("mxgemm::moe_mxfp8_grouped_gemm_out", mutates_args=("out",))
def _moe_out_op(a: torch.Tensor, a_scale: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor,
                sorted_token_ids: torch.Tensor, sorted_expert_ids: torch.Tensor,
                num_valid_ids: torch.Tensor, topk_weights: torch.Tensor | None, block_m: int,
                out: torch.Tensor, config: str, fallback: str) -> None:
    _run_moe(a, a_scale, w, w_scale, sorted_token_ids, sorted_expert_ids, num_valid_ids,
             topk_weights, block_m, out, config, fallback)


@_moe_out_op.register_fake
def _(a, a_scale, w, w_scale, sorted_token_ids, sorted_expert_ids, num_valid_ids, topk_weights,
      block_m, out, config, fallback):
    _op_plan(a, a_scale, w, w_scale, sorted_token_ids, sorted_expert_ids, num_valid_ids,
             topk_weights, block_m, out, out.dtype, config, fallback)


@torch.library.custom_op("mxgemm::moe_mxfp8_grouped_gemm", mutates_args=())
def _moe_op(a: torch.Tensor, a_scale: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor,
            sorted_token_ids: torch.Tensor, sorted_expert_ids: torch.Tensor,
            num_valid_ids: torch.Tensor, topk_weights: torch.Tensor | None, block_m: int,
            out_dtype: torch.dtype, config: str, fallback: str) -> torch.Tensor:
    out = torch.zeros((sorted_token_ids.shape[0], w.shape[1]), dtype=out_dtype, device=a.device)
    _run_moe(a, a_scale, w, w_scale, sorted_token_ids, sorted_expert_ids, num_valid_ids,
             topk_weights, block_m, out, config, fallback)
    return out


@_moe_op.register_fake
def _(a, a_scale, w, w_scale, sorted_token_ids, sorted_expert_ids, num_valid_ids, topk_weights,
      block_m, out_dtype, config, fallback):
    _op_plan(a, a_scale, w, w_scale, sorted_token_ids, sorted_expert_ids, num_valid_ids,
             topk_weights, block_m, None, out_dtype, config, fallback)
    return a.new_empty((sorted_token_ids.shape[0], w.shape[1]), dtype=out_dtype)


def moe_mxfp8_grouped_gemm(a: torch.Tensor, a_scale: torch.Tensor, w: torch.Tensor,
                           w_scale: torch.Tensor, sorted_token_ids: torch.Tensor,
                           sorted_expert_ids: torch.Tensor, num_valid_ids: torch.Tensor, *,
                           topk_weights: torch.Tensor | None = None, block_m: int,
                           out: torch.Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16,
                           config=None, fallback: str = "auto") -> torch.Tensor:
    """MXFP8 MoE grouped GEMM over the expert-sorted layout of ``mxgemm.routing.moe_sorting``.

    a: [T, K] e4m3 (one row per token; gemm1 style) or [T, topk, K] (one row per (token, slot))
    a_scale: [T, K/32] / [T, topk, K/32] e8m0;  w: [E, N, K] e4m3, w_scale: [E, N, K/32]
    sorted_token_ids: [S] int32, (slot << 24) | token, padding rows have token >= T
    sorted_expert_ids: [>= ceil(S / block_m)] int32, expert of each block of block_m rows (-1: none)
    num_valid_ids: [1] or [2] int32, num_valid_ids[0] = sorted rows in use (padding included)
    topk_weights: optional [T, topk] fp32; row p is multiplied by topk_weights[token, slot]
    -> out [S, N] out_dtype (bf16 or fp32) in sorted order: for p < num_valid_ids[0],
       out[p] = weight * A[row(p)] @ W[expert(p)]^T (MX-scaled, fp32 accumulation); padding
       rows are 0; rows p >= num_valid_ids[0] are left as they were (0 when out is None).
    config: force a variant, e.g. {"BLOCK_N": 16, "M_CHUNK": 4}. fallback: as smallm_mxfp8_gemm.
    The 2 GB rule applies to a, a_scale, out and ONE expert's slice of w / w_scale (the
    kernel rebases the weight resource per expert).
    """
    if isinstance(config, dict):
        config = ",".join(f"{k}={v}" for k, v in sorted(config.items()))
    if out is not None and out.dtype != out_dtype:
        guards.fail("dtype", f"out has dtype {out.dtype} but out_dtype is {out_dtype}")
    if out is None:
        return torch.ops.mxgemm.moe_mxfp8_grouped_gemm(
            a, a_scale, w, w_scale, sorted_token_ids, sorted_expert_ids, num_valid_ids, topk_weights,
            block_m, out_dtype, config or "", fallback)
    torch.ops.mxgemm.moe_mxfp8_grouped_gemm_out(
        a, a_scale, w, w_scale, sorted_token_ids, sorted_expert_ids, num_valid_ids, topk_weights,
        block_m, out, config or "", fallback)
    return out


# ------------------------------------------------------------------------------------------
# Benchmarks and demo hooks (wired into `python -m mxgemm bench dispatch` / `demo`)
# ------------------------------------------------------------------------------------------
def bench_dispatch(n_calls: int = 100_000) -> float:
    """Microseconds per call of the planner on a cached key (guards + config choice, no launch)."""
    g = torch.Generator().manual_seed(0)
    M, N, K = 1, 4096, 4096
    a = torch.randint(0, 0x7E, (M, K), dtype=torch.uint8, generator=g).view(torch.float8_e4m3fn)
    b = torch.empty((N, K), dtype=torch.float8_e4m3fn)
    sa, sb = torch.full((M, K // 32), 127, dtype=torch.uint8), torch.full((N, K // 32), 127, dtype=torch.uint8)
    plan_smallm_mxfp8_gemm(a, sa, b, sb)  # fill the cache
    t0 = time.perf_counter()
    for _ in range(n_calls):
        plan_smallm_mxfp8_gemm(a, sa, b, sb)
    return (time.perf_counter() - t0) / n_calls * 1e6


def demo() -> list[str]:
    """One GEMV and one MoE call on the default backend vs mxgemm.reference (max bf16 ulp)."""
    from .. import metrics, quant, reference, routing
    dev = "cuda" if launcher_backend() == "hip" else "cpu"
    g = torch.Generator().manual_seed(0)
    lines = []
    M, N, K = 2, 128, 256
    a, sa = quant.quantize_mx(torch.randn(M, K, generator=g), "e4m3")
    b, sb = quant.quantize_mx(torch.randn(N, K, generator=g), "e4m3")
    t0 = time.perf_counter()
    got = smallm_mxfp8_gemm(a.to(dev), sa.to(dev), b.to(dev), sb.to(dev)).cpu()
    dt = time.perf_counter() - t0
    ulp = int(metrics.bf16_ulp_distance(got, reference.smallm_mxfp8_gemm_ref(a, sa, b, sb)).max())
    plan = plan_smallm_mxfp8_gemm(a, sa, b, sb)
    lines.append(f"smallm_mxfp8_gemm {M}x{N}x{K} [{plan.kernel}]: max {ulp} bf16 ulp vs reference "
                 f"({'ok' if ulp <= 1 else 'MISMATCH'}, {dt:.2f} s)")
    T, E, topk, N, K, bm = 3, 4, 2, 64, 128, 4
    x, xs = quant.quantize_mx(torch.randn(T, K, generator=g), "e4m3")
    w, ws = quant.quantize_mx(torch.randn(E, N, K, generator=g), "e4m3")
    ids = torch.randint(0, E, (T, topk), generator=g)
    tw = torch.rand(T, topk, generator=g)
    srt = routing.moe_sorting(ids, tw, E, block_m=bm)
    t0 = time.perf_counter()
    got = moe_mxfp8_grouped_gemm(x.to(dev), xs.to(dev), w.to(dev), ws.to(dev),
                                 srt.sorted_token_ids.to(dev), srt.sorted_expert_ids.to(dev),
                                 srt.num_valid_ids.to(dev), topk_weights=tw.to(dev), block_m=bm).cpu()
    dt = time.perf_counter() - t0
    ref = reference.moe_mxfp8_grouped_gemm_ref(x, xs, w, ws, srt.sorted_token_ids,
                                               srt.sorted_expert_ids, srt.num_valid_ids, bm,
                                               sorted_weights=srt.sorted_weights)
    ulp = int(metrics.bf16_ulp_distance(got[:ref.shape[0]], ref).max())
    lines.append(f"moe_mxfp8_grouped_gemm T={T} E={E} topk={topk} N={N} K={K}: max {ulp} bf16 ulp "
                 f"vs reference ({'ok' if ulp <= 1 else 'MISMATCH'}, {dt:.2f} s)")
    return lines


def launcher_backend() -> str:
    from ..toolchain import launch_backend
    return launch_backend()
