"""Run logging: TensorBoard scalars, histograms and figures, plus a plain-text mirror.

``RunLogger(run_dir)`` writes TensorBoard event files to ``run_dir/tb`` (view with
``tensorboard --logdir runs``) and appends every scalar to ``run_dir/scalars.csv`` so results
can be read without TensorBoard.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import torch

__all__ = ["RunLogger", "plot_sampler_nets"]


class RunLogger:
    """TensorBoard + CSV logger for one run directory."""

    def __init__(self, run_dir: str | Path, enabled: bool = True) -> None:
        self.run_dir = Path(run_dir)
        self.enabled = enabled
        self._writer = None
        if enabled:
            from torch.utils.tensorboard import SummaryWriter

            self.run_dir.mkdir(parents=True, exist_ok=True)
            self._writer = SummaryWriter(log_dir=str(self.run_dir / "tb"))
            self._csv = open(self.run_dir / "scalars.csv", "a", newline="")  # noqa: SIM115
            self._rows = csv.writer(self._csv)

    def scalar(self, tag: str, value: float, step: int) -> None:
        """Log ``value`` under ``tag`` at ``step`` (TensorBoard and ``scalars.csv``)."""
        if self._writer is not None:
            self._writer.add_scalar(tag, value, step)
            self._rows.writerow([tag, step, value])
            self._csv.flush()

    def histogram(self, tag: str, values: torch.Tensor, step: int) -> None:
        """Log the histogram of ``values`` under ``tag`` at ``step`` (TensorBoard)."""
        if self._writer is not None:
            self._writer.add_histogram(tag, values.detach().cpu(), step)

    def figure(self, tag: str, figure, step: int) -> None:
        """Log a matplotlib ``figure`` under ``tag`` at ``step`` (TensorBoard; closes it)."""
        if self._writer is not None:
            self._writer.add_figure(tag, figure, step, close=True)

    def text(self, tag: str, text: str, step: int = 0) -> None:
        """Log ``text`` under ``tag`` (TensorBoard)."""
        if self._writer is not None:
            self._writer.add_text(tag, text, step)

    def close(self) -> None:
        """Flush and close the TensorBoard writer and the CSV file (idempotent)."""
        if self._writer is not None:
            self._writer.close()
            self._csv.close()
            self._writer = None


@torch.no_grad()
def plot_sampler_nets(
    sampler, energy_range=(0.0, 20.0), momentum_range=(-3.0, 3.0), stiffness_range=(-8.0, 0.0), n=80
):
    """Contours of the learned ``Q_f`` and ``D_f(U, p, grad=0)`` (Gong et al. 2019, Fig. 4):
    ``Q_f`` over the energy and its second input (the stiffness ``s`` or the momentum ``p``).

    The axes are the raw energy input (per datum, or per coordinate for an energy without
    data), momentum and stiffness (the sampler's input statistics are applied as in sampling).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dtype = sampler.f_q.head.weight.dtype
    device = sampler.f_q.head.weight.device
    energy = torch.linspace(*energy_range, n, dtype=dtype, device=device)
    momentum = torch.linspace(*momentum_range, n, dtype=dtype, device=device)
    u = ((energy - float(sampler.energy_loc)) / float(sampler.energy_std)).unsqueeze(-1)
    p_hat = (momentum / float(sampler.momentum_std)).expand(n, n)  # columns = p
    stiffness, curl_axis, curl_name = None, momentum, "momentum p"
    if sampler.uses_stiffness:
        s = torch.linspace(*stiffness_range, n, dtype=dtype, device=device)
        stiffness, curl_axis, curl_name = s.expand(n, n), s, "stiffness s"
    q, d = sampler.coefficients(u, p_hat, torch.zeros_like(p_hat), stiffness=stiffness)
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    panels = (
        (axes[0], curl_axis, q, f"Q_f(U, {curl_name[-1]})", curl_name),
        (axes[1], momentum, d, "D_f(U, p, grad U = 0)", "momentum p"),
    )
    for ax, x, values, title, xlabel in panels:
        mesh = ax.contourf(
            x.cpu().numpy(),
            energy.cpu().numpy(),
            values.float().cpu().numpy(),
            levels=20,
            cmap="viridis",
        )
        fig.colorbar(mesh, ax=ax)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("energy input U")
        ax.set_title(title)
    fig.tight_layout()
    return fig


def summarise(values: torch.Tensor) -> dict[str, float]:
    """Mean / std / min / max of a tensor, for scalar logs."""
    v = values.detach().double().flatten().cpu().numpy()
    return {
        "mean": float(np.mean(v)),
        "std": float(np.std(v)),
        "min": float(np.min(v)),
        "max": float(np.max(v)),
    }
