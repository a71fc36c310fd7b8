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
# TensorFlow without Horovod (its own cached virtualenv);
# TF_RESNET_REQUIREMENTS=requirements-gpu.txt the GPU set: CUDA and NCCL
# from PyPI, Horovod built with NCCL by a system CUDA's nvcc (find_cuda).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

REQUIREMENTS=${TF_RESNET_REQUIREMENTS:-requirements.txt}
CACHE=${TF_RESNET_CACHE:-$HOME/.cache/tf-resnet}
PYTHON=${PYTHON:-python3}
HOROVOD_VERSION=$(sed -n 's/^horovod==//p' "$REQUIREMENTS")
TF_PIN=$(grep -E '^tensorflow(-cpu|\[and-cuda\])?==' "$REQUIREMENTS")
KEY=$(grep -hv '^[[:space:]]*\(#\|$\)' "$REQUIREMENTS" requirements-dev.txt |
  sha256sum | cut -c1-12)
VENV=${TF_RESNET_VENV:-$CACHE/venv-$KEY}

log() { echo "[setup] $*" >&2; }

# Horovod's TensorFlow build (TF >= 2.16) includes these headers through
# TensorFlow's own; Debian/Ubuntu ship them in these packages.
BUILD_HEADERS=(farmhash.h highwayhash/sip_hash.h)
BUILD_DEBS=(libfarmhash-dev libhighwayhash-dev)
# From PyPI where no cmake is on PATH. Below 4: Horovod 0.28.1's bundled
# Gloo asks for a cmake_minimum_required that cmake 4 refuses.
CMAKE_PIN=cmake==3.31.6
BUILD_DEPS=$CACHE/build-deps

have_headers() {
  printf '#include <%s>\n' "${BUILD_HEADERS[@]}" |
    "${CXX:-g++}" -x c++ -E -o /dev/null - 2>/dev/null
}

fetch_headers_as_user() {
  # Debian/Ubuntu without root: apt-get download + dpkg -x into the cache.
  command -v apt-get >/dev/null && command -v dpkg >/dev/null || return 1
  log "fetching ${BUILD_DEBS[*]} into $BUILD_DEPS (no root needed)"
  rm -rf "$BUILD_DEPS" && mkdir -p "$BUILD_DEPS/debs"
  (cd "$BUILD_DEPS/debs" && apt-get download -q "${BUILD_DEBS[@]}") \
    >/dev/null 2>&1 || return 1
  local deb
  for deb in "$BUILD_DEPS"/debs/*.deb; do dpkg -x "$deb" "$BUILD_DEPS/root"; done
  use_fetched_headers
}

use_fetched_headers() {
  [ -d "$BUILD_DEPS/root/usr/include" ] &&
    export CPATH="$BUILD_DEPS/root/usr/include${CPATH:+:$CPATH}"
  return 0
}

build_tools_ready() {
  # What Horovod's build needs: a C++ compiler, the headers, cmake. As
  # root, Debian's packages (apt-get install); as a user, the headers
  # from Debian's archive into the cache and cmake from PyPI. Returns 1
  # with one line saying what is missing and what to do.
  local root=""
  [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null && root=1
  if [ -n "$root" ]; then
    local missing=() pkg
    for pkg in "${BUILD_DEBS[@]}" cmake g++; do
      dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
    done
    if [ ${#missing[@]} -gt 0 ]; then
      log "installing Debian packages: ${missing[*]}"
      apt-get update -qq
      apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
  fi
  if ! "${CXX:-g++}" --version >/dev/null 2>&1; then
    skip_horovod "no C++ compiler (${CXX:-g++})" \
      "load a compiler module (e.g. module load gcc) or set CXX"
    return 1
  fi
  use_fetched_headers
  if ! have_headers && ! { fetch_headers_as_user && have_headers; }; then
    skip_horovod "headers ${BUILD_HEADERS[*]} not found" \
      "install ${BUILD_DEBS[*]}, or put a folder holding them on CPATH"
    return 1
  fi
  if ! cmake --version >/dev/null 2>&1; then
    log "cmake from PyPI ($CMAKE_PIN)"
    "$VENV/bin/pip" install -q "$CMAKE_PIN"
  fi
}

gains() {  # gains NEW OLD PART: NEW has PART and OLD has not.
  [[ "$1" == *"$3"* && "$2" != *"$3"* ]]
}

upgrades() {  # upgrades NEW OLD: NEW adds MPI or NCCL to OLD, drops neither.
  local part adds=""
  for part in mpi nccl; do
    if gains "$2" "$1" "$part"; then return 1; fi
    if gains "$1" "$2" "$part"; then adds=1; fi
  done
  [ -n "$adds" ]
}

skip_horovod() {
  log "horovod not built: $1; $2, then run ./setup.sh env again." \
    "Every engine but horovod works without it (averaging on multi_worker too)."
}

horovod_flavour() {
  # Horovod with MPI and Gloo where an MPI is found (mpi_for_horovod), so
  # that mpirun, srun --mpi and aprun start its ranks as well as
  # horovodrun; else Gloo. A GPU set adds NCCL (-nccl) where a CUDA
  # compiler is found (cuda_home).
  local flavour=gloo
  if [ -n "$(mpi_for_horovod)" ]; then flavour=mpi-gloo; fi
  if [[ "$TF_PIN" == *and-cuda* ]] && [ -n "$CUDA_FOR_HOROVOD" ]; then
    flavour+=-nccl
  fi
  echo "$flavour"
}

mpi_for_horovod() {
  # Which MPI Horovod's build (CMake's FindMPI) uses: "cray", Cray MPICH,
  # where Cray's C++ compiler wrapper CC is on PATH and the cray-mpich
  # module is loaded (CRAY_MPICH_DIR): CC compiles and links MPI with no
  # flags, which FindMPI takes for the MPI; "mpicxx" where one runs;
  # else nothing.
  if command -v CC >/dev/null 2>&1 && [ -n "${CRAY_MPICH_DIR:-}" ]; then
    echo cray
  elif mpicxx --version >/dev/null 2>&1; then
    echo mpicxx
  fi
}

mpi_build_options() {
  # The build's variables for mpi_for_horovod's MPI, one a line: on a Cray
  # the wrappers as the compilers, linking dynamically (a Python module
  # cannot be the static executable the wrappers link by default).
  if [ "$(mpi_for_horovod)" = cray ]; then
    log "MPI: Cray MPICH ($CRAY_MPICH_DIR) through the compiler wrapper CC"
    printf '%s\n' CC=cc CXX=CC CRAYPE_LINK_TYPE=dynamic
  fi
  echo HOROVOD_WITH_MPI=1
}

# GPU sets only: the CUDA toolkit whose nvcc compiles Horovod's kernels.
# PyPI's CUDA 12 wheels (what tensorflow[and-cuda] installs) hold the
# runtime, the libraries and NCCL but no nvcc (nvidia-cuda-nvcc-cu12 ships
# only ptxas), so this is a system CUDA: HOROVOD_CUDA_HOME, CUDA_HOME or
# CUDA_PATH (what `module load cuda` sets), else the nvcc on PATH. Sets
# CUDA_FOR_HOROVOD (empty: none) and says which it found.
CUDA_FOR_HOROVOD=""
find_cuda() {
  [[ "$TF_PIN" == *and-cuda* ]] || return 0
  local dir="" source="" var nvcc
  for var in HOROVOD_CUDA_HOME CUDA_HOME CUDA_PATH; do
    if [ -n "${!var:-}" ]; then dir=${!var} source=$var; break; fi
  done
  if [ -n "$dir" ] && [ ! -x "$dir/bin/nvcc" ]; then
    echo "[setup] error: $source=$dir has no bin/nvcc; point it at a CUDA" \
      "toolkit (or unset it)" >&2
    exit 1
  fi
  if [ -z "$dir" ] && nvcc=$(command -v nvcc); then
    # The toolkit nvcc runs from (a wrapper script on PATH runs another).
    dir=$("$nvcc" --dryrun -x cu -c /dev/null -o /dev/null 2>&1 |
      sed -n 's/^#\$ TOP=//p')
    dir=$(cd "${dir:-$(dirname "$nvcc")/..}" && pwd -P) source="nvcc on PATH"
  fi
  if [ -z "$dir" ]; then
    log "no CUDA compiler: PyPI's CUDA 12 wheels hold none (nvidia-cuda-nvcc-cu12" \
      "ships ptxas only), so a horovod built now has no NCCL operations (it then" \
      "reduces GPU tensors through host memory). For NCCL: module load cuda (12.x) or" \
      "CUDA_HOME=<a CUDA 12 toolkit>, then ./setup.sh env again (it rebuilds horovod)."
    return 0
  fi
  local version tf_version
  version=$("$dir/bin/nvcc" --version | sed -n 's/.*release \([0-9.]*\),.*/\1/p')
  tf_version=$("$VENV/bin/python" -c 'import tensorflow as tf
print(tf.sysconfig.get_build_info()["cuda_version"])' 2>/dev/null)
  log "CUDA for horovod's kernels: system CUDA $version at $dir ($source);" \
    "NCCL: $(nccl_source); TensorFlow's CUDA: $tf_version (PyPI wheels)"
  if [ "${version%%.*}" != "${tf_version%%.*}" ]; then
    log "warning: CUDA $version is not TensorFlow's CUDA ${tf_version%%.*}: horovod's" \
      "kernels then need the NVIDIA driver CUDA $version needs (CUDA 13: 580 or" \
      "newer, GPUs of compute capability 7.5 or newer); module load a CUDA" \
      "${tf_version%%.*} to match TensorFlow."
  fi
  CUDA_FOR_HOROVOD=$dir
}

nccl_source() {
  if [ -n "${HOROVOD_NCCL_HOME:-}" ]; then echo "system NCCL at $HOROVOD_NCCL_HOME"
  else echo "PyPI wheel nvidia-nccl-cu12 $(sed -n 's/^nvidia-nccl-cu12==//p' "$REQUIREMENTS")"; fi
}

nccl_build_options() {
  # Prints Horovod's NCCL build options: a system NCCL (HOROVOD_NCCL_HOME,
  # as a module sets it) as it is; else the nvidia-nccl-cu12 wheel's header
  # and library, linked shared (the wheel has no static library, and no
  # libnccl.so: a folder in the virtualenv holds that link). The rpath
  # lets horovod find the wheel's libnccl.so.2 without LD_LIBRARY_PATH.
  echo "HOROVOD_CUDA_HOME=$CUDA_FOR_HOROVOD"
  [ -n "${HOROVOD_NCCL_HOME:-}" ] && return
  local wheel
  wheel=$("$VENV/bin/python" -c 'import os, nvidia.nccl
print(os.path.dirname(nvidia.nccl.__file__))')
  [ -f "$wheel/include/nccl.h" ] && [ -f "$wheel/lib/libnccl.so.2" ] || {
    echo "[setup] error: $wheel has no include/nccl.h or lib/libnccl.so.2" >&2
    return 1
  }
  mkdir -p "$VENV/nccl-link"
  ln -sfn "$wheel/lib/libnccl.so.2" "$VENV/nccl-link/libnccl.so"
  echo "HOROVOD_NCCL_INCLUDE=$wheel/include"
  echo "HOROVOD_NCCL_LIB=$VENV/nccl-link"
  echo HOROVOD_NCCL_LINK=SHARED
  echo "LDFLAGS=-Wl,-rpath,$wheel/lib ${LDFLAGS:-}"
}

build_horovod_wheel() {
  local wheels=$1 flavour=$2
  log "building horovod $HOROVOD_VERSION ($flavour) against $TF_PIN (a few minutes)"
  local options=(HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1
    HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1)
  local line
  if [[ "$flavour" == mpi-* ]]; then
    while read -r line; do options+=("$line"); done < <(mpi_build_options)
  else options+=(HOROVOD_WITHOUT_MPI=1); fi
  if [[ "$flavour" == *nccl ]]; then
    local nccl
    nccl=$(nccl_build_options)
    while read -r line; do options+=("$line"); done <<<"$nccl"
    options+=(HOROVOD_GPU_OPERATIONS=NCCL)
  fi
  rm -rf "$wheels.tmp" && mkdir -p "$wheels.tmp"
  # --no-cache-dir: pip caches built wheels by version only, so a horovod
  # wheel built against another TensorFlow would be reused silently. The
  # build's log (CMake's lines: which CUDA, which NCCL) stays beside it.
  local build_log=$wheels.tmp/build.log
  if ! env "${options[@]}" PATH="$VENV/bin:$PATH" MAKEFLAGS="-j$(nproc)" \
    "$VENV/bin/pip" wheel -v --no-cache-dir --no-build-isolation --no-deps \
    -w "$wheels.tmp" "horovod==$HOROVOD_VERSION" >"$build_log" 2>&1; then
    tail -n 30 "$build_log" >&2
    log "horovod's build failed: the whole log is $build_log"
    return 1
  fi
  if [[ "$flavour" == *nccl ]]; then log "$(grep -m1 -o 'Found NCCL (.*' "$build_log")"; fi
  rm -rf "$wheels" && mv "$wheels.tmp" "$wheels"
  log "build log: $wheels/build.log"
}

install_horovod() {
  # Retried by every run until it is in: a set-up that could not build it
  # still leaves a working environment, and a later run (headers found,
  # module loaded) adds it.
  [ -n "$HOROVOD_VERSION" ] || return 0  # A requirement set without Horovod.
  local flavour installed=""
  find_cuda
  flavour=$(horovod_flavour)
  [ -f "$VENV/.horovod" ] && installed=$(<"$VENV/.horovod")
  # Built with MPI (NCCL) once an MPI (a CUDA) is there; never rebuilt
  # without it (a module not loaded this time).
  if [ -n "$installed" ] && ! upgrades "$flavour" "$installed"; then return; fi
  local wheels=$CACHE/wheels/horovod-$HOROVOD_VERSION-$flavour-${TF_PIN//[^A-Za-z0-9.]/_}
  if [[ "$flavour" == *nccl ]]; then  # Its rpath names this virtualenv.
    wheels+=-$(echo "$VENV" | sha256sum | cut -c1-8)
  fi
  if ! ls "$wheels"/horovod-*.whl >/dev/null 2>&1; then
    build_tools_ready || return 0
    build_horovod_wheel "$wheels" "$flavour"
  fi
  "$VENV/bin/pip" install -q --find-links "$wheels" -r "$REQUIREMENTS"
  if [ -n "$installed" ]; then  # The build without MPI or NCCL, replaced.
    "$VENV/bin/pip" install -q --force-reinstall --no-deps --find-links "$wheels" \
      "horovod==$HOROVOD_VERSION"
  fi
  echo "$flavour" >"$VENV/.horovod"
  log "horovod $HOROVOD_VERSION installed ($flavour)"
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
    touch "$VENV/.complete"
  fi
  install_horovod
  ln -sfn "$VENV" .venv
}

run_demo() {
  local data=datasets/synthetic/cifar-10-batches-bin
  local log_root=${LOG_ROOT:-runs/demo}
  [ -f "$data/test_batch.bin" ] || .venv/bin/python data/make_synthetic_cifar.py \
    --output_dir=datasets/synthetic
  if [ -f "$log_root/eval.csv" ]; then
    log "$log_root holds an earlier demo run: this one resumes it and trains" \
      "only what is left of its ${DEMO_EPOCHS:-10} epochs (DEMO_EPOCHS);" \
      "to train afresh: rm -rf $log_root, or LOG_ROOT=<another folder>"
  fi
  log "training resnet20 on generated shapes; TensorBoard: .venv/bin/tensorboard --logdir=$log_root"
  .venv/bin/python resnet_main.py --dataset=cifar10 \
    --train_data_path="$data/data_batch*" --eval_data_path="$data/test_batch.bin" \
    --log_root="$log_root" --model=resnet20 --train_epochs="${DEMO_EPOCHS:-10}" \
    "$@"
  log "result: $(last_evaluation "$log_root/eval.csv")"
  log "learning curve: $log_root/learning_curve.png, results: $log_root/eval.csv"
}

last_evaluation() {
  # The last row of a run's eval.csv, in words.
  awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) column[$i] = i }
    END { printf "step %s, test precision %.1f%% (best %.1f%%)",
      $column["step"], 100 * $column["precision"],
      100 * $column["best_precision"] }' "$1"
}

install_cluster_packages() {
  # The cluster tests' real Slurm (tests/slurm_cluster.py), Open MPI (which
  # Horovod is then built with), Lmod and iptables (the bench's link delay,
  # tests/test_link_delay.py): Debian's packages, as root, before
  # the environment is made; elsewhere those tests are skipped with a reason.
  local missing=()
  for pkg in slurm-wlm munge openssh-server openssh-client iproute2 \
    openmpi-bin libopenmpi-dev lmod iptables; do
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
  .venv/bin/ruff check .
  # One pytest worker per core, at most 4: a test may start four
  # TensorFlow processes of its own. TF_RESNET_TEST_WORKERS overrides.
  local cores
  cores=$(nproc)
  local workers=${TF_RESNET_TEST_WORKERS:-$((cores < 4 ? cores : 4))}
  .venv/bin/python -m pytest -q -n "$workers" --dist=worksteal "$@"
}

usage() {  # The header's commands, as the usage line.
  echo "usage: $0 [env|demo|test] [flags for the demo's resnet_main.py or pytest]"
  sed -n '/^#   \.\/setup.sh/s/^# //p' "$0"
}

main() {
  local command=${1:-env}
  shift || true
  # Checked before anything is set up: --help and a typo do nothing else.
  case "$command" in
    env | demo | test) ;;
    -h | --help | help) usage; exit 0 ;;
    *) usage >&2; exit 2 ;;
  esac
  if [ "$command" = test ]; then install_cluster_packages; fi
  setup_env
  case "$command" in
    env) log "environment ready at .venv -> $VENV" ;;
    demo) run_demo "$@" ;;
    test) run_tests "$@" ;;
  esac
}

# Sourced (tests/test_cli.py), it only defines its functions.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then main "$@"; fi
