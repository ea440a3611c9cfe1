#!/bin/sh
# npulm bench: the llama-bench table and JSON (its field names, so its tools read ours), the
# roofline ceilings and the SVG plot, and one-line errors for bad arguments. Prints TAP lines.
. "$(dirname "$0")/tap.sh"

require_model bench

# one small run of each format, reused by several checks
"$bin" bench -m "$model" -p 16,32 -n 8 -r 2 -t 1 >"$tmp/md" 2>"$tmp/md.err"
"$bin" bench -m "$model" -p 16 -n 4 -r 3 -t 1 -o json >"$tmp/json" 2>"$tmp/json.err"
"$bin" bench -m "$model" -p 16 -n 4 -r 2 -t 1 --roofline --plot "$tmp/roof.svg" >"$tmp/roof" 2>"$tmp/roof.err"

table() {
  head -1 "$tmp/md" | grep -Eq '^\| model +\| +size \| +params \| backend +\| threads \| +test \| +t/s \| +ttft ms \| +peak RSS \|$' &&
    sed -n 2p "$tmp/md" | grep -q '^| -*- | -*: |' &&
    grep -Eq '^\| llama 260K w8a8-smooth +\| +0\.[0-9]+ MiB \| +0\.26 M \| NPU,CPU +\| +1 \| +pp16 \| +[0-9.]+ ± [0-9.]+ \| +[0-9.]+ \| +[0-9.]+ MiB \|$' "$tmp/md" &&
    grep -Eq '\| +pp32 \|' "$tmp/md" && grep -Eq '\| +tg8 \|' "$tmp/md" &&
    [ "$(grep -c '^| llama' "$tmp/md")" -eq 3 ] && grep -q '^build: npulm' "$tmp/md"
}
check "bench: llama-bench table with one row per test, t/s as mean ± sd" table

json_fields() {
  python3 - "$tmp/json" <<'EOF'
import json, sys
rows = json.load(open(sys.argv[1]))
assert isinstance(rows, list) and len(rows) == 2, rows
need = ["build_commit", "cpu_info", "backends", "model_filename", "model_type", "model_size",
        "model_n_params", "n_batch", "n_ubatch", "n_threads", "type_k", "type_v", "n_prompt",
        "n_gen", "n_depth", "test_time", "avg_ns", "stddev_ns", "avg_ts", "stddev_ts",
        "samples_ns", "samples_ts", "ttft_ms", "peak_rss_bytes"]
for r in rows:
    for k in need:
        assert k in r, k
    assert r["n_threads"] == 1 and len(r["samples_ns"]) == 3 and len(r["samples_ts"]) == 3
    assert r["avg_ts"] > 0 and r["stddev_ts"] >= 0 and r["peak_rss_bytes"] > 0
    n = r["n_prompt"] + r["n_gen"]
    ts = [1e9 * n / s for s in r["samples_ns"]]
    assert all(abs(a - b) <= 1e-6 * a for a, b in zip(ts, r["samples_ts"]))
    assert abs(sum(ts) / len(ts) - r["avg_ts"]) <= 1e-6 * r["avg_ts"]
assert (rows[0]["n_prompt"], rows[0]["n_gen"]) == (16, 0)
assert (rows[1]["n_prompt"], rows[1]["n_gen"]) == (0, 4)
EOF
}
if command -v python3 >/dev/null 2>&1; then
  check "bench -o json: an array with llama-bench's field names and consistent t/s" json_fields
else
  n=$((n + 1)); echo "ok $n - bench -o json fields # SKIP no python3"
fi
# each test's own peak RSS: a small decode test after a larger prefill one reports less than it
# (a process-wide peak could only grow); the larger session's memory is given back when freed
per_test_rss() {
  "$bin" bench -m "$model" -p 512 -n 4 -r 1 -t 1 -o json >"$tmp/rss.json" 2>/dev/null &&
    python3 - "$tmp/rss.json" <<'EOF'
import json, sys
rows = json.load(open(sys.argv[1]))
pp, tg = rows[0]["peak_rss_bytes"], rows[1]["peak_rss_bytes"]
assert (rows[0]["n_prompt"], rows[1]["n_gen"]) == (512, 4)
assert 0 < tg < pp, (pp, tg)
EOF
}
if command -v python3 >/dev/null 2>&1 && [ -w /proc/self/clear_refs ]; then
  check "bench: peak RSS is each test's own" per_test_rss
else
  n=$((n + 1)); echo "ok $n - bench per-test peak RSS # SKIP no python3 or /proc/self/clear_refs"
fi
# --profile: per test, node time by operator; the matmuls' work is what the model's shapes say
# (a decode step multiplies every weight once: MACs per token = the weights the matmuls read,
# less the packed layout's per-channel header)
"$bin" bench -m "$model" -p 16 -n 4 -r 2 -t 1 --profile >"$tmp/prof" 2>"$tmp/prof.err"
"$bin" bench -m "$model" -p 16 -n 4 -r 2 -t 1 --profile -o json >"$tmp/prof.json" 2>/dev/null
profile_md() {
  grep -q '^profile of pp16, per run (wall [0-9.]* ms; node time [0-9.]* ms' "$tmp/prof" &&
    grep -q '^profile of tg4, per run' "$tmp/prof" &&
    grep -q '^workers in their subgraphs: NPU [0-9.]* ms, CPU [0-9.]* ms, both at once [0-9.]* ms' "$tmp/prof" &&
    grep -Eq '^\| matmul +\| NPU +\| +[1-9][0-9]* \| +[0-9.]+ \| +[0-9.]+% \| +[0-9.]+ \| +[0-9.]+ \|$' "$tmp/prof" &&
    grep -Eq '^\| attn +\| CPU +\|' "$tmp/prof" &&
    awk -F'|' '/^profile of tg4/ {on = 1} on && $3 ~ /NPU|CPU/ {gsub(/[ %]/, "", $6); s += $6}
               END {exit !(s > 99.5 && s < 100.5)}' "$tmp/prof"
}
check "bench --profile: a table per test, its shares adding up to 100%" profile_md
profile_json() {
  python3 - "$tmp/prof.json" <<'EOF'
import json, sys
rows = json.load(open(sys.argv[1]))
tg = [r for r in rows if r["n_gen"] == 4][0]
mm = [e for e in tg["profile"] if e["op"] == "matmul" and e["backend"] == "NPU"][0]
assert mm["ms_per_run"] > 0 and mm["macs_per_run"] > 0
per_token = mm["macs_per_run"] / 4
assert per_token == int(per_token), per_token
# the packed layout adds 8 bytes per output channel (128 per 16): an eighth at this model's k = 64
assert per_token < mm["weight_bytes_per_run"] / 4 < 1.2 * per_token, mm
EOF
}
if command -v python3 >/dev/null 2>&1; then
  check "bench --profile -o json: decode matmul MACs match the weights they read" profile_json
else
  n=$((n + 1)); echo "ok $n - bench --profile json # SKIP no python3"
fi
json_only() { [ ! -s "$tmp/json.err" ] && [ "$(head -c 1 "$tmp/json")" = "[" ]; }
check "bench -o json: nothing but JSON" json_only

ceilings() {
  grep -Eq '^  int8 compute +[0-9]*[1-9][0-9]*\.[0-9]+ GMAC/s' "$tmp/roof" &&
    grep -Eq '^  w4a8 compute +[0-9.]+ GMAC/s  NPU kernel qs8_qc4w_gemm__' "$tmp/roof" &&
    grep -Eq '^  w8a16 compute +[0-9.]+ GMAC/s  NPU kernel qs16_gemm_qs16__' "$tmp/roof" &&
    grep -Eq '^  w4a16 compute +[0-9.]+ GMAC/s  NPU kernel qs16_qc4w_gemm_qs16__.* blocks [0-9.]+\)$' "$tmp/roof" &&
    ! grep -Eq '^  w[48]a[0-9]+ compute +0\.00 ' "$tmp/roof" &&
    grep -Eq '^  ridge point +[0-9.]+ MAC/byte \(w8a8\)$' "$tmp/roof" &&
    grep -q '^pp16: .* the w8a8 ceiling allows' "$tmp/roof" &&
    grep -Eq '^  memory +[0-9.]+ GB/s' "$tmp/roof" &&
    ! grep -Eq '^  (int8 compute|memory) +0\.00 ' "$tmp/roof" &&
    grep -Eq '^\| +pp16 \| +1 \| +[0-9.]+ \| .*% \|' "$tmp/roof" &&
    grep -Eq '^\| +tg4 \| .* memory \|' "$tmp/roof" &&
    grep -q 'hexagon-v75 t/s' "$tmp/roof" && grep -q 'm4-ane t/s' "$tmp/roof" &&
    grep -q 'mtl-npu t/s' "$tmp/roof" && grep -q '^tg4: .* MB per token' "$tmp/roof" &&
    grep -Eq '^\| +test \| .* % ceiling \| +% paired \|' "$tmp/roof" &&
    grep -Eq '^tg4: .* around each repetition \([0-9.]+-[0-9.]+ GB/s\), ([0-9.]+% \(median of the [12] of 2 whose two agree within 10%\)|none whose two agree within 10%); each against the better of its two, [0-9.]+% \(median\)$' \
      "$tmp/roof"
}
check "bench --roofline: positive ceilings, % of ceiling, NPU predictions, bytes per token" ceilings
# the paired figures: each repetition against the bandwidths measured right before and after it,
# the median over those whose two agree within 10 % (none: null), and over all against the better
# of the two; the measurement's buffer (256 MiB or more) is not the test's peak RSS
paired_json() {
  "$bin" bench -m "$model" -p 16 -n 4 -r 3 -t 1 --roofline -o json >"$tmp/paired.json" \
    2>/dev/null &&
    python3 - "$tmp/paired.json" "$1" <<'EOF'
import json, statistics, sys
def check(rl, key, pcts, known):
    assert abs(rl[key + "_all"] - statistics.median(pcts)) < 1e-6 * rl[key + "_all"], (rl, key)
    kept = [p for p, k in zip(pcts, known) if k]
    if kept:
        want = statistics.median(kept)
        assert abs(rl[key] - want) < 1e-6 * want, (rl, key, want)
    else:
        assert rl[key] is None, (rl, key)
    return len(kept)
rows = json.load(open(sys.argv[1]))
for r in rows:
    rl = r["roofline"]
    around = rl["mem_bytes_per_s_around_reps"]
    ts = r["samples_ts"]
    assert len(around) == len(ts) + 1, around
    assert all(b > 1e8 for b in around), around
    lo = [min(around[i], around[i + 1]) for i in range(len(ts))]
    hi = [max(around[i], around[i + 1]) for i in range(len(ts))]
    if r["n_gen"] > 0:
        n = check(rl, "pct_of_bandwidth_paired",
                  [100 * t * rl["bytes_per_token"] / b for t, b in zip(ts, hi)],
                  [a >= 0.9 * b for a, b in zip(lo, hi)])
        assert rl["reps_paired_bandwidth"] == n, rl
    macs_per_token = rl["macs"] / (r["n_prompt"] + r["n_gen"])
    assert rl["peak_macs_per_s"] == rl["int8_macs_per_s"], rl  # an int8 program
    roof = lambda b: min(rl["peak_macs_per_s"], rl["intensity"] * b)
    n = check(rl, "pct_of_ceiling_paired",
              [100 * t * macs_per_token / roof(b) for t, b in zip(ts, hi)],
              [roof(a) >= 0.9 * roof(b) for a, b in zip(lo, hi)])
    assert rl["reps_paired_ceiling"] == n, rl
    if sys.argv[2] == "rss":
        assert r["peak_rss_bytes"] < 128 << 20, r["peak_rss_bytes"]
EOF
}
if command -v python3 >/dev/null 2>&1; then
  rss=no
  [ -w /proc/self/clear_refs ] && rss=rss
  check "bench --roofline -o json: paired % figures agree with the samples and bandwidths" \
    paired_json "$rss"
else
  n=$((n + 1)); echo "ok $n - bench --roofline paired json # SKIP no python3"
fi
# a w4a16 program is placed against its own ceiling: the host's w4a16 GEMM, named as such
precision_json() {
  "$bin" bench -m "$model" -p 16 -n 0 -r 1 -t 1 --roofline --quant w4a16 -o json \
    >"$tmp/w4a16.json" 2>/dev/null &&
    python3 - "$tmp/w4a16.json" <<'EOF'
import json, sys
rows = json.load(open(sys.argv[1]))
rl = rows[0]["roofline"]
assert rows[0]["quant"] == "w4a16-naive" and rl["precision"] == "w4a16", rl
assert rl["peak_macs_per_s"] == rl["w4a16_macs_per_s"] > 0, rl
for k in ["w4a8_macs_per_s", "w8a16_macs_per_s", "w4a16_block_macs_per_s"]:
    assert rl[k] > 0, (k, rl)
assert rl["kernel_w4a16"].startswith("qs16_qc4w_gemm_qs16__"), rl
EOF
}
if command -v python3 >/dev/null 2>&1; then
  check "bench --roofline --quant w4a16: placed against the w4a16 GEMM's ceiling" precision_json
else
  n=$((n + 1)); echo "ok $n - bench --roofline precision json # SKIP no python3"
fi
svg() {
  head -c 200 "$tmp/roof.svg" | grep -q '^<svg ' && tail -1 "$tmp/roof.svg" | grep -q '</svg>' &&
    grep -q 'arithmetic intensity' "$tmp/roof.svg" && grep -q '<circle' "$tmp/roof.svg" &&
    grep -q 'pp16' "$tmp/roof.svg" && grep -q 'tg4' "$tmp/roof.svg" &&
    { ! command -v python3 >/dev/null 2>&1 ||
      python3 -c 'import sys, xml.dom.minidom as m; m.parse(sys.argv[1])' "$tmp/roof.svg"; }
}
check "bench --plot: writes a well-formed SVG with the points" svg

usage_lists() { "$bin" --help | grep -q "^  bench"; }
check "usage lists bench" usage_lists
check "bench --help" "$bin" bench --help

fails "bench: bad prompt list" "not a list" "$bin" bench -m "$model" -p 16,abc
fails "bench: zero repetitions" "not an integer" "$bin" bench -m "$model" -r 0
fails "bench: unknown output format" "not md or json" "$bin" bench -m "$model" -o xml
fails "bench: unknown option" "unknown option" "$bin" bench -m "$model" --fast
fails "bench: missing model" "cannot open" "$bin" bench -m "$tmp/nope.gguf"
fails "bench: test longer than the context" "does not fit" "$bin" bench -m "$model" -p 4096 -n 0
fails "bench: no tests" "no tests" "$bin" bench -m "$model" -p 0 -n 0
fails "bench: unwritable plot" "cannot write" "$bin" bench -m "$model" --plot "$tmp/no/such/dir.svg"
echo "1..$n"
