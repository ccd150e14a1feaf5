"""Bayesian neural networks as targets: an ``nn.Module`` and a dataset become a minibatch energy.

For ``N`` data points ``(x_n, y_n)``, a likelihood ``p(y | x, theta)`` given by the module's
outputs and the prior ``p(theta) = N(0, prior_std^2 I)`` (docs/METHOD.md §1)::

    U(theta) = -sum_n log p(y_n | x_n, theta) - log p(theta)
    Ũ(theta) = -(N / M) sum_m log p(y_m | x_m, theta) - log p(theta)     (minibatch of M)
    -log p(theta) = ||theta||^2 / (2 prior_std^2)   (+ D/2 log(2 pi prior_std^2), omitted)

``theta`` is the flat vector of all the module's parameters, in ``module.named_parameters()``
order (the order of ``torch.nn.utils.parameters_to_vector``). ``K`` chains are evaluated at
once: :func:`torch.func.functional_call` is vmapped over the rows of a ``(K, D)`` tensor
(for a module ``vmap`` has no batching rule for, such as ``nn.GRU``, ``nn.LSTM`` and
``nn.RNN``, chain by chain: the same numbers, ``K`` calls), with the minibatch shared by all
chains; the likelihood part of ``grad Ũ`` is obtained by one reverse-mode pass through its
sum over chains (chains are independent, so this is every chain's gradient) and the prior's
``theta / prior_std^2`` is added in closed form.

Conventions:

* **Minibatches.** Each :meth:`BayesianModel.evaluate` call draws one minibatch, shared by all
  chains, without replacement: ``torch.randperm(N, generator=generator)[:M]``. Nothing is
  stored between calls (no epochs), so a run is reproducible from the generator alone.
  ``batch_size=None`` (or ``M = N``) uses the full data set and draws no random numbers.
* **Buffers are not sampled.** Buffers (e.g. BatchNorm running statistics) are held fixed at
  the module's values. The module is deep-copied and put in ``eval()`` mode (dropout off,
  BatchNorm uses its stored statistics), so the forward pass is a deterministic function
  of ``(theta, x)``; the module passed in is not modified.
* **Every parameter is sampled**, including ones with ``requires_grad=False``. Parameters
  must be floating point. Tied parameters appear once.

The flat layout is :mod:`metasampler.flat_params`, the likelihoods
:mod:`metasampler.likelihoods` (both re-exported here).
"""

from __future__ import annotations

import copy
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, vmap
from torch.utils.data import TensorDataset

from .devices import check_device
from .flat_params import ParamSpec, assign_params, flatten_params, unflatten_params
from .likelihoods import (
    LogLik,
    bernoulli_frame_log_lik,
    bernoulli_log_lik,
    bernoulli_sequence_log_lik,
    categorical_log_lik,
    gaussian_log_lik,
)
from .targets import Evaluation, check_positions, energy_and_grad

__all__ = [
    "BayesianModel",
    "ParamSpec",
    "Predictive",
    "assign_params",
    "flatten_params",
    "unflatten_params",
    "categorical_log_lik",
    "gaussian_log_lik",
    "bernoulli_log_lik",
    "bernoulli_frame_log_lik",
    "bernoulli_sequence_log_lik",
]


#: The built-in likelihoods whose outputs are Bernoulli logits.
_BERNOULLI = ("bernoulli", "bernoulli_sequence")


@dataclass(frozen=True)
class Predictive:
    """Posterior-predictive summary of a :class:`BayesianModel` on inputs ``x`` (``B`` rows).

    A draw's *prediction* is what its network outputs mean for ``y``: class probabilities
    ``softmax(outputs)`` for the categorical likelihood, ``sigmoid(outputs)`` for the
    Bernoulli ones, the mean ``outputs`` for the gaussian one and the raw outputs for a
    custom likelihood.

    :meth:`nll` scores observed targets under the posterior predictive of every built-in
    likelihood; :meth:`accuracy` applies to the classifiers (categorical and Bernoulli).

    Attributes:
        draws: ``(S, K, B, ...)`` the prediction of every kept sample of every chain.
        mean: ``(B, ...)`` the posterior-predictive mean: ``draws`` averaged over samples and
            chains (for classification, the predictive class probabilities).
        std: ``(B, ...)`` the standard deviation of ``draws`` over samples and chains (the
            spread due to parameter uncertainty; for regression add ``noise_std**2`` to its
            square for the predictive variance of a new ``y``).
        entropy: ``(B,)`` entropy of the predictive class probabilities (categorical only,
            else ``None``): 0 for a certain prediction, ``log C`` for a uniform one.
        likelihood: the model's built-in likelihood (``"categorical"``, ``"gaussian"``,
            ``"bernoulli"`` or ``"bernoulli_sequence"``); ``None`` for a custom one (then
            ``"categorical"`` is assumed where ``entropy`` is given).
        noise_std: the gaussian likelihood's observation noise (``None`` otherwise).
        logits: ``(S, K, B, ...)`` the raw outputs of every draw for the Bernoulli
            likelihoods, else ``None``: :meth:`nll` uses them, since a float32 probability
            rounds to 1 beyond a logit of about 17 (without them it uses ``draws``).
    """

    draws: Tensor
    mean: Tensor
    std: Tensor
    entropy: Tensor | None
    likelihood: str | None = None
    noise_std: float | None = None
    logits: Tensor | None = None

    @property
    def kind(self) -> str | None:
        """The likelihood the predictions are of (see ``likelihood``)."""
        if self.likelihood is not None:
            return self.likelihood
        return "categorical" if self.entropy is not None else None

    def accuracy(self, y: Tensor) -> float:
        """Fraction of targets predicted right by the posterior-predictive mean.

        Categorical: rows whose most probable class (``mean.argmax(-1)``) equals the label
        ``y``. Bernoulli: 0/1 targets where ``mean > 0.5`` says the same (padding frames of a
        sequence, marked ``-1``, are left out).

        Raises:
            ValueError: ``y`` does not fit the predictions (the message says how), or the
                likelihood is not a classifier's (gaussian or custom: use :meth:`nll`).
        """
        kind = self.kind
        if kind == "categorical":
            y = self._labels(y)
            return float((self.mean.argmax(-1) == y).double().mean())
        if kind in _BERNOULLI:
            y, valid = self._binary_targets(y)
            right = (self.mean.reshape(y.shape) > 0.5) == (y > 0.5)
            return float(right[valid].double().mean())
        raise ValueError(
            f"accuracy needs a classifier's predictions (categorical or Bernoulli likelihood); "
            f"these are of the {kind or 'custom'} likelihood: score them with nll(y)"
        )

    def nll(self, y: Tensor) -> float:
        """The negative log posterior-predictive probability (density) of the observed
        targets, in nats, averaged over them: the score a step-size tuning minimises on
        validation data (README "Use it on your own model").

        The posterior predictive is the mixture over the ``N = S * K`` draws:

        * categorical: ``-log mean[row, y_row]``, averaged over rows; a probability that
          underflowed to 0 counts as the dtype's smallest positive number;
        * Bernoulli: ``-log (1/N) sum_n p_n(y)`` for each 0/1 target, with
          ``p_n(1) = sigmoid(logit_n)``, computed as a ``logsumexp`` of log-sigmoids (padding
          frames of a sequence, marked ``-1``, are left out);
        * gaussian: ``-log (1/N) sum_n N(y; mean_n, noise_std^2)`` for each target value (a
          ``logsumexp`` over draws).

        Raises:
            ValueError: ``y`` does not fit the predictions (the message says how), or the
                likelihood is custom (its predictive is unknown here).
        """
        kind = self.kind
        if kind == "categorical":
            picked = self.mean.gather(-1, self._labels(y).unsqueeze(-1)).squeeze(-1)
            return float(-picked.clamp_min(torch.finfo(picked.dtype).tiny).log().double().mean())
        n_draws = self.draws.shape[0] * self.draws.shape[1]
        if kind in _BERNOULLI:
            y, valid = self._binary_targets(y)
            positive = y > 0.5
            if self.logits is not None:
                logits = self.logits.flatten(0, 1).reshape(n_draws, *y.shape).double()
                log_p = F.logsigmoid(torch.where(positive, logits, -logits))
            else:
                probs = self.draws.flatten(0, 1).reshape(n_draws, *y.shape).double()
                picked = torch.where(positive, probs, 1.0 - probs)
                log_p = picked.clamp_min(torch.finfo(self.draws.dtype).tiny).log()
            per_target = torch.logsumexp(log_p, 0) - math.log(n_draws)
            return float(-per_target[valid].mean())
        if kind == "gaussian":
            if self.noise_std is None:
                raise ValueError("a gaussian Predictive needs its noise_std to score targets")
            y = self._real_targets(y)
            means = self.draws.flatten(0, 1).reshape(n_draws, *y.shape).double()
            z = (y.double() - means) / self.noise_std
            log_p = -0.5 * z * z - math.log(self.noise_std) - 0.5 * math.log(2 * math.pi)
            return float(-(torch.logsumexp(log_p, 0) - math.log(n_draws)).mean())
        raise ValueError(
            "nll needs a built-in likelihood (categorical, bernoulli, bernoulli_sequence or "
            "gaussian); the predictive of a custom likelihood is not known here"
        )

    def _labels(self, y: Tensor) -> Tensor:
        """``y`` checked as the class labels of the summarised rows (categorical only)."""
        y = torch.as_tensor(y, device=self.mean.device)
        rows, n_classes = tuple(self.mean.shape[:-1]), self.mean.shape[-1]
        if tuple(y.shape) != rows:
            raise ValueError(f"y must have shape {rows}, got {tuple(y.shape)}")
        if y.is_floating_point() or y.is_complex() or ((y < 0) | (y >= n_classes)).any():
            raise ValueError(f"y must hold integer class labels in [0, {n_classes})")
        return y.long()

    def _target_shape(self, y: Tensor) -> tuple[int, ...]:
        """The shape ``y`` must have: the predictions', or without a trailing 1 (a ``(B, 1)``
        head with ``(B,)`` targets)."""
        shape = tuple(self.mean.shape)
        if tuple(y.shape) == shape or (shape[-1:] == (1,) and tuple(y.shape) == shape[:-1]):
            return tuple(y.shape)
        raise ValueError(f"y must have shape {shape}, got {tuple(y.shape)}")

    def _binary_targets(self, y: Tensor) -> tuple[Tensor, Tensor]:
        """``y`` checked as 0/1 targets, and where they count (not a padding frame)."""
        y = torch.as_tensor(y, device=self.mean.device)
        self._target_shape(y)
        if y.is_complex() or not bool(torch.isfinite(y.double()).all()):
            raise ValueError("y must hold 0/1 targets")
        if self.kind == "bernoulli_sequence" and y.ndim >= 2:
            valid = (y >= 0).all(-1, keepdim=True).expand(y.shape)
        else:
            valid = torch.ones_like(y, dtype=torch.bool)
        if not bool(((y[valid] == 0) | (y[valid] == 1)).all()):
            raise ValueError(
                "y must hold 0/1 targets"
                + (" (frames of -1 are padding)" if self.kind == "bernoulli_sequence" else "")
            )
        if not bool(valid.any()):
            raise ValueError("y holds no targets to score (every frame is padding)")
        return y, valid

    def _real_targets(self, y: Tensor) -> Tensor:
        """``y`` checked as real-valued targets of the predictions."""
        y = torch.as_tensor(y, device=self.mean.device)
        self._target_shape(y)
        if y.is_complex() or not bool(torch.isfinite(y.double()).all()):
            raise ValueError("y must hold finite real targets")
        return y


# --------------------------------------------------------------------------------------------
# The target
# --------------------------------------------------------------------------------------------
class BayesianModel:
    """Posterior over the parameters of ``module`` given ``data``, as a :class:`Target`.

    Args:
        module: any ``nn.Module`` mapping a batch of inputs ``(B, ...)`` to outputs
            ``(B, ...)``; deterministic in ``eval()`` mode. Its current parameter values are
            not used by :meth:`evaluate` (they are ``theta``), only its structure and buffers.
            Every parameter is sampled, those with ``requires_grad=False`` too (register a
            value to keep fixed as a buffer). A module :func:`torch.func.vmap` cannot batch
            (``nn.GRU``, ``nn.LSTM``, ``nn.RNN``) runs its chains one by one, with a warning.
        data: ``(x, y)`` tensors or a ``TensorDataset`` of two tensors, same first dimension
            ``N``. Floating ``x`` is cast to ``dtype``; ``y`` to ``dtype`` for the gaussian and
            bernoulli likelihoods and to ``long`` for the categorical one.
        likelihood: ``"categorical"`` (logits, integer labels), ``"gaussian"`` (mean, fixed
            ``noise_std``), ``"bernoulli"`` (logits, 0/1 targets, summed over output dims),
            ``"bernoulli_sequence"`` (logits and 0/1 targets ``(B, T, P)``, frames of ``-1``
            are padding; :func:`bernoulli_sequence_log_lik`), or a callable
            ``(outputs (B, ...), y (B, ...)) -> log p per example (B,)`` (it is called inside
            :func:`torch.func.vmap`, so it must be vmap-compatible).
        prior_std: ``prior_std`` of the ``N(0, prior_std^2 I)`` prior.
        batch_size: minibatch size ``M``; ``None`` for full-batch energies.
        noise_std: observation noise of the gaussian likelihood (only there).
        dtype, device: of positions and data (default: those of the module's parameters).

    Raises:
        ValueError: a bad argument, or data the module and likelihood cannot take (non-finite
            values, inputs of a shape the module rejects, labels outside its outputs, targets
            of a shape its outputs do not fit); the message says which.
        DeviceError: ``device`` is not a device this torch build and machine can use.

    Attributes:
        dim: number of parameters ``D``.
        n_data: ``N``.
        batch_size: ``M`` (``N`` for full batch).
        spec: the :class:`ParamSpec` of the flat layout.
        module: the internal eval-mode copy of the module.
    """

    def __init__(
        self,
        module: nn.Module,
        data: tuple[Tensor, Tensor] | TensorDataset,
        likelihood: str | LogLik = "categorical",
        prior_std: float = 1.0,
        batch_size: int | None = None,
        noise_std: float = 1.0,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        if not isinstance(module, nn.Module):
            raise ValueError(f"module must be a torch.nn.Module, got {type(module)}")
        named = list(module.named_parameters())
        if not named:
            raise ValueError("module has no parameters to sample")
        bad = [f"{n} ({p.dtype})" for n, p in named if not p.is_floating_point()]
        if bad:
            raise ValueError(f"module parameters must be floating point; not so: {', '.join(bad)}")
        if not (prior_std > 0 and math.isfinite(prior_std)):
            raise ValueError(f"prior_std must be a finite number > 0, got {prior_std!r}")
        if not (noise_std > 0 and math.isfinite(noise_std)):
            raise ValueError(f"noise_std must be a finite number > 0, got {noise_std!r}")
        if noise_std != 1.0 and likelihood != "gaussian":  # a setting that would do nothing
            shown = likelihood if isinstance(likelihood, str) else "a custom"
            raise ValueError(
                f"noise_std is the gaussian likelihood's observation noise; {shown!s} "
                f"likelihood has none (got noise_std={noise_std!r})"
            )
        if dtype is not None and not dtype.is_floating_point:
            raise ValueError(f"dtype must be a floating dtype, got {dtype}")

        self.dtype: torch.dtype = dtype or named[0][1].dtype
        self.device = check_device(device) if device is not None else named[0][1].device
        self.module = copy.deepcopy(module).to(device=self.device, dtype=self.dtype).eval()
        self.spec = ParamSpec.from_module(self.module)
        self.dim = self.spec.dim
        self.prior_std = float(prior_std)
        self.noise_std = float(noise_std)
        self._buffers = {n: b.detach() for n, b in self.module.named_buffers()}

        if isinstance(likelihood, str):
            builtin = {
                "categorical": categorical_log_lik,
                "gaussian": lambda o, y: gaussian_log_lik(o, y, self.noise_std),
                "bernoulli": bernoulli_log_lik,
                "bernoulli_sequence": bernoulli_sequence_log_lik,
            }
            if likelihood not in builtin:
                raise ValueError(
                    "likelihood must be 'categorical', 'gaussian', 'bernoulli', "
                    f"'bernoulli_sequence' or a callable, got {likelihood!r}"
                )
            self._loglik_fn: LogLik = builtin[likelihood]
        elif callable(likelihood):
            self._loglik_fn = likelihood
        else:
            raise ValueError(f"likelihood must be a string or a callable, got {type(likelihood)}")
        self.likelihood = likelihood

        self.x, self.y = self._prepare_data(data, likelihood)
        self.n_data = int(self.x.shape[0])
        self._check_data_fits_module(self.x, self.y)
        self._vmap = self._vmap_works()
        if batch_size is None:
            batch_size = self.n_data
        if int(batch_size) != batch_size or not 1 <= batch_size <= self.n_data:
            raise ValueError(
                f"batch_size must be an integer in [1, N={self.n_data}] or None, got {batch_size!r}"
            )
        self.batch_size = int(batch_size)

    # -- set-up -----------------------------------------------------------------------------
    def _prepare_data(
        self, data: tuple[Tensor, Tensor] | TensorDataset, likelihood: str | LogLik
    ) -> tuple[Tensor, Tensor]:
        if isinstance(data, TensorDataset):
            data = tuple(data.tensors)
        if not isinstance(data, (tuple, list)) or len(data) != 2:
            raise ValueError("data must be a tuple (x, y) of tensors or a TensorDataset of two")
        x, y = data
        if not isinstance(x, Tensor) or not isinstance(y, Tensor):
            raise ValueError(f"data must hold tensors, got ({type(x)}, {type(y)})")
        if x.ndim == 0 or y.ndim == 0 or x.shape[0] != y.shape[0]:
            raise ValueError(
                "data x and y must have the same first dimension N, got shapes "
                f"{tuple(x.shape)} and {tuple(y.shape)}"
            )
        if x.shape[0] == 0:
            raise ValueError("data is empty")
        x = x.to(self.device, dtype=self.dtype if x.is_floating_point() else None)
        if likelihood == "categorical":
            if y.is_floating_point() or y.is_complex():
                raise ValueError(f"categorical likelihood needs integer labels y, got {y.dtype}")
            y = y.to(self.device, dtype=torch.long)
        elif likelihood in ("gaussian", "bernoulli", "bernoulli_sequence"):
            y = y.to(self.device, dtype=self.dtype)
        else:
            y = y.to(self.device)
        return x.detach(), y.detach()

    def _check_data_fits_module(self, x: Tensor, y: Tensor, what: str = "data") -> None:
        """Non-finite data, a feature count the module cannot take, (categorical) labels
        outside its outputs and targets of a shape its outputs do not fit fail here, not as a
        shape or index error at the first step."""
        for name, value in (("x", x), ("y", y)):
            if value.is_floating_point() and not bool(torch.isfinite(value).all()):
                bad = int((~torch.isfinite(value)).sum())
                raise ValueError(f"{what} {name} has {bad} non-finite value(s) of {value.numel()}")
        try:
            with torch.no_grad():
                outputs = self.module(x[:1])
        except Exception as err:  # any failure of the module on the data's input shape
            raise ValueError(
                f"the module cannot take the {what}'s inputs x of shape {self._data_shape(x)}: "
                f"{type(err).__name__}: {err}"
            ) from None
        if self.likelihood == "categorical":
            if not isinstance(outputs, Tensor) or outputs.ndim < 2:
                raise ValueError(
                    "categorical likelihood needs (B, n_classes) logits from the module, got "
                    f"{type(outputs).__name__} {tuple(getattr(outputs, 'shape', ()))}"
                )
            n_classes = outputs.shape[-1]
            low, high = int(y.min()), int(y.max())
            if low < 0 or high >= n_classes:
                raise ValueError(
                    f"{what} labels y must be in [0, {n_classes - 1}] (the module has "
                    f"{n_classes} outputs), got labels in [{low}, {high}]"
                )
        elif self.likelihood in ("bernoulli", "bernoulli_sequence"):
            # probabilities of a 1 (padding frames of a sequence are -1)
            valid = (y >= 0) & (y <= 1)
            if self.likelihood == "bernoulli_sequence":
                valid |= y == -1
            if not bool(valid.all()):
                padding = " or -1 (padding)" if self.likelihood == "bernoulli_sequence" else ""
                raise ValueError(
                    f"{what}: {self.likelihood} likelihood needs targets y in [0, 1]{padding}, "
                    f"got values in [{float(y.min()):g}, {float(y.max()):g}]"
                )
        if isinstance(self.likelihood, str):  # targets of a shape the outputs do not fit
            try:
                self._loglik_fn(outputs, y[:1])
            except ValueError as err:
                raise ValueError(f"{what}: {err} (on its first example)") from None

    def _check_theta(self, theta: Tensor, name: str = "theta") -> None:
        check_positions(theta, self.dim, name)
        if theta.dtype != self.dtype:
            raise ValueError(
                f"{name} has dtype {theta.dtype} but the model uses {self.dtype} "
                "(pass the same dtype to sample() and BayesianModel)"
            )
        if theta.device.type != self.device.type:
            raise ValueError(
                f"{name} is on {theta.device} but the model's data is on {self.device}"
            )

    def check_data(self, x: Tensor, y: Tensor, name: str = "data") -> tuple[Tensor, Tensor]:
        """``(x, y)`` checked as the model's own data are (tensors of the same length, finite,
        inputs of the training data's shape that the module takes, categorical labels integers
        within its outputs) and moved to its device and dtype: held-out data for
        ``Adapt(validation=...)`` or an evaluation, checked once before a run uses it.

        Raises:
            ValueError: naming ``name`` and what is wrong.
        """
        try:
            x, y = self._prepare_data((x, y), self.likelihood)
        except ValueError as err:
            raise ValueError(f"{name}: {err}") from None
        if tuple(x.shape[1:]) != tuple(self.x.shape[1:]):
            raise ValueError(
                f"{name}: inputs x of shape {tuple(x.shape)}, but the model's data x is "
                f"{self._data_shape()}"
            )
        self._check_data_fits_module(x, y, name)
        return x, y

    def _inputs(self, x: Tensor) -> Tensor:
        return x.to(self.device, dtype=self.dtype if x.is_floating_point() else None)

    # -- model pieces -----------------------------------------------------------------------
    def _forward_one(self, flat: Tensor, x: Tensor) -> Tensor:
        return functional_call(self.module, (self.spec.unflatten(flat), self._buffers), (x,))

    def _loglik_one(self, flat: Tensor, x: Tensor, y: Tensor) -> Tensor:
        outputs = self._forward_one(flat, x)
        logp = self._loglik_fn(outputs, y)
        if logp.shape != (x.shape[0],):
            raise ValueError(
                f"likelihood must return one log-probability per example, shape ({x.shape[0]},), "
                f"got {tuple(logp.shape)}"
            )
        return logp

    def _data_shape(self, x: Tensor | None = None) -> str:
        """The inputs' shape (default: the training inputs') with ``N`` for their count, e.g.
        ``"(N, 784)"``."""
        x = self.x if x is None else x
        return "(" + ", ".join(["N", *(str(d) for d in x.shape[1:])]) + ")"

    def _vmap_works(self) -> bool:
        """Whether :func:`torch.func.vmap` can batch the module over chains; where it cannot
        (no batching rule, e.g. ``nn.GRU``, ``nn.LSTM``, ``nn.RNN``), a warning, and the
        chains run one by one."""
        theta = flatten_params(self.module)
        try:
            with torch.no_grad():
                vmap(self._forward_one, in_dims=(0, None))(theta.expand(2, -1), self.x[:1])
        except RuntimeError as err:
            if "batching rule" not in str(err).lower():
                raise
            warnings.warn(
                f"torch.func.vmap cannot batch this module over chains ({err}); its K chains "
                "run one by one (the same results, K times the calls)",
                stacklevel=3,
            )
            return False
        return True

    def _batched(self, fn: Callable[..., Tensor], n_rest: int) -> Callable[..., Tensor]:
        """``fn(flat, *data)`` over the rows of ``(K, D)`` chains, the data shared:
        vmapped, or chain by chain where the module cannot be vmapped."""
        if self._vmap:
            return vmap(fn, in_dims=(0, *(None for _ in range(n_rest))))
        return lambda theta, *data: torch.stack([fn(flat, *data) for flat in theta])

    def _over_chains(
        self, fn: Callable[..., Tensor], theta: Tensor, x: Tensor, *rest: Tensor
    ) -> Tensor:
        """``fn(flat, x, *rest)`` for every chain of ``theta``; where the module fails on inputs
        shaped unlike the model's data, a ``ValueError`` saying so (not a shape error from
        inside the module)."""
        try:
            return self._batched(fn, 1 + len(rest))(theta, x, *rest)
        except RuntimeError as err:
            if tuple(x.shape[1:]) == tuple(self.x.shape[1:]):
                raise
            raise ValueError(
                f"the module cannot take inputs x of shape {tuple(x.shape)} (the model's data "
                f"x: {self._data_shape()}): {type(err).__name__}: {err}"
            ) from None

    def forward(self, theta: Tensor, x: Tensor) -> Tensor:
        """Outputs of every chain's network on ``x`` of shape ``(B, ...)``: ``(K, B, ...)``.

        Raises:
            ValueError: ``theta`` is not ``(K, D)``, or the module cannot take ``x``'s shape.
        """
        self._check_theta(theta)
        return self._over_chains(self._forward_one, theta, self._inputs(x))

    def log_likelihood(self, theta: Tensor, x: Tensor, y: Tensor) -> Tensor:
        """``log p(y_b | x_b, theta_k)`` for every chain and example, shape ``(K, B)``.

        Raises:
            ValueError: as :meth:`forward`, or ``x`` and ``y`` of different lengths.
        """
        self._check_theta(theta)
        x = self._inputs(x)
        if x.shape[0] != y.shape[0]:
            raise ValueError(
                f"x and y must have the same length, got {x.shape[0]} and {y.shape[0]}"
            )
        y = y.to(self.device, dtype=self.y.dtype)
        return self._over_chains(self._loglik_one, theta, x, y)

    def predict(self, theta: Tensor, x: Tensor | None = None) -> Predictive:
        """Posterior-predictive mean and spread on ``x`` (default: the training inputs).

        Args:
            theta: ``(S, K, D)`` samples (``result.theta``) or ``(K, D)`` positions.
            x: inputs ``(B, ...)``.

        Returns:
            A :class:`Predictive` (its ``draws`` hold ``S * K * B`` predictions, so pass a
            subset of ``x`` or thin the samples when that is large).

        Raises:
            ValueError: ``theta`` is not ``(S, K, D)`` or ``(K, D)``, or holds no samples.
        """
        if not isinstance(theta, Tensor) or theta.ndim not in (2, 3):
            raise ValueError(
                f"theta must be (S, K, D) samples or (K, D) positions, got "
                f"{getattr(theta, 'shape', type(theta))}"
            )
        samples = theta.unsqueeze(0) if theta.ndim == 2 else theta
        if samples.shape[0] == 0:
            raise ValueError(
                "theta holds no samples (a run with sample(..., store=False) keeps none)"
            )
        x = self.x if x is None else x
        kind = self.likelihood if isinstance(self.likelihood, str) else None
        predictions, logits = [], []
        with torch.no_grad():
            # One vmapped forward per kept sample bounds memory at K * B outputs.
            for row in samples:
                outputs = self.forward(row, x)
                predictions.append(self._prediction(outputs))
                if kind in _BERNOULLI:
                    logits.append(outputs)
        draws = torch.stack(predictions)
        flat = draws.flatten(0, 1)
        mean = flat.mean(0)
        std = flat.std(0) if flat.shape[0] > 1 else torch.zeros_like(mean)
        entropy = None
        if self.likelihood == "categorical":
            entropy = -(mean * mean.clamp_min(1e-30).log()).sum(-1)
        return Predictive(
            draws,
            mean,
            std,
            entropy,
            likelihood=kind,
            noise_std=self.noise_std if kind == "gaussian" else None,
            logits=torch.stack(logits) if logits else None,
        )

    def _prediction(self, outputs: Tensor) -> Tensor:
        """What one draw's outputs predict for ``y`` (see :class:`Predictive`)."""
        if self.likelihood == "categorical":
            return outputs.softmax(-1)
        if self.likelihood in ("bernoulli", "bernoulli_sequence"):
            return outputs.sigmoid()
        return outputs

    def prior_energy(self, theta: Tensor) -> Tensor:
        """``-log p(theta) = ||theta||^2 / (2 prior_std^2)`` up to its constant, shape ``(K,)``."""
        return (theta * theta).sum(-1) / (2.0 * self.prior_std**2)

    def minibatch(self, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        """The minibatch one :meth:`evaluate` call uses: the first ``M`` entries of
        ``torch.randperm(N, generator=generator)`` (the whole data set when ``M = N``)."""
        if self.batch_size == self.n_data:
            return self.x, self.y
        gen_device = generator.device if generator is not None else self.device
        idx = torch.randperm(self.n_data, generator=generator, device=gen_device)[: self.batch_size]
        idx = idx.to(self.device)
        return self.x[idx], self.y[idx]

    # -- Target protocol --------------------------------------------------------------------
    #: :meth:`evaluate` can estimate the variance of its gradient's minibatch noise
    #: (``estimate_noise=True``), which ``NNSGHMC(grad_noise_estimate=True)`` asks for.
    estimates_grad_noise = True

    def evaluate(
        self,
        theta: Tensor,
        generator: torch.Generator | None = None,
        create_graph: bool = False,
        estimate_noise: bool = False,
    ) -> Evaluation:
        """Minibatch energy ``Ũ`` and ``grad Ũ`` at ``theta`` ``(K, D)``, one shared minibatch.

        ``estimate_noise=True`` also returns ``grad_noise_var``, an unbiased one-draw
        estimate of each coordinate's variance of ``grad Ũ`` over minibatches: the
        minibatch's two halves ``a`` and ``b`` (sizes ``m_a``, ``m_b``, ``M`` in all) give
        ``(1 - M / N) m_a m_b (g_a / m_a - g_b / m_b)^2`` from their likelihood gradients ``g``
        (same minibatch, same ``grad``, about the arithmetic of one pass; ``1 - M / N``
        because minibatches are drawn without replacement).
        """
        self._check_theta(theta)
        x, y = self.minibatch(generator)
        scale = self.n_data / x.shape[0]
        noise_var = None
        if not estimate_noise:
            energy, grad = self._likelihood_energy_and_grad(theta, x, y, scale, create_graph)
        elif x.shape[0] < 2:
            raise ValueError("estimate_noise needs a minibatch of at least 2 examples")
        else:
            half = x.shape[0] // 2
            sizes = (half, x.shape[0] - half)
            halves = [(x[:half], y[:half]), (x[half:], y[half:])]
            (e_a, g_a), (e_b, g_b) = (
                self._likelihood_energy_and_grad(theta, hx, hy, scale, create_graph)
                for hx, hy in halves
            )
            # m_a m_b (1 - M/N) (g_a/m_a - g_b/m_b)^2 = (m_b/m_a) (1 - M/N) (g_a - (m_a/m_b) g_b)^2,
            # in place: fresh (K, D) temporaries cost more than the arithmetic here.
            noise_var = torch.sub(g_a.detach(), g_b.detach(), alpha=sizes[0] / sizes[1])
            noise_var.square_().mul_(sizes[1] / sizes[0] * (1.0 - x.shape[0] / self.n_data))
            energy, grad = e_a + e_b, g_a + g_b
        prior_energy = self.prior_energy(theta)
        prior_grad = theta / self.prior_std**2
        if not create_graph:
            prior_energy, prior_grad = prior_energy.detach(), prior_grad.detach()
        energy, grad = energy + prior_energy, grad + prior_grad
        return Evaluation(energy, grad, prior_energy, prior_grad, noise_var)

    def _likelihood_energy_and_grad(
        self, theta: Tensor, x: Tensor, y: Tensor, scale: float, create_graph: bool
    ) -> tuple[Tensor, Tensor]:
        """``-scale sum log p(y | x, theta)`` and its gradient, autograd through the network
        only (the Gaussian prior's terms are closed-form)."""
        batched = self._batched(self._loglik_one, 2)
        return energy_and_grad(lambda th: -scale * batched(th, x, y).sum(-1), theta, create_graph)

    def energy(self, theta: Tensor, chunk_size: int | None = None) -> Tensor:
        """Exact full-data energy ``U(theta)``, shape ``(K,)``, summed over data chunks of
        ``chunk_size`` examples (default: ``batch_size``) to bound memory. Differentiable when
        grad mode is on (wrap in ``torch.no_grad()`` for evaluation)."""
        self._check_theta(theta)
        chunk = self._chunk(chunk_size)
        batched = self._batched(self._loglik_one, 2)
        loglik = theta.new_zeros(theta.shape[0])
        for start in range(0, self.n_data, chunk):
            sl = slice(start, start + chunk)
            loglik = loglik + batched(theta, self.x[sl], self.y[sl]).sum(-1)
        return -loglik + self.prior_energy(theta)

    def _chunk(self, chunk_size: int | None) -> int:
        """Examples per data chunk of the full-data sums (default: ``batch_size``)."""
        chunk = int(chunk_size or self.batch_size)
        if chunk < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size!r}")
        return chunk

    def full_grad(self, theta: Tensor, chunk_size: int | None = None) -> Tensor:
        """Exact full-data ``grad U(theta)``, shape ``(K, D)``, accumulated over data chunks
        of ``chunk_size`` examples (default: ``batch_size``), so that memory stays that of
        one minibatch's gradient whatever ``N`` (for diagnostics; not differentiable)."""
        self._check_theta(theta)
        chunk = self._chunk(chunk_size)
        grad = theta.detach() / self.prior_std**2
        for start in range(0, self.n_data, chunk):
            sl = slice(start, start + chunk)
            _, g = self._likelihood_energy_and_grad(theta, self.x[sl], self.y[sl], 1.0, False)
            grad = grad + g.detach()
        return grad

    # -- initial positions ------------------------------------------------------------------
    def init_positions(
        self, n_chains: int, generator: torch.Generator | None = None, scheme: str = "module"
    ) -> Tensor:
        """``(n_chains, D)`` starting positions.

        ``"module"``: each chain gets PyTorch's default initialisation of the module — every
        submodule's ``reset_parameters()`` is re-run on a CPU copy under a CPU RNG seeded with
        an integer drawn from ``generator`` (one per chain; the global RNG state is restored).
        Parameters that no ``reset_parameters`` covers keep the module's values (a warning
        names them). Deterministic given ``generator``. ``"prior"``: ``N(0, prior_std^2 I)``.
        Use as ``sample(..., init=lambda g: model.init_positions(K, g))``.
        """
        if int(n_chains) != n_chains or n_chains < 1:
            raise ValueError(f"n_chains must be a positive integer, got {n_chains!r}")
        gen_device = generator.device if generator is not None else torch.device("cpu")
        if scheme == "prior":
            draw = torch.randn(
                (int(n_chains), self.dim), generator=generator, device=gen_device, dtype=self.dtype
            )
            return (self.prior_std * draw).to(self.device)
        if scheme != "module":
            raise ValueError(f"scheme must be 'module' or 'prior', got {scheme!r}")
        seeds = torch.randint(0, 2**62, (int(n_chains),), generator=generator, device=gen_device)
        work = copy.deepcopy(self.module).to("cpu")
        resettable = [m for m in work.modules() if callable(getattr(m, "reset_parameters", None))]
        self._warn_uncovered(work)
        spec = self.spec
        rows = []
        # A loop over chains at initialisation only (reset_parameters works on one module).
        with torch.random.fork_rng(devices=[]):
            for seed in seeds.tolist():
                torch.default_generator.manual_seed(seed)
                for m in resettable:
                    m.reset_parameters()
                params = dict(work.named_parameters())
                rows.append(spec.flatten({n: params[n].detach() for n in spec.names}))
        return torch.stack(rows).to(device=self.device, dtype=self.dtype)

    @staticmethod
    def _warn_uncovered(module: nn.Module) -> None:
        uncovered: list[str] = []

        def visit(m: nn.Module, prefix: str, covered: bool) -> None:
            covered = covered or callable(getattr(m, "reset_parameters", None))
            if not covered:
                uncovered.extend(prefix + n for n, p in m._parameters.items() if p is not None)
            for name, child in m.named_children():
                visit(child, f"{prefix}{name}.", covered)

        visit(module, "", False)
        if uncovered:
            warnings.warn(
                "init_positions(scheme='module'): no reset_parameters() covers "
                f"{uncovered}; these start at the module's values in every chain",
                stacklevel=3,
            )

    def __repr__(self) -> str:
        lik = self.likelihood if isinstance(self.likelihood, str) else "custom"
        return (
            f"BayesianModel(dim={self.dim}, n_data={self.n_data}, batch_size={self.batch_size}, "
            f"likelihood={lik!r}, prior_std={self.prior_std})"
        )
