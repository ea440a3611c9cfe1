#!/bin/sh
# Sparse decode and memory budgets from the command line: a program compiled with --sparsity runs
# predicted, exact and dense decode; inspect describes its layers; a memory budget from a cold
# page cache gives the unbudgeted text and prints what it read; serve decodes it as run does; bad
# use is a one-line error.
# Prints TAP lines.
. "$(dirname "$0")/tap.sh"
model=$shared/models/tinystories-5M.gguf
require_model sparse

compile_sparse() { "$bin" compile -m "$model" -o "$tmp/s.npu" --sparsity 0.5 --sparse-form neuron --calib-tokens 256; }
check "compile --sparsity 0.5" compile_sparse

inspect_layers() {
  "$bin" inspect "$tmp/s.npu" >"$tmp/inspect" && grep -q "^sparse decode: skips 50%" "$tmp/inspect" &&
    [ "$(grep -c '^ *[0-9]  *[0-9]*  tau ' "$tmp/inspect")" -eq 6 ]
}
check "inspect: the sparse decode line and one row per layer" inspect_layers

for mode in predict exact off; do
  run_mode() {
    "$bin" run -m "$tmp/s.npu" -p "Once upon a time" -n 24 --temp 0 --sparse "$1" \
      >"$tmp/$1.txt" 2>"$tmp/$1.err" && grep -q "^Once upon a time" "$tmp/$1.txt"
  }
  check "run --sparse $mode" run_mode "$mode"
done
shares() { grep -q "sparse decode: .* of neurons computed" "$tmp/predict.err" && ! grep -q "sparse decode" "$tmp/off.err"; }
check "run: the sparse shares printed, not for dense decode" shares

budget() {
  "$bin" run -m "$tmp/s.npu" -p "Once upon a time" -n 24 --temp 0 --mem-budget 3M --cold \
    >"$tmp/budget.txt" 2>"$tmp/budget.err" && cmp -s "$tmp/budget.txt" "$tmp/predict.txt" &&
    grep -q "peak RSS" "$tmp/budget.err" && grep -q "neuron bytes from memory .*, gate hit rate" "$tmp/budget.err"
}
check "run --mem-budget 3M --cold: the same text, and the storage figures" budget

ppl_decode() {
  head -c 6000 "$shared/data/tinystories-valid.txt" >"$tmp/t.txt" &&
    "$bin" ppl -m "$tmp/s.npu" -f "$tmp/t.txt" -c 64 --sparse exact --sparse-audit >"$tmp/ppl" 2>/dev/null &&
    grep -q "^Final estimate" "$tmp/ppl" && grep -q "recall 1.0000" "$tmp/ppl"
}
check "ppl --sparse exact --sparse-audit: recall 1 by definition" ppl_decode

# serve decodes the program as compiled: with one request at a time every step is one request's,
# sparse as run's, so greedy serve gives run's text (5 prompts); it says so once at start
serve_is_run() {
  start_server "$tmp/serve.log" -m "$tmp/s.npu" --parallel 2 || {
    kill "$server_pid"; cat "$tmp/serve.log"; return 1
  }
  spid=$server_pid
  ok=0
  for p in "Once upon a time" "The little dog" "Lily wanted to" "One day, Tom" "The sun was"; do
    "$bin" run -m "$tmp/s.npu" -p "$p" -n 32 --temp 0 2>/dev/null >"$tmp/run.txt"
    curl -s --max-time 60 -H 'Content-Type: application/json' \
      -d "{\"prompt\":\"$p\",\"max_tokens\":32,\"temperature\":0}" "$url/v1/completions" |
      python3 -c 'import json,sys; sys.stdout.write(sys.argv[1] + json.load(sys.stdin)["choices"][0]["text"])' "$p" \
        >"$tmp/serve.txt"
    if [ "$(cat "$tmp/run.txt")" = "$(cat "$tmp/serve.txt")" ]; then ok=$((ok + 1)); else
      echo "'$p': run and serve differ:"; cat "$tmp/run.txt"; echo; cat "$tmp/serve.txt"; echo; fi
  done
  kill -TERM "$spid"
  wait "$spid"
  [ "$ok" -eq 5 ] && grep -q "^npulm serve: sparse decode (--sparse predict): a step of one request decodes sparse" "$tmp/serve.log"
}
if command -v curl >/dev/null && command -v python3 >/dev/null; then
  check "serve: greedy text is run's for a sparse program (5 prompts), and says how it decodes" serve_is_run
else
  n=$((n + 1))
  echo "ok $n - serve: greedy text is run's for a sparse program # SKIP no curl or python3"
fi

# the input form (the default): thresholds on every block matmul's input
compile_input() { "$bin" compile -m "$model" -o "$tmp/i.npu" --sparsity 0.4 --calib-tokens 256 --quant w4a16-block; }
check "compile --sparsity 0.4 (input form, w4a16-block)" compile_input
inspect_input() {
  "$bin" inspect "$tmp/i.npu" >"$tmp/inspect-i" && grep -q "^input-sparse decode: skips 40%" "$tmp/inspect-i" &&
    [ "$(grep -c '^  blk\.[0-9]*\.[a-z_]*  *[0-9]*  *[0-9]*  *[0-9.]*%$' "$tmp/inspect-i")" -eq 42 ]
}
check "inspect: the input-sparse line and one row per block matmul (7 x 6 layers)" inspect_input
run_input() {
  "$bin" run -m "$tmp/i.npu" -p "Once upon a time" -n 24 --temp 0 -v >"$tmp/i.txt" 2>"$tmp/i.err" &&
    grep -q "^input-sparse decode: .* of input channels read .* of decode weight bytes read" "$tmp/i.err" &&
    "$bin" run -m "$tmp/i.npu" -p "Once upon a time" -n 24 --temp 0 --sparse off -v >"$tmp/i-off.txt" 2>"$tmp/i-off.err" &&
    ! grep -q "input-sparse" "$tmp/i-off.err" && grep -q "^Once upon a time" "$tmp/i-off.txt"
}
check "run -v: the input-sparse shares printed, not with --sparse off" run_input
ppl_input() {
  head -c 4000 "$shared/data/tinystories-valid.txt" >"$tmp/short.txt" &&
    "$bin" ppl -m "$tmp/i.npu" -f "$tmp/short.txt" -c 64 --decode >"$tmp/i.ppl" 2>/dev/null &&
    grep -q "^input-sparse decode: .* of decode weight bytes read (.* skipped)" "$tmp/i.ppl"
}
check "ppl --decode: the share of decode weight bytes read" ppl_input
fails "run: input-sparse decode under a memory budget" "sparse-form neuron" "$bin" run -m "$tmp/i.npu" -p x --mem-budget 100M
fails "compile: an unknown --sparse-form" "not input or neuron" "$bin" compile -m "$model" -o "$tmp/x.npu" --sparsity 0.5 --sparse-form rows

fails "compile: sparsity out of range" "not in \[0, 1)" "$bin" compile -m "$model" -o "$tmp/x.npu" --sparsity 1.5
fails "compile: sparsity needs int8 activations" "sparse decode needs" "$bin" compile -m "$model" -o "$tmp/x.npu" --sparsity 0.5 --sparse-form neuron --quant w8a16
fails "run: --sparse exact without sparse data" "compile it with --sparsity" "$bin" run -m "$model" -p x -n 2 --sparse exact
fails "run: unknown --sparse mode" "not predict, exact or off" "$bin" run -m "$tmp/s.npu" -p x --sparse some
fails "run: a memory budget on a GGUF" "needs a program file" "$bin" run -m "$model" -p x --mem-budget 100M
fails "run: a budget too small for the neuron cache" "needs at least" "$bin" run -m "$tmp/s.npu" -p x --mem-budget 1M
fails "run: a budget that is not a size" "is not a size" "$bin" run -m "$tmp/s.npu" -p x --mem-budget lots
echo "1..$n"
