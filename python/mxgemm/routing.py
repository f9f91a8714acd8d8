"""MoE routing: the block-aligned, expert-sorted layout the MoE kernels consume (aiter moe_sorting)."""
from typing import NamedTuple, Optional

import torch

TOKEN_BITS = 24
TOKEN_MASK = (1 << TOKEN_BITS) - 1


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
    """
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
