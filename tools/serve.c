/* npulm serve: an OpenAI-compatible HTTP server over one model. libmicrohttpd runs a thread per
 * connection; one engine thread owns every session (slot) and decodes all running requests as
 * one batched step. The two meet only in a request's channel (its text, under the server's mutex,
 * with a condition variable), so that neither waits on the other's work. The engine is
 * tools/serve_engine.c; what the two share, tools/serve.h. */
#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <microhttpd.h>

#include "cli_util.h"
#include "commands.h"
#include "npulm.h"
#include "serve.h"

/* clang-format off */
const char npulm_usage_serve[] =
    "usage: npulm serve [-m MODEL] [--host ADDR] [--port N] [--parallel N] [options]\n"
    "\n"
    "Serve the model over HTTP with OpenAI's API: GET /health, GET /v1/models,\n"
    "POST /v1/completions and POST /v1/chat/completions (\"stream\": true for server-sent\n"
    "events). Up to --parallel requests generate at once, each in its own session (slot), their\n"
    "decode steps batched into one; more wait in a queue of --queue. Prints\n"
    "'npulm serve: listening on http://HOST:PORT ...' on stderr once ready; SIGINT or SIGTERM\n"
    "stops it: it takes no new connections, running requests end where they are\n"
    "(finish_reason \"length\"), waiting ones get an error, every response is written out whole\n"
    "(a client has --timeout to take it) and then it exits 0.\n"
    "\n"
    "  -m, --model FILE   model (default: $NPULM_MODEL, else " CLI_DEFAULT_MODEL_PATH ");\n"
    "                     its file name is the model's id in the API\n"
    "  -a, --alias NAME   the model's id instead (as llama-server's): /v1/models lists NAME and\n"
    "                     answers carry it. A request's \"model\" may be NAME or the file name;\n"
    "                     any other is 404 model_not_found (as OpenAI answers)\n"
    "  --host ADDR        numeric address to listen on (default 127.0.0.1)\n"
    "  --port N           port, 0 = any free one (default 8080)\n"
    "  --parallel N       slots: requests generated at once, 1 to 64 (default 4)\n"
    "  -c, --ctx N        each slot's context length: prompt and generated tokens (default: the\n"
    "                     model's, at most 4096)\n"
    "  -t, --threads N    threads each session's matmuls are cut across (default: one per CPU)\n"
    "  --api-key KEY      requests must carry 'Authorization: Bearer KEY' (/health need not)\n"
    "  --chat-template NAME  chat template of /v1/chat/completions (default: the model's, else\n"
    "                     chatml)\n"
    "  --max-tokens N     largest max_tokens a request may ask for (default 4096)\n"
    "  --max-body BYTES   largest request body (K, M suffixes; default 1M): larger is 413, at\n"
    "                     once for a declared length, for a chunked body once it has been sent\n"
    "  --max-connections N  open connections (default 64); up to 16 more are answered 503 and\n"
    "                     closed, more still are refused\n"
    "  --queue N          requests that may wait for a slot (default 64); more are answered 503\n"
    "  --timeout S        seconds a connection has to send a whole request (headers and body;\n"
    "                     also the most a kept-alive connection waits idle) (default 10)\n"
    "  --sparse MODE      decode of a program compiled with --sparsity: predict (default), exact\n"
    "                     or off (dense). Sparse decode is a one-row step's: a step of one request\n"
    "                     decodes sparse, so its greedy text is run's; a step that batches several\n"
    "                     requests (or a token and a prompt) runs their FFNs dense, and its\n"
    "                     tokens may differ from run's (said at start)\n"
    "\n"
    "A GGUF model is compiled in memory first (calibrated and quantized as compile would), with\n"
    "the chunk sizes of batched decode (--batch, default --parallel):\n"
    CLI_COMPILE_OPTIONS_HELP;
/* clang-format on */

/* A connection, for the request-time watchdog and the connection count (conn_mu). */
struct tracked {
  int fd;
  double since;    /* when it started waiting for a request, or a stream's client for events */
  bool waiting;    /* it has not sent a whole request since 'since' */
  bool sending;    /* a stream has handed it events since 'since' that it has not taken yet (the
                      reader is not asked for more until they are on their way) */
  bool over_limit; /* past --max-connections: answered 503 */
  bool counted;    /* in n_conns: until it closes, or is being closed by this side (which a
                      client may see before libmicrohttpd has noticed) */
  struct tracked *prev, *next;
};

static double now_s(void) { return cli_now(); }

/* ---- HTTP: responses ------------------------------------------------------------------------ */

enum route { ROUTE_HEALTH, ROUTE_MODELS, ROUTE_COMPLETIONS, ROUTE_CHAT };

/* What a connection's current request holds (libmicrohttpd's per-request pointer). */
struct http_req {
  struct server *s;
  struct MHD_Connection *conn;
  enum route route;
  const char *allow; /* the method the path takes, for a 405's Allow */
  char *body;
  size_t body_len, body_cap;
  bool too_large; /* the body passed --max-body: the rest is read and dropped, then 413 */
  bool answered;  /* a response is queued */
  struct request *req;
  /* a stream's events not yet sent */
  char *out;
  size_t out_len, out_pos, out_cap;
  bool role_sent, ended;
};

static enum MHD_Result queue_json(struct http_req *h, unsigned status, json_t *body) {
  char *text = json_dumps(body, JSON_COMPACT);
  json_decref(body);
  if (text == NULL) return MHD_NO;
  struct MHD_Response *resp =
      MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
  if (resp == NULL) {
    free(text);
    return MHD_NO;
  }
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
  if (status == MHD_HTTP_UNAUTHORIZED) {
    MHD_add_response_header(resp, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
  }
  if (status == MHD_HTTP_METHOD_NOT_ALLOWED) MHD_add_response_header(resp, "Allow", h->allow);
  if (status == MHD_HTTP_SERVICE_UNAVAILABLE) { /* an overloaded server lets the client go */
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
  }
  h->answered = true;
  const enum MHD_Result ret = MHD_queue_response(h->conn, status, resp);
  MHD_destroy_response(resp);
  return ret;
}

/* OpenAI's error object. */
static json_t *error_json(const char *type, const char *code, const char *param, const char *msg) {
  return json_pack("{s:{s:s, s:s, s:s?, s:s?}}", "error", "message", msg, "type", type, "param",
                   param, "code", code);
}

static enum MHD_Result answer_error(struct http_req *h, unsigned status, const char *type,
                                    const char *code, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
static enum MHD_Result answer_error(struct http_req *h, unsigned status, const char *type,
                                    const char *code, const char *param, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  /* a message may quote the client's bytes (a path, a model, a role), cut anywhere: JSON strings
   * are UTF-8, so each invalid or cut sequence becomes U+FFFD */
  char *text = NULL;
  size_t len = 0, cap = 0;
  append_utf8(&text, &len, &cap, msg, strlen(msg));
  text[len] = '\0';
  h->answered = true; /* even if the answer cannot be made: the request goes no further */
  json_t *body = error_json(type, code, param, text);
  free(text);
  return body != NULL ? queue_json(h, status, body) : MHD_NO;
}

/* A 400 naming the field at fault. */
#define BAD_REQUEST(h, param, ...)                                                                 \
  answer_error(h, MHD_HTTP_BAD_REQUEST, "invalid_request_error", NULL, param, __VA_ARGS__)

static json_t *usage_json(const struct request *r, int n_gen) {
  return json_pack("{s:I, s:I, s:I}", "prompt_tokens", (json_int_t)r->n_prompt, "completion_tokens",
                   (json_int_t)n_gen, "total_tokens", (json_int_t)r->n_prompt + n_gen);
}

/* One choice of a response or chunk: text (completions), message or delta (chat). */
static json_t *choice_json(const struct request *r, bool chunk, const char *text, size_t len,
                           bool with_role, const char *finish) {
  json_t *c = json_pack("{s:i}", "index", 0);
  json_t *content = text != NULL ? json_stringn(text, len) : NULL;
  if (!r->chat) {
    json_object_set_new(c, "text", content != NULL ? content : json_string(""));
  } else {
    json_t *m = json_object();
    if (with_role) json_object_set_new(m, "role", json_string("assistant"));
    if (content != NULL) json_object_set_new(m, "content", content);
    json_object_set_new(c, chunk ? "delta" : "message", m);
  }
  json_object_set_new(c, "finish_reason", finish != NULL ? json_string(finish) : json_null());
  return c;
}

static json_t *completion_json(const struct server *s, const struct request *r, bool chunk,
                               json_t *choice) {
  const char *object =
      r->chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion";
  return json_pack("{s:s, s:s, s:I, s:s, s:[o]}", "id", r->id, "object", object, "created",
                   (json_int_t)r->created, "model", s->model_id, "choices", choice);
}

/* ---- HTTP: requests ------------------------------------------------------------------------- */

/* True once the client has closed its end (a read would return end of file). */
static bool client_gone(struct MHD_Connection *conn) {
  const union MHD_ConnectionInfo *ci =
      MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
  if (ci == NULL) return true;
  struct pollfd p = {.fd = ci->connect_fd, .events = POLLIN};
  if (poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLHUP | POLLERR | POLLNVAL)) return true;
  char c;
  const ssize_t n = recv(ci->connect_fd, &c, 1, MSG_PEEK);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

/* Wait (under the mutex) until 'r' has news: text, its end, a failure. false if the client left
 * meanwhile (the mutex is held either way). */
static bool wait_news(struct http_req *h, struct request *r, bool want_text) {
  /* the client is looked at every WAIT_MS however often the engine wakes the wait: while a
   * request generates it wakes it at every step, and an unstreamed answer's wait lasts until the
   * end */
  struct timespec check;
  timespec_after_ms(&check, WAIT_MS);
  while (r->finish == NULL && r->failure == NULL && !(want_text && r->len > 0)) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now); /* the clock of the condition variables */
    if (pthread_cond_timedwait(&r->cv, &h->s->mu, &check) == ETIMEDOUT ||
        now.tv_sec > check.tv_sec || (now.tv_sec == check.tv_sec && now.tv_nsec >= check.tv_nsec)) {
      pthread_mutex_unlock(&h->s->mu);
      const bool gone = client_gone(h->conn);
      pthread_mutex_lock(&h->s->mu);
      if (gone) return false;
      timespec_after_ms(&check, WAIT_MS);
    }
  }
  return true;
}

/* Add one server-sent event (the JSON, or the literal text if 'json' is NULL). */
static void add_event(struct http_req *h, json_t *json, const char *literal) {
  char *text = json != NULL ? json_dumps(json, JSON_COMPACT) : NULL;
  json_decref(json);
  const char *data = text != NULL ? text : literal != NULL ? literal : "{}";
  const size_t n = strlen("data: \n\n") + strlen(data) + 1;
  if (h->out_len + n > h->out_cap) {
    h->out_cap = 2 * (h->out_len + n);
    h->out = xrealloc(h->out, h->out_cap);
  }
  h->out_len += (size_t)snprintf(h->out + h->out_len, n, "data: %s\n\n", data);
  free(text);
}

/* libmicrohttpd's reader of a stream: waits for the request's next text (looking every WAIT_MS
 * whether the client left) and sends it as events, then the end. */
/* The record of a connection (libmicrohttpd's socket context), or NULL. */
static struct tracked *tracked_of(struct MHD_Connection *conn) {
  const union MHD_ConnectionInfo *ci =
      MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
  return ci != NULL ? ci->socket_context : NULL;
}

/* Mark a stream's connection as having events its client has yet to take (since now), or not.
 * The stream holds its connection with no idle timeout (generation may outlast it), so the
 * watchdog is what closes it when a client stops reading. */
static void stream_sending(struct http_req *h, bool sending) {
  struct tracked *t = tracked_of(h->conn);
  if (t == NULL) return;
  pthread_mutex_lock(&h->s->conn_mu);
  t->sending = sending;
  t->since = now_s();
  pthread_mutex_unlock(&h->s->conn_mu);
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
  struct http_req *h = cls;
  struct server *s = h->s;
  struct request *r = h->req;
  (void)pos;
  stream_sending(h, false); /* asked for more: what it was given is on its way */
  while (h->out_pos == h->out_len) {
    if (h->ended) return MHD_CONTENT_READER_END_OF_STREAM;
    h->out_pos = h->out_len = 0;
    if (r->chat && !h->role_sent) { /* the role first, before any text */
      add_event(h, completion_json(s, r, true, choice_json(r, true, "", 0, true, NULL)), NULL);
      h->role_sent = true;
      continue;
    }
    pthread_mutex_lock(&s->mu);
    if (!wait_news(h, r, true)) {
      pthread_mutex_unlock(&s->mu);
      return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    char *text = r->text;
    size_t *ends = r->ends;
    const size_t n_ends = r->n_ends;
    const char *finish = r->finish, *failure = r->failure;
    const int n_gen = r->n_gen;
    r->text = NULL;
    r->ends = NULL;
    r->len = r->cap = r->n_ends = r->ends_cap = 0;
    pthread_mutex_unlock(&s->mu);
    for (size_t k = 0; k < n_ends; k++) { /* an event per piece */
      const size_t from = k > 0 ? ends[k - 1] : 0;
      add_event(h,
                completion_json(s, r, true,
                                choice_json(r, true, text + from, ends[k] - from, false, NULL)),
                NULL);
    }
    free(text);
    free(ends);
    if (finish != NULL) {
      json_t *last = completion_json(s, r, true, choice_json(r, true, NULL, 0, false, finish));
      json_object_set_new(last, "usage", usage_json(r, n_gen));
      add_event(h, last, NULL);
    } else if (failure != NULL) {
      add_event(h, error_json("server_error", NULL, NULL, failure), NULL);
    }
    if (finish != NULL || failure != NULL) {
      add_event(h, NULL, "[DONE]");
      h->ended = true;
    }
  }
  const size_t n = h->out_len - h->out_pos < max ? h->out_len - h->out_pos : max;
  memcpy(buf, h->out + h->out_pos, n);
  h->out_pos += n;
  stream_sending(h, true);
  return (ssize_t)n;
}

/* Boolean field 'name' of 'root' into '*out' (false when absent or null); false with the message
 * in 'msg' if it is of another type. */
static bool bool_field(json_t *root, const char *name, bool *out, char *msg, size_t cap) {
  json_t *v = json_object_get(root, name);
  *out = v != NULL && json_is_true(v);
  if (v == NULL || json_is_null(v) || json_is_boolean(v)) return true;
  snprintf(msg, cap, "%s must be true or false", name);
  return false;
}

/* The sampling fields and limits both endpoints share, into 'r' and 'sp'; NULL if they are
 * sound, else the field at fault with the message in 'msg'. */
static const char *read_fields(const struct server *s, json_t *root, struct request *r,
                               npulm_sampler_params *sp, bool *seeded, char *msg, size_t cap) {
  json_t *v;
  /* OpenAI's defaults: 16 tokens for a completion, as many as fit for a chat (here: this
   * server's largest); a chat's newer name for the field, max_completion_tokens, wins */
  r->max_tokens = r->chat ? s->max_tokens : 16;
  const char *field = "max_tokens";
  if (r->chat && (v = json_object_get(root, "max_completion_tokens")) != NULL && !json_is_null(v)) {
    field = "max_completion_tokens";
  } else {
    v = json_object_get(root, "max_tokens");
  }
  if (v != NULL && !json_is_null(v)) {
    if (!json_is_integer(v) || json_integer_value(v) < 0) {
      snprintf(msg, cap, "%s must be a non-negative integer", field);
      return field;
    }
    if (json_integer_value(v) > s->max_tokens) {
      snprintf(msg, cap, "%s is %" JSON_INTEGER_FORMAT ", more than this server's %d", field,
               json_integer_value(v), s->max_tokens);
      return field;
    }
    r->max_tokens = (int)json_integer_value(v);
  }
  sp->temp = 1.0f;
  if ((v = json_object_get(root, "temperature")) != NULL && !json_is_null(v)) {
    if (!json_is_number(v) || !(json_number_value(v) >= 0 && json_number_value(v) <= 2)) {
      snprintf(msg, cap, "temperature must be a number in [0, 2]");
      return "temperature";
    }
    sp->temp = (float)json_number_value(v);
  }
  sp->top_p = 1.0f;
  if ((v = json_object_get(root, "top_p")) != NULL && !json_is_null(v)) {
    if (!json_is_number(v) || !(json_number_value(v) > 0 && json_number_value(v) <= 1)) {
      snprintf(msg, cap, "top_p must be a number in (0, 1]");
      return "top_p";
    }
    sp->top_p = (float)json_number_value(v);
  }
  sp->top_k = 0;
  if ((v = json_object_get(root, "top_k")) != NULL && !json_is_null(v)) {
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX) {
      snprintf(msg, cap, "top_k must be a non-negative integer");
      return "top_k";
    }
    sp->top_k = (int)json_integer_value(v);
  }
  *seeded = false;
  if ((v = json_object_get(root, "seed")) != NULL && !json_is_null(v)) {
    if (!json_is_integer(v)) {
      snprintf(msg, cap, "seed must be an integer");
      return "seed";
    }
    sp->seed = (uint64_t)json_integer_value(v);
    *seeded = true;
  }
  if ((v = json_object_get(root, "n")) != NULL && !json_is_null(v) &&
      !(json_is_integer(v) && json_integer_value(v) == 1)) {
    snprintf(msg, cap, "n must be 1: one choice per request");
    return "n";
  }
  /* log probabilities are not given: asked for, that is said rather than left out unseen (a
   * chat's "logprobs": false asks for none) */
  v = json_object_get(root, "logprobs");
  if (v != NULL && !json_is_null(v) && !(r->chat && json_is_false(v))) {
    snprintf(msg, cap, "logprobs is not supported by this server");
    return "logprobs";
  }
  if ((v = json_object_get(root, "top_logprobs")) != NULL && !json_is_null(v)) {
    snprintf(msg, cap, "top_logprobs is not supported by this server");
    return "top_logprobs";
  }
  if (!bool_field(root, "ignore_eos", &r->ignore_eos, msg, cap)) return "ignore_eos";
  if (!bool_field(root, "stream", &r->stream, msg, cap)) return "stream";
  if ((v = json_object_get(root, "stop")) != NULL && !json_is_null(v)) {
    const bool one = json_is_string(v);
    if (!one && !(json_is_array(v) && json_array_size(v) <= MAX_STOP)) {
      snprintf(msg, cap, "stop must be a string or an array of at most %d strings", MAX_STOP);
      return "stop";
    }
    for (size_t i = 0; i < (one ? 1 : json_array_size(v)); i++) {
      json_t *e = one ? v : json_array_get(v, i);
      if (!json_is_string(e) || json_string_length(e) > MAX_STOP_LEN) {
        snprintf(msg, cap, "each stop must be a string of at most %d bytes", MAX_STOP_LEN);
        return "stop";
      }
      if (json_string_length(e) > 0) r->stop[r->n_stop++] = strdup(json_string_value(e));
    }
  }
  return NULL;
}

/* The chat messages formatted with the template into a malloc'd text; NULL with 'msg' if they are
 * not sound. */
static char *format_chat(const struct server *s, json_t *messages, char *msg, size_t cap) {
  const size_t n = json_array_size(messages);
  if (!json_is_array(messages) || n == 0) {
    snprintf(msg, cap, "messages must be a non-empty array");
    return NULL;
  }
  npulm_chat_message *msgs = xrealloc(NULL, n * sizeof(*msgs));
  char *text = NULL;
  for (size_t i = 0; i < n; i++) {
    json_t *m = json_array_get(messages, i);
    json_t *role = json_object_get(m, "role"), *content = json_object_get(m, "content");
    if (!json_is_string(role) || !json_is_string(content)) {
      snprintf(msg, cap, "messages[%zu] must have a string role and a string content", i);
      goto done;
    }
    msgs[i].role = json_string_value(role);
    msgs[i].content = json_string_value(content);
    if (strcmp(msgs[i].role, "system") != 0 && strcmp(msgs[i].role, "user") != 0 &&
        strcmp(msgs[i].role, "assistant") != 0) {
      snprintf(msg, cap, "messages[%zu]: unknown role '%.64s' (system, user or assistant)", i,
               msgs[i].role);
      goto done;
    }
  }
  size_t len = 0, room = 256;
  npulm_error err;
  for (;;) {
    text = xrealloc(text, room);
    const npulm_status st =
        npulm_chat_apply(s->model, s->chat_template, msgs, n, true, text, room, &len, &err);
    if (st == NPULM_OK) break;
    if (len < room) { /* not a matter of room */
      snprintf(msg, cap, "messages: %.200s", err.msg);
      free(text);
      text = NULL;
      break;
    }
    room = len + 1;
  }
done:
  free(msgs);
  return text;
}

/* Tokenize 'text' as a prompt (special-token text parsed, BOS as the model wants) into 'r'. */
static bool tokenize_prompt(const struct server *s, const char *text, struct request *r) {
  size_t cap = strlen(text) + 8, n = 0;
  npulm_error err;
  for (;;) {
    r->prompt = xrealloc(r->prompt, cap * sizeof(int32_t));
    if (npulm_tokenize(s->model, text, strlen(text), s->info.add_bos, true, r->prompt, cap, &n,
                       &err) == NPULM_OK) {
      r->n_prompt = n;
      return true;
    }
    if (n <= cap) return false;
    cap = n;
  }
}

/* The body of a completion request parsed, checked and queued; or an error answered. */
static enum MHD_Result handle_generate(struct http_req *h) {
  struct server *s = h->s;
  const bool chat = h->route == ROUTE_CHAT;
  json_error_t jerr;
  json_t *root = json_loadb(h->body != NULL ? h->body : "", h->body_len, 0, &jerr);
  if (root == NULL) return BAD_REQUEST(h, NULL, "malformed JSON: %s", jerr.text);
  enum MHD_Result ret;
  char msg[300];
  const char *param;
  struct request *r = calloc(1, sizeof(*r));
  if (r == NULL) {
    json_decref(root);
    return MHD_NO;
  }
  r->chat = chat;
  r->refs = 1;
  pthread_condattr_t ca; /* waits are timed on the monotonic clock (timespec_after_ms) */
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&r->cv, &ca);
  pthread_condattr_destroy(&ca);
  npulm_sampler_params sp = npulm_sampler_default_params();
  bool seeded = false;
  json_t *model = json_object_get(root, "model");
  char *chat_text = NULL;
  if (!json_is_object(root)) {
    ret = BAD_REQUEST(h, NULL, "the body must be a JSON object");
  } else if (model != NULL && !json_is_null(model) && !json_is_string(model)) {
    ret = BAD_REQUEST(h, "model", "model must be a string");
  } else if (json_is_string(model) && strcmp(json_string_value(model), s->model_id) != 0 &&
             strcmp(json_string_value(model), s->file_id) != 0) {
    ret = answer_error(h, MHD_HTTP_NOT_FOUND, "invalid_request_error", "model_not_found", "model",
                       "the model '%.200s' does not exist: this server has '%s'",
                       json_string_value(model), s->model_id);
  } else if ((param = read_fields(s, root, r, &sp, &seeded, msg, sizeof(msg))) != NULL) {
    ret = BAD_REQUEST(h, param, "%s", msg);
  } else if (!chat && !json_is_string(json_object_get(root, "prompt"))) {
    ret = BAD_REQUEST(h, "prompt", "prompt must be a string");
  } else if (chat && (chat_text = format_chat(s, json_object_get(root, "messages"), msg,
                                              sizeof(msg))) == NULL) {
    ret = BAD_REQUEST(h, "messages", "%s", msg);
  } else if (!tokenize_prompt(
                 s, chat ? chat_text : json_string_value(json_object_get(root, "prompt")), r)) {
    ret = BAD_REQUEST(h, chat ? "messages" : "prompt", "the prompt cannot be tokenized");
  } else if (r->n_prompt == 0) {
    ret = BAD_REQUEST(h, "prompt", "the prompt is empty and the model adds no BOS token");
  } else if (r->n_prompt >= (size_t)s->n_ctx) {
    ret = answer_error(h, MHD_HTTP_BAD_REQUEST, "invalid_request_error", "context_length_exceeded",
                       chat ? "messages" : "prompt",
                       "the prompt has %zu tokens; this server's context is %d", r->n_prompt,
                       s->n_ctx);
  } else {
    ret = MHD_YES;
  }
  free(chat_text);
  json_decref(root);
  npulm_error err;
  if (h->answered) {
    request_release(r);
    return ret;
  }

  pthread_mutex_lock(&s->mu);
  const uint64_t k = ++s->n_requests;
  pthread_mutex_unlock(&s->mu);
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  if (!seeded) sp.seed = (uint64_t)ts.tv_nsec * 0x9e3779b97f4a7c15ull ^ k;
  if (npulm_sampler_create(&sp, s->info.n_vocab, &r->sampler, &err) != NPULM_OK) {
    request_release(r);
    return BAD_REQUEST(h, NULL, "%s", err.msg);
  }
  snprintf(r->id, sizeof(r->id), "%s-%llx%06" PRIx64, chat ? "chatcmpl" : "cmpl",
           (long long)ts.tv_sec, k);
  r->created = (long long)ts.tv_sec;

  pthread_mutex_lock(&s->mu);
  int busy = 0; /* slots taken: the engine changes them under the mutex */
  for (int i = 0; i < s->n_slots; i++) busy += s->slots[i].req != NULL;
  const bool refused = s->stopping || busy + s->n_queued >= s->n_slots + s->max_queue;
  if (!refused) {
    r->refs = 2; /* this side and the engine */
    if (s->queue_tail != NULL) s->queue_tail->next = r;
    else s->queue_head = r;
    s->queue_tail = r;
    s->n_queued++;
    pthread_cond_signal(&s->work);
  }
  pthread_mutex_unlock(&s->mu);
  if (refused) {
    request_release(r);
    return answer_error(h, MHD_HTTP_SERVICE_UNAVAILABLE, "server_error", "overloaded", NULL,
                        s->stopping ? "the server is shutting down"
                                    : "the server is busy: %d requests are waiting; retry later",
                        s->max_queue);
  }
  h->req = r;
  /* generation may take longer than the idle timeout: none while it runs */
  MHD_set_connection_option(h->conn, MHD_CONNECTION_OPTION_TIMEOUT, 0u);

  if (r->stream) {
    struct MHD_Response *resp =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, h, NULL);
    if (resp == NULL) return MHD_NO;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    h->answered = true;
    ret = MHD_queue_response(h->conn, MHD_HTTP_OK, resp);
    MHD_destroy_response(resp);
    return ret;
  }
  pthread_mutex_lock(&s->mu);
  if (!wait_news(h, r, false)) {
    pthread_mutex_unlock(&s->mu);
    return MHD_NO; /* the client left: closing the connection cancels the request */
  }
  const char *failure = r->failure;
  pthread_mutex_unlock(&s->mu);
  MHD_set_connection_option(h->conn, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned)s->timeout_s);
  if (failure != NULL) {
    return answer_error(h, MHD_HTTP_SERVICE_UNAVAILABLE, "server_error", NULL, NULL, "%s", failure);
  }
  json_t *body = completion_json(
      s, r, false, choice_json(r, false, r->text != NULL ? r->text : "", r->len, true, r->finish));
  json_object_set_new(body, "usage", usage_json(r, r->n_gen));
  return queue_json(h, MHD_HTTP_OK, body);
}

/* Compared in a time that depends only on the key's length: the time says nothing of the key. */
static bool same_key(const char *given, const char *key) {
  const size_t n = strlen(key), given_n = strlen(given);
  unsigned char diff = given_n != n;
  for (size_t i = 0; i < n; i++) diff |= (unsigned char)((i < given_n ? given[i] : 0) ^ key[i]);
  return diff == 0;
}

static enum MHD_Result too_large(struct http_req *h) {
  return answer_error(h, MHD_HTTP_CONTENT_TOO_LARGE, "invalid_request_error", "request_too_large",
                      NULL, "the body is larger than %zu bytes", h->s->max_body);
}

/* The request's first call: route, method, key and declared size, answered at once when wrong. */
static enum MHD_Result handle_headers(struct http_req *h, const char *url, const char *method) {
  struct server *s = h->s;
  static const struct {
    const char *path, *method;
    enum route route;
  } routes[] = {
      {"/health", "GET", ROUTE_HEALTH},
      {"/v1/models", "GET", ROUTE_MODELS},
      {"/v1/completions", "POST", ROUTE_COMPLETIONS},
      {"/v1/chat/completions", "POST", ROUTE_CHAT},
  };
  const struct tracked *t = tracked_of(h->conn);
  if (t != NULL && t->over_limit) {
    return answer_error(h, MHD_HTTP_SERVICE_UNAVAILABLE, "server_error", "too_many_connections",
                        NULL, "too many open connections (at most %d); retry later",
                        s->max_connections);
  }
  size_t i = 0;
  while (i < sizeof(routes) / sizeof(routes[0]) && strcmp(url, routes[i].path) != 0) i++;
  if (i == sizeof(routes) / sizeof(routes[0])) {
    return answer_error(h, MHD_HTTP_NOT_FOUND, "invalid_request_error", "not_found", NULL,
                        "no such endpoint: %.200s", url);
  }
  h->route = routes[i].route;
  const bool get = strcmp(routes[i].method, "GET") == 0;
  h->allow = get ? "GET, HEAD" : routes[i].method;
  if (strcmp(method, routes[i].method) != 0 && !(get && strcmp(method, "HEAD") == 0)) {
    return answer_error(h, MHD_HTTP_METHOD_NOT_ALLOWED, "invalid_request_error",
                        "method_not_allowed", NULL, "%s takes %s, not %.20s", url, routes[i].method,
                        method);
  }
  if (s->api_key != NULL && h->route != ROUTE_HEALTH) {
    const char *auth = MHD_lookup_connection_value(h->conn, MHD_HEADER_KIND, "Authorization");
    if (auth == NULL || strncmp(auth, "Bearer ", 7) != 0 || !same_key(auth + 7, s->api_key)) {
      return answer_error(h, MHD_HTTP_UNAUTHORIZED, "invalid_request_error", "invalid_api_key",
                          NULL, "%s",
                          auth == NULL ? "no API key: send 'Authorization: Bearer KEY'"
                                       : "the API key is not this server's");
    }
  }
  if (h->route == ROUTE_HEALTH) {
    return queue_json(h, MHD_HTTP_OK, json_pack("{s:s}", "status", "ok"));
  }
  if (h->route == ROUTE_MODELS) {
    return queue_json(h, MHD_HTTP_OK,
                      json_pack("{s:s, s:[{s:s, s:s, s:I, s:s}]}", "object", "list", "data", "id",
                                s->model_id, "object", "model", "created", (json_int_t)s->started,
                                "owned_by", "npulm"));
  }
  const char *length =
      MHD_lookup_connection_value(h->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
  if (length != NULL && strtoull(length, NULL, 10) > s->max_body) {
    return answer_error(h, MHD_HTTP_CONTENT_TOO_LARGE, "invalid_request_error", "request_too_large",
                        NULL, "the body is larger than %zu bytes", s->max_body);
  }
  return MHD_YES;
}

/* libmicrohttpd's access handler: called once with the headers, then with each piece of the body,
 * then once more with none. */
static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_size, void **con_cls) {
  struct server *s = cls;
  struct http_req *h = *con_cls;
  (void)version;
  if (h == NULL) {
    h = calloc(1, sizeof(*h));
    if (h == NULL) return MHD_NO;
    h->s = s;
    h->conn = conn;
    *con_cls = h;
    pthread_mutex_lock(&s->conn_mu);
    s->n_answers++;
    pthread_mutex_unlock(&s->conn_mu);
    return handle_headers(h, url, method);
  }
  if (*upload_size > 0) {
    if (h->too_large || h->body_len + *upload_size > s->max_body) {
      /* a body of undeclared length (chunked) past the limit: libmicrohttpd 0.9 answers only
       * once the body is in, so the rest is read and dropped (within --timeout: the watchdog) */
      h->too_large = true;
      free(h->body);
      h->body = NULL;
      h->body_len = h->body_cap = 0;
    } else {
      if (h->body_len + *upload_size + 1 > h->body_cap) {
        h->body_cap = 2 * (h->body_len + *upload_size + 1);
        h->body = xrealloc(h->body, h->body_cap);
      }
      memcpy(h->body + h->body_len, upload_data, *upload_size);
      h->body_len += *upload_size;
    }
    *upload_size = 0;
    return MHD_YES;
  }
  if (h->answered) return MHD_YES;
  pthread_mutex_lock(&s->conn_mu); /* the whole request is in: the watchdog lets it be */
  struct tracked *t = tracked_of(conn);
  if (t != NULL) t->waiting = false;
  pthread_mutex_unlock(&s->conn_mu);
  if (h->too_large) return too_large(h);
  return handle_generate(h);
}

/* libmicrohttpd: the request has ended, answered or not (the client may have left): a request
 * still generating is cancelled, and the connection waits for its next request. */
static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode why) {
  struct server *s = cls;
  struct http_req *h = *con_cls;
  (void)why;
  if (h == NULL) return;
  struct request *r = h->req;
  if (r != NULL) {
    pthread_mutex_lock(&s->mu);
    if (r->finish == NULL && r->failure == NULL) {
      r->cancelled = true;
      /* still waiting: out of the queue at once */
      for (struct request **p = &s->queue_head; *p != NULL; p = &(*p)->next) {
        if (*p != r) continue;
        *p = r->next;
        if (s->queue_tail == r) {
          s->queue_tail = NULL;
          for (struct request *q = s->queue_head; q != NULL; q = q->next) s->queue_tail = q;
        }
        s->n_queued--;
        r->failure = "cancelled";
        request_release(r);
        break;
      }
      pthread_cond_signal(&s->work);
    }
    request_release(r);
    pthread_mutex_unlock(&s->mu);
  }
  free(h->body);
  free(h->out);
  free(h);
  *con_cls = NULL;
  pthread_mutex_lock(&s->conn_mu); /* a kept-alive connection has --timeout for its next one */
  s->n_answers--;
  struct tracked *t = tracked_of(conn);
  if (t != NULL && t->over_limit) { /* its 503 closes it */
    s->n_conns -= t->counted;
    t->counted = false;
  } else if (t != NULL) {
    t->waiting = true;
    t->since = now_s();
  }
  pthread_mutex_unlock(&s->conn_mu);
}

/* libmicrohttpd: a connection opened or closed (before its socket is closed). */
static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                          enum MHD_ConnectionNotificationCode code) {
  struct server *s = cls;
  pthread_mutex_lock(&s->conn_mu);
  if (code == MHD_CONNECTION_NOTIFY_STARTED) {
    struct tracked *t = calloc(1, sizeof(*t));
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (t != NULL) {
      t->fd = ci != NULL ? ci->connect_fd : -1;
      t->since = now_s();
      t->waiting = true;
      t->over_limit = s->n_conns >= s->max_connections;
      t->next = s->conns;
      if (s->conns != NULL) s->conns->prev = t;
      s->conns = t;
      t->counted = true;
      s->n_conns++;
    }
    *socket_context = t;
  } else if (*socket_context != NULL) {
    struct tracked *t = *socket_context;
    if (t->prev != NULL) t->prev->next = t->next;
    else s->conns = t->next;
    if (t->next != NULL) t->next->prev = t->prev;
    s->n_conns -= t->counted;
    free(t);
    *socket_context = NULL;
  }
  pthread_mutex_unlock(&s->conn_mu);
}

/* Close every connection that has not sent a whole request within --timeout seconds (a client
 * that sends a byte now and then defeats an idle timeout): shutting its socket down makes
 * libmicrohttpd's next read see the end. Under conn_mu, so the socket is still the connection's. */
static void watchdog(struct server *s) {
  const double now = now_s();
  pthread_mutex_lock(&s->conn_mu);
  for (struct tracked *t = s->conns; t != NULL; t = t->next) {
    /* a request not sent in time, or a stream's client that stopped reading */
    if ((t->waiting || t->sending) && t->fd >= 0 && now - t->since > s->timeout_s) {
      shutdown(t->fd, SHUT_RDWR);
      t->waiting = t->sending = false;
      s->n_conns -= t->counted;
      t->counted = false;
    }
  }
  pthread_mutex_unlock(&s->conn_mu);
}

/* ---- serve ---------------------------------------------------------------------------------- */

struct serve_opts {
  const char *model_path, *host;
  int port, parallel;
  bool batch_given;
  npulm_compile_params cp;
  npulm_session_params sp;
};

static void parse_options(struct cli_args *a, struct server *s, struct serve_opts *o) {
  for (a->i = 2; a->i < a->argc; a->i++) {
    const char *arg = a->argv[a->i];
    if (cli_wants_help(a)) exit(0);
    else if (cli_is_opt(arg, "-m", "--model")) o->model_path = cli_opt_value(a);
    else if (cli_is_opt(arg, NULL, "--host")) o->host = cli_opt_value(a);
    else if (cli_is_opt(arg, NULL, "--port")) o->port = (int)cli_opt_int(a, 0, 65535);
    else if (cli_is_opt(arg, NULL, "--parallel"))
      o->parallel = (int)cli_opt_int(a, 1, MAX_PARALLEL);
    else if (cli_is_opt(arg, "-c", "--ctx")) o->sp.n_ctx = (int)cli_opt_int(a, 1, 1 << 20);
    else if (cli_is_opt(arg, "-t", "--threads")) o->sp.n_threads = (int)cli_opt_int(a, 0, 1024);
    else if (cli_is_opt(arg, NULL, "--api-key")) s->api_key = cli_opt_value(a);
    else if (cli_is_opt(arg, "-a", "--alias")) s->alias = cli_opt_value(a);
    else if (cli_is_opt(arg, NULL, "--chat-template")) s->chat_template = cli_opt_value(a);
    else if (cli_is_opt(arg, NULL, "--max-tokens")) s->max_tokens = (int)cli_opt_int(a, 1, 1 << 24);
    else if (cli_is_opt(arg, NULL, "--max-body")) s->max_body = (size_t)cli_opt_size(a);
    else if (cli_is_opt(arg, NULL, "--max-connections"))
      s->max_connections = (int)cli_opt_int(a, 1, 4096);
    else if (cli_is_opt(arg, NULL, "--queue")) s->max_queue = (int)cli_opt_int(a, 0, 1 << 16);
    else if (cli_is_opt(arg, NULL, "--timeout")) s->timeout_s = (int)cli_opt_int(a, 1, 86400);
    else if (cli_is_opt(arg, NULL, "--sparse")) cli_session_option(a, &o->sp);
    else if (cli_compile_option(a, &o->cp, false)) o->batch_given |= strcmp(arg, "--batch") == 0;
    else cli_unknown_option(a);
  }
  if (s->api_key != NULL && s->api_key[0] == '\0') {
    cli_die(a->cmd, "%s", "option --api-key: the key is empty (a request would need none)");
  }
  if (s->alias != NULL && s->alias[0] == '\0') cli_die(a->cmd, "%s", "option --alias: empty");
  if (s->chat_template != NULL) {
    const char *const *t = npulm_chat_templates();
    while (*t != NULL && strcmp(*t, s->chat_template) != 0) t++;
    if (*t == NULL) cli_die(a->cmd, "unknown chat template '%s'", s->chat_template);
  }
}

/* The listening address of --host (numeric) and --port; exits if it is not one. */
static struct addrinfo *listen_address(const char *cmd, const char *host, int port) {
  struct addrinfo hints = {.ai_flags = AI_PASSIVE | AI_NUMERICHOST | AI_NUMERICSERV,
                           .ai_socktype = SOCK_STREAM};
  char service[16];
  snprintf(service, sizeof(service), "%d", port);
  struct addrinfo *ai;
  if (getaddrinfo(host, service, &hints, &ai) != 0) {
    cli_die(cmd, "--host %s: not a numeric IPv4 or IPv6 address", host);
  }
  return ai;
}

int npulm_cmd_serve(int argc, char **argv) {
  struct cli_args a = {.argc = argc, .argv = argv, .cmd = argv[1], .usage = npulm_usage_serve};
  /* SIGINT and SIGTERM are taken by sigtimedwait below: blocked in every thread, which all start
   * after this and inherit the mask */
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, NULL);
  signal(SIGPIPE, SIG_IGN); /* a client gone mid-write is an error return, not the end */

  struct server s = {.max_tokens = 4096,
                     .max_body = 1 << 20,
                     .max_connections = 64,
                     .max_queue = 64,
                     .timeout_s = 10};
  struct serve_opts o = {.host = "127.0.0.1", .port = 8080, .parallel = 4};
  o.cp = npulm_compile_default_params();
  o.sp = npulm_session_default_params();
  parse_options(&a, &s, &o);
  struct addrinfo *addr = listen_address(a.cmd, o.host, o.port);

  const char *path = cli_resolve_model(a.cmd, o.model_path);
  npulm_error err;
  if (npulm_model_open(path, &s.model, &err) != NPULM_OK) cli_die(a.cmd, "%s", err.msg);
  if (!o.batch_given) cli_compile_batch(&a, &o.cp, o.parallel);
  cli_compile_if_needed(a.cmd, s.model, &o.cp, false);
  cli_free_compile_params(&o.cp);
  npulm_model_get_info(s.model, &s.info);
  const char *slash = strrchr(path, '/');
  s.file_id = slash != NULL ? slash + 1 : path;
  s.model_id = s.alias != NULL ? s.alias : s.file_id;
  s.n_slots = o.parallel;
  for (int i = 0; i < s.n_slots; i++) {
    if (npulm_session_create(s.model, &o.sp, &s.slots[i].session, &err) != NPULM_OK) {
      cli_die(a.cmd, "%s", err.msg);
    }
  }
  if (npulm_session_is_sparse(s.slots[0].session)) {
    fprintf(stderr,
            "npulm serve: sparse decode (--sparse %s): a step of one request decodes sparse, as "
            "run does; a step batching several requests runs dense\n",
            o.sp.sparse == NPULM_SPARSE_EXACT ? "exact" : "predict");
  }
  s.n_ctx = npulm_session_ctx(s.slots[0].session);
  s.started = (long long)time(NULL);

  pthread_mutex_init(&s.mu, NULL);
  pthread_mutex_init(&s.conn_mu, NULL);
  pthread_cond_init(&s.work, NULL);
  /* thread per connection: a connection's thread may wait on its request (a whole answer, or the
   * next piece of a stream) without holding up any other */
  struct MHD_Daemon *d = MHD_start_daemon(
      MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_ITC |
          (addr->ai_family == AF_INET6 ? MHD_USE_IPv6 : 0),
      0, NULL, NULL, on_request, &s, MHD_OPTION_SOCK_ADDR, addr->ai_addr,
      MHD_OPTION_CONNECTION_LIMIT, (unsigned)(s.max_connections + OVERFLOW_CONNECTIONS),
      MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)s.timeout_s, MHD_OPTION_NOTIFY_COMPLETED,
      on_completed, &s, MHD_OPTION_NOTIFY_CONNECTION, on_connection, &s, MHD_OPTION_END);
  freeaddrinfo(addr);
  if (d == NULL) {
    cli_die(a.cmd, "cannot listen on %s port %d (in use, or not an address of this machine)",
            o.host, o.port);
  }
  const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
  pthread_t engine;
  if (pthread_create(&engine, NULL, engine_main, &s) != 0) cli_die(a.cmd, "cannot start a thread");
  fprintf(stderr, "npulm serve: listening on http://%s%s%s:%u (%d slots, model %s)\n",
          strchr(o.host, ':') != NULL ? "[" : "", o.host, strchr(o.host, ':') != NULL ? "]" : "",
          di != NULL ? di->port : (unsigned)o.port, s.n_slots, s.model_id);

  for (;;) {
    const struct timespec tick = {0, 250 * 1000000L};
    const int sig = sigtimedwait(&stop_signals, NULL, &tick);
    if (sig == SIGINT || sig == SIGTERM) break;
    watchdog(&s);
  }

  /* stop accepting, end every request, then close the connections */
  const MHD_socket listen_fd = MHD_quiesce_daemon(d);
  pthread_mutex_lock(&s.mu);
  s.stopping = true;
  pthread_cond_signal(&s.work);
  pthread_mutex_unlock(&s.mu);
  pthread_join(engine, NULL);
  /* every request has its end now (the running ones "length", the waiting ones an error): the
   * connections write it all out before they are closed, within --timeout (the watchdog cuts a
   * client that stops reading) */
  for (const double until = now_s() + s.timeout_s;;) {
    pthread_mutex_lock(&s.conn_mu);
    const int left = s.n_answers;
    pthread_mutex_unlock(&s.conn_mu);
    if (left == 0 || now_s() > until) break;
    watchdog(&s);
    nanosleep(&(struct timespec){0, 10 * 1000000L}, NULL);
  }
  MHD_stop_daemon(d);
  if (listen_fd != MHD_INVALID_SOCKET) close(listen_fd);
  for (int i = 0; i < s.n_slots; i++) {
    npulm_session_free(s.slots[i].session);
    free(s.slots[i].out);
    free(s.slots[i].ends);
  }
  pthread_cond_destroy(&s.work);
  pthread_mutex_destroy(&s.conn_mu);
  pthread_mutex_destroy(&s.mu);
  npulm_model_close(s.model);
  fprintf(stderr, "npulm serve: stopped\n");
  return 0;
}
