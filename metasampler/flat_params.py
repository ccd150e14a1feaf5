"""Flat parameter vectors of a module: ``theta`` is every parameter of an ``nn.Module``, in
``module.named_parameters()`` order (the order of ``torch.nn.utils.parameters_to_vector``);
tied parameters appear once, and every parameter counts, including ones with
``requires_grad=False``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.nn.utils import vector_to_parameters

__all__ = ["ParamSpec", "assign_params", "flatten_params", "unflatten_params"]


@dataclass(frozen=True)
class ParamSpec:
    """Where each named parameter lives in the flat vector ``theta`` of length ``dim``.

    Built once per module (:meth:`from_module`); :meth:`unflatten` is then a split and a
    reshape per parameter, which also works on a single row inside :func:`torch.func.vmap`.
    """

    names: tuple[str, ...]
    shapes: tuple[torch.Size, ...]
    numels: tuple[int, ...]
    offsets: tuple[int, ...]

    @classmethod
    def from_module(cls, module: nn.Module) -> ParamSpec:
        """The layout of ``module.named_parameters()`` (tied parameters once)."""
        if not isinstance(module, nn.Module):
            raise ValueError(f"module must be a torch.nn.Module, got {type(module)}")
        names, shapes, numels, offsets = [], [], [], []
        offset = 0
        for name, p in module.named_parameters():
            names.append(name)
            shapes.append(p.shape)
            numels.append(p.numel())
            offsets.append(offset)
            offset += p.numel()
        return cls(tuple(names), tuple(shapes), tuple(numels), tuple(offsets))

    @property
    def dim(self) -> int:
        """Total number of parameters ``D``."""
        return sum(self.numels)

    def flatten(self, params: Mapping[str, Tensor]) -> Tensor:
        """Concatenate ``params[name]`` in spec order; a leading batch shape is kept."""
        missing = [n for n in self.names if n not in params]
        if missing:
            raise ValueError(f"params is missing entries {missing}")
        lead = params[self.names[0]].shape[: params[self.names[0]].ndim - len(self.shapes[0])]
        return torch.cat([params[n].reshape(*lead, -1) for n in self.names], dim=-1)

    def unflatten(self, flat: Tensor) -> dict[str, Tensor]:
        """Views of ``flat`` (``(..., D)``) as ``{name: (..., *shape)}``."""
        if flat.shape[-1] != self.dim:
            raise ValueError(
                f"flat parameters must have last dimension {self.dim}, got {tuple(flat.shape)}"
            )
        lead = flat.shape[:-1]
        pieces = torch.split(flat, self.numels, dim=-1)
        return {
            n: piece.reshape((*lead, *shape))  # a tuple: 0-d parameters give ()
            for n, piece, shape in zip(self.names, pieces, self.shapes, strict=True)
        }


def flatten_params(module: nn.Module) -> Tensor:
    """A detached copy of all of ``module``'s parameters as one ``(D,)`` vector.

    Same order as ``torch.nn.utils.parameters_to_vector(module.parameters())``.
    """
    params = [p.detach().reshape(-1) for p in module.parameters()]
    if not params:
        raise ValueError("module has no parameters")
    return torch.cat(params).clone()


def unflatten_params(flat: Tensor, module: nn.Module) -> dict[str, Tensor]:
    """Split ``flat`` of shape ``(D,)`` or ``(K, D)`` into ``{name: tensor}`` for ``module``.

    With a ``(K, D)`` input every tensor has a leading ``K`` dimension. The tensors are views
    of ``flat`` (differentiable), ready for :func:`torch.func.functional_call`.
    """
    if not isinstance(flat, Tensor) or flat.ndim not in (1, 2):
        raise ValueError(
            f"flat must be a (D,) or (K, D) tensor, got {getattr(flat, 'shape', flat)}"
        )
    return ParamSpec.from_module(module).unflatten(flat)


def assign_params(module: nn.Module, flat: Tensor) -> nn.Module:
    """Copy one sample ``flat`` of shape ``(D,)`` into ``module``'s parameters, in place.

    The layout is :class:`BayesianModel`'s: ``module.parameters()`` order, each parameter
    flattened row-major, tied parameters once — exactly what
    ``torch.nn.utils.vector_to_parameters(flat, module.parameters())`` expects, which this
    wraps with shape and dtype checks. E.g. ``assign_params(net, result.theta[-1, 0])`` puts
    chain 0's last sample into ``net`` (``result.theta`` is ``(samples, chains, D)``).

    Returns:
        ``module`` (for chaining).

    Raises:
        ValueError: ``flat`` is not a ``(D,)`` tensor with ``D`` the module's parameter count,
            or holds integers or non-finite values.
    """
    dim = ParamSpec.from_module(module).dim
    if not isinstance(flat, Tensor) or flat.shape != (dim,):
        raise ValueError(
            f"flat must be a ({dim},) tensor for this module (one sample, e.g. "
            f"result.theta[s, k]), got {getattr(flat, 'shape', type(flat))}"
        )
    if not flat.is_floating_point() or not bool(torch.isfinite(flat).all()):
        raise ValueError(f"flat must hold finite floating-point values, got {flat.dtype} {flat}")
    first = next(module.parameters())
    with torch.no_grad():
        vector_to_parameters(flat.detach().to(first.device, first.dtype), module.parameters())
    return module
