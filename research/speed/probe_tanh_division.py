"""Probe: does one division per net (a batched reciprocal) speed up the compiled tanh units?

The compiled NNSGHMC step evaluates each hidden unit's tanh as Eigen's rational approximation
``x P(x^2) / Q(x^2)`` (:func:`metasampler.learned.nets.tanh_rational`): one division per unit.
This probe compiles ten such units on a ``(20, 33450)`` grid (the 784-40-40-10 MLP with K = 20)
twice: as written, and with the ten divisions replaced by one division of the product of the
denominators and the prefix products that recover each reciprocal (Montgomery's trick). It prints
both times, interleaved, and the largest difference between them.

    .venv/bin/python research/speed/probe_tanh_division.py
"""

from __future__ import annotations

import time

import torch

from metasampler.learned.nets import tanh_rational, tanh_rational_parts


def tanh_batched_reciprocal(xs: list[torch.Tensor]) -> list[torch.Tensor]:
    """``tanh`` of every tensor in ``xs`` with a single division."""
    parts = [tanh_rational_parts(x) for x in xs]  # denominators in [4.9e-3, 0.91]: no underflow
    prefix = [parts[0][1]]
    for _, den in parts[1:]:
        prefix.append(prefix[-1] * den)
    inverse = 1.0 / prefix[-1]
    out: list[torch.Tensor] = [inverse] * len(xs)
    for i in range(len(xs) - 1, 0, -1):
        out[i] = parts[i][0] * (inverse * prefix[i - 1])
        inverse = inverse * parts[i][1]
    out[0] = parts[0][0] * inverse
    return out


def main() -> None:
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    weight, bias, head = (torch.randn(s, generator=gen) for s in ((10, 2), (10,), (10,)))

    def per_unit(u: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        units = [tanh_rational(bias[h] + weight[h, 0] * u + weight[h, 1] * p) for h in range(10)]
        return sum(head[h] * units[h] for h in range(10))

    def batched(u: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        pre = [bias[h] + weight[h, 0] * u + weight[h, 1] * p for h in range(10)]
        units = tanh_batched_reciprocal(pre)
        return sum(head[h] * units[h] for h in range(10))

    u, p = torch.randn(20, 1, generator=gen), 3 * torch.randn(20, 33450, generator=gen)
    variants = {"one division per unit": torch.compile(per_unit), "batched": torch.compile(batched)}
    with torch.no_grad():
        outs = [f(u, p) for f in variants.values()]
        print(f"largest difference: {(outs[0] - outs[1]).abs().max().item():.2e}")
        for _ in range(3):
            for name, f in variants.items():
                start = time.perf_counter()
                for _ in range(50):
                    f(u, p)
                print(f"{name}: {(time.perf_counter() - start) / 50 * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
