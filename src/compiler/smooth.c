/* SmoothQuant (see smooth.h): the factors of a block's four matmul inputs, from the calibration
 * statistics and the weights, folded into the weights. */
#include "compiler/smooth.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"

/* A weight of the program made writable: a copy owned by the program, which 'weights' then
 * references. Returns the copy or NULL. */
static float *own_weight(struct npu_program *p, int32_t wi) {
  struct npu_weight *w = &p->weights[wi];
  size_t n = (size_t)w->ne0 * (size_t)w->ne1;
  for (int32_t i = 0; i < p->n_owned; i++) {
    if (p->owned[i] == w->data) return p->owned[i]; /* already ours */
  }
  float **grown = realloc(p->owned, (size_t)(p->n_owned + 1) * sizeof(*grown));
  if (grown == NULL) return NULL;
  p->owned = grown;
  float *copy = malloc(n * sizeof(float));
  if (copy == NULL) return NULL;
  memcpy(copy, w->data, n * sizeof(float));
  p->owned[p->n_owned++] = copy;
  /* every table entry that shared the old data (a tied output) follows the copy */
  const float *old = w->data;
  for (int32_t i = 0; i < p->n_weights; i++) {
    if (p->weights[i].data == old) p->weights[i].data = copy;
  }
  return copy;
}

/* The weight (slot 1) or bias (slot 2) that the op writing the tensor of 'role' in 'layer' of
 * graph 'g' reads: its number in the program's weight table, or -1. */
static int32_t weight_of(const struct npu_graph *g, int32_t layer, enum npu_tensor_role role,
                         int slot) {
  int32_t w = npu_ir_writer_of(g, npu_ir_find_tensor(g, layer, role));
  if (w < 0 || g->nodes[w].in[slot] < 0) return -1;
  const struct npu_ir_tensor *t = &g->tensors[g->nodes[w].in[slot]];
  return t->kind == NPU_TK_WEIGHT ? t->ref : -1;
}

/* The calibration statistics of the tensor of 'role' in 'layer' of graph 'g', or NULL. */
static const struct npu_act_stats *stats_of(const struct npu_calib *cal, const struct npu_graph *g,
                                            int32_t layer, enum npu_tensor_role role) {
  int32_t t = npu_ir_find_tensor(g, layer, role);
  return t >= 0 ? npu_calib_find(cal, g->tensors[t].name) : NULL;
}

/* Largest |w[r][c]| over the rows r, for each input column c. */
static void column_absmax(const struct npu_weight *w, float *out) {
  for (int32_t c = 0; c < w->ne0; c++) out[c] = 0.0f;
  for (int32_t r = 0; r < w->ne1; r++) {
    const float *row = w->data + (size_t)r * (size_t)w->ne0;
    for (int32_t c = 0; c < w->ne0; c++) out[c] = fmaxf(out[c], fabsf(row[c]));
  }
}

/* Multiply column c of weight 'wi' by s[c]. */
static bool scale_columns(struct npu_program *p, int32_t wi, const float *s) {
  float *w = own_weight(p, wi);
  if (w == NULL) return false;
  const struct npu_weight *t = &p->weights[wi];
  for (int32_t r = 0; r < t->ne1; r++) {
    for (int32_t c = 0; c < t->ne0; c++) w[(size_t)r * (size_t)t->ne0 + (size_t)c] *= s[c];
  }
  return true;
}

/* Divide row r of weight 'wi' (a matrix, or a vector with ne1 = 1 scaled element-wise) by s[r]. */
static bool divide_rows(struct npu_program *p, int32_t wi, const float *s) {
  float *w = own_weight(p, wi);
  if (w == NULL) return false;
  const struct npu_weight *t = &p->weights[wi];
  if (t->ne1 == 1) {
    for (int32_t c = 0; c < t->ne0; c++) w[c] /= s[c];
  } else {
    for (int32_t r = 0; r < t->ne1; r++) {
      for (int32_t c = 0; c < t->ne0; c++) w[(size_t)r * (size_t)t->ne0 + (size_t)c] /= s[r];
    }
  }
  return true;
}

/* SmoothQuant factors s[c] = amax[c]^alpha / wmax[c]^(1-alpha) over the matmuls reading one
 * activation (wmax = max over them), clamped to a sane range. */
static void smooth_factors(const float *amax, const float *wmax, int32_t n, float alpha, float *s) {
  for (int32_t c = 0; c < n; c++) {
    float a = fmaxf(amax[c], 1e-5f), w = fmaxf(wmax[c], 1e-5f);
    float f = powf(a, alpha) / powf(w, 1.0f - alpha);
    s[c] = fminf(fmaxf(f, 1e-2f), 1e2f);
  }
}

/* Apply SmoothQuant to block 'l': the inputs of q/k/v (folded into attn_norm), of gate/up
 * (ffn_norm), of the attention output projection (V's rows, per KV channel shared by the heads of
 * a group) and of down (up's rows), from the block's statistics in 'cal'. The classifier is left
 * alone: its weight may be the embedding table. The weights are found through the program's
 * first graph. */
npulm_status npu_smooth_layer(const struct npulm_model *m, struct npu_program *p,
                              const struct npu_calib *cal, float alpha, int32_t l,
                              npulm_error *err) {
  const struct npu_config *c = &m->cfg;
  const struct npu_graph *g = &p->graphs[0];
  int32_t widest = c->ffn_dim > c->dim ? c->ffn_dim : c->dim;
  if (c->n_heads * c->head_dim > widest) widest = c->n_heads * c->head_dim;
  float *wmax = malloc((size_t)widest * sizeof(float)),
        *tmp = malloc((size_t)widest * sizeof(float));
  float *s = malloc((size_t)widest * sizeof(float)), *amax = malloc((size_t)widest * sizeof(float));
  npulm_status st = NPULM_OK;
  if (!wmax || !tmp || !s || !amax) {
    st = npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
    goto done;
  }
  int32_t idx[4];
#define W(role) weight_of(g, l, NPU_ROLE_##role, 1)
#define STATS(role) stats_of(cal, g, l, NPU_ROLE_##role)
  /* inputs of q, k, v: fold 1/s into attn_norm */
  const struct npu_act_stats *a = STATS(ATTN_NORM);
  idx[0] = W(Q), idx[1] = W(K), idx[2] = W(V);
  idx[3] = W(ATTN_NORM);
  if (a == NULL || idx[0] < 0 || idx[1] < 0 || idx[2] < 0 || idx[3] < 0) goto missing;
  column_absmax(&p->weights[idx[0]], wmax);
  for (int k = 1; k < 3; k++) {
    column_absmax(&p->weights[idx[k]], tmp);
    for (int32_t i = 0; i < c->dim; i++) wmax[i] = fmaxf(wmax[i], tmp[i]);
  }
  smooth_factors(a->chan_absmax, wmax, c->dim, alpha, s);
  if (!divide_rows(p, idx[3], s) || !scale_columns(p, idx[0], s) || !scale_columns(p, idx[1], s) ||
      !scale_columns(p, idx[2], s)) {
    goto nomem;
  }
  /* inputs of gate, up: fold 1/s into ffn_norm */
  a = STATS(FFN_NORM);
  idx[0] = W(FFN_GATE), idx[1] = W(FFN_UP), idx[2] = W(FFN_NORM);
  if (a == NULL || idx[0] < 0 || idx[1] < 0 || idx[2] < 0) goto missing;
  column_absmax(&p->weights[idx[0]], wmax);
  column_absmax(&p->weights[idx[1]], tmp);
  for (int32_t i = 0; i < c->dim; i++) wmax[i] = fmaxf(wmax[i], tmp[i]);
  smooth_factors(a->chan_absmax, wmax, c->dim, alpha, s);
  if (!divide_rows(p, idx[2], s) || !scale_columns(p, idx[0], s) || !scale_columns(p, idx[1], s)) {
    goto nomem;
  }
  /* input of down (silu(gate) * up): fold 1/s into up's rows */
  a = STATS(FFN_GATE_PAR);
  idx[0] = W(FFN_DOWN), idx[1] = W(FFN_UP);
  if (a == NULL || idx[0] < 0 || idx[1] < 0) goto missing;
  column_absmax(&p->weights[idx[0]], wmax);
  smooth_factors(a->chan_absmax, wmax, c->ffn_dim, alpha, s);
  if (!divide_rows(p, idx[1], s) || !scale_columns(p, idx[0], s)) goto nomem;
  /* input of the output projection (attention result): one factor per KV channel, shared by
   * the heads that read it; fold 1/s into V's rows (and bias) */
  a = STATS(KQV);
  idx[0] = W(ATTN_OUT), idx[1] = W(V);
  if (a == NULL || idx[0] < 0 || idx[1] < 0) goto missing;
  int32_t kv_dim = c->n_kv_heads * c->head_dim, q_dim = c->n_heads * c->head_dim;
  int32_t group = c->n_heads / c->n_kv_heads;
  column_absmax(&p->weights[idx[0]], wmax);
  for (int32_t j = 0; j < kv_dim; j++) amax[j] = tmp[j] = 0.0f;
  for (int32_t i = 0; i < q_dim; i++) {
    int32_t j = (i / c->head_dim / group) * c->head_dim + i % c->head_dim;
    amax[j] = fmaxf(amax[j], a->chan_absmax[i]);
    tmp[j] = fmaxf(tmp[j], wmax[i]);
  }
  smooth_factors(amax, tmp, kv_dim, alpha, s);
  int32_t bv = weight_of(g, l, NPU_ROLE_V, 2);
  for (int32_t i = 0; i < q_dim; i++) {
    wmax[i] = s[(i / c->head_dim / group) * c->head_dim + i % c->head_dim]; /* per q channel */
  }
  if (!divide_rows(p, idx[1], s) || (bv >= 0 && !divide_rows(p, bv, s)) ||
      !scale_columns(p, idx[0], wmax)) {
    goto nomem;
  }
#undef W
#undef STATS
  goto done;
missing:
  st = npu_fail(err, NPULM_ERR_ARG, "SmoothQuant: a weight or calibration statistic is missing");
  goto done;
nomem:
  st = npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
done:
  free(wmax);
  free(tmp);
  free(s);
  free(amax);
  return st;
}
