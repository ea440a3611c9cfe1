/* Sessions: a model plus the state of one sequence (KV cache, position, last logits). For now a
 * session runs the FP32 reference forward token by token. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"
#include "model.h"
#include "ref/forward.h"

/* Context used when the caller asks for the model's own: capped so that models trained for very
 * long contexts do not allocate gigabytes of KV cache by default. */
#define DEFAULT_CTX_CAP 4096

struct npulm_session {
  const struct npulm_model *model;
  struct npu_ref_state ref;
  int pos;
  int n_threads;
  float *logits; /* (n_vocab) of the last evaluated token */
};

npulm_session_params npulm_session_default_params(void) {
  npulm_session_params p = {.n_ctx = 0, .n_threads = 0};
  return p;
}

npulm_status npulm_session_create(const npulm_model *model, const npulm_session_params *params,
                                  npulm_session **session_out, npulm_error *err) {
  *session_out = NULL;
  npulm_session_params p = params != NULL ? *params : npulm_session_default_params();
  int n_ctx_train = model->cfg.n_ctx_train;
  if (p.n_ctx < 0) return npu_fail(err, NPULM_ERR_ARG, "context length %d is negative", p.n_ctx);
  if (p.n_ctx == 0) p.n_ctx = n_ctx_train < DEFAULT_CTX_CAP ? n_ctx_train : DEFAULT_CTX_CAP;
  if (p.n_ctx > n_ctx_train) {
    return npu_fail(err, NPULM_ERR_ARG, "context length %d exceeds the model's %d", p.n_ctx,
                    n_ctx_train);
  }
  if (p.n_threads <= 0) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    p.n_threads = n > 0 ? (int)n : 1;
  }
  struct npulm_session *s = calloc(1, sizeof(*s));
  if (s == NULL) return npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
  s->model = model;
  s->n_threads = p.n_threads;
  s->logits = calloc((size_t)model->cfg.n_vocab, sizeof(float));
  npulm_status st = s->logits == NULL ? npu_fail(err, NPULM_ERR_NOMEM, "out of memory")
                                      : npu_ref_state_init(&s->ref, &model->cfg, p.n_ctx, err);
  if (st != NPULM_OK) {
    npulm_session_free(s);
    return st;
  }
  *session_out = s;
  return NPULM_OK;
}

void npulm_session_free(npulm_session *s) {
  if (s == NULL) return;
  npu_ref_state_free(&s->ref);
  free(s->logits);
  free(s);
}

void npulm_session_reset(npulm_session *s) { s->pos = 0; }
int npulm_session_pos(const npulm_session *s) { return s->pos; }
int npulm_session_ctx(const npulm_session *s) { return s->ref.n_ctx; }
const float *npulm_session_logits(const npulm_session *s) { return s->logits; }

npulm_status npulm_session_eval(npulm_session *s, const int32_t *tokens, size_t n,
                                float *logits_out, npulm_error *err) {
  const struct npu_config *c = &s->model->cfg;
  if (n > (size_t)(s->ref.n_ctx - s->pos)) {
    return npu_fail(err, NPULM_ERR_ARG,
                    "%zu tokens do not fit in the context: %d of %d positions are used", n, s->pos,
                    s->ref.n_ctx);
  }
  for (size_t i = 0; i < n; i++) {
    if (tokens[i] < 0 || tokens[i] >= c->n_vocab) {
      return npu_fail(err, NPULM_ERR_ARG, "token id %d is outside the vocabulary (0..%d)",
                      tokens[i], c->n_vocab - 1);
    }
  }
  for (size_t i = 0; i < n; i++) {
    npu_ref_forward(s->model, &s->ref, tokens[i], s->pos, s->logits, NULL);
    s->pos++;
    if (logits_out != NULL) {
      memcpy(logits_out + i * (size_t)c->n_vocab, s->logits, (size_t)c->n_vocab * sizeof(float));
    }
  }
  return NPULM_OK;
}
