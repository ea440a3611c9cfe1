/* Building the sparse decode data of a program (see sparsify.h). */
#include "compiler/sparsify.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "base/pages.h"
#include "compiler/quantize.h"
#include "ir/ir.h"
#include "program/qparams.h"
#include "ref/forward.h"

/* 'size' bytes, 64-byte aligned (the kernels' streams start on a cache line); free() frees. */
static void *alloc64(size_t size) { return aligned_alloc(64, (size + 63) / 64 * 64); }

/* The bounds of |SiLU(g)| >= tau on g: g >= *hi, or *lo_a <= g <= *lo_b (the negative lobe, empty
 * when tau is above SiLU's minimum magnitude, 0.2785 at g = -1.2785). Bisection: SiLU is
 * increasing above -1.2785 and decreasing below. */
static void silu_bounds(double tau, double *hi, double *lo_a, double *lo_b) {
  const double g_min = -1.2784645427610738;
  double a = g_min, b = 64.0;
  for (int i = 0; i < 200; i++) { /* silu(g) = tau on [g_min, inf) */
    const double m = 0.5 * (a + b);
    if (npu_ref_silu((float)m) >= tau) b = m;
    else a = m;
  }
  *hi = b;
  if (tau <= 0.0) {
    *lo_a = -INFINITY;
    *lo_b = *hi;
    return;
  }
  if (-npu_ref_silu((float)g_min) < tau) {
    *lo_a = 1.0; /* empty */
    *lo_b = 0.0;
    return;
  }
  double c = -64.0, d = g_min; /* |silu| rising towards g_min from below */
  for (int i = 0; i < 200; i++) {
    const double m = 0.5 * (c + d);
    if (-npu_ref_silu((float)m) >= tau) d = m;
    else c = m;
  }
  *lo_a = d;
  c = g_min, d = 0.0; /* |silu| falling from g_min to 0 */
  for (int i = 0; i < 200; i++) {
    const double m = 0.5 * (c + d);
    if (-npu_ref_silu((float)m) >= tau) c = m;
    else d = m;
  }
  *lo_b = c;
}

static int cmp_desc_float(const void *a, const void *b) {
  const float x = *(const float *)a, y = *(const float *)b;
  return (x < y) - (x > y);
}

/* A calibration value: its predicted |SiLU| and its |SiLU| if the thresholds keep it, else 0. */
struct pred_mass {
  float pred, mass;
};

static int cmp_desc_pred(const void *a, const void *b) {
  const float x = ((const struct pred_mass *)a)->pred, y = ((const struct pred_mass *)b)->pred;
  return (x < y) - (x > y);
}

/* A float to int32, saturated. */
static int32_t sat_i32(double v) {
  if (!(v > -2147483648.0)) return INT32_MIN;
  if (!(v < 2147483647.0)) return INT32_MAX;
  return (int32_t)v;
}

/* Orthonormalize the r columns of z [n, r] (row-major) in place by modified Gram-Schmidt; a
 * column that vanishes is left zero. */
static void orthonormalize(double *z, size_t n, size_t r) {
  for (size_t c = 0; c < r; c++) {
    for (size_t q = 0; q < c; q++) {
      double dot = 0.0;
      for (size_t i = 0; i < n; i++) dot += z[i * r + c] * z[i * r + q];
      for (size_t i = 0; i < n; i++) z[i * r + c] -= dot * z[i * r + q];
    }
    double norm = 0.0;
    for (size_t i = 0; i < n; i++) norm += z[i * r + c] * z[i * r + c];
    norm = sqrt(norm);
    for (size_t i = 0; i < n; i++) z[i * r + c] = norm > 1e-30 ? z[i * r + c] / norm : 0.0;
  }
}

/* splitmix64: a reproducible Gaussian-ish sketch (sum of uniforms) for the range finder. */
static double sketch_value(uint64_t *state) {
  double s = 0.0;
  for (int i = 0; i < 4; i++) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    s += (double)(z >> 11) * 0x1.0p-53 - 0.5;
  }
  return s;
}

/* What one layer's build works on. */
struct layer_build {
  const struct npu_sparse_sites *sites;
  const struct npu_ukernels *uk;
  size_t dim, n_ff, rank, kp, n;
  const int8_t *x;    /* [n, dim] calibration inputs */
  int32_t zx;         /* their zero point */
  double *step;       /* (n_ff) M_j */
  float *v;           /* [n, n_ff] exact gate values, in gate steps */
  int16_t *p;         /* [n, n_ff] the predictor's outputs */
  float *silu_abs;    /* [n, n_ff] |SiLU| of the exact values (real units) */
  int32_t *gate_bias; /* (n_ff) the gate's bias as the dense GEMM adds it */
};

/* The bundles of one layer, neuron j in place j (place_by_heat moves them once calibration has
 * counted them), and each neuron's gate and up bias. */
static bool make_bundles(const struct layer_build *b, struct npu_sparse_layer *ly) {
  const size_t dim = b->dim, n_ff = b->n_ff, kp = b->kp;
  const size_t bytes = n_ff * 3 * kp;
  int8_t *down_row = malloc(n_ff);
  ly->bundles = alloc64(bytes);
  ly->bias = malloc(2 * n_ff * sizeof(int32_t));
  ly->place = malloc(n_ff * sizeof(int32_t));
  if (down_row == NULL || ly->bundles == NULL || ly->bias == NULL || ly->place == NULL) {
    free(down_row);
    return false;
  }
  memset(ly->bundles, 0, bytes);
  const struct npu_qsite *gate = b->sites->gate, *up = b->sites->up, *down = b->sites->down;
  for (size_t j = 0; j < n_ff; j++) {
    ly->place[j] = (int32_t)j;
    int8_t *gj = ly->bundles + npu_sparse_gate_at(kp, (int32_t)j);
    int8_t *uj = ly->bundles + npu_sparse_pair_at(kp, (int32_t)n_ff, (int32_t)j);
    npu_qs8_gemm_unpack_row(dim, gate->packed, j, 0, dim, gj);
    npu_qs8_gemm_unpack_row(dim, up->packed, j, 0, dim, uj);
    b->gate_bias[j] = npu_qs8_gemm_bias(dim, gate->packed, j);
    /* the input's zero point folded in: bias - zx sum w, within int32 (|bias| <= 2^30, |zx sum
     * w| <= 128 * 32768 * 127) */
    int64_t sum_gate = 0, sum_up = 0;
    for (size_t c = 0; c < dim; c++) sum_gate += gj[c], sum_up += uj[c];
    ly->bias[2 * j] = (int32_t)(b->gate_bias[j] - (int64_t)b->zx * sum_gate);
    ly->bias[2 * j + 1] =
        (int32_t)(npu_qs8_gemm_bias(dim, up->packed, j) - (int64_t)b->zx * sum_up);
  }
  for (size_t c = 0; c < dim; c++) {
    npu_qs8_gemm_unpack_row(n_ff, down->packed, c, 0, n_ff, down_row);
    for (size_t j = 0; j < n_ff; j++)
      ly->bundles[npu_sparse_pair_at(kp, (int32_t)n_ff, (int32_t)j) + kp + c] = down_row[j];
  }
  free(down_row);
  return true;
}

/* The bundles moved from index order to the places of the kept counts (npu_sparse_places). */
static bool place_by_heat(const struct layer_build *b, struct npu_sparse_layer *ly) {
  const size_t n_ff = b->n_ff, kp = b->kp;
  int8_t *moved = alloc64(n_ff * 3 * kp);
  if (moved == NULL || !npu_sparse_places(ly->freq, (int32_t)n_ff, ly->place)) {
    free(moved);
    return false;
  }
  for (size_t j = 0; j < n_ff; j++) {
    const int32_t at = ly->place[j], n = (int32_t)n_ff;
    memcpy(moved + npu_sparse_gate_at(kp, at), ly->bundles + npu_sparse_gate_at(kp, (int32_t)j),
           kp);
    memcpy(moved + npu_sparse_pair_at(kp, n, at),
           ly->bundles + npu_sparse_pair_at(kp, n, (int32_t)j), 2 * kp);
  }
  free(ly->bundles);
  ly->bundles = moved;
  return true;
}

/* The exact gate values of the calibration inputs, from the bundles' gate rows. */
static bool exact_values(struct layer_build *b, const struct npu_sparse_layer *ly) {
  const size_t n_ff = b->n_ff;
  const int8_t **rows = malloc(n_ff * sizeof(*rows));
  int32_t *acc = malloc(n_ff * sizeof(int32_t));
  if (rows == NULL || acc == NULL) {
    free(rows);
    free(acc);
    return false;
  }
  for (size_t j = 0; j < n_ff; j++) rows[j] = ly->bundles + npu_sparse_gate_at(b->kp, (int32_t)j);
  for (size_t t = 0; t < b->n; t++) {
    b->uk->qs8_rows_dot(b->dim, b->x + t * b->dim, 0, n_ff, rows, acc); /* zx in the bias */
    for (size_t j = 0; j < n_ff; j++) {
      const double v = (double)(acc[j] + ly->bias[2 * j]) * b->step[j];
      b->v[t * n_ff + j] = (float)v;
      b->silu_abs[t * n_ff + j] = fabsf(npu_ref_silu((float)v * b->sites->gate_scale));
    }
  }
  free(rows);
  free(acc);
  return true;
}

/* With V' [n, n_ff] the calibration gate values less their bias terms (the linear part the
 * predictor fits): out = V' in ([n_ff, r] in, [n, r] out) with 'forward', else out = V'^T in
 * ([n, r] in, [n_ff, r] out). 'out' is overwritten. */
static void linear_product(const struct layer_build *b, const double *in, double *out,
                           bool forward) {
  const size_t n_ff = b->n_ff, r = b->rank, n = b->n;
  memset(out, 0, (forward ? n : n_ff) * r * sizeof(double));
  for (size_t j = 0; j < n_ff; j++) {
    const double bias = (double)b->gate_bias[j] * b->step[j];
    for (size_t t = 0; t < n; t++) {
      const double v = (double)b->v[t * n_ff + j] - bias;
      const double *src = forward ? in + j * r : in + t * r;
      double *dst = forward ? out + t * r : out + j * r;
      for (size_t c = 0; c < r; c++) dst[c] += v * src[c];
    }
  }
}

/* The predictor: Q [n_ff, rank] orthonormal, spanning the gate values' range over the
 * calibration inputs (one power iteration of a random sketch); B = Q^T diag(M) W_gate [rank,
 * dim]; p = Q (B (x - zx)) + bias, quantized. */
static bool make_predictor(struct layer_build *b, struct npu_sparse_layer *ly) {
  const size_t n_ff = b->n_ff, r = b->rank, n = b->n, dim = b->dim, kp = b->kp;
  double *z = calloc(n_ff * r, sizeof(double)), *y = calloc(n * r, sizeof(double));
  float *bm = calloc(r * dim, sizeof(float));
  float *bq_scale = malloc(r * sizeof(float)), *aq_scale = malloc(n_ff * sizeof(float));
  int8_t *bq = malloc(r * dim), *aq = malloc(n_ff * r), *h = malloc(n * r);
  int32_t *abias = malloc(n_ff * sizeof(int32_t));
  bool ok = z != NULL && y != NULL && bm != NULL && bq_scale != NULL && aq_scale != NULL &&
            bq != NULL && aq != NULL && h != NULL && abias != NULL;
  ly->mult = malloc((r + n_ff) * sizeof(int32_t));
  ly->shift = malloc((r + n_ff) * sizeof(int32_t));
  ly->pred_b = alloc64(npu_qs8_gemm_packed_size(r, dim));
  ly->pred_a = alloc64(npu_qs8_gemm_packed_size(n_ff, r));
  ok = ok && ly->mult != NULL && ly->shift != NULL && ly->pred_b != NULL && ly->pred_a != NULL;
  if (ok) {
    /* V' = V - bias term: the linear part; Z = V'^T Omega, then Z = V'^T (V' Z) */
    uint64_t rng = 0x5eed5eedu + n_ff;
    double *omega = y; /* [n, r] */
    for (size_t i = 0; i < n * r; i++) omega[i] = sketch_value(&rng);
    linear_product(b, omega, z, false);
    orthonormalize(z, n_ff, r);
    linear_product(b, z, y, true);  /* y = V' Z: [n, r] */
    linear_product(b, y, z, false); /* z = V'^T y */
    orthonormalize(z, n_ff, r);
    /* B = Z^T diag(M) W: row c = sum_j z[j, c] M_j w_j */
    for (size_t j = 0; j < n_ff; j++) {
      const int8_t *w = ly->bundles + npu_sparse_gate_at(kp, (int32_t)j);
      for (size_t c = 0; c < r; c++) {
        const float f = (float)(z[j * r + c] * b->step[j]);
        if (f == 0.0f) continue;
        for (size_t k = 0; k < dim; k++) bm[c * dim + k] += f * w[k];
      }
    }
    for (size_t c = 0; ok && c < r; c++) {
      ok = npu_quantize_weights_per_channel(bm + c * dim, 1, dim, bq + c * dim, &bq_scale[c]);
    }
  }
  /* h = B (x - zx) in real units (gate steps): its int8 scale from the calibration inputs */
  float h_scale = 0.0f;
  if (ok) {
    double hmax = 0.0;
    for (size_t t = 0; t < n; t++) {
      const int8_t *xt = b->x + t * dim;
      for (size_t c = 0; c < r; c++) {
        int32_t acc = 0;
        for (size_t k = 0; k < dim; k++) acc += (xt[k] - b->zx) * bq[c * dim + k];
        const double hv = fabs((double)acc * bq_scale[c]);
        if (hv > hmax) hmax = hv;
      }
    }
    h_scale = hmax > 0.0 ? (float)(hmax / 127.0) : 1.0f;
    ok = npu_quantize_multipliers(1.0f, bq_scale, r, h_scale, ly->mult, ly->shift) &&
         npu_qs8_gemm_pack(r, dim, bq, NULL, ly->pred_b);
  }
  /* A = Z, per row; output int16 in 1/256 gate steps; the bias term folded in */
  if (ok) {
    float *row = malloc(r * sizeof(float));
    ok = row != NULL;
    for (size_t j = 0; ok && j < n_ff; j++) {
      for (size_t c = 0; c < r; c++) row[c] = (float)z[j * r + c];
      ok = npu_quantize_weights_per_channel(row, 1, r, aq + j * r, &aq_scale[j]);
      const double unit = (double)h_scale * aq_scale[j];
      const double bias = (double)b->gate_bias[j] * b->step[j];
      abias[j] = unit > 0.0 ? sat_i32(nearbyint(bias / unit)) : 0;
      if (abias[j] > (1 << 30) || abias[j] < -(1 << 30)) ok = false;
    }
    free(row);
    ok = ok &&
         npu_quantize_multipliers(h_scale, aq_scale, n_ff, 1.0f / 256.0f, ly->mult + r,
                                  ly->shift + r) &&
         npu_qs8_gemm_pack(n_ff, r, aq, abias, ly->pred_a);
  }
  /* the predictor's outputs on the calibration inputs, by the kernels that will compute them */
  if (ok) {
    const struct npu_qs8_gemm_params pb = {ly->mult, ly->shift, b->zx, 0};
    const struct npu_qs8_gemm_params pa = {ly->mult + r, ly->shift + r, 0, 0};
    b->uk->qs8_gemm(n, 0, r, dim, b->x, dim, ly->pred_b, h, r, &pb);
    b->uk->qs8_gemm_qs16(n, 0, n_ff, r, h, r, ly->pred_a, b->p, n_ff, &pa);
  }
  free(z);
  free(y);
  free(bm);
  free(bq_scale);
  free(aq_scale);
  free(bq);
  free(aq);
  free(h);
  free(abias);
  return ok;
}

/* The thresholds: tau, the |SiLU| that 'level' of the calibration values fall below; the
 * candidate bound, the largest predicted |SiLU| whose candidates cover 'recall' of the kept
 * mass. */
static bool make_thresholds(const struct layer_build *b, struct npu_sparse_layer *ly, float level,
                            double recall) {
  const size_t total = b->n * b->n_ff;
  float *sorted = malloc(total * sizeof(float));
  struct pred_mass *pairs = malloc(total * sizeof(*pairs));
  ly->freq = calloc(b->n_ff, sizeof(uint32_t));
  if (sorted == NULL || pairs == NULL || ly->freq == NULL) {
    free(sorted);
    free(pairs);
    return false;
  }
  memcpy(sorted, b->silu_abs, total * sizeof(float));
  qsort(sorted, total, sizeof(float), cmp_desc_float);
  const size_t n_keep = (size_t)ceil((1.0 - (double)level) * (double)total);
  const double tau = level <= 0.0f || n_keep == 0 ? 0.0 : (double)sorted[n_keep - 1];
  double hi, lo_a, lo_b;
  silu_bounds(tau, &hi, &lo_a, &lo_b);
  const double s = b->sites->gate_scale;
  ly->hi = (float)(hi / s);
  ly->lo_a = isfinite(lo_a) ? (float)(lo_a / s) : -INFINITY;
  ly->lo_b = (float)(lo_b / s);
  /* kept set and its mass; each sample's predicted |SiLU| */
  double kept_mass = 0.0;
  size_t kept = 0;
  for (size_t i = 0; i < total; i++) {
    const float v = b->v[i];
    const bool keep = v >= ly->hi || (v >= ly->lo_a && v <= ly->lo_b);
    const float pv = (float)b->p[i] / 256.0f;
    pairs[i].pred = fabsf(npu_ref_silu(pv * (float)s));
    pairs[i].mass = keep ? b->silu_abs[i] : 0.0f;
    kept_mass += pairs[i].mass;
    kept += keep;
    if (keep) ly->freq[i % b->n_ff]++;
  }
  qsort(pairs, total, sizeof(*pairs), cmp_desc_pred);
  double covered = 0.0, tau_c = 0.0;
  for (size_t i = 0; i < total && level > 0.0f; i++) {
    covered += pairs[i].mass;
    if (covered >= recall * kept_mass) {
      tau_c = pairs[i].pred;
      break;
    }
  }
  /* bounds in the predictor's units: 1/256 gate steps, saturated to int16 */
  double c_hi, c_lo_a, c_lo_b;
  silu_bounds(tau_c, &c_hi, &c_lo_a, &c_lo_b);
  const double u = 256.0 / s;
  ly->cand_hi = sat_i32(ceil(c_hi * u));
  ly->cand_lo_a = isfinite(c_lo_a) ? sat_i32(ceil(c_lo_a * u)) : INT32_MIN;
  ly->cand_lo_b = sat_i32(floor(c_lo_b * u));
  if (level <= 0.0f) ly->cand_hi = INT32_MIN; /* dense: every neuron is a candidate */
  /* the figures, counted by the integer bounds as the runtime applies them */
  size_t cand = 0;
  double cand_mass = 0.0;
  for (size_t i = 0; i < total; i++) {
    const int32_t p = b->p[i];
    if (p >= ly->cand_hi || (p >= ly->cand_lo_a && p <= ly->cand_lo_b)) {
      cand++;
      const float v = b->v[i];
      if (v >= ly->hi || (v >= ly->lo_a && v <= ly->lo_b)) cand_mass += b->silu_abs[i];
    }
  }
  ly->keep = (float)((double)kept / (double)total);
  ly->cand = (float)((double)cand / (double)total);
  ly->recall = kept_mass > 0.0 ? (float)(cand_mass / kept_mass) : 1.0f;
  free(sorted);
  free(pairs);
  return true;
}

/* A predictor pays if a decode step reads fewer bytes of it than of the gate rows it spares
 * (its candidates' share on the calibration text, cand): its MACs compare the same way, an int8
 * weight each. Where it does not (at low sparsity the candidates must cover nearly every
 * neuron to reach the recall) the layer has none: rank 0, every neuron a candidate. */
static void drop_unpaid_predictor(struct npu_sparse *sp, int32_t l) {
  struct npu_sparse_layer *ly = &sp->layers[l];
  const double spared = (1.0 - (double)ly->cand) * (double)ly->n_ff * (double)sp->kp;
  if ((double)npu_sparse_predictor_bytes(sp, l) < spared) return;
  free(ly->pred_b);
  free(ly->pred_a);
  free(ly->mult);
  free(ly->shift);
  ly->pred_b = ly->pred_a = NULL;
  ly->mult = ly->shift = NULL;
  ly->rank = 0;
  ly->cand_hi = INT32_MIN;
  ly->cand = ly->recall = 1.0f;
}

npulm_status npu_sparse_build(struct npu_program *p, const struct npu_config *cfg,
                              const int8_t *const *x, int32_t n, float level, int32_t rank,
                              double recall, npulm_error *err) {
  if (!(level >= 0.0f && level < 1.0f)) {
    return npu_fail(err, NPULM_ERR_ARG, "sparsity %g is not in [0, 1)", (double)level);
  }
  if (recall == 0.0) recall = NPU_SPARSE_RECALL;
  if (!(recall > 0.0 && recall <= 1.0)) {
    return npu_fail(err, NPULM_ERR_ARG, "the predictor's recall %g is not in (0, 1]", recall);
  }
  if (n < 1) return npu_fail(err, NPULM_ERR_ARG, "sparse decode needs calibration inputs");
  const size_t dim = (size_t)cfg->dim, n_ff = (size_t)cfg->ffn_dim;
  const bool rank_asked = rank > 0; /* then every layer has its predictor */
  if (rank <= 0) rank = ((cfg->dim / 8 + 15) / 16) * 16;
  if ((size_t)rank > n_ff) rank = (int32_t)n_ff;
  if ((size_t)rank > (size_t)n) rank = n;
  struct npu_sparse *sp = calloc(1, sizeof(*sp));
  if (sp == NULL) return npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
  sp->level = level;
  sp->n_layers = cfg->n_layers;
  sp->dim = cfg->dim;
  sp->kp = (int32_t)npu_bundle_kp(dim);
  sp->layers = calloc((size_t)cfg->n_layers, sizeof(*sp->layers));
  const size_t total = (size_t)n * n_ff;
  struct layer_build b = {.uk = &p->uk,
                          .dim = dim,
                          .n_ff = n_ff,
                          .rank = (size_t)rank,
                          .kp = (size_t)sp->kp,
                          .n = (size_t)n,
                          .step = malloc(n_ff * sizeof(double)),
                          .v = malloc(total * sizeof(float)),
                          .p = malloc(total * sizeof(int16_t)),
                          .silu_abs = malloc(total * sizeof(float)),
                          .gate_bias = malloc(n_ff * sizeof(int32_t))};
  npulm_status st = NPULM_OK;
  if (sp->layers == NULL || b.step == NULL || b.v == NULL || b.p == NULL || b.silu_abs == NULL ||
      b.gate_bias == NULL) {
    st = npu_fail(err, NPULM_ERR_NOMEM, "out of memory building the sparse decode data");
  }
  for (int32_t l = 0; st == NPULM_OK && l < cfg->n_layers; l++) {
    struct npu_sparse_sites sites;
    if ((st = npu_sparse_sites_of(p, l, &sites, err)) != NPULM_OK) break;
    struct npu_sparse_layer *ly = &sp->layers[l];
    ly->n_ff = (int32_t)n_ff;
    ly->rank = rank;
    b.sites = &sites;
    b.x = x[l];
    b.zx = sites.gate->gemm.x_zero_point;
    for (size_t j = 0; j < n_ff; j++)
      /* a gate accumulator times it is the value in the gate's steps */
      b.step[j] = npu_multiplier_real(sites.gate->mult[j], sites.gate->shift[j]);
    if (!make_bundles(&b, ly) || !exact_values(&b, ly) || !make_predictor(&b, ly) ||
        !make_thresholds(&b, ly, level, recall) || !place_by_heat(&b, ly)) {
      st = npu_fail(err, NPULM_ERR_NOMEM,
                    "cannot build layer %d's sparse decode data (out of memory, or a predictor "
                    "weight beyond the int8 GEMM's range)",
                    l);
    } else if (!rank_asked) {
      drop_unpaid_predictor(sp, l);
    }
  }
  free(b.step);
  free(b.v);
  free(b.p);
  free(b.silu_abs);
  free(b.gate_bias);
  if (st != NPULM_OK) {
    npu_sparse_free(sp);
    return st;
  }
  npu_sparse_free(p->sparse);
  p->sparse = sp;
  return NPULM_OK;
}
