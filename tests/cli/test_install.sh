#!/bin/sh
# The library as a program outside the tree uses it: `make install` into a scratch prefix (the
# files, the soname, only the npulm_* API exported, npulm.pc), then docs/library.md's example
# (tests/install/example.c, which docs/library.md must hold verbatim) built with pkg-config's flags
# against the shared library and, with --static, against libnpulm.a, each run on the tiny model;
# DESTDIR, a prefix with a space, and `make uninstall`. Prints TAP lines.
# It installs what build/ holds (building build/pic/ and the shared library there if they are
# missing), so it runs for the plain build only: under SAN=1 or TSAN=1 it skips.
. "$(dirname "$0")/tap.sh"
require_model install
root=$(cd "$(dirname "$0")/../.." && pwd)
if [ "$bin" != "$root/build/npulm" ]; then
  echo "ok 1 - install # SKIP installs build/ only, and NPULM_BIN is $bin"
  echo "1..1"
  exit 0
fi
prefix=$tmp/prefix
example=$root/tests/install/example.c
prompt="Once upon a time"
cc=${CC:-cc}
pc() { PKG_CONFIG_PATH=$prefix/lib/pkgconfig pkg-config "$@" npulm; }

# make from within make test: a make of its own (not the running one's jobs), its log kept
run_make() {
  MAKEFLAGS= make -C "$root" -j2 "$@" >"$tmp/make.log" 2>&1 || { tail -20 "$tmp/make.log" >&2; false; }
}
installed() { # installed DIR: the files and links under DIR, one a line, sorted
  (cd "$1" && find . -type f -o -type l | sort)
}

check "make install PREFIX=..." run_make install PREFIX="$prefix"
ver=$(pc --modversion)
expected=$(printf '%s\n' ./bin/npulm ./include/npulm.h ./include/npulm_bench.h ./lib/libnpulm.a \
  ./lib/libnpulm.so \
  ./lib/libnpulm.so.0 "./lib/libnpulm.so.$ver" ./lib/pkgconfig/npulm.pc)
check "installs the CLI, both headers, both libraries and npulm.pc" [ "$(installed "$prefix")" = "$expected" ]
links() {
  [ "$(readlink "$prefix/lib/libnpulm.so")" = libnpulm.so.0 ] &&
    [ "$(readlink "$prefix/lib/libnpulm.so.0")" = "libnpulm.so.$ver" ]
}
check "libnpulm.so -> libnpulm.so.0 -> libnpulm.so.$ver" links
soname() { readelf -d "$prefix/lib/libnpulm.so.$ver" | grep -q 'SONAME.*\[libnpulm\.so\.0\]'; }
check "the shared library's soname is libnpulm.so.0" soname
only_api() { # every symbol defined, less the version node (NPULM_0), is npulm_* (name@@NPULM_0)
  nm -D --defined-only "$prefix/lib/libnpulm.so.$ver" | awk '$2 != "A" { sub(/@.*/, "", $3); print $3 }' >"$tmp/syms" &&
    grep -qx npulm_version "$tmp/syms" && ! grep -v '^npulm_' "$tmp/syms"
}
check "the shared library exports the npulm_* API only" only_api
cli_version() { "$prefix/bin/npulm" --version | grep -q "^npulm $ver ([^ ]*)\$"; }
check "npulm --version names npulm.pc's version" cli_version

# docs/library.md shows the example verbatim: the first C block after its name
readme_example() {
  awk '/tests\/install\/example\.c/ { named = 1 } named && /^```c$/ { on = 1; next }
       on && /^```$/ { exit } on { print }' "$root/docs/library.md" | cmp -s - "$example"
}
check "docs/library.md holds tests/install/example.c verbatim" readme_example

# the example against the shared library, then statically; both greedy, FP32 static graphs,
# bit-identical to the reference forward
"$bin" run -m "$model" -p "$prompt" -n 32 --temp 0 --reference >"$tmp/want" 2>/dev/null
build_shared() {
  # shellcheck disable=SC2046 # pkg-config's flags are words
  $cc -std=c11 -Wall -Wextra -Werror -o "$tmp/example" "$example" $(pc --cflags --libs) &&
    readelf -d "$tmp/example" | grep -q 'NEEDED.*\[libnpulm\.so\.0\]'
}
check "the example builds against libnpulm.so (pkg-config --cflags --libs)" build_shared
run_example() { # run_example PROGRAM: greedy output as npulm run's
  LD_LIBRARY_PATH=$prefix/lib "$1" "$model" "$prompt" >"$tmp/got" && cmp -s "$tmp/want" "$tmp/got"
}
check "it runs and prints npulm run --reference's text" run_example "$tmp/example"
fails "it reports a missing model in one line" "cannot open" \
  env LD_LIBRARY_PATH="$prefix/lib" "$tmp/example" "$tmp/none.gguf" "$prompt"
build_static() {
  # shellcheck disable=SC2046
  $cc -std=c11 -Wall -Wextra -Werror -static -o "$tmp/example-static" "$example" \
    $(pc --static --cflags --libs) 2>"$tmp/static.err" &&
    ! readelf -d "$tmp/example-static" | grep -q NEEDED
}
check "the example links statically (pkg-config --static, cc -static)" build_static
# the measurement header, installed beside npulm.h: a program of it builds and runs
cat >"$tmp/bench.c" <<'EOF2'
#include <stdio.h>

#include <npulm_bench.h>

int main(void) {
  int n = 0;
  const npulm_npu_profile *p = npulm_npu_profiles(&n);
  printf("%s %d %s\n", npulm_synth_shapes()[0], n, n > 0 ? p[0].name : "");
  return n > 0 ? 0 : 1;
}
EOF2
bench_header() {
  # shellcheck disable=SC2046
  $cc -std=c11 -Wall -Wextra -Werror -o "$tmp/bench" "$tmp/bench.c" $(pc --cflags --libs) &&
    LD_LIBRARY_PATH=$prefix/lib "$tmp/bench" | grep -q '^[a-z0-9.-]* [1-9][0-9]* [a-z0-9-]*$'
}
check "a program of npulm_bench.h (synth shapes, NPU profiles) builds and runs" bench_header
check "the static example prints the same text" run_example "$tmp/example-static"

check "make install DESTDIR=... PREFIX=/opt/npulm" run_make install DESTDIR="$tmp/dest" PREFIX=/opt/npulm
destdir() {
  [ "$(installed "$tmp/dest/opt/npulm")" = "$expected" ] &&
    grep -qx 'prefix=/opt/npulm' "$tmp/dest/opt/npulm/lib/pkgconfig/npulm.pc"
}
check "DESTDIR: the same files, npulm.pc naming PREFIX" destdir
check "make uninstall removes every file" run_make uninstall PREFIX="$prefix"
check "nothing is left" [ -z "$(installed "$prefix")" ]

# a prefix with a space: every file under it, no stray folder in the tree (nor where the words
# would point), and uninstall removes them
spaced="$tmp/with space"
before=$(ls -A "$root")
check "make install PREFIX='.../with space'" run_make install PREFIX="$spaced"
check "a prefix with a space: the same files" [ "$(installed "$spaced")" = "$expected" ]
check "a prefix with a space: no stray folder in the tree" [ "$(ls -A "$root")" = "$before" ]
check "a prefix with a space: uninstall" run_make uninstall PREFIX="$spaced"
check "a prefix with a space: nothing is left" [ -z "$(installed "$spaced")" ]
echo "1..$n"
