#!/usr/bin/env bash
# Launch the tiny two-rank meta-training of tests/meta/test_distributed.py N times under
# torchrun (gloo, CPU) and count the launches that fail; a failed launch keeps its logs (and a
# core file, for gdb) under OUT/runI. docs/DISTRIBUTED.md ("A crash at exit") has the numbers.
#
#   bash research/scripts/torchrun_exit_check.sh [N=30] [OUT=/tmp/torchrun_exit_check]
set -u
n_runs=${1:-30}
out=${2:-/tmp/torchrun_exit_check}
root=$(cd "$(dirname "$0")/../.." && pwd)
python=${PYTHON:-$root/.venv/bin/python}
mkdir -p "$out"
ulimit -c unlimited
failures=0
for i in $(seq 1 "$n_runs"); do
  run="$out/run$i"
  rm -rf "$run" && mkdir -p "$run"
  (cd "$run" && PYTHONFAULTHANDLER=1 OMP_NUM_THREADS=1 PYTHONPATH="$root" timeout 300 \
    "$python" -m torch.distributed.run --standalone --nproc_per_node=2 \
    "$root/train_meta.py" --config "$root/configs/toy_gaussian.yaml" --run-dir "$run/run" \
    train.epochs=2 train.sub_epochs=1 train.steps_per_sub_epoch=20 train.unroll=10 \
    train.n_chains=6 train.in_chain_burn_in=4 train.in_chain_chains=3 train.eval_every=0 \
    train.checkpoint_every=1 progress=false threads=1 'sampler.q_hidden=[8]' \
    'sampler.d_hidden=[8]' >"$run/stdout.txt" 2>"$run/stderr.txt")
  status=$?
  if [ "$status" -eq 0 ]; then
    rm -rf "$run"
  else
    failures=$((failures + 1))
    echo "launch $i failed (exit $status): $run"
  fi
done
echo "$failures of $n_runs launches failed"
