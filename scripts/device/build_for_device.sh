#!/usr/bin/env bash
# Builds meshtrain for the device tool's H200 on this machine (sm_90a, shared libraries, static
# Boost.PO) and stages what a device run needs in dist/ (under the 64 MiB the tool carries):
#   dist/bin, dist/lib      binaries and our shared libraries (RPATH $ORIGIN/../lib), travelling
#                           xz-compressed as dist/binaries.tar.xz (run_on_device.sh unpacks them):
#                           uncompressed they and the dataset no longer fit the tool's 64 MiB
#   dist/fallback-lib       system libraries the device image may lack, xz-compressed (unpacked by
#                           run_on_device.sh only when ldd there reports them missing)
#   dist/fashion-idx        Fashion-MNIST IDX files, converted to HDF5 on the device
# Then: device run with carry ["dist"] and command "bash scripts/device/run_on_device.sh <what>".
set -euo pipefail
cd "$(dirname "$0")/../.."
build=build-sm90
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DMT_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DMT_SHARED=ON \
  -DBUILD_TESTING=ON >/dev/null
# A source edited while the build runs can leave an object compiled from its old text but newer than
# the edit, which make then keeps (one such dist/ crashed at exit on a changed struct layout): files
# changed during the build are touched and built again until none changed.
# (A build that failed is retried the same way when sources changed under it: its error may be theirs.)
for pass in 1 2 3; do
  stamp=$(mktemp)
  built=1
  cmake --build "$build" -j "${JOBS:-$(nproc)}" || built=0
  changed=$(find core comm topo sharding data models launch export tests -newer "$stamp" -type f \
    \( -name '*.h' -o -name '*.cuh' -o -name '*.cpp' -o -name '*.cu' -o -name CMakeLists.txt \) | head -50)
  rm -f "$stamp"
  if [[ -z "$changed" ]]; then
    [[ $built == 1 ]] && break
    exit 1
  fi
  echo "build_for_device: edited during the build, building again: $(echo "$changed" | tr '\n' ' ')" >&2
  [[ $pass == 3 ]] && { echo "build_for_device: sources keep changing; stop editing and run again" >&2; exit 1; }
  echo "$changed" | xargs touch
done
rm -rf dist
mkdir -p dist/bin dist/lib dist/fallback-lib dist/fashion-idx
for f in "$build"/bin/*; do strip -o "dist/bin/$(basename "$f")" "$f"; done
for f in "$build"/lib/*.so; do strip -o "dist/lib/$(basename "$f")" "$f"; done
# Libraries outside CUDA that Ubuntu 24.04 may not have installed.
for lib in libopenblas.so.0 libgfortran.so.5 libquadmath.so.0 libhdf5_serial.so.103 libsz.so.2 libaec.so.0 \
           libpugixml.so.1 libprotobuf-lite.so.32 libmicrohttpd.so.12; do
  p=$(ldconfig -p | awk -v l="$lib" '$1 == l && !done {print $NF; done = 1}')
  if [[ -n "$p" ]]; then xz -9 -c "$(readlink -f "$p")" >"dist/fallback-lib/$lib.xz"; fi
done
cp /usr/share/datasets/fashion-mnist/*.gz dist/fashion-idx/
/usr/bin/python3 tests/models/torch_reference.py dist/parity_ref.h5 >/dev/null
tar -C dist -cf - bin lib | xz -T0 -6 >dist/binaries.tar.xz
rm -rf dist/bin dist/lib
du -sh dist dist/*
