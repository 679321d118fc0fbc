#!/usr/bin/env bash
# Installs meshtrain's build and test dependencies from Debian 12 packages, only if missing.
# Usage: scripts/install_deps.sh [--with-slurm] [--with-fuzz]
set -euo pipefail

packages=(
  build-essential cmake pkg-config git
  libopenmpi-dev openmpi-bin
  libhdf5-dev zlib1g-dev
  libboost-program-options-dev
  libgtest-dev
  libopenblas-dev
  libpugixml-dev nlohmann-json3-dev
  libmicrohttpd-dev  # the HTTP server of run.metrics_port (launch/MetricsServer.h)
  prometheus       # the server tests/launch/test_prometheus.py scrapes a run with (started by the test only)
  libprotobuf-dev protobuf-compiler libonnx-dev  # the ONNX export: onnx.proto compiled by protoc
  python3 python3-numpy python3-h5py python3-torch python3-matplotlib
  python3-onnx  # onnx.checker for the exported models (ONNX Runtime itself comes from npm: scripts/onnx)
  dataset-fashion-mnist
)
for arg in "$@"; do
  case "$arg" in
    --with-slurm) packages+=(slurm-wlm munge) ;;
    --with-fuzz) packages+=(clang libclang-rt-14-dev) ;;  # libFuzzer and the sanitizers' runtimes
    *) echo "install_deps: unknown option $arg" >&2; exit 2 ;;
  esac
done

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if ((${#missing[@]} == 0)); then
  exit 0
fi

echo "install_deps: installing ${missing[*]}"
sudo=""
if [[ $EUID -ne 0 ]]; then
  sudo="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -q
$sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
