#!/usr/bin/env bash
# Sets up tf-resnet and runs its jobs. Idempotent and cached: the virtualenv
# and the horovod wheel live under ~/.cache/tf-resnet, keyed by a hash of
# the requirement files' requirements (not their comments), so a second run
# (or CI on the same machine) reuses them.
#
#   ./setup.sh demo   # set up, then train + evaluate on generated data (offline)
#   ./setup.sh test   # set up, then lint and run the test suite
#   ./setup.sh env    # set up only; the environment is linked at ./.venv
#
# TF_RESNET_REQUIREMENTS=requirements-latest.txt selects the newest
# TensorFlow without Horovod (its own cached virtualenv).
set -euo pipefail
cd "$(dirname "$0")"

REQUIREMENTS=${TF_RESNET_REQUIREMENTS:-requirements.txt}
CACHE=${TF_RESNET_CACHE:-$HOME/.cache/tf-resnet}
PYTHON=${PYTHON:-python3}
HOROVOD_VERSION=$(sed -n 's/^horovod==//p' "$REQUIREMENTS")
TF_PIN=$(grep -E '^tensorflow(-cpu|\[and-cuda\])?==' "$REQUIREMENTS")
KEY=$(grep -hv '^[[:space:]]*\(#\|$\)' "$REQUIREMENTS" requirements-dev.txt |
  sha256sum | cut -c1-12)
VENV=${TF_RESNET_VENV:-$CACHE/venv-$KEY}
WHEELS=$CACHE/wheels/horovod-$HOROVOD_VERSION-${TF_PIN//[^A-Za-z0-9.]/_}

log() { echo "[setup] $*" >&2; }

install_build_packages() {
  # Horovod's TensorFlow build needs these headers for TF >= 2.16.
  local missing=()
  for pkg in libhighwayhash-dev libfarmhash-dev cmake g++; do
    dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  log "installing Debian packages: ${missing[*]}"
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
}

build_horovod_wheel() {
  [ -n "$HOROVOD_VERSION" ] || return 0  # A requirement set without Horovod.
  ls "$WHEELS"/horovod-*.whl >/dev/null 2>&1 && return
  install_build_packages
  log "building horovod $HOROVOD_VERSION against $TF_PIN (a few minutes)"
  local gpu_ops=()
  if [[ "$TF_PIN" == *and-cuda* ]]; then gpu_ops=(HOROVOD_GPU_OPERATIONS=NCCL); fi
  mkdir -p "$WHEELS.tmp"
  # --no-cache-dir: pip caches built wheels by version only, so a horovod
  # wheel built against another TensorFlow would be reused silently.
  env HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
    HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 "${gpu_ops[@]}" \
    MAKEFLAGS="-j$(nproc)" \
    "$VENV/bin/pip" wheel -q --no-cache-dir --no-build-isolation --no-deps \
    -w "$WHEELS.tmp" "horovod==$HOROVOD_VERSION"
  rm -rf "$WHEELS" && mv "$WHEELS.tmp" "$WHEELS"
}

setup_env() {
  if [ ! -f "$VENV/.complete" ]; then
    log "creating $VENV"
    rm -rf "$VENV"
    mkdir -p "$CACHE"
    "$PYTHON" -m venv "$VENV"
    # setuptools stays at the version requirements.txt pins (TensorBoard
    # needs its pkg_resources, which the newest setuptools dropped).
    "$VENV/bin/pip" install -q --upgrade pip wheel
    # Everything but horovod first: its build imports TensorFlow.
    "$VENV/bin/pip" install -q -r <(grep -v '^horovod' "$REQUIREMENTS") \
      -r requirements-dev.txt
    build_horovod_wheel
    "$VENV/bin/pip" install -q --find-links "$WHEELS" -r "$REQUIREMENTS"
    touch "$VENV/.complete"
  fi
  ln -sfn "$VENV" .venv
}

run_demo() {
  local data=datasets/synthetic/cifar-10-batches-bin
  local log_root=${LOG_ROOT:-runs/demo}
  [ -f "$data/test_batch.bin" ] || .venv/bin/python data/make_synthetic_cifar.py \
    --output_dir=datasets/synthetic
  log "training resnet20 on generated shapes; TensorBoard: .venv/bin/tensorboard --logdir=$log_root"
  .venv/bin/python resnet_main.py --dataset=cifar10 \
    --train_data_path="$data/data_batch*" --eval_data_path="$data/test_batch.bin" \
    --log_root="$log_root" --model=resnet20 --train_epochs="${DEMO_EPOCHS:-10}" \
    --log_every_steps=20 "$@"
  log "learning curve: $log_root/learning_curve.png, results: $log_root/eval.csv"
}

install_cluster_packages() {
  # The cluster tests' real Slurm (tests/slurm_cluster.py): Debian's
  # packages, as root; elsewhere those tests are skipped with a reason.
  local missing=()
  for pkg in slurm-wlm munge openssh-server openssh-client iproute2; do
    dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
    log "not root with apt-get: the Slurm cluster tests will be skipped"
    return
  fi
  log "installing Debian packages for the cluster tests: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
    --no-install-recommends "${missing[@]}" >/dev/null
}

run_tests() {
  install_cluster_packages
  .venv/bin/ruff check .
  # One pytest worker per core, at most 4: a test may start four
  # TensorFlow processes of its own. TF_RESNET_TEST_WORKERS overrides.
  local cores
  cores=$(nproc)
  local workers=${TF_RESNET_TEST_WORKERS:-$((cores < 4 ? cores : 4))}
  .venv/bin/python -m pytest -q -n "$workers" --dist=worksteal "$@"
}

command=${1:-env}
shift || true
setup_env
case "$command" in
  env) log "environment ready at .venv -> $VENV" ;;
  demo) run_demo "$@" ;;
  test) run_tests "$@" ;;
  *) echo "usage: $0 [env|demo|test]" >&2; exit 2 ;;
esac
