"""Build shipped samplers' compiled steps before their first use on this machine.

On a CPU, the first use of a sampler configuration builds its compiled step (AOTInductor,
about 30 s on 2 cores) in a child process while eager steps, several times an SGHMC step,
run meanwhile (:mod:`metasampler.learned.aot`): a first run of a few hundred steps pays about
half a minute more than SGHMC (``BENCHMARKS.md``). The package is cached, so every later
process loads it in milliseconds. :func:`prebuild` pays that build once, ahead of time:
``scripts/setup.sh`` runs it for the samplers the README recommends.

    python -m metasampler.prebuild [NAME_OR_PATH ...] [--threads N]

A package is keyed by the machine, the torch version, the thread count and the sampler's
configuration (not its weights or the model's size), so one build serves every model the
sampler is later used on with the same thread count (by default, as many as torch uses).
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .bayesian import BayesianModel
from .cli import positive_int
from .export import SamplerFileError, load_sampler
from .learned import NNSGHMC, aot
from .learned.fast import compile_unavailable
from .sampling import sample

__all__ = ["RECOMMENDED", "Prebuilt", "prebuild", "main"]

#: The shipped samplers (``metasampler.pretrained_samplers()``).
RECOMMENDED = ("feedforward", "recurrent", "toy_gaussian")


@dataclass(frozen=True)
class Prebuilt:
    """One sampler's outcome: ``ready`` when its compiled step loads; ``detail`` says why
    not otherwise."""

    name: str
    ready: bool
    detail: str = ""


def _small_model() -> BayesianModel:
    """A classifier as small as a package build needs (the package takes any size)."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(64, 2, generator=generator)
    y = (x[:, 0] > 0).long()
    net = torch.nn.Sequential(torch.nn.Linear(2, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    return BayesianModel(net, (x, y), likelihood="categorical", prior_std=1.0, batch_size=32)


def _unavailable_after_steps(
    sampler: NNSGHMC, model: BayesianModel, compile: bool | None
) -> list[str]:
    """Two steps of ``sampler`` (a finite-difference step compiles from its second); what they
    said about its compiled step being unavailable."""
    sampler.use_compile = compile
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sample(sampler, model, n_chains=2, n_steps=2, seed=0, progress=False)
    return [str(w.message) for w in caught if str(w.message).startswith(aot.UNAVAILABLE)]


def prebuild(names: Sequence[str] = RECOMMENDED, threads: int | None = None) -> list[Prebuilt]:
    """Build (or find already built) the compiled sampling step of each sampler.

    The builds run in parallel child processes; each sampler is then run for two steps that
    must load its package. (With ``METASAMPLER_COMPILE=0`` in the environment the builds run
    one after another.) A package that another process is building already (its lock in the
    cache directory is held) is waited for, not built twice.

    Args:
        names: shipped sampler names or sampler file paths (as :func:`load_sampler` takes).
        threads: torch's intra-op threads the packages are built for, set for this process
            (default: torch's current count, which a user's script also gets by default).

    Returns:
        One :class:`Prebuilt` per distinct name, in order. Nothing is built where the compiled step
        is unavailable (e.g. no C++ compiler): every entry is then not ready, with the reason.

    Raises:
        FileNotFoundError, SamplerFileError: a name that is not a sampler (before any build).
    """
    if threads is not None:
        torch.set_num_threads(threads)
    samplers = {name: load_sampler(name) for name in names}  # all checked before any build
    reason = compile_unavailable(torch.device("cpu"))
    if reason is not None:
        return [Prebuilt(name, False, reason) for name in samplers]
    model = _small_model()
    started = {  # the default compile starts the builds not cached yet, all at once
        name: _unavailable_after_steps(sampler, model, None) for name, sampler in samplers.items()
    }
    aot.wait_for_builds()
    results = []
    for name, sampler in samplers.items():
        unavailable = started[name] + _unavailable_after_steps(sampler, model, True)
        results.append(Prebuilt(name, not unavailable, unavailable[0] if unavailable else ""))
    return results


def main(argv: list[str] | None = None) -> int:
    """The command line; exit status 0 when every package is ready, 1 otherwise."""
    parser = argparse.ArgumentParser(
        prog="python -m metasampler.prebuild", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "names", nargs="*", default=list(RECOMMENDED),
        help=f"shipped sampler names or files (default: {' '.join(RECOMMENDED)})",
    )  # fmt: skip
    parser.add_argument("--threads", type=positive_int, default=None,
                        help="torch threads the packages are for (default: torch's)")  # fmt: skip
    args = parser.parse_args(argv)
    start = time.perf_counter()
    try:
        results = prebuild(args.names, args.threads)
    except (FileNotFoundError, SamplerFileError) as err:
        parser.error(str(err))
    for result in results:
        print(f"{result.name}: " + ("ready" if result.ready else f"not built: {result.detail}"))
    print(f"{time.perf_counter() - start:.0f} s, {torch.get_num_threads()} thread(s)")
    return 0 if all(result.ready for result in results) else 1


if __name__ == "__main__":
    sys.exit(main())
