/* npulm serve's engine (serve.h): one thread that owns the slots' sessions and runs every
 * request's steps, batched; the HTTP side (tools/serve.c) queues requests and takes their text. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve.h"

/* ---- UTF-8 ---------------------------------------------------------------------------------- */

/* How much of 'n' bytes ends on a character's end: a last sequence that more bytes could still
 * complete is left out. */
static size_t utf8_whole(const char *s, size_t n) {
  const unsigned char *p = (const unsigned char *)s;
  for (size_t back = 1; back <= 3 && back <= n; back++) {
    const unsigned char b = p[n - back];
    if ((b & 0xc0) == 0x80) continue; /* a continuation byte: its lead is further back */
    const size_t need = b >= 0xf0 ? 4 : b >= 0xe0 ? 3 : b >= 0xc0 ? 2 : 1;
    return need > back ? n - back : n;
  }
  return n;
}

/* ---- Small helpers -------------------------------------------------------------------------- */

void *xrealloc(void *p, size_t size) {
  void *q = realloc(p, size);
  if (q == NULL) {
    fputs("npulm serve: out of memory\n", stderr);
    abort();
  }
  return q;
}

/* Append 'n' bytes to a growing buffer, invalid UTF-8 replaced by U+FFFD (JSON needs it valid). */
void append_utf8(char **buf, size_t *len, size_t *cap, const char *s, size_t n) {
  if (*len + 3 * n + 1 > *cap) {
    *cap = 2 * (*len + 3 * n + 1);
    *buf = xrealloc(*buf, *cap);
  }
  const unsigned char *p = (const unsigned char *)s;
  for (size_t i = 0; i < n;) {
    const size_t k = npulm_utf8_sequence((const char *)p + i, n - i);
    if (k == 0) {
      memcpy(*buf + *len, "\xef\xbf\xbd", 3);
      *len += 3;
      i++;
    } else {
      memcpy(*buf + *len, p + i, k);
      *len += k;
      i += k;
    }
  }
}

/* Note that a piece of text ends at 'end'. */
static void push_end(size_t **ends, size_t *n, size_t *cap, size_t end) {
  if (*n == *cap) {
    *cap = *cap > 0 ? 2 * *cap : 16;
    *ends = xrealloc(*ends, *cap * sizeof(size_t));
  }
  (*ends)[(*n)++] = end;
}

void timespec_after_ms(struct timespec *ts, int ms) {
  clock_gettime(CLOCK_MONOTONIC, ts);
  ts->tv_nsec += (long)ms * 1000000L;
  ts->tv_sec += ts->tv_nsec / 1000000000L;
  ts->tv_nsec %= 1000000000L;
}

/* Drop one reference to 'r' (under the server's mutex); the last frees it. */
void request_release(struct request *r) {
  if (--r->refs > 0) return;
  free(r->prompt);
  npulm_sampler_free(r->sampler);
  for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
  pthread_cond_destroy(&r->cv);
  free(r->text);
  free(r->ends);
  free(r);
}

/* ---- Engine --------------------------------------------------------------------------------- */

static void slot_emit(struct slot *sl, size_t n) {
  if (n == 0) return;
  append_utf8(&sl->out, &sl->out_len, &sl->out_cap, sl->hold, n);
  push_end(&sl->ends, &sl->n_ends, &sl->ends_cap, sl->out_len);
  memmove(sl->hold, sl->hold + n, sl->hold_len - n);
  sl->hold_len -= n;
}

static void slot_finish(struct slot *sl, const char *why) {
  slot_emit(sl, utf8_whole(sl->hold, sl->hold_len)); /* a cut character is dropped */
  sl->hold_len = 0;
  sl->finish = why;
  sl->pending = false;
}

/* Take a sampled token: end on an end-of-generation token, else add its bytes, end at a stop
 * string (left out of the text), release what can no longer start one, and end at max_tokens or
 * at the context's end. */
static void slot_token(const struct server *s, struct slot *sl, int32_t tok) {
  const struct request *r = sl->req;
  if (!r->ignore_eos && npulm_token_is_eog(s->model, tok)) {
    slot_finish(sl, "stop");
    return;
  }
  char piece[256];
  size_t n = npulm_token_to_piece(s->model, sl->prev, tok, piece, sizeof(piece));
  if (n > sizeof(piece)) n = sizeof(piece);
  sl->prev = tok;
  sl->pending = true;
  sl->n_gen++;
  for (size_t done = 0; done < n;) { /* the hold stays under a stop string's length + 3 */
    size_t k = n - done;
    if (k > sizeof(sl->hold) - sl->hold_len) k = sizeof(sl->hold) - sl->hold_len;
    memcpy(sl->hold + sl->hold_len, piece + done, k);
    sl->hold_len += k;
    done += k;
    size_t stop_at = SIZE_MAX, keep = 0;
    for (int i = 0; i < r->n_stop; i++) {
      const size_t sn = strlen(r->stop[i]);
      for (size_t at = 0; at + sn <= sl->hold_len && at < stop_at; at++) {
        if (memcmp(sl->hold + at, r->stop[i], sn) == 0) stop_at = at;
      }
      for (size_t m = sn - 1 < sl->hold_len ? sn - 1 : sl->hold_len; m > keep; m--) {
        if (memcmp(sl->hold + sl->hold_len - m, r->stop[i], m) == 0) {
          keep = m;
          break;
        }
      }
    }
    if (stop_at != SIZE_MAX) {
      sl->hold_len = stop_at;
      slot_finish(sl, "stop");
      return;
    }
    slot_emit(sl, utf8_whole(sl->hold, sl->hold_len - keep));
  }
  /* the token would fill the context's last place: prompt and generated tokens fit it */
  if (sl->n_gen >= r->max_tokens || npulm_session_pos(sl->session) + 1 >= s->n_ctx) {
    slot_finish(sl, "length");
  }
}

static void slot_fail(struct slot *sl, const char *why) {
  sl->hold_len = 0;
  sl->finish = why;
  sl->pending = false;
}

/* Take a new request into its slot: its prompt is evaluated by the next steps, a piece a step. */
static void slot_start(struct slot *sl) {
  const struct request *r = sl->req;
  npulm_session_reset(sl->session);
  sl->n_gen = 0;
  sl->hold_len = 0;
  sl->finish = NULL;
  sl->pending = false;
  sl->fed = 0;
  sl->prev = r->prompt[r->n_prompt - 1];
  if (r->max_tokens == 0) slot_finish(sl, "length");
}

/* Hand each slot's released text and end to its request (under the mutex); free ended slots. */
static void engine_publish(struct server *s) {
  for (int i = 0; i < s->n_slots; i++) {
    struct slot *sl = &s->slots[i];
    struct request *r = sl->req;
    if (r == NULL) continue;
    if (sl->out_len > 0 || sl->finish != NULL) {
      if (r->len + sl->out_len + 1 > r->cap) {
        r->cap = 2 * (r->len + sl->out_len + 1);
        r->text = xrealloc(r->text, r->cap);
      }
      memcpy(r->text + r->len, sl->out, sl->out_len);
      for (size_t k = 0; k < sl->n_ends; k++) {
        push_end(&r->ends, &r->n_ends, &r->ends_cap, r->len + sl->ends[k]);
      }
      r->len += sl->out_len;
      r->n_gen = sl->n_gen;
      sl->out_len = 0;
      sl->n_ends = 0;
      if (sl->finish != NULL) {
        if (strcmp(sl->finish, "stop") == 0 || strcmp(sl->finish, "length") == 0) {
          r->finish = sl->finish;
        } else {
          r->failure = sl->finish;
        }
      }
      pthread_cond_broadcast(&r->cv);
    }
    if (sl->finish != NULL) {
      sl->req = NULL;
      sl->finish = NULL;
      request_release(r);
    }
  }
}

/* The rows of one step: with 'decode', each running request's pending token; then pieces of the
 * prompts being evaluated (chunked prefill: a long prompt does not hold up the others' tokens for
 * all of its length), in slot order, up to 'max_rows' in all (the program's largest chunk: a step
 * of more is not one graph; the running requests alone may pass it, then the step runs each
 * alone). Each slot's rows are consecutive ('sl->rows' of them). */
static int build_step(struct server *s, int max_rows, bool decode, npulm_session **sessions,
                      int32_t *tokens, struct slot **owners) {
  int n = 0;
  for (int i = 0; i < s->n_slots; i++) {
    struct slot *sl = &s->slots[i];
    sl->rows = 0;
    if (!decode || sl->req == NULL || sl->finish != NULL || !sl->pending) continue;
    sessions[n] = sl->session;
    tokens[n] = sl->prev;
    owners[n++] = sl;
    sl->rows = 1;
  }
  for (int i = 0, left = max_rows - n; i < s->n_slots && left > 0; i++) {
    struct slot *sl = &s->slots[i];
    if (sl->req == NULL || sl->finish != NULL || sl->fed == sl->req->n_prompt) continue;
    const size_t rest = sl->req->n_prompt - sl->fed;
    const int k = rest < (size_t)left ? (int)rest : left;
    for (int j = 0; j < k; j++) {
      sessions[n] = sl->session;
      tokens[n] = sl->req->prompt[sl->fed + (size_t)j];
      owners[n++] = sl;
    }
    sl->rows = k;
    left -= k;
  }
  return n;
}

/* Evaluate the 'n' rows of a step as one batched step, and take the next token of each slot whose
 * step ended its prompt or decoded its token. A program that cannot batch them (a program file
 * compiled without --batch, attention on the NPU, more rows than its largest chunk) refuses the
 * step, evaluating nothing: then each slot's rows are evaluated alone ('*warned' says so once). */
static void engine_step(struct server *s, npulm_session *const *sessions, const int32_t *tokens,
                        struct slot *const *owners, int n, bool *warned) {
  npulm_error err;
  const npulm_status st = npulm_session_eval_batch(sessions, tokens, (size_t)n, &err);
  if (st == NPULM_ERR_UNSUPPORTED && !*warned) {
    fprintf(stderr, "npulm serve: %s; such steps run each request alone\n", err.msg);
    *warned = true;
  }
  for (int i = 0; i < n; i += owners[i]->rows) {
    struct slot *sl = owners[i];
    if (st != NPULM_OK &&
        (st != NPULM_ERR_UNSUPPORTED ||
         npulm_session_eval(sl->session, &tokens[i], (size_t)sl->rows, NULL, &err) != NPULM_OK)) {
      fprintf(stderr, "npulm serve: %s: step: %s\n", sl->req->id, err.msg);
      slot_fail(sl, sl->pending ? "a decode step failed" : "the prompt could not be evaluated");
      continue;
    }
    if (!sl->pending) sl->fed += (size_t)sl->rows;
    sl->pending = false;
    if (sl->fed == sl->req->n_prompt) {
      slot_token(s, sl, npulm_sampler_sample(sl->req->sampler, npulm_session_logits(sl->session)));
    }
  }
}

/* The engine thread: take waiting requests into free slots, prefill them, then decode one token
 * of every running request as one batched step; repeat. */
void *engine_main(void *arg) {
  struct server *s = arg;
  /* a step's rows: at most a token of each slot and a largest chunk of prompts */
  int max_rows = npulm_program_max_rows(s->model);
  if (max_rows < 1) max_rows = 1;
  const size_t cap = (size_t)s->n_slots + (size_t)max_rows;
  npulm_session **sessions = malloc(cap * sizeof(*sessions));
  int32_t *tokens = malloc(cap * sizeof(*tokens));
  struct slot **owners = malloc(cap * sizeof(*owners));
  if (sessions == NULL || tokens == NULL || owners == NULL) {
    fprintf(stderr, "npulm serve: out of memory\n");
    exit(1);
  }
  bool warned = false;
  pthread_mutex_lock(&s->mu);
  for (;;) {
    /* a client gone is dropped before the next step; at shutdown every request ends here */
    for (int i = 0; i < s->n_slots; i++) {
      struct slot *sl = &s->slots[i];
      if (sl->req != NULL && (sl->req->cancelled || s->stopping)) slot_finish(sl, "length");
    }
    engine_publish(s);
    if (s->stopping) {
      while (s->queue_head != NULL) { /* waiting requests are refused */
        struct request *r = s->queue_head;
        s->queue_head = r->next;
        r->failure = "the server is shutting down";
        pthread_cond_broadcast(&r->cv);
        request_release(r);
      }
      s->queue_tail = NULL;
      s->n_queued = 0;
    }
    int n_running = 0;
    for (int i = 0; i < s->n_slots; i++) {
      struct slot *sl = &s->slots[i];
      if (sl->req == NULL && s->queue_head != NULL) {
        struct request *r = s->queue_head;
        s->queue_head = r->next;
        if (s->queue_head == NULL) s->queue_tail = NULL;
        s->n_queued--;
        sl->req = r;
        slot_start(sl);
      }
      n_running += sl->req != NULL;
    }
    if (n_running == 0) {
      if (s->stopping) break;
      pthread_cond_wait(&s->work, &s->mu);
      continue;
    }
    pthread_mutex_unlock(&s->mu);

    int n = build_step(s, max_rows, true, sessions, tokens, owners);
    if (n > 0) engine_step(s, sessions, tokens, owners, n, &warned);
    if (n >= max_rows) { /* the running requests filled the step: prompts move on in one more */
      n = build_step(s, max_rows, false, sessions, tokens, owners);
      if (n > 0) engine_step(s, sessions, tokens, owners, n, &warned);
    }
    pthread_mutex_lock(&s->mu);
  }
  pthread_mutex_unlock(&s->mu);
  free(sessions);
  free(tokens);
  free(owners);
  return NULL;
}
