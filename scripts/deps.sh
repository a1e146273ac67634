#!/usr/bin/env bash
# Install the Debian 12 packages libmla's build, tests and bindings need.
# Safe to re-run; does nothing for packages already present. Needs root (or sudo).
set -euo pipefail
pkgs=(build-essential pkg-config meson ninja-build libcmocka-dev
      swig python3-dev python3-numpy python3-pytest
      bindgen libclang-dev clang-19 hipcc)
command -v cargo >/dev/null 2>&1 || pkgs+=(cargo)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
echo "deps: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
