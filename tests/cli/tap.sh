# Shared by the CLI test scripts (sourced, not run): the binary, the shared data, a scratch
# folder, the two TAP checks, skips for a missing model or curl, and a server's start.
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

require_curl() { # require_curl NAME: skip the whole script without curl
  if ! command -v curl >/dev/null; then
    echo "ok 1 - $1 # SKIP no curl"
    echo "1..1"
    exit 0
  fi
}

# start_server LOG ARGS...: npulm serve on a free port in the background, its stderr in LOG;
# waits (at most 60 s) for its listening line and sets 'server_pid' and 'url'. LOG is emptied
# here, before the server starts: a LOG kept from an earlier server still has its listening line,
# and the child's own truncation may come after the first grep (then url is read from an empty
# file, or names the old port)
start_server() {
  log=$1; shift
  : >"$log"
  "$bin" serve --port 0 "$@" 2>"$log" &
  server_pid=$!
  i=0
  until grep -q 'listening on' "$log"; do
    i=$((i + 1))
    if [ "$i" -gt 600 ] || ! kill -0 "$server_pid" 2>/dev/null; then return 1; fi
    sleep 0.1
  done
  url=$(sed -n 's/.*listening on \(http:[^ ]*\) .*/\1/p' "$log")
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
