#!/bin/sh
# CLI behaviour: the documented greedy output, and one-line errors with a non-zero exit for bad
# input. Prints TAP lines ("ok N - name" / "not ok N - name").
bin=${NPULM_BIN:-build/npulm}
shared=${NPULM_SHARED:-../shared}
model=$shared/models/stories260K.gguf
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
n=0

check() { # check NAME COMMAND...: the command must succeed
  name=$1; shift
  n=$((n + 1))
  if "$@" >"$tmp/out" 2>"$tmp/err"; then echo "ok $n - $name"; else
    echo "not ok $n - $name"; sed 's/^/#   /' "$tmp/out" "$tmp/err" | head -20; fi
}

# fails NAME PATTERN COMMAND...: the command must exit non-zero (not crash) with one line on
# stderr matching PATTERN
fails() {
  name=$1; pattern=$2; shift 2
  n=$((n + 1))
  "$@" >"$tmp/out" 2>"$tmp/err"
  rc=$?
  lines=$(wc -l <"$tmp/err")
  if [ "$rc" -ge 1 ] && [ "$rc" -lt 128 ] && [ "$lines" -eq 1 ] && grep -q -- "$pattern" "$tmp/err"; then
    echo "ok $n - $name"
  else
    echo "not ok $n - $name (exit $rc, $lines lines)"; sed 's/^/#   /' "$tmp/err" | head -10
  fi
}

greedy_story() {
  "$bin" run -m "$model" -p "Once upon a time" -n 40 --temp 0 >"$tmp/story" 2>/dev/null &&
    grep -q "^Once upon a time, there was a little girl named Lily. She loved to play outside in the park." "$tmp/story"
}
check "run: greedy stories260K continuation" greedy_story

default_model() {
  (unset NPULM_MODEL; cd "$(dirname "$0")/../.." && "$OLDPWD/$bin" run -p "Once" -n 5 --temp 0 >/dev/null 2>&1) ||
    (unset NPULM_MODEL; "$bin" run -p "Once" -n 5 --temp 0 >/dev/null 2>&1)
}
check "run: default model when -m is absent" default_model

env_model() { NPULM_MODEL="$model" "$bin" run -p "Once" -n 3 --temp 0 >/dev/null 2>&1; }
check "run: NPULM_MODEL picks the model" env_model

no_default() { (cd "$tmp" && env -u NPULM_MODEL "$OLDPWD/$bin" run -p "x" 2>&1 | grep -q "pass -m"); }
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
fails "run: unknown option" "unknown option" "$bin" run --frobnicate
fails "unknown command" "unknown command" "$bin" frobnicate

tok() { [ "$("$bin" tokenize -m "$model" -p "Hello world")" = "$("$bin" tokenize -m "$model" -p "Hello world" --text | head -1)" ] &&
  "$bin" tokenize -m "$model" -p "Hello world" | grep -Eq '^\[[0-9]+(, [0-9]+)*\]$' &&
  "$bin" tokenize -m "$model" -p "Hello" --bos | grep -q '^\[1, '; }
check "tokenize: prints [id, ...], --bos prepends BOS" tok

ppl_short() { "$bin" ppl -m "$model" -f "$shared/data/tinystories-valid.txt" -c 128 -t 2 >"$tmp/ppl" 2>/dev/null &&
  grep -q "^Final estimate: PPL = " "$tmp/ppl"; }
check "ppl: prints a final estimate" ppl_short
fails "ppl: missing text file" "cannot open" "$bin" ppl -m "$model" -f "$tmp/none.txt"
printf 'Once upon a time.' >"$tmp/short.txt"
fails "ppl: text too short" "needs at least" "$bin" ppl -m "$model" -f "$tmp/short.txt" -c 256

for c in run tokenize ppl synth; do
  check "$c --help" "$bin" "$c" --help
done
fails "synth: unknown shape" "shape" "$bin" synth --shape nonesuch -o "$tmp/x.gguf"
echo "1..$n"
