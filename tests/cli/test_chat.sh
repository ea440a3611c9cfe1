#!/bin/sh
# The prompt from a file or stdin, and the chat: two turns piped, deterministic at --temp 0, the
# second reusing the first's KV cache. Prints TAP lines.
. "$(dirname "$0")/tap.sh"
require_model chat

greedy() { "$bin" run -m "$model" -n 12 --temp 0 "$@" 2>/dev/null; }
want=$(greedy -p "Once upon a time")

printf 'Once upon a time\n' >"$tmp/prompt.txt"
from_file() { [ "$(greedy -f "$tmp/prompt.txt")" = "$want" ]; }
check "run -f: the prompt from a file (its last line break dropped)" from_file

from_dash() { [ "$(printf 'Once upon a time' | greedy -p -)" = "$want" ]; }
check "run -p -: the prompt from stdin" from_dash

from_pipe() { [ "$(printf 'Once upon a time\n' | greedy)" = "$want" ]; }
check "run: a prompt piped with neither -p nor -f is read" from_pipe

ignores_null() { [ "$(greedy -p "Once upon a time" </dev/null)" = "$want" ]; }
check "run -p: /dev/null on stdin changes nothing" ignores_null

fails "run: -p with -f" "give one" "$bin" run -m "$model" -p x -f "$tmp/prompt.txt"
fails "run -f: a missing file" "cannot open" "$bin" run -m "$model" -f "$tmp/nope.txt"
fails "run -f: a directory" "cannot read" "$bin" run -m "$model" -f "$tmp"

# two turns through a pipe, greedy: the same replies twice, one line each at most -n tokens, and
# the second turn evaluates only what the first left out of the cache
two_turns() { printf 'Once upon a time\nThe cat sat\n' | "$bin" chat -m "$model" -n 16 --temp 0 -v "$@"; }
chat_twice() {
  two_turns >"$tmp/a" 2>"$tmp/a.err" && two_turns >"$tmp/b" 2>/dev/null &&
    cmp -s "$tmp/a" "$tmp/b" && [ -s "$tmp/a" ]
}
check "chat: two piped turns, the same replies twice at --temp 0" chat_twice

reuses_cache() {
  grep -q "^turn 1: [0-9]* tokens of the conversation, 0 reused" "$tmp/a.err" &&
    reused=$(sed -n 's/^turn 2: [0-9]* tokens of the conversation, \([0-9]*\) reused.*/\1/p' "$tmp/a.err") &&
    first=$(sed -n 's/^turn 1: \([0-9]*\) tokens.*/\1/p' "$tmp/a.err") &&
    [ -n "$reused" ] && [ "$reused" -gt "$first" ]
}
check "chat: the second turn reuses the first turn's prompt and reply from the cache" reuses_cache

same_as_run_i() {
  printf 'Once upon a time\nThe cat sat\n' | "$bin" run -i -m "$model" -n 16 --temp 0 >"$tmp/c" 2>/dev/null &&
    cmp -s "$tmp/a" "$tmp/c"
}
check "run -i is npulm chat" same_as_run_i

stops_at_exit() {
  printf 'Once upon a time\n/exit\nThe cat sat\n' | "$bin" chat -m "$model" -n 16 --temp 0 -v 2>"$tmp/e" >/dev/null &&
    grep -q "^turn 1:" "$tmp/e" && ! grep -q "^turn 2:" "$tmp/e"
}
check "chat: /exit ends it" stops_at_exit

templated() {
  printf 'Hello\n' | "$bin" chat -m "$model" -n 4 --temp 0 -v --chat-template llama2 --system "Be brief" \
    2>&1 >/dev/null | grep -q "chat template: llama2, end marker '</s>'"
}
check "chat --chat-template llama2 --system: its end marker" templated

default_template() {
  printf 'Hello\n' | "$bin" chat -m "$model" -n 4 --temp 0 -v 2>&1 >/dev/null | grep -q "chat template: chatml"
}
check "chat: chatml for a model without a template" default_template

full() { printf 'Once upon a time\nThe cat sat\n' | "$bin" chat -m "$model" -n 60 --temp 0 -c 64; }
fails "chat: the context filling ends it with a line" "context of 64 tokens is full" full
too_long() { printf 'Once upon a time\n' | "$bin" chat -m "$model" --temp 0 -c 16; }
fails "chat: a conversation longer than the context" "more than the context" too_long
fails "chat: unknown template" "unknown chat template 'nope'" "$bin" chat -m "$model" --chat-template nope
fails "chat: -p does not apply" "do not apply" "$bin" chat -m "$model" -p x
fails "run: --system without a chat" "apply to a chat" "$bin" run -m "$model" --system x

help_lists() {
  "$bin" run --help >"$tmp/help" && grep -q -- "-f, --file FILE" "$tmp/help" &&
    grep -q -- "-i, --interactive" "$tmp/help" && grep -q -- "--chat-template NAME" "$tmp/help" &&
    grep -q -- "--system TEXT" "$tmp/help" && grep -q -- "- reads it from" "$tmp/help" &&
    "$bin" --help | grep -q "^  chat "
}
check "run --help and the usage name the options and chat" help_lists

echo "1..$n"
