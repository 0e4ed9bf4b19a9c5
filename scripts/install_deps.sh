#!/usr/bin/env bash
# scripts/install_deps.sh — installs what building and testing fa4 needs on Debian 12 (bookworm).
# Used by the README's set-up commands and by .ci/run, so the two cannot drift apart.
#
#   * Debian packages (apt-get, only the missing ones): cmake, g++ (with OpenMP), make, GoogleTest,
#     CLI11, nlohmann-json, and python3-dev (the headers the Python package's C host path,
#     fa4._fastpath, compiles against when python3 is Debian's own).
#   * If a CUDA compiler (nvcc) is present, CMake will build the Hopper kernels, which need the
#     CuTe/CUTLASS 4.2 headers: they come from PyPI (nvidia-cutlass, headers only, no deps) into the
#     python3 that CMake finds (src/hopper/hopper.cmake imports cutlass_library to locate them).
#     Without nvcc the build is CPU-only and this step is skipped.
# Runs as root, or as a user with sudo.
set -euo pipefail

APT_PACKAGES=(cmake g++ make libgtest-dev googletest libcli11-dev nlohmann-json3-dev python3-dev)
CUTLASS_PIP="nvidia-cutlass==4.2.0.0"

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "install_deps: apt-get install ${missing[*]}"
  $SUDO apt-get update
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends "${missing[@]}"
else
  echo "install_deps: Debian packages present (${APT_PACKAGES[*]})"
fi

# nvcc may be installed outside PATH (the CUDA toolkit's default prefix); CMake finds it there too.
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  if python3 -c "import cutlass_library" >/dev/null 2>&1; then
    echo "install_deps: nvcc found; CuTe/CUTLASS headers present ($(python3 -m pip show nvidia-cutlass 2>/dev/null | sed -n 's/^Version: //p'))"
  else
    echo "install_deps: nvcc found; pip install --no-deps $CUTLASS_PIP (CuTe headers for the Hopper kernels)"
    if ! python3 -m pip --version >/dev/null 2>&1; then
      DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends python3-pip
    fi
    # Debian's own python3 is "externally managed" (PEP 668): there the headers-only package has
    # to be installed with --break-system-packages (it has no dependencies and no compiled code).
    python3 -m pip install --no-deps "$CUTLASS_PIP" ||
      python3 -m pip install --no-deps --break-system-packages "$CUTLASS_PIP"
  fi
else
  echo "install_deps: no nvcc: CPU-only build (the Hopper kernels need the CUDA toolkit)"
fi
