# Shared by the CLI test scripts (sourced, not run): the binary, the shared data, a scratch
# folder, the two TAP checks, and a skip for a missing model.
bin=${NPULM_BIN:-build/npulm}
bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")
shared=${NPULM_SHARED:-../shared}
model=$shared/models/stories260K.gguf
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
n=0

require_model() { # require_model NAME: skip the whole script (one TAP skip) without the model
  if [ ! -r "$model" ]; then
    echo "ok 1 - $1 # SKIP no $model"
    echo "1..1"
    exit 0
  fi
}

check() { # check NAME COMMAND...: the command must succeed
  name=$1; shift
  n=$((n + 1))
  if "$@" >"$tmp/out" 2>"$tmp/err"; then echo "ok $n - $name"; else
    echo "not ok $n - $name"; sed 's/^/#   /' "$tmp/out" "$tmp/err" | head -20; fi
}

# fails NAME PATTERN COMMAND...: the command must exit 1..127 (not crash) with one line on
# stderr matching PATTERN, besides the lines a compile prints as each phase ends ("quantize  6 / 6
# blocks in 0.8 s")
fails() {
  name=$1; pattern=$2; shift 2
  n=$((n + 1))
  "$@" >"$tmp/out" 2>"$tmp/err"
  rc=$?
  lines=$(grep -cv '^[a-z]* *[0-9.]* / [0-9.]* [a-zA-Z]* in [0-9.]* s$' "$tmp/err")
  if [ "$rc" -ge 1 ] && [ "$rc" -lt 128 ] && [ "$lines" -eq 1 ] && grep -q -- "$pattern" "$tmp/err"; then
    echo "ok $n - $name"
  else
    echo "not ok $n - $name (exit $rc, $lines lines)"; sed 's/^/#   /' "$tmp/err" | head -10
  fi
}
