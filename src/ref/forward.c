/* The FP32 reference forward pass of the llama/qwen2 decoder, written to read like the paper. */
#include "ref/forward.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "base/expf.h"

npulm_status npu_ref_state_init(struct npu_ref_state *s, const struct npu_config *c, int n_ctx,
                                npulm_error *err) {
  return npu_ref_state_init_rows(s, c, n_ctx, 1, err);
}

npulm_status npu_ref_state_init_rows(struct npu_ref_state *s, const struct npu_config *c, int n_ctx,
                                     int max_rows, npulm_error *err) {
  memset(s, 0, sizeof(*s));
  npulm_status st = npu_config_check_weights(c, err);
  if (st != NPULM_OK) return st;
  s->n_ctx = n_ctx;
  s->max_rows = max_rows;
  size_t rows = (size_t)max_rows;
  size_t q_dim = (size_t)c->n_heads * (size_t)c->head_dim;
  size_t kv_dim = (size_t)c->n_kv_heads * (size_t)c->head_dim;
  size_t wide = q_dim > (size_t)c->dim ? q_dim : (size_t)c->dim;
  size_t cache = (size_t)c->n_layers * (size_t)n_ctx * kv_dim;
  s->x = calloc(rows * (size_t)c->dim, sizeof(float));
  s->xb = calloc(rows * wide, sizeof(float));
  s->xb2 = calloc(rows * (size_t)c->dim, sizeof(float));
  s->hb = calloc(rows * (size_t)c->ffn_dim, sizeof(float));
  s->hb2 = calloc(rows * (size_t)c->ffn_dim, sizeof(float));
  s->q = calloc(rows * q_dim, sizeof(float));
  s->att = calloc((size_t)n_ctx, sizeof(float));
  s->key_cache = calloc(cache, sizeof(float));
  s->value_cache = calloc(cache, sizeof(float));
  if (!s->x || !s->xb || !s->xb2 || !s->hb || !s->hb2 || !s->q || !s->att || !s->key_cache ||
      !s->value_cache) {
    npu_ref_state_free(s);
    return npu_fail(err, NPULM_ERR_NOMEM, "out of memory allocating a %d-token KV cache (%zu MiB)",
                    n_ctx, 2 * cache * sizeof(float) >> 20);
  }
  return NPULM_OK;
}

void npu_ref_state_free(struct npu_ref_state *s) {
  free(s->x);
  free(s->xb);
  free(s->xb2);
  free(s->hb);
  free(s->hb2);
  free(s->q);
  free(s->att);
  free(s->key_cache);
  free(s->value_cache);
  memset(s, 0, sizeof(*s));
}

void npu_ref_rmsnorm(float *out, const float *x, const float *weight, int n, float eps) {
  float ss = 0.0f;
  for (int i = 0; i < n; i++) ss += x[i] * x[i];
  float scale = 1.0f / sqrtf(ss / (float)n + eps);
  for (int i = 0; i < n; i++) out[i] = x[i] * scale * weight[i];
}

float npu_ref_dot(const float *a, const float *b, int n) {
  /* eight independent partial sums: the compiler keeps them in one vector register */
  float acc[8] = {0};
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; j++) acc[j] += a[i + j] * b[i + j];
  }
  float sum = 0.0f;
  for (; i < n; i++) sum += a[i] * b[i];
  sum += ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  return sum;
}

void npu_ref_matvec(float *out, const float *w, const float *bias, const float *x, int n_in,
                    int n_out) {
  for (int o = 0; o < n_out; o++) {
    float sum = npu_ref_dot(w + (size_t)o * (size_t)n_in, x, n_in);
    out[o] = bias != NULL ? sum + bias[o] : sum;
  }
}

void npu_ref_matmul(void *user, float *out, const float *w, const float *bias, const float *x,
                    int n_in, int n_out, int rows) {
  (void)user;
  for (int r = 0; r < rows; r++) {
    npu_ref_matvec(out + (size_t)r * (size_t)n_out, w, bias, x + (size_t)r * (size_t)n_in, n_in,
                   n_out);
  }
}

void npu_ref_softmax(float *x, int n) {
  float max = x[0];
  for (int i = 1; i < n; i++) max = x[i] > max ? x[i] : max;
  float sum = 0.0f;
  for (int i = 0; i < n; i++) {
    x[i] = npu_expf(x[i] - max);
    sum += x[i];
  }
  for (int i = 0; i < n; i++) x[i] /= sum;
}

void npu_ref_rope(float *vec, int n_heads, const struct npu_config *c, const float *freq_factors,
                  int pos) {
  int half = c->rope_dim / 2;
  for (int i = 0; i < half; i++) {
    float freq = powf(c->rope_base, -2.0f * (float)i / (float)c->rope_dim);
    if (freq_factors != NULL) freq /= freq_factors[i];
    float angle = (float)pos * freq;
    float cs = cosf(angle), sn = sinf(angle);
    /* norm rotates adjacent pairs, neox rotates the two halves of the rotated span */
    int a = c->rope_type == NPU_ROPE_NORM ? 2 * i : i;
    int b = c->rope_type == NPU_ROPE_NORM ? 2 * i + 1 : i + half;
    for (int h = 0; h < n_heads; h++) {
      float *v = vec + (size_t)h * (size_t)c->head_dim;
      float v0 = v[a], v1 = v[b];
      v[a] = v0 * cs - v1 * sn;
      v[b] = v0 * sn + v1 * cs;
    }
  }
}

/* Show an activation to the observer, if there is one. */
static void observe(const struct npu_ref_observer *o, int layer, const char *what,
                    const float *values, int n) {
  if (o != NULL) o->fn(o->user, layer, what, values, n);
}

bool npu_ref_per_head(const char *what) {
  return strcmp(what, "kq") == 0 || strcmp(what, "kq_softmax") == 0;
}

void npu_ref_attention(float *out, float *att, const float *q, const float *keys,
                       const float *values, size_t stride, int hd, int len, float scale) {
  float max = -INFINITY, sum = 0.0f, p[NPU_REF_ATTN_TILE];
  for (int j0 = 0; j0 < len; j0 += NPU_REF_ATTN_TILE) {
    const int n = len - j0 < NPU_REF_ATTN_TILE ? len - j0 : NPU_REF_ATTN_TILE;
    /* the tile's scores and their maximum */
    float tile_max = -INFINITY;
    for (int j = 0; j < n; j++) {
      att[j0 + j] = npu_ref_dot(keys + (size_t)(j0 + j) * stride, q, hd) * scale;
      tile_max = att[j0 + j] > tile_max ? att[j0 + j] : tile_max;
    }
    /* the tile on its own: each key's exponential against the tile's maximum, and their sum */
    float tile_sum = 0.0f;
    for (int j = 0; j < n; j++) {
      p[j] = npu_expf(att[j0 + j] - tile_max);
      tile_sum += p[j];
    }
    /* folded into the running result, each side rescaled to the larger maximum; the first tile
     * is the running result */
    const float new_max = tile_max > max ? tile_max : max;
    const float a = npu_expf(max - new_max), b = npu_expf(tile_max - new_max);
    sum = j0 == 0 ? tile_sum : sum * a + tile_sum * b;
    for (int i = 0; i < hd; i++) {
      float u = 0.0f; /* the tile's weighted sum of values, in key order */
      for (int j = 0; j < n; j++) u += p[j] * values[(size_t)(j0 + j) * stride + (size_t)i];
      out[i] = j0 == 0 ? u : out[i] * a + u * b;
    }
    max = new_max;
  }
  /* normalize */
  for (int i = 0; i < hd; i++) out[i] /= sum;
}

/* Multi-head attention of query 'q' (one position's heads) over cache positions 0..pos; result
 * in 'out'. */
static void attention(const struct npu_config *c, struct npu_ref_state *s, int layer, int pos,
                      const float *q, float *out, const struct npu_ref_observer *obs) {
  int hd = c->head_dim, group = c->n_heads / c->n_kv_heads;
  size_t kv_dim = (size_t)c->n_kv_heads * (size_t)hd;
  const float *keys = s->key_cache + (size_t)layer * (size_t)s->n_ctx * kv_dim;
  const float *values = s->value_cache + (size_t)layer * (size_t)s->n_ctx * kv_dim;
  float scale = 1.0f / sqrtf((float)hd);
  for (int h = 0; h < c->n_heads; h++) {
    /* query head h reads KV head h / group */
    size_t kv_off = (size_t)(h / group) * (size_t)hd;
    npu_ref_attention(out + (size_t)h * (size_t)hd, s->att, q + (size_t)h * (size_t)hd,
                      keys + kv_off, values + kv_off, kv_dim, hd, pos + 1, scale);
    /* the scores and, for observers only, their softmax as one row */
    if (obs != NULL && obs->scores) {
      observe(obs, layer, "kq", s->att, pos + 1);
      npu_ref_softmax(s->att, pos + 1);
      observe(obs, layer, "kq_softmax", s->att, pos + 1);
    }
  }
}

/* Show each of 'rows' rows of 'n' values at 'v' to the observer, if there is one. */
static void observe_rows(const struct npu_ref_observer *o, int layer, const char *what,
                         const float *v, int n, int rows) {
  if (o != NULL && o->rows_fn != NULL) {
    o->rows_fn(o->user, layer, what, v, n, rows);
    return;
  }
  for (int r = 0; o != NULL && r < rows; r++) observe(o, layer, what, v + (size_t)r * (size_t)n, n);
}

void npu_ref_block(const struct npu_config *c, const struct npu_layer_weights *lw,
                   const float *rope_freqs, struct npu_ref_state *s, int l, int pos0, int rows,
                   const struct npu_ref_observer *obs) {
  const int dim = c->dim, q_dim = c->n_heads * c->head_dim, kv_dim = c->n_kv_heads * c->head_dim;
  const size_t n = (size_t)rows;
  npu_ref_matmul_fn *matmul = s->matmul != NULL ? s->matmul : npu_ref_matmul;
  void *mu = s->matmul_user;
  size_t cache_row = ((size_t)l * (size_t)s->n_ctx + (size_t)pos0) * (size_t)kv_dim;
  float *k = s->key_cache + cache_row; /* the rows' cache rows, one after another */
  float *v = s->value_cache + cache_row;

  /* attention rmsnorm */
  for (int r = 0; r < rows; r++) {
    npu_ref_rmsnorm(s->xb + (size_t)r * (size_t)dim, s->x + (size_t)r * (size_t)dim, lw->attn_norm,
                    dim, c->rms_eps);
  }
  observe_rows(obs, l, "attn_norm", s->xb, dim, rows);

  /* q, k, v projections; k and v go straight into the positions' cache rows */
  matmul(mu, s->q, lw->wq, lw->bq, s->xb, dim, q_dim, rows);
  matmul(mu, k, lw->wk, lw->bk, s->xb, dim, kv_dim, rows);
  matmul(mu, v, lw->wv, lw->bv, s->xb, dim, kv_dim, rows);
  observe_rows(obs, l, "attn_q", s->q, q_dim, rows);
  observe_rows(obs, l, "attn_k", k, kv_dim, rows);
  observe_rows(obs, l, "attn_v", v, kv_dim, rows);

  /* rotary position embedding of q and k */
  for (int r = 0; r < rows; r++) {
    npu_ref_rope(s->q + (size_t)r * (size_t)q_dim, c->n_heads, c, rope_freqs, pos0 + r);
    npu_ref_rope(k + (size_t)r * (size_t)kv_dim, c->n_kv_heads, c, rope_freqs, pos0 + r);
  }
  observe_rows(obs, l, "q_rope", s->q, q_dim, rows);
  observe_rows(obs, l, "k_rope", k, kv_dim, rows);

  /* attention (each row over the positions up to its own), then output projection */
  if (s->attention != NULL && (obs == NULL || !obs->scores)) {
    const size_t layer_cache = (size_t)l * (size_t)s->n_ctx * (size_t)kv_dim;
    s->attention(mu, s->xb, s->q, s->key_cache + layer_cache, s->value_cache + layer_cache,
                 c->n_heads, c->n_kv_heads, c->head_dim, rows, pos0,
                 1.0f / sqrtf((float)c->head_dim));
  } else {
    for (int r = 0; r < rows; r++) {
      attention(c, s, l, pos0 + r, s->q + (size_t)r * (size_t)q_dim,
                s->xb + (size_t)r * (size_t)q_dim, obs);
    }
  }
  observe_rows(obs, l, "kqv", s->xb, q_dim, rows);
  matmul(mu, s->xb2, lw->wo, NULL, s->xb, q_dim, dim, rows);
  observe_rows(obs, l, "attn_out", s->xb2, dim, rows);

  /* residual */
  for (size_t i = 0; i < n * (size_t)dim; i++) s->x[i] += s->xb2[i];
  observe_rows(obs, l, "attn_residual", s->x, dim, rows);

  /* ffn rmsnorm */
  for (int r = 0; r < rows; r++) {
    npu_ref_rmsnorm(s->xb + (size_t)r * (size_t)dim, s->x + (size_t)r * (size_t)dim, lw->ffn_norm,
                    dim, c->rms_eps);
  }
  observe_rows(obs, l, "ffn_norm", s->xb, dim, rows);

  /* SwiGLU feed-forward: down(silu(gate(x)) * up(x)) */
  const size_t ffn = n * (size_t)c->ffn_dim;
  matmul(mu, s->hb, lw->w_gate, NULL, s->xb, dim, c->ffn_dim, rows);
  matmul(mu, s->hb2, lw->w_up, NULL, s->xb, dim, c->ffn_dim, rows);
  observe_rows(obs, l, "ffn_gate", s->hb, c->ffn_dim, rows);
  observe_rows(obs, l, "ffn_up", s->hb2, c->ffn_dim, rows);
  for (size_t i = 0; i < ffn; i++) s->hb[i] = npu_ref_silu(s->hb[i]);
  observe_rows(obs, l, "ffn_silu", s->hb, c->ffn_dim, rows);
  for (size_t i = 0; i < ffn; i++) s->hb[i] *= s->hb2[i];
  observe_rows(obs, l, "ffn_gate_par", s->hb, c->ffn_dim, rows);
  matmul(mu, s->xb2, lw->w_down, NULL, s->hb, c->ffn_dim, dim, rows);
  observe_rows(obs, l, "ffn_down", s->xb2, dim, rows);

  /* residual */
  for (size_t i = 0; i < n * (size_t)dim; i++) s->x[i] += s->xb2[i];
  observe_rows(obs, l, "ffn_residual", s->x, dim, rows);
}

void npu_ref_forward(const struct npulm_model *m, struct npu_ref_state *s, int32_t token, int pos,
                     float *logits, const struct npu_ref_observer *obs) {
  const struct npu_config *c = &m->cfg;
  const struct npu_weights *w = &m->w;
  int dim = c->dim;

  /* token embedding */
  memcpy(s->x, w->token_embd + (size_t)token * (size_t)dim, (size_t)dim * sizeof(float));
  observe(obs, -1, "embd", s->x, dim);

  for (int l = 0; l < c->n_layers; l++)
    npu_ref_block(c, &w->layers[l], w->rope_freqs, s, l, pos, 1, obs);

  /* final rmsnorm and classifier */
  npu_ref_rmsnorm(s->x, s->x, w->output_norm, dim, c->rms_eps);
  observe(obs, -1, "output_norm", s->x, dim);
  npu_ref_matvec(logits, w->output, NULL, s->x, dim, c->n_vocab);
  observe(obs, -1, "logits", logits, c->n_vocab);
}
