"""The op → Triton expression table, and the helper functions generated kernels use.

Values inside kernels are held in their compute type: float16/bfloat16 in float32,
everything else as is.  NaN behaves as in eager: max/min/clamp propagate it.
"""
from __future__ import annotations

import math

import torch

from ..ir.nodes import FLOAT8_DTYPES, compute_dtype  # (the emitters import it from here too)
from . import special_bessel

TL_DTYPE = {
    torch.float16: "tl.float16", torch.bfloat16: "tl.bfloat16", torch.float32: "tl.float32",
    torch.float64: "tl.float64", torch.int8: "tl.int8", torch.int16: "tl.int16", torch.int32: "tl.int32",
    torch.int64: "tl.int64", torch.uint8: "tl.uint8", torch.bool: "tl.int1",
    # unsigned types wider than a byte only as the result of a bit-cast (lower/rules_bits.py)
    torch.uint16: "tl.uint16", torch.uint32: "tl.uint32", torch.uint64: "tl.uint64",
    # float8 pointers; their values are held as bits (uint8: `ir.nodes.compute_dtype`)
    torch.float8_e4m3fn: "tl.float8e4nv", torch.float8_e5m2: "tl.float8e5",
}
FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
# the same types as Triton's signature strings (ahead-of-time and pooled compilation)
SIG_DTYPE = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.float64: "fp64",
             torch.int8: "i8", torch.int16: "i16", torch.int32: "i32", torch.int64: "i64", torch.uint8: "u8",
             torch.uint16: "u16", torch.uint32: "u32", torch.uint64: "u64", torch.bool: "i1",
             torch.float8_e4m3fn: "fp8e4nv", torch.float8_e5m2: "fp8e5"}
assert set(SIG_DTYPE) == set(TL_DTYPE), "every kernel dtype needs a signature string"
# smallest magnitude from which every value of the compute type is an integer (round is identity)
ROUND_EXACT = {torch.float32: "8388608.0", torch.float64: "4503599627370496.0",
               torch.float16: "8388608.0", torch.bfloat16: "8388608.0"}


def literal(value: bool | int | float, dtype: torch.dtype) -> str:
    if dtype == torch.bool:
        return "True" if value else "False"
    if dtype in FLOATS:
        v = float(value)
        if math.isnan(v):
            return 'float("nan")'
        if math.isinf(v):
            return 'float("inf")' if v > 0 else 'float("-inf")'
        return repr(v)
    if dtype in TL_DTYPE:
        # eager wraps a Python integer into a narrow type (uint8 - 1 is 255, + 300 adds 44);
        # Triton refuses an out-of-range literal
        info = torch.iinfo(dtype)
        v = int(value) & ((1 << info.bits) - 1)
        return str(v - (1 << info.bits) if v > info.max else v)
    return str(int(value))


PRELUDE = '''
import triton
import triton.language as tl
from triton.language.extra import libdevice

from stitchml.codegen.triton_fast import _exp_ftz, _gdc_launch_dependents, _gdc_wait

# kernels that must differ between the interpreter and compiled code branch on this
# constant: a conversion the interpreter does not round, and `%` on floats (numpy's exact
# fmod in the interpreter; compiled, a - b * trunc(a / b), wrong once the quotient passes
# 2**24 in float32 (sm_90 PTX), so GPUs call libdevice's fmod)
_INTERPRETED = tl.constexpr(bool(triton.knobs.runtime.interpret))


@triton.jit
def _nanmax(a, b):
    # NaN-propagating maximum (eager's `maximum`, `amax`, the max of a softmax).  As
    # tl.maximum with propagate_nan it is one sm_80+ instruction an element (FMNMX.NAN)
    # where the select it replaced, where((a > b) | (a != a), a, b), was three (two
    # compares and a select); a bf16 softmax row's max was ~1/7 of its SASS.  The
    # sign of a zero result differs: IEEE maximum orders -0 below +0, the select
    # returned the second of two zeros, eager's the first (values compare equal).
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _nanmin(a, b):
    return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _mul_recip(x, s):
    # x / s for a divisor that is NaN or at least 1 (a softmax's sum: `emit_core.
    # _softmax_division`), s a row value: compiled, one reciprocal a row and a multiply
    # an element (div.full.f32 range-scales numerator and divisor: four sm_90
    # instructions an element).  The interpreter divides, as the kernels did before:
    # numpy warns on a padded row's 1 / 0 (its sum is 0), and callers may run with
    # warnings as errors.
    if _INTERPRETED:
        return x / s
    else:
        return x * (1.0 / s)


@triton.jit
def _philox_word(seed, offset):
    # the random word of element `offset`: word (offset & 3) of the Philox block at
    # (offset >> 2).  One Philox call (10 rounds, ~50 sm_90 instructions) yields four
    # words; tl.rand / tl.randn called per element ran one call an element and kept
    # one word.  Elements that share a block and sit in one thread's registers share
    # the call once the compiler sees their block index is equal: a bf16 dropout +
    # layer norm row kernel went 1343 -> 1048 SASS instructions (Triton 3.6, sm_90).
    # A pure function of the element's index, so every kernel that computes the same
    # random node (a recomputed dropout mask) gets the same values.
    a, b, c, d = tl.randint4x(seed, offset >> 2)
    k = offset & 3
    return tl.where(k == 0, a, tl.where(k == 1, b, tl.where(k == 2, c, d)))


@triton.jit
def _rand4(seed, offset):
    # uniform in [0, 1) (tl.rand's conversion of a word)
    return tl.random.uint_to_uniform_float(_philox_word(seed, offset))


@triton.jit
def _randn4(seed, offset):
    # standard normal: Box-Muller on the words of elements (2i, 2i+1), as tl.randn4x
    # pairs a block's words, so element 2i takes the pair's first normal, 2i+1 the second
    a, b, c, d = tl.randint4x(seed, offset >> 2)
    k = offset & 3
    u1 = tl.random.uint_to_uniform_float(tl.where(k < 2, a, c))
    u2 = tl.random.uint_to_uniform_float(tl.where(k < 2, b, d))
    n1, n2 = tl.random.pair_uniform_to_normal(u1, u2)
    return tl.where((k & 1) == 0, n1, n2)


@triton.jit
def _add(a, b):
    return a + b


@triton.jit
def _mul(a, b):
    return a * b


@triton.jit
def _xor(a, b):
    return a ^ b


@triton.jit
def _add2(a0, a1, b0, b1):
    return a0 + b0, a1 + b1


@triton.jit
def _add3(a0, a1, a2, b0, b1, b2):
    return a0 + b0, a1 + b1, a2 + b2


@triton.jit
def _cummax(v1, i1, v2, i2):
    # cummax's combine of (value, index) pairs, the second one later: it wins when its
    # value is NaN, or when it is >= a non-NaN first (ties: the later index, as eager)
    take = (v2 != v2) | ((v1 == v1) & (v2 >= v1))
    return tl.where(take, v2, v1), tl.where(take, i2, i1)


@triton.jit
def _cummin(v1, i1, v2, i2):
    take = (v2 != v2) | ((v1 == v1) & (v2 <= v1))
    return tl.where(take, v2, v1), tl.where(take, i2, i1)


@triton.jit
def _order_key(x, IS_FLOAT: tl.constexpr, FLIP: tl.constexpr):
    # scatter amax/amin: a value of at most 32 bits -> an int64 key >= 1 that orders as the
    # value does (reversed for FLIP: a min as a max), so an int64 atomic max into a zeroed
    # buffer finds the extreme and 0 means "nothing arrived".  Floats order by their bits
    # (negatives with the magnitude bits flipped); NaN takes the top key: it always wins
    if IS_FLOAT:
        bits = x.to(tl.float32).to(tl.int32, bitcast=True)
        k = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    else:
        k = x.to(tl.int32)
    if FLIP:
        k = ~k
    if IS_FLOAT:
        k = tl.where(x != x, 2147483647, k)
    return k.to(tl.int64) + 2147483649


@triton.jit
def _from_order_key(key, IS_FLOAT: tl.constexpr, FLIP: tl.constexpr):
    # the value of a key of `_order_key` (float32 or int32; a key of 0 decodes to garbage:
    # callers select it away)
    # (one return: compiled Triton rejects returns of different types, even in branches
    # that a constexpr removes)
    k = (key - 2147483649).to(tl.int32)
    nan = k == 2147483647
    if FLIP:
        k = ~k
    if IS_FLOAT:
        bits = tl.where(k < 0, k ^ 0x7FFFFFFF, k)
        k = tl.where(nan, float("nan"), bits.to(tl.float32, bitcast=True))
    return k


@triton.jit
def _order_key64(x, IS_FLOAT: tl.constexpr, FLIP: tl.constexpr):
    # 64-bit scatter amax/amin: a signed int64 key that orders as the value does (float64:
    # negatives with the magnitude bits flipped, NaN on top; a min as the max of ~key).
    # Every int64 is a key, so "nothing arrived" is told apart by the caller
    if IS_FLOAT:
        bits = x.to(tl.int64, bitcast=True)
        k = tl.where(bits < 0, bits ^ 0x7FFFFFFFFFFFFFFF, bits)
    else:
        k = x.to(tl.int64)
    if FLIP:
        k = ~k
    if IS_FLOAT:  # (after the flip: NaN wins a min too)
        k = tl.where(x != x, 0x7FFFFFFFFFFFFFFF, k)
    return k


@triton.jit
def _from_order_key64(key, IS_FLOAT: tl.constexpr, FLIP: tl.constexpr):
    nan = key == 0x7FFFFFFFFFFFFFFF
    k = key
    if FLIP:
        k = ~k
    if IS_FLOAT:
        bits = tl.where(k < 0, k ^ 0x7FFFFFFFFFFFFFFF, k)
        k = tl.where(nan, float("nan"), bits.to(tl.float64, bitcast=True))
    return k


@triton.jit
def _atomic_mul(base, off, v, m, IS_FLOAT: tl.constexpr, WIDE: tl.constexpr):
    # scatter_reduce 'prod': base[off] *= v per lane where m, by a compare-and-swap loop
    # (there is no atomic multiply).  Every lane takes part in every round: a lane that is
    # done, or masked, swaps a value with itself (a no-op) at a valid address (base + 0).
    # Floats are swapped as their bit patterns (NaN and -0.0 compare as bits).
    p = base + tl.where(m, off, 0)
    cur = tl.load(p, mask=m, other=1)
    todo = m
    if IS_FLOAT:
        bits_ty = tl.int64 if WIDE else tl.int32
        ip = p.to(tl.pointer_type(bits_ty))
        while tl.sum(todo.to(tl.int32)) > 0:
            cb = cur.to(bits_ty, bitcast=True)
            new = tl.where(todo, (cur * v).to(bits_ty, bitcast=True), cb)
            old = tl.atomic_cas(ip, cb, new, sem="relaxed")
            todo = todo & (old != cb)
            cur = old.to(cur.dtype, bitcast=True)
    else:
        while tl.sum(todo.to(tl.int32)) > 0:
            new = tl.where(todo, cur * v, cur)
            old = tl.atomic_cas(p, cur, new, sem="relaxed")
            todo = todo & (old != cur)
            cur = old


@triton.jit
def _logaddexp(a, b):
    # log(e^a + e^b) = max + log1p(e^(min - max)): the combine of logcumsumexp.  -inf
    # with -inf stays -inf and +inf wins (min - max would be NaN there); NaN propagates
    mx = tl.where(a > b, a, b)
    mn = tl.where(a > b, b, a)
    r = mx + _log1p(tl.exp(mn - mx))
    r = tl.where((mn == float("-inf")) | (mx == float("inf")), mx, r)
    return tl.where((a != a) | (b != b), a + b, r)


@triton.jit
def _expm1(x):
    # compiled: libdevice's (accurate to ~1 ulp, a third of the instructions of the
    # formula below, which divides); the interpreter has no libdevice: the formula
    if _INTERPRETED:
        return _expm1_kahan(x)
    else:
        return libdevice.expm1(x)


@triton.jit
def _expm1_kahan(x):
    # Kahan: (u - 1) * x / log(u) keeps full relative precision near 0; away from 0
    # u - 1 is exact enough, and (u - 1) * x would overflow for x near log(FLT_MAX)
    u = tl.exp(x)
    um1 = u - 1.0
    # (the lanes the selects below discard divide by 1, not 0/0 or inf/inf: the
    # interpreter evaluates both sides of a select and numpy warned on every such lane)
    lg = tl.where((um1 == 0.0) | (u == 0.0) | (u == float("inf")), 1.0, tl.log(u))
    r = tl.where(um1 == 0.0, x, um1 * x / lg)
    r = tl.where(tl.abs(x) > 0.5, um1, r)
    r = tl.where(um1 == -1.0, -1.0, r)
    return tl.where(u == float("inf"), u, r)


@triton.jit
def _log1p(x):
    if _INTERPRETED:   # (see _expm1)
        return _log1p_kahan(x)
    else:
        return libdevice.log1p(x)


@triton.jit
def _log1p_kahan(x):
    u = 1.0 + x
    d = u - 1.0
    # (discarded lanes divide by 1: see _expm1_kahan)
    r = tl.where(d == 0.0, x, tl.log(u) * (x / tl.where((d == 0.0) | (u == float("inf")), 1.0, d)))
    return tl.where(u == float("inf"), u, r)


@triton.jit
def _tanh(x):
    # compiled: libdevice's tanh (2 ulp in float32). The formula below took ~58 PTX
    # instructions an element (two IEEE divisions): GPT-2's tanh-GELU over 12.6 M
    # bfloat16 values ran 36 us on an H200, compute-bound, for 12 us of memory traffic
    if _INTERPRETED:
        return _tanh_expm1(x)
    else:
        return libdevice.tanh(x)


@triton.jit
def _tanh_expm1(x):
    # near 0, -e / (2 + e) keeps relative precision; where tanh saturates, 1 - 2 / (exp(2|x|) + 1)
    # rounds once at the end (<= 1 ulp against 2.5 for the quotient): tanh's gradient 1 - y*y is
    # read from those last bits and was off by 3x at |x| ~ 8 (fuzz seed 21102)
    a = tl.abs(x)
    e = _expm1_kahan(-2.0 * a)
    t = tl.where(a > 0.55, 1.0 - 2.0 / (tl.exp(2.0 * a) + 1.0), -e / (2.0 + e))
    return tl.where(x < 0, -t, t)


@triton.jit
def _round(x, big):
    # half to even, like torch.round; |x| >= big (2**23 in float32, 2**52 in float64)
    # is already an integer
    f = tl.floor(x)
    d = x - f
    r = tl.where(d > 0.5, f + 1.0, f)
    odd = (f - 2.0 * tl.floor(f * 0.5)) == 1.0
    r = tl.where((d == 0.5) & odd, f + 1.0, r)
    return tl.where(tl.abs(x) >= big, x, r)


@triton.jit
def _floordiv(a, b):
    # eager's floor division of floats: divide the exact remainder out first, so a
    # quotient that rounds up to an integer (1 / 0.1 -> 10.0) still floors to 9
    mod = _fmod(a, b)  # exact, sign of a
    div = (a - mod) / b
    div = tl.where((mod != 0) & ((b < 0) != (mod < 0)), div - 1.0, div)
    fl = tl.floor(div)
    fl = tl.where(div - fl > 0.5, fl + 1.0, fl)
    q = a / b
    r = tl.where(div != 0, fl, tl.where(q < 0, -0.0, 0.0))
    return tl.where(b == 0, q, r)


@triton.jit
def _round_bf16(x):
    # float32 -> nearest-even bfloat16 value, kept in float32.  Compiled, the conversion
    # rounds to nearest even itself (cvt.rn); the interpreter's truncates, so there it is
    # done with integer ops (on a GPU those cost ~6 integer ops per element, a real share
    # of a bandwidth-bound bf16 kernel's issue slots)
    if _INTERPRETED:
        bits = x.to(tl.int32, bitcast=True)
        bits = (bits + 32767 + ((bits >> 16) & 1)) & -65536
        return tl.where(x != x, x, bits.to(tl.float32, bitcast=True))
    else:
        return x.to(tl.bfloat16).to(tl.float32)


@triton.jit
def _to_bf16(x):
    # float32 -> bfloat16 for a store, rounded to nearest even on GPUs and in the interpreter
    if _INTERPRETED:
        # (by its bits: the interpreter's float32 -> bfloat16 conversion also loses subnormals)
        bits = x.to(tl.int32, bitcast=True)
        r = (bits + 32767 + ((bits >> 16) & 1)) >> 16
        r = tl.where(x != x, (bits >> 16) | 64, r)  # a NaN stays a (quiet) NaN
        return r.to(tl.int16).to(tl.bfloat16, bitcast=True)
    else:
        return x.to(tl.bfloat16)


@triton.jit
def _from_bf16(x):
    # a loaded bfloat16 value in float32: compiled, the conversion is exact; the
    # interpreter's (Triton 3.9) loses subnormals (1e-39 became 4.4e-39), so there the
    # bits are moved into the top half of a float32 word
    if _INTERPRETED:
        return (x.to(tl.int16, bitcast=True).to(tl.int32) << 16).to(tl.float32, bitcast=True)
    else:
        return x.to(tl.float32)


@triton.jit
def _small_f8(a, least_normal, scale):
    # |x| (bits `a`, below the float8 type's least normal) in units of the type's least
    # subnormal (`scale`: 2^9, 2^16), rounded to nearest even: the result's bits (a carry
    # is the least normal's pattern).  The product is exact, and adding 2^23 rounds it to
    # an integer in float32.  (Eager adds 2^14 to |x| instead; compiled, that add could
    # be fused with a product that made x, one rounding where eager has two; fusing the
    # exact product with the add changes nothing).  Larger values (and NaNs) are clamped to
    # the least normal: no overflow, no invalid operation (the interpreter's numpy warns)
    v = tl.minimum(a, least_normal).to(tl.float32, bitcast=True) * scale + 8388608.0
    return v.to(tl.int32, bitcast=True) - 0x4B000000


@triton.jit
def _to_e4m3fn(x):
    # float32 -> float8_e4m3fn bits (uint8) as eager converts (torch 2.13, c10's
    # fp8e4m3fn_from_fp32_value): nearest even, finite overflow and infinities saturate to
    # +-448 (0x7E), NaN stays NaN (0x7F).  Our own arithmetic, so that compiled kernels and
    # the interpreter agree with eager bit for bit (the interpreter's conversion has no
    # overflow rule).  ~18 integer ops an element (sm_90 SASS)
    bits = x.to(tl.int32, bitcast=True)
    a = bits & 0x7FFFFFFF
    # (normal results: the exponent rebiased, the mantissa rounded to 3 bits, half to even;
    # 448 and beyond, infinity included, land on 0x7E or above)
    normal = tl.minimum((a + (0x7FFFF - (120 << 23)) + ((a >> 20) & 1)) >> 20, 0x7E)
    r = tl.where(a < (121 << 23), _small_f8(a, 121 << 23, 512.0), normal)
    r = tl.where(a > 0x7F800000, 0x7F, r)
    return (r | ((bits >> 24) & 0x80)).to(tl.uint8)


@triton.jit
def _to_e5m2(x):
    # float32 -> float8_e5m2 bits as eager converts (c10's fp8e5m2_from_fp32_value): nearest
    # even, overflow to infinity (0x7C; a GPU's cvt.rn.satfinite would saturate at 57344)
    bits = x.to(tl.int32, bitcast=True)
    a = bits & 0x7FFFFFFF
    normal = tl.minimum((a + (0xFFFFF - (112 << 23)) + ((a >> 21) & 1)) >> 21, 0x7C)
    r = tl.where(a < (113 << 23), _small_f8(a, 113 << 23, 65536.0), normal)
    r = tl.where(a > 0x7F800000, 0x7F, r)
    return (r | ((bits >> 24) & 0x80)).to(tl.uint8)


@triton.jit
def _from_e4m3fn(b):
    # float8_e4m3fn bits -> float32, exact: a normal value's exponent and mantissa move into
    # a float32 word, a subnormal is m * 2^-9, S.1111.111 is NaN (there is no infinity)
    v = b.to(tl.int32)
    e = (v >> 3) & 15
    m = v & 7
    normal = (((e + 120) << 23) | (m << 20)).to(tl.float32, bitcast=True)
    mag = tl.where(e == 0, m.to(tl.float32) * 0.001953125, normal)
    mag = tl.where((v & 0x7F) == 0x7F, float("nan"), mag)
    return tl.where((v & 0x80) != 0, -mag, mag)


@triton.jit
def _from_e5m2(b):
    # float8_e5m2 bits -> float32, exact: they are a float16's top byte.  Patterns
    # S.11111.0x are signalling NaNs: made quiet, sign kept (numpy, the interpreter, warns
    # on them)
    h = b.to(tl.uint16) << 8
    h = tl.where(((h & 0x7C00) == 0x7C00) & ((h & 0x3FF) != 0), h | 0x200, h)
    return h.to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _fmod(a, b):
    # C fmod of floats: exact, the sign of the dividend
    if _INTERPRETED:
        return a % b
    else:
        return libdevice.fmod(a, b)


@triton.jit
def _sqrt(x):
    # IEEE-rounded in float32 (sqrt_rn) and float64 (where sqrt_rn is refused, tl.sqrt is IEEE)
    if x.dtype == tl.float64:
        return tl.sqrt(x)
    else:
        return tl.sqrt_rn(x)


@triton.jit
def _atan_unit(q):
    # atan on [0, 1]: beyond tan(pi/8), pi/4 + atan((q - 1) / (q + 1)); then t + t^3 P(t^2) on
    # |t| <= tan(pi/8), P fitted by weighted least squares (relative error before rounding:
    # 2e-8 in float32, 1e-18 in float64)
    big = q > 0.41421356237309503
    t = tl.where(big, (q - 1.0) / (q + 1.0), q)
    s = t * t
    # (Horner starts from s: a float literal assigned to a local becomes a float32 constant)
    if q.dtype == tl.float64:
        p = s * -0.017922196523442038 + 0.038078242192759126
        p = p * s - 0.05039842273011651
        p = p * s + 0.05848008163325048
        p = p * s - 0.06663120275087428
        p = p * s + 0.07692061627000189
        p = p * s - 0.09090897835843807
        p = p * s + 0.11111110786115225
        p = p * s - 0.14285714280248016
        p = p * s + 0.19999999999954077
        p = p * s - 0.333333333333332
    else:
        p = s * 0.04638938190946034 - 0.08420205568319714
        p = p * s + 0.11033398843972068
        p = p * s - 0.1428095139981978
        p = p * s + 0.1999985914379384
        p = p * s - 0.33333331839137686
    r = t + t * s * p
    return tl.where(big, r + 0.7853981633974483, r)


@triton.jit
def _atan2(y, x):
    # the octant of (x, y) by symmetries, then atan of the smaller magnitude over the larger;
    # signed zeros and infinities as C's atan2
    ax = tl.abs(x)
    ay = tl.abs(y)
    hi = tl.where(ax > ay, ax, ay)
    lo = tl.where(ax > ay, ay, ax)
    q = tl.where(hi == 0.0, 0.0, tl.where(lo == hi, 1.0, lo / hi))
    r = _atan_unit(q)
    r = tl.where(ay > ax, 1.5707963267948966 - r, r)
    xneg = (x < 0) | ((x == 0) & ((1.0 / x) < 0))
    r = tl.where(xneg, 3.141592653589793 - r, r)
    yneg = (y < 0) | ((y == 0) & ((1.0 / y) < 0))
    r = tl.where(yneg, -r, r)
    return tl.where((x != x) | (y != y), x + y, r)


@triton.jit
def _atan(x):
    a = tl.abs(x)
    inv = a > 1.0
    r = _atan_unit(tl.where(inv, 1.0 / a, a))
    r = tl.where(inv, 1.5707963267948966 - r, r)
    r = tl.where(x < 0, -r, r)
    return tl.where(x == 0, x, r)  # -0.0 stays -0.0


@triton.jit
def _asin(x):
    # (1 - x)(1 + x), not 1 - x*x: exact factors near |x| = 1; |x| > 1 gives sqrt(< 0) = nan
    return _atan2(x, _sqrt((1.0 - x) * (1.0 + x)))


@triton.jit
def _acos(x):
    return _atan2(_sqrt((1.0 - x) * (1.0 + x)), x)


@triton.jit
def _asinh(x):
    # log1p(a + a^2 / (1 + sqrt(1 + a^2))) keeps the relative precision near 0; above 2**28
    # asinh(a) is log(2a) to the last bit (and a^2 would overflow float32 from 2**64)
    a = tl.abs(x)
    a2 = a * a
    r = _log1p(a + a2 / (1.0 + _sqrt(1.0 + a2)))
    r = tl.where(a > 268435456.0, tl.log(a) + 0.6931471805599453, r)
    r = tl.where(x < 0, -r, r)
    return tl.where(x == 0, x, r)


@triton.jit
def _acosh(x):
    # log1p(t + sqrt(t (t + 2))) with t = x - 1 (exact near 1); log(2x) above 2**28; nan
    # below 1 (t (t + 2) is positive again below -1)
    t = x - 1.0
    r = _log1p(t + _sqrt(t * (t + 2.0)))
    r = tl.where(x > 268435456.0, tl.log(x) + 0.6931471805599453, r)
    return tl.where(x < 1.0, float("nan"), r)


@triton.jit
def _atanh(x):
    # log1p(2a / (1 - a)) / 2: +-inf at +-1, nan beyond
    a = tl.abs(x)
    r = 0.5 * _log1p(2.0 * a / (1.0 - a))
    r = tl.where(x < 0, -r, r)
    return tl.where(x == 0, x, r)


@triton.jit
def _sinh(x):
    # u = expm1(|x|): (u + u / (u + 1)) / 2 has no cancellation near 0; beyond 20 (where e^-|x|
    # is below the last bit) exp(|x| / 2)^2 / 2, finite up to the largest finite sinh
    a = tl.abs(x)
    big = a > 20.0
    u = _expm1(tl.where(big, 0.0, a))
    h = tl.exp(0.5 * a)
    r = tl.where(big, (0.5 * h) * h, 0.5 * (u + u / (u + 1.0)))
    r = tl.where(x < 0, -r, r)
    return tl.where(x == 0, x, r)


@triton.jit
def _cosh(x):
    a = tl.abs(x)
    big = a > 20.0
    e = tl.exp(tl.where(big, 0.5 * a, a))
    return tl.where(big, (0.5 * e) * e, 0.5 * (e + 1.0 / e))


@triton.jit
def _pow(a, b):
    # C pow: odd integer powers keep the base's sign (-0.0 included), finite negative
    # bases to non-integer powers are nan, (-1) ** +-inf == 1, x ** 0 == 1 ** y == 1
    r = tl.exp2(b * tl.log2(tl.abs(a)))
    bint = tl.floor(b) == b
    odd = bint & ((b - 2.0 * tl.floor(b * 0.5)) == 1.0)
    neg = (a < 0) | ((a == 0) & ((1.0 / a) < 0))
    r = tl.where(neg & odd, -r, r)
    r = tl.where((a < 0) & (a > float("-inf")) & (bint == 0), float("nan"), r)
    r = tl.where((a == -1.0) & (tl.abs(b) == float("inf")), 1.0, r)
    r = tl.where((b == 0) | (a == 1.0), 1.0, r)
    return r

@triton.jit
def _lgamma_pos(x):
    # x >= 0.5: Stirling's series at y >= 8 (below 8: at y = x + 8, shifted back by
    # log(x (x+1) ... (x+7)); not above, where that product would overflow)
    small = x < 8.0
    xs = tl.where(small, x, 1.0)
    p = xs * (xs + 1.0) * (xs + 2.0) * (xs + 3.0) * (xs + 4.0) * (xs + 5.0) * (xs + 6.0) * (xs + 7.0)
    y = tl.where(small, x + 8.0, x)
    r = 1.0 / (y * y)
    if x.dtype == tl.float64:  # four more terms: truncation 1e-16 at y = 8 (the first four leave 6e-12)
        s = ((((((((-2.955065359477124e-02 * r + 6.4102564102564100e-03) * r - 1.9175269175269176e-03) * r
                  + 8.4175084175084175e-04) * r - 5.952380952380952e-04) * r + 7.936507936507937e-04) * r
               - 2.777777777777778e-03) * r + 8.333333333333333e-02) / y)
    else:
        s = (((-5.952380952380952e-04 * r + 7.936507936507937e-04) * r - 2.777777777777778e-03) * r
             + 8.333333333333333e-02) / y
    return (y - 0.5) * tl.log(y) - y + 0.9189385332046727 + s - tl.where(small, tl.log(tl.abs(p)), 0.0)


@triton.jit
def _lgamma(x):
    # reflection below 0.5: lgamma(x) = log(pi / |sin(pi x)|) - lgamma(1 - x), the sine
    # taken of x reduced modulo 2 (exact), so large negative x keep their accuracy
    xr = x - 2.0 * tl.floor(x * 0.5)
    refl = 1.1447298858494002 - tl.log(tl.abs(tl.sin(3.141592653589793 * xr))) - _lgamma_pos(1.0 - x)
    r = tl.where(x < 0.5, refl, _lgamma_pos(tl.where(x < 0.5, 1.0, x)))
    r = tl.where((x <= 0) & (x == tl.floor(x)), float("inf"), r)
    return tl.where(tl.abs(x) == float("inf"), float("inf"), r)


@triton.jit
def _digamma_pos(x):
    # x >= 0.5: digamma(x + 8) by its asymptotic series, minus 1/x + ... + 1/(x+7)
    s = (1.0 / x + 1.0 / (x + 1.0) + 1.0 / (x + 2.0) + 1.0 / (x + 3.0) + 1.0 / (x + 4.0) + 1.0 / (x + 5.0)
         + 1.0 / (x + 6.0) + 1.0 / (x + 7.0))
    y = x + 8.0
    r = 1.0 / (y * y)
    if x.dtype == tl.float64:  # three more terms: truncation 6e-17 at y = 8.5 (the first five leave 1.5e-13)
        t = r * (8.333333333333333e-02 - r * (8.333333333333333e-03 - r * (3.968253968253968e-03
                 - r * (4.166666666666667e-03 - r * (7.575757575757576e-03 - r * (2.1092796092796094e-02
                 - r * (8.333333333333333e-02 - r * 4.432598039215686e-01)))))))
    else:
        t = r * (8.333333333333333e-02 - r * (8.333333333333333e-03 - r * (3.968253968253968e-03
                 - r * (4.166666666666667e-03 - r * 7.575757575757576e-03))))
    return tl.log(y) - 0.5 / y - t - s


@triton.jit
def _digamma(x):
    # reflection below 0.5: digamma(x) = digamma(1 - x) - pi / tan(pi x) (tan has period 1:
    # x reduced exactly first); eager's values at the poles: -inf at +0, +inf at -0, nan
    # at negative integers
    a = 3.141592653589793 * (x - tl.floor(x))
    refl = _digamma_pos(1.0 - x) - 3.141592653589793 * tl.cos(a) / tl.sin(a)
    r = tl.where(x < 0.5, refl, _digamma_pos(tl.where(x < 0.5, 1.0, x)))
    r = tl.where((x < 0) & (x == tl.floor(x)), float("nan"), r)
    r = tl.where(x == 0, tl.where((1.0 / x) < 0, float("inf"), float("-inf")), r)
    r = tl.where(x == float("inf"), x, r)
    return tl.where(x == float("-inf"), float("nan"), r)


@triton.jit
def _ipow(a, b, BITS: tl.constexpr, SIGNED: tl.constexpr):
    # integer a ** b as eager computes it: square-and-multiply over the exponent's BITS low
    # bits, wrapping as integer products do; a ** 0 is 1 (0 ** 0 too); a signed exponent
    # below 0 gives 1 for a == 1, -1 or 1 for a == -1 by its parity, 0 for any other base
    r = a * 0 + 1
    base = a
    e = b
    for _ in range(BITS):   # (a loop, not unrolled: 64 unrolled steps took sm_90 to 255 registers)
        r = tl.where((e & 1) != 0, r * base, r)
        base = base * base
        e = e >> 1
    if SIGNED:
        odd = (b & 1) != 0
        neg = tl.where(a == 1, 1, tl.where(a == -1, tl.where(odd, -1, 1), 0))
        r = tl.where(b < 0, neg.to(r.dtype), r)
    return r


@triton.jit
def _gcd(a, b):
    # Euclid's algorithm as eager runs it (on |a| and |b|, C's remainder: |minimum| wraps to
    # the minimum as in C), until every lane of the block is done: as many steps as the
    # block's slowest pair (at most 92 for int64, consecutive Fibonacci numbers; about 10
    # for values below 100), not the type's worst case; a finished lane keeps its value
    a = tl.abs(a)
    b = tl.abs(b)
    live = a != 0
    while tl.max(live.to(tl.int32)) > 0:
        c = a
        a = tl.where(live, b % tl.where(live, a, 1), a)
        b = tl.where(live, c, b)
        live = a != 0
    return b


@triton.jit
def _nextafter(a, b, STEP: tl.constexpr, F16: tl.constexpr):
    # one step of the bit pattern away from or towards zero (adding to the raw bits moves
    # the magnitude up for either sign); from zero the smallest subnormal with b's sign.
    # STEP is 1, or 2**16 for bfloat16 values held in float32; F16: float16 values held
    # in float32, stepped on their own 16-bit pattern.  Half operands are rounded to their
    # type first: held in float32 they may carry more precision than eager's stored values
    # (a / 3 == b in float16 is not equal in float32, and 1e-8 is float16's zero)
    if F16:
        a = a.to(tl.float16).to(tl.float32)
        b = b.to(tl.float16).to(tl.float32)
        bits = a.to(tl.float16).to(tl.int16, bitcast=True)
        one = (bits * 0 + 1).to(tl.int16)
        tiny = one.to(tl.float16, bitcast=True).to(tl.float32)
        up = (a > 0) == (b > a)
        r = (bits + tl.where(up, one, -one)).to(tl.float16, bitcast=True).to(tl.float32)
    elif a.dtype == tl.float64:
        bits = a.to(tl.int64, bitcast=True)
        one = bits * 0 + STEP
        tiny = one.to(tl.float64, bitcast=True)
        up = (a > 0) == (b > a)
        r = (bits + tl.where(up, one, -one)).to(tl.float64, bitcast=True)
    else:
        if STEP != 1:
            a = _round_bf16(a)
            b = _round_bf16(b)
        bits = a.to(tl.int32, bitcast=True)
        one = bits * 0 + STEP
        tiny = one.to(tl.float32, bitcast=True)
        up = (a > 0) == (b > a)
        r = (bits + tl.where(up, one, -one)).to(tl.float32, bitcast=True)
    r = tl.where(a == 0, tl.where(b > 0, tiny, -tiny), r)
    r = tl.where(a == b, b, r)
    return tl.where((a != a) | (b != b), a + b, r)


@triton.jit
def _erfc_fit(z):
    # Chebyshev fit of erfc(z) = t exp(-z^2 + P(t)), z >= 0, t = 1 / (1 + z / 2): relative
    # error < 1.2e-7 (Numerical Recipes' erfcc coefficients); returns (t, P(t))
    t = 1.0 / (1.0 + 0.5 * z)
    p = t * 0.17087277 - 0.82215223
    p = p * t + 1.48851587
    p = p * t - 1.13520398
    p = p * t + 0.27886807
    p = p * t - 0.18628806
    p = p * t + 0.09678418
    p = p * t + 0.37409196
    p = p * t + 1.00002368
    p = p * t - 1.26551223
    return t, p


@triton.jit
def _square_parts(z):
    # z^2 as hi + lo with hi = zh^2 exact (zh = z rounded down to 1/16: 8 bits where exp(z^2)
    # is finite), so that exp(+-z^2) keeps its relative precision at large z
    zh = tl.floor(z * 16.0) * 0.0625
    return zh * zh, (z - zh) * (z + zh)


@triton.jit
def _erfcx64_pos(x):
    # float64 erfcx(x) for x >= 0: (x + 3.75) erfcx(x) is smooth in t = (x - 3.75) / (x + 3.75)
    # over all of [0, inf) (t -> 1 where erfcx ~ 1 / (x sqrt(pi))); its Chebyshev series in t,
    # 24 terms summed by Clenshaw's recurrence, fitted here with mpmath (bench/NOTES.md):
    # relative error 6e-16 from 0 to 1e300.  Infinity gives 0.
    t = (x - 3.75) / (x + 3.75)
    t2 = t + t
    b0 = x * 0.0
    b1 = x * 0.0
    b0, b1 = 1.0501564927720586e-16 + t2 * b0 - b1, b0
    b0, b1 = -1.0963030130900087e-16 + t2 * b0 - b1, b0
    b0, b1 = -2.704740368320276e-15 + t2 * b0 - b1, b0
    b0, b1 = 2.8807292328713077e-15 + t2 * b0 - b1, b0
    b0, b1 = 7.242772425819852e-14 + t2 * b0 - b1, b0
    b0, b1 = -1.1724828156626574e-13 + t2 * b0 - b1, b0
    b0, b1 = -1.993785314415682e-12 + t2 * b0 - b1, b0
    b0, b1 = 5.780745301094449e-12 + t2 * b0 - b1, b0
    b0, b1 = 5.307787477918412e-11 + t2 * b0 - b1, b0
    b0, b1 = -2.9040184105173024e-10 + t2 * b0 - b1, b0
    b0, b1 = -1.0830423386818938e-09 + t2 * b0 - b1, b0
    b0, b1 = 1.355826598349273e-08 + t2 * b0 - b1, b0
    b0, b1 = -9.53473146659699e-09 + t2 * b0 - b1, b0
    b0, b1 = -4.936920694378021e-07 + t2 * b0 - b1, b0
    b0, b1 = 3.086971620657423e-06 + t2 * b0 - b1, b0
    b0, b1 = 1.971677029425334e-06 + t2 * b0 - b1, b0
    b0, b1 = -0.0001678661262168746 + t2 * b0 - b1, b0
    b0, b1 = 0.0015696224296742666 + t2 * b0 - b1, b0
    b0, b1 = -0.009506139167741073 + t2 * b0 - b1, b0
    b0, b1 = 0.044234890018353 + t2 * b0 - b1, b0
    b0, b1 = -0.16770511573096467 + t2 * b0 - b1, b0
    b0, b1 = 0.5310168126584589 + t2 * b0 - b1, b0
    b0, b1 = -1.4155291636062 + t2 * b0 - b1, b0
    r = (1.5802719754089016 + t * b0 - b1) / (x + 3.75)
    return tl.where(x == float("inf"), 0.0, r)


@triton.jit
def _erfc(x):
    # below |x| = 0.5, 1 - erf(x) (no cancellation: erfc > 0.47 there); above, the fit with
    # exp(-z^2) taken in two exact-enough parts; erfc(-z) = 2 - erfc(z).  float64: erfcx's
    # Chebyshev form times exp(-z^2) everywhere
    z = tl.abs(x)
    hi, lo = _square_parts(z)
    if x.dtype == tl.float64:
        r = _erfcx64_pos(z) * tl.exp(-hi) * tl.exp(-lo)
        r = tl.where(z == float("inf"), 0.0, r)
        r = tl.where(x < 0, 2.0 - r, r)
    else:
        t, p = _erfc_fit(z)
        r = t * tl.exp(-hi) * tl.exp(p - lo)
        r = tl.where(z == float("inf"), 0.0, r)
        r = tl.where(x < 0, 2.0 - r, r)
        r = tl.where(z < 0.5, 1.0 - tl.erf(x), r)
    return tl.where(x != x, x, r)


@triton.jit
def _erfcx_pos(z):
    # erfcx(z), z >= 0, in z's precision: the float64 Chebyshev form, or the float32 fit
    # without its exp(-z^2) factor (0 at +inf)
    if z.dtype == tl.float64:
        r = _erfcx64_pos(z)
    else:
        t, p = _erfc_fit(z)
        r = t * tl.exp(p)
    return r


@triton.jit
def _erfcx(x):
    # exp(x^2) erfc(x): the form above for x >= 0; 2 exp(x^2) - erfcx(-x) below 0, exp(x^2)
    # in two parts as in _erfc (inf once it overflows)
    z = tl.abs(x)
    r = _erfcx_pos(z)
    hi, lo = _square_parts(z)
    big = 2.0 * tl.exp(hi) * tl.exp(lo)
    big = tl.where(z == float("inf"), z, big)
    r = tl.where(x < 0, big - r, r)
    return tl.where(x != x, x, r)


@triton.jit
def _frexp(x):
    # (mantissa in [0.5, 1) with x's sign, exponent) from the bit pattern; subnormals are
    # scaled into the normal range first; zero, inf and NaN give (x, 0) as eager
    if x.dtype == tl.float64:
        sub = (tl.abs(x) < 2.2250738585072014e-308) & (x != 0)
        xs = tl.where(sub, x * 18014398509481984.0, x)  # 2**54
        bits = xs.to(tl.int64, bitcast=True)
        e = ((bits >> 52) & 2047).to(tl.int32) - 1022 - tl.where(sub, 54, 0)
        m = ((bits & -9218868437227405313) | 4602678819172646912).to(tl.float64, bitcast=True)
    else:
        sub = (tl.abs(x) < 1.1754943508222875e-38) & (x != 0)
        xs = tl.where(sub, x * 33554432.0, x)  # 2**25
        bits = xs.to(tl.int32, bitcast=True)
        e = ((bits >> 23) & 255) - 126 - tl.where(sub, 25, 0)
        m = ((bits & -2139095041) | 1056964608).to(tl.float32, bitcast=True)
    special = (x == 0) | (x != x) | (tl.abs(x) == float("inf"))
    return tl.where(special, x, m), tl.where(special, 0, e)


@triton.jit
def _bessel_ie(x, NU: tl.constexpr):
    # exp(-|x|) I_nu(x) for nu = 0, 1: below |x| = S the power series
    # sum (a/2)^(2k+nu) / (k! (k+nu)!) (positive terms), above it Hankel's asymptotic series
    # e^a / sqrt(2 pi a) sum_k prod_j ((2j-1)^2 - 4 nu^2) / (k! (8a)^k); I_1 is odd.
    # float32: S = 15 with 30 and 12 terms (2e-11 relative at the switch); float64: S = 20
    # with 60 and 20 terms (2.3e-15 over |x| <= 60 and 1e-8..1e3, against SciPy's i0e/i1e)
    F64: tl.constexpr = x.dtype == tl.float64
    SWITCH: tl.constexpr = 20.0 if F64 else 15.0
    a = tl.abs(x)
    h = 0.25 * a * a
    t = tl.where(NU == 1, 0.5 * a, 1.0 + 0.0 * a)
    s = t
    for k in tl.static_range(60 if F64 else 30):
        t = t * h / ((k + 1.0) * (k + 1.0 + NU))
        s = s + t
    s = s * tl.exp(-a)
    z = tl.where(a < SWITCH, SWITCH, a)
    c = 1.0 + 0.0 * z
    u = c
    for k in tl.static_range(20 if F64 else 12):
        c = c * ((2.0 * k + 1.0) * (2.0 * k + 1.0) - 4.0 * NU * NU) / (8.0 * z * (k + 1.0))
        u = u + c
    u = u / tl.sqrt(6.283185307179586 * z)
    r = tl.where(a < SWITCH, s, u)
    r = tl.where(a == float("inf"), 0.0, r)
    if NU == 1:
        r = tl.where(x < 0, -r, r)
    return r


@triton.jit
def _bessel_i(x, NU: tl.constexpr):
    # I_nu(x) = e^|x| (e^-|x| I_nu(x)), the exponential taken in two halves so that I_nu
    # stays finite as far as it is; NaN at +-inf (inf * 0), as eager's
    h = tl.exp(0.5 * tl.abs(x))
    return h * (_bessel_ie(x, NU) * h)


@triton.jit
def _zeta_pos(s, q):
    # sum_{k>=0} (q + k)^-s for q > 0, s > 1: N terms, then the Euler-Maclaurin remainder at
    # a = q + N: a^(1-s) (1/(s-1) + 1/(2a) + sum_{j<=M} B_2j/(2j)! s(s+1)..(s+2j-2) / a^2j),
    # Horner in 1/a^2 (the constants are B_2j/(2j)!).  (N, M) = (4, 5) in float32, (7, 10) in
    # float64: truncation error below 5e-10 and 3e-17 against a 50-digit sum over s in
    # (1, 1000], q in [1e-3, 1e5].  The corrections take c = min(s, 8a): past it they lie
    # below the first term's last bit (it is >= e^(8N) times larger), and s(s+1).. overflows.
    # Powers are exp2(-s log2 x): relative error ~ |s log2 x| ulps, that of s itself
    if q.dtype == tl.float64:
        a = q + 7.0
        w = 1.0 / (a * a)
        c = tl.minimum(s, 8.0 * a)
        h = (c + 17.0) * (c + 18.0) * w * -2.174868698558062e-16 + 8.586062056277845e-15
        h = (c + 15.0) * (c + 16.0) * w * h - 3.3896802963225827e-13
        h = (c + 13.0) * (c + 14.0) * w * h + 1.3382536530684679e-11
        h = (c + 11.0) * (c + 12.0) * w * h - 5.284190138687493e-10
        h = (c + 9.0) * (c + 10.0) * w * h + 2.08767569878681e-08
        h = (c + 7.0) * (c + 8.0) * w * h - 8.267195767195768e-07
        h = (c + 5.0) * (c + 6.0) * w * h + 3.306878306878307e-05
        h = (c + 3.0) * (c + 4.0) * w * h - 0.001388888888888889
        h = (c + 1.0) * (c + 2.0) * w * h + 0.08333333333333333
        r = tl.exp2((1.0 - s) * tl.log2(a)) * (1.0 / (s - 1.0) + 0.5 / a + c * w * h)
        for k in tl.static_range(7):  # (smallest term first)
            r = r + tl.exp2(-s * tl.log2(q + (6 - k)))
    else:
        a = q + 4.0
        w = 1.0 / (a * a)
        c = tl.minimum(s, 8.0 * a)
        h = (c + 7.0) * (c + 8.0) * w * 2.08767569878681e-08 - 8.267195767195768e-07
        h = (c + 5.0) * (c + 6.0) * w * h + 3.306878306878307e-05
        h = (c + 3.0) * (c + 4.0) * w * h - 0.001388888888888889
        h = (c + 1.0) * (c + 2.0) * w * h + 0.08333333333333333
        r = tl.exp2((1.0 - s) * tl.log2(a)) * (1.0 / (s - 1.0) + 0.5 / a + c * w * h)
        for k in tl.static_range(4):
            r = r + tl.exp2(-s * tl.log2(q + (3 - k)))
    return r


@triton.jit
def _zeta(s, q):
    # Hurwitz zeta sum_{k>=0} (q + k)^-s with eager's values at its edges: inf at s == 1, NaN
    # below; inf at q = 0, -1, -2, .. and -inf; other q < 0 only for integer s (NaN else),
    # where the terms with q + k < 0 are (-1)^s (g + j)^-s, g = frac(|q|), j < ceil(|q|):
    # zeta(s, q) = zeta(s, 1 - g) + (-1)^s (zeta(s, g) - zeta(s, 1 + |q|)).  Those two extra
    # sums run only in blocks that hold such a q
    pole = (q <= 0) & (q == tl.floor(q))
    neg = (q < 0) & (pole == 0)
    aq = tl.abs(q)
    g = aq - tl.floor(aq)
    r = _zeta_pos(s, tl.where(neg, 1.0 - g, q))
    if tl.max(neg.to(tl.int32)) > 0:
        odd = (s - 2.0 * tl.floor(0.5 * s)) == 1.0
        zg = _zeta_pos(s, tl.where(neg, g, 1.0))
        zq = _zeta_pos(s, tl.where(neg, 1.0 + aq, 2.0))
        # (odd s: the halves at 1 - g and g cancel first, exactly so at g = 1/2)
        r = tl.where(neg, tl.where(odd, (r - zg) + zq, r + (zg - zq)), r)
    r = tl.where(neg & (s != tl.floor(s)), float("nan"), r)
    r = tl.where(q == float("inf"), float("nan"), r)
    r = tl.where(pole, float("inf"), r)
    # eager's sum at s = +inf: inf below q = 1, 1 at 1, NaN above (0 * inf in its remainder)
    at_inf = tl.where((q > 1.0) | (q != q), float("nan"), tl.where(q == 1.0, 1.0, float("inf")))
    r = tl.where(s == float("inf"), at_inf, r)
    r = tl.where(s < 1.0, float("nan"), r)
    return tl.where(s == 1.0, float("inf"), r)


@triton.jit
def _sum3(a, b, c, lo):
    # a + b + c + lo with a + b + c exact before its one rounding (Knuth's two-sum, twice):
    # near eager's trigamma poles they cancel to a few ulps of the largest
    s = a + b
    t = s - a
    err = (a - (s - t)) + (b - t)
    u = s + c
    t = u - s
    err = err + ((s - (u - t)) + (c - t))
    return u + (err + lo)


@triton.jit
def _sin2_rounded_pi_x(x, PI: tl.constexpr, D1: tl.constexpr, D2: tl.constexpr, BIG: tl.constexpr):
    # sin^2(p), p = PI x rounded (PI: pi rounded to x's type, PI - pi = D1 + D2), with the
    # relative precision of sin^2 kept where p nears a multiple of pi: sin^2(p) = sin^2(r),
    # r = p - k pi = PI f + (PI - pi) k + e, x = k + f (k an integer: f exact), e = p - PI x,
    # each part exact as a pair (fmas), summed exactly (_sum3).  k is round(x), moved by
    # round(r / pi) where that leaves |r| > 2 (|x| > 2^21, where f is a multiple of 1/4 and
    # stays exact; r then reaches 2 pi, x + 1/2 rounding up from 2^23).
    # From BIG (2^24, 2^53) on r outgrows its precision: sin(p) itself there
    p = x * PI
    e = -tl.fma(x, PI, -p)
    k = tl.floor(x + 0.5)
    f = x - k
    r0 = (e + D1 * k) + PI * f
    j = tl.where(tl.abs(r0) > 2.0, tl.floor(r0 * 0.3183098861837907 + 0.5), 0.0)
    k = k + j
    f = f - j
    a = PI * f
    b = D1 * k
    lo = tl.fma(f, PI, -a) + tl.fma(k, D1, -b) + D2 * k
    sn = tl.where(tl.abs(x) < BIG, tl.sin(_sum3(e, b, a, lo)), tl.sin(p))
    return sn * sn


@triton.jit
def _trigamma(x):
    # polygamma(1, x) as eager computes it: zeta(2, x) from 0 up (inf at 0, 0 at +inf: no
    # remainder there, unlike _zeta's NaN); below 0 its reflection PI^2 / sin^2(PI x) -
    # zeta(2, 1 - x) with PI x rounded to the compute type (PI: pi rounded) as eager's, so
    # that its finite values at -1, -2, .. (pi^2 over the product's rounding error squared)
    # come out alike
    if x.dtype == tl.float64:
        refl = 9.869604401089358 / _sin2_rounded_pi_x(x, 3.141592653589793, -1.2246467991473532e-16,
                                                      2.9947698097183397e-33, 9007199254740992.0)
    else:
        refl = 9.86960506439209 / _sin2_rounded_pi_x(x, 3.1415927410125732, 8.742277657347586e-08,
                                                     3.4302490200117637e-15, 16777216.0)
    below = x < 0
    z = _zeta_pos(tl.zeros_like(x) + 2.0, tl.where(below, 1.0 - x, x))
    r = tl.where(below, refl - z, z)
    return tl.where(x == float("-inf"), float("nan"), r)


@triton.jit
def _erfinv_start(a, w):
    # Giles' single-precision polynomials for erfinv(a), a in [0, 1), in w = -log((1 - a)(1 + a)):
    # central below w = 5, tail above
    c = w - 2.5
    p = c * 2.81022636e-08 + 3.43273939e-07
    p = p * c - 3.5233877e-06
    p = p * c - 4.39150654e-06
    p = p * c + 0.00021858087
    p = p * c - 0.00125372503
    p = p * c - 0.00417768164
    p = p * c + 0.246640727
    p = p * c + 1.50140941
    t = tl.sqrt(tl.where(w < 5.0, 5.0, w)) - 3.0
    q = t * -0.000200214257 + 0.000100950558
    q = q * t + 0.00134934322
    q = q * t - 0.00367342844
    q = q * t + 0.00573950773
    q = q * t - 0.0076224613
    q = q * t + 0.00943887047
    q = q * t + 1.00167406
    q = q * t + 2.83297682
    return tl.where(w < 5.0, p, q) * a


@triton.jit
def _erfinv(y):
    # Giles' polynomials, then one Newton step on erf(x) = y; +-inf at +-1, nan beyond.
    # float64: the polynomials only start _inv_erf's refinement
    if y.dtype == tl.float64:
        a = tl.abs(y)
        x = _inv_erf(a, 1.0 - a)
        x = tl.where(y < 0, -x, tl.where(y == 0, y, x))  # (-0.0 keeps its sign)
    else:
        w = -tl.log((1.0 - y) * (1.0 + y))
        x = _erfinv_start(y, w)
        x = x - (tl.erf(x) - y) / (1.1283791670955126 * tl.exp(-x * x))
    x = tl.where(tl.abs(y) == 1.0, y * float("inf"), x)
    return tl.where((tl.abs(y) > 1.0) | (y != y), float("nan"), x)


@triton.jit
def _inv_erf(a, c):
    # x >= 0 with erf(x) = a and erfc(x) = c = 1 - a, for a in [0, 1): the caller passes
    # both, each exact where it is used (a below 0.5, c above ~0 down to the smallest
    # positive float), so neither erfinv next to 1 nor ndtri in its far tail loses the
    # digits that 1 - c would.  Start: Giles' polynomials where they were fitted (w < 16),
    # the asymptotic x^2 ~ L - log(pi L) / 2 (L = -log c) beyond.  Refinement: Newton on
    # erf(x) = a below a = 0.5, and on log erfc(x) = log c above (log erfcx(x) - x^2, no
    # exp to underflow: its slope is -2 / (sqrt(pi) erfcx(x))), x^2 in exact parts;
    # three steps in float64, two in float32 (quadratic convergence from ~1e-3).
    F64: tl.constexpr = a.dtype == tl.float64
    w = -tl.log(c * (2.0 - c))
    x = _erfinv_start(a, w)
    big = -tl.log(tl.where(c < 0.5, c, 0.5))
    x = tl.where(w < 16.0, x, tl.sqrt(big - 0.5 * tl.log(3.141592653589793 * big)))
    central = a < 0.5
    logc = tl.log(tl.where(central, 0.5, c))
    for _ in tl.static_range(3 if F64 else 2):
        xc = x - (tl.erf(x) - a) / (1.1283791670955126 * tl.exp(-x * x))
        z = tl.where(central, 1.0, tl.maximum(x, 0.0))
        e = _erfcx_pos(z)
        hi, lo = _square_parts(z)
        xt = z + (tl.log(e) - hi - lo - logc) * (0.886226925452758 * e)
        x = tl.where(central, xc, xt)
    return x


@triton.jit
def _ndtri(p):
    # the standard normal quantile, sqrt(2) erfinv(2p - 1) = -sqrt(2) erfcinv(2p): below
    # p = 0.5 from c = 2p (exact), above from c = 2 - 2p and a = 2p - 1 (exact there);
    # -inf at 0, inf at 1, nan outside [0, 1]
    lower = p < 0.5
    c = tl.where(lower, p + p, 2.0 - (p + p))
    x = 1.4142135623730951 * _inv_erf(1.0 - c, c)
    x = tl.where(lower, -x, x)
    x = tl.where(p == 0.0, float("-inf"), x)
    x = tl.where(p == 1.0, float("inf"), x)
    return tl.where((p < 0.0) | (p > 1.0) | (p != p), float("nan"), x)


@triton.jit
def _lgamma1p_taylor(t):
    # lgamma(1 + t) for |t| <= 0.5 in float64, to full relative precision near t = 0:
    # t (1 - euler_gamma) - log1p(t) + sum_k>=2 (-1)^k (zeta(k) - 1) / k t^k (the series
    # of lgamma(1 + t) with the log1p part summed in closed form; |term| < (t/2)^k / k,
    # so 24 terms reach 1e-17 at |t| = 0.5)
    s = 2.4836745438024783e-09
    s = s * t - 5.1834750419700467e-09
    s = s * t + 1.0838659214896954e-08
    s = s * t - 2.2711094608943165e-08
    s = s * t + 4.7698101693639806e-08
    s = s * t - 1.00432248239681e-07
    s = s * t + 2.1207184805554666e-07
    s = s * t - 4.492469198764566e-07
    s = s * t + 9.5514121304074198e-07
    s = s * t - 2.0392157538013662e-06
    s = s * t + 4.3748667899074878e-06
    s = s * t - 9.4394882752683959e-06
    s = s * t + 2.0507212775670692e-05
    s = s * t - 4.4926236738133142e-05
    s = s * t + 9.9457512781808534e-05
    s = s * t - 0.00022315475845357938
    s = s * t + 0.00050966952474304242
    s = s * t - 0.001192753911703261
    s = s * t + 0.0028905103307415233
    s = s * t - 0.0073855510286739853
    s = s * t + 0.020580808427784548
    s = s * t - 0.067352301053198095
    s = s * t + 0.32246703342411322
    return t * 0.42278433509846714 - _log1p(t) + s * t * t


@triton.jit
def _lgamma1p(a):
    # lgamma(1 + a) for 0 <= a < 1.5 without rounding 1 + a: the series at 0, and
    # log(a) + lgamma(1 + (a - 1)) above a = 0.5
    lo = a <= 0.5
    return tl.where(lo, _lgamma1p_taylor(tl.where(lo, a, 0.0)),
                    tl.log(tl.where(lo, 1.0, a)) + _lgamma1p_taylor(tl.where(lo, 0.0, a - 1.0)))


@triton.jit
def _igamma(a, x, upper: tl.constexpr):
    # Regularised incomplete gamma P(a, x) (Q = 1 - P when `upper`), in float64 whatever
    # the operands' type: the prefactor x^a e^-x / Gamma(a) taken as exp(a log x - x -
    # lgamma(a)) cancels ~a log a, so float32 would lose |a log a| ulps.  Below x = a + 1
    # the series sum_n x^n / (a (a+1) .. (a+n)) gives P, above it Lentz's continued
    # fraction gives Q; the other is 1 minus it.  Both run until every lane of the block
    # has converged (~12 sqrt(a) steps near x = a, bench/NOTES.md); a lane still moving
    # after 16384 steps (a beyond ~1e6 with x near a) gives NaN rather than a wrong value.
    # Edges as eager's (SciPy's): NaN for a < 0 or x < 0 and at a = x = 0 or both infinite;
    # a = 0 means P = 1; x = 0 means P = 0; a = inf P = 0; x = inf P = 1.
    # Q where 1 - P would cancel (x <= 1.1 and a small against it: Q ~ a E1(x), down to
    # ~1e-4 at a = 1e-3): Q = -expm1(a log x - lgamma(1 + a)) - a x^a / Gamma(1 + a)
    # sum_n>=1 (-x)^n / (n! (a + n)), the regions of DiDonato & Morris / Cephes
    a = a.to(tl.float64)
    x = x.to(tl.float64)
    ok = (a > 0) & (x > 0) & (a < float("inf")) & (x < float("inf"))
    aa = tl.where(ok, a, 1.0)
    xx = tl.where(ok, x, 1.0)
    series = xx < aa + 1.0
    pre = tl.exp(aa * tl.log(xx) - xx - _lgamma(aa))
    ap = aa
    term = 1.0 / aa
    total = term
    b = xx + 1.0 - aa
    c = tl.zeros_like(b) + 1e300
    d = 1.0 / tl.where(tl.abs(b) < 1e-300, 1e-300, b)
    h = d
    busy = ok
    lx = tl.log(xx)
    qser = series & (xx <= 1.1) & tl.where(xx <= 0.5, aa * lx > -0.4, aa < 1.1 * xx) if upper else series & False
    fac = tl.zeros_like(xx) + 1.0
    qsum = tl.zeros_like(xx)
    i = 0
    while (i < 16384) & (tl.max(busy.to(tl.int32)) > 0):
        i += 1
        ap = ap + 1.0
        term = term * xx / ap
        total = total + term
        if upper:
            fac = fac * -xx / (i * 1.0)
            qterm = fac / (aa + i * 1.0)
            qsum = qsum + qterm
        fi = i * 1.0
        an = fi * (aa - fi)
        b = b + 2.0
        d = an * d + b
        d = 1.0 / tl.where(tl.abs(d) < 1e-300, 1e-300, d)
        c = b + an / c
        c = tl.where(tl.abs(c) < 1e-300, 1e-300, c)
        step = d * c
        h = h * step
        busy = ok & tl.where(series, tl.abs(term) > tl.abs(total) * 4.4e-16, tl.abs(step - 1.0) > 8.9e-16)
        if upper:
            busy = busy | (ok & qser & (tl.abs(qterm) > tl.abs(qsum) * 4.4e-16))
    p_series = pre * total
    q_fraction = pre * h
    # eager's edge tests in eager's order (the first that holds decides; NaN operands
    # reach a value where an earlier test decides, e.g. P(inf, NaN) = 0)
    lo = 1.0 if upper else 0.0
    hi = 1.0 - lo
    if upper:
        e = aa * lx - _lgamma1p(tl.where(qser, aa, 0.0))
        q_series = -_expm1(e) - aa * tl.exp(e) * qsum
        r = tl.where(series, tl.where(qser, q_series, 1.0 - p_series), q_fraction)
    else:
        r = tl.where(series, p_series, 1.0 - q_fraction)
    r = tl.where(busy | (a != a) | (x != x), float("nan"), r)
    r = tl.where(x == float("inf"), hi, r)
    r = tl.where(a == float("inf"), tl.where(x == float("inf"), float("nan"), lo), r)
    r = tl.where(x == 0, lo, r)
    r = tl.where(a == 0, tl.where(x > 0, hi, float("nan")), r)
    return tl.where((a < 0) | (x < 0), float("nan"), r)


@triton.jit
def _ortho_poly(x, n, family: tl.constexpr):
    # The orthogonal polynomials of torch.special as eager evaluates them (ATen's Math.h):
    # family 0-3 Chebyshev T, U, V, W; 4-7 their shifted forms (argument y = 2x - 1);
    # 8 Hermite H, 9 Hermite He, 10 Laguerre L, 11 Legendre P.  n is truncated to an
    # integer (non-finite n counts as negative: 0); n < 0 gives 0, then eager's special
    # points (|x| = 1; x = 0 and 1 when shifted; x = 0 for L), then Chebyshev's closed
    # forms for |y| < 1 past a degree, then the three-term recurrence, n - 1 steps, run
    # until every lane of the block has taken its steps or reached NaN (eager stops there).
    # Hermite beyond degree 128 (float32) / 512 (float64) is NaN, as eager's
    nn = tl.where((n == n) & (tl.abs(n) < float("inf")), n, -1.0)
    nn = tl.where(nn < 0, tl.ceil(nn), tl.floor(nn))
    shifted: tl.constexpr = family >= 4 and family < 8
    kind: tl.constexpr = family % 4
    cheb: tl.constexpr = family < 8
    y = x + x - 1.0 if shifted else x
    odd = (nn - 2.0 * tl.floor(nn * 0.5)) == 1.0
    sgn = tl.where(odd, -1.0, 1.0)
    one = tl.zeros_like(x) + 1.0
    if cheb:
        if kind == 0:
            q1 = y
        elif kind == 1:
            q1 = y + y
        elif kind == 2:
            q1 = y + y - 1.0
        else:
            q1 = y + y + 1.0
    elif family == 8:
        q1 = x + x
    elif family == 9:
        q1 = x
    elif family == 10:
        q1 = 1.0 - x
    else:
        q1 = x
    p = one
    q = q1
    j = 0
    busy = (nn >= 2.0) & (q == q)
    while tl.max(busy.to(tl.int32)) > 0:
        j += 1
        fj = j * 1.0
        if cheb:
            r = (y + y) * q - p
        elif family == 8:
            r = (x + x) * q - (fj + fj) * p
        elif family == 9:
            r = x * q - fj * p
        elif family == 10:
            r = (((fj + fj) + (1.0 - x)) * q - fj * p) / (fj + 1.0)
        else:
            r = ((fj + fj + 1.0) * x * q - fj * p) / (fj + 1.0)
        p = tl.where(busy, q, p)
        q = tl.where(busy, r, q)
        busy = busy & (fj + 1.0 < nn) & (q == q)
    res = tl.where(nn == 1.0, q1, q)
    res = tl.where(nn == 0.0, 1.0, res)
    if family == 8 or family == 9:
        limit = 512.0 if x.dtype == tl.float64 else 128.0
        res = tl.where(nn > limit, float("nan"), res)
    if cheb:
        # closed forms for |y| < 1 past a degree (eager's thresholds)
        if shifted:
            past = 4.0 if kind == 3 else 6.0
        else:
            past = 6.0 if kind == 0 else 8.0
        inside = (nn > past) & (tl.abs(y) < 1.0)
        # acos correctly rounded to the compute type (taken in float64): n times its error
        # reaches the result, and eager's libm acos is within an ulp
        t = _acos(tl.where(inside, y, 0.0).to(tl.float64)).to(y.dtype)
        if kind == 0:
            closed = tl.cos(nn * t)
        elif kind == 1:
            s = tl.sin(t)
            closed = tl.where(s != 0.0, tl.sin((nn + 1.0) * t) / s, (nn + 1.0) * tl.cos((nn + 1.0) * t) / y)
        elif kind == 2:
            closed = tl.where(tl.sin(t * 0.5) != 1.0, tl.cos((nn + 0.5) * t) / tl.cos(t * 0.5), sgn * (nn + nn + 1.0))
        else:
            if shifted:
                edge = sgn
            else:
                edge = tl.where(x > 0, nn + nn + 1.0, sgn)
            closed = tl.where(tl.cos(t * 0.5) != 1.0, tl.sin((nn + 0.5) * t) / tl.sin(t * 0.5), edge)
        res = tl.where(inside, closed, res)
        # special points
        if shifted:
            if kind == 0:
                at_one = one
                at_zero = sgn
            elif kind == 1:
                at_one = nn + 1.0
                at_zero = sgn * (nn + 1.0)
            elif kind == 2:
                at_one = one
                at_zero = sgn * (nn + nn + 1.0)
            else:
                at_one = nn + nn + 1.0
                at_zero = sgn
            res = tl.where(x == 0.0, at_zero, res)
            res = tl.where(x == 1.0, at_one, res)
        else:
            pos = x > 0
            if kind == 0:
                edge1 = tl.where(pos, 1.0, sgn)
            elif kind == 1:
                edge1 = tl.where(pos, nn + 1.0, sgn * (nn + 1.0))
            elif kind == 2:
                edge1 = tl.where(pos, 1.0, sgn * (nn + nn + 1.0))
            else:
                edge1 = tl.where(pos, nn + nn + 1.0, sgn)
            res = tl.where(tl.abs(x) == 1.0, edge1, res)
    elif family == 10:
        res = tl.where(x == 0.0, 1.0, res)
    elif family == 11:
        res = tl.where(tl.abs(x) == 1.0, tl.where(x > 0, 1.0, sgn), res)
    return tl.where(nn < 0.0, 0.0, res)

'''

# the Bessel J/Y/K and Airy helpers, generated from their Chebyshev tables
PRELUDE += "\n\n" + special_bessel.SOURCE

ORTHO_POLY_OPS = ("cheb_t", "cheb_u", "cheb_v", "cheb_w", "scheb_t", "scheb_u", "scheb_v", "scheb_w",
                  "hermite_h", "hermite_he", "laguerre_l", "legendre_p")

# (format, needs float)  — operands already share the compute dtype
BINARY = {
    "add": "({0} + {1})", "sub": "({0} - {1})", "mul": "({0} * {1})", "truediv": "({0} / {1})",
    "maximum": "_nanmax({0}, {1})", "minimum": "_nanmin({0}, {1})",
    "clamp_min": "_nanmax({0}, {1})", "clamp_max": "_nanmin({0}, {1})",
    "floordiv": "_floordiv({0}, {1})", "atan2": "_atan2({0}, {1})", "zeta": "_zeta({0}, {1})",
    "igamma": "_igamma({0}, {1}, False)", "igammac": "_igamma({0}, {1}, True)",
    # C semantics (issue 18, lower/rules_intdiv.py): integer `//` truncates, `%` (ints and
    # floats) takes the dividend's sign; the rules build Python's rounding from them
    "tdiv": "({0} // {1})", "fmod": "({0} % {1})",
    # raw shifts: the rules (rules_pointwise) keep the count in [0, bits) and give eager's
    # results outside it
    "lshift": "({0} << {1})", "rshift": "({0} >> {1})",
    "bitwise_and": "({0} & {1})", "bitwise_or": "({0} | {1})", "bitwise_xor": "({0} ^ {1})",
    "logical_and": "({0} & {1})", "logical_or": "({0} | {1})", "logical_xor": "({0} ^ {1})",
    "eq": "({0} == {1})", "ne": "({0} != {1})", "lt": "({0} < {1})", "le": "({0} <= {1})",
    "gt": "({0} > {1})", "ge": "({0} >= {1})",
}
# torch.special's orthogonal polynomials: the family number is `_ortho_poly`'s constexpr
BINARY.update({op: "_ortho_poly({0}, {1}, %d)" % i for i, op in enumerate(ORTHO_POLY_OPS)})
UNARY = {
    "exp": "tl.exp({0})", "exp2": "tl.exp2({0})", "log": "tl.log({0})", "log2": "tl.log2({0})",
    "log1p": "_log1p({0})", "expm1": "_expm1({0})", "sqrt": "tl.sqrt_rn({0})", "rsqrt": "tl.rsqrt({0})",
    "sin": "tl.sin({0})", "cos": "tl.cos({0})", "tanh": "_tanh({0})",
    "sigmoid": "(1.0 / (1.0 + tl.exp(-{0})))", "erf": "tl.erf({0})", "abs": "tl.abs({0})",
    "neg": "(-{0})", "reciprocal": "(1.0 / {0})", "floor": "tl.floor({0})", "ceil": "tl.ceil({0})",
    "trunc": "tl.where({0} < 0, tl.ceil({0}), tl.floor({0}))",
    "bitwise_not": "(~{0})", "logical_not": "({0} == 0)", "identity": "{0}",
    "relu": "tl.where({0} < 0, 0, {0})", "isnan": "({0} != {0})",
    "lgamma": "_lgamma({0})", "digamma": "_digamma({0})",
    "asin": "_asin({0})", "acos": "_acos({0})", "atan": "_atan({0})", "asinh": "_asinh({0})",
    "acosh": "_acosh({0})", "atanh": "_atanh({0})", "sinh": "_sinh({0})", "cosh": "_cosh({0})",
    "tan": "(tl.sin({0}) / tl.cos({0}))", "log10": "(tl.log({0}) * 0.4342944819032518)",
    "erfc": "_erfc({0})", "erfcx": "_erfcx({0})", "erfinv": "_erfinv({0})", "ndtri": "_ndtri({0})",
    "frexp_mantissa": "_frexp({0})[0]", "frexp_exponent": "_frexp({0})[1]",
    "bessel_i0": "_bessel_i({0}, 0)", "bessel_i1": "_bessel_i({0}, 1)",
    "bessel_i0e": "_bessel_ie({0}, 0)", "bessel_i1e": "_bessel_ie({0}, 1)",
    "trigamma": "_trigamma({0})",
    **special_bessel.UNARY,
}


def _is_literal(x: str) -> bool:
    return x.startswith("float(") or x.replace(".", "").replace("-", "").replace("+", "").replace("e", "").isdigit()


def pointwise_expr(op: str, args: list[str], in_dtype: torch.dtype | None, out_dtype: torch.dtype) -> str:
    float_fmod = op == "fmod" and out_dtype in FLOATS
    if op == "signbit":
        if in_dtype in FLOATS:  # the bit itself: -0.0 and negative NaNs too
            bits = "tl.int64" if in_dtype == torch.float64 else "tl.int32"
            return f"({args[0]}.to({bits}, bitcast=True) < 0)"
        return f"({args[0]} < 0)"
    if op in ("order_key_max", "order_key_min"):
        return f"_order_key({args[0]}, {in_dtype in FLOATS}, {op == 'order_key_min'})"
    if op in ("from_order_key_max", "from_order_key_min"):
        return f"_from_order_key({args[0]}, {out_dtype in FLOATS}, {op == 'from_order_key_min'})"
    if op in ("order_key64_max", "order_key64_min"):
        return f"_order_key64({args[0]}, {in_dtype in FLOATS}, {op == 'order_key64_min'})"
    if op in ("from_order_key64_max", "from_order_key64_min"):
        return f"_from_order_key64({args[0]}, {out_dtype in FLOATS}, {op == 'from_order_key64_min'})"
    if op == "nextafter":
        a, b = _block_operands(*args)
        return f"_nextafter({a}, {b}, {65536 if out_dtype == torch.bfloat16 else 1}, {out_dtype == torch.float16})"
    if op in ("floordiv", "atan2", "zeta", "igamma", "igammac") or op in ORTHO_POLY_OPS or float_fmod:
        # the helpers compare (or pass to libdevice) their operands as tensors
        a, b = _block_operands(*args)
        return f"_fmod({a}, {b})" if float_fmod else BINARY[op].format(a, b)
    if op in BINARY:
        return BINARY[op].format(*args)
    if op == "sqrt" and out_dtype == torch.float64:
        return f"tl.sqrt({args[0]})"  # `sqrt_rn` takes float32 only; float64 sqrt is IEEE-rounded
    if op == "round":
        return f"_round({args[0]}, {ROUND_EXACT[out_dtype]})"
    if op in UNARY:
        return UNARY[op].format(*args)
    if op == "sign":
        a = args[0]
        if in_dtype in FLOATS:
            # sign(nan) is 0 in eager
            return _typed_literals(f"tl.where({a} > 0, 1.0, tl.where({a} < 0, -1.0, 0.0))", out_dtype)
        return f"tl.where({a} > 0, 1, tl.where({a} < 0, -1, 0)).to({TL_DTYPE[out_dtype]})"
    if op == "isinf":
        a = args[0]
        return f"(({a} == float('inf')) | ({a} == float('-inf')))" if in_dtype in FLOATS else f"({a} != {a})"
    if op == "where":
        expr = f"tl.where({args[0]}, {args[1]}, {args[2]})"
        return _typed_literals(expr, out_dtype) if _is_literal(args[1]) and _is_literal(args[2]) else expr
    if op == "fma":  # a * b + c rounded once (linspace's edges as eager's CPU kernel makes them)
        ref = next((a for a in args if not _is_literal(a)), None)
        if ref is None:
            raise NotImplementedError("fma of three literals")
        a, b, c = (f"(tl.zeros_like({ref}) + {a})" if _is_literal(a) else a for a in args)
        return f"tl.fma({a}, {b}, {c})"
    if op == "pow":
        return _pow(args, out_dtype) if out_dtype in FLOATS else _int_pow(args, out_dtype)
    if op == "gcd":
        a, b = _block_operands(*args)
        return f"_gcd({a}, {b})"
    raise NotImplementedError(f"no Triton expression for pointwise op {op!r}")


def _typed_literals(expr: str, out_dtype: torch.dtype) -> str:
    """A value chosen among Python float literals, which Triton types float32: in a
    float64 kernel it is cast, or every op after it computes in float32 (fuzz, float64
    programs: `atan(sign(x))` was 2e-8 off, a float32 arctangent).  Half and float32
    values compute in float32 anyway."""
    return f"{expr}.to(tl.float64)" if out_dtype == torch.float64 else expr


def _int_pow(args: list[str], dtype: torch.dtype) -> str:
    """Integer a ** b (`_ipow`): a literal exponent walks only its own bits."""
    a, b = args
    bits = torch.iinfo(dtype).bits
    if _is_literal(b) and int(b) >= 0:
        bits = max(int(b).bit_length(), 1)
    a, b = _block_operands(a, b)
    return f"_ipow({a}, {b}, {bits}, {dtype.is_signed})"


def _pow(args: list[str], dtype: torch.dtype = torch.float32) -> str:
    a, b = args
    sqrt = "tl.sqrt" if dtype == torch.float64 else "tl.sqrt_rn"
    # the exponents eager special-cases (CPU and CUDA pow kernels), computed the same way;
    # x ** 0 is 1 even for inf and nan
    special = {"2.0": f"({a} * {a})", "1.0": a, "3.0": f"({a} * {a} * {a})", "0.5": f"{sqrt}({a})",
               "-1.0": f"(1.0 / {a})", "-0.5": f"tl.rsqrt({a})", "-2.0": f"(1.0 / ({a} * {a}))",
               "0.0": _typed_literals(f"tl.where({a} != {a}, 1.0, 1.0)", dtype)}
    if b in special:
        return special[b]
    # _pow works on blocks: a scalar base or exponent becomes one
    a, b = _block_operands(a, b)
    return f"_pow({a}, {b})"


def _block_operands(a: str, b: str) -> tuple[str, str]:
    """Two operands of a helper that works on blocks: a literal one (at most one is)
    becomes a block of the other's shape and type."""
    a = f"(tl.zeros_like({b}) + {a})" if _is_literal(a) else a
    b = f"(tl.zeros_like({a}) + {b})" if _is_literal(b) else b
    return a, b


def store_expr(x: str, dtype: torch.dtype) -> str:
    """A compute-type value converted to the stored type.  bf16 is rounded to nearest
    even with integer ops first: the interpreter's bf16 conversion truncates (GPUs
    round, and rounding an already representable value again changes nothing)."""
    if compute_dtype(dtype) == dtype:
        return x
    if dtype in FLOAT8_DTYPES:   # (held as its bits)
        return f"{x}.to({TL_DTYPE[dtype]}, bitcast=True)"
    if dtype == torch.bfloat16:
        return f"_to_bf16({x})"
    return f"{x}.to({TL_DTYPE[dtype]})"


def bitcast_expr(x: str, src: torch.dtype, dst: torch.dtype) -> str:
    """The bits of a `src` value (held in its compute type) read as `dst` (same size):
    a half value is rounded to its own type first (held in float32, it may carry more
    precision than eager's stored value: `store_expr`'s rounding) and a half result goes
    on in float32 like every half value.  A float8 value is held as its bits (uint8)."""
    if src in FLOAT8_DTYPES or dst in FLOAT8_DTYPES:   # (byte types: no rounding, no widening)
        cs, cd = compute_dtype(src), compute_dtype(dst)
        return x if cs == cd else f"{x}.to({TL_DTYPE[cd]}, bitcast=True)"
    if compute_dtype(src) != src:
        x = store_expr(x, src)
    x = f"{x}.to({TL_DTYPE[dst]}, bitcast=True)"
    if dst == torch.bfloat16:
        return f"_from_bf16({x})"   # (the interpreter's own widening loses subnormals)
    return f"{x}.to(tl.float32)" if compute_dtype(dst) != dst else x


# comparisons see half operands rounded to their type (`round_half`), as eager compares its
# stored values.  Not floor/trunc/floordiv: there the operand is often an intermediate of one
# eager kernel split by its decomposition (`div(a, b, rounding_mode="trunc")` is trunc(a / b),
# the quotient never rounded to bfloat16 in eager: rounding it made 15.97 trunc to 16)
HALF_EXACT_OPS = frozenset({"eq", "ne", "lt", "le", "gt", "ge"})


def round_half(x: str, dtype: torch.dtype) -> str:
    """`x`, a value of `dtype` held in its compute type, rounded to `dtype` where that is a
    half type (float32 carries more precision than eager's stored value: 2 - a in float16
    recomputed by a backward is not the saved minimum it equals in eager, and 70000 is
    finite in float32 but float16's inf); else `x`."""
    if dtype == torch.bfloat16:
        return f"_round_bf16({x})"
    if dtype == torch.float16:
        return f"{x}.to(tl.float16).to(tl.float32)"
    return x


_F8_NAME = {torch.float8_e4m3fn: "e4m3fn", torch.float8_e5m2: "e5m2"}


def cast_expr(x: str, src: torch.dtype, dst: torch.dtype) -> str:
    """Cast between compute types, rounding through half types like eager does.  A
    half-precision value is held in float32 between ops without rounding (more accurate
    than eager); a cast out of its type rounds it first, as eager's value was rounded, so
    that what the program asked for in float32 (x.float() - mean, a rematerialised
    activation against a saved statistic) matches eager's bit for bit.  The float8 types convert through float32 with eager's
    rounding (`_to_e4m3fn`; eager converts from float32 too, a float64 value rounded to it
    first)."""
    if dst == src:
        return x
    if src in FLOAT8_DTYPES:
        x, src = f"_from_{_F8_NAME[src]}({x})", torch.float32
    if dst in FLOAT8_DTYPES:
        return f"_to_{_F8_NAME[dst]}({cast_expr(x, src, torch.float32)})"
    x = round_half(x, src)
    if dst == torch.bool:
        return f"({x} != 0)"
    if src == torch.bool:
        x = f"{x}.to(tl.int8)"
    if dst == torch.bfloat16:
        if compute_dtype(src) != torch.float32:
            x = f"{x}.to(tl.float32)"  # ints: through float32, like eager's conversion
        return f"_round_bf16({x})" if src != torch.bfloat16 else x
    if dst == torch.float16:
        if compute_dtype(src) not in (torch.float32, torch.float64):
            x = f"{x}.to(tl.float32)"
        return f"{x}.to(tl.float16).to(tl.float32)"
    if compute_dtype(src) == dst:
        return x
    return f"{x}.to({TL_DTYPE[dst]})"


REDUCE_COMBINE = {"sum": "_add", "prod": "_mul", "amax": "_nanmax", "amin": "_nanmin", "xor_sum": "_xor"}


def reduce_identity(op: str, dtype: torch.dtype) -> str:
    if op in ("sum", "xor_sum"):
        return literal(0, dtype)
    if op == "prod":
        return literal(1, dtype)
    if dtype in FLOATS:
        return literal(float("-inf") if op == "amax" else float("inf"), dtype)
    info = torch.iinfo(dtype)
    return str(info.min if op == "amax" else info.max)
