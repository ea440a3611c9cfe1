#!/bin/sh
# `npulm serve` from the outside: starts three servers on free ports (one with --api-key for the
# official openai client, one with --parallel 8 for concurrent greedy requests, one with tight
# limits for hostile clients), runs tests/serve/*.mjs against them with node and passes their TAP
# through, then stops each server with SIGTERM: it must exit 0 and its log must hold no sanitizer
# report (the script runs under the SAN and TSAN builds too). Needs node and `npm ci --prefix
# tests/serve` (.ci/install-deps does both); without them it skips, except under CI.
. "$(dirname "$0")/tap.sh"
require_model serve-clients
serve_dir=$(cd "$(dirname "$0")/../serve" && pwd)
if ! "$bin" serve --help >/dev/null 2>&1; then # a tree without the server (this branch before it)
  echo "ok 1 - serve clients # SKIP $bin has no serve command"
  echo "1..1"
  exit 0
fi
if ! command -v node >/dev/null 2>&1 || [ ! -d "$serve_dir/node_modules/openai" ]; then
  if [ -n "${CI:-}" ]; then
    echo "not ok 1 - serve clients: no node or no $serve_dir/node_modules (npm ci --prefix tests/serve)"
  else
    echo "ok 1 - serve clients # SKIP no node or no tests/serve/node_modules (npm ci --prefix tests/serve)"
  fi
  echo "1..1"
  exit 0
fi

pids=""
trap 'for p in $pids; do kill -9 "$p" 2>/dev/null; done; rm -rf "$tmp"' EXIT
trap 'exit 1' INT TERM HUP

# alive PID: the process runs (kill -0 would count a zombie not yet waited for)
alive() {
  state=$(cut -d' ' -f3 "/proc/$1/stat" 2>/dev/null)
  [ -n "$state" ] && [ "$state" != Z ]
}

# launch NAME ARGS...: starts a server in the background, logging to $tmp/NAME.log
launch() {
  name=$1; shift
  : >"$tmp/$name.log" # there before the server opens it, for the wait below
  "$bin" serve -m "$model" --port 0 "$@" >"$tmp/$name.out" 2>"$tmp/$name.log" &
  pids="$pids $!"
  eval "pid_$name=$!"
}

# listening NAME: waits for the server's "listening" line and sets port_NAME from it, or prints
# a failed check when none comes within 60 s (compiling the model under a sanitizer takes a few
# seconds) or the server exits
listening() {
  name=$1
  eval "pid=\$pid_$name"
  waited=0
  while ! grep -q 'listening on http://' "$tmp/$name.log"; do
    if ! alive "$pid" || [ "$waited" -ge 600 ]; then
      n=$((n + 1))
      echo "not ok $n - serve $name: no 'listening' line (it exited, or 60 s passed)"
      sed 's/^/#   /' "$tmp/$name.log" | tail -20
      eval "port_$name="
      return
    fi
    sleep 0.1
    waited=$((waited + 1))
  done
  eval "port_$name=$(sed -n 's|.*listening on http://127\.0\.0\.1:\([0-9][0-9]*\) .*|\1|p' "$tmp/$name.log" | head -1)"
}

# tap_through NAME PORT ENV... -- SCRIPT: runs the node script against the server on PORT with
# the environment given, renumbering its TAP lines after ours; a script that dies without a
# failing line counts as one failure
tap_through() {
  name=$1; port=$2; shift 2
  if [ -z "$port" ]; then
    n=$((n + 1)); echo "not ok $n - $name: its server did not start"; return
  fi
  env NPULM_SERVE_PORT="$port" NPULM_BIN="$bin" NPULM_MODEL="$model" "$@" >"$tmp/$name.tap" 2>"$tmp/$name.err"
  rc=$?
  awk -v n="$n" '/^(not )?ok [0-9]+/ { sub(/^ok [0-9]+/, "ok " ++n); sub(/^not ok [0-9]+/, "not ok " n); print; next }
    /^1\.\.[0-9]+$/ { next } { print }' "$tmp/$name.tap"
  n=$((n + $(grep -c '^\(not \)\{0,1\}ok [0-9]' "$tmp/$name.tap")))
  if [ "$rc" -ne 0 ] && ! grep -q '^not ok' "$tmp/$name.tap"; then
    n=$((n + 1)); echo "not ok $n - $name: node exited $rc"; sed 's/^/#   /' "$tmp/$name.err" | tail -20
  fi
}

# stop NAME: SIGTERM; the server must exit 0 within 10 s, and its log must hold no sanitizer report
stop() {
  name=$1
  eval "pid=\$pid_$name"
  [ -n "$pid" ] || return
  n=$((n + 1))
  if ! alive "$pid"; then
    wait "$pid"
    echo "not ok $n - serve $name: it died before SIGTERM (exit $?)"
  else
    kill -TERM "$pid"
    waited=0
    while alive "$pid" && [ "$waited" -lt 100 ]; do sleep 0.1; waited=$((waited + 1)); done
    if alive "$pid"; then
      echo "not ok $n - serve $name: still running 10 s after SIGTERM"
    elif wait "$pid"; then
      echo "ok $n - serve $name: SIGTERM, exit 0"
    else
      echo "not ok $n - serve $name: exit $? on SIGTERM"
      grep -v '^ *[A-Z][a-zA-Z ]*: .* [0-9a-f][0-9a-f]$\|^Shadow' "$tmp/$name.log" | tail -10 | sed 's/^/#   /'
    fi
  fi
  n=$((n + 1))
  report='ERROR: AddressSanitizer\|runtime error:\|LeakSanitizer\|ThreadSanitizer'
  if grep -q "$report" "$tmp/$name.log"; then
    echo "not ok $n - serve $name: a sanitizer report in its log"
    grep -A12 "$report" "$tmp/$name.log" | head -40 | sed 's/^/#   /'
  else
    echo "ok $n - serve $name: no sanitizer report in its log"
  fi
}

key=sk-npulm-test-$$
launch client --api-key "$key" --parallel 2
launch parallel --parallel 8 -c 512
launch hostile --api-key "$key" --parallel 1 -c 256 --timeout 2 --max-connections 8 --max-body 65536
for s in client parallel hostile; do listening "$s"; done

tap_through openai_client "$port_client" NPULM_SERVE_KEY="$key" node "$serve_dir/openai_client.mjs"
tap_through concurrent "$port_parallel" node "$serve_dir/concurrent.mjs"
tap_through hostile "$port_hostile" NPULM_SERVE_KEY="$key" NPULM_SERVE_TIMEOUT=2 NPULM_SERVE_MAX_CONNECTIONS=8 \
  NPULM_SERVE_MAX_BODY=65536 NPULM_SERVE_CTX=256 node "$serve_dir/hostile.mjs"

line() { grep -q "^npulm serve: listening on http://127\.0\.0\.1:$port_parallel (8 slots, model .*)$" "$tmp/parallel.log"; }
check "serve: the listening line as the spec gives it" line

for s in client parallel hostile; do stop "$s"; done
echo "1..$n"
