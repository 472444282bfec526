"""Fit the Chebyshev tables behind the Bessel J/Y/K and Airy kernels (issue 19: op_db's
special functions ran eagerly for "no lowering rule") and write them to
`codegen/special_fits.py`.

Each table is a function of s in [-1, 1] that is smooth there (the logarithmic and
oscillating parts of the Bessel functions are taken out analytically first, see
`codegen/special_bessel.py`), sampled at 80 Chebyshev nodes with mpmath at 40 digits;
its series is cut where the remaining terms are below 2e-17 of the largest one.  Run
`python -m stitchml.tools.fit_special` to regenerate (a few seconds); the kernels are
checked against mpmath itself in tests/test_coverage_bessel.py.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Callable

import mpmath as mp

NODES = 80
CUT = 2e-17


def chebyshev(f: Callable, n: int = NODES) -> list:
    """Coefficients c_k with f(s) = c_0 + sum_k c_k T_k(s) on [-1, 1] (discrete cosine
    transform of f at the n first-kind nodes: the ends, where several tables have a
    removable singularity, are never evaluated)."""
    theta = [mp.pi * (j + mp.mpf(1) / 2) / n for j in range(n)]
    vals = [f(mp.cos(t)) for t in theta]
    cs = [mp.fsum(v * mp.cos(k * t) for v, t in zip(vals, theta)) * 2 / n for k in range(n)]
    cs[0] /= 2
    return cs


def cut(cs: list) -> list[float]:
    top = max(abs(c) for c in cs)
    m = len(cs)
    while m > 1 and abs(cs[m - 1]) < CUT * top:
        m -= 1
    if m == len(cs):
        raise ValueError("series did not converge within the nodes")
    return [float(c) for c in cs[:m]]


def tables() -> dict[str, tuple[str, list[float]]]:
    """name -> (what the table holds, as a function of s, coefficients)."""
    pi = mp.pi
    j, y, i, k = mp.besselj, mp.bessely, mp.besseli, mp.besselk

    def small(s):  # x in (0, 8]: y = x^2 = 32 (s + 1)
        return mp.sqrt(32 * (s + 1))

    def large(s):  # x in [8, inf): t = 64 / x^2 = (s + 1) / 2
        return 8 / mp.sqrt((s + 1) / 2)

    def pq(nu: int, part: str):
        def f(s):
            x = large(s)
            chi = x - (2 * nu + 1) * pi / 4
            a = mp.sqrt(pi * x / 2)
            jj, yy = j(nu, x), y(nu, x)
            if part == "p":
                return a * (jj * mp.cos(chi) + yy * mp.sin(chi))
            return x * a * (yy * mp.cos(chi) - jj * mp.sin(chi))
        return f

    def ksmall(s):  # x in (0, 2]: y = x^2 = 2 (s + 1)
        return mp.sqrt(2 * (s + 1))

    def klarge(s):  # x in [2, inf): t = 2 / x = (s + 1) / 2
        return 4 / (s + 1)

    zeta0 = mp.mpf(2) / 3 * mp.mpf(2) ** 1.5  # zeta at |x| = 2

    def airy_far(s):  # |x| in [2, inf): t = zeta0 / zeta = (s + 1) / 2
        zeta = 2 * zeta0 / (s + 1)
        return (3 * zeta / 2) ** (mp.mpf(2) / 3), zeta

    def ai_pos(s):
        x, zeta = airy_far(s)
        return mp.airyai(x) * 2 * mp.sqrt(pi) * x ** 0.25 * mp.exp(zeta)

    def ai_neg(part: str):
        def f(s):
            z, zeta = airy_far(s)
            phi = zeta + pi / 4
            a, b = mp.airyai(-z), mp.airybi(-z)
            c = mp.sqrt(pi) * z ** 0.25
            return c * (a * mp.sin(phi) + b * mp.cos(phi)) if part == "p" else c * (b * mp.sin(phi) - a * mp.cos(phi))
        return f

    spec = {
        "j0_small": ("J0(x), y = x^2 = 32 (s + 1)", lambda s: j(0, small(s))),
        "y0_small": ("Y0(x) - (2/pi) log(x) J0(x), y = 32 (s + 1)",
                     lambda s: (lambda x: y(0, x) - 2 / pi * mp.log(x) * j(0, x))(small(s))),
        "j1_small": ("J1(x) / x, y = 32 (s + 1)", lambda s: (lambda x: j(1, x) / x)(small(s))),
        "y1_small": ("(Y1(x) - (2/pi) (log(x) J1(x) - 1/x)) / x, y = 32 (s + 1)",
                     lambda s: (lambda x: (y(1, x) - 2 / pi * (mp.log(x) * j(1, x) - 1 / x)) / x)(small(s))),
        "p0_large": ("Hankel P0(x), x = 8 / sqrt((s + 1) / 2)", pq(0, "p")),
        "q0_large": ("x Q0(x)", pq(0, "q")),
        "p1_large": ("Hankel P1(x)", pq(1, "p")),
        "q1_large": ("x Q1(x)", pq(1, "q")),
        "i0_small": ("I0(x), y = x^2 = 2 (s + 1)", lambda s: i(0, ksmall(s))),
        "k0_small": ("K0(x) + log(x) I0(x), y = 2 (s + 1)",
                     lambda s: (lambda x: k(0, x) + mp.log(x) * i(0, x))(ksmall(s))),
        "i1_small": ("I1(x) / x, y = 2 (s + 1)", lambda s: (lambda x: i(1, x) / x)(ksmall(s))),
        "k1_small": ("(K1(x) - 1/x - log(x) I1(x)) / x, y = 2 (s + 1)",
                     lambda s: (lambda x: (k(1, x) - 1 / x - mp.log(x) * i(1, x)) / x)(ksmall(s))),
        "k0_large": ("K0(x) e^x sqrt(2x/pi), x = 4 / (s + 1)",
                     lambda s: (lambda x: k(0, x) * mp.exp(x) * mp.sqrt(2 * x / pi))(klarge(s))),
        "k1_large": ("K1(x) e^x sqrt(2x/pi), x = 4 / (s + 1)",
                     lambda s: (lambda x: k(1, x) * mp.exp(x) * mp.sqrt(2 * x / pi))(klarge(s))),
        "ai_mid": ("Ai(x), x = 2 s", lambda s: mp.airyai(2 * s)),
        "ai_pos": ("Ai(x) 2 sqrt(pi) x^(1/4) e^zeta, zeta = 2/3 x^(3/2) = 2 zeta(2) / (s + 1)", ai_pos),
        "ai_neg_p": ("sqrt(pi) z^(1/4) (Ai(-z) sin(phi) + Bi(-z) cos(phi)), phi = zeta + pi/4", ai_neg("p")),
        "ai_neg_q": ("sqrt(pi) z^(1/4) (Bi(-z) sin(phi) - Ai(-z) cos(phi))", ai_neg("q")),
    }
    return {name: (what, cut(chebyshev(f))) for name, (what, f) in spec.items()}


def render(fits: dict[str, tuple[str, list[float]]]) -> str:
    lines = ['"""Chebyshev tables of the Bessel J/Y/K and Airy kernels (codegen/special_bessel.py):',
             "each is sum c_k T_k(s) over s in [-1, 1], the comment says of what.",
             "", "Generated by `python -m stitchml.tools.fit_special` (mpmath, 40 digits); do not edit.",
             '"""', "", "FITS: dict[str, tuple[float, ...]] = {"]
    for name, (what, cs) in fits.items():
        lines.append(f"    # {what}")
        lines.append(f'    "{name}": (')
        for c in cs:
            lines.append(f"        {c!r},")
        lines.append("    ),")
    lines.append("}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent.parent / "codegen" / "special_fits.py")
    args = ap.parse_args(argv)
    mp.mp.dps = 40
    fits = tables()
    args.out.write_text(render(fits))
    print(f"wrote {args.out.name}: " + ", ".join(f"{n} {len(cs)}" for n, (_, cs) in fits.items()))


if __name__ == "__main__":
    main()
