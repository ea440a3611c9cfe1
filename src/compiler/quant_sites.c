/* The quantizer's per-op builders: the integer data (a site) of each NPU operation, from the
 * calibrated quantization of its tensors and its weights (see quantize.h). */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "base/pages.h"
#include "base/pool.h"
#include "compiler/quant_internal.h"
#include "compiler/wquant.h"
#include "program/qparams.h"

/* True if the CPU can compute the outlier channels of a matmul reading tensor 'x' in float: the
 * value exists on the CPU (made there), or it is the FFN product, which the CPU recomputes from
 * the FFN norm output. An input the NPU makes (the attention output, when P.V runs there) is not:
 * its matmul gets no shadow, and its int8 range covers all channels. */
bool npu_quant_shadowable(const struct npu_graph *g, int32_t x) {
  return g->tensors[x].role == NPU_ROLE_FFN_GATE_PAR || npu_ir_value_on(g, x, NPU_BE_CPU) >= 0;
}

/* The name of the NPU's int8 copy of the K (or V) cache of 'layer' (its quantization's key). */
void npu_quant_kv_copy_name(int32_t layer, bool value, char name[NPU_IR_NAME_MAX]) {
  snprintf(name, NPU_IR_NAME_MAX, "blk.%d.%s", layer,
           npu_tensor_role_name(value ? NPU_ROLE_V_CACHE_COPY : NPU_ROLE_K_CACHE_COPY));
}

/* Input channels of 'stats' whose calibrated magnitude exceeds 'threshold' times the median. */
int32_t npu_quant_find_outliers(const struct npu_act_stats *st, float threshold, int32_t *out) {
  int32_t n = st->n_channels, count = 0;
  float *sorted = malloc((size_t)n * sizeof(float));
  if (sorted == NULL) return -1;
  memcpy(sorted, st->chan_absmax, (size_t)n * sizeof(float));
  for (int32_t i = 1; i < n; i++) { /* insertion sort: n is a layer width */
    float v = sorted[i];
    int32_t j = i - 1;
    for (; j >= 0 && sorted[j] > v; j--) sorted[j + 1] = sorted[j];
    sorted[j + 1] = v;
  }
  float limit = threshold * sorted[n / 2];
  free(sorted);
  for (int32_t c = 0; c < n; c++) {
    if (st->chan_absmax[c] > limit) out[count++] = c;
  }
  return count;
}

/* ---- Sites ---------------------------------------------------------------------------------- */

static const struct npu_qtensor *qt(const struct npu_program *p, const struct npu_graph *g,
                                    int32_t id) {
  return npu_program_qtensor(p, g->tensors[id].name);
}

/* Rows per block as a matrix is quantized: whole 16-channel blocks of the GEMM's packing, and few
 * enough that a block of the largest classifier stays tens of MB in float. */
enum { QUANT_ROWS = 1024 };
_Static_assert(QUANT_ROWS % NPU_QS8_GEMM_NR == 0, "blocks of rows pack on their own");

/* Rows [r0, r0 + n) of weight 'wi' as floats at '*out': where the table has them, else read from
 * the model into 'scratch' (a streaming compile's embedding and classifier, never whole in
 * memory). */
npulm_status npu_quant_weight_rows(const struct npulm_model *m, const struct npu_program *p,
                                   int32_t wi, size_t r0, size_t n, float *scratch,
                                   const float **out, npulm_error *err) {
  const struct npu_weight *w = &p->weights[wi];
  if (w->data != NULL) {
    *out = w->data + r0 * (size_t)w->ne0;
    return NPULM_OK;
  }
  *out = scratch;
  return npu_model_read_rows(m, w->name, r0, n, scratch, err);
}

/* Room for 'size' bytes of packed weights: the heap, or a streaming compile's spill file. */
static void *alloc_packed(struct npu_program *p, uint64_t size) {
  const uint64_t rounded = (size + 63) & ~(uint64_t)63;
  if (p->spill == NULL) return aligned_alloc(64, rounded);
  if (rounded > p->spill_size - p->spill_used) return NULL;
  void *at = p->spill + p->spill_used;
  p->spill_used += rounded;
  return at;
}

/* Packed bytes just written to a streaming compile's spill file leave memory (they stay in the
 * file, which the save reads them back from). */
static void packed_written(const struct npu_program *p, const void *packed, uint64_t size) {
  if (p->spill != NULL) npu_pages_release(packed, (size_t)size);
}

/* The weight format of the matmul writing tensor 'out' in 'mode': the mode's, except that the
 * classifier keeps int8 weights in every mode (as llama.cpp's Q4_0 and Q4_K_M keep the output
 * matrix in Q6_K: the logits are the most sensitive product, and a tied embedding then shares
 * its int8 matrix). */
static void weight_format(const struct npu_graph *g, int32_t out, enum npu_quant_mode mode,
                          uint8_t *bits, uint8_t *block) {
  const bool classifier = g->tensors[out].role == NPU_ROLE_LOGITS;
  *bits = (uint8_t)(classifier ? 8 : npu_quant_weight_bits(mode));
  *block = (uint8_t)(classifier ? 0 : npu_quant_weight_block(mode));
}

/* E[x_c^2] of each channel of a matmul's input, from its calibration statistics (NULL if it has
 * none), or NULL with the status set. */
static float *input_importance(const struct npu_calib *cal, const char *name, size_t cols) {
  const struct npu_act_stats *st = npu_calib_find(cal, name);
  if (st == NULL || st->n_channels != (int32_t)cols || st->count == 0) return NULL;
  float *imp = malloc(cols * sizeof(float));
  if (imp == NULL) return NULL;
  const double rows = (double)(st->count / (uint64_t)st->n_channels);
  for (size_t c = 0; c < cols; c++) imp[c] = (float)(st->chan_sumsq[c] / rows);
  return imp;
}

/* The bound of |acc| of the rows of a matmul with an int16 input: |bias| + 32768 * sum_k
 * |q_block * w| per row, the largest. */
static int64_t wide_bound(const int8_t *wq, const uint8_t *bscale, const int32_t *bias, size_t rows,
                          size_t cols, size_t block) {
  int64_t worst = 0;
  const size_t n_blocks = block > 0 ? (cols + block - 1) / block : 0;
  for (size_t r = 0; r < rows; r++) {
    int64_t sum = 0;
    for (size_t c = 0; c < cols; c++) {
      const int64_t q = block > 0 ? bscale[r * n_blocks + c / block] : 1;
      sum += q * llabs(wq[r * cols + c]);
    }
    const int64_t b = bias != NULL ? llabs(bias[r]) : 0;
    if (b + 32768 * sum > worst) worst = b + 32768 * sum;
  }
  return worst;
}

/* npu_narrow's shift for accumulators bounded by 'bound': the smallest that leaves no value past
 * int32 after its rounding (so that nothing saturates). */
static int32_t narrow_shift(int64_t bound) {
  int32_t s = 0;
  while (s < 32 && (s == 0 ? bound : (bound >> s) + 1) > INT32_MAX) s++;
  return s;
}

/* Rows of a matrix quantized by npu_quantize_weights, cut across a pool's threads (each row on
 * its own: the same result for any cut). */
struct wquant_job {
  const float *w;
  size_t rows, cols, n_bscales, per_task;
  const struct npu_wquant *how;
  int8_t *q;
  float *scales;
  uint8_t *bscale;
  _Atomic bool bad;
};

static void wquant_task(void *arg, size_t task) {
  struct wquant_job *j = arg;
  const size_t r0 = task * j->per_task;
  if (r0 >= j->rows) return;
  const size_t n = j->rows - r0 < j->per_task ? j->rows - r0 : j->per_task;
  if (!npu_quantize_weights(j->w + r0 * j->cols, n, j->cols, j->how, j->q + r0 * j->cols,
                            j->scales + r0,
                            j->bscale != NULL ? j->bscale + r0 * j->n_bscales : NULL)) {
    atomic_store(&j->bad, true);
  }
}

static bool quantize_rows(struct npu_pool *pool, const float *w, size_t rows, size_t cols,
                          const struct npu_wquant *how, int8_t *q, float *scales, uint8_t *bscale,
                          size_t n_bscales) {
  struct wquant_job j = {.w = w,
                         .rows = rows,
                         .cols = cols,
                         .n_bscales = n_bscales,
                         .per_task = 16,
                         .how = how,
                         .q = q,
                         .scales = scales,
                         .bscale = bscale};
  atomic_init(&j.bad, false);
  npu_pool_run(pool, (rows + j.per_task - 1) / j.per_task, wquant_task, &j);
  return !atomic_load(&j.bad);
}

/* A matmul: quantize W per output channel (outlier columns zeroed and kept in float; int4 per
 * channel or in blocks as the mode says, the scales chosen by the weighted error on the
 * calibration data), bias in accumulator units, multipliers x_scale * w_scale[n] / y_scale (times
 * 2^acc_shift for an int16 input, whose sums npu_narrow narrows first), and pack; a block of rows
 * at a time (every step is per output channel). */
static npulm_status make_matmul(const struct npulm_model *m, struct npu_program *p,
                                const struct npu_graph *g, const struct npu_ir_node *n,
                                const struct npu_calib *cal, enum npu_quant_mode mode,
                                struct npu_pool *pool, struct npu_qsite *site,
                                const int32_t *outliers, int32_t n_outliers, npulm_error *err) {
  const int32_t wi = g->tensors[n->in[1]].ref;
  const struct npu_weight *w = &p->weights[wi];
  const struct npu_qtensor *x = qt(p, g, n->in[0]), *y = qt(p, g, n->out);
  const size_t rows = (size_t)w->ne1, cols = (size_t)w->ne0;
  const size_t block = rows < QUANT_ROWS ? rows : QUANT_ROWS;
  weight_format(g, n->out, mode, &site->w_bits, &site->w_block);
  const size_t n_bscales = site->w_block > 0 ? (cols + site->w_block - 1) / site->w_block : 0;
  const uint64_t packed_block = npu_matmul_rows_packed_size(site, NPU_QS8_GEMM_NR, cols);
  const bool wide = x != NULL && x->dtype == NPU_DT_I16;
  float *wf = malloc(block * cols * sizeof(float)), *scales = malloc(rows * sizeof(float));
  float *scratch = w->data == NULL ? malloc(block * cols * sizeof(float)) : NULL;
  float *imp = input_importance(cal, g->tensors[n->in[0]].name, cols);
  int8_t *wq = malloc(block * cols);
  uint8_t *bscale = n_bscales > 0 ? malloc(block * n_bscales) : NULL;
  int32_t *bias = n->in[2] >= 0 ? malloc(rows * sizeof(int32_t)) : NULL;
  npulm_status st = NPULM_OK;
  int64_t bound = 0;
  site->n = (int32_t)rows;
  site->k = (int32_t)cols;
  site->mult = malloc(rows * sizeof(int32_t));
  site->shift = malloc(rows * sizeof(int32_t));
  site->packed_size = npu_matmul_rows_packed_size(site, rows, cols);
  site->packed = alloc_packed(p, site->packed_size);
  if (n_outliers > 0) {
    site->outliers = malloc((size_t)n_outliers * sizeof(int32_t));
    site->outlier_w = malloc(rows * (size_t)n_outliers * sizeof(float));
  }
  if (!wf || !scales || !wq || !site->mult || !site->shift || !site->packed ||
      (w->data == NULL && !scratch) || (n->in[2] >= 0 && !bias) || (n_bscales > 0 && !bscale) ||
      (n_outliers > 0 && (!site->outliers || !site->outlier_w))) {
    st = npu_fail(err, NPULM_ERR_NOMEM, "out of memory quantizing '%s'", site->name);
    goto done;
  }
  if (x == NULL || y == NULL) {
    st = npu_fail(err, NPULM_ERR_ARG, "'%s': operands without quantization", site->name);
    goto done;
  }
  /* int8 weights keep the row maximum (the programs of before); int4 ones search */
  const struct npu_wquant how = {
      .bits = site->w_bits, .block = site->w_block, .imp = imp, .search = site->w_bits == 4};
  site->n_outliers = n_outliers;
  for (int32_t o = 0; o < n_outliers; o++) site->outliers[o] = outliers[o];
  for (size_t r0 = 0; r0 < rows && st == NPULM_OK; r0 += block) {
    const size_t nb = rows - r0 < block ? rows - r0 : block;
    const float *src;
    if ((st = npu_quant_weight_rows(m, p, wi, r0, nb, scratch, &src, err)) != NPULM_OK) break;
    memcpy(wf, src, nb * cols * sizeof(float));
    for (int32_t o = 0; o < n_outliers; o++) {
      for (size_t r = 0; r < nb; r++) {
        site->outlier_w[(r0 + r) * (size_t)n_outliers + (size_t)o] =
            wf[r * cols + (size_t)outliers[o]];
        wf[r * cols + (size_t)outliers[o]] = 0.0f; /* the NPU's share of these channels is zero */
      }
    }
    if (!quantize_rows(pool, wf, nb, cols, &how, wq, scales + r0, bscale, n_bscales)) {
      st = npu_fail(err, NPULM_ERR_FORMAT, "weight of '%s' is not finite", site->name);
      break;
    }
    if (bias != NULL && !npu_quantize_bias(p->weights[g->tensors[n->in[2]].ref].data + r0, nb,
                                           x->q.scale, scales + r0, bias + r0)) {
      st = npu_fail(err, NPULM_ERR_ARG, "bias of '%s' cannot be quantized", site->name);
      break;
    }
    /* an all-zero row has scale 0: any multiplier gives 0 */
    for (size_t r = r0; r < r0 + nb; r++) scales[r] = scales[r] > 0.0f ? scales[r] : 0.0f;
    uint8_t *packed = (uint8_t *)site->packed + r0 / NPU_QS8_GEMM_NR * packed_block;
    const int32_t *b = bias != NULL ? bias + r0 : NULL;
    if (site->w_bits == 8 ? !npu_qs8_gemm_pack(nb, cols, wq, b, packed)
                          : !npu_qc4w_gemm_pack(nb, cols, wq, b, site->w_block, bscale, packed)) {
      st = npu_fail(err, NPULM_ERR_ARG, "'%s': weights cannot be packed", site->name);
      break;
    }
    if (wide) {
      const int64_t rows_bound = wide_bound(wq, bscale, b, nb, cols, site->w_block);
      if (rows_bound > bound) bound = rows_bound;
    }
    packed_written(p, packed, npu_matmul_rows_packed_size(site, nb, cols));
  }
  /* the multipliers, once the accumulators' narrowing is known */
  const int32_t acc_shift = wide ? narrow_shift(bound) : 0;
  if (st == NPULM_OK && !npu_quantize_multipliers(ldexpf(x->q.scale, acc_shift), scales, rows,
                                                  y->q.scale, site->mult, site->shift)) {
    st = npu_fail(err, NPULM_ERR_ARG, "'%s': scales out of the fixed-point range", site->name);
  }
  site->gemm = (struct npu_qs8_gemm_params){.mult = site->mult,
                                            .shift = site->shift,
                                            .x_zero_point = x != NULL ? x->q.zero_point : 0,
                                            .y_zero_point = y != NULL ? y->q.zero_point : 0};
  site->gemm16 = (struct npu_qs16_gemm_params){.mult = site->mult,
                                               .shift = site->shift,
                                               .acc_shift = acc_shift,
                                               .y_zero_point = y != NULL ? y->q.zero_point : 0,
                                               .block = site->w_block};
done:
  free(wf);
  free(scratch);
  free(scales);
  free(imp);
  free(wq);
  free(bscale);
  free(bias);
  return st;
}

/* Shadow data of a matmul whose input is the FFN product silu(gate) * up, which exists only on
 * the NPU: the CPU recomputes the outlier channels from the FFN norm output with these rows. */
static npulm_status keep_ffn_rows(struct npu_program *p, const struct npu_graph *g, int32_t layer,
                                  struct npu_qsite *site, npulm_error *err) {
  int32_t gi = npu_ir_weight_of(g, layer, NPU_ROLE_FFN_GATE, 1);
  int32_t ui = npu_ir_weight_of(g, layer, NPU_ROLE_FFN_UP, 1);
  if (gi < 0 || ui < 0)
    return npu_fail(err, NPULM_ERR_ARG, "'%s': FFN weights missing", site->name);
  size_t dim = (size_t)p->weights[gi].ne0;
  site->outlier_dim = (int32_t)dim;
  site->outlier_gate = malloc((size_t)site->n_outliers * dim * sizeof(float));
  site->outlier_up = malloc((size_t)site->n_outliers * dim * sizeof(float));
  if (site->outlier_gate == NULL || site->outlier_up == NULL) {
    return npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
  }
  for (int32_t o = 0; o < site->n_outliers; o++) {
    size_t row = (size_t)site->outliers[o] * dim;
    memcpy(site->outlier_gate + (size_t)o * dim, p->weights[gi].data + row, dim * sizeof(float));
    memcpy(site->outlier_up + (size_t)o * dim, p->weights[ui].data + row, dim * sizeof(float));
  }
  return NPULM_OK;
}

/* A gather: the table quantized per row, multipliers row_scale / y_scale; a block of rows at a
 * time. */
static npulm_status make_gather(const struct npulm_model *m, struct npu_program *p,
                                const struct npu_graph *g, const struct npu_ir_node *n,
                                struct npu_qsite *site, npulm_error *err) {
  const int32_t wi = g->tensors[n->in[1]].ref;
  const struct npu_weight *w = &p->weights[wi];
  const struct npu_qtensor *y = qt(p, g, n->out);
  const size_t rows = (size_t)w->ne1, cols = (size_t)w->ne0;
  const size_t block = rows < QUANT_ROWS ? rows : QUANT_ROWS;
  float *scales = malloc(rows * sizeof(float));
  float *scratch = w->data == NULL ? malloc(block * cols * sizeof(float)) : NULL;
  site->n = (int32_t)rows;
  site->k = (int32_t)cols;
  site->packed_size = rows * cols;
  site->packed = alloc_packed(p, site->packed_size);
  site->mult = malloc(rows * sizeof(int32_t));
  site->shift = malloc(rows * sizeof(int32_t));
  npulm_status st = NPULM_OK;
  if (!scales || !site->packed || !site->mult || !site->shift || (w->data == NULL && !scratch)) {
    st = npu_fail(err, NPULM_ERR_NOMEM, "out of memory quantizing '%s'", site->name);
  } else if (y == NULL) {
    st = npu_fail(err, NPULM_ERR_ARG, "'%s': table cannot be quantized", site->name);
  }
  for (size_t r0 = 0; r0 < rows && st == NPULM_OK; r0 += block) {
    const size_t nb = rows - r0 < block ? rows - r0 : block;
    int8_t *table = (int8_t *)site->packed + r0 * cols;
    const float *src;
    if ((st = npu_quant_weight_rows(m, p, wi, r0, nb, scratch, &src, err)) != NPULM_OK) break;
    if (!npu_quantize_weights_per_channel(src, nb, cols, table, scales + r0) ||
        !npu_quantize_multipliers(1.0f, scales + r0, nb, y->q.scale, site->mult + r0,
                                  site->shift + r0)) {
      st = npu_fail(err, NPULM_ERR_ARG, "'%s': table cannot be quantized", site->name);
    }
    packed_written(p, table, nb * cols);
  }
  if (st == NPULM_OK) {
    site->gather = (struct npu_qs8_gather_params){
        .mult = site->mult, .shift = site->shift, .y_zero_point = y->q.zero_point};
  }
  free(scales);
  free(scratch);
  return st;
}

/* Whether the int8 table of gather site 'g' is row for row the packed weights of matmul site
 * 'mm' (a tied embedding, quantized the same way per row for both). */
static bool same_table(const struct npu_qsite *g, const struct npu_qsite *mm) {
  if (mm->op != NPU_OP_MATMUL || mm->w_bits != 8 || mm->n != g->n || mm->k != g->k ||
      mm->n_outliers != 0) {
    return false;
  }
  enum { NR = NPU_QS8_GEMM_NR };
  const size_t block_size = npu_qs8_gemm_packed_size(NR, (size_t)g->k);
  int8_t row[1024];
  for (int32_t r = 0; r < g->n; r++) {
    /* a matmul with a bias cannot serve: the head of its packed block holds that bias */
    int32_t bias;
    memcpy(&bias,
           (const uint8_t *)mm->packed + (size_t)(r / NR) * block_size + (size_t)(r % NR) * 4,
           sizeof(bias));
    if (bias != 0) return false;
    for (int32_t c0 = 0; c0 < g->k; c0 += (int32_t)sizeof(row)) {
      int32_t c1 = c0 + (int32_t)sizeof(row) < g->k ? c0 + (int32_t)sizeof(row) : g->k;
      npu_qs8_gemm_unpack_row((size_t)g->k, mm->packed, (size_t)r, (size_t)c0, (size_t)c1, row);
      if (memcmp(row, (const int8_t *)g->packed + (size_t)r * (size_t)g->k + c0,
                 (size_t)(c1 - c0)) != 0) {
        return false;
      }
    }
  }
  return true;
}

/* A gather whose table equals a matmul's packed weights (the classifier of a model whose output
 * shares the token embedding) reads it from there: the int8 matrix is kept once. */
void npu_quant_share_tables(struct npu_program *p) {
  for (int32_t i = 0; i < p->n_qsites; i++) {
    struct npu_qsite *g = &p->qsites[i];
    if (g->op != NPU_OP_GATHER || g->table_site >= 0) continue;
    for (int32_t j = 0; j < p->n_qsites; j++) {
      const bool same = same_table(g, &p->qsites[j]);
      if (p->qsites[j].op == NPU_OP_MATMUL) { /* read back to compare: out of memory again */
        packed_written(p, p->qsites[j].packed, p->qsites[j].packed_size);
        packed_written(p, g->packed, g->packed_size);
      }
      if (!same) continue;
      if (p->spill == NULL) free(g->packed);
      g->packed = p->qsites[j].packed;
      g->packed_size = p->qsites[j].packed_size;
      g->table_site = j;
      break;
    }
  }
}

npulm_status npu_quant_make_site(const struct npulm_model *m, struct npu_program *p,
                                 const struct npu_graph *g, const struct npu_ir_node *n,
                                 const struct npu_calib *cal, const struct npu_quant_options *o,
                                 struct npu_pool *pool, npulm_error *err) {
  struct npu_qsite *site = &p->qsites[p->n_qsites++];
  memset(site, 0, sizeof(*site));
  site->table_site = -1;
  snprintf(site->name, sizeof(site->name), "%s", g->tensors[n->out].name);
  site->op = n->op;
  const struct npu_qtensor *a = n->in[0] >= 0 ? qt(p, g, n->in[0]) : NULL;
  const struct npu_qtensor *b = n->in[1] >= 0 ? qt(p, g, n->in[1]) : NULL;
  const struct npu_qtensor *y = qt(p, g, n->out);
  switch ((enum npu_op)n->op) {
  case NPU_OP_MATMUL: {
    int32_t n_out = 0, *outliers = NULL;
    if (npu_quant_outliers(o->mode) == NPU_OUTLIERS_SHADOW && npu_quant_shadowable(g, n->in[0])) {
      const struct npu_act_stats *st = npu_calib_find(cal, g->tensors[n->in[0]].name);
      if (st != NULL && (outliers = malloc((size_t)st->n_channels * sizeof(int32_t))) != NULL) {
        n_out = npu_quant_find_outliers(st, o->shadow_threshold, outliers);
      }
    }
    npulm_status s =
        make_matmul(m, p, g, n, cal, o->mode, pool, site, outliers, n_out > 0 ? n_out : 0, err);
    free(outliers);
    if (s == NPULM_OK && site->n_outliers > 0 &&
        g->tensors[n->in[0]].role == NPU_ROLE_FFN_GATE_PAR) {
      s = keep_ffn_rows(p, g, n->layer, site, err);
    }
    return s;
  }
  case NPU_OP_GATHER: return make_gather(m, p, g, n, site, err);
  case NPU_OP_ADD:
    if (a && b && y &&
        npu_qadd_params_make(a->q.scale, a->q.zero_point, b->q.scale, b->q.zero_point, y->q.scale,
                             y->q.zero_point, y->dtype == NPU_DT_I16, &site->add) &&
        a->dtype == y->dtype && b->dtype == y->dtype) {
      return NPULM_OK;
    }
    break;
  case NPU_OP_MUL:
    /* int8, or int16 with zero points 0 (the product then fits int32) */
    if (a && b && y && a->dtype == y->dtype && b->dtype == y->dtype &&
        (y->dtype == NPU_DT_I8 ||
         (a->q.zero_point == 0 && b->q.zero_point == 0 && y->q.zero_point == 0)) &&
        npu_qmul_params_make(a->q.scale, a->q.zero_point, b->q.scale, b->q.zero_point, y->q.scale,
                             y->q.zero_point, &site->mul)) {
      return NPULM_OK;
    }
    break;
  case NPU_OP_SILU:
    if (a && y && a->dtype == NPU_DT_I8 && y->dtype == NPU_DT_I8) {
      npu_lut_s8_build(npu_silu, a->q.scale, a->q.zero_point, y->q.scale, y->q.zero_point,
                       site->lut);
      return NPULM_OK;
    }
    if (a && y && a->dtype == NPU_DT_I16 && y->dtype == NPU_DT_I16 && a->q.zero_point == 0 &&
        y->q.zero_point == 0) {
      npu_lut_s16_build(npu_silu, a->q.scale, y->q.scale, site->lut16);
      site->lut_wide = 1;
      return NPULM_OK;
    }
    break;
  case NPU_OP_QK:
  case NPU_OP_PV: {
    /* the cache operand: the NPU's int8 copy that npu_quant_rewrite_graph puts in place of the F32
     * cache */
    char name[NPU_IR_NAME_MAX];
    npu_quant_kv_copy_name(n->layer, n->op == NPU_OP_PV, name);
    const struct npu_qtensor *kv = npu_program_qtensor(p, name);
    if (n->op == NPU_OP_QK && a && kv && y && a->dtype == NPU_DT_I8 && kv->dtype == NPU_DT_I8 &&
        y->dtype == NPU_DT_I16 &&
        npu_qk_params_make(a->q.scale, a->q.zero_point, kv->q.scale, kv->q.zero_point, n->param,
                           y->q.scale, y->q.zero_point, &site->qk)) {
      return NPULM_OK;
    }
    if (n->op == NPU_OP_PV && a && kv && y && a->dtype == NPU_DT_I16 &&
        a->q.scale == npu_prob_scale() && a->q.zero_point == 0 && kv->dtype == NPU_DT_I8 &&
        y->dtype == NPU_DT_I8 &&
        npu_pv_params_make(kv->q.scale, kv->q.zero_point, y->q.scale, y->q.zero_point, &site->pv)) {
      return NPULM_OK;
    }
    break;
  }
  case NPU_OP_RMSNORM: {
    /* the residual stream (int16) normalized into a matmul's int8 input */
    const struct npu_weight *w = &p->weights[g->tensors[n->in[1]].ref];
    site->n = w->ne0;
    site->mult = malloc((size_t)w->ne0 * sizeof(int32_t));
    if (site->mult == NULL) return npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
    if (a && y && a->dtype == NPU_DT_I16 && a->q.zero_point == 0 &&
        (y->dtype == NPU_DT_I8 || y->dtype == NPU_DT_I16) &&
        npu_rmsnorm_params_make(a->q.scale, w->data, (size_t)w->ne0, n->param, y->q.scale,
                                y->q.zero_point, site->mult, &site->rmsnorm)) {
      return NPULM_OK;
    }
    break;
  }
  case NPU_OP_LAST_ROW:
    /* a copy of a row: its output is quantized as its input (see npu_quantize_program) */
    if (a && y && a->dtype == y->dtype && a->q.scale == y->q.scale &&
        a->q.zero_point == y->q.zero_point) {
      return NPULM_OK;
    }
    break;
  case NPU_OP_SOFTMAX:
    if (a && y && a->dtype == NPU_DT_I16 && y->dtype == NPU_DT_I16 &&
        y->q.scale == npu_prob_scale() && y->q.zero_point == 0 &&
        npu_softmax_params_make(a->q.scale, &site->softmax)) {
      return NPULM_OK;
    }
    break;
  default:
    return npu_fail(err, NPULM_ERR_UNSUPPORTED,
                    "the integer NPU has no kernel for %s yet: keep it in float (--float-ops)",
                    npu_op_name((enum npu_op)n->op));
  }
  return npu_fail(err, NPULM_ERR_ARG, "'%s' (%s): inconsistent quantization", site->name,
                  npu_op_name((enum npu_op)n->op));
}
