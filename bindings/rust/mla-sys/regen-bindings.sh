#!/bin/sh
# Regenerate src/bindings.rs from include/mla.h with Debian's `bindgen`.
#
# usage: ./regen-bindings.sh [OUTPUT]
#
#   OUTPUT      where to write the bindings (default: src/bindings.rs next to
#               this script). The test tests/bindings_fresh.rs runs this script
#               with a temporary OUTPUT and compares the result with the
#               committed file, so these flags are the only record of how the
#               bindings are made.
#   MLA_HEADER  the header to read (default: ../../../include/mla.h).
#   BINDGEN     the bindgen command (default: bindgen).
#   RUSTFMT     the rustfmt command (default: rustfmt). The output is
#               formatted when rustfmt is found; the check test ignores
#               formatting-only differences.
#
# Flags:
#   --allowlist-function 'mla_.*' --allowlist-type 'mla_.*'
#   --allowlist-var 'MLA_.*'     only libmla's own items (no libc noise)
#   --newtype-enum 'mla_.*'      C enums become #[repr(transparent)] newtypes
#                                with associated constants, so any value the
#                                library returns (including ones appended by
#                                a newer library) is representable
#   --size_t-is-usize            size_t fields map to usize
#   --no-rustfmt-bindings        formatting is done below, explicitly
# Layout tests are kept: they check size and offset of every struct field on
# the platform the tests run on.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
header=${MLA_HEADER:-$here/../../../include/mla.h}
out=${1:-$here/src/bindings.rs}
bindgen=${BINDGEN:-bindgen}
rustfmt=${RUSTFMT:-rustfmt}

if ! command -v "$bindgen" >/dev/null 2>&1; then
    echo "regen-bindings.sh: '$bindgen' not found (Debian: apt-get install bindgen)" >&2
    exit 127
fi
if [ ! -f "$header" ]; then
    echo "regen-bindings.sh: header '$header' not found" >&2
    exit 2
fi

tmp=$(mktemp "${TMPDIR:-/tmp}/mla-bindings.XXXXXX")
trap 'rm -f "$tmp"' EXIT INT TERM

"$bindgen" "$header" \
    --allowlist-function 'mla_.*' \
    --allowlist-type 'mla_.*' \
    --allowlist-var 'MLA_.*' \
    --newtype-enum 'mla_.*' \
    --size_t-is-usize \
    --no-rustfmt-bindings \
    -o "$tmp" \
    -- -x c -std=c11

if command -v "$rustfmt" >/dev/null 2>&1; then
    "$rustfmt" --edition 2021 "$tmp"
else
    echo "regen-bindings.sh: '$rustfmt' not found; writing unformatted bindings" >&2
fi

cat "$tmp" > "$out"
