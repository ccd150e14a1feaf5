"""The task section of a run config: what to sample (a toy target, or a Bayesian neural
network with its data), built by :func:`tasks.registry.build_problem`.

The schema lives with the tasks that read it, so that ``tasks`` never imports the
application's configs; :mod:`experiments.run_config` puts it into the run config.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from metasampler.config import Activation

__all__ = ["MusicDataset", "TaskConfig", "TaskKind"]


class TaskKind(str, Enum):
    """Targets the meta-trainer and evaluator know how to build (``tasks/registry.py``)."""

    gaussian = "gaussian"  # any-D Gaussian (identity / diagonal / correlated)
    paper_train_gaussian = "paper_train_gaussian"  # Gong et al. 2019, F.1: 10-D, mean 3, diagonal
    paper_test_gaussian = "paper_test_gaussian"  # Gong et al. 2019, F.1: 20-D, mean 3, correlated
    random_gaussians = "random_gaussians"  # a new random Gaussian every meta-epoch
    mnist_mlp = "mnist_mlp"  # Gong et al. 2019, F.2 (transfer benchmark)
    fmnist_cnn = "fmnist_cnn"  # Gong et al. 2019, F.3 stand-in (transfer benchmark)
    chorale_gru = "chorale_gru"  # Gong et al. 2019, F.4 (transfer benchmark)


class MusicDataset(str, Enum):
    """The music21 corpus of a ``chorale_gru`` task (``tasks/chorales.py``)."""

    bach = "bach"  # four-part chorales (music21 corpus), the JSB set's source
    palestrina = "palestrina"  # a 200-piece subset of the music21 Palestrina corpus


@dataclass
class TaskConfig:
    """What to sample: a toy target or a Bayesian neural network with its data."""

    kind: TaskKind = TaskKind.paper_train_gaussian
    dim: int = 10  # gaussian / random_gaussians
    mean: float = 3.0
    cov: str = "correlated"  # gaussian: identity | diagonal | correlated
    # Eigenvalue range and spacing (log | uniform) of the covariance of gaussian,
    # random_gaussians and paper_train_gaussian (null: the kind's default). The smallest
    # eigenvalue sets how stiff a direction training shows the sampler at its step.
    eig_range: list[float] | None = None
    eig_spacing: str | None = None
    seed: int = 0  # seeds the random covariance / data split
    grad_noise_std: float = 1.0  # toy targets: injected gradient noise sigma
    # Gaussian targets: the energy fed to a learned sampler's nets includes the constant
    # ½ log(2 pi det Sigma), as the paper's toy code (docs/METHOD.md §5;
    # GaussianTask.with_normalised_energy)
    energy_log_normaliser: bool = False
    init_low: float = 0.0  # toy chains start uniform in [init_low, init_high]^D
    init_high: float = 6.0
    # Bayesian neural networks (mnist_mlp, fmnist_cnn, chorale_gru)
    hidden: list[int] = field(default_factory=lambda: [20])
    activation: Activation = Activation.relu
    # Meta-training only: epoch e trains on the network with hidden activation
    # train_activations[e mod n] (same data and layers), so that the sampler sees more than
    # one architecture; null: task.activation alone. Evaluation ignores it.
    train_activations: list[Activation] | None = None
    channels: int = 8
    batch_size: int = 500
    prior_std: float = 1.0
    data_dir: str | None = None
    classes: list[int] | None = None  # restrict the training classes (NT+Data)
    # chorale_gru only (tasks/chorales.py): the music21 corpus and the chunk length in frames
    dataset: MusicDataset = MusicDataset.bach
    seq_len: int = 32
