#!/usr/bin/env bash
# Proves the GPU install as far as a machine without a GPU can, and prints a
# pass/fail table with the install's time and size (docs/usage.md, "GPU
# install"; results in bench/results/gpu_install.md). Run it as a plain user
# (not root) from a clean clone:
#
#   git clone <repository> ~/tf-resnet && cd ~/tf-resnet
#   ./scripts/check_gpu_install.sh
#
# It sets up requirements-gpu.txt into a fresh cache under OUT (a clean
# virtualenv and a freshly built Horovod: never a cached one), then checks:
# TensorFlow is a CUDA build and sees no GPU; horovod.tensorflow imports,
# built with NCCL and Gloo (and MPI where mpicxx is on PATH); resnet_main.py
# trains a few steps on the CPU; --num_gpus=1 is one clear error; and
# scripts/gpu_check.sh runs its CPU fallback. The GPU set is several GB, so
# CI never runs this. On a machine with GPUs run scripts/gpu_check.sh instead.
#
#   OUT=<folder>        where the cache, logs and runs go (default: mktemp)
#   GPU_CHECK_STEPS=10  steps of each scripts/gpu_check.sh run
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" -eq 0 ]; then
  echo "check_gpu_install: run it as a plain user, not root: the install" \
    "must need no root (e.g. runuser -u <user> -- $0)" >&2
  exit 2
fi
OUT=${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/check_gpu_install.XXXXXX")}
mkdir -p "$OUT"
export TF_RESNET_REQUIREMENTS=requirements-gpu.txt
export TF_RESNET_CACHE=$OUT/cache TF_CPP_MIN_LOG_LEVEL=2
unset TF_RESNET_VENV
PYTHON=.venv/bin/python
rows=()
row() { rows+=("$1|$2|$3"); }  # row CHECK pass|FAIL MEASURE

echo "check_gpu_install: output in $OUT" >&2
if [ -n "$(git status --porcelain 2>/dev/null)" ] || [ -e .venv ]; then
  row "clean clone" FAIL "uncommitted files or a .venv here: clone afresh"
else
  row "clean clone" pass "commit $(git rev-parse --short HEAD), user $(id -un) (uid $(id -u))"
fi

echo "check_gpu_install: ./setup.sh env (several GB; minutes)" >&2
start=$SECONDS
if ./setup.sh env >"$OUT/setup.log" 2>&1; then setup=0; else setup=$?; fi
seconds=$((SECONDS - start))
install_time="$((seconds / 60)) min $((seconds % 60)) s"
size=$(du -sh "$TF_RESNET_CACHE/" | cut -f1)
venv_size=$(du -sh "$(readlink -f .venv 2>/dev/null || echo "$TF_RESNET_CACHE")" | cut -f1)
if ((setup == 0)); then
  row "TF_RESNET_REQUIREMENTS=requirements-gpu.txt ./setup.sh env, no root" pass \
    "$install_time, $size (virtualenv $venv_size)"
else
  row "TF_RESNET_REQUIREMENTS=requirements-gpu.txt ./setup.sh env, no root" FAIL \
    "exit $setup after $install_time: see $OUT/setup.log"
fi

# python CHECK CODE: runs CODE, its last line the measure; pass on exit 0.
python() {
  local out
  if out=$("$PYTHON" -c "$2" 2>>"$OUT/python.log"); then
    row "$1" pass "${out##*$'\n'}"
  else
    row "$1" FAIL "${out##*$'\n'} (see $OUT/python.log)"
  fi
}
python "TensorFlow is a CUDA build and finds no GPU" '
import tensorflow as tf
info = tf.sysconfig.get_build_info()
built, cuda, cudnn = (info.get(k) for k in ("is_cuda_build", "cuda_version", "cudnn_version"))
gpus = tf.config.list_physical_devices("GPU")
print(f"TensorFlow {tf.__version__}, is_cuda_build={built}, CUDA {cuda}, cuDNN {cudnn}, {len(gpus)} GPU(s)")
assert built and not gpus'
python "horovod.tensorflow imports" '
import horovod
import horovod.tensorflow as hvd
print(f"horovod {horovod.__version__}, mpi_built()={hvd.mpi_built()}")
assert hvd.mpi_built() or __import__("shutil").which("mpicxx") is None'
python "hvd.nccl_built()" '
import horovod.tensorflow as hvd
print(f"nccl_built()={hvd.nccl_built()}, cuda_built()={hvd.cuda_built()}")
assert hvd.nccl_built()'
python "hvd.gloo_built()" '
import horovod.tensorflow as hvd
print(f"gloo_built()={hvd.gloo_built()}")
assert hvd.gloo_built()'

# A few training steps of the demo's model on generated CIFAR-10 files.
data=$OUT/data/cifar-10-batches-bin
train=("$PYTHON" resnet_main.py --dataset=cifar10 --model=resnet20
  --train_data_path="$data/data_batch*" --eval_data_path="$data/test_batch.bin"
  --batch_size=32 --eval_batch_count=2 --log_every_steps=5)
if "$PYTHON" data/make_synthetic_cifar.py --output_dir="$OUT/data" \
  --train_per_batch=500 --test_count=200 >"$OUT/data.log" 2>&1 &&
  "${train[@]}" --train_steps=20 --eval_every_steps=20 --log_root="$OUT/demo" \
    >"$OUT/demo.log" 2>&1 && [ -f "$OUT/demo/eval.csv" ]; then
  row "resnet_main.py trains the demo's resnet20 on the CPU" pass \
    "$(grep -o 'done: .*' "$OUT/demo.log" | tail -n 1)"
else
  row "resnet_main.py trains the demo's resnet20 on the CPU" FAIL "see $OUT/demo.log"
fi

# --num_gpus=1 without a GPU: one error naming it, no traceback.
if "${train[@]}" --train_steps=1 --num_gpus=1 --log_root="$OUT/one_gpu" \
  >"$OUT/one_gpu.log" 2>&1; then
  row "--num_gpus=1 is one clear error" FAIL "it trained: see $OUT/one_gpu.log"
elif error=$(grep -m1 "num_gpus=1 but 0 GPU(s) are visible" "$OUT/one_gpu.log") &&
  ! grep -q Traceback "$OUT/one_gpu.log"; then
  row "--num_gpus=1 is one clear error" pass "$error"
else
  row "--num_gpus=1 is one clear error" FAIL "see $OUT/one_gpu.log"
fi

if STEPS=${GPU_CHECK_STEPS:-10} OUT=$OUT/gpu_check ./scripts/gpu_check.sh \
  >"$OUT/gpu_check.log" 2>&1 &&
  grep -q "no GPUs: 2 logical CPU devices" "$OUT/gpu_check.log"; then
  row "scripts/gpu_check.sh runs its CPU fallback" pass \
    "$(grep -c '| pass |' "$OUT/gpu_check.log") checks pass on 2 logical CPU devices (below)"
else
  row "scripts/gpu_check.sh runs its CPU fallback" FAIL "see $OUT/gpu_check.log"
fi

echo
echo "| check | result | measure |"
echo "| --- | --- | --- |"
failed=0
for entry in "${rows[@]}"; do
  IFS='|' read -r check result measure <<<"$entry"
  echo "| $check | $result | $measure |"
  [[ $result == FAIL ]] && failed=1
done
echo
echo "install: $install_time, $size in $TF_RESNET_CACHE (virtualenv $venv_size)"
grep -E "^\[setup\] (CUDA for|warning: CUDA|no CUDA compiler|Found NCCL|build log|horovod)" \
  "$OUT/setup.log" || true
grep -hE -- "-- (Found CUDAToolkit|Found NCCL \(|NCCL_VERSION_CODE)" \
  "$TF_RESNET_CACHE"/wheels/*/build.log 2>/dev/null || true
echo
echo "scripts/gpu_check.sh (its CPU fallback):"
grep "^|" "$OUT/gpu_check.log" || true
echo
echo "($(lscpu | sed -n 's/^Model name:[[:space:]]*//p'), $(nproc) cores;" \
  "$(sed -n 's/^PRETTY_NAME="\(.*\)"/\1/p' /etc/os-release); $(date -u +%F))"
exit "$failed"
