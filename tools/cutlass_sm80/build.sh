#!/usr/bin/env bash
# Builds build/cutlass_sm80_gemm: CUTLASS's Ampere-style (SM80: cp.async + ldmatrix + mma.sync) GEMMs
# as a standalone benchmark, the reference our mma_sync family is measured against on the same GPU.
# Needs nvcc (CUDA 12.x or 13.x) and the CUTLASS headers: CUTLASS_DIR must contain include/cutlass/;
# without it the headers of the nvidia-cutlass 4.2.0 wheel are fetched with pip into build/.
# ARCH (default sm_90) is the target; use plain sm_90 on Hopper, not sm_90a: the point is the
# mma.sync path. The binary links cudart statically and needs only the driver where it runs.
#   tools/cutlass_sm80/build.sh && tools/cutlass_sm80/build/cutlass_sm80_gemm 8192 20
set -euo pipefail
case "${1:-}" in
  "") ;;
  -h|--help) sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "build.sh takes no arguments (settings: CUTLASS_DIR, ARCH); see build.sh --help" >&2; exit 2 ;;
esac
HERE="$(cd "$(dirname "$0")" && pwd)"
BUILD="$HERE/build"
ARCH="${ARCH:-sm_90}"
if [ -n "${CUTLASS_DIR:-}" ] && [ ! -f "$CUTLASS_DIR/include/cutlass/gemm/device/gemm.h" ]; then
  echo "CUTLASS_DIR=$CUTLASS_DIR has no include/cutlass/gemm/device/gemm.h (it must be a CUTLASS source" \
       "tree); unset it to fetch the headers of the nvidia-cutlass 4.2.0 wheel" >&2
  exit 2
fi
CUTLASS_DIR="${CUTLASS_DIR:-$BUILD/cutlass_src/cutlass_library/source}"

if [ ! -f "$CUTLASS_DIR/include/cutlass/gemm/device/gemm.h" ]; then
  echo "CUTLASS headers not found in $CUTLASS_DIR; fetching the nvidia-cutlass 4.2.0 wheel from PyPI" >&2
  mkdir -p "$BUILD/whl" "$BUILD/cutlass_src"
  python3 -m pip download --no-deps -d "$BUILD/whl" "nvidia-cutlass==4.2.0.0"
  python3 -m zipfile -e "$BUILD"/whl/nvidia_cutlass-4.2.0.0-py3-none-any.whl "$BUILD/cutlass_src"
  CUTLASS_DIR="$BUILD/cutlass_src/cutlass_library/source"
fi

INCLUDES=(-I"$CUTLASS_DIR/include")
[ -d "$CUTLASS_DIR/tools/util/include" ] && INCLUDES+=(-I"$CUTLASS_DIR/tools/util/include")
mkdir -p "$BUILD"
set -x
nvcc -O3 -std=c++17 -arch="$ARCH" -cudart static --expt-relaxed-constexpr \
     "${INCLUDES[@]}" \
     -Xcompiler -static-libstdc++ -Xcompiler -static-libgcc \
     "$HERE/cutlass_sm80_gemm.cu" -o "$BUILD/cutlass_sm80_gemm"
