"""Shared helpers of the speed scripts."""

from __future__ import annotations

import os
import platform
import re
import shlex
import sys
from pathlib import Path

import torch

import metasampler as ms


def write_section(path: Path, section: str, body: str) -> None:
    """Replace (or append) the ``section`` heading's part of ``path``, keeping the others."""
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    block = f"{section}\n\n{body.strip()}\n"
    pattern = re.compile(re.escape(section) + r".*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(text):
        text = pattern.sub(lambda _: block + "\n", text, count=1).rstrip() + "\n"
    else:
        text = text.rstrip() + "\n\n" + block
    path.write_text(text)


def provenance(module: str, argv: list[str] | None, threads: int) -> str:
    """How a table was made: threads, torch, the CPU, cores and the command that reruns it."""
    command = f"python -m {module} " + shlex.join(argv if argv is not None else sys.argv[1:])
    return (
        f"{threads} thread(s); torch {torch.__version__}, {platform.processor() or '?'}, "
        f"{os.cpu_count()} cores; `{command.strip()}`."
    )


def markdown_table(columns: list[str], rows: list[str], numeric_from: int = 1) -> str:
    """A markdown table of already formatted ``rows`` under ``columns`` (those from
    ``numeric_from`` on right-aligned)."""
    rule = ["---" if i < numeric_from else "---:" for i in range(len(columns))]
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join(rule) + "|", *rows]
    return "\n".join(lines)


def toy_gaussian(n_chains: int, dim: int = 20) -> tuple[ms.EnergyTarget, torch.Tensor]:
    """A seeded correlated Gaussian (mean 3) with an autograd energy and gradient noise
    N(0, 1), and ``n_chains`` starts in U([0, 6]^dim): the toy case of every benchmark."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(dim, dim, generator=g) / dim**0.5
    precision = a @ a.T + 0.5 * torch.eye(dim)
    mean = torch.full((dim,), 3.0)

    def energy(x: torch.Tensor) -> torch.Tensor:
        d = x - mean
        return 0.5 * ((d @ precision) * d).sum(-1)

    init = torch.rand(n_chains, dim, generator=g) * 6.0
    return ms.EnergyTarget(energy, dim, grad_noise_std=1.0), init
