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
