#!/usr/bin/env bash
# Instruction counts of one attention kernel specialisation, without a GPU:
#   scripts/sass_stats.sh ROWS KV [TREE]
# ROWS is 16, 32 or 64; KV one of BF16, FP8_E4M3, FP8_E4M3_FNUZ, MXFP4;
# TREE a source tree (default: this one; a `git worktree` of another
# revision compares two). Compiles the specialisation for sm_90a with the
# library's flags into a cubin, disassembles it and prints ptxas's register
# and spill report, the kernel's R2UR moves, the instructions from the
# consumer's first to its last wgmma (the tile loop and its epilogue), and
# that stretch's most frequent opcodes.
#
# Needs nvcc and a disassembler: cuobjdump or nvdisasm of the same CUDA if
# present, else CUDA 11.8's nvdisasm from Debian's nvidia-cuda-toolkit
# (non-free), which reads a newer cubin once the ELF e_flags word says
# sm_90 in its own encoding (it prints the instructions it does not know
# as .byte; none of those counted here). Set MLA_NVDISASM to its path.
set -euo pipefail
[ $# -ge 2 ] || { sed -n '2,16p' "$0"; exit 2; }
rows=$1 kv=$2 tree=${3:-$(cd "$(dirname "$0")/.." && pwd)}
export PATH="$PATH:/usr/local/cuda/bin"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
printf '#include "gpu/attention.cuh"\nMLA_INSTANTIATE_ATTENTION(%s, MLA_DTYPE_%s)\n' "$rows" "$kv" > "$work/unit.cu"
nvcc -std=c++17 -O3 -DMLA_BUILDING_LIBRARY --expt-relaxed-constexpr -Xptxas -v \
    -gencode arch=compute_90a,code=sm_90a -I"$tree/include" -I"$tree/src" -DMLA_WGMMA_KERNELS=1 \
    -cubin "$work/unit.cu" -o "$work/unit.cubin" 2>&1 | grep -E "registers|spill" | sed 's/^ptxas info *: *//'
if command -v cuobjdump > /dev/null; then
    cuobjdump -sass "$work/unit.cubin" > "$work/unit.sass"
else
    disasm=${MLA_NVDISASM:-$(command -v nvdisasm || echo /usr/bin/nvdisasm)}
    [ -x "$disasm" ] || { echo "sass_stats: no cuobjdump or nvdisasm (apt-get install nvidia-cuda-toolkit from non-free, or set MLA_NVDISASM)" >&2; exit 1; }
    # e_flags is the 32-bit word at offset 48 of an ELF64 header; 0x5a055a
    # is sm_90 with 64-bit addresses in the encoding of CUDA 11.
    python3 - "$work/unit.cubin" <<'PY'
import struct, sys
path = sys.argv[1]
elf = bytearray(open(path, "rb").read())
struct.pack_into("<I", elf, 48, 0x5A055A)
open(path, "wb").write(elf)
PY
    "$disasm" "$work/unit.cubin" > "$work/unit.sass"
fi
# One opcode line per instruction, predicates and operands dropped.
grep -oP '/\*[0-9a-f]{4,6}\*/\s+\K[^;]*' "$work/unit.sass" | grep -v '^\.' | sed -E 's/^@!?U?P[0-9T] //' > "$work/ops"
echo "R2UR moves: $(grep -c '^R2UR' "$work/ops" || true)"
awk '/^HGMMA/ { if (!first) first = NR; last = NR } { line[NR] = $1 }
     END {
         if (!first) { print "no wgmma in this kernel"; exit }
         printf "first to last wgmma: %d instructions\n", last - first + 1
         for (i = first; i <= last; ++i) count[line[i]]++
         for (op in count) printf "%7d %s\n", count[op], op | "sort -rn | head -12"
     }' "$work/ops"
