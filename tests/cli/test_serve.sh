#!/bin/sh
# npulm serve over HTTP with curl: every endpoint, streamed and not (status, the JSON's shape,
# finish_reason and usage), greedy output the same streamed or not, stop strings, the context's
# end, OpenAI error objects and statuses (logprobs refused by name), the API key, --alias, the
# connection limit and request timeout, bad options, and a prompt exit 0 on SIGTERM. The JSON is checked as text: the server writes it
# compact, fields in a fixed order.
. "$(dirname "$0")/tap.sh"
require_model "npulm serve"
require_curl "npulm serve"
pids=
trap 'for p in $pids; do kill "$p" 2>/dev/null; done; rm -rf "$tmp"' EXIT

# start LOG ARGS...: the server on the model (start_server), its pid in 'pid' too
start() {
  l=$1; shift
  start_server "$l" -m "$model" "$@"
  started=$?
  pid=$server_pid
  pids="$pids $pid"
  return $started
}

# req PATH [CURL ARGS...]: the response's body in $tmp/body, its headers in $tmp/headers, its
# status in $tmp/status
req() {
  path=$1; shift
  curl -s -o "$tmp/body" -D "$tmp/headers" -w '%{http_code}' --max-time 30 "$@" "$url$path" \
    >"$tmp/status"
}
post() { # post PATH BODY [CURL ARGS...]
  p=$1 d=$2; shift 2
  req "$p" -H 'Content-Type: application/json' -d "$d" "$@"
}
status_is() {
  [ "$(cat "$tmp/status")" = "$1" ] || { echo "status $(cat "$tmp/status"), not $1"; cat "$tmp/body"; return 1; }
}
has() { # has TEXT...: the body holds each TEXT
  for t; do grep -qF -- "$t" "$tmp/body" || { echo "no '$t' in:"; cat "$tmp/body"; return 1; }; done
}
# the JSON string value of the body's first field NAME (escapes kept)
field() { sed -n 's/.*"'"$1"'":"\(\([^"\\]\|\\.\)*\)".*/\1/p' "$tmp/body" | head -n 1; }
# the stream's pieces of field NAME, concatenated (escapes kept)
pieces() { sed -n 's/^data: .*"'"$1"'":"\(\([^"\\]\|\\.\)*\)".*/\1/p' "$tmp/body" | tr -d '\n'; }
# is_error STATUS TYPE: an OpenAI error object with this status
is_error() {
  status_is "$1" && has '{"error":{"message":"' "\"type\":\"$2\""
}

check "starts and says where it listens" start "$tmp/log1" -c 128 --parallel 2
case $url in http://127.0.0.1:[1-9]*) ;; *) echo "not ok - no listening address: '$url'"; exit 1 ;; esac

t_health() { req /health && status_is 200 && has '{"status":"ok"}'; }
check "GET /health: 200 {\"status\":\"ok\"}" t_health

t_models() {
  req /v1/models && status_is 200 &&
    has '{"object":"list","data":[{"id":"stories260K.gguf","object":"model","created":' \
      '"owned_by":"npulm"}]}'
}
check "GET /v1/models lists the model by its file name" t_models

greedy='{"prompt":"Once upon a time","max_tokens":12,"temperature":0'
t_completion() {
  post /v1/completions "$greedy}" && status_is 200 &&
    has '{"id":"cmpl-' '"object":"text_completion"' '"model":"stories260K.gguf"' \
      '"finish_reason":"length"' \
      '"usage":{"prompt_tokens":5,"completion_tokens":12,"total_tokens":17}' &&
    grep -q 'Content-Type: application/json' "$tmp/headers" &&
    text=$(field text) && [ -n "$text" ]
}
check "POST /v1/completions: text, finish_reason length at max_tokens, usage" t_completion

t_stream() {
  post /v1/completions "$greedy,\"stream\":true}" && status_is 200 &&
    grep -q 'Content-Type: text/event-stream' "$tmp/headers" &&
    [ "$(grep -c '^data: {"id":"cmpl-.*"object":"text_completion"' "$tmp/body")" -ge 12 ] &&
    has '"finish_reason":"length"}],"usage":{"prompt_tokens":5,"completion_tokens":12' &&
    [ "$(grep -v '^$' "$tmp/body" | tail -n 1)" = "data: [DONE]" ] &&
    [ "$(pieces text)" = "$text" ]
}
check "stream: an event per piece, usage, data: [DONE]; the same text as unstreamed" t_stream

t_chat() {
  post /v1/chat/completions '{"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Tell a story."}],"max_tokens":6,"temperature":0}' &&
    status_is 200 &&
    has '{"id":"chatcmpl-' '"object":"chat.completion"' \
      '"choices":[{"index":0,"message":{"role":"assistant","content":"' '"finish_reason":"' \
      '"usage":{"prompt_tokens":' &&
    chat=$(field content)
}
check "POST /v1/chat/completions: the assistant's message, finish_reason, usage" t_chat

# a chat's default length is what fits (OpenAI's), not a completion's 16 tokens; and its newer
# field max_completion_tokens
t_chat_lengths() {
  post /v1/chat/completions '{"messages":[{"role":"user","content":"Tell a story."}],"temperature":0,"ignore_eos":true}' &&
    status_is 200 && has '"finish_reason":"length"' &&
    k=$(sed -n 's/.*"completion_tokens":\([0-9]*\).*/\1/p' "$tmp/body") && [ "$k" -gt 16 ] &&
    post /v1/chat/completions '{"messages":[{"role":"user","content":"Hi"}],"max_completion_tokens":5,"ignore_eos":true}' &&
    status_is 200 && has '"completion_tokens":5,'
}
check "chat: by default as long as the context allows; max_completion_tokens" t_chat_lengths

t_chat_stream() {
  post /v1/chat/completions '{"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Tell a story."}],"max_tokens":6,"temperature":0,"stream":true}' &&
    status_is 200 &&
    head -n 1 "$tmp/body" | grep -qF '"object":"chat.completion.chunk"' &&
    head -n 1 "$tmp/body" | grep -qF '"delta":{"role":"assistant","content":""}' &&
    has '"delta":{},"finish_reason":"' '"usage":{"prompt_tokens":' &&
    [ "$(grep -v '^$' "$tmp/body" | tail -n 1)" = "data: [DONE]" ] &&
    [ "$(pieces content)" = "$chat" ]
}
check "chat stream: the role first, deltas, usage, [DONE]; the same text" t_chat_stream

# a stop string from the middle of the greedy text: the text ends just before it
t_stop() {
  stop=$(printf '%s' "$text" | cut -c6-9)
  case $stop in *[\\\"]* | "") echo "no plain stop string in '$text'"; return 1 ;; esac
  post /v1/completions "$greedy,\"stop\":[\"zzzz\",\"$stop\"]}" && status_is 200 &&
    has '"finish_reason":"stop"' && got=$(field text) &&
    case $text in "$got$stop"*) true ;; *) echo "'$got' + '$stop' does not start '$text'"; false ;; esac
}
check "stop: finish_reason stop, the text ends before the stop string" t_stop

t_ignore_eos() {
  post /v1/completions '{"prompt":"Once","max_tokens":4,"ignore_eos":"yes"}' &&
    is_error 400 invalid_request_error && has '"param":"ignore_eos"' &&
    post /v1/completions '{"prompt":"Once","max_tokens":4,"ignore_eos":true}' && status_is 200 &&
    has '"finish_reason":"length"' '"completion_tokens":4'
}
check "ignore_eos (llama-server's extension): a boolean, else 400" t_ignore_eos

t_zero() {
  post /v1/completions '{"prompt":"Once","max_tokens":0}' && status_is 200 &&
    has '"text":"","finish_reason":"length"' '"completion_tokens":0'
}
check "max_tokens 0: no text, finish_reason length" t_zero

t_context_end() {
  post /v1/completions '{"prompt":"Once upon a time","max_tokens":1000,"temperature":0}' &&
    status_is 200 && has '"finish_reason":' &&
    k=$(sed -n 's/.*"completion_tokens":\([0-9]*\).*/\1/p' "$tmp/body") && [ "$k" -le 123 ] &&
    { [ "$k" -eq 123 ] && has '"finish_reason":"length"' || has '"finish_reason":"stop"'; }
}
check "generation ends at the context (-c 128): length after 123 tokens, unless it stopped" \
  t_context_end

long=$(i=0; while [ $i -lt 60 ]; do printf 'once upon a time '; i=$((i + 1)); done)
t_long() {
  post /v1/completions "{\"prompt\":\"$long\"}" && is_error 400 invalid_request_error &&
    has '"code":"context_length_exceeded"'
}
check "a prompt longer than the context: 400 context_length_exceeded" t_long

t_404() { req /v1/nothing && is_error 404 invalid_request_error; }
check "unknown path: 404" t_404
# error messages quote the client's bytes: invalid UTF-8 there becomes U+FFFD, still an answer
t_404_utf8() {
  req '/v1/%FF%C3' && is_error 404 invalid_request_error && has "$(printf '\357\277\275')" &&
    post /v1/completions "$(printf '{"prompt":"a","model":"x\303"}')" &&
    status_is 400 && has '{"error":{"message":"'
}
check "an error quoting invalid UTF-8 (path, model): answered, with U+FFFD" t_404_utf8
t_405() {
  req /v1/completions && is_error 405 invalid_request_error && grep -q '^Allow: POST' "$tmp/headers"
}
check "GET on a POST endpoint: 405" t_405
t_405b() { post /v1/models '{}' && is_error 405 invalid_request_error; }
check "POST on a GET endpoint: 405" t_405b
t_model() {
  post /v1/completions '{"prompt":"a","model":"gpt-4"}' && is_error 404 invalid_request_error &&
    has '"code":"model_not_found"'
}
check "an unknown model: 404 model_not_found" t_model
bad() { # bad NAME PATH BODY PARAM: 400 naming PARAM ('null' for none)
  b_path=$2 b_body=$3 b_param=$4
  t_bad() {
    post "$b_path" "$b_body" && is_error 400 invalid_request_error &&
      { [ "$b_param" = null ] && has '"param":null' || has "\"param\":\"$b_param\""; }
  }
  check "400: $1" t_bad
}
bad "malformed JSON" /v1/completions '{"prompt": "a",' null
bad "not an object" /v1/completions '["a"]' null
bad "no prompt" /v1/completions '{"max_tokens":3}' prompt
bad "prompt not a string" /v1/completions '{"prompt":7}' prompt
bad "negative max_tokens" /v1/completions '{"prompt":"a","max_tokens":-1}' max_tokens
bad "fractional max_tokens" /v1/completions '{"prompt":"a","max_tokens":2.5}' max_tokens
bad "max_tokens past --max-tokens" /v1/completions '{"prompt":"a","max_tokens":5000}' max_tokens
bad "temperature 2.5" /v1/completions '{"prompt":"a","temperature":2.5}' temperature
bad "top_p 0" /v1/completions '{"prompt":"a","top_p":0}' top_p
bad "stream not a boolean" /v1/completions '{"prompt":"a","stream":"yes"}' stream
bad "five stop strings" /v1/completions '{"prompt":"a","stop":["a","b","c","d","e"]}' stop
bad "logprobs (not given: said, not left out)" /v1/completions '{"prompt":"a","logprobs":2}' logprobs
bad "a chat's logprobs true" /v1/chat/completions \
  '{"messages":[{"role":"user","content":"a"}],"logprobs":true}' logprobs
bad "a chat's top_logprobs" /v1/chat/completions \
  '{"messages":[{"role":"user","content":"a"}],"logprobs":false,"top_logprobs":3}' top_logprobs
t_logprobs_off() {
  post /v1/chat/completions \
    '{"messages":[{"role":"user","content":"a"}],"logprobs":false,"max_tokens":2}' &&
    status_is 200
}
check "a chat's logprobs false asks for none: 200" t_logprobs_off
bad "no messages" /v1/chat/completions '{"prompt":"a"}' messages
bad "an unknown role" /v1/chat/completions '{"messages":[{"role":"wizard","content":"a"}]}' messages
bad "content not a string" /v1/chat/completions '{"messages":[{"role":"user","content":3}]}' messages

head -c 1100000 /dev/zero | tr '\0' ' ' >"$tmp/big"
t_413() { req /v1/completions --data-binary @"$tmp/big" && is_error 413 invalid_request_error; }
check "a body past --max-body (1 MiB): 413" t_413
t_413_chunked() {
  req /v1/completions -H 'Transfer-Encoding: chunked' --data-binary @"$tmp/big" &&
    is_error 413 invalid_request_error
}
check "a chunked body past --max-body: 413" t_413_chunked

t_health2() { req /health && status_is 200; }
check "still serving after all that" t_health2

t_term() {
  kill -TERM "$pid"
  i=0
  while kill -0 "$pid" 2>/dev/null; do
    i=$((i + 1))
    if [ "$i" -gt 100 ]; then echo "still running 10 s after SIGTERM"; return 1; fi
    sleep 0.1
  done
  wait "$pid"
  rc=$?
  [ "$rc" -eq 0 ] || { echo "exit $rc"; cat "$tmp/log1"; return 1; }
}
check "SIGTERM: exits 0 within 10 s" t_term

# a second server: an API key, one connection, a 2 s request time
check "starts with --api-key, --max-connections 1, --timeout 2, --alias" \
  start "$tmp/log2" --api-key sekrit --max-connections 1 --timeout 2 --parallel 1 \
  --alias gpt-3.5-turbo
t_key_none() { post /v1/completions '{"prompt":"a"}' && is_error 401 invalid_request_error; }
check "--api-key: no key is 401" t_key_none
t_key_wrong() {
  post /v1/completions '{"prompt":"a"}' -H 'Authorization: Bearer wrong' &&
    is_error 401 invalid_request_error
}
check "--api-key: a wrong key is 401" t_key_wrong
t_key_models() { req /v1/models && is_error 401 invalid_request_error; }
check "--api-key: /v1/models needs it too" t_key_models
t_key_right() {
  post /v1/completions '{"prompt":"a","max_tokens":2}' -H 'Authorization: Bearer sekrit' &&
    status_is 200 && has '"completion_tokens":2'
}
check "--api-key: the key is let in" t_key_right
t_key_health() { req /health && status_is 200; }
check "--api-key: /health needs none" t_key_health
key='Authorization: Bearer sekrit'
t_alias_models() {
  req /v1/models -H "$key" && status_is 200 && has '"data":[{"id":"gpt-3.5-turbo","object":"model"'
}
check "--alias: /v1/models lists the alias" t_alias_models
t_alias_named() {
  post /v1/completions '{"prompt":"a","max_tokens":2,"model":"gpt-3.5-turbo"}' -H "$key" &&
    status_is 200 && has '"model":"gpt-3.5-turbo"'
}
check "--alias: a request naming the alias is served, and answered under it" t_alias_named
t_alias_file() {
  post /v1/completions '{"prompt":"a","max_tokens":2,"model":"stories260K.gguf"}' -H "$key" &&
    status_is 200
}
check "--alias: the file name is served too" t_alias_file
t_alias_other() {
  post /v1/completions '{"prompt":"a","model":"gpt-4"}' -H "$key" && is_error 404 invalid_request_error &&
    has '"code":"model_not_found"'
}
check "--alias: any other name is 404 model_not_found" t_alias_other

# a client that sends its headers and then nothing (its body never comes)
mkfifo "$tmp/fifo"
curl -s -o /dev/null -w '%{http_code}' --max-time 20 -H 'Authorization: Bearer sekrit' \
  -H 'Content-Type: application/json' -X POST -T - "$url/v1/completions" <"$tmp/fifo" \
  >"$tmp/slow" &
slow=$!
exec 3>"$tmp/fifo"
sleep 0.5
t_conn_limit() { req /health && is_error 503 server_error; }
check "past --max-connections: 503" t_conn_limit
# the server cut it off after 2 s: when its body ends, 3 s in, no one answers it (curl saw at most
# the 100 Continue)
t_slowloris() {
  sleep 2.5
  exec 3>&-
  wait "$slow" && { echo "answered $(cat "$tmp/slow") after 3 s"; return 1; }
  case $(cat "$tmp/slow") in 000 | 100) ;; *) echo "answered $(cat "$tmp/slow")"; return 1 ;; esac
}
check "a client that does not send its whole request within --timeout is cut off" t_slowloris
t_after() { req /health && status_is 200; }
check "and its connection is free again" t_after

t_term2() {
  kill -INT "$pid" && wait "$pid"
}
check "SIGINT: exits 0" t_term2

fails "--port out of range" "not an integer in \[0, 65535\]" "$bin" serve -m "$model" --port 70000
fails "--parallel 0" "not an integer in \[1, 64\]" "$bin" serve -m "$model" --parallel 0
fails "--parallel 65" "not an integer in \[1, 64\]" "$bin" serve -m "$model" --parallel 65
fails "a model that does not open" "nonexistent" "$bin" serve -m "$tmp/nonexistent.gguf"
fails "an unknown chat template" "unknown chat template" "$bin" serve -m "$model" \
  --chat-template nonesuch
fails "--host not an address" "not a numeric" "$bin" serve -m "$model" --host example.org
fails "an empty --api-key" "option --api-key: the key is empty" "$bin" serve -m "$model" --api-key ''
fails "an empty --alias" "option --alias: empty" "$bin" serve -m "$model" --alias ''
start "$tmp/log3" --parallel 1 >/dev/null 2>&1
port=${url##*:}
fails "a port in use" "cannot listen" "$bin" serve -m "$model" --port "$port" --parallel 1
kill -TERM "$pid"
wait "$pid"
t_help() { "$bin" serve --help | grep -q -- '--max-connections N'; }
check "--help lists the options" t_help

echo "1..$n"
