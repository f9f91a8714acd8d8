"""MoE routing: the block-aligned, expert-sorted layout the MoE kernels consume (aiter moe_sorting)."""
import numbers
from typing import NamedTuple, Optional

import torch

from . import guards

TOKEN_BITS = 24
TOKEN_MASK = (1 << TOKEN_BITS) - 1
MAX_SLOT = 127  # slots sit in bits 24..30 of an int32: decode_sorted_id shifts arithmetically
INT_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


class MoeSorting(NamedTuple):
    sorted_token_ids: torch.Tensor   # int32 [max_padded]
    sorted_weights: torch.Tensor     # fp32  [max_padded]
    sorted_expert_ids: torch.Tensor  # int32 [ceil(max_padded / block_m)]
    num_valid_ids: torch.Tensor      # int32 [1] or [2]


def encode_sorted_id(token: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
    return ((slot.to(torch.int32) << TOKEN_BITS) | token.to(torch.int32)).to(torch.int32)


def decode_sorted_id(sorted_ids: torch.Tensor):
    """-> (token id, top-k slot); for padding entries the token id is >= T."""
    return sorted_ids & TOKEN_MASK, sorted_ids >> TOKEN_BITS


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _check_sorting_args(topk_ids, topk_weights, num_experts, block_m, pad_value, expert_mask, num_valid_len):
    for name, value in (("num_experts", num_experts), ("block_m", block_m)):
        if not _is_int(value) or value < 1:
            guards.fail(name, f"{name} = {value!r} must be a positive int")
    if not _is_int(num_valid_len) or num_valid_len not in (1, 2):
        guards.fail("num_valid_len", f"num_valid_len = {num_valid_len!r}; expected 1 ([padded rows]) "
                                     "or 2 ([padded rows, T])")
    if pad_value is not None and not (_is_int(pad_value) and -2**31 <= pad_value < 2**31):
        guards.fail("pad_value", f"pad_value = {pad_value!r} must be an int32 (-2^31 <= pad_value < 2^31): "
                                 "sorted_token_ids holds it")
    for name, t in (("topk_ids", topk_ids), ("topk_weights", topk_weights), ("expert_mask", expert_mask)):
        if t is not None and not isinstance(t, torch.Tensor):
            guards.fail("type", f"{name} must be a torch.Tensor; got {type(t).__name__}")
    if topk_ids.dtype not in INT_DTYPES:
        guards.fail("dtype", f"topk_ids has dtype {topk_ids.dtype}; expected an integer dtype "
                             f"({', '.join(map(str, INT_DTYPES))})")
    if topk_ids.dim() != 2:
        guards.fail("shape", f"topk_ids must be 2-D [T, topk]; got shape {list(topk_ids.shape)}")
    T, topk = topk_ids.shape
    default_pad = pad_value is None  # (topk << 24) | T: one past the last token and slot
    if T - 1 + default_pad > TOKEN_MASK or topk - 1 + default_pad > MAX_SLOT:
        guards.fail("shape", f"topk_ids has shape [{T}, {topk}]: a sorted id packs (slot << 24) | token into int32, "
                             f"so tokens must be <= {TOKEN_MASK} and slots <= {MAX_SLOT}, the default padding's "
                             "token T and slot topk included")
    if topk > num_experts:
        guards.fail("topk", f"topk = {topk} (topk_ids shape [{T}, {topk}]) > num_experts = {num_experts}: a token "
                            "routes to topk distinct experts, and the buffers are sized for that")
    if not topk_weights.is_floating_point():
        guards.fail("dtype", f"topk_weights has dtype {topk_weights.dtype}; expected a floating dtype")
    guards.check_shape(topk_weights, "topk_weights", (T, topk))
    guards.check_same_device(topk_ids=topk_ids, topk_weights=topk_weights)
    if expert_mask is not None:
        guards.check_shape(expert_mask, "expert_mask", (num_experts,))
    bad = ((topk_ids < 0) | (topk_ids >= num_experts)).nonzero()
    if len(bad):
        t, k = bad[0].tolist()
        guards.fail("expert-id", f"topk_ids[{t}, {k}] = {int(topk_ids[t, k])}; expected an expert id "
                                 f"0 <= id < num_experts = {num_experts}")


def moe_sorting(topk_ids: torch.Tensor, topk_weights: torch.Tensor, num_experts: int,
                block_m: int = 32, pad_value: Optional[int] = None,
                expert_mask: Optional[torch.Tensor] = None, num_valid_len: int = 1) -> MoeSorting:
    """Group the (token, slot) pairs by expert, padding each expert to a multiple of block_m.

    topk_ids [T, topk] int (expert of each slot), topk_weights [T, topk] float.
    Each entry of sorted_token_ids encodes one (token t, slot s) pair as (s << 24) | t.
    Experts appear in increasing id; within an expert pairs keep row-major (t, s) order.
    Every expert's run is padded up to a multiple of block_m with pad_value (default
    (topk << 24) | T, i.e. token id T = "no token") and weight 0; experts with no tokens
    get no blocks. sorted_expert_ids[b] is the expert of rows [b*block_m, (b+1)*block_m)
    (-1 past the end; with expert_mask, experts with mask 0 are dropped and the rest
    renumbered densely, as aiter does for local experts). The buffers have aiter's
    worst-case size T*topk + E*block_m - topk; only the first num_valid_ids[0] rows are
    meaningful. num_valid_ids = [total padded rows] (num_valid_len=1) or
    [total padded rows, T] (num_valid_len=2).

    Refused with mxgemm.guards.GuardError before any work: topk_ids not a 2-D integer tensor
    (float ids would be truncated), topk_weights not a floating tensor of its shape and device,
    num_experts or block_m not a positive int, expert_mask not 1-D of length num_experts,
    num_valid_len other than 1 or 2, pad_value outside int32, T or topk too large for the
    packed ids (token < 2^24, slot < 128, the default padding's included), topk > num_experts
    (aiter's buffer size assumes a token's topk experts are distinct), and any id outside
    [0, num_experts). aiter's current sorting kernels skip such ids (callers like vLLM mark
    padded rows -1 and other ranks' tokens num_experts; older kernels used them unchecked as
    counter indices); here a route dropped silently is indistinguishable from a bad id, so it
    is an error. To skip routes as aiter does, send them to an extra expert num_experts and pass
    num_experts + 1 with that expert masked out in expert_mask (the buffers grow by one block).
    """
    _check_sorting_args(topk_ids, topk_weights, num_experts, block_m, pad_value, expert_mask, num_valid_len)
    T, topk = topk_ids.shape
    pad = (topk << TOKEN_BITS) | T if pad_value is None else pad_value
    flat = topk_ids.reshape(-1).long()
    keep = torch.ones(num_experts, dtype=torch.bool) if expert_mask is None else expert_mask.bool().cpu()
    local_id = torch.cumsum(keep.long(), 0) - 1  # dense renumbering of kept experts
    sel = keep[flat].nonzero().squeeze(1)  # flat (t*topk + s) indices routed to kept experts
    experts = flat[sel]
    order = torch.sort(experts, stable=True).indices  # by expert, then row-major (t, s)
    sel, experts = sel[order], experts[order]

    counts = torch.bincount(experts, minlength=num_experts)
    blocks = (counts + block_m - 1) // block_m
    run_start = torch.cumsum(blocks * block_m, 0) - blocks * block_m  # padded run offsets
    first = torch.cumsum(counts, 0) - counts  # offsets in the unpadded (sorted) list
    pos = run_start[experts] + torch.arange(len(sel)) - first[experts]

    max_padded = T * topk + num_experts * block_m - topk
    sorted_ids = torch.full((max_padded,), pad, dtype=torch.int32)
    sorted_w = torch.zeros(max_padded, dtype=torch.float32)
    sorted_ids[pos] = encode_sorted_id(sel // topk, sel % topk)
    sorted_w[pos] = topk_weights.reshape(-1)[sel].float()
    sorted_exp = torch.full((-(-max_padded // block_m),), -1, dtype=torch.int32)
    total_blocks = int(blocks.sum())
    sorted_exp[:total_blocks] = torch.repeat_interleave(local_id, blocks).to(torch.int32)
    valid = [total_blocks * block_m, T][:num_valid_len]
    return MoeSorting(sorted_ids, sorted_w, sorted_exp, torch.tensor(valid, dtype=torch.int32))
