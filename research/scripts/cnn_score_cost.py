"""What one held-out score costs against one sampling step on the benchmark's CNN
(``configs/eval/fmnist_cnn_nt.yaml``): four chains, a step on a minibatch of 250 images
against the log-likelihood of 1,000 validation images (what ``Adapt(validation=...)``
scores at each of its points). One thread.

Usage, from the repository root (about a minute)::

    PYTHONPATH=. .venv/bin/python research/scripts/cnn_score_cost.py
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

import metasampler as ms
from experiments.benchmark_config import load_benchmark_config
from tasks.registry import build_problem


def seconds(call: Callable[[], object], repeats: int) -> float:
    call()  # warm-up
    start = time.perf_counter()
    for _ in range(repeats):
        call()
    return (time.perf_counter() - start) / repeats


def main() -> None:
    torch.set_num_threads(1)
    cfg = load_benchmark_config("configs/eval/fmnist_cnn_nt.yaml", [])
    problem = build_problem(cfg.task, seed=0, device="cpu")
    generator = torch.Generator().manual_seed(0)
    theta = problem.init(4, generator)
    x, y = problem.data.x_val[:1000], problem.data.y_val[:1000]
    sampler = ms.samplers.SGLD(lr=0.3)
    state = sampler.init(theta, problem.target, generator)
    step = seconds(lambda: sampler.step(state, problem.target, generator), 5)
    score = seconds(lambda: problem.target.log_likelihood(theta, x, y), 3)
    print(
        f"CNN, 4 chains: one step {step * 1000:.0f} ms; held-out log-likelihood on 1,000 "
        f"images {score * 1000:.0f} ms; ratio {score / step:.2f}"
    )


if __name__ == "__main__":
    main()
