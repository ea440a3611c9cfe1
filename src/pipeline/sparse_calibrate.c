/* The compile's sparse decode step (sparse.h). */
#include "pipeline/sparse_calibrate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "compiler/sparsify.h"
#include "model/model.h"
#include "runtime/session_internal.h"

/* Windows of the calibration text decoded from an empty cache: long enough for the positions a
 * decode step sees, short enough to be quick. */
enum { WINDOW = 128, MAX_INPUTS = 512 };

/* The FFN norm outputs of the decode graphs, one row per token (npu_node_observer). */
struct capture {
  int32_t dim, n_layers;
  int32_t row; /* the row of the token being decoded, or -1: do not capture */
  int32_t n;   /* rows captured */
  int8_t **x;  /* (n_layers) [MAX_INPUTS, dim] */
};

static void capture_ffn_input(void *user, const struct npu_graph *g, int32_t node,
                              const struct npu_exec_ctx *ctx) {
  struct capture *c = user;
  const struct npu_ir_tensor *t = &g->tensors[g->nodes[node].out];
  if (g->rows != 1 || t->role != NPU_ROLE_FFN_NORM || t->dtype != NPU_DT_I8 || t->layer < 0 ||
      t->layer >= c->n_layers || c->row < 0 || c->row >= MAX_INPUTS) {
    return;
  }
  memcpy(c->x[t->layer] + (size_t)c->row * (size_t)c->dim, ctx->arena[t->backend] + t->offset,
         (size_t)c->dim);
}

/* Decode 'n' tokens in windows from an empty cache; with 'cap', capture each step's FFN inputs;
 * the mean negative log-likelihood of each next token into '*nll' (may be NULL). */
static npulm_status decode_text(const npulm_model *model, const struct npu_program *p, int mode,
                                const int32_t *tokens, size_t n, int32_t bos, struct capture *cap,
                                double *nll, npulm_error *err) {
  npulm_session_params sp = npulm_session_default_params();
  sp.n_ctx = WINDOW + 1;
  sp.sparse = mode;
  npulm_session *s = NULL;
  npulm_status st = npu_session_create_program(model, p, &sp, &s, err);
  if (st != NPULM_OK) return st;
  if (cap != NULL) npu_session_observe(s, capture_ffn_input, cap);
  const int n_vocab = model->cfg.n_vocab;
  double sum = 0.0;
  uint64_t scored = 0;
  for (size_t w = 0; st == NPULM_OK && w < n; w += WINDOW) {
    if (cap != NULL && cap->n >= MAX_INPUTS) break;
    npulm_session_reset(s);
    const size_t len = n - w < WINDOW ? n - w : WINDOW;
    if (cap != NULL) cap->row = -1;
    if (bos >= 0) st = npulm_session_eval(s, &bos, 1, NULL, err);
    for (size_t i = 0; st == NPULM_OK && i < len; i++) {
      if (cap != NULL && cap->n >= MAX_INPUTS) break;
      if (cap != NULL) cap->row = cap->n++;
      st = npulm_session_eval(s, &tokens[w + i], 1, NULL, err);
      if (st != NPULM_OK || nll == NULL || i + 1 >= len) continue;
      const float *logits = npulm_session_logits(s);
      double mx = -INFINITY, z = 0.0;
      for (int v = 0; v < n_vocab; v++) mx = logits[v] > mx ? logits[v] : mx;
      for (int v = 0; v < n_vocab; v++) z += exp(logits[v] - mx);
      sum += log(z) + mx - logits[tokens[w + i + 1]];
      scored++;
    }
  }
  npulm_session_free(s);
  if (nll != NULL) *nll = scored > 0 ? sum / (double)scored : 0.0;
  return st;
}

npulm_status npu_sparse_calibrate(const npulm_model *model, struct npu_program *p, float level,
                                  int32_t rank, const int32_t *tokens, size_t n_tokens, int32_t bos,
                                  const npulm_compile_params *params, npulm_error *err) {
  const struct npu_config *cfg = &model->cfg;
  const double recall = params != NULL ? params->sparse_recall : 0.0;
  struct capture cap = {.dim = cfg->dim, .n_layers = cfg->n_layers, .row = -1, .n = 0};
  cap.x = calloc((size_t)cfg->n_layers, sizeof(*cap.x));
  npulm_status st = cap.x == NULL ? npu_fail(err, NPULM_ERR_NOMEM, "out of memory") : NPULM_OK;
  for (int32_t l = 0; st == NPULM_OK && l < cfg->n_layers; l++) {
    cap.x[l] = malloc((size_t)MAX_INPUTS * (size_t)cfg->dim);
    if (cap.x[l] == NULL) st = npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
  }
  const bool report = params != NULL && params->progress != NULL;
  if (st == NPULM_OK && report) params->progress(params->progress_user, "sparse", "steps", 0, 1);
  if (st == NPULM_OK) {
    st = decode_text(model, p, NPULM_SPARSE_OFF, tokens, n_tokens, bos, &cap, NULL, err);
  }
  const int32_t n = cap.n;
  if (st == NPULM_OK && level != NPULM_SPARSITY_AUTO) {
    st = npu_sparse_build(p, cfg, (const int8_t *const *)cap.x, n, level, rank, recall, err);
  } else if (st == NPULM_OK) {
    /* auto: the largest level whose decode perplexity is within tolerance of dense */
    const float *levels = npu_sparse_auto_levels;
    float ratio[NPU_SPARSE_AUTO_LEVELS] = {0};
    double dense = 0.0;
    st = decode_text(model, p, NPULM_SPARSE_OFF, tokens, n_tokens, bos, NULL, &dense, err);
    bool found = false;
    for (size_t i = 0; st == NPULM_OK && !found && i < NPU_SPARSE_AUTO_LEVELS; i++) {
      double nll = 0.0;
      st = npu_sparse_build(p, cfg, (const int8_t *const *)cap.x, n, levels[i], rank, recall, err);
      if (st == NPULM_OK) {
        st = decode_text(model, p, NPULM_SPARSE_PREDICT, tokens, n_tokens, bos, NULL, &nll, err);
      }
      if (st == NPULM_OK) ratio[i] = (float)exp(nll - dense);
      found = st == NPULM_OK && exp(nll - dense) <= NPU_SPARSE_AUTO_TOLERANCE;
      if (report) {
        params->progress(params->progress_user, "sparse", "levels", (uint64_t)i + 1,
                         NPU_SPARSE_AUTO_LEVELS);
      }
    }
    if (st == NPULM_OK && !found) {
      st = npu_sparse_build(p, cfg, (const int8_t *const *)cap.x, n, 0.0f, rank, recall, err);
    }
    if (st == NPULM_OK) memcpy(p->sparse->auto_ratio, ratio, sizeof(ratio));
  }
  if (st == NPULM_OK && report) params->progress(params->progress_user, "sparse", "steps", 1, 1);
  for (int32_t l = 0; cap.x != NULL && l < cfg->n_layers; l++) free(cap.x[l]);
  free(cap.x);
  return st;
}
