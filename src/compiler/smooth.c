/* SmoothQuant (see smooth.h): the factors of a block's four matmul inputs, from the calibration
 * statistics and the weights, folded into the weights. */
#include "compiler/smooth.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "compiler/quantize.h"

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

/* The calibration statistics of the tensor of 'role' in 'layer' of graph 'g', or NULL. */
static const struct npu_act_stats *stats_of(const struct npu_calib *cal, const struct npu_graph *g,
                                            int32_t layer, enum npu_tensor_role role) {
  int32_t t = npu_ir_find_tensor(g, layer, role);
  return t >= 0 ? npu_calib_find(cal, g->tensors[t].name) : NULL;
}

/* Largest |w[r][c]| over the rows r of matrix 'w' for each input column c, into out[map[c]]
 * (map NULL: out[c]), which is not cleared first. */
static void column_absmax(const struct npu_weight *w, const int32_t *map, float *out) {
  for (int32_t r = 0; r < w->ne1; r++) {
    const float *row = w->data + (size_t)r * (size_t)w->ne0;
    for (int32_t c = 0; c < w->ne0; c++) {
      float *o = &out[map != NULL ? map[c] : c];
      *o = fmaxf(*o, fabsf(row[c]));
    }
  }
}

/* Multiply column c of weight 'wi' by f[c]. */
static bool scale_columns(struct npu_program *p, int32_t wi, const float *f) {
  float *w = own_weight(p, wi);
  if (w == NULL) return false;
  const struct npu_weight *t = &p->weights[wi];
  for (int32_t r = 0; r < t->ne1; r++) {
    for (int32_t c = 0; c < t->ne0; c++) w[(size_t)r * (size_t)t->ne0 + (size_t)c] *= f[c];
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

void npu_smooth_factors(const float *amax, const float *wmax, int32_t n, float alpha, float *s) {
  for (int32_t c = 0; c < n; c++) {
    float a = fmaxf(amax[c], 1e-5f), w = fmaxf(wmax[c], 1e-5f);
    float f = powf(a, alpha) / powf(w, 1.0f - alpha);
    s[c] = fminf(fmaxf(f, 1e-2f), 1e2f);
  }
}

/* The mean square of the part of a channel beyond the clipping threshold 't': its tail beyond
 * its calibrated maximum 'amax' (<= t), which one value in 'rows' (the calibration's) reaches,
 * taken as a power law, P(|x| > u) = (u / amax)^-4 / rows, whose excess E[(|x| - t)^2; |x| > t]
 * is amax^4 / (3 rows t^2). A maximum over a short calibration text bounds other text poorly:
 * the calibrated range holds every calibration value, and this is what other text's values
 * beyond it cost, growing as a channel loses the headroom that a larger channel gave it. */
static double clip_noise(double amax, double t, double rows) {
  if (!(amax > 0) || !(rows > 0)) return 0.0;
  const double r = amax / fmax(t, amax);
  return r * r * r * r * fmax(t, amax) * fmax(t, amax) / (3.0 * rows);
}

double npu_smooth_error(const struct npu_smooth_input *x, const struct npu_smooth_matmul *mm,
                        int n_mm, const float *f, double *scratch) {
  /* the per-tensor int8 steps: the calibrated ranges, shrunk as their largest channel is */
  double amax0 = 0, amax1 = 0, esum = 0, src0 = 0, src1 = 0;
  for (int32_t c = 0; c < x->k; c++) {
    const double fc = f != NULL ? f[c] : 1.0;
    amax0 = fmax(amax0, x->absmax[c]);
    amax1 = fmax(amax1, x->absmax[c] / fc);
    esum += x->meansq[c] / (fc * fc);
    if (x->src_absmax != NULL) {
      src0 = fmax(src0, x->src_absmax[c]);
      src1 = fmax(src1, x->src_absmax[c] / fc);
    }
  }
  const double range = x->range * (amax0 > 0 ? amax1 / amax0 : 1.0), dx = range / x->act_steps;
  const double src_range = src0 > 0 ? x->src_range * src1 / src0 : 0.0;
  const double ds = src_range / x->act_steps;
  /* the noise power each channel of x' carries: rounding, clipping, and the source's */
  double *v = scratch;
  for (int32_t c = 0; c < x->k; c++) {
    const double fc = f != NULL ? f[c] : 1.0;
    v[c] = dx * dx / 12.0 + clip_noise(x->absmax[c] / fc, range / 2.0, x->rows);
    if (src_range > 0) {
      v[c] += (ds * ds / 12.0 + clip_noise(x->src_absmax[c] / fc, src_range / 2.0, x->rows)) *
              x->src_gain[c];
    }
  }
  double total = 0;
  for (int i = 0; i < n_mm; i++) {
    const struct npu_smooth_matmul *w = &mm[i];
    const int32_t stride = (w->n + NPU_SMOOTH_MODEL_ROWS - 1) / NPU_SMOOTH_MODEL_ROWS;
    double noise = 0, power = 0;
    for (int32_t r = 0; r < w->n; r += stride) {
      const float *row = w->w + (size_t)r * (size_t)x->k;
      double rowmax = 0, act = 0;
      for (int32_t c = 0; c < x->k; c++) {
        const double wc = row[c], vc = wc * (f != NULL ? f[c] : 1.0);
        rowmax = fmax(rowmax, fabs(vc));
        act += vc * vc * v[c];
        power += wc * wc * x->meansq[c];
      }
      const double dw = rowmax / x->w_levels;
      noise += act + dw * dw / 12.0 * esum;
    }
    if (power > 0) total += noise / power;
  }
  return total;
}

static int cmp_float(const void *a, const void *b) {
  const float x = *(const float *)a, y = *(const float *)b;
  return x < y ? -1 : x > y;
}

npulm_status npu_smooth_choose(const struct npu_smooth_input *x, const struct npu_smooth_matmul *mm,
                               int n_mm, int32_t n_factors, const int32_t *map, float alpha,
                               float *s_out, float *alpha_out, double *err_out, npulm_error *err) {
  float *amax = malloc((size_t)n_factors * sizeof(float));
  float *wmax = malloc((size_t)n_factors * sizeof(float));
  float *s = malloc((size_t)n_factors * sizeof(float));
  float *f = malloc((size_t)x->k * sizeof(float));
  float *floored = malloc((size_t)x->k * sizeof(float));
  double *v = malloc((size_t)x->k * sizeof(double));
  npulm_status st = NPULM_OK;
  if (amax == NULL || wmax == NULL || s == NULL || f == NULL || floored == NULL || v == NULL) {
    st = npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
    goto done;
  }
  for (int32_t j = 0; j < n_factors; j++) amax[j] = wmax[j] = 0.0f;
  for (int32_t c = 0; c < x->k; c++) {
    float *a = &amax[map != NULL ? map[c] : c];
    *a = fmaxf(*a, x->absmax[c]);
  }
  for (int i = 0; i < n_mm; i++) {
    const struct npu_weight w = {.data = mm[i].w, .ne0 = mm[i].k, .ne1 = mm[i].n};
    column_absmax(&w, map, wmax);
  }
  if (alpha >= 0.0f) { /* forced */
    npu_smooth_factors(amax, wmax, n_factors, alpha, s_out);
    *alpha_out = alpha;
    if (err_out != NULL) {
      for (int32_t c = 0; c < x->k; c++) f[c] = s_out[map != NULL ? map[c] : c];
      *err_out = npu_smooth_error(x, mm, n_mm, f, v);
    }
    goto done;
  }
  /* A channel's calibrated maximum is a maximum over a short text: a channel quiet there may
   * reach as far as a typical one on another. So no channel counts as smaller than the median
   * channel, neither for its factor (which would magnify it) nor for the range it needs. */
  memcpy(s, amax, (size_t)n_factors * sizeof(float));
  qsort(s, (size_t)n_factors, sizeof(float), cmp_float);
  const float median = s[n_factors / 2];
  for (int32_t j = 0; j < n_factors; j++) amax[j] = fmaxf(amax[j], median);
  for (int32_t c = 0; c < x->k; c++) floored[c] = fmaxf(x->absmax[c], median);
  struct npu_smooth_input xf = *x;
  xf.absmax = floored;
  x = &xf;
  /* no smoothing first: an alpha must predict strictly less error to be taken */
  double best = npu_smooth_error(x, mm, n_mm, NULL, v);
  *alpha_out = NPU_SMOOTH_NONE;
  for (int32_t j = 0; j < n_factors; j++) s_out[j] = 1.0f;
  for (int step = 0; step < NPU_SMOOTH_CANDIDATES; step++) {
    const float a = npu_smooth_candidate(step);
    npu_smooth_factors(amax, wmax, n_factors, a, s);
    for (int32_t c = 0; c < x->k; c++) f[c] = s[map != NULL ? map[c] : c];
    const double e = npu_smooth_error(x, mm, n_mm, f, v);
    if (e < best) {
      best = e;
      *alpha_out = a;
      memcpy(s_out, s, (size_t)n_factors * sizeof(float));
    }
  }
  if (err_out != NULL) *err_out = best;
done:
  free(amax);
  free(wmax);
  free(s);
  free(f);
  free(floored);
  free(v);
  return st;
}

/* One group of a block: the activation that its matmuls read, and what takes 1/s. */
struct group {
  enum npu_tensor_role input;   /* the activation */
  enum npu_tensor_role mm[3];   /* the matmuls reading it (NPU_ROLE_NONE: fewer) */
  enum npu_tensor_role fold[2]; /* the weights whose rows (or elements) take 1/s: (role, slot) */
  int fold_slot[2];
};

static const struct group groups[NPU_SMOOTH_GROUPS] = {
    /* inputs of q, k, v: fold 1/s into attn_norm */
    [NPU_SMOOTH_QKV] = {NPU_ROLE_ATTN_NORM,
                        {NPU_ROLE_Q, NPU_ROLE_K, NPU_ROLE_V},
                        {NPU_ROLE_ATTN_NORM, NPU_ROLE_NONE},
                        {1, 0}},
    /* inputs of gate, up: fold 1/s into ffn_norm */
    [NPU_SMOOTH_GATE_UP] = {NPU_ROLE_FFN_NORM,
                            {NPU_ROLE_FFN_GATE, NPU_ROLE_FFN_UP, NPU_ROLE_NONE},
                            {NPU_ROLE_FFN_NORM, NPU_ROLE_NONE},
                            {1, 0}},
    /* input of down (silu(gate) * up): fold 1/s into up's rows */
    [NPU_SMOOTH_DOWN] = {NPU_ROLE_FFN_GATE_PAR,
                         {NPU_ROLE_FFN_DOWN, NPU_ROLE_NONE, NPU_ROLE_NONE},
                         {NPU_ROLE_FFN_UP, NPU_ROLE_NONE},
                         {1, 0}},
    /* input of the output projection (attention result): one factor per KV channel, shared by
     * the heads that read it; fold 1/s into V's rows and bias */
    [NPU_SMOOTH_OUT] = {NPU_ROLE_KQV,
                        {NPU_ROLE_ATTN_OUT, NPU_ROLE_NONE, NPU_ROLE_NONE},
                        {NPU_ROLE_V, NPU_ROLE_V},
                        {1, 2}},
};

npulm_status npu_smooth_layer(const struct npulm_model *m, struct npu_program *p,
                              const struct npu_calib *cal, float alpha, int32_t l,
                              npulm_error *err) {
  const struct npu_config *c = &m->cfg;
  const struct npu_graph *g = &p->graphs[0];
  const int32_t q_dim = c->n_heads * c->head_dim, kv_dim = c->n_kv_heads * c->head_dim;
  const int32_t group = c->n_heads / c->n_kv_heads;
  const enum npu_quant_mode mode = (enum npu_quant_mode)p->quant_mode;
  const double act_steps = npu_quant_act_bits(mode) == 16 ? 65535.0 : 255.0;
  const double w_levels = npu_quant_weight_bits(mode) == 4 ? 7.0 : 127.0;
  int32_t widest = c->ffn_dim > c->dim ? c->ffn_dim : c->dim;
  if (q_dim > widest) widest = q_dim;
  float *s = malloc((size_t)widest * sizeof(float)), *f = malloc((size_t)widest * sizeof(float));
  double *meansq = malloc((size_t)widest * sizeof(double)),
         *gain = malloc((size_t)widest * sizeof(double)),
         *src_meansq = malloc((size_t)widest * sizeof(double));
  int32_t *kv_of = malloc((size_t)q_dim * sizeof(int32_t));
  npulm_status st = NPULM_OK;
  if (p->smooth_alphas == NULL) {
    p->smooth_alphas = calloc((size_t)c->n_layers * NPU_SMOOTH_GROUPS, sizeof(float));
  }
  if (p->smooth_factors == NULL) {
    p->smooth_factors = calloc((size_t)c->n_layers * NPU_SMOOTH_GROUPS, sizeof(float *));
    if (p->smooth_factors != NULL) p->n_smooth_factors = c->n_layers * NPU_SMOOTH_GROUPS;
  }
  if (s == NULL || f == NULL || meansq == NULL || gain == NULL || src_meansq == NULL ||
      kv_of == NULL || p->smooth_alphas == NULL || p->smooth_factors == NULL) {
    st = npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
    goto done;
  }
  for (int32_t i = 0; i < q_dim; i++) {
    kv_of[i] = (i / c->head_dim / group) * c->head_dim + i % c->head_dim;
  }
  for (int gi = 0; gi < NPU_SMOOTH_GROUPS && st == NPULM_OK; gi++) {
    const struct group *gr = &groups[gi];
    const struct npu_act_stats *a = stats_of(cal, g, l, gr->input);
    struct npu_smooth_matmul mm[3];
    int32_t wi[3];
    int n_mm = 0;
    for (int k = 0; k < 3 && gr->mm[k] != NPU_ROLE_NONE; k++) {
      wi[n_mm] = npu_ir_weight_of(g, l, gr->mm[k], 1);
      if (wi[n_mm] < 0) goto missing;
      const struct npu_weight *w = &p->weights[wi[n_mm]];
      mm[n_mm++] = (struct npu_smooth_matmul){w->data, w->ne1, w->ne0};
    }
    if (a == NULL || a->n_channels != mm[0].k) goto missing;
    const double rows = (double)(a->count / (uint64_t)a->n_channels);
    for (int32_t i = 0; i < a->n_channels; i++) {
      meansq[i] = rows > 0 ? a->chan_sumsq[i] / rows : 0.0;
    }
    struct npu_smooth_input x = {.k = a->n_channels,
                                 .absmax = a->chan_absmax,
                                 .meansq = meansq,
                                 .range = a->max - a->min,
                                 .rows = rows,
                                 .act_steps = act_steps,
                                 .w_levels = w_levels};
    if (gi == NPU_SMOOTH_DOWN) { /* up's output takes the fold, silu(gate) multiplies it */
      const struct npu_act_stats *up = stats_of(cal, g, l, NPU_ROLE_FFN_UP);
      const struct npu_act_stats *silu = stats_of(cal, g, l, NPU_ROLE_FFN_SILU);
      if (up == NULL || silu == NULL || up->n_channels != a->n_channels ||
          silu->n_channels != a->n_channels) {
        goto missing;
      }
      const double srows = (double)(silu->count / (uint64_t)silu->n_channels);
      for (int32_t i = 0; i < a->n_channels; i++) {
        gain[i] = srows > 0 ? silu->chan_sumsq[i] / srows : 0.0;
      }
      x.src_absmax = up->chan_absmax;
      x.src_range = up->max - up->min;
      x.src_gain = gain;
      const double urows = (double)(up->count / (uint64_t)up->n_channels);
      for (int32_t i = 0; i < a->n_channels; i++) {
        src_meansq[i] = urows > 0 ? up->chan_sumsq[i] / urows : 0.0;
      }
      x.src_meansq = src_meansq;
    }
    const bool per_kv = gi == NPU_SMOOTH_OUT;
    const int32_t n_factors = per_kv ? kv_dim : a->n_channels;
    float chosen;
    st = npu_smooth_choose(&x, mm, n_mm, n_factors, per_kv ? kv_of : NULL, alpha, s, &chosen, NULL,
                           err);
    if (st != NPULM_OK) break;
    p->smooth_alphas[(size_t)l * NPU_SMOOTH_GROUPS + (size_t)gi] = chosen;
    if (chosen == NPU_SMOOTH_NONE) continue;
    float **kept = &p->smooth_factors[(size_t)l * NPU_SMOOTH_GROUPS + (size_t)gi];
    free(*kept);
    *kept = malloc((size_t)n_factors * sizeof(float));
    if (*kept == NULL) goto nomem;
    memcpy(*kept, s, (size_t)n_factors * sizeof(float));
    for (int32_t i = 0; i < a->n_channels; i++) f[i] = s[per_kv ? kv_of[i] : i];
    for (int k = 0; k < 2 && gr->fold[k] != NPU_ROLE_NONE; k++) {
      const int32_t fw = npu_ir_weight_of(g, l, gr->fold[k], gr->fold_slot[k]);
      if (fw < 0 && gr->fold_slot[k] == 2) continue; /* no bias */
      if (fw < 0) goto missing;
      if (!divide_rows(p, fw, s)) goto nomem;
    }
    for (int k = 0; k < n_mm; k++) {
      if (!scale_columns(p, wi[k], f)) goto nomem;
    }
  }
  goto done;
missing:
  st = npu_fail(err, NPULM_ERR_ARG, "SmoothQuant: a weight or calibration statistic is missing");
  goto done;
nomem:
  st = npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
done:
  free(s);
  free(f);
  free(meansq);
  free(gain);
  free(src_meansq);
  free(kv_of);
  return st;
}
