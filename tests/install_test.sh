#!/bin/sh
# Install test: install the build into a temporary DESTDIR, build
# examples/c/decode.c against the installed copy exactly as a user would
# (cc + pkg-config), run it, and check the installed library's ABI surface.
#
#   install_test.sh <build dir> <source dir> [meson command...]
set -eu

build=$1
src=$2
shift 2
if [ $# -eq 0 ]; then set -- meson; fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/mla-install-test.XXXXXX")
trap 'rm -rf "$tmp"' EXIT INT TERM

"$@" install -C "$build" --no-rebuild --quiet --destdir "$tmp/root" >"$tmp/install.log" 2>&1 || {
    cat "$tmp/install.log"
    echo "FAIL: meson install"
    exit 1
}

pc=$(find "$tmp/root" -name mla.pc | head -n 1)
if [ -z "$pc" ]; then
    echo "FAIL: no mla.pc was installed"
    exit 1
fi
pcdir=$(dirname "$pc")
libdir=$(dirname "$pcdir")
echo "installed: $(find "$tmp/root" -type f | sed "s|^$tmp/root||" | sort | tr '\n' ' ')"

# The .pc file names the final prefix (e.g. /usr/local); the sysroot maps its
# -I / -L paths into the DESTDIR tree. Only our .pc is visible.
export PKG_CONFIG_LIBDIR="$pcdir"
export PKG_CONFIG_PATH="$pcdir"
export PKG_CONFIG_SYSROOT_DIR="$tmp/root"
flags=$(pkg-config --cflags --libs mla)
echo "pkg-config --cflags --libs mla: $flags"
case "$flags" in
    *"$tmp/root"*) ;;
    *) echo "FAIL: pkg-config flags do not point into the installed tree"; exit 1 ;;
esac

# shellcheck disable=SC2086 # the flags are meant to split
${CC:-cc} -std=c11 -Wall -Wextra -Werror -pedantic "$src/examples/c/decode.c" $flags -o "$tmp/decode"

# The example resolves libmla from the installed tree, through its SONAME.
LD_LIBRARY_PATH="$libdir" ldd "$tmp/decode" | grep libmla
LD_LIBRARY_PATH="$libdir" ldd "$tmp/decode" | grep -q "$libdir/libmla.so.0" || {
    echo "FAIL: decode does not load the installed libmla.so.0"
    exit 1
}
LD_LIBRARY_PATH="$libdir" "$tmp/decode"

# ABI surface: SONAME libmla.so.0, only mla_* symbols exported.
lib=$(ls "$libdir"/libmla.so.0.* | head -n 1)
if command -v readelf >/dev/null 2>&1; then
    readelf -d "$lib" | grep -q 'SONAME.*\[libmla\.so\.0\]' || {
        echo "FAIL: SONAME of $lib is not libmla.so.0"
        exit 1
    }
fi
if command -v nm >/dev/null 2>&1; then
    bad=$(nm -D --defined-only "$lib" | awk '$2 ~ /^[TDBRVW]$/ {print $3}' | grep -v '^mla_' | grep -v '^LIBMLA_' || true)
    if [ -n "$bad" ]; then
        echo "FAIL: symbols exported beyond mla_*: $bad"
        exit 1
    fi
fi
[ -f "$(find "$tmp/root" -name mla.h | head -n 1)" ] || { echo "FAIL: mla.h not installed"; exit 1; }
echo "PASS: install + pkg-config + examples/c/decode.c"
