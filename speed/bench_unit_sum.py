"""How the compiled nets add up their units: one running sum against sums in pairs.

``metasampler.learned.nets.coordinate_mlp``, unrolled and compiled for sampling, adds the
units' contributions to each output with :func:`~metasampler.learned.nets.pairwise_sum`. This
compares that with the running sum it replaced (the same nets with ``pairwise_sum`` swapped for
a left-to-right sum) on the two nets of one step: a curl net ``Q_f(U, p_i)`` and a friction net
``D_f(U, p_i, g_i)``, softsign units, each with its derivative in ``p_i``, over K x D
coordinates (default 20 x 33,450, the 784-40-40-10 MLP of ``bench_nnsghmc_overhead.py``).
Both variants are compiled in one process and timed in interleaved rounds on one thread.

Usage::

    python speed/bench_unit_sum.py [--hidden 40] [--rounds 10]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from unittest import mock

import torch
from torch import Tensor

from metasampler.learned import nets
from metasampler.learned.nets import CoordinateMLP, coordinate_mlp


def running_sum(terms: Sequence[Tensor]) -> Tensor:
    """The units added one after another (the order before ``pairwise_sum``)."""
    return functools.reduce(lambda total, term: total + term, terms)


def two_nets(q_net: CoordinateMLP, d_net: CoordinateMLP) -> Callable[..., tuple[Tensor, ...]]:
    """Both nets of a step with their derivatives in the momentum input."""
    q_params, d_params = q_net.params(), d_net.params()

    def evaluate(energy: Tensor, momentum: Tensor, grad: Tensor) -> tuple[Tensor, ...]:
        q, (dq,) = coordinate_mlp(q_params, [energy, momentum], "softsign", "identity", [1])
        d, (dd,) = coordinate_mlp(d_params, [energy, momentum, grad], "softsign", "softplus", [1])
        return q, dq, d, dd

    return evaluate


@contextlib.contextmanager
def summing_with(sum_fn: Callable[[Sequence[Tensor]], Tensor]) -> Iterator[None]:
    with mock.patch.object(nets, "pairwise_sum", sum_fn):
        yield


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=40)
    parser.add_argument("--chains", type=int, default=20)
    parser.add_argument("--dim", type=int, default=33_450)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--calls", type=int, default=5, help="calls per variant and round")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    q_net = CoordinateMLP(2, [args.hidden], "softsign")
    d_net = CoordinateMLP(3, [args.hidden], "softsign", "softplus")
    inputs = (
        torch.randn(args.chains, 1),
        torch.randn(args.chains, args.dim),
        torch.randn(args.chains, args.dim),
    )
    sums = {"running sum": running_sum, "pairwise_sum": nets.pairwise_sum}
    compiled = {}
    with torch.no_grad():
        for name, sum_fn in sums.items():
            compiled[name] = torch.compile(two_nets(q_net, d_net), dynamic=False)
            with summing_with(sum_fn):
                compiled[name](*inputs)
        reference = compiled["running sum"](*inputs)
        with summing_with(nets.pairwise_sum):
            for a, b in zip(reference, compiled["pairwise_sum"](*inputs), strict=True):
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
        times: dict[str, list[float]] = {name: [] for name in sums}
        for _ in range(args.rounds):
            for name, sum_fn in sums.items():
                with summing_with(sum_fn):
                    start = time.perf_counter()
                    for _ in range(args.calls):
                        compiled[name](*inputs)
                    times[name].append((time.perf_counter() - start) / args.calls)
    coords = args.chains * args.dim
    print(
        f"| two {args.hidden}-unit softsign nets, {coords:,} coordinates, 1 thread | ms | ratio |"
    )
    print("|---|---:|---:|")
    base = statistics.median(times["running sum"])
    for name, values in times.items():
        median = statistics.median(values)
        print(f"| {name} | {1e3 * median:.2f} | {median / base:.2f}x |")


if __name__ == "__main__":
    main()
