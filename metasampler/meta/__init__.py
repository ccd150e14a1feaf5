"""Meta-training building blocks for NNSGHMC (Gong et al. ICLR 2019, §3.3; docs/METHOD.md §4).

* :mod:`.stein` — Stein gradient estimator of ``grad log q`` (Li & Turner 2018).
* :mod:`.losses` — pathwise ELBO surrogates: cross-chain (eq. 10) and in-chain (eq. 11).
* :mod:`.replay` — FIFO replay pool of chain states (appendix F.3.1).
* :mod:`.schedule` — the truncation schedule (segment, BPTT window, accumulation, steps per
  loss, continuing chains, in-chain pool span); :mod:`.unroll` — one window of chain steps;
  :mod:`.outer` — meta-gradients and the optimiser step; :mod:`.update` — the meta-loss path
  (one process or chains sharded across ranks, :mod:`.sharded`); :mod:`.checkpoint` — exact
  resume; :mod:`.report` — logging; :mod:`.divergence` — stopping on non-finite values;
  :mod:`.trainer` — the loop that wires them; :mod:`.build` — a run's parts from its config.
"""

from .losses import (
    InChainCollector,
    combined_loss,
    cross_chain_loss,
    neg_elbo_estimate,
    surrogate_loss,
)
from .replay import ReplayPool
from .stein import median_heuristic, pairwise_sq_dists, stein_score

__all__ = [
    "InChainCollector",
    "ReplayPool",
    "combined_loss",
    "cross_chain_loss",
    "median_heuristic",
    "neg_elbo_estimate",
    "pairwise_sq_dists",
    "stein_score",
    "surrogate_loss",
]
