#!/bin/sh
# CLI behaviour: the documented greedy output, and one-line errors with a non-zero exit for bad
# input. Prints TAP lines ("ok N - name" / "not ok N - name").
. "$(dirname "$0")/tap.sh"
require_model cli

greedy_story() {
  "$bin" run -m "$model" -p "Once upon a time" -n 40 --temp 0 >"$tmp/story" 2>/dev/null &&
    grep -q "^Once upon a time, there was a little girl named Lily. She loved to play with her toys and her friends." "$tmp/story"
}
check "run: greedy stories260K continuation" greedy_story

default_model() { (unset NPULM_MODEL; "$bin" run -p "Once" -n 5 --temp 0 >/dev/null 2>&1); }
check "run: default model when -m is absent" default_model

env_model() { NPULM_MODEL="$model" "$bin" run -p "Once" -n 3 --temp 0 >/dev/null 2>&1; }
check "run: NPULM_MODEL picks the model" env_model

# from a folder whose ../shared does not exist (a /tmp/shared beside the scratch folder would be
# found)
no_default() {
  mkdir -p "$tmp/nowhere/cwd" &&
    (cd "$tmp/nowhere/cwd" && env -u NPULM_MODEL "$bin" run -p "x" 2>&1 | grep -q "pass -m")
}
check "run: no model at all explains how to pass one" no_default

seeded() {
  a=$("$bin" run -m "$model" -p "Once" -n 20 --temp 1 --seed 7 2>/dev/null) &&
    b=$("$bin" run -m "$model" -p "Once" -n 20 --temp 1 --seed 7 2>/dev/null) && [ "$a" = "$b" ]
}
check "run: the same seed gives the same text" seeded

speeds() { "$bin" run -m "$model" -p "Once" -n 8 --temp 0 2>&1 >/dev/null | grep -q "tok/s"; }
check "run: reports prompt and generation speed" speeds

long_prompt=$(head -c 6000 "$shared/data/tinystories-valid.txt")
fails "run: prompt longer than the context" "more than the context" "$bin" run -m "$model" -p "$long_prompt" -n 1
fails "run: missing model file" "cannot open" "$bin" run -m "$tmp/nope.gguf" -p x
printf 'GGUF\003\000\000\000' >"$tmp/trunc.gguf"
fails "run: truncated GGUF" "truncated" "$bin" run -m "$tmp/trunc.gguf" -p x
printf 'not a model at all' >"$tmp/junk.gguf"
fails "run: bad magic" "bad magic" "$bin" run -m "$tmp/junk.gguf" -p x
fails "run: bad number" "not an integer" "$bin" run -m "$model" -n abc
# a NaN weight: the last 4 bytes of stories260K.gguf are the last value of its last tensor,
# output_norm.weight; the FP32 reference, the f32 program and the integer NPU all refuse it
cat "$model" >"$tmp/nan.gguf"
printf '\000\000\300\177' | dd of="$tmp/nan.gguf" bs=1 seek=$(($(wc -c <"$tmp/nan.gguf") - 4)) conv=notrunc 2>/dev/null
for engine in --reference "--quant f32" "--quant w8a8-smooth"; do
  fails "run $engine: a NaN weight" "tensor 'output_norm.weight' has a value that is not finite: nan at 63" \
    "$bin" run -m "$tmp/nan.gguf" -p x -n 1 $engine
done
# strtof reads "inf" and "nan": no float option means them
for opt in --temp --top-p --smooth-alpha --shadow-threshold; do
  for v in inf -inf nan; do
    fails "run: $opt $v" "option $opt: '$v' is not a finite number" "$bin" run -m "$model" -p x -n 1 $opt $v
  done
done
fails "compile: --shadow-threshold inf" "option --shadow-threshold: 'inf' is not a finite number" \
  "$bin" compile -m "$model" -o "$tmp/x.npu" --shadow-threshold inf
# 0 is the library's "default", never a value an option takes: refused as the help's ranges say
for v in 0 -0 1; do
  fails "compile: --smooth-alpha $v" "option --smooth-alpha: $v is not in (0, 1)" \
    "$bin" compile -m "$model" -o "$tmp/x.npu" --quant w8a8-smooth --smooth-alpha $v
done
fails "compile: --shadow-threshold 0" "option --shadow-threshold: 0 is not above 1" \
  "$bin" compile -m "$model" -o "$tmp/x.npu" --quant w8a8-shadow --shadow-threshold 0
# one rule for a context length: run, chat, serve and ppl refuse 0
for cmd in run chat; do
  fails "$cmd: -c 0" "option -c: '0' is not an integer in \[1, " "$bin" $cmd -m "$model" -p x -c 0
done
fails "run: unknown option" "unknown option" "$bin" run --frobnicate
fails "unknown command" "unknown command" "$bin" frobnicate

tok() { [ "$("$bin" tokenize -m "$model" -p "Hello world")" = "$("$bin" tokenize -m "$model" -p "Hello world" --text | head -1)" ] &&
  "$bin" tokenize -m "$model" -p "Hello world" | grep -Eq '^\[[0-9]+(, [0-9]+)*\]$' &&
  "$bin" tokenize -m "$model" -p "Hello" --bos | grep -q '^\[1, '; }
check "tokenize: prints [id, ...], --bos prepends BOS" tok

# tokenize reads a vocabulary-only GGUF (llama.cpp's test vocabularies, of any architecture, as
# llama-tokenize does): every case of FILE.inp (texts between "\n__ggml_vocab_test__\n" lines; no
# special-token text in them) gives the ids of its line of FILE.out (without BOS)
vocab_cases() {
  f=$shared/data/vocab/$1
  n_cases=$(wc -l <"$f.out")
  [ "$n_cases" -gt 40 ] || return 1
  k=1
  while [ "$k" -le "$n_cases" ]; do
    text=$(awk -v k="$k" 'BEGIN { RS = "\n__ggml_vocab_test__\n" } NR == k { printf "%s", $0 }' "$f.inp"; echo x)
    text=${text%x} # (the x keeps a text's trailing newlines)
    want=$(sed -n "${k}p" "$f.out" | sed 's/^ //; s/ /, /g')
    got=$("$bin" tokenize -m "$f" -p "$text") || return 1
    if [ "$got" != "[$want]" ]; then echo "case $k: want [$want], got $got"; return 1; fi
    k=$((k + 1))
  done
}
for v in llama-spm phi-3 gpt-2 starcoder falcon deepseek-coder; do
  check "tokenize: vocabulary-only ggml-vocab-$v.gguf gives llama.cpp's ids" vocab_cases "ggml-vocab-$v.gguf"
done
vocab_text() { "$bin" tokenize -m "$shared/data/vocab/ggml-vocab-llama-spm.gguf" -p "Hi" --bos --text >"$tmp/tok" &&
  [ "$(sed -n 1p "$tmp/tok")" = "[1, 6324]" ] && grep -q "^  6324 -> '▁Hi' 'Hi'$" "$tmp/tok"; }
check "tokenize: --bos and --text on a vocabulary-only GGUF" vocab_text
vocab=$shared/data/vocab/ggml-vocab-gpt-2.gguf
fails "run: a vocabulary-only GGUF" "no tensors: a vocabulary only" "$bin" run -m "$vocab" -p x
fails "compile: a vocabulary-only GGUF" "no tensors" "$bin" compile -m "$vocab" -o "$tmp/x.npu"
fails "inspect: a vocabulary-only GGUF" "no tensors" "$bin" inspect "$vocab"
fails "ppl: a vocabulary-only GGUF" "no tensors" "$bin" ppl -m "$vocab" -f "$shared/data/tinystories-valid.txt"
fails "diff: a vocabulary-only GGUF" "no tensors" "$bin" diff -m "$vocab" -p x

ppl_short() { "$bin" ppl -m "$model" -f "$shared/data/tinystories-valid.txt" -c 128 -t 2 >"$tmp/ppl" 2>/dev/null &&
  grep -q "^Final estimate: PPL = " "$tmp/ppl"; }
check "ppl: prints a final estimate" ppl_short
fails "ppl: missing text file" "cannot open" "$bin" ppl -m "$model" -f "$tmp/none.txt"
printf 'Once upon a time.' >"$tmp/short.txt"
fails "ppl: text too short" "needs at least" "$bin" ppl -m "$model" -f "$tmp/short.txt" -c 256

# compile and inspect: a program file runs exactly as the GGUF it came from
npu=$tmp/stories260K.npu
compile_ok() { "$bin" compile -m "$model" -o "$npu" --chunks 16,64 --ctx 128,512 2>"$tmp/compile.err" &&
  [ -s "$npu" ] && grep -q "^wrote $npu" "$tmp/compile.err"; }
check "compile: writes a program file" compile_ok
inspect_ok() { "$bin" inspect "$npu" >"$tmp/inspect" && grep -q "specializations: 10 graphs" "$tmp/inspect" &&
  grep -q "^placement" "$tmp/inspect" && grep -Eq "^  matmul +[0-9]+ +0$" "$tmp/inspect" &&
  grep -q "^CPU fallbacks" "$tmp/inspect" && grep -Eq "^  attn .*pinned to float" "$tmp/inspect" &&
  grep -Eq "^  rope .*not on the NPU's supported list" "$tmp/inspect" &&
  grep -q "^  KV cache" "$tmp/inspect" && grep -q "^  weights" "$tmp/inspect" && grep -q "^  arenas" "$tmp/inspect"; }
check "inspect: graphs, placement, fallbacks with reasons, memory" inspect_ok
inspect_m() { [ "$("$bin" inspect -m "$npu")" = "$(cat "$tmp/inspect")" ]; }
check "inspect: -m MODEL.npu is the same as MODEL.npu" inspect_m
inspect_gguf() { "$bin" inspect "$model" --ctx 128,512 --chunks 16,64 >"$tmp/inspect2" &&
  grep -q "compiled in memory" "$tmp/inspect2" && [ "$(sed 1d "$tmp/inspect2")" = "$(cat "$tmp/inspect")" ]; }
check "inspect: a GGUF is compiled in memory to the same program" inspect_gguf
run_same() { a=$("$bin" run -m "$model" -p "Once upon a time" -n 40 --temp 0 2>/dev/null) &&
  b=$("$bin" run -m "$npu" -p "Once upon a time" -n 40 --temp 0 2>/dev/null) && [ "$a" = "$b" ] &&
  echo "$b" | grep -q "^Once upon a time, there was a little girl named Lily."; }
check "run: a program file generates the same greedy text as its GGUF" run_same
# attention on the integer NPU (QK, softmax, PV and the int8 KV copies) through a program file
attn_npu() { "$bin" compile -m "$model" -o "$tmp/attn.npu" --quant w8a8-smooth --float-ops none 2>/dev/null &&
  a=$("$bin" run -m "$model" --quant w8a8-smooth --float-ops none -p "Once upon a time" -n 40 --temp 0 2>/dev/null) &&
  b=$("$bin" run -m "$tmp/attn.npu" -p "Once upon a time" -n 40 --temp 0 2>/dev/null) && [ -n "$a" ] && [ "$a" = "$b" ]; }
check "run: --float-ops none from a program file gives the in-memory greedy text" attn_npu
attn_inspect() { "$bin" inspect "$tmp/attn.npu" >"$tmp/inspect3" && grep -Eq "^  qk +[0-9]+ +0$" "$tmp/inspect3" &&
  grep -Eq "^  pv +[0-9]+ +0$" "$tmp/inspect3" && grep -q "<= .* KiB" "$tmp/inspect3" && grep -q "^  (<=: a KV cache copy" "$tmp/inspect3"; }
check "inspect: attention on the NPU, KV copies counted as an upper bound" attn_inspect
ppl_same() { a=$("$bin" ppl -m "$model" -f "$shared/data/tinystories-valid.txt" -c 128 -t 2 2>/dev/null | sed 's/, [0-9.]* s)$//') &&
  b=$("$bin" ppl -m "$npu" -f "$shared/data/tinystories-valid.txt" -c 128 -t 2 2>/dev/null | sed 's/, [0-9.]* s)$//') &&
  [ -n "$a" ] && [ "$a" = "$b" ]; }
check "ppl: a program file gives the same perplexity as its GGUF" ppl_same
# (w8a8-smooth stores its smoothed weights, so compiling a smooth program again smooths anew)
recompile() { "$bin" compile -m "$model" -o "$tmp/naive.npu" --quant w8a8-naive --chunks 16,64 --ctx 128,512 --keep-float 2>/dev/null &&
  "$bin" compile -m "$tmp/naive.npu" -o "$tmp/again.npu" --quant w8a8-naive --chunks 16,64 --ctx 128,512 --keep-float 2>/dev/null &&
  cmp -s "$tmp/naive.npu" "$tmp/again.npu"; }
check "compile: recompiling a program file compiled with --keep-float writes the same bytes" recompile
# an integer program file holds no float copy of the NPU's matrices (unless --keep-float): smaller,
# the same text and perplexity; what needs the float model refuses it in one line
lean_same() { "$bin" compile -m "$model" -o "$tmp/lean.npu" --quant w8a8-naive --chunks 16,64 --ctx 128,512 2>/dev/null &&
  [ "$(wc -c <"$tmp/lean.npu")" -lt "$(wc -c <"$tmp/naive.npu")" ] &&
  a=$("$bin" run -m "$tmp/naive.npu" -p "Once upon a time" -n 40 --temp 0 2>/dev/null) &&
  b=$("$bin" run -m "$tmp/lean.npu" -p "Once upon a time" -n 40 --temp 0 2>/dev/null) && [ -n "$a" ] && [ "$a" = "$b" ] &&
  a=$("$bin" ppl -m "$tmp/naive.npu" -f "$shared/data/tinystories-valid.txt" -c 128 -t 2 2>/dev/null | sed 's/, [0-9.]* s)$//') &&
  b=$("$bin" ppl -m "$tmp/lean.npu" -f "$shared/data/tinystories-valid.txt" -c 128 -t 2 2>/dev/null | sed 's/, [0-9.]* s)$//') &&
  [ -n "$a" ] && [ "$a" = "$b" ] && "$bin" verify "$tmp/lean.npu" >/dev/null && "$bin" verify "$tmp/naive.npu" >/dev/null; }
check "compile: a program file without --keep-float is smaller and runs the same" lean_same
fails "run --reference: a program file without the float weights" "no float copy.*--keep-float" "$bin" run -m "$tmp/lean.npu" --reference -p x -n 2
fails "ppl --reference: a program file without the float weights" "no float copy.*--keep-float" "$bin" ppl -m "$tmp/lean.npu" --reference -f "$shared/data/tinystories-valid.txt" -c 128
fails "diff: a program file without the float weights" "no float copy.*--keep-float" "$bin" diff -m "$tmp/lean.npu" -p "Once upon"
fails "compile: recompiling a program file without the float weights" "no float copy.*--keep-float" "$bin" compile -m "$tmp/lean.npu" -o "$tmp/x.npu"
fails "inspect: compiling a program file without the float weights" "no float copy.*--keep-float" "$bin" inspect -m "$tmp/lean.npu" --quant f32
keep_reference() { "$bin" run -m "$tmp/naive.npu" --reference -p "Once upon a time" -n 8 --temp 0 >/dev/null 2>&1; }
check "run --reference: a program file compiled with --keep-float" keep_reference
fails "compile: no output file" "pass -o" "$bin" compile -m "$model"
fails "compile: malformed list" "not a list" "$bin" compile -m "$model" -o "$tmp/x.npu" --chunks 32,abc
fails "compile: empty list entry" "not a list" "$bin" compile -m "$model" -o "$tmp/x.npu" --ctx 128,,256
fails "compile: descending chunk sizes" "ascending" "$bin" compile -m "$model" -o "$tmp/x.npu" --chunks 128,32
fails "compile: bucket beyond the model's context" "context" "$bin" compile -m "$model" -o "$tmp/x.npu" --ctx 128,100000
fails "compile: unwritable output" "cannot create" "$bin" compile -m "$model" -o "$tmp/no/such/dir.npu"
fails "compile: missing model" "cannot open" "$bin" compile -m "$tmp/nope.gguf" -o "$tmp/x.npu"
fails "compile: unknown option" "unknown option" "$bin" compile -m "$model" -o "$tmp/x.npu" --fast
fails "inspect: no program given" "pass MODEL.npu" "$bin" inspect
fails "inspect: missing file" "cannot open" "$bin" inspect "$tmp/nope.npu"
head -c 3000 "$npu" >"$tmp/trunc.npu"
fails "inspect: program file cut in its metadata" "does not fit in the file" "$bin" inspect "$tmp/trunc.npu"
head -c $(($(wc -c <"$npu") - 1000)) "$npu" >"$tmp/trunc.npu"
fails "run: program file cut in its weights" "outside the" "$bin" run -m "$tmp/trunc.npu" -p x
# a program file from a newer npulm: npulm.program.version = 11; from an older one: 9 (the
# version is checked before the checksums, so that an old or new file says what it is)
cp "$npu" "$tmp/vother.npu"
at=$(grep -obUa "npulm.program.version" "$tmp/vother.npu" | head -1 | cut -d: -f1)
printf '\013' | dd of="$tmp/vother.npu" bs=1 seek=$((at + 21 + 4)) conv=notrunc 2>/dev/null
fails "run: program file of a newer version" "version 11 is not supported" "$bin" run -m "$tmp/vother.npu" -p x
printf '\011' | dd of="$tmp/vother.npu" bs=1 seek=$((at + 21 + 4)) conv=notrunc 2>/dev/null
fails "run: program file of an older version" "version 9 is not supported.*recompile" "$bin" run -m "$tmp/vother.npu" -p x
usage_lists() { "$bin" --help | grep -q "^  compile" && "$bin" --help | grep -q "^  inspect"; }
check "usage lists compile and inspect" usage_lists

for c in run compile inspect tokenize ppl synth; do
  check "$c --help" "$bin" "$c" --help
done
fails "synth: unknown shape" "shape" "$bin" synth --shape nonesuch -o "$tmp/x.gguf"
fails "synth: unknown type lists the accepted ones" "q5_k.*f16.*q4_0.*q8_0.*q4_k.*q6_k" "$bin" \
  synth --shape tiny --type q5_k -o "$tmp/x.gguf"
echo "1..$n"
