"""moe_gemm2_a4w4: MXFP4 x MXFP4 MoE down-projection ("gemm2") with bf16 atomic accumulation.

Two kernels compute it bit-identically: the hand-written HIP reference
(csrc/kernels/moe_gemm2_a4w4.hip) and its 1:1 FlyDSL port (flydsl_kernels/moe_gemm2_a4w4.py).
"""
from __future__ import annotations

import torch

from .. import build, guards, launcher
from ..dispatch import Plan, planner, tensor_key

_KERNEL = {"hip": "moe_gemm2_a4w4", "flydsl": "moe_gemm2_a4w4_flydsl"}
_BLOCK_MS = (16, 32)
_FP4_DTYPES = tuple(t for t in (torch.uint8, getattr(torch, "float4_e2m1fn_x2", None)) if t is not None)
_SCALE_DTYPES = (torch.uint8, torch.float8_e8m0fnu)
_BLOCK_N = 256   # output columns per workgroup (D_HIDDEN % 256)
_BLOCK_K = 256   # K per pipeline step (D_INTER % 256)
_THREADS = 256
_MAX_TOKENS = 1 << 24  # token id field of sorted_token_ids
_MAX_TOPK = 256        # slot field (8 bits)


def _routing_block_m(sorted_token_ids, sorted_expert_ids):
    """Block sizes in _BLOCK_MS consistent with the sorted layout: the routing pads every
    expert to a multiple of block_m and sorted_expert_ids has ceil(len / block_m) entries."""
    n_ids, n_blocks = sorted_token_ids.numel(), sorted_expert_ids.numel()
    return [bm for bm in _BLOCK_MS if -(-n_ids // bm) == n_blocks]


_PLANS: dict = {}


@planner("moe_gemm2_a4w4")
def plan_moe_gemm2_a4w4(a, a_scale, w, w_scale, sorted_token_ids, sorted_expert_ids, num_valid_ids,
                        sorted_weights, out, *, block_m=None, nt=None, backend="auto") -> Plan:
    tensors = (a, a_scale, w, w_scale, sorted_token_ids, sorted_expert_ids, num_valid_ids, sorted_weights, out)
    key = (tuple(map(tensor_key, tensors)), block_m, nt, backend)
    plan = _PLANS.get(key)
    if plan is None:
        plan = _PLANS[key] = _plan(*tensors, block_m=block_m, nt=nt, backend=backend)
    return plan


def _plan(a, a_scale, w, w_scale, sorted_token_ids, sorted_expert_ids, num_valid_ids, sorted_weights, out,
          *, block_m, nt, backend) -> Plan:
    named = dict(a=a, a_scale=a_scale, w=w, w_scale=w_scale, sorted_token_ids=sorted_token_ids,
                 sorted_expert_ids=sorted_expert_ids, num_valid_ids=num_valid_ids,
                 sorted_weights=sorted_weights, out=out)
    if backend not in ("auto", *_KERNEL):
        guards.fail("backend", f"backend must be 'auto', 'hip' or 'flydsl'; got {backend!r}")
    guards.check_dtype(a, "a", _FP4_DTYPES)
    guards.check_dtype(w, "w", _FP4_DTYPES)
    guards.check_dtype(a_scale, "a_scale", _SCALE_DTYPES)
    guards.check_dtype(w_scale, "w_scale", _SCALE_DTYPES)
    for name in ("sorted_token_ids", "sorted_expert_ids", "num_valid_ids"):
        guards.check_dtype(named[name], name, torch.int32)
    guards.check_dtype(sorted_weights, "sorted_weights", torch.float32)
    guards.check_dtype(out, "out", torch.bfloat16)
    for name, t in named.items():
        guards.check_contiguous(t, name)
    guards.check_same_device(**named)

    if w.dim() != 3:
        guards.fail("shape", f"w must be 3-D [E, N, K/2]; got shape {list(w.shape)}")
    E, N, K = w.shape[0], w.shape[1], w.shape[2] * 2
    guards.check_multiple(K, "K (D_INTER)", _BLOCK_K, "D_INTER%256")
    guards.check_multiple(N, "N (D_HIDDEN)", _BLOCK_N, "D_HIDDEN%256")
    guards.check_shape(w_scale, "w_scale", (E, N, K // 32))
    if out.dim() != 2:
        guards.fail("shape", f"out must be 2-D [T, N]; got shape {list(out.shape)}")
    T = out.shape[0]
    guards.check_shape(out, "out", (T, N))
    guards.check_shape(a, "a", (None, K // 2))
    rows = a.shape[0]
    if T == 0 or rows % T:
        guards.fail("shape", f"a has {rows} rows; expected T*topk rows for out's T = {T}")
    topk = rows // T
    if T >= _MAX_TOKENS or topk > _MAX_TOPK:
        guards.fail("routing", f"T = {T} must be < 2^24 and topk = {topk} <= 256 "
                               "(sorted_token_ids packs (slot << 24) | token)")
    guards.check_shape(a_scale, "a_scale", (rows, K // 32))
    for name in ("sorted_token_ids", "sorted_expert_ids", "sorted_weights", "num_valid_ids"):
        if named[name].dim() != 1:
            guards.fail("shape", f"{name} must be 1-D; got shape {list(named[name].shape)}")
    guards.check_shape(sorted_weights, "sorted_weights", (sorted_token_ids.numel(),))
    if num_valid_ids.numel() < 1:
        guards.fail("shape", "num_valid_ids must hold at least one element")

    fits = _routing_block_m(sorted_token_ids, sorted_expert_ids)
    if block_m is None:
        if not fits:
            guards.fail("block_m", f"sorted layout ({sorted_token_ids.numel()} ids, {sorted_expert_ids.numel()} "
                                   f"blocks) matches no kernel block size in {_BLOCK_MS}")
        block_m = max(fits)
    guards.check_range(block_m, "block_m", _BLOCK_MS, "block_m")
    if block_m not in fits:
        guards.fail("block_m", f"block_m = {block_m} does not match the sorted layout "
                               f"({sorted_token_ids.numel()} ids in {sorted_expert_ids.numel()} blocks): "
                               "use the block_m the routing was built with")

    # Raw buffer resources: a and a_scale whole, w and w_scale per expert (the kernel rebases
    # its resource to the expert in 64-bit arithmetic).
    guards.check_voffset(a, "a")
    guards.check_voffset(a_scale, "a_scale")
    if E:
        guards.check_voffset(w[0], "w[expert]")
        guards.check_voffset(w_scale[0], "w_scale[expert]")
    arch_backend = guards.check_arch(a)

    # Non-temporal weight loads pay off when each expert's weights are read about once:
    # at most one block of rows per expert on average.
    if nt is None:
        nt = int(rows <= block_m * max(E, 1))
    guards.check_range(int(nt), "nt", (0, 1), "nt")
    language = "hip" if backend == "auto" else backend
    grid = (N // _BLOCK_N, sorted_expert_ids.numel(), 1)
    why = ("the HIP reference kernel (the FlyDSL port is bit-identical)" if backend == "auto"
           else f"backend={backend!r} requested")
    return Plan("moe_gemm2_a4w4", _KERNEL[language], {"BM": int(block_m), "NT": int(nt)}, arch_backend, grid,
                (_THREADS, 1, 1),
                reason=f"{why}; BM={block_m} from the routing layout, NT={int(nt)} "
                       f"({'weights streamed' if nt else 'weights cached'}; {rows} rows over {E} experts)",
                extra={"tokens": T, "topk": topk, "experts": E, "N": N, "K": K})


def _launch(plan: Plan, args) -> None:
    a, a_scale, w, w_scale, sorted_token_ids, sorted_expert_ids, num_valid_ids, sorted_weights, out = args
    x = plan.extra
    if out.numel() == 0 or x["K"] == 0 or sorted_expert_ids.numel() == 0:
        return
    art = build.artifact(plan.kernel, plan.variant, "gfx950")
    u8 = lambda t: t.view(torch.uint8)  # noqa: E731
    launcher.launch(art, plan.grid, plan.block,
                    [u8(a), u8(a_scale), u8(w), u8(w_scale), sorted_token_ids, sorted_expert_ids, num_valid_ids,
                     sorted_weights, out, x["tokens"], x["topk"], x["experts"], x["N"], x["K"]])


@torch.library.custom_op("mxgemm::moe_gemm2_a4w4", mutates_args=("out",))
def _moe_gemm2_a4w4_op(a: torch.Tensor, a_scale: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor,
                       sorted_token_ids: torch.Tensor, sorted_expert_ids: torch.Tensor,
                       num_valid_ids: torch.Tensor, sorted_weights: torch.Tensor, out: torch.Tensor,
                       block_m: int, nt: int, backend: str) -> None:
    args = (a, a_scale, w, w_scale, sorted_token_ids, sorted_expert_ids, num_valid_ids, sorted_weights, out)
    _launch(plan_moe_gemm2_a4w4(*args, block_m=block_m, nt=nt, backend=backend), args)


@_moe_gemm2_a4w4_op.register_fake
def _(a, a_scale, w, w_scale, sorted_token_ids, sorted_expert_ids, num_valid_ids, sorted_weights, out,
      block_m, nt, backend) -> None:
    return None


def moe_gemm2_a4w4(a: torch.Tensor, a_scale: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor,
                   sorted_token_ids: torch.Tensor, sorted_expert_ids: torch.Tensor,
                   num_valid_ids: torch.Tensor, sorted_weights: torch.Tensor, out: torch.Tensor, *,
                   block_m: int | None = None, nt: bool | None = None, backend: str = "auto") -> torch.Tensor:
    """MoE down-projection, accumulated into ``out``: for every real sorted row p with
    (token, slot) = sorted_token_ids[p] and expert e of p's block,
        out[token, :] += bf16(sorted_weights[p] * (A[token*topk + slot] . W[e]^T))
    with one bf16 atomic add (RNE) per element, so the result depends on arrival order.

    a:        [T*topk, K/2] packed e2m1 (uint8 or float4_e2m1fn_x2; even k in the low nibble),
              row = token*topk + slot.       a_scale: [T*topk, K/32] e8m0 (uint8 or float8_e8m0fnu).
    w:        [E, N, K/2] packed e2m1, natural row-major layout (no pre-shuffle).
              w_scale: [E, N, K/32] e8m0.
    sorted_token_ids [P] int32 ((slot << 24) | token; token >= T is padding),
    sorted_expert_ids [ceil(P / block_m)] int32, num_valid_ids [1 or 2] int32 (rows below
    num_valid_ids[0] are live), sorted_weights [P] f32: the layout of mxgemm.routing.moe_sorting.
    out:      [T, N] bf16, accumulated in place (zero it for a plain product) and returned.
    K % 256 == 0 (D_INTER), N % 256 == 0 (D_HIDDEN).
    block_m:  16 or 32, the routing's block size (inferred from the layout when None).
    nt:       non-temporal weight loads (None: on when experts average <= one block of rows).
    backend:  "hip" (reference kernel), "flydsl" (its bit-identical port) or "auto" (hip).
    """
    plan = plan_moe_gemm2_a4w4(a, a_scale, w, w_scale, sorted_token_ids, sorted_expert_ids, num_valid_ids,
                               sorted_weights, out, block_m=block_m, nt=nt, backend=backend)
    _moe_gemm2_a4w4_op(a, a_scale, w, w_scale, sorted_token_ids, sorted_expert_ids, num_valid_ids,
                       sorted_weights, out, plan.variant["BM"], plan.variant["NT"],
                       "hip" if plan.kernel == _KERNEL["hip"] else "flydsl")
    return out


# ---- structure of the compiled kernels (HIP vs FlyDSL parity report) ----
STEPS_PER_LOOP_ITERATION = 2  # both kernels run K steps in pairs (two alternating register sets)
_COUNTED = (("scaled MFMA", ("v_mfma_scale_f32_16x16x128_f8f6f4",)),
            ("buffer loads (all)", ("buffer_load_",)),
            ("  of which direct-to-LDS", ("buffer_load_dwordx4/lds",)),
            ("barriers", ("s_barrier",)),
            ("ds_read_b128", ("ds_read_b128",)))


def k_step_profile(asm: str, symbol: str = "moe_gemm2_a4w4") -> dict:
    """Instruction counts per K step of the main loop (the body between the loop header and
    its back-edge, divided by the steps it runs) of one kernel's assembly."""
    lines = [l for l in (x.split(";")[0].strip() for x in asm.splitlines()) if l]
    start = lines.index(f"{symbol}:")
    labels = {}
    for i, l in enumerate(lines[start:], start):
        if l.endswith(":") and l.startswith(".LBB"):
            labels[l[:-1]] = i
    loop = None
    for i, l in enumerate(lines[start:], start):
        parts = l.split()
        if parts[0].startswith("s_cbranch") and len(parts) > 1 and labels.get(parts[1], i) < i:
            loop = lines[labels[parts[1]] + 1:i + 1]
            break
    if loop is None:
        raise ValueError(f"{symbol}: no loop back-edge found")
    keyed = [(l.split()[0] + ("/lds" if l.split()[0].startswith("buffer_load") and " lds" in f" {l} " else ""))
             for l in loop if not l.endswith(":") and not l.startswith(".")]
    out = {}
    for name, prefixes in _COUNTED:
        n = sum(1 for m in keyed if any(m.startswith(p) for p in prefixes))
        out[name] = n / STEPS_PER_LOOP_ITERATION
    return out
