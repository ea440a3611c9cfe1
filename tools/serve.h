/* npulm serve (tools/serve.c): what its HTTP side and its engine (tools/serve_engine.c) share:
 * the requests between them, the engine's slots, the server, and the engine's entry points. */
#ifndef NPULM_TOOLS_SERVE_H
#define NPULM_TOOLS_SERVE_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "npulm.h"

enum {
  MAX_PARALLEL = 64,
  MAX_STOP = 4,              /* OpenAI's limit on stop strings */
  MAX_STOP_LEN = 256,        /* bytes of one stop string */
  OVERFLOW_CONNECTIONS = 16, /* connections past --max-connections answered 503 */
  WAIT_MS = 100,             /* how often a waiting connection looks whether its client is gone */
};

/* A request between the HTTP side and the engine. The fields above 'cv' are written before it
 * is queued and only read after; the rest are under the server's mutex. */
struct request {
  bool chat, stream;
  bool ignore_eos; /* (llama-server's extension) an end-of-generation token does not end it */
  int32_t *prompt;
  size_t n_prompt;
  int max_tokens;
  npulm_sampler *sampler;
  char *stop[MAX_STOP];
  int n_stop;
  char id[48];
  long long created;

  pthread_cond_t cv; /* signalled when text, the end or a failure arrives */
  char *text;        /* generated text the HTTP side has not taken yet */
  size_t len, cap;
  size_t *ends; /* where each piece of it ends (a stream sends one event per piece) */
  size_t n_ends, ends_cap;
  int n_gen;            /* completion tokens so far */
  const char *finish;   /* "stop" or "length" once it has ended */
  const char *failure;  /* why the engine could not finish it */
  bool cancelled;       /* the client is gone */
  int refs;             /* the HTTP side and the engine each hold one */
  struct request *next; /* in the queue */
};

/* One session and what the engine knows of the request it is generating: the engine's alone, but
 * for 'req', which it changes under the server's mutex (the HTTP side counts the busy slots). */
struct slot {
  npulm_session *session;
  struct request *req; /* NULL: free */
  int32_t prev;        /* the last token (token_to_piece needs it) */
  bool pending;        /* 'prev' is yet to be evaluated */
  size_t fed;          /* prompt tokens evaluated: until all are, the slot is prefilling */
  int rows;            /* its tokens in the step being built */
  int n_gen;
  char hold[MAX_STOP_LEN + 8]; /* bytes held back: a stop string's start, unfinished UTF-8 */
  size_t hold_len;
  char *out; /* text released this step, handed over under the mutex */
  size_t out_len, out_cap;
  size_t *ends; /* where each piece of 'out' ends */
  size_t n_ends, ends_cap;
  const char *finish;
};

struct tracked; /* a connection (tools/serve.c) */

struct server {
  npulm_model *model;
  npulm_model_info info;
  const char *model_id; /* the served name: --alias, else the model's file name */
  const char *file_id;  /* the model's file name, which a request may name too */
  const char *alias;
  const char *api_key;
  const char *chat_template; /* NULL: the model's */
  int n_ctx, max_tokens, max_connections, max_queue, timeout_s;
  long long started; /* the Unix time the server started */
  size_t max_body;

  pthread_mutex_t mu;
  pthread_cond_t work; /* the engine waits on it for requests */
  struct request *queue_head, *queue_tail;
  int n_queued;
  bool stopping;
  uint64_t n_requests; /* for ids and default seeds */
  struct slot slots[MAX_PARALLEL];
  int n_slots;

  pthread_mutex_t conn_mu;
  struct tracked *conns;
  int n_conns;   /* connections open and counted */
  int n_answers; /* requests begun and not yet answered in full (their on_completed to come) */
};

/* The engine thread (pthread_create's start routine, its argument the server): takes waiting
 * requests into free slots, prefills them, then decodes one token of every running request as one
 * batched step, until the server is stopping and no request is left. */
void *engine_main(void *server);

/* Drop one reference to 'r' (under the server's mutex); the last frees it. */
void request_release(struct request *r);

/* realloc that exits on failure; append the valid UTF-8 of s[0..n) to the buffer (U+FFFD for an
 * invalid or cut sequence); the monotonic time 'ms' from now (the condition variables' clock). */
void *xrealloc(void *p, size_t size);
void append_utf8(char **buf, size_t *len, size_t *cap, const char *s, size_t n);
void timespec_after_ms(struct timespec *ts, int ms);

#endif /* NPULM_TOOLS_SERVE_H */
