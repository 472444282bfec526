"""Tier 1: the index simplifier cancels reshape pairs and keeps what it cannot prove."""
from stitchml.ir import index as ix


def _vars(*sizes, axis="row"):
    return tuple(ix.var(f"v{i}", s, axis) for i, s in enumerate(sizes))


def test_flatten_then_unravel_cancels():
    idx = _vars(4, 6, 8)
    assert ix.unravel(ix.flatten(idx, (4, 6, 8)), (4, 6, 8)) == idx


def test_merge_leading_dims():
    b, t, c = _vars(4, 6, 8)
    j0, j1 = ix.unravel(ix.flatten((b, t, c), (4, 6, 8)), (24, 8))
    assert ix.render(j0) == "v0 * 6 + v1" and j1 == c


def test_split_dims_keeps_div_and_mod():
    j0, j1 = _vars(24, 8)
    b, t, c = ix.unravel(ix.flatten((j0, j1), (24, 8)), (4, 6, 8))
    assert ix.render(b) == "((v0) // 6)" and ix.render(t) == "((v0) % 6)" and c == j1


def test_bounds_and_axes():
    r = ix.var("r", 10, "row")
    c = ix.var("c", 7, "col")
    e = r * 7 + c + 3
    assert ix.bounds(e) == (3, 72)
    assert ix.axes(e) == frozenset({"row", "col"})
    assert ix.axes(ix.floordiv(e - 3, 7)) == frozenset({"row"})
    assert ix.floordiv(e - 3, 7) == r


def test_mod_of_a_multiple_drops_the_term():
    r, c = _vars(10, 7)
    assert ix.mod(r * 7 + c, 7) == c
    # not provable: stays a modulo atom
    assert "%" in ix.render(ix.mod(r + c, 7))


def test_size_one_axes_are_constant_zero():
    assert ix.var("x", 1, "row") == ix.const(0)


def _evaluate(e: ix.Expr, env: dict) -> int:
    """Python's floor semantics (every value here is >= 0, where truncation agrees)."""
    total = e.const
    for a, k in e.terms:
        if isinstance(a, ix.Var):
            v = env[a.name]
        elif isinstance(a, ix.Div):
            v = _evaluate(a.expr, env) // a.d
        else:
            v = _evaluate(a.expr, env) % a.m
        total += k * v
    return total


def test_unravel_then_flatten_gives_the_index_back():
    """A reshape of a reshape back to the first shape (a scan read through views): the
    multiples of a divisor leave a division, and (e // m) * m + e % m folds to e."""
    import itertools
    import random
    rng = random.Random(3)
    for _ in range(40):
        shape = tuple(rng.randint(1, 6) for _ in range(rng.randint(2, 4)))
        n = 1
        for s in shape:
            n *= s
        cols = rng.choice([d for d in range(1, n + 1) if n % d == 0])
        r, c = ix.var("r", n // cols, "row"), ix.var("c", cols, "col")
        e = r * cols + c
        u = ix.unravel(e, shape)
        suffixes = {1}
        for s in reversed(shape):
            suffixes.add(max(suffixes) * s)
        if cols in suffixes:   # columns = trailing dims: the round trip is provable
            assert ix.flatten(u, shape) == e, (shape, cols, ix.render(ix.flatten(u, shape)))
        # and every simplified component still addresses what plain arithmetic does
        for rv, cv in itertools.product(range(n // cols), range(cols)):
            flat, env = rv * cols + cv, {"r": rv, "c": cv}
            want = []
            for s in reversed(shape):
                want.append(flat % s)
                flat //= s
            assert [_evaluate(x, env) for x in u] == want[::-1]


def test_a_division_keeps_what_it_cannot_prove():
    r, c = _vars(10, 7)
    # r*15 + c with c up to 6: // 5 splits into 3r + c // 5 (c >= 0); a negative part stays whole
    assert ix.render(ix.floordiv(r * 15 + c, 5)) == "((v1) // 5) + v0 * 3"
    assert "//" in ix.render(ix.floordiv(r * 15 - c, 5)) and "v0 * 3" not in ix.render(ix.floordiv(r * 15 - c, 5))


def test_an_unaligned_split_of_nested_strides_flattens_back():
    """A channels-last batch [32, 56, 56, C] viewed as chunks of rows [1024, 98, C]
    (batch-norm chunk statistics): row f = 98 k + j of the chunk view sits at n = f // 3136,
    which the simplifier writes k // 32, h = (f // 56) % 56 and w = f % 56; the address
    n * 56*56*C + h * 56*C + w * C is f * C, one multiply-add an element, not two
    divisions and two modulos (`index._simplified_partner`)."""
    k, j = _vars(1024, 98)
    f = ix.flatten((k, j), (1024, 98))
    n, h, w = ix.unravel(f, (32, 56, 56))
    assert ix.render(n) == "((v0) // 32)"
    off = ix.offset((n, h, w), (56 * 56 * 256, 56 * 256, 256))
    assert off == f * 256, ix.render(off)
    for kv, jv in ((0, 0), (31, 97), (32, 0), (517, 45), (1023, 97)):
        assert _evaluate(off, {"v0": kv, "v1": jv}) == (98 * kv + jv) * 256
