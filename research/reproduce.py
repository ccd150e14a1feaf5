#!/usr/bin/env python
"""Reproduce the baseline results of the papers metasampler builds on (research/docs/REPRODUCTION.md).

Usage::

    python reproduce.py <experiment> [--config FILE] [--out DIR] [key=value ...]
    python reproduce.py all [--out DIR]

Experiments: mixture25, blr, double_well, mixture4, bnn_regression (see
``reproduction/__init__.py``). The default config is ``research/configs/reproduce/<experiment>.yaml``;
``key=value`` overrides follow it (e.g. ``n_steps=2000 nnsghmc.enabled=false``). Unknown keys
and bad values stop the run before any work, with a message naming the key.

Outputs, each written atomically into ``--out`` (default ``research/docs/reproduction``):
``<experiment>.json`` (raw numbers and the resolved config), ``<experiment>.md`` (our table
beside the paper's numbers) and ``<experiment>_<figure>.png``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent


def main(argv: list[str] | None = None) -> int:
    from reproduction import EXPERIMENTS, experiment_module
    from reproduction.common import ConfigError, load_experiment_config, write_outputs

    from metasampler.cli import positive_int

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("experiment", choices=[*EXPERIMENTS, "all"])
    parser.add_argument(
        "--config", help="YAML config (default research/configs/reproduce/<exp>.yaml)"
    )
    parser.add_argument("--out", default=str(ROOT / "docs" / "reproduction"))
    parser.add_argument("--threads", type=positive_int, default=1, help="torch intra-op threads")
    parser.add_argument("overrides", nargs="*", help="key=value config overrides")
    args = parser.parse_intermixed_args(argv)

    import torch
    from omegaconf import OmegaConf

    torch.set_num_threads(max(1, args.threads))
    names = list(EXPERIMENTS) if args.experiment == "all" else [args.experiment]
    if args.experiment == "all" and (args.config or args.overrides):
        parser.error("'all' runs every experiment with its default config; no --config/overrides")
    configs = {}
    try:  # validate every config before any work starts
        for name in names:
            module = experiment_module(name)
            path = args.config or ROOT / "configs" / "reproduce" / f"{name}.yaml"
            schema = getattr(module, EXPERIMENTS[name][1])
            configs[name] = load_experiment_config(schema, path, args.overrides, module.validate)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for name, cfg in configs.items():
        start = time.perf_counter()
        output = experiment_module(name).run(cfg)
        output.results["wall_seconds"] = time.perf_counter() - start
        written = write_outputs(output, args.out, OmegaConf.to_yaml(cfg))
        print(f"## {name} ({output.results['wall_seconds']:.0f} s)\n\n{output.markdown}\n")
        print("wrote " + ", ".join(str(p) for p in written) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
