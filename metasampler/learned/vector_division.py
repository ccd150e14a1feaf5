"""Float divisions of the compiled step from the CPU's reciprocal estimate (AVX-512 only).

In the compiled NNSGHMC step every hidden unit of every net evaluation divides once
(softsign's ``1 / (1 + |a|)``, the rational tanh's ``p(a) / q(a)``), and AVX-512's
division is slow (one port): with 40-unit softsign nets on a 784-40-40-10 MLP the fused loop
took 29.9 -> 23.9 ms (exact Gamma, 120 divisions per vector) and 36.2 -> 25.7 ms (finite
differences) when each division became ``rcp14`` (a 14-bit estimate) and one Newton step
(``research/BENCHMARKS_HISTORY.md``). Steps with a per-step friction need it too: their
scalar ``1 / eta`` would otherwise make every such build fall back to exact division. That is
what :func:`fast_float_division` makes inductor write, for 16-float vectors only: other vector
widths, other dtypes and scalar code keep the exact division.

The result is within about 2 ulp of the correctly rounded quotient for divisors whose
reciprocal is a normal float. Unlike a division it is NaN for a divisor of 0 or ±inf; every
divisor of the step is bounded away from both (``1 + |a|``, the rational tanh's positive
denominator, the softplus's ``e + 2`` and ``e + 1``, the secants' guarded differences), and a
chain whose pre-activations overflow is non-finite either way.

Only the child process that builds a package applies this (:func:`metasampler.learned.aot.build`),
and a build that fails with it is retried without it.
"""

from __future__ import annotations

import contextlib
from unittest import mock

# 1 / v: the 14-bit estimate r, then r + r (1 - v r) (one Newton step: ~28 bits before rounding).
_NEWTON = (
    "__m512 v_ = {v}; __m512 r_ = _mm512_rcp14_ps(v_); "
    "r_ = _mm512_fmadd_ps(r_, _mm512_fnmadd_ps(v_, r_, _mm512_set1_ps(1.0f)), r_);"
)
# A generic lambda called in place: the AVX-512 branch is instantiated only for a 64-byte
# Vectorized<float> (a build for another ISA discards it), anything else divides as before.
_IS_ZMM_FLOAT = "std::is_same_v<decltype({x}), at::vec::Vectorized<float>> && sizeof({x}) == 64"
_RECIPROCAL = (
    "([](auto x_) {{ if constexpr ({test}) {{ {newton} return decltype(x_)(r_); }} "
    "else {{ return x_.reciprocal(); }} }})({a})"
)
_TRUEDIV = (
    "([](auto n_, auto d_) {{ if constexpr ({test} && std::is_same_v<decltype(n_), "
    "decltype(d_)>) {{ {newton} return decltype(d_)(_mm512_mul_ps(n_, r_)); }} "
    "else {{ return n_ / d_; }} }})({a}, {b})"
)


# The two functions keep the names of the ops they replace: where every input of an op is a
# scalar (e.g. ``1 / eta``), inductor calls the scalar op of the same ``__name__``.
def reciprocal(a: str) -> str:
    """C++ for ``1 / a`` of a vector expression ``a`` (see the module docstring)."""
    test = _IS_ZMM_FLOAT.format(x="x_")
    return _RECIPROCAL.format(test=test, newton=_NEWTON.format(v="x_"), a=a)


def truediv(a: str, b: str) -> str:
    """C++ for ``a / b`` of vector expressions (see the module docstring)."""
    test = _IS_ZMM_FLOAT.format(x="d_")
    return _TRUEDIV.format(test=test, newton=_NEWTON.format(v="d_"), a=a, b=b)


def fast_float_division() -> contextlib.AbstractContextManager:
    """Within the block, inductor's C++ vector code divides floats as this module says (a
    no-op on a torch whose code generator lacks the hooks)."""
    try:
        from torch._inductor.codegen.cpp import CppVecOverrides
    except ImportError:
        return contextlib.nullcontext()
    if not {"reciprocal", "truediv"} <= CppVecOverrides.__dict__.keys():
        return contextlib.nullcontext()
    return mock.patch.multiple(
        CppVecOverrides, reciprocal=staticmethod(reciprocal), truediv=staticmethod(truediv)
    )
