#!/usr/bin/env bash
# Build the NVIDIA libmla of a git revision, for scripts/device_ab.sh:
#   scripts/ab_prep.sh REV DEST_DIR [meson options...]
# Checks REV out into a temporary worktree, builds only the library there
# (-Dgpu=nvidia, no tests, tools or bindings) and copies libmla.so.0 into
# DEST_DIR. Put DEST_DIR under .carry/ (gitignored) and carry it to the GPU
# machine with the mla-bench of the working tree, e.g.
#   scripts/ab_prep.sh main .carry/ab/main && scripts/ab_prep.sh HEAD .carry/ab/head
#   cp build-nv/tools/mla-bench .carry/ab/   # any tree's: the C ABI is stable
# then there: scripts/device_ab.sh $OUT .carry/ab/mla-bench .carry/ab/main .carry/ab/head
set -euo pipefail
[ $# -ge 2 ] || { sed -n '2,11p' "$0"; exit 2; }
rev=$1 dest=$2
shift 2
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/cuda/bin"
sha=$(git rev-parse --verify "$rev^{commit}")
tree=$(mktemp -d)
trap 'git worktree remove --force "$tree/src" >/dev/null 2>&1 || true; rm -rf "$tree"' EXIT
git worktree add --detach "$tree/src" "$sha" >/dev/null
meson setup "$tree/build" "$tree/src" -Dgpu=nvidia -Dtests=false -Dtools=false -Dpython=disabled \
    -Demulated_gpu_tests=false "$@" >/dev/null
ninja -C "$tree/build" libmla.so.0.1.0 >/dev/null
mkdir -p "$dest"
cp -L "$tree/build/libmla.so.0" "$dest/libmla.so.0"
echo "ab_prep: $(git log -1 --format='%h %s' "$sha" | cut -c1-70) -> $dest/libmla.so.0"
