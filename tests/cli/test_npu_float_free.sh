#!/bin/sh
# The NPU contract: no floating point in the emulated NPU, its integer kernels (src/kernels/npu)
# and its executor (src/backends/npu_emu.*): "the NPU" below. Three checks, TAP lines:
# 1. no float/double/_Float16 token anywhere in their .c and .h files (comments included, as the
#    pre-stop hook greps them);
# 2. their compiled objects contain no floating-point arithmetic or conversion instruction
#    (x87, scalar/packed SSE/AVX float math, FMA, cvt*; on AArch64 the f* instructions, scvtf,
#    ucvtf and the BF16 ones) -- moves and bitwise ops of the float domain (movaps, xorps,
#    vbroadcastss, ...; fmov) are allowed, compilers use them for integers;
# 3. they call no libm function.
# Objects are looked for next to $NPULM_BIN (BUILD/npulm -> BUILD/src/kernels/npu/*.o and
# BUILD/src/backends/npu_emu.o); skipped if absent. AArch64 objects (make CROSS=aarch64
# test-cross) are read with aarch64-linux-gnu-objdump and -nm.
root=$(cd "$(dirname "$0")/../.." && pwd)
bin=${NPULM_BIN:-build/npulm}
case "$bin" in /*) ;; *) bin="$PWD/$bin" ;; esac
objdir=$(dirname "$bin")/src
n=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
notok() { n=$((n + 1)); echo "not ok $n - $1"; }
skip() { n=$((n + 1)); echo "ok $n - $1 # SKIP $2"; }

hits=$(grep -nE '\b(float|double|_Float16)\b' "$root"/src/kernels/npu/*.c "$root"/src/kernels/npu/*.h \
  "$root"/src/backends/npu_emu.c "$root"/src/backends/npu_emu.h 2>/dev/null)
if [ -z "$hits" ]; then ok "no float/double/_Float16 token in the NPU's sources"; else
  notok "no float/double/_Float16 token in the NPU's sources"; echo "$hits" | sed "s|$root/||; s/^/#   /"; fi

set -- "$objdir"/kernels/npu/*.o "$objdir"/backends/npu_emu.o
objdump=objdump nm=nm arch=x86-64
if [ -e "$1" ] && readelf -h "$1" 2>/dev/null | grep -q 'Machine:.*AArch64'; then
  objdump=aarch64-linux-gnu-objdump nm=aarch64-linux-gnu-nm arch=aarch64
fi
if [ ! -e "$1" ] || [ ! -e "$objdir/backends/npu_emu.o" ] || ! command -v $objdump >/dev/null 2>&1; then
  skip "no floating-point instructions in the NPU's objects" "no objects in $objdir or no objdump"
  skip "no libm calls from the NPU's objects" "no objects in $objdir"
  exit 0
fi

# Mnemonics (AT&T, as objdump prints them) of floating-point arithmetic, compares, conversions.
fp='(f[a-z0-9]*|v?(add|sub|mul|div|sqrt|min|max|rcp|rsqrt|round|hadd|hsub|addsub|dp)(ss|sd|ps|pd)'
fp="$fp"'|v?cmp[a-z]*(ss|sd|ps|pd)|v?u?comis[sd]|v?cvt[a-z0-9]*|vfn?m(add|sub)[a-z0-9]*'
fp="$fp"'|vfm(addsub|subadd)[a-z0-9]*'
fp="$fp"'|v(rndscale|getexp|getmant|scalef|rcp14|rsqrt14|range|reduce|fixupimm)[a-z0-9]*)'
# AArch64: every f* but fmov (f then anything but m, or fm then anything but o), the integer to
# float conversions, the BF16 instructions (not bfi / bfxil, bitfield inserts)
[ $arch = aarch64 ] && fp='(f([a-ln-z]|m[a-np-z])[a-z0-9]*|[su]cvtf|bf(cvt|dot|mmla|mlal)[a-z0-9]*)'
bad=$(for o in "$@"; do
  $objdump -d --no-show-raw-insn "$o" |
    awk -F'\t' -v f="${o##*/}" 'NF >= 2 { split($2, w, " "); print f " " w[1] }'
done | grep -E " $fp\$" | sort -u)
if [ -z "$bad" ]; then ok "no floating-point instructions in the NPU's objects"; else
  notok "no floating-point instructions in the NPU's objects"
  echo "$bad" | head -20 | sed 's/^/#   /'
fi

libm='^(a?(sin|cos|tan)h?|atan2|exp[0-9m]*1?|log[0-9p]*1?|pow|sqrt|cbrt|hypot|erfc?|fma'
libm="$libm"'|l?l?round|l?l?rint|nearbyint|floor|ceil|trunc|fabs|fmod|frexp|ldexp|modf'
libm="$libm"'|fmin|fmax)[fl]?$'
calls=$(for o in "$@"; do $nm -u "$o" | awk '{ print $2 }'; done | grep -E "$libm" | sort -u)
if [ -z "$calls" ]; then ok "no libm calls from the NPU's objects"; else
  notok "no libm calls from the NPU's objects"; echo "$calls" | sed 's/^/#   /'; fi
