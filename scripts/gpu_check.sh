#!/usr/bin/env bash
# Checks tf-resnet's engines on this machine's GPUs, in minutes, and prints a
# pass/fail table to paste into an issue.
#
#   ./scripts/gpu_check.sh            # from the repository root, after setup
#   STEPS=50 GPUS=4 ./scripts/gpu_check.sh
#
# Every engine that fits one node trains ResNet-20 for STEPS steps on
# generated CIFAR-10 files, in float64 with --deterministic (in float32 the
# different summation order of N devices grows over a few steps beyond any
# useful bound), and is held against a run it must equal, as the CPU tests
# hold them (docs/distributed.md):
#
#   mirrored on N GPUs, --sync_bn = default on one GPU (one pipeline, split;
#                               BatchNorm over the whole batch, as one GPU)
#   multi_worker, N workers   = horovod, N ranks (the same shards)
#   averaging every step at N x the rate = horovod (synchronous SGD)
#   parameter_server, N workers: trains, finite loss (asynchronous: no twin)
#
# "equal" is the largest difference of any weight or BatchNorm statistic
# after the run, relative to the variable's largest value, below TOLERANCE
# (default 1e-6): only the summation order differs. Each run's --dry_run plan and log
# are kept in OUT. Without GPUs it runs the same checks on 2 logical CPU
# devices (how the test suite runs it).
set -uo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-.venv/bin/python}
STEPS=${STEPS:-20}
TOLERANCE=${TOLERANCE:-1e-6}
OUT=${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")}
export TF_CPP_MIN_LOG_LEVEL=2
mkdir -p "$OUT"

visible=$("$PYTHON" -c 'import tensorflow as tf
print(len(tf.config.list_physical_devices("GPU")))' 2>/dev/null) || visible=0
N=${GPUS:-$visible}
if ((N >= 2)); then
  many=(--num_gpus="$N") one=(--num_gpus=1) where="$N GPUs"
else
  N=2 many=(--cpu_replicas=2) one=() where="no GPUs: 2 logical CPU devices"
fi
ENGINES=${ENGINES:-mirrored multi_worker horovod averaging parameter_server}

"$PYTHON" data/make_synthetic_cifar.py --output_dir="$OUT/data" \
  --train_per_batch=500 --test_count=200 >/dev/null || exit 1
data=$OUT/data/cifar-10-batches-bin
common=(--train_data_path="$data/data_batch*" --eval_data_path="$data/test_batch.bin"
  --model=resnet20 --batch_size=$((32 * N)) --train_steps="$STEPS" --seed=1
  --dtype=float64 --deterministic --eval_every_steps="$STEPS"
  --eval_batch_count=2 --log_every_steps=5)

declare -A status
rows=()

# run NAME COMMAND...: the command (resnet_main.py's flags last), its
# --dry_run plan first; status[NAME] is its exit code.
run() {
  local name=$1
  shift
  "$@" --dry_run --log_root="$OUT/$name" >"$OUT/$name.plan" 2>&1
  "$@" --log_root="$OUT/$name" >"$OUT/$name.log" 2>&1
  status[$name]=$?
}

# compare NAME TWIN: the largest relative weight difference, or why not.
compare() {
  local name=$1 twin=$2 result
  if ((status[$name] || status[$twin])); then
    rows+=("$name = $twin|FAIL|exit codes ${status[$name]}, ${status[$twin]}: see $OUT/*.log")
    return
  fi
  result=$("$PYTHON" - "$OUT/$name" "$OUT/$twin" <<'EOF'
import sys
import numpy as np
import tensorflow as tf
a, b = (tf.train.load_checkpoint(p) for p in sys.argv[1:])
worst = 0.0
for name in a.get_variable_to_shape_map():
    if not name.startswith(("model/", "optimizer/_trainable_variables/")):
        continue
    x, y = a.get_tensor(name), b.get_tensor(name)
    worst = max(worst, float(np.max(np.abs(x - y)) / (np.max(np.abs(y)) + 1e-12)))
print(f"{worst:.2e}")
EOF
  )
  if awk -v w="$result" -v t="$TOLERANCE" 'BEGIN { exit !(w < t) }'; then
    rows+=("$name = $twin|pass|largest relative weight difference $result")
  else
    rows+=("$name = $twin|FAIL|largest relative weight difference $result")
  fi
}

has_horovod() { "$PYTHON" -c 'import horovod' 2>/dev/null; }
# The synchronous Horovod run two checks compare with, trained once.
run_horovod_once() {
  [[ -v status[horovod] ]] || run horovod $(launcher horovod) --np="$N" -- \
    "${common[@]}" --distribution=horovod
}
main=(resnet_main.py "${common[@]}")
launcher() { echo "$PYTHON -m tf_resnet.launch.$1"; }

echo "gpu_check: $where, $STEPS steps, output in $OUT" >&2
run default "$PYTHON" "${main[@]}" --distribution=default "${one[@]}"
for engine in $ENGINES; do
  case $engine in
    mirrored)
      run mirrored "$PYTHON" "${main[@]}" --distribution=mirrored \
        --sync_bn "${many[@]}"
      compare mirrored default
      ;;
    horovod | averaging)
      if ! has_horovod; then
        rows+=("$engine|skipped|Horovod is not installed")
        continue
      fi
      run_horovod_once
      if [[ $engine == averaging ]]; then
        run averaging $(launcher horovod) --np="$N" -- "${common[@]}" \
          --distribution=averaging --learning_rate="$(awk -v n="$N" 'BEGIN { print 0.1 * n }')"
        compare averaging horovod
      fi
      ;;
    multi_worker)
      run multi_worker $(launcher tf_config_cluster) --np="$N" -- "${common[@]}" \
        --distribution=multi_worker
      if has_horovod; then
        run_horovod_once
        compare multi_worker horovod
      else
        rows+=("multi_worker|$( ((status[multi_worker])) && echo FAIL || echo pass)|trained (no Horovod to compare with)")
      fi
      ;;
    parameter_server)
      run parameter_server $(launcher ps) --num_ps=1 --num_workers="$N" -- \
        "${common[@]}"
      if ((status[parameter_server] == 0)) &&
        grep -q "loss [0-9]" "$OUT/parameter_server.log" &&
        ! grep -qi "loss nan\|loss inf" "$OUT/parameter_server.log"; then
        rows+=("parameter_server|pass|trained $STEPS steps, finite loss")
      else
        rows+=("parameter_server|FAIL|see $OUT/parameter_server.log")
      fi
      ;;
  esac
done

echo
echo "| check | result | measure |"
echo "| --- | --- | --- |"
failed=0
for row in "${rows[@]}"; do
  IFS='|' read -r check result measure <<<"$row"
  echo "| $check | $result | $measure |"
  [[ $result == FAIL ]] && failed=1
done
echo
echo "($where; $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | sort | uniq -c | xargs echo || true); TensorFlow $("$PYTHON" -c 'import tensorflow as tf; print(tf.__version__)' 2>/dev/null); $(date -u +%F))"
exit "$failed"
