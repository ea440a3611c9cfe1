/* Verifying a program's integer data (npu_program_verify, program_verify.c): every site's sizes,
 * multipliers, shifts, zero points, packed weights and outlier channels, the quantization table
 * and the sparse decode data, within what the kernels accept. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "program/program.h"
#include "program/program_file.h"
#include "program/qparams.h"
#include "program/sparse_data.h"

/* ---- Integer data: sites and the quantization table ------------------------------------- */

npulm_status npu_program_site_fail(npulm_error *err, const struct npu_program *p, int32_t i,
                                   const char *fmt, ...) {
  char what[NPULM_ERROR_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof(what), fmt, ap);
  va_end(ap);
  return npu_fail(err, NPULM_ERR_FORMAT, "program site %d ('%.*s'): %s", i, NPU_IR_NAME_MAX,
                  p->qsites[i].name, what);
}

static int32_t load_i32(const uint8_t *p) {
  int32_t v;
  memcpy(&v, p, sizeof(v));
  return v;
}

/* The packed weights of a matmul site hold exactly what npu_qs8_gemm_pack writes, so that every
 * kernel variant computes the same thing without overflow: |bias| <= 2^30, weights in
 * [-127, 127], each channel's wsum the sum of its weights, zeros in the padding. NULL or what is
 * wrong. */
static const char *check_packed(const struct npu_qsite *s, char *why, size_t cap) {
  enum { NR = NPU_QS8_GEMM_NR, KR = NPU_QS8_GEMM_KR };
  const size_t n = (size_t)s->n, k = (size_t)s->k, kp = (k + KR - 1) / KR * KR;
  const size_t block_size = 2 * NR * sizeof(int32_t) + NR * kp;
  const uint8_t *block = s->packed;
  const size_t groups = kp / KR, tail = k - (groups - 1) * KR; /* k values in the last group */
  for (size_t n0 = 0; n0 < n; n0 += NR, block += block_size) {
    const int8_t *w = (const int8_t *)(block + 2 * NR * sizeof(int32_t));
    const size_t valid = n - n0 < NR ? n - n0 : NR; /* channels of this block */
    /* padding: channels past n, k values past k */
    int pad = 0;
    for (size_t g = 0; g < groups; g++) {
      for (size_t j = 0; j < NR; j++) {
        for (size_t t = j < valid ? (g + 1 < groups ? KR : tail) : 0; t < KR; t++) {
          pad |= w[g * NR * KR + j * KR + t];
        }
      }
    }
    if (pad != 0) return "packed weights have non-zero padding";
    /* w[g][j][t] is weight k = 4g + t of channel n0 + j; in memory order, no early exit */
    int32_t sum[NR] = {0};
    int bad = 0;
    for (size_t g = 0; g < groups; g++) {
      for (size_t j = 0; j < NR; j++) {
        for (size_t t = 0; t < KR; t++) {
          int8_t x = w[g * NR * KR + j * KR + t];
          sum[j] += x;
          bad |= x == INT8_MIN;
        }
      }
    }
    if (bad) return "packed weights hold -128";
    for (size_t j = 0; j < NR; j++) {
      int32_t bias = load_i32(block + 4 * j), wsum = load_i32(block + 4 * (NR + j));
      if (n0 + j >= n ? bias != 0 || wsum != 0 : bias > (1 << 30) || bias < -(1 << 30)) {
        snprintf(why, cap, "packed channel %zu has an invalid bias %d", n0 + j, bias);
        return why;
      }
      if (n0 + j < n && wsum != sum[j]) {
        snprintf(why, cap, "packed channel %zu has weight sum %d, not %d", n0 + j, wsum, sum[j]);
        return why;
      }
    }
  }
  return NULL;
}

/* The packed int4 weights of a matmul site hold what npu_qc4w_gemm_pack writes: |bias| <= 2^30,
 * block scales in [0, 15], each channel's wsum the sum of its weights times their block scales,
 * weight 0 (nibble 8) in the padding. NULL or what is wrong. */
static const char *check_packed_qc4w(const struct npu_qsite *s, char *why, size_t cap) {
  enum { NR = NPU_QS8_GEMM_NR, BLOCK = NPU_QC4W_BLOCK };
  const size_t n = (size_t)s->n, k = (size_t)s->k, block = s->w_block;
  const size_t kp = block > 0 ? (k + BLOCK - 1) / BLOCK * BLOCK : (k + 7) / 8 * 8;
  const size_t chunk = block > 0 ? NR + 4 * 64 : 64; /* bytes per 32 k (block) or 8 k */
  const size_t chunk_k = block > 0 ? BLOCK : 8;
  const size_t block_size = npu_qc4w_gemm_packed_size(NR, k, block);
  const uint8_t *base = s->packed;
  for (size_t n0 = 0; n0 < n; n0 += NR, base += block_size) {
    const uint8_t *data = base + 2 * NR * sizeof(int32_t);
    const size_t valid = n - n0 < NR ? n - n0 : NR;
    int64_t sum[NR] = {0};
    int bad = 0;
    for (size_t c = 0; c < kp / chunk_k; c++) {
      const uint8_t *at = data + c * chunk;
      const uint8_t *scale = block > 0 ? at : NULL;
      const uint8_t *pairs = block > 0 ? at + NR : at;
      for (size_t j = 0; j < NR; j++) {
        const int32_t q = scale != NULL ? scale[j] : 1;
        bad |= q > 15;
        for (size_t pr = 0; pr < chunk_k / 8; pr++) {
          for (size_t t = 0; t < 8; t++) {
            const uint8_t byte = pairs[pr * 64 + j * 4 + t % 4];
            const int32_t w = (t < 4 ? byte & 15 : byte >> 4) - 8;
            const size_t kk = c * chunk_k + pr * 8 + t;
            bad |= (kk >= k || j >= valid) && w != 0;
            sum[j] += (int64_t)q * w;
          }
        }
      }
    }
    if (bad) return "packed int4 weights have a block scale above 15 or non-zero padding";
    for (size_t j = 0; j < NR; j++) {
      int32_t bias = load_i32(base + 4 * j), wsum = load_i32(base + 4 * (NR + j));
      if (n0 + j >= n ? bias != 0 || wsum != 0 : bias > (1 << 30) || bias < -(1 << 30)) {
        snprintf(why, cap, "packed channel %zu has an invalid bias %d", n0 + j, bias);
        return why;
      }
      if (n0 + j < n && wsum != sum[j]) {
        snprintf(why, cap, "packed channel %zu has weight sum %d, not %lld", n0 + j, wsum,
                 (long long)sum[j]);
        return why;
      }
    }
  }
  return NULL;
}

/* Every value of a float array is finite. */
static bool all_finite(const float *x, size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (!isfinite(x[i])) return false;
  }
  return true;
}

/* Site 'i' on its own: an op with an integer kernel, arrays of the sizes its shape implies, every
 * multiplier, shift and zero point within the kernels' documented ranges. */
static npulm_status verify_site(const struct npu_program *p, int32_t i, npulm_error *err) {
  const struct npu_qsite *s = &p->qsites[i];
  char detail[NPULM_ERROR_MAX / 2];
  if (memchr(s->name, '\0', sizeof(s->name)) == NULL || s->name[0] == '\0') {
    return npu_fail(err, NPULM_ERR_FORMAT, "program site %d has an invalid name", i);
  }
  for (int32_t j = 0; j < i; j++) {
    if (strcmp(p->qsites[j].name, s->name) == 0)
      return npu_program_site_fail(err, p, i, "is named twice");
  }
  const uint32_t sites = s->op < NPU_OP_COUNT ? npu_op_info((enum npu_op)s->op)->sites : 0;
  const bool table = sites & NPU_SITE_TABLE;
  /* a gather may read its table out of a matmul's packed weights of the same [n, k] */
  const struct npu_qsite *owner = NULL;
  if (s->table_site != -1) {
    if (s->op != NPU_OP_GATHER || s->table_site < 0 || s->table_site >= p->n_qsites) {
      return npu_program_site_fail(err, p, i, "reads a table from site %d", s->table_site);
    }
    owner = &p->qsites[s->table_site];
    if (owner->op != NPU_OP_MATMUL || owner->n != s->n || owner->k != s->k ||
        owner->packed != s->packed) {
      return npu_program_site_fail(
          err, p, i, "reads its table from site %d, which is not a [n %d, k %d] matmul",
          s->table_site, s->n, s->k);
    }
  }
  if (table) {
    if (s->n < 1 || s->k < 1 || ((s->op == NPU_OP_MATMUL || owner) && s->k > NPU_QS8_GEMM_MAX_K)) {
      return npu_program_site_fail(err, p, i, "has an invalid shape [n %d, k %d]", s->n, s->k);
    }
    if (owner != NULL && owner->w_bits != 8) {
      return npu_program_site_fail(err, p, i, "reads its table from int4 weights");
    }
    uint64_t want = s->op == NPU_OP_MATMUL ? npu_matmul_packed_size(s)
                    : owner != NULL        ? npu_qs8_gemm_packed_size((size_t)s->n, (size_t)s->k)
                                           : (uint64_t)s->n * (uint64_t)s->k;
    if (want == 0) {
      return npu_program_site_fail(err, p, i, "has weights of %d bits in blocks of %d", s->w_bits,
                                   s->w_block);
    }
    if (s->packed == NULL || s->packed_size != want) {
      return npu_program_site_fail(
          err, p, i, "has %llu bytes of packed weights, not the %llu of [n %d, k %d]",
          (unsigned long long)s->packed_size, (unsigned long long)want, s->n, s->k);
    }
    if (s->mult == NULL || s->shift == NULL)
      return npu_program_site_fail(err, p, i, "lacks its multipliers");
    for (int32_t c = 0; c < s->n; c++) {
      if (!npu_verify_requant_ok(s->mult[c], s->shift[c])) {
        return npu_program_site_fail(
            err, p, i, "channel %d has multiplier %d, shift %d (valid: >= 0, -31..30)", c,
            s->mult[c], s->shift[c]);
      }
    }
  }
  if (!(sites & NPU_SITE_OUTLIERS) &&
      (s->n_outliers != 0 || s->outliers != NULL || s->outlier_w != NULL ||
       s->outlier_gate != NULL || s->outlier_up != NULL)) {
    return npu_program_site_fail(err, p, i, "has shadow outliers but is not a matmul");
  }
  switch ((enum npu_op)s->op) {
  case NPU_OP_MATMUL: {
    const struct npu_qs8_gemm_params *q = &s->gemm;
    if (q->mult != s->mult || q->shift != s->shift)
      return npu_program_site_fail(err, p, i, "GEMM parameters");
    if (q->x_zero_point < INT8_MIN || q->x_zero_point > INT8_MAX || q->y_zero_point < INT16_MIN ||
        q->y_zero_point > INT16_MAX) {
      return npu_program_site_fail(err, p, i, "has GEMM zero points %d, %d out of range",
                                   q->x_zero_point, q->y_zero_point);
    }
    if (s->gemm16.acc_shift < 0 || s->gemm16.acc_shift > 32 ||
        s->gemm16.y_zero_point != q->y_zero_point || s->gemm16.block != s->w_block ||
        s->gemm16.mult != s->mult || s->gemm16.shift != s->shift) {
      return npu_program_site_fail(err, p, i, "has wide GEMM parameters out of range (shift %d)",
                                   s->gemm16.acc_shift);
    }
    const char *why = s->w_bits == 8 ? check_packed(s, detail, sizeof(detail))
                                     : check_packed_qc4w(s, detail, sizeof(detail));
    if (why != NULL) return npu_program_site_fail(err, p, i, "%s", why);
    if (s->n_outliers < 0 || s->n_outliers > s->k) {
      return npu_program_site_fail(err, p, i, "has %d outlier channels of %d", s->n_outliers, s->k);
    }
    if (s->n_outliers > 0 && (s->outliers == NULL || s->outlier_w == NULL)) {
      return npu_program_site_fail(err, p, i, "lacks its outlier data");
    }
    for (int32_t o = 0; o < s->n_outliers; o++) {
      int32_t prev = o > 0 ? s->outliers[o - 1] : -1;
      if (s->outliers[o] <= prev || s->outliers[o] >= s->k) {
        return npu_program_site_fail(err, p, i,
                                     "outlier %d is channel %d (channels ascend, below %d)", o,
                                     s->outliers[o], s->k);
      }
    }
    size_t n_w = (size_t)s->n * (size_t)s->n_outliers;
    bool gate = s->outlier_gate != NULL || s->outlier_up != NULL || s->outlier_dim != 0;
    size_t n_g = gate ? (size_t)s->n_outliers * (size_t)s->outlier_dim : 0;
    if (gate && (s->outlier_gate == NULL || s->outlier_up == NULL || s->outlier_dim < 1 ||
                 s->n_outliers == 0)) {
      return npu_program_site_fail(err, p, i, "has incomplete FFN outlier rows (dim %d)",
                                   s->outlier_dim);
    }
    if ((n_w > 0 && !all_finite(s->outlier_w, n_w)) ||
        (n_g > 0 && (!all_finite(s->outlier_gate, n_g) || !all_finite(s->outlier_up, n_g)))) {
      return npu_program_site_fail(err, p, i, "has outlier weights that are not finite");
    }
    return NPULM_OK;
  }
  case NPU_OP_GATHER: {
    const struct npu_qs8_gather_params *q = &s->gather;
    if (q->mult != s->mult || q->shift != s->shift)
      return npu_program_site_fail(err, p, i, "gather parameters");
    if (q->y_zero_point < INT16_MIN || q->y_zero_point > INT16_MAX) {
      return npu_program_site_fail(err, p, i, "has gather zero point %d out of range",
                                   q->y_zero_point);
    }
    return NPULM_OK;
  }
  case NPU_OP_ADD: {
    const struct npu_qadd_params *q = &s->add;
    if (q->left_shift < 0 || q->left_shift > 22 ||
        !npu_verify_add_input_ok(q->a_mult, q->a_shift) ||
        !npu_verify_add_input_ok(q->b_mult, q->b_shift) ||
        !npu_verify_requant_ok(q->y_mult, q->y_shift)) {
      return npu_program_site_fail(
          err, p, i,
          "has add parameters out of range (left shift %d, multipliers %d/%d, %d/%d, "
          "%d/%d)",
          q->left_shift, q->a_mult, q->a_shift, q->b_mult, q->b_shift, q->y_mult, q->y_shift);
    }
    if (q->a_zero_point < INT16_MIN || q->a_zero_point > INT16_MAX || q->b_zero_point < INT16_MIN ||
        q->b_zero_point > INT16_MAX || q->y_zero_point < INT16_MIN || q->y_zero_point > INT16_MAX) {
      return npu_program_site_fail(err, p, i, "has add zero points out of range");
    }
    return NPULM_OK;
  }
  case NPU_OP_MUL: {
    const struct npu_qmul_params *q = &s->mul;
    if (!npu_verify_requant_ok(q->y_mult, q->y_shift) || q->a_zero_point < INT8_MIN ||
        q->a_zero_point > INT8_MAX || q->b_zero_point < INT8_MIN || q->b_zero_point > INT8_MAX ||
        q->y_zero_point < INT8_MIN || q->y_zero_point > INT8_MAX) {
      return npu_program_site_fail(err, p, i, "has multiply parameters out of range");
    }
    return NPULM_OK;
  }
  case NPU_OP_SILU: /* any table of 256 int8 or 513 int16 values */
    if (s->lut_wide > 1) return npu_program_site_fail(err, p, i, "has table kind %d", s->lut_wide);
    return NPULM_OK;
  case NPU_OP_QK: {
    const struct npu_qs8_qk_params *q = &s->qk;
    if (!npu_verify_requant_ok(q->mult, q->shift) ||
        !npu_verify_zp_fits(NPU_DT_I8, q->q_zero_point) ||
        !npu_verify_zp_fits(NPU_DT_I8, q->k_zero_point) ||
        !npu_verify_zp_fits(NPU_DT_I16, q->s_zero_point)) {
      return npu_program_site_fail(
          err, p, i,
          "has score parameters out of range (multiplier %d, shift %d, zero points "
          "%d, %d, %d)",
          q->mult, q->shift, q->q_zero_point, q->k_zero_point, q->s_zero_point);
    }
    return NPULM_OK;
  }
  case NPU_OP_SOFTMAX:
    if (!npu_verify_requant_ok(s->softmax.mult, s->softmax.shift)) {
      return npu_program_site_fail(err, p, i,
                                   "has softmax parameters out of range (multiplier %d, shift %d)",
                                   s->softmax.mult, s->softmax.shift);
    }
    return NPULM_OK;
  case NPU_OP_PV: {
    const struct npu_qs16_pv_params *q = &s->pv;
    if (!npu_verify_requant_ok(q->mult, q->shift) ||
        !npu_verify_zp_fits(NPU_DT_I8, q->v_zero_point) ||
        !npu_verify_zp_fits(NPU_DT_I8, q->y_zero_point)) {
      return npu_program_site_fail(
          err, p, i,
          "has weighted-value parameters out of range (multiplier %d, shift %d, zero "
          "points %d, %d)",
          q->mult, q->shift, q->v_zero_point, q->y_zero_point);
    }
    return NPULM_OK;
  }
  case NPU_OP_RMSNORM: {
    const struct npu_qs16_rmsnorm_params *q = &s->rmsnorm;
    if (q->eps < 1 || q->eps > ((int64_t)1 << 62) || q->shift < -16 || q->shift > 46 ||
        !npu_verify_zp_fits(NPU_DT_I8, q->y_zero_point)) {
      return npu_program_site_fail(
          err, p, i, "has norm parameters out of range (eps %lld, shift %d, zero point %d)",
          (long long)q->eps, q->shift, q->y_zero_point);
    }
    return NPULM_OK;
  }
  case NPU_OP_LAST_ROW: return NPULM_OK; /* a copy: nothing to check */
  default: break;
  }
  return npu_program_site_fail(err, p, i, "is a %s, which has no integer kernel",
                               npu_op_name((enum npu_op)s->op));
}

/* The quantization table: integer types, positive finite scales, zero points that fit. */
static npulm_status verify_qtensors(const struct npu_program *p, npulm_error *err) {
  for (int32_t i = 0; i < p->n_qtensors; i++) {
    const struct npu_qtensor *t = &p->qtensors[i];
    const char *why = NULL;
    if (memchr(t->name, '\0', sizeof(t->name)) == NULL || t->name[0] == '\0')
      why = "has an invalid name";
    else if (!npu_verify_is_int(t->dtype)) why = "is not I8 or I16";
    else if (!(t->q.scale > 0.0f) || !isfinite(t->q.scale))
      why = "has a scale that is not positive and finite";
    else if (!npu_verify_zp_fits(t->dtype, t->q.zero_point))
      why = "has a zero point outside its type's range";
    for (int32_t j = 0; j < i && why == NULL; j++) {
      if (strcmp(p->qtensors[j].name, t->name) == 0) why = "is named twice";
    }
    if (why != NULL) {
      return npu_fail(err, NPULM_ERR_FORMAT, "program quantization table entry %d ('%.*s') %s", i,
                      NPU_IR_NAME_MAX, t->name, why);
    }
  }
  return NPULM_OK;
}

/* The integer half of a program: FP32 programs have none; integer ones a valid mode, options,
 * table and sites. */
/* Sparse decode's predictors are int8 GEMMs too: their packed weights as a matmul site's. */
npulm_status npu_program_verify_sparse(const struct npu_program *p, npulm_error *err) {
  const struct npu_sparse *sp = p->sparse;
  for (int32_t l = 0; sp != NULL && l < sp->n_layers; l++) {
    const struct npu_sparse_layer *ly = &sp->layers[l];
    if (ly->rank == 0) continue; /* no predictor */
    const struct npu_qsite b = {.n = ly->rank, .k = sp->dim, .packed = ly->pred_b};
    const struct npu_qsite a = {.n = ly->n_ff, .k = ly->rank, .packed = ly->pred_a};
    char detail[160];
    const char *why = check_packed(&b, detail, sizeof(detail));
    if (why == NULL) why = check_packed(&a, detail, sizeof(detail));
    if (why != NULL) {
      return npu_fail(err, NPULM_ERR_FORMAT, "sparse layer %d's predictor: %s", l, why);
    }
  }
  return NPULM_OK;
}

npulm_status npu_program_verify_quant(const struct npu_program *p, npu_site_checked_fn after_site,
                                      void *user, npulm_error *err) {
  if (p->quant_mode == NPU_QUANT_F32) {
    if (p->n_qsites != 0 || p->n_qtensors != 0) {
      return npu_fail(err, NPULM_ERR_FORMAT, "an FP32 program has integer data");
    }
    return NPULM_OK;
  }
  if (p->quant_mode < 0 || p->quant_mode >= NPU_QUANT_MODE_COUNT) {
    return npu_fail(err, NPULM_ERR_FORMAT, "program quantization mode %d is unknown",
                    p->quant_mode);
  }
  if (!isfinite(p->smooth_alpha) || !isfinite(p->shadow_threshold)) {
    return npu_fail(err, NPULM_ERR_FORMAT, "program quantization options are not finite");
  }
  if (p->n_qsites < 0 || p->n_qtensors < 0 || (p->n_qsites > 0 && p->qsites == NULL) ||
      (p->n_qtensors > 0 && p->qtensors == NULL)) {
    return npu_fail(err, NPULM_ERR_FORMAT, "program integer data is missing");
  }
  npulm_status st = verify_qtensors(p, err);
  for (int32_t i = 0; i < p->n_qsites && st == NPULM_OK; i++) {
    st = verify_site(p, i, err);
    if (st == NPULM_OK && after_site != NULL) after_site(user, p, i);
  }
  return st;
}
