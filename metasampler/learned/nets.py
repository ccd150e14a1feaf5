"""Per-coordinate MLPs with derivatives with respect to their scalar inputs.

NNSGHMC's ``f_phiQ(U, p_i)`` and ``f_phiD(U, p_i, g_i)`` are tiny MLPs applied to every
coordinate ``i`` with shared weights, so one trained sampler runs on any dimension.

Inputs are passed as a list of tensors, one per input feature, each broadcastable to the
common ``(K, D)`` shape: the energy is per chain (``(K, 1)``), momentum and gradient are per
coordinate (``(K, D)``).

The complete recipe's ``Gamma`` needs ``d f / d x_f`` for some scalar inputs ``x_f``. They
are computed by the network's own chain rule (forward-mode tangents that share the
activations of the forward pass), an ordinary differentiable expression of the weights, so
meta-training back-propagates through it.

:func:`coordinate_mlp` is the one definition of the net. Hidden units sit on a *leading*
axis (``(H, K, D)``), so every operation is element-wise over the coordinates or a sum over
that axis: eager mode evaluates it on blocks of coordinates that stay in cache, and
``torch.compile`` fuses it into one loop over the coordinates.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

__all__ = ["CoordinateMLP", "coordinate_mlp", "NetParams", "ACTIVATIONS", "OUTPUTS"]

ACTIVATIONS = ("tanh", "relu", "sigmoid", "softplus", "softsign", "quadsat")
OUTPUTS = ("identity", "softplus", "abs")
#: ``(((W_1, b_1), ..., (W_L, b_L)), (w_out, b_out))``: hidden layers, then the head's weight
#: row ``(H_L,)`` and scalar bias.
NetParams = tuple[tuple[tuple[Tensor, Tensor], ...], tuple[Tensor, Tensor]]
# Compiled for sampling, one-layer nets up to this width are evaluated unit by unit (one fused
# loop, no (H, K, D) activation stored). The build time grows with the width (40 units: ~3 min
# against ~1 for 10), but it runs in a child process while eager steps go on
# (metasampler.learned.aot), so only wider nets keep the units as one axis.
UNROLL_MAX_HIDDEN = 64

# Eigen's rational approximation of tanh on float32 (``ptanh_float``): relative error within a
# few ulp everywhere, also near 0. Inductor's own vectorised tanh is about 4x slower than this
# (and than MKL's, which eager mode uses), so compiled code uses it for float32.
_TANH_CLIP = 7.90531110763549805
_TANH_NUM = (
    4.89352455891786e-03,
    6.37261928875436e-04,
    1.48572235717979e-05,
    5.12229709037114e-08,
    -8.60467152213735e-11,
    2.00018790482477e-13,
    -2.76076847742355e-16,
)
_TANH_DEN = (4.89352518554385e-03, 2.26843463243900e-03, 1.18534705686654e-04, 1.19825839466702e-06)


def tanh_rational_parts(x: Tensor) -> tuple[Tensor, Tensor]:
    """Numerator and denominator of :func:`tanh_rational` (the denominator lies in
    ``[4.9e-3, 0.91]``)."""
    x = x.clamp(-_TANH_CLIP, _TANH_CLIP)
    x2 = x * x
    num = x2 * _TANH_NUM[6] + _TANH_NUM[5]
    for coef in _TANH_NUM[4::-1]:
        num = num * x2 + coef
    den = x2 * _TANH_DEN[3] + _TANH_DEN[2]
    for coef in _TANH_DEN[1::-1]:
        den = den * x2 + coef
    return x * num, den


def tanh_rational(x: Tensor) -> Tensor:
    """``tanh(x)`` for float32 from mul/add/div only (a few ulp; odd, exact 0 at 0)."""
    num, den = tanh_rational_parts(x)
    return num / den


# log1p(e) = 2 atanh(s) with s = e / (2 + e) in [0, 1/3] for e in [0, 1]: the odd series of
# atanh to s^15 (coefficients 1 / (2k + 1)) leaves a relative error below 2e-9.
_ATANH_SERIES = tuple(1.0 / (2 * k + 1) for k in range(8))


def softplus_fused(x: Tensor, slope: bool) -> tuple[Tensor, Tensor | None]:
    """``softplus(x)`` and (if ``slope``) ``sigmoid(x)`` from one ``exp(-|x|)``, mul/add/div.

    Compiled code uses it for float32: inductor's vectorised ``log1p`` and ``exp`` made
    the softplus of ``f_phiD`` and the sigmoid of its derivative cost ~1.8 ms per 670,000
    coordinates on the shipped CPU, against ~0.9 ms for this. Sampling only: autograd would
    give it the derivative 1 at exactly 0 (meta-training keeps torch's softplus).
    """
    magnitude = x.abs()
    e = torch.exp(-magnitude)
    s = e / (e + 2.0)
    s2 = s * s
    series = s2 * _ATANH_SERIES[7] + _ATANH_SERIES[6]
    for coef in _ATANH_SERIES[5::-1]:
        series = series * s2 + coef
    value = x.clamp_min(0.0) + 2.0 * s * series
    return value, torch.where(x >= 0, 1.0, e) / (e + 1.0) if slope else None


def _softplus(x: Tensor, slope: bool) -> tuple[Tensor, Tensor | None]:
    """``softplus`` and its derivative: :func:`softplus_fused` when compiled for float32
    sampling (no autograd)."""
    if torch.compiler.is_compiling() and not torch.is_grad_enabled() and x.dtype == torch.float32:
        return softplus_fused(x, slope)
    return nn.functional.softplus(x), torch.sigmoid(x) if slope else None


def _activate(name: str, a: Tensor, slope: bool) -> tuple[Tensor, Tensor | None]:
    """Activation value and (if ``slope``) its derivative at pre-activation ``a``."""
    if name == "tanh":
        fused = torch.compiler.is_compiling() and a.dtype == torch.float32
        y = tanh_rational(a) if fused else torch.tanh(a)
        return y, (1.0 - y * y) if slope else None
    if name == "relu":
        return torch.relu(a), (a > 0).to(a.dtype) if slope else None
    if name == "sigmoid":
        y = torch.sigmoid(a)
        return y, y * (1.0 - y) if slope else None
    if name == "softplus":
        return _softplus(a, slope)
    if name == "softsign":  # a / (1 + |a|): tanh's shape from one division
        r = torch.reciprocal(a.abs() + 1.0)  # (1 / x compiles to a reciprocal times 1)
        return a * r, r * r if slope else None
    if name == "quadsat":  # c (1 - |c| / 4), c = clamp(a, -2, 2): bounded, C1, no division
        c = a.clamp(-2.0, 2.0)
        m = c.abs()
        return c * (1.0 - 0.25 * m), (1.0 - 0.5 * m) if slope else None
    raise ValueError(f"activation must be one of {ACTIVATIONS}, got {name!r}")


def coordinate_mlp(
    params: NetParams,
    inputs: Sequence[Tensor],
    activation: str,
    output: str,
    derivatives: Sequence[int] = (),
) -> tuple[Tensor, list[Tensor]]:
    """A scalar MLP applied element-wise, with derivatives with respect to chosen inputs.

    Args:
        params: the weights (:attr:`NetParams`).
        inputs: ``F`` tensors broadcastable to a common shape ``S`` (e.g. ``(K, 1)`` and
            ``(K, D)``).
        activation: hidden activation (``ACTIVATIONS``); output: ``OUTPUTS``.
        derivatives: indices ``f`` of inputs to differentiate with respect to.

    Returns:
        ``(value, [d value / d inputs[f] for f in derivatives])``, each of shape ``S``.
    """
    layers, (w_out, b_out) = params
    ndim = max(x.ndim for x in inputs)

    def column(w: Tensor) -> Tensor:  # (G,) -> (G, 1, ..., 1): broadcasts over coordinates
        return w.reshape(w.shape + (1,) * ndim)

    slope = len(derivatives) > 0
    weight, bias = layers[0]
    # Hidden units of a one-layer net are taken all at once in eager mode (few large
    # operations, the units on a leading axis), one by one when compiled for sampling, where
    # that turns the net into (K, D) element-wise operations that inductor fuses into one loop
    # without storing any (H, K, D) activation. Same sums, only the order of the loop differs.
    # Unrolled, each unit's weights are 0-d tensors (one `unbind`, not a slice and a reshape
    # per weight and unit: half the graph that a package build traces). Compiled with
    # autograd (meta-training) the units stay one axis: unrolled, the joint graph compiled far
    # slower (10 units: 637 s with a job on the other core, against 99 s idle) for a step
    # about 10 % faster.
    unroll = (
        torch.compiler.is_compiling()
        and not torch.is_grad_enabled()
        and len(layers) == 1
        and weight.shape[0] <= UNROLL_MAX_HIDDEN
    )
    if unroll:
        units = zip(bias.unbind(0), weight.unbind(0), w_out.unbind(0), strict=True)
        groups = [(b, w.unbind(0), o) for b, w, o in units]
    else:
        groups = [(column(bias), [column(w) for w in weight.unbind(1)], column(w_out))]

    def over_units(t: Tensor) -> Tensor:
        return t if unroll else t.sum(0)

    value: Tensor | float = b_out
    grads: list[Tensor | float] = [0.0 for _ in derivatives]
    for b, w, o in groups:
        a = b
        for w_f, x in zip(w, inputs, strict=True):
            a = a + w_f * x
        h, s = _activate(activation, a, slope)
        if len(layers) == 1:
            # d value / d x_f = sum_j w_out_j s_j W_jf: the weights' product is taken once
            # (a scalar per unit), one (K, D) product fewer per unit and derivative.
            value = value + over_units(h * o)
            grads = [
                total + over_units(s * (w[f] * o))
                for total, f in zip(grads, derivatives, strict=True)
            ]
            continue
        tangents = [s * w[f] for f in derivatives]
        for deeper, deeper_bias in layers[1:]:  # (H', H) x (H, ...) -> (H', ...)
            h, s = _activate(activation, torch.tensordot(deeper, h, 1) + column(deeper_bias), slope)
            tangents = [s * torch.tensordot(deeper, t, 1) for t in tangents]
        value = value + (h * o).sum(0)
        grads = [total + (t * o).sum(0) for total, t in zip(grads, tangents, strict=True)]
    if output == "softplus":
        value, sigmoid = _softplus(value, slope)
        grads = [sigmoid * g for g in grads]
    elif output == "abs":
        if slope:
            grads = [torch.sign(value) * g for g in grads]
        value = value.abs()
    elif output != "identity":
        raise ValueError(f"output must be one of {OUTPUTS}, got {output!r}")
    return value, grads


class CoordinateMLP(nn.Module):
    """A scalar MLP ``R^F -> R`` applied element-wise over a ``(K, D)`` grid of coordinates.

    Args:
        in_features: number of scalar inputs ``F``.
        hidden: widths of the hidden layers (at least one).
        activation: one of ``ACTIVATIONS``.
        output: output transform: ``"identity"``, ``"softplus"`` or ``"abs"`` (the last two
            make the output non-negative, as ``f_phiD`` must be).
    """

    def __init__(
        self,
        in_features: int,
        hidden: Sequence[int] = (40,),
        activation: str = "softsign",
        output: str = "identity",
    ) -> None:
        super().__init__()
        hidden = list(hidden)
        if in_features < 1:
            raise ValueError(f"in_features must be >= 1, got {in_features!r}")
        if not hidden or any(int(h) != h or h < 1 for h in hidden):
            raise ValueError(f"hidden must be a non-empty list of positive ints, got {hidden!r}")
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
        if output not in OUTPUTS:
            raise ValueError(f"output must be one of {OUTPUTS}, got {output!r}")
        self.in_features = in_features
        self.hidden = hidden
        self.activation = activation
        self.output = output
        widths = [in_features, *hidden]
        self.layers = nn.ModuleList(
            nn.Linear(a, b) for a, b in zip(widths[:-1], widths[1:], strict=True)
        )
        self.head = nn.Linear(widths[-1], 1)

    def params(self, dtype: torch.dtype | None = None) -> NetParams:
        """The weights as :func:`coordinate_mlp` takes them (cast to ``dtype`` if given)."""

        def cast(w: Tensor) -> Tensor:
            return w if dtype is None else w.to(dtype)

        layers = tuple((cast(layer.weight), cast(layer.bias)) for layer in self.layers)
        return layers, (cast(self.head.weight[0]), cast(self.head.bias[0]))

    def forward(
        self, inputs: Sequence[Tensor], derivatives: Sequence[int] = ()
    ) -> tuple[Tensor, list[Tensor]]:
        """:func:`coordinate_mlp` with this net's weights."""
        if len(inputs) != self.in_features:
            raise ValueError(f"expected {self.in_features} inputs, got {len(inputs)}")
        return coordinate_mlp(self.params(), inputs, self.activation, self.output, derivatives)

    def reset_parameters(self, generator: torch.Generator | None = None, gain: float = 1.0) -> None:
        """Re-draw weights ``U(-gain/sqrt(fan_in), gain/sqrt(fan_in))``, biases likewise."""
        with torch.no_grad():
            for layer in [*self.layers, self.head]:
                bound = gain / math.sqrt(layer.in_features)
                for p in (layer.weight, layer.bias):
                    p.copy_(
                        (torch.rand(p.shape, generator=generator, dtype=p.dtype) * 2 - 1) * bound
                    )

    def extra_repr(self) -> str:
        return f"hidden={self.hidden}, activation={self.activation}, output={self.output}"
