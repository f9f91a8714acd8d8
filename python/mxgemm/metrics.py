"""Accuracy metrics and exact-comparison assertions used by every kernel test."""
import torch

_INT_OF_WIDTH = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    """DeepGEMM's similarity: 1 - 2*sum(x*y) / sum(x*x + y*y), in float64 (0 = identical)."""
    x, y = x.double(), y.double()
    denom = (x * x + y * y).sum()
    return float(1 - 2 * (x * y).sum() / denom) if denom > 0 else 0.0


def snr_db(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """10*log10(|expected|^2 / |actual - expected|^2) in float64; inf when equal."""
    a, e = actual.double(), expected.double()
    noise = ((a - e) ** 2).sum()
    return float("inf") if noise == 0 else float(10 * torch.log10((e * e).sum() / noise))


def max_abs_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return float((actual.double() - expected.double()).abs().max()) if actual.numel() else 0.0


def max_rel_err(actual: torch.Tensor, expected: torch.Tensor, eps: float = 1e-30) -> float:
    """max |a - e| / max(|e|, eps), elementwise."""
    a, e = actual.double(), expected.double()
    return float(((a - e).abs() / e.abs().clamp(min=eps)).max()) if a.numel() else 0.0


def bits(x: torch.Tensor) -> torch.Tensor:
    """Bit pattern of each element as a signed integer tensor of the same width."""
    if not x.is_floating_point():
        return x
    return x.contiguous().view(_INT_OF_WIDTH[x.element_size()])


def _hex(b: int, width: int) -> str:
    return f"0x{b & ((1 << (8 * width)) - 1):0{2 * width}x}"


def _report(name, actual, expected, bad, what, first):
    idx = bad.nonzero()
    w = actual.element_size()
    lines = [f"{name}: {len(idx)} of {bad.numel()} elements {what} (shape {tuple(actual.shape)})"]
    ab, eb = bits(actual), bits(expected)
    for i in idx[:first].tolist():
        i = tuple(i)
        lines.append(f"  at {i}: actual {actual[i].item()!r} ({_hex(ab[i].item(), w)})"
                     f"  expected {expected[i].item()!r} ({_hex(eb[i].item(), w)})")
    raise AssertionError("\n".join(lines))


def _check_same(actual, expected, name):
    assert actual.shape == expected.shape, f"{name}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    assert actual.dtype == expected.dtype, f"{name}: dtype {actual.dtype} != {expected.dtype}"


def assert_bitwise_equal(actual: torch.Tensor, expected: torch.Tensor, name: str = "tensor",
                         first: int = 8) -> None:
    """Exact bit-pattern equality (NaN == NaN only with identical bits; +0 != -0).

    On failure lists how many elements differ and the first `first` of them with
    index, both values and both bit patterns.
    """
    _check_same(actual, expected, name)
    bad = bits(actual) != bits(expected)
    if bad.any():
        _report(name, actual, expected, bad, "differ bitwise", first)


def assert_mostly_bitwise_equal(actual: torch.Tensor, expected: torch.Tensor, min_fraction: float,
                                name: str = "tensor", first: int = 8) -> None:
    """At least min_fraction of the elements have identical bits (NaN matches NaN): for results
    whose summation order legitimately differs from the reference in a few elements, while a
    rounding bug (e.g. truncation instead of RNE) changes a large share of them."""
    _check_same(actual, expected, name)
    bad = (bits(actual) != bits(expected)) & ~(torch.isnan(actual) & torch.isnan(expected))
    if actual.numel() and float(bad.double().mean()) > 1 - min_fraction:
        _report(name, actual, expected, bad, f"differ bitwise (at most {1 - min_fraction:.2%} may)", first)


def bf16_ulp_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Distance in bf16 units in the last place (+0 and -0 coincide); int64."""
    def ordered(x):
        v = bits(x.to(torch.bfloat16)).long() & 0xFFFF
        return torch.where(v >= 0x8000, 0x8000 - v, v)  # monotone map onto the integers
    return (ordered(a) - ordered(b)).abs()


def assert_close_ulp(actual: torch.Tensor, expected: torch.Tensor, max_ulp: int = 1,
                     name: str = "tensor", first: int = 8) -> None:
    """bf16 tensors agree within max_ulp bf16 ulps; NaN must match NaN."""
    _check_same(actual, expected, name)
    assert actual.dtype == torch.bfloat16, f"{name}: expected bf16 tensors, got {actual.dtype}"
    na, ne = torch.isnan(actual), torch.isnan(expected)
    bad = (na != ne) | (~na & ~ne & (bf16_ulp_distance(actual, expected) > max_ulp))
    if bad.any():
        _report(name, actual, expected, bad, f"differ by more than {max_ulp} bf16 ulp", first)
