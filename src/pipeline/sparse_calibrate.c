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

/* ---- input-sparse decode ---------------------------------------------------------------------*/

enum { HIST = 32769 }; /* |d| of an int16 input is at most 32768 */

/* Per matmul site, a histogram of |x[c] - zero point| over the decode steps' inputs. */
struct input_capture {
  const struct npu_program *p;
  uint64_t **hist; /* (n_qsites) NULL where the site is not sparsified */
};

/* The matmuls input-sparse decode thresholds: every one of a block; not the classifier. */
static bool sparsified_role(int32_t role) {
  return role == NPU_ROLE_Q || role == NPU_ROLE_K || role == NPU_ROLE_V ||
         role == NPU_ROLE_ATTN_OUT || role == NPU_ROLE_FFN_GATE || role == NPU_ROLE_FFN_UP ||
         role == NPU_ROLE_FFN_DOWN;
}

static void capture_matmul_input(void *user, const struct npu_graph *g, int32_t node,
                                 const struct npu_exec_ctx *ctx) {
  struct input_capture *c = user;
  const struct npu_ir_node *n = &g->nodes[node];
  if (g->rows != 1 || n->op != NPU_OP_MATMUL || n->backend != NPU_BE_NPU || g->node_site == NULL)
    return;
  const int32_t site = g->node_site[node];
  if (site < 0 || c->hist[site] == NULL) return;
  const struct npu_ir_tensor *x = &g->tensors[n->in[0]];
  const void *data = ctx->arena[x->backend] + x->offset;
  const size_t k = (size_t)x->ne[1];
  uint64_t *h = c->hist[site];
  if (x->dtype == NPU_DT_I16) {
    for (size_t i = 0; i < k; i++) h[abs(((const int16_t *)data)[i])]++;
  } else {
    const int32_t zx = c->p->qsites[site].gemm.x_zero_point;
    for (size_t i = 0; i < k; i++) h[abs(((const int8_t *)data)[i] - zx)]++;
  }
}

/* Give every captured site the threshold that skips the share 'level' of its channels (nearest
 * on the histogram; 0 for level 0). */
static void set_thresholds(struct npu_program *p, uint64_t *const *hist, float level) {
  p->input_sparsity = level;
  for (int32_t i = 0; i < p->n_qsites; i++) {
    struct npu_qsite *s = &p->qsites[i];
    s->skip_below = 0;
    s->skip_keep = 1.0f;
    if (hist[i] == NULL || level <= 0.0f) continue;
    uint64_t total = 0;
    for (int v = 0; v < HIST; v++) total += hist[i][v];
    if (total == 0) continue;
    /* below t skips cum(t) = sum_{v < t} h[v]: the t >= 1 nearest to the level */
    uint64_t cum = 0;
    double best = 2.0;
    for (int t = 1; t <= HIST; t++) {
      cum += hist[i][t - 1];
      const double share = (double)cum / (double)total, miss = share - level;
      if ((miss < 0 ? -miss : miss) < best) {
        best = miss < 0 ? -miss : miss;
        s->skip_below = t;
        s->skip_keep = (float)(1.0 - share);
      }
      if (share >= level) break;
    }
  }
}

npulm_status npu_input_calibrate(const npulm_model *model, struct npu_program *p, float level,
                                 const int32_t *tokens, size_t n_tokens, int32_t bos,
                                 const npulm_compile_params *params, npulm_error *err) {
  if (!(level == NPULM_SPARSITY_AUTO || (level > 0.0f && level < 1.0f))) {
    return npu_fail(err, NPULM_ERR_ARG, "sparsity %g is not in (0, 1) nor auto", (double)level);
  }
  struct input_capture cap = {.p = p, .hist = calloc((size_t)p->n_qsites, sizeof(uint64_t *))};
  npulm_status st = cap.hist == NULL ? npu_fail(err, NPULM_ERR_NOMEM, "out of memory") : NPULM_OK;
  for (int32_t gi = 0; st == NPULM_OK && gi < p->n_graphs; gi++) {
    const struct npu_graph *g = &p->graphs[gi];
    for (int32_t i = 0; st == NPULM_OK && g->node_site != NULL && i < g->n_nodes; i++) {
      const int32_t site = g->node_site[i];
      const struct npu_ir_node *n = &g->nodes[i];
      if (site < 0 || n->op != NPU_OP_MATMUL || n->backend != NPU_BE_NPU ||
          !sparsified_role(g->tensors[n->out].role) || cap.hist[site] != NULL) {
        continue;
      }
      cap.hist[site] = calloc(HIST, sizeof(uint64_t));
      if (cap.hist[site] == NULL) st = npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
    }
  }
  const bool report = params != NULL && params->progress != NULL;
  if (st == NPULM_OK && report) params->progress(params->progress_user, "sparse", "steps", 0, 1);
  set_thresholds(p, cap.hist, 0.0f);
  npulm_session_params sp = npulm_session_default_params();
  sp.n_ctx = WINDOW + 1;
  sp.sparse = NPULM_SPARSE_OFF;
  npulm_session *s = NULL;
  if (st == NPULM_OK) st = npu_session_create_program(model, p, &sp, &s, err);
  if (st == NPULM_OK) {
    /* the inputs of decode steps from an empty cache, as decode_text runs them */
    npu_session_observe(s, capture_matmul_input, &cap);
    for (size_t w = 0; st == NPULM_OK && w < n_tokens && w < MAX_INPUTS; w += WINDOW) {
      npulm_session_reset(s);
      npu_session_observe(s, NULL, NULL);
      if (bos >= 0) st = npulm_session_eval(s, &bos, 1, NULL, err);
      npu_session_observe(s, capture_matmul_input, &cap);
      const size_t len = n_tokens - w < WINDOW ? n_tokens - w : WINDOW;
      for (size_t i = 0; st == NPULM_OK && i < len; i++)
        st = npulm_session_eval(s, &tokens[w + i], 1, NULL, err);
    }
  }
  npulm_session_free(s);
  if (st == NPULM_OK && level != NPULM_SPARSITY_AUTO) {
    set_thresholds(p, cap.hist, level);
  } else if (st == NPULM_OK) {
    /* auto: the largest level whose decode perplexity is within tolerance of dense */
    double dense = 0.0;
    st = decode_text(model, p, NPULM_SPARSE_OFF, tokens, n_tokens, bos, NULL, &dense, err);
    bool found = false;
    for (size_t i = 0; st == NPULM_OK && !found && i < NPU_INPUT_AUTO_LEVELS; i++) {
      double nll = 0.0;
      set_thresholds(p, cap.hist, npu_input_auto_levels[i]);
      st = decode_text(model, p, NPULM_SPARSE_PREDICT, tokens, n_tokens, bos, NULL, &nll, err);
      if (st == NPULM_OK) p->input_auto_ratio[i] = (float)exp(nll - dense);
      found = st == NPULM_OK && exp(nll - dense) <= NPU_SPARSE_AUTO_TOLERANCE;
      if (report) {
        params->progress(params->progress_user, "sparse", "levels", (uint64_t)i + 1,
                         NPU_INPUT_AUTO_LEVELS);
      }
    }
    if (st == NPULM_OK && !found) set_thresholds(p, cap.hist, 0.0f);
  }
  if (st != NPULM_OK) set_thresholds(p, cap.hist, 0.0f);
  if (st == NPULM_OK && report) params->progress(params->progress_user, "sparse", "steps", 1, 1);
  for (int32_t i = 0; cap.hist != NULL && i < p->n_qsites; i++) free(cap.hist[i]);
  free(cap.hist);
  return st;
}
