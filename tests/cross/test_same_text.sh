#!/bin/sh
# AArch64 against x86-64: the same command line, run by the host build ($NPULM_HOST_BIN) and by the
# cross build ($NPULM_BIN, through $NPULM_EXEC, qemu-aarch64), must print the same text, whether
# the model is compiled on each side or one program file compiled on the host runs on both; and so
# must each tier of the AArch64 GEMMs: smmla on qemu's default CPU (every extension), sdot on a
# Cortex-A76 (dot product, no int8 matrix multiply), plain NEON on a Cortex-A53; and so must the
# programs of the other precisions (w8a16, w4a16, w4a16-block, w4a8). NPULM_EXEC must take qemu's
# -cpu option. Prints TAP lines. `make CROSS=aarch64 test-cross` runs it.
. "$(dirname "$0")/../cli/tap.sh"
require_model cross
host=${NPULM_HOST_BIN:-build/npulm}
exec_=${NPULM_EXEC:?NPULM_EXEC: the command that runs an AArch64 program, e.g. qemu-aarch64}
prompt="Once upon a time"

same() { # same NAME FILE_A FILE_B: the two outputs are identical and not empty
  n=$((n + 1))
  if [ -s "$2" ] && cmp -s "$2" "$3"; then echo "ok $n - $1"; else
    echo "not ok $n - $1"; diff "$2" "$3" | head -10 | sed 's/^/#   /'; fi
}

# one GGUF, compiled in memory on each side (calibration in floats, quantization, packing)
"$host" run -m "$model" -p "$prompt" -n 40 --temp 0 -t 2 >"$tmp/host.txt" 2>/dev/null
$exec_ "$bin" run -m "$model" -p "$prompt" -n 40 --temp 0 -t 2 >"$tmp/cross.txt" 2>/dev/null
same "run from the GGUF: the same text on x86-64 and AArch64" "$tmp/host.txt" "$tmp/cross.txt"

# one program file compiled on the host, every NPU op in integers (--float-ops none), run on both
check "compile on x86-64 with --float-ops none" \
  "$host" compile -m "$model" -o "$tmp/int.npu" --float-ops none
"$host" run -m "$tmp/int.npu" -p "$prompt" -n 40 --temp 0 -t 2 >"$tmp/host_int.txt" 2>/dev/null
$exec_ "$bin" run -m "$tmp/int.npu" -p "$prompt" -n 40 --temp 0 -t 2 >"$tmp/cross_int.txt" 2>/dev/null
same "x86-64 program file: the same text on AArch64" "$tmp/host_int.txt" "$tmp/cross_int.txt"
for cpu in cortex-a76 cortex-a53; do
  $exec_ -cpu $cpu "$bin" run -m "$tmp/int.npu" -p "$prompt" -n 40 --temp 0 -t 2 \
    >"$tmp/$cpu.txt" 2>/dev/null
  same "x86-64 program file: the same text on qemu's $cpu" "$tmp/host_int.txt" "$tmp/$cpu.txt"
done
# the other precisions (int16 activations: int16 x int8 or int4 GEMMs, the int16 norm and table;
# int4 weights with int8 activations: every tier of the w4a8 GEMMs), one program each
for quant in w8a16 w4a16 w4a16-block "w4a8 --float-ops none"; do
  q=${quant%% *}
  "$host" compile -m "$model" -o "$tmp/$q.npu" --quant $quant >/dev/null 2>&1
  "$host" run -m "$tmp/$q.npu" -p "$prompt" -n 40 --temp 0 -t 2 >"$tmp/host_$q.txt" 2>/dev/null
  for cpu in max cortex-a53; do
    [ $cpu = max ] || [ $q = w4a8 ] || continue
    $exec_ -cpu $cpu "$bin" run -m "$tmp/$q.npu" -p "$prompt" -n 40 --temp 0 -t 2 \
      >"$tmp/${q}_$cpu.txt" 2>/dev/null
    same "x86-64 $q program file: the same text on qemu's $cpu" "$tmp/host_$q.txt" \
      "$tmp/${q}_$cpu.txt"
  done
done
echo "1..$n"
