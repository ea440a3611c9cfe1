#!/bin/sh
# npulm export against its contract (the exported model's interface: README, "npulm export"): for
# stories260K (every precision and f32), tinystories-5M, a qwen2 shape and stories27M (f32), a
# program is compiled once (npulm compile) and exported as a decode (and a prefill:16) model over
# the 128-position bucket; each passes
# tests/export/check_onnx.py (the ONNX checker, the interface, the QDQ nodes, the encodings), and
# under onnxruntime (tests/export/ort_check.mjs) gives npulm's own logits (export_ref, run on the
# same program) within TOL and its greedy tokens exactly, prompt token by token through the decode
# model and then through the prefill model. Bad use is a one-line error that leaves no file.
# Needs python3 with onnx (python3-onnx), node and `npm ci --prefix tests/export` (.ci/install-deps
# does all three); without them it skips, except under CI. Prints TAP lines.
. "$(dirname "$0")/tap.sh"
require_model export
export_dir=$(cd "$(dirname "$0")/../export" && pwd)
export_ref=$(dirname "$bin")/tests/export_ref # built by make tests / make test

# How near onnxruntime's logits must be to npulm's (export_ref, the same program), by the
# precision of the activations: the largest |difference| over every compared row (TOL), and the
# median over the decode steps of each step's largest (MEDIAN). The two cannot agree bit for bit:
# - onnxruntime computes QDQ in float (QuantizeLinear rounds x / scale half to even after float
#   sums), npulm in integers (exact sums, one fixed-point multiply rounding half up), so an
#   activation whose real value lies within float error of a rounding boundary lands one step
#   apart. That is rare: with int8 activations most steps agree bit for bit (median 0 measured on
#   both models), but one int8 step before the classifier moves the logits by that step times the
#   classifier's weights (stories260K's output norm has a step of 0.13): up to 0.60 measured, so
#   TOL is 1.0, while MEDIAN (0.01, a few steps of the int16 logits) is what catches a systematic
#   error, which would move every step.
# - int16 activations' GEMMs narrow their int64 sums by 2^acc_shift before the multiplier (a
#   second rounding the ONNX graph does not have), so every step differs a little: 0.005 (w8a16,
#   tinystories-5M) and 0.028 (w4a16-block, stories260K) measured at most, medians 0.003 and 0.015.
# - f32 programs differ only in the order of float sums (1.6e-5 measured).
# - attention on the NPU (--float-ops none): ONNX's softmax is float where npulm's is an exp2
#   table in fixed point, and the int8 K/V copies and int16 scores move with every flip before
#   them: a median step of 0.96 and at most 1.59 measured (stories260K w8a8), where npulm's own
#   integer attention differs from its float one by 1.53 median; TOL 3, MEDIAN 1.5, and the
#   first 16 greedy tokens npulm's (31 of 32 measured).
# Besides, every greedy token must be npulm's (SAME, default all).
tolerances() {
  SAME=32
  case $1 in
  f32) TOL=1e-4; MEDIAN=1e-4 ;;
  *a16*) TOL=0.1; MEDIAN=0.05 ;;
  npu-attention) TOL=3; MEDIAN=1.5; SAME=16 ;;
  *) TOL=1.0; MEDIAN=0.01 ;;
  esac
}

# a tree without the exporter (this branch before it) skips, as test_serve_clients.sh does
if ! "$bin" export --help >/dev/null 2>&1; then
  echo "ok 1 - export # SKIP $bin has no export command"
  echo "1..1"
  exit 0
fi
py=
for p in python3 /usr/bin/python3; do # Debian's python3-onnx is /usr/bin/python3's
  if "$p" -c 'import onnx, xxhash' >/dev/null 2>&1; then py=$p; break; fi
done
if [ -z "$py" ] || ! command -v node >/dev/null 2>&1 ||
  [ ! -d "$export_dir/node_modules/onnxruntime-node" ]; then
  what="no python3 with onnx and xxhash (python3-onnx, python3-xxhash), no node or no"
  what="$what tests/export/node_modules"
  what="$what (npm ci --prefix tests/export)"
  if [ -n "${CI:-}" ]; then
    echo "not ok 1 - export: $what"
  else
    echo "ok 1 - export # SKIP $what"
  fi
  echo "1..1"
  exit 0
fi

# ort NAME ARGS...: ort_check.mjs must pass; its lines (the max |d| measured) are printed as TAP
# comments either way, for setting TOL
ort() {
  what=$1; shift
  n=$((n + 1))
  if node "$export_dir/ort_check.mjs" "$@" --tol "$TOL" --median-tol "$MEDIAN" \
    --same-tokens "$SAME" >"$tmp/out" 2>"$tmp/err"; then
    echo "ok $n - $what"
  else
    echo "not ok $n - $what"
  fi
  sed 's/^/#   /' "$tmp/out" "$tmp/err" | head -20
}

prompt="Once upon a time"
# a qwen2 shape (random weights): Q/K/V biases, NeoX RoPE, 4 query heads a KV head
check "synth tiny-qwen2" "$bin" synth --shape tiny-qwen2 -o "$tmp/tiny-qwen2.gguf"
# MODEL QUANT SPECIALIZATIONS: every precision on stories260K, its attention on the NPU and
# w8a8-shadow with outlier channels,
# decode and prefill:16 on the default and one int16 precision of each model; stories27M in f32
# has more lazily written weights than any other here
for spec in "stories260K w8a8-smooth decode,prefill:16" "stories260K w4a16-block decode,prefill:16" \
  "stories260K f32 decode,prefill:16" "stories260K w8a16-naive decode" "stories260K w4a16 decode" \
  "stories260K w4a8 decode" "tinystories-5M w8a8-smooth decode,prefill:16" \
  "tinystories-5M w8a16 decode,prefill:16" "tiny-qwen2 w8a8-smooth decode,prefill:16" \
  "tiny-qwen2 w8a16 decode,prefill:16" "stories27M f32 decode" \
  "stories260K npu-attention decode,prefill:16" "stories260K shadow-outliers decode,prefill:16"; do
  # shellcheck disable=SC2086 # three words
  set -- $spec
  mname=$1; quant=$2; specs=$3 # not 'name': check and fails set that
  gguf=$shared/models/$mname.gguf
  [ "$mname" = tiny-qwen2 ] && gguf=$tmp/tiny-qwen2.gguf
  if [ ! -r "$gguf" ]; then
    n=$((n + 1)); echo "ok $n - export $mname # SKIP no $gguf"; continue
  fi
  tolerances "$quant"
  m=$tmp/$mname.$quant
  if [ "$quant" = npu-attention ]; then # w8a8-smooth with attention on the NPU
    check "$mname $quant: compile" "$bin" compile -m "$gguf" -o "$m.npu" --float-ops none
  elif [ "$quant" = shadow-outliers ]; then # w8a8-shadow, with outlier channels to shadow
    check "$mname $quant: compile" "$bin" compile -m "$gguf" -o "$m.npu" --quant w8a8-shadow \
      --shadow-threshold 2
  else
    check "$mname $quant: compile" "$bin" compile -m "$gguf" -o "$m.npu" --quant "$quant"
  fi
  for s in $(echo "$specs" | tr , ' '); do
    out=$m.$(echo "$s" | tr -d :)
    check "$mname $quant: export --specialization $s --ctx 128" \
      "$bin" export -m "$m.npu" -o "$out.onnx" --specialization "$s" --ctx 128
    check "$mname $quant $s: check_onnx.py" \
      "$py" "$export_dir/check_onnx.py" "$out.onnx" "$out.encodings.json"
  done
  check "$mname $quant: export_ref (npulm's logits, 32 steps)" \
    "$export_ref" "$m.npu" "$m.ref" --prompt "$prompt" --steps 32 --ctx 128
  ort "$mname $quant: onnxruntime, prompt through decode" --decode "$m.decode.onnx" --ref "$m.ref"
  case $specs in *prefill:16*)
    ort "$mname $quant: onnxruntime, prompt through prefill:16" \
      --decode "$m.decode.onnx" --prefill "$m.prefill16.onnx" --ref "$m.ref" ;;
  esac
done

# from the GGUF, compiled in memory for the one specialization (any bucket), the weights as
# external data: the same model as the program's export
m=$tmp/stories260K.w8a8-smooth
check "export from the GGUF, --external-data" "$bin" export -m "$shared/models/stories260K.gguf" \
  -o "$tmp/ext.onnx" --ctx 128 --external-data
has_data() { [ -s "$tmp/ext.onnx.data" ]; }
check "export --external-data: the weights are in ext.onnx.data" has_data
check "export --external-data: check_onnx.py" \
  "$py" "$export_dir/check_onnx.py" "$tmp/ext.onnx" "$tmp/ext.encodings.json"
tolerances w8a8-smooth
ort "export --external-data: onnxruntime" --decode "$tmp/ext.onnx" --ref "$m.ref"
# one weight byte changed in the data file, one byte of the encodings: the digests the model
# names catch each
mkdir "$tmp/bad"
cp "$tmp/ext.onnx" "$tmp/ext.onnx.data" "$tmp/ext.encodings.json" "$tmp/bad/"
printf '\177' | dd of="$tmp/bad/ext.onnx.data" bs=1 seek=100 conv=notrunc 2>/dev/null
bad_check() { "$py" "$export_dir/check_onnx.py" "$@" >&2; }
fails "check_onnx: a changed weight byte" "initializers_xxh3_64" \
  bad_check "$tmp/bad/ext.onnx" "$tmp/bad/ext.encodings.json"
cp "$tmp/ext.onnx.data" "$tmp/bad/"
sed -i 's/"version": "0.6.1"/"version": "0.6.2"/' "$tmp/bad/ext.encodings.json"
fails "check_onnx: a changed encodings byte" "encodings_xxh3_64" \
  bad_check "$tmp/bad/ext.onnx" "$tmp/bad/ext.encodings.json"
check "export from the GGUF at a bucket of 100 (compiled for it)" \
  "$bin" export -m "$shared/models/stories260K.gguf" -o "$tmp/c100.onnx" --ctx 100
# a chunk as long as its bucket has no past slots: the first chunk of a prompt
check "export prefill:128 at context 128 (no past inputs)" "$bin" export -m "$m.npu" \
  -o "$tmp/p128.onnx" --specialization prefill:128 --ctx 128
check "export prefill:128 at 128: check_onnx.py" \
  "$py" "$export_dir/check_onnx.py" "$tmp/p128.onnx" "$tmp/p128.encodings.json"
ort "export prefill:128 at 128: onnxruntime, prompt through it" --decode "$m.decode.onnx" \
  --prefill "$tmp/p128.onnx" --ref "$m.ref"

# bad use, on the first program: one line, non-zero exit, no output file
npu=$tmp/stories260K.w8a8-smooth.npu
fails "export: a prefill chunk the program lacks" "prefill:7\|chunk" \
  "$bin" export -m "$npu" -o "$tmp/e.onnx" --specialization prefill:7 --ctx 128
fails "export: a context bucket the program lacks" "100" \
  "$bin" export -m "$npu" -o "$tmp/e.onnx" --ctx 100
fails "export: an output folder that does not exist" "nonexistent-dir" \
  "$bin" export -m "$npu" -o /nonexistent-dir/x.onnx
fails "export: an unknown specialization" "bogus" \
  "$bin" export -m "$npu" -o "$tmp/e.onnx" --specialization bogus
fails "export: --quant with a program file" "quant" \
  "$bin" export -m "$npu" -o "$tmp/e.onnx" --quant w8a16
no_file() { [ ! -e "$tmp/e.onnx" ] && [ ! -e "$tmp/e.encodings.json" ]; }
check "export: the failed exports left no file" no_file

echo "1..$n"
