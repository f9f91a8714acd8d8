"""moe_mxfp8_grouped_gemm: MXFP8 MoE grouped GEMM over the expert-sorted layout of
``mxgemm.routing.moe_sorting`` (kernel smallm_mxfp8_moe_grouped_gemm in
csrc/kernels/smallm_mxfp8.hip). Guards, formats and the fallback: ``ops/_mxfp8.py``. Config
choice (``mxgemm.explain`` prints it): the caller's, else a tuned CSV row (``python -m mxgemm tune
moe_mxfp8``) for the same experts, top-k, a layout, N, K and block_m at the nearest tuned token
count >= T, else ``moe_heuristic_config``."""
from __future__ import annotations

import functools

import torch

from .. import guards, registry, tuned
from . import _mxfp8 as mx
from ._op import NUM_CUS, Choice, ConfigGrammar, Plan, empty_plan, op

MOE = "smallm_mxfp8_moe_grouped_gemm"
MFMA_CHUNK, MFMA_K = 16, 128   # the M_CHUNK whose chunk is one scaled 16 x 16 x 128 MFMA tile
ARCH, = registry.get(MOE).archs
CONFIG_CSV = tuned.table_path("moe_mxfp8", ARCH)
CSV_KEY = ("experts", "topk", "per_route_a", "N", "K", "block_m")   # per_route_a: a is [T, topk, K]
CSV_PARAMS = ("BLOCK_N", "M_CHUNK")
CSV_FIELDS = ("arch", "tokens", *CSV_KEY, *CSV_PARAMS, "us", "source", "runner_up", "runner_up_us", "peer_us")


def candidates(K: int, block_m: int) -> list:
    """The variants that run a call with this K and block_m: a tuner times each."""
    return [v for v in registry.get(MOE).variants
            if block_m % v["M_CHUNK"] == 0 and (v["M_CHUNK"] != MFMA_CHUNK or K % MFMA_K == 0)]


@functools.lru_cache(maxsize=1)
def tuned_table() -> dict:
    """CSV rows keyed (arch, *CSV_KEY) -> list of (tokens, variant, source) by tokens. Read once."""
    return tuned.by_size(CONFIG_CSV, lambda r: (r["arch"], *(int(r[c]) for c in CSV_KEY)), "tokens",
                         lambda r: {p: int(r[p]) for p in CSV_PARAMS})


def tuned_config(tokens: int, experts: int, topk: int, per_route_a: bool, N: int, K: int, block_m: int,
                 arch: str = ARCH):
    """The Choice of the CSV row at the nearest tuned token count >= tokens with the same key, if
    its variant runs K and block_m."""
    row = tuned.at_or_above(tuned_table().get((arch, experts, topk, int(per_route_a), N, K, block_m), ()), tokens)
    if row is None or row[1] not in candidates(K, block_m):
        return None
    return Choice(MOE, row[1], f"tuned CSV row tokens={row[0]} experts={experts} topk={topk} N={N} K={K} "
                               f"(source={row[2]})")


RESIDENT_WGS = NUM_CUS * 8   # 256-thread workgroups a full chip holds at once (8 per CU: 32 wave slots)


def moe_heuristic_config(routes: int, experts: int, N: int, K: int, block_m: int, live_blocks: int):
    """M_CHUNK 16, the MFMA core with BLOCK_N 64 (when K and block_m allow it), where its workgroups
    over the blocks the routes fill reach 3/4 of the CUs: it has no K split, but with its loads a
    step ahead that many keep HBM busy, and then it streams the weights faster than the GEMV core
    (docs/peers/moe_mxfp8.md). Else the GEMV core, BLOCK_N the widest (fewer, fuller workgroups,
    each lane a longer run of K) that still launches 3 workgroups per 2 CUs, else 8. Its M_CHUNK is
    4 (a weight tile read once per 4 rows) only where throughput decides: its grid fills every
    resident slot and an active expert averages >= 1.5 rows; else 2, whose loads run a step ahead
    and whose padding rows skip more."""
    if K % MFMA_K == 0 and block_m % MFMA_CHUNK == 0 and 4 * -(-N // 64) * live_blocks >= 3 * NUM_CUS:
        return Choice(MOE, {"BLOCK_N": 64, "M_CHUNK": MFMA_CHUNK}, "heuristic (moe_heuristic_config)")
    wide = [bn for bn in (64, 32, 16) if 2 * -(-N // bn) * live_blocks >= 3 * NUM_CUS]
    block_n = wide[0] if wide else 8
    active = experts * (1 - (1 - 1 / experts) ** routes)      # experts holding a route, routes uniform
    full = -(-N // block_n) * live_blocks >= RESIDENT_WGS and routes >= 1.5 * active
    return Choice(MOE, {"BLOCK_N": block_n, "M_CHUNK": 4 if full else 2}, "heuristic (moe_heuristic_config)")


def route_blocks(routes: int, experts: int, block_m: int) -> int:
    """The most sorted blocks the routes can fill: m + (routes - m) // block_m for m =
    min(routes, experts) (every expert holding a route pads at most block_m - 1 rows)."""
    m = min(routes, experts)
    return m + (routes - m) // block_m


def heuristic_choice(tokens: int, topk: int, experts: int, N: int, K: int, block_m: int, sorted_rows: int):
    """moe_heuristic_config at the call's live blocks: the blocks the routes can fill, within the
    sorted buffer's (at least one)."""
    routes = tokens * topk
    blocks = min(-(-sorted_rows // block_m), route_blocks(routes, experts, block_m))
    return moe_heuristic_config(routes, experts, N, K, block_m, max(1, blocks))


def grid_blocks(blocks: int, col_groups: int, block_m: int, experts: int, routes: int) -> int:
    """Workgroup rows of the launch; the kernel strides over the live blocks, so fewer rows than the
    buffer's worst-case blocks still cover them all. At most as many rows as the chip's resident
    workgroups need (each row then loops over its share, and no row launches past them), and at
    most route_blocks."""
    return max(1, min(blocks, RESIDENT_WGS // col_groups, route_blocks(routes, experts, block_m)))


CONFIG = ConfigGrammar("moe_mxfp8_grouped_gemm", {"BLOCK_N": int, "M_CHUNK": int}, required=True)


def _plan(x) -> Plan:
    name = "moe_mxfp8_grouped_gemm"
    a, w, block_m = x.a, x.w, x.block_m
    mx.check_fallback_mode(x.fallback)
    if a.dim() not in (2, 3):
        guards.fail("shape", f"a must be [T, K] or [T, topk, K]; got shape {list(a.shape)}")
    K = mx.check_mx_operand(a, x.a_scale, "a", a.dim())
    mx.check_mx_operand(w, x.w_scale, "w", 3, K)
    T, N = a.shape[0], w.shape[1]
    ids = dict(sorted_token_ids=x.sorted_token_ids, sorted_expert_ids=x.sorted_expert_ids,
               num_valid_ids=x.num_valid_ids)
    for n, t in ids.items():
        guards.check_dtype(t, n, torch.int32)
        if t.dim() != 1:
            guards.fail("shape", f"{n} must be 1-D; got shape {list(t.shape)}")
        guards.check_contiguous(t, n)
    if x.num_valid_ids.numel() < 1:
        guards.fail("shape", "num_valid_ids must hold at least one element")
    if not isinstance(block_m, int) or block_m < 1:
        guards.fail("block_m", f"block_m must be a positive int; got {block_m!r}")
    S = x.sorted_token_ids.shape[0]
    blocks = -(-S // block_m)
    if x.sorted_expert_ids.shape[0] < blocks:
        guards.fail("shape", f"sorted_expert_ids has {x.sorted_expert_ids.shape[0]} blocks; "
                             f"{S} sorted rows / block_m {block_m} need {blocks}")
    tw = x.topk_weights
    if tw is not None:
        guards.check_dtype(tw, "topk_weights", torch.float32)
        guards.check_shape(tw, "topk_weights", (T, a.shape[1] if a.dim() == 3 else None))
        guards.check_contiguous(tw, "topk_weights")
    topk = topk_of(x)
    if topk is None:
        guards.fail("topk", "topk must be given when a is [T, K] and topk_weights is None: out is [T, topk, N]")
    if not isinstance(topk, int) or topk < 1 or topk >= 256:
        guards.fail("topk", f"topk must be an int in [1, 255] (the slot field of a sorted id); got {topk!r}")
    if x.topk is not None and x.topk != topk:
        guards.fail("topk", f"topk = {x.topk} but a / topk_weights have {topk} slots per token")
    if x.out_dtype not in (torch.bfloat16, torch.float32):
        guards.fail("dtype", f"out_dtype must be torch.bfloat16 or torch.float32; got {x.out_dtype}")
    if x.out is not None and x.out.dtype != x.out_dtype:
        guards.fail("dtype", f"out has dtype {x.out.dtype} but out_dtype is {x.out_dtype}")
    mx.check_out(x.out, (T, topk, N), (x.out_dtype,))
    device = guards.check_same_device(a=a, a_scale=x.a_scale, w=w, w_scale=x.w_scale, **ids,
                                      topk_weights=tw, out=x.out)
    shape = dict(out_shape=(T, topk, N), out_dtype=x.out_dtype)
    if S == 0 or N == 0 or T == 0:
        return empty_plan(name, **shape)
    variant = CONFIG.parse(x.config)
    if variant is not None:
        if variant not in registry.get(MOE).variants:
            guards.fail("config", f"{MOE} has no variant {variant}; registered: {list(registry.get(MOE).variants)}")
        why = "config given by the caller"
    else:
        choice = (tuned_config(T, w.shape[0], topk, a.dim() == 3, N, K, block_m)
                  or heuristic_choice(T, topk, w.shape[0], N, K, block_m, S))
        variant, why = choice.variant, choice.why
    if block_m % variant["M_CHUNK"]:
        guards.fail("block_m", f"block_m = {block_m} must be a multiple of M_CHUNK = {variant['M_CHUNK']}")
    if variant["M_CHUNK"] == MFMA_CHUNK and K % MFMA_K:
        guards.fail("shape", f"K = {K} must be a multiple of {MFMA_K} for M_CHUNK = {MFMA_CHUNK} (scaled MFMA steps)")
    # One resource per expert slice: the weights are rebased per expert in the kernel.
    expert = (w[0], x.w_scale[0]) if w.shape[0] else (w, x.w_scale)
    named = (("a", a), ("a_scale", x.a_scale), ("w[expert]", expert[0]), ("w_scale[expert]", expert[1]),
             ("out", x.out))
    flags = (1 if tw is not None else 0) | (2 if a.dim() == 3 else 0) | (4 if x.out_dtype == torch.float32 else 0)
    return mx.kernel_or_fallback(x.fallback, name, named, MOE, variant, device, why, **shape, N=N, K=K,
                                 grid_blocks=grid_blocks(blocks, -(-N // variant["BLOCK_N"]), block_m, w.shape[0],
                                                         T * topk),
                                 tokens=T, topk=topk, a_rows=a.numel() // K if K else 0, block_m=block_m,
                                 flags=flags)


def topk_of(x):
    """The top-k of the routes (out's rows are token * topk + slot): a's [T, topk, K] rows, else
    topk_weights' columns, else the caller's topk (None: not given)."""
    if x.a.dim() == 3:
        return x.a.shape[1]
    return x.topk if x.topk_weights is None else x.topk_weights.shape[1]


def _check_routing(x, plan) -> None:
    guards.check_routing(x.sorted_token_ids, x.sorted_expert_ids, x.num_valid_ids, x.block_m, x.a.shape[0],
                         topk_of(x), x.w.shape[0])


def _fallback(x, plan) -> None:
    """Per-expert dequantise + matmul (reads num_valid_ids and the experts on the host)."""
    a, a_scale, w, w_scale, out = x.a, x.a_scale, x.w, x.w_scale, x.out
    n = int(x.num_valid_ids[0])
    ids = x.sorted_token_ids[:n].long()
    tok, slot = ids & 0xFFFFFF, ids >> 24
    exp = x.sorted_expert_ids.long()[torch.arange(n, device=ids.device) // x.block_m]
    real = (tok < a.shape[0]) & (exp >= 0)
    vals = torch.zeros(n, w.shape[1], dtype=torch.float32, device=a.device)
    topk = topk_of(x)
    a2 = a.reshape(-1, a.shape[-1])
    s2 = a_scale.reshape(-1, a_scale.shape[-1])
    row = tok * a.shape[1] + slot if a.dim() == 3 else tok
    for e in exp[real].unique().tolist():
        r = (real & (exp == e)).nonzero().squeeze(1)
        vals[r] = mx.dequant(a2[row[r]], s2[row[r]]) @ mx.dequant(w[e], w_scale[e]).T
    if x.topk_weights is not None:
        tw = x.topk_weights
        wt = tw[tok.clamp(max=a.shape[0] - 1), slot.clamp(max=tw.shape[1] - 1)]
        vals = vals * wt[:, None]
    out.view(-1, out.shape[-1])[tok[real] * topk + slot[real]] = vals[real].to(out.dtype)


@op(plan=_plan, fallback=_fallback, alloc=torch.zeros, convert={"config": CONFIG.text},
    check_data=_check_routing, out_shape=lambda x: ((x.a.shape[0], topk_of(x), x.w.shape[1]), x.out_dtype))
def moe_mxfp8_grouped_gemm(a: torch.Tensor, a_scale: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor,
                           sorted_token_ids: torch.Tensor, sorted_expert_ids: torch.Tensor,
                           num_valid_ids: torch.Tensor, *, topk_weights: torch.Tensor | None = None,
                           block_m: int, topk: int | None = None, out: torch.Tensor | None = None,
                           out_dtype: torch.dtype = torch.bfloat16, config: str = "",
                           fallback: str = "auto", validate: bool = True) -> torch.Tensor:
    """MXFP8 MoE grouped GEMM over the expert-sorted layout of ``mxgemm.routing.moe_sorting``.

    a: [T, K] e4m3 (one row per token; gemm1 style) or [T, topk, K] (one row per (token, slot))
    a_scale: [T, K/32] / [T, topk, K/32] e8m0;  w: [E, N, K] e4m3, w_scale: [E, N, K/32]
    sorted_token_ids: [S] int32, (slot << 24) | token, padding rows have token >= T
    sorted_expert_ids: [>= ceil(S / block_m)] int32, expert of each block of block_m rows (-1: none)
    num_valid_ids: [1] or [2] int32, num_valid_ids[0] = sorted rows in use (padding included)
    topk_weights: optional [T, topk] fp32; route (token, slot) is multiplied by topk_weights[token, slot]
    topk: routes per token; needed only when a is [T, K] and topk_weights is None
    -> out [T, topk, N] out_dtype (bf16 or fp32) in route order, as vLLM's fused MoE caches: for
       each route of the sorted rows p < num_valid_ids[0] (token < T, its block's expert >= 0),
       out[token, slot] = weight * A[row(p)] @ W[expert(p)]^T (MX-scaled, fp32 accumulation);
       padding rows write nothing, routes no sorted row holds are left as they were (0 when out
       is None). A [T, topk, N] out feeds the next GEMM as its [T, topk, K] a.
    config: force a variant, e.g. {"BLOCK_N": 16, "M_CHUNK": 4}. fallback: as smallm_mxfp8_gemm.
    The 2 GB rule applies to a, a_scale, out and ONE expert's slice of w / w_scale (the
    kernel rebases the weight resource per expert).
    validate: before the launch, check the routing metadata the kernel trusts (GuardError,
    nothing written): 0 <= num_valid_ids[0] <= S; a live entry's slot < topk unless its token is
    padding (>= T); a block holding live rows names an expert
    < E. On a GPU that costs a device-to-host copy and a sync per call; validate=False skips it
    for metadata made by moe_sorting, and a malformed layout then reads out of bounds.
    """
