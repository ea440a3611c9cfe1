#!/bin/sh
# Run every test program in BUILD/tests (cmocka, TAP output) and the CLI tests; print one summary
# line "N passed, N failed" and exit non-zero if anything failed. A program that crashes or exits
# non-zero without reporting a failed test counts as one failure.
# `tests/run.sh BUILD TEST...` runs only the given programs and scripts; with NPULM_EXEC set (a
# command, e.g. qemu-aarch64 and its options) the programs run through it, and the scripts see it
# (make CROSS=aarch64 test-cross).
build=${1:-build}
[ $# -gt 0 ] && shift
[ $# -gt 0 ] || set -- "$build"/tests/test_* tests/cli/test_*.sh
passed=0
failed=0
skipped=0
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for t in "$@"; do
  [ -x "$t" ] || continue
  case "$t" in *.d|*.o) continue ;; *.sh) exec_= ;; *) exec_=${NPULM_EXEC:-} ;; esac
  CMOCKA_MESSAGE_OUTPUT=TAP NPULM_BIN="$build/npulm" $exec_ "$t" >"$log" 2>&1
  rc=$?
  # a skip is "ok N # SKIP" in TAP, "not ok N # SKIP" in cmocka 1.1's TAP
  skip=$(grep -c '^\(not \)\{0,1\}ok .*# SKIP' "$log")
  ok=$(grep '^ok ' "$log" | grep -vc '# SKIP')
  bad=$(grep '^not ok ' "$log" | grep -vc '# SKIP')
  if [ "$rc" -ne 0 ] && [ "$bad" -eq 0 ]; then bad=1; fi
  passed=$((passed + ok))
  skipped=$((skipped + skip))
  failed=$((failed + bad))
  if [ "$bad" -ne 0 ]; then
    echo "FAIL $t (exit $rc):"
    grep -v '^ok ' "$log" | head -60
  else
    echo "ok   $t ($ok tests)"
  fi
done
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
