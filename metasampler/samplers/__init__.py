"""Hand-designed SG-MCMC baselines and optimiser references, one algorithm per file.

=====================  ==========================================  ==========================
class / factory        algorithm                                   file
=====================  ==========================================  ==========================
``SGLD``               stochastic gradient Langevin dynamics       ``sgld.py``
``PSGLD``              RMSprop-preconditioned SGLD                 ``psgld.py``
``SGHMC``              stochastic gradient HMC (modified Euler)    ``sghmc.py``
``SGNHT``              (m)SGNHT thermostats, Euler or splitting    ``sgnht.py``
``cyclical_sgld``      cSGLD (cyclical cosine schedule)            ``cyclical.py``
``cyclical_sghmc``     cSGHMC                                      ``cyclical.py``
``HMC``                Metropolis-corrected HMC (full-data         ``hmc.py``
                       reference)
``SGDMomentum``        SGD with momentum (T = 0 reference)         ``optimizers.py``
``Adam``               Adam (T = 0 reference)                      ``optimizers.py``
=====================  ==========================================  ==========================

The learned sampler :class:`metasampler.NNSGHMC` follows the same protocol.
"""

from .base import Sampler, SamplerState
from .cyclical import cyclical_sghmc, cyclical_sgld
from .hmc import HMC
from .optimizers import Adam, SGDMomentum
from .psgld import PSGLD
from .sghmc import SGHMC
from .sgld import SGLD
from .sgnht import SGNHT

__all__ = [
    "Adam",
    "HMC",
    "PSGLD",
    "SGDMomentum",
    "SGHMC",
    "SGLD",
    "SGNHT",
    "Sampler",
    "SamplerState",
    "cyclical_sghmc",
    "cyclical_sgld",
]
