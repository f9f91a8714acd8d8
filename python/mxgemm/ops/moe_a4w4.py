"""moe_gemm2_a4w4: MXFP4 x MXFP4 MoE down-projection ("gemm2"): top-k summed by bf16 atomics, or a row per route.

Two kernels compute it bit-identically: the hand-written HIP reference
(csrc/kernels/moe_gemm2_a4w4.hip) and its 1:1 FlyDSL port (flydsl_kernels/moe_gemm2_a4w4.py).
"""
from __future__ import annotations

import warnings

import torch

from .. import guards, registry
from ._op import E8M0, Plan, empty_plan, kernel_plan, op

_KERNEL = {"hip": "moe_gemm2_a4w4", "flydsl": "moe_gemm2_a4w4_flydsl"}
_FACTS = registry.get(_KERNEL["hip"])   # tiles, alignment and BM values: the same for both ports
_BLOCK_MS = _FACTS.values("BM")
_FP4_DTYPES = tuple(t for t in (torch.uint8, getattr(torch, "float4_e2m1fn_x2", None)) if t is not None)
_MAX_TOKENS = 1 << 24  # token id field of sorted_token_ids
_MAX_TOPK = 256        # slot field (8 bits)


def _routing_block_m(sorted_token_ids, sorted_expert_ids):
    """Block sizes in _BLOCK_MS consistent with the sorted layout: the routing pads every
    expert to a multiple of block_m and sorted_expert_ids has ceil(len / block_m) entries."""
    n_ids, n_blocks = sorted_token_ids.numel(), sorted_expert_ids.numel()
    return [bm for bm in _BLOCK_MS if -(-n_ids // bm) == n_blocks]


def _plan(x) -> Plan:
    named = dict(a=x.a, a_scale=x.a_scale, w=x.w, w_scale=x.w_scale, sorted_token_ids=x.sorted_token_ids,
                 sorted_expert_ids=x.sorted_expert_ids, num_valid_ids=x.num_valid_ids,
                 sorted_weights=x.sorted_weights, out=x.out)
    a, w, out, language, block_m = x.a, x.w, x.out, x.language, x.block_m
    if x.backend is not None:     # the old spelling: "backend" elsewhere means GPU vs emulator
        if language not in ("auto", x.backend):
            guards.fail("language", f"language={language!r} and its deprecated alias backend={x.backend!r} disagree")
        warnings.warn("moe_gemm2_a4w4(backend=...) is deprecated: the kernel language is language=...",
                      DeprecationWarning, stacklevel=2)
        language = x.backend
    if language not in ("auto", *_KERNEL):
        guards.fail("language", f"language must be 'auto', 'hip' or 'flydsl'; got {language!r}")
    guards.check_dtype(a, "a", _FP4_DTYPES)
    guards.check_dtype(w, "w", _FP4_DTYPES)
    guards.check_dtype(x.a_scale, "a_scale", E8M0)
    guards.check_dtype(x.w_scale, "w_scale", E8M0)
    for name in ("sorted_token_ids", "sorted_expert_ids", "num_valid_ids"):
        guards.check_dtype(named[name], name, torch.int32)
    guards.check_dtype(x.sorted_weights, "sorted_weights", torch.float32)
    guards.check_dtype(out, "out", torch.bfloat16)
    for name, t in named.items():
        guards.check_contiguous(t, name)
    device = guards.check_same_device(**named)

    if w.dim() != 3:
        guards.fail("shape", f"w must be 3-D [E, N, K/2]; got shape {list(w.shape)}")
    E, N, K = w.shape[0], w.shape[1], w.shape[2] * 2
    guards.check_multiple(K, "K (D_INTER)", _FACTS.k_align, f"D_INTER%{_FACTS.k_align}")
    guards.check_multiple(N, "N (D_HIDDEN)", _FACTS.n_align, f"D_HIDDEN%{_FACTS.n_align}")
    guards.check_shape(x.w_scale, "w_scale", (E, N, K // 32))
    route_rows = out.dim() == 3     # [T, topk, N]: a row per route, as vLLM's fused-MoE cache
    if out.dim() not in (2, 3) or out.shape[-1] != N:
        guards.fail("shape", f"out has shape {list(out.shape)}; expected [T, {N}] or [T, topk, {N}] (N from w)")
    T = out.shape[0]
    if a.dim() != 2:
        guards.fail("shape", f"a must be 2-D [T*topk, K/2]; got shape {list(a.shape)}")
    if a.shape[1] * 2 != K:
        guards.fail("shape", f"a has K = {a.shape[1] * 2} (shape {list(a.shape)}, 2 values per byte) "
                             f"but w has K = {K} (shape {list(w.shape)})")
    rows = a.shape[0]
    if route_rows and out.shape[0] * out.shape[1] != rows:
        guards.fail("shape", f"out has shape {list(out.shape)}: its T x topk = {out.shape[0] * out.shape[1]} "
                             f"is not the {rows} rows of a (one per token and top-k slot)")
    if rows % max(T, 1) or (T == 0) != (rows == 0):
        guards.fail("shape", f"out has shape {list(out.shape)}: its T = {T} does not divide the {rows} rows "
                             f"of a (a holds T*topk rows, one per token and top-k slot)")
    topk = rows // T if T else None
    if T >= _MAX_TOKENS or (topk or 0) > _MAX_TOPK:
        guards.fail("routing", f"T = {T} must be < 2^24 and topk = {topk} <= 256 "
                               "(sorted_token_ids packs (slot << 24) | token)")
    guards.check_shape(x.a_scale, "a_scale", (rows, K // 32))
    for name in ("sorted_token_ids", "sorted_expert_ids", "sorted_weights", "num_valid_ids"):
        if named[name].dim() != 1:
            guards.fail("shape", f"{name} must be 1-D; got shape {list(named[name].shape)}")
    guards.check_shape(x.sorted_weights, "sorted_weights", (x.sorted_token_ids.numel(),))
    if x.num_valid_ids.numel() < 1:
        guards.fail("shape", "num_valid_ids must hold at least one element")

    fits = _routing_block_m(x.sorted_token_ids, x.sorted_expert_ids)
    if block_m is None:
        if not fits:
            guards.fail("block_m", f"sorted layout ({x.sorted_token_ids.numel()} ids, "
                                   f"{x.sorted_expert_ids.numel()} blocks) matches no kernel block size "
                                   f"in {_BLOCK_MS}")
        block_m = min(fits)    # a one-block layout fits every larger block too: the fewest dead rows
    guards.check_range(block_m, "block_m", _BLOCK_MS, "block_m")
    if block_m not in fits:
        guards.fail("block_m", f"block_m = {block_m} does not match the sorted layout "
                               f"({x.sorted_token_ids.numel()} ids in {x.sorted_expert_ids.numel()} blocks): "
                               "use the block_m the routing was built with")

    # Raw buffer resources: a and a_scale whole, w and w_scale per expert (the kernel rebases
    # its resource to the expert in 64-bit arithmetic).
    guards.check_voffset(a, "a")
    guards.check_voffset(x.a_scale, "a_scale")
    if E:
        guards.check_voffset(w[0], "w[expert]")
        guards.check_voffset(x.w_scale[0], "w_scale[expert]")

    # Non-temporal weight loads pay off when each expert's weights are read about once:
    # at most one block of rows per expert on average.
    nt = x.nt
    if nt is None:
        nt = int(rows <= block_m * max(E, 1))
    guards.check_range(int(nt), "nt", (0, 1), "nt")
    why = ("the HIP reference kernel (the FlyDSL port is bit-identical)" if language == "auto"
           else f"language={language!r} requested")
    language = "hip" if language == "auto" else language
    blocks = x.sorted_expert_ids.numel()
    routing = dict(block_m=int(block_m), tokens=T, topk=topk, experts=E)   # what the data check reads
    if K == 0 or N == 0 or blocks == 0 or T == 0:
        return empty_plan("moe_gemm2_a4w4", "empty problem: nothing to launch", args=routing)
    variant = {"BM": int(block_m), "NT": int(nt), "ROUTE_ROWS": int(route_rows)}
    return kernel_plan("moe_gemm2_a4w4", _KERNEL[language], variant, device,
                       f"{why}; BM={block_m} from the routing layout, NT={int(nt)} "
                       f"({'weights streamed' if nt else 'weights cached'}; {rows} rows over {E} experts); "
                       f"ROUTE_ROWS={int(route_rows)} (out {list(out.shape)}: "
                       f"{'a row per route, plain stores' if route_rows else 'top-k summed by bf16 atomics'})",
                       N=N, K=K, blocks=blocks, **routing)


def _check_routing(x, plan) -> None:
    r = plan.args
    guards.check_routing(x.sorted_token_ids, x.sorted_expert_ids, x.num_valid_ids, r["block_m"], r["tokens"],
                         r["topk"], r["experts"])


@op(plan=_plan, check_data=_check_routing)
def moe_gemm2_a4w4(a: torch.Tensor, a_scale: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor,
                   sorted_token_ids: torch.Tensor, sorted_expert_ids: torch.Tensor,
                   num_valid_ids: torch.Tensor, sorted_weights: torch.Tensor, out: torch.Tensor, *,
                   block_m: int | None = None, nt: bool | None = None, language: str = "auto",
                   backend: str | None = None, validate: bool = True) -> torch.Tensor:
    """MoE down-projection: for every real sorted row p with (token, slot) = sorted_token_ids[p]
    and expert e of p's block, v = bf16(sorted_weights[p] * (A[token*topk + slot] . W[e]^T)), then
        out [T, N]:        out[token, :] += v, one bf16 atomic add (RNE) per element, so the
                           result depends on arrival order;
        out [T, topk, N]:  out[token, slot, :] = v, a plain store (deterministic; rows no sorted
                           row names are left as they are). The top-k sum is the caller's, as in
                           vLLM's fused MoE (out.sum(1)); at prefill this form spares the L2 the
                           atomics (docs/peers/moe_a4w4.md).

    a:        [T*topk, K/2] packed e2m1 (uint8 or float4_e2m1fn_x2; even k in the low nibble),
              row = token*topk + slot.       a_scale: [T*topk, K/32] e8m0 (uint8 or float8_e8m0fnu).
    w:        [E, N, K/2] packed e2m1, natural row-major layout (no pre-shuffle).
              w_scale: [E, N, K/32] e8m0.
    sorted_token_ids [P] int32 ((slot << 24) | token; token >= T is padding),
    sorted_expert_ids [ceil(P / block_m)] int32, num_valid_ids [1 or 2] int32 (rows below
    num_valid_ids[0] are live), sorted_weights [P] f32: the layout of mxgemm.routing.moe_sorting.
    out:      [T, N] bf16, accumulated in place (zero it for a plain product), or [T, topk, N] bf16,
              written; returned.
    K % 256 == 0 (D_INTER), N % 256 == 0 (D_HIDDEN).
    block_m:  16, 32, 64 or 128, the routing's block size (inferred from the layout when None). On
              the timing model 16 suits decode (at most 16 routed rows per expert), 64 prefill
              (docs/peers/moe_a4w4.md).
    nt:       non-temporal weight loads (None: on when experts average <= one block of rows).
    language: the kernel: "hip" (reference kernel), "flydsl" (its bit-identical port) or "auto"
              (hip); backend: its deprecated alias (a DeprecationWarning).
    validate: before the launch, check the routing metadata the kernel trusts (GuardError,
    out untouched): 0 <= num_valid_ids[0] <= P; a live entry's slot < topk unless its token is
    padding (>= T); a block holding live rows names an expert < E (the kernels would skip it and
    its rows would be missing). On a GPU that costs a device-to-host copy and a sync per call;
    validate=False skips it for metadata made by moe_sorting.
    """
