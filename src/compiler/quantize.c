/* The quantizer: from a compiled FP32 program and calibration statistics to an integer NPU
 * program (see quantize.h for the conventions and the three outlier modes). */
#include "compiler/quantize.h"

#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/common.h"
#include "base/pages.h"
#include "base/pool.h"
#include "compiler/qparams.h"
#include "compiler/smooth.h"
#include "compiler/sparse.h"
#include "compiler/wquant.h"

/* Headroom over the calibrated magnitude for int16 tensors: text unlike the calibration text may
 * go somewhat further, and int16 has resolution to spare. */
#define I16_HEADROOM 2.0f

static const char *const precision_names[NPU_PREC_COUNT] = {"w8a8", "w8a16", "w4a16", "w4a16-block",
                                                            "w4a8"};

const char *npu_quant_mode_name(enum npu_quant_mode mode) {
  static const char *const names[NPU_QUANT_MODE_COUNT] = {"f32",
                                                          "w8a8-naive",
                                                          "w8a8-shadow",
                                                          "w8a8-smooth",
                                                          "w8a16-naive",
                                                          "w8a16-shadow",
                                                          "w8a16-smooth",
                                                          "w4a16-naive",
                                                          "w4a16-shadow",
                                                          "w4a16-smooth",
                                                          "w4a16-block-naive",
                                                          "w4a16-block-shadow",
                                                          "w4a16-block-smooth",
                                                          "w4a8-naive",
                                                          "w4a8-shadow",
                                                          "w4a8-smooth"};
  return (unsigned)mode < NPU_QUANT_MODE_COUNT ? names[mode] : "?";
}

int npu_quant_mode_parse(const char *name) {
  for (int i = 0; i < NPU_QUANT_MODE_COUNT; i++) {
    if (strcmp(name, npu_quant_mode_name((enum npu_quant_mode)i)) == 0) return i;
  }
  for (int i = 0; i < NPU_PREC_COUNT; i++) {
    if (strcmp(name, precision_names[i]) == 0) {
      return npu_quant_mode_of((enum npu_precision)i, NPU_OUTLIERS_NAIVE);
    }
  }
  return -1;
}

int npu_quant_weight_bits(enum npu_quant_mode mode) {
  const enum npu_precision p = npu_quant_precision(mode);
  return p == NPU_PREC_W8A8 || p == NPU_PREC_W8A16 ? 8 : 4;
}

int npu_quant_act_bits(enum npu_quant_mode mode) {
  const enum npu_precision p = npu_quant_precision(mode);
  return p == NPU_PREC_W8A8 || p == NPU_PREC_W4A8 ? 8 : 16;
}

int npu_quant_weight_block(enum npu_quant_mode mode) {
  return npu_quant_precision(mode) == NPU_PREC_W4A16_BLOCK ? NPU_QC4W_BLOCK : 0;
}

uint32_t npu_quant_float_ops(enum npu_quant_mode mode, uint32_t float_ops) {
  return mode != NPU_QUANT_F32 && npu_quant_outliers(mode) == NPU_OUTLIERS_SHADOW
             ? float_ops | 1u << NPU_OP_RMSNORM
             : float_ops;
}

void npu_quant_default_options(struct npu_quant_options *o) {
  memset(o, 0, sizeof(*o));
  o->mode = NPU_QUANT_SMOOTH;
  o->smooth_alpha = 0.5f;
  o->shadow_threshold = 6.0f;
}

/* Whether 'packed' lies in the program's block of placed weights. */
static bool in_arena(const struct npu_program *p, const void *packed) {
  const uint8_t *b = packed;
  return p->packed_arena != NULL && b >= p->packed_arena &&
         b < p->packed_arena + p->packed_arena_size;
}

/* Free a site's arrays; 'packed' only when it is its own heap memory (not a program file's
 * mapping, nor the placed weights' block, nor the matmul's whose weights a gather reads). */
static void free_site(const struct npu_program *p, struct npu_qsite *s) {
  if (!p->qsites_mapped && s->table_site < 0 && !in_arena(p, s->packed)) free(s->packed);
  free(s->mult);
  free(s->shift);
  free(s->outliers);
  free(s->outlier_w);
  free(s->outlier_gate);
  free(s->outlier_up);
}

void npu_quant_free(struct npu_program *p) {
  for (int32_t i = 0; i < p->n_qsites; i++) free_site(p, &p->qsites[i]);
  npu_pages_free(p->packed_arena, p->packed_arena_size);
  p->packed_arena = NULL;
  p->packed_arena_size = 0;
  npu_pages_free(p->spill, p->spill_size);
  p->spill = NULL;
  p->spill_size = p->spill_used = 0;
  free(p->qsites);
  free(p->qtensors);
  for (int32_t i = 0; i < p->n_owned; i++) free(p->owned[i]);
  free(p->owned);
  p->qsites = NULL;
  p->qtensors = NULL;
  p->owned = NULL;
  p->n_qsites = p->n_qtensors = p->n_owned = 0;
  p->quant_mode = NPU_QUANT_F32;
  p->qsites_mapped = false;
  npu_sparse_free(p->sparse); /* built on the integer data */
  p->sparse = NULL;
}

/* Whether site 's' is a matmul whose packed weights are its own (placed in the arena). */
static bool placed(const struct npu_qsite *s) {
  return s->op == NPU_OP_MATMUL && s->table_site < 0 && s->packed != NULL;
}

npulm_status npu_quant_place_packed(struct npu_program *p, npulm_error *err) {
  return npu_quant_place_packed_but(p, NULL, err);
}

npulm_status npu_quant_place_packed_but(struct npu_program *p, const uint8_t *leave,
                                        npulm_error *err) {
  enum { ALIGN = 64 };
  size_t total = 0;
  for (int32_t i = 0; i < p->n_qsites; i++) {
    const struct npu_qsite *s = &p->qsites[i];
    if (placed(s) && (leave == NULL || !leave[i]))
      total += ((size_t)s->packed_size + ALIGN - 1) / ALIGN * ALIGN;
  }
  if (total == 0 || p->packed_arena != NULL) return NPULM_OK;
  /* under a budget (some sites left in the file) small pages: a huge page's rounding would count
   * against it */
  uint8_t *arena = leave != NULL ? npu_pages_alloc(total) : npu_pages_alloc_huge(total);
  if (arena == NULL) {
    return npu_fail(err, NPULM_ERR_NOMEM, "out of memory placing %zu MiB of packed weights",
                    total >> 20);
  }
  size_t off = 0;
  for (int32_t i = 0; i < p->n_qsites; i++) {
    struct npu_qsite *s = &p->qsites[i];
    if (!placed(s) || (leave != NULL && leave[i])) continue;
    memcpy(arena + off, s->packed, (size_t)s->packed_size);
    if (p->qsites_mapped) npu_pages_release(s->packed, (size_t)s->packed_size);
    else free(s->packed);
    s->packed = arena + off;
    off += ((size_t)s->packed_size + ALIGN - 1) / ALIGN * ALIGN;
  }
  p->packed_arena = arena;
  p->packed_arena_size = total;
  for (int32_t i = 0; i < p->n_qsites; i++) {
    struct npu_qsite *s = &p->qsites[i];
    if (s->table_site >= 0) s->packed = p->qsites[s->table_site].packed;
  }
  return NPULM_OK;
}

const struct npu_qsite *npu_program_qsite(const struct npu_program *p, const char *name) {
  for (int32_t i = 0; i < p->n_qsites; i++) {
    if (strcmp(p->qsites[i].name, name) == 0) return &p->qsites[i];
  }
  return NULL;
}

const struct npu_qtensor *npu_program_qtensor(const struct npu_program *p, const char *name) {
  for (int32_t i = 0; i < p->n_qtensors; i++) {
    if (strcmp(p->qtensors[i].name, name) == 0) return &p->qtensors[i];
  }
  return NULL;
}

/* ---- A block's weights and statistics ------------------------------------------------------- */

/* The calibration statistics of the tensor of 'role' in 'layer' of graph 'g' (by its name, which
 * the reference forward gives its values too), or NULL. */
static const struct npu_act_stats *stats_of(const struct npu_calib *cal, const struct npu_graph *g,
                                            int32_t layer, enum npu_tensor_role role) {
  int32_t t = npu_ir_find_tensor(g, layer, role);
  return t >= 0 ? npu_calib_find(cal, g->tensors[t].name) : NULL;
}

/* The weights of block 'l' as the program's table has them now (possibly smoothed), as the
 * reference reads them: each field the weight (slot 1) or bias (slot 2) of the op writing a
 * role's tensor. */
static void layer_view(const struct npu_program *p, int32_t l, struct npu_layer_weights *lw) {
  memset(lw, 0, sizeof(*lw));
  const struct {
    const float **field;
    enum npu_tensor_role role;
    int slot;
  } read_by[] = {{&lw->attn_norm, NPU_ROLE_ATTN_NORM, 1},
                 {&lw->wq, NPU_ROLE_Q, 1},
                 {&lw->wk, NPU_ROLE_K, 1},
                 {&lw->wv, NPU_ROLE_V, 1},
                 {&lw->bq, NPU_ROLE_Q, 2},
                 {&lw->bk, NPU_ROLE_K, 2},
                 {&lw->bv, NPU_ROLE_V, 2},
                 {&lw->wo, NPU_ROLE_ATTN_OUT, 1},
                 {&lw->ffn_norm, NPU_ROLE_FFN_NORM, 1},
                 {&lw->w_gate, NPU_ROLE_FFN_GATE, 1},
                 {&lw->w_up, NPU_ROLE_FFN_UP, 1},
                 {&lw->w_down, NPU_ROLE_FFN_DOWN, 1}};
  for (size_t f = 0; f < sizeof(read_by) / sizeof(read_by[0]); f++) {
    int32_t wi = npu_ir_weight_of(&p->graphs[0], l, read_by[f].role, read_by[f].slot);
    if (wi >= 0) *read_by[f].field = p->weights[wi].data;
  }
}

/* ---- Tensor quantization -------------------------------------------------------------------- */

/* Whether tensors 'a' and 'b' hold one value: the same tensor, or copies of it in the two arenas
 * (a copy keeps its value's layer and role). */
static bool same_value(const struct npu_graph *g, int32_t a, int32_t b) {
  const struct npu_ir_tensor *x = &g->tensors[a], *y = &g->tensors[b];
  return a == b || (x->role != NPU_ROLE_NONE && x->role == y->role && x->layer == y->layer);
}

/* True if an NPU matmul reads tensor 't' (or a copy of it) as its activation. */
static bool feeds_matmul(const struct npu_graph *g, int32_t t) {
  for (int32_t i = 0; i < g->n_nodes; i++) {
    const struct npu_ir_node *n = &g->nodes[i];
    if (n->backend == NPU_BE_NPU && n->op == NPU_OP_MATMUL && same_value(g, n->in[0], t)) {
      return true;
    }
  }
  return false;
}

/* With int8 activations, int8 unless no NPU consumer needs it: matmul inputs, SiLU and products
 * are int8; the residual stream and what the NPU hands back to the CPU are int16. With int16
 * activations ('act_bits' 16), all int16. */
static enum npu_dtype npu_dtype_of(const struct npu_graph *g, int32_t t, int act_bits) {
  if (act_bits == 16) return NPU_DT_I16;
  for (int32_t i = 0; i < g->n_nodes; i++) {
    const struct npu_ir_node *n = &g->nodes[i];
    if (n->backend != NPU_BE_NPU) continue;
    bool reads = false;
    for (int s = 0; s < NPU_IR_MAX_IN; s++) {
      reads |= n->in[s] >= 0 && same_value(g, n->in[s], t);
    }
    if (reads && (n->op == NPU_OP_MATMUL || n->op == NPU_OP_SILU || n->op == NPU_OP_MUL ||
                  n->op == NPU_OP_QK)) {
      return NPU_DT_I8;
    }
  }
  return NPU_DT_I16;
}

/* True if the CPU can compute the outlier channels of a matmul reading tensor 'x' in float: the
 * value exists on the CPU (made there), or it is the FFN product, which the CPU recomputes from
 * the FFN norm output. An input the NPU makes (the attention output, when P.V runs there) is not:
 * its matmul gets no shadow, and its int8 range covers all channels. */
static bool shadowable(const struct npu_graph *g, int32_t x) {
  return g->tensors[x].role == NPU_ROLE_FFN_GATE_PAR || npu_ir_value_on(g, x, NPU_BE_CPU) >= 0;
}

/* The name of the NPU's int8 copy of the K (or V) cache of 'layer' (its quantization's key). */
static void kv_copy_name(int32_t layer, bool value, char name[NPU_IR_NAME_MAX]) {
  snprintf(name, NPU_IR_NAME_MAX, "blk.%d.%s", layer,
           npu_tensor_role_name(value ? NPU_ROLE_V_CACHE_COPY : NPU_ROLE_K_CACHE_COPY));
}

/* Input channels of 'stats' whose calibrated magnitude exceeds 'threshold' times the median. */
static int32_t find_outliers(const struct npu_act_stats *st, float threshold, int32_t *out) {
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

static npulm_status add_qtensor(struct npu_program *p, const char *name, enum npu_dtype dt,
                                const struct npu_act_stats *st, const int32_t *outliers,
                                int32_t n_outliers, npulm_error *err) {
  struct npu_qtensor *t = &p->qtensors[p->n_qtensors++];
  memset(t, 0, sizeof(*t));
  snprintf(t->name, sizeof(t->name), "%s", name);
  t->dtype = (uint8_t)dt;
  if (st == NULL) return npu_fail(err, NPULM_ERR_ARG, "no calibration statistics for '%s'", name);
  float lo = st->min, hi = st->max;
  if (n_outliers > 0) {
    /* the range the NPU must cover without the channels the CPU takes over */
    float absmax = 0.0f;
    for (int32_t c = 0, o = 0; c < st->n_channels; c++) {
      if (o < n_outliers && outliers[o] == c) o++;
      else absmax = fmaxf(absmax, st->chan_absmax[c]);
    }
    lo = fmaxf(lo, -absmax);
    hi = fminf(hi, absmax);
  }
  if (dt == NPU_DT_I8) {
    npu_choose_qparams_s8(lo, hi, &t->q.scale, &t->q.zero_point);
  } else {
    t->q.scale = npu_choose_scale_sym(I16_HEADROOM * fmaxf(fabsf(lo), fabsf(hi)), 32767);
    t->q.zero_point = 0;
  }
  return NPULM_OK;
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
static npulm_status weight_rows(const struct npulm_model *m, const struct npu_program *p,
                                int32_t wi, size_t r0, size_t n, float *scratch, const float **out,
                                npulm_error *err) {
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

static uint64_t matmul_packed_size(const struct npu_qsite *s, size_t rows, size_t cols) {
  if (s->w_bits == 8 && s->w_block == 0) return npu_qs8_gemm_packed_size(rows, cols);
  if (s->w_bits == 4 && (s->w_block == 0 || s->w_block == NPU_QC4W_BLOCK)) {
    return npu_qc4w_gemm_packed_size(rows, cols, s->w_block);
  }
  return 0;
}

uint64_t npu_matmul_packed_size(const struct npu_qsite *s) {
  return matmul_packed_size(s, (size_t)s->n, (size_t)s->k);
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
  const uint64_t packed_block = matmul_packed_size(site, NPU_QS8_GEMM_NR, cols);
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
  site->packed_size = matmul_packed_size(site, rows, cols);
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
    if ((st = weight_rows(m, p, wi, r0, nb, scratch, &src, err)) != NPULM_OK) break;
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
    packed_written(p, packed, matmul_packed_size(site, nb, cols));
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
    if ((st = weight_rows(m, p, wi, r0, nb, scratch, &src, err)) != NPULM_OK) break;
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
static void share_tied_tables(struct npu_program *p) {
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

static npulm_status make_site(const struct npulm_model *m, struct npu_program *p,
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
    if (npu_quant_outliers(o->mode) == NPU_OUTLIERS_SHADOW && shadowable(g, n->in[0])) {
      const struct npu_act_stats *st = npu_calib_find(cal, g->tensors[n->in[0]].name);
      if (st != NULL && (outliers = malloc((size_t)st->n_channels * sizeof(int32_t))) != NULL) {
        n_out = find_outliers(st, o->shadow_threshold, outliers);
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
    /* the cache operand: the NPU's int8 copy that rewrite_graph puts in place of the F32 cache */
    char name[NPU_IR_NAME_MAX];
    kv_copy_name(n->layer, n->op == NPU_OP_PV, name);
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

/* The CPU float tensor a shadowed matmul's outlier channels are computed from: its input's value
 * on the CPU, or for the FFN product (made on the NPU) the FFN norm output's. */
static int32_t shadow_source(const struct npu_graph *g, int32_t node,
                             const struct npu_qsite *site) {
  int32_t x = g->nodes[node].in[0];
  if (site->outlier_gate != NULL) {
    x = npu_ir_find_tensor(g, g->nodes[node].layer, NPU_ROLE_FFN_NORM);
  }
  return npu_ir_value_on(g, x, NPU_BE_CPU);
}

/* Shadow outlier execution: before each matmul with outlier channels insert SHADOW (CPU, float:
 * those channels' share of the product) and a TRANSFER quantizing it onto the NPU; after it an
 * NPU ADD of the two, which the matmul's readers then read instead. */
static npulm_status insert_shadows(const struct npu_program *p, struct npu_ir_builder *b,
                                   npulm_error *err) {
  struct npu_graph *g = b->g;
  for (int32_t i = 0; i < g->n_nodes && b->status == NPULM_OK; i++) {
    const struct npu_ir_node *mm = &g->nodes[i];
    const struct npu_qsite *s = mm->backend == NPU_BE_NPU && mm->op == NPU_OP_MATMUL
                                    ? npu_program_qsite(p, g->tensors[mm->out].name)
                                    : NULL;
    if (s == NULL || s->n_outliers == 0) continue;
    int32_t src = shadow_source(g, i, s), out = mm->out, layer = mm->layer;
    if (src < 0) {
      return npu_fail(err, NPULM_ERR_ARG, "'%s': no float source for its shadow", s->name);
    }
    char name[NPU_IR_NAME_MAX + 16];
    snprintf(name, sizeof(name), "%s.%s", s->name, npu_tensor_role_name(NPU_ROLE_SHADOW));
    int32_t cpu = npu_ir_add_copy(b, out, NPU_BE_CPU, name);
    int32_t npu = npu_ir_add_copy(b, out, NPU_BE_NPU, name);
    snprintf(name, sizeof(name), "%s.%s", s->name, npu_tensor_role_name(NPU_ROLE_SHADOW_SUM));
    int32_t sum = npu_ir_add_copy(b, out, NPU_BE_NPU, name);
    npu_ir_set_role(b, cpu, layer, NPU_ROLE_SHADOW);
    npu_ir_set_role(b, npu, layer, NPU_ROLE_SHADOW);
    npu_ir_set_role(b, sum, layer, NPU_ROLE_SHADOW_SUM);
    struct npu_ir_node shadow = {.op = NPU_OP_SHADOW,
                                 .backend = NPU_BE_CPU,
                                 .in = {src, -1, -1},
                                 .out = cpu,
                                 .layer = layer};
    struct npu_ir_node transfer = {.op = NPU_OP_TRANSFER,
                                   .backend = NPU_BE_CPU,
                                   .in = {cpu, -1, -1},
                                   .out = npu,
                                   .layer = layer};
    struct npu_ir_node add = {
        .op = NPU_OP_ADD, .backend = NPU_BE_NPU, .in = {out, npu, -1}, .out = sum, .layer = layer};
    /* shadow, transfer, the matmul, the sum */
    npu_ir_insert_node(b, i, &shadow);
    npu_ir_insert_node(b, i + 1, &transfer);
    if (npu_ir_insert_node(b, i + 3, &add) < 0) break;
    i += 3;
    /* later readers of the matmul read the sum */
    for (int32_t j = i + 1; j < g->n_nodes; j++) {
      for (int k = 0; k < NPU_IR_MAX_IN; k++) {
        if (g->nodes[j].in[k] == out) g->nodes[j].in[k] = sum;
      }
    }
    g->n_transfers++;
  }
  return npu_ir_builder_status(b, err);
}

/* ---- Graph rewriting ------------------------------------------------------------------------ */

/* Attention on the integer NPU reads int8 caches: before each NPU QK (PV) insert a CPU TRANSFER
 * that quantizes this step's rows of the layer's F32 K (V) cache into an NPU copy; read that. */
static void insert_kv_copies(struct npu_ir_builder *b) {
  struct npu_graph *g = b->g;
  for (int32_t i = 0; i < g->n_nodes && b->status == NPULM_OK; i++) {
    const struct npu_ir_node *n = &g->nodes[i];
    int32_t cache = n->in[1], layer = n->layer;
    if (n->backend != NPU_BE_NPU || (n->op != NPU_OP_QK && n->op != NPU_OP_PV) ||
        g->tensors[cache].kind != NPU_TK_KV) {
      continue;
    }
    bool value = g->tensors[cache].kv_is_value;
    char name[NPU_IR_NAME_MAX];
    kv_copy_name(layer, value, name);
    /* an activation; kv_is_value still says which cache it holds */
    int32_t copy = npu_ir_add_copy(b, cache, NPU_BE_NPU, name);
    npu_ir_set_role(b, copy, layer, value ? NPU_ROLE_V_CACHE_COPY : NPU_ROLE_K_CACHE_COPY);
    struct npu_ir_node transfer = {.op = NPU_OP_TRANSFER,
                                   .backend = NPU_BE_CPU,
                                   .in = {cache, -1, -1},
                                   .out = copy,
                                   .layer = layer};
    if (npu_ir_insert_node(b, i, &transfer) < 0) break;
    i++;
    g->nodes[i].in[1] = copy;
    g->n_transfers++;
  }
}

/* Give a graph the program's integer form: NPU tensors take their dtype and scale; the NPU's
 * classifier writes int16 logits that a CPU transfer dequantizes; every TRANSFER (quantize or
 * dequantize) runs on the CPU; then subgraphs and the plan are made again. */
static npulm_status rewrite_graph(const struct npu_program *p, struct npu_graph *g,
                                  npulm_error *err) {
  struct npu_ir_builder b;
  npu_ir_builder_resume(&b, g);
  for (int32_t i = 0; i < g->n_nodes && b.status == NPULM_OK; i++) {
    int32_t logits = g->nodes[i].out;
    if (g->nodes[i].backend != NPU_BE_NPU || g->tensors[logits].kind != NPU_TK_LOGITS) continue;
    /* the NPU writes int16 logits to its arena; a transfer after it turns them into floats */
    int32_t act = npu_ir_add_copy(&b, logits, NPU_BE_NPU, NULL);
    if (act < 0) break;
    g->nodes[i].out = act;
    struct npu_ir_node transfer = {.op = NPU_OP_TRANSFER,
                                   .backend = NPU_BE_CPU,
                                   .in = {act, -1, -1},
                                   .out = logits,
                                   .layer = -1};
    npu_ir_insert_node(&b, i + 1, &transfer);
    g->n_transfers++;
  }
  npulm_status st = npu_ir_builder_status(&b, err);
  if (st == NPULM_OK) st = insert_shadows(p, &b, err);
  if (st == NPULM_OK) {
    insert_kv_copies(&b);
    st = npu_ir_builder_status(&b, err);
  }
  if (st != NPULM_OK) return st;
  for (int32_t t = 0; t < g->n_tensors; t++) {
    struct npu_ir_tensor *tensor = &g->tensors[t];
    if (tensor->kind != NPU_TK_ACT || tensor->backend != NPU_BE_NPU) continue;
    const struct npu_qtensor *q = npu_program_qtensor(p, tensor->name);
    if (q == NULL) return npu_fail(err, NPULM_ERR_ARG, "no quantization for '%s'", tensor->name);
    tensor->dtype = q->dtype;
    tensor->q = q->q;
  }
  for (int32_t i = 0; i < g->n_nodes; i++) {
    if (g->nodes[i].op == NPU_OP_TRANSFER) g->nodes[i].backend = NPU_BE_CPU;
  }
  npu_ir_cut_subgraphs(&b);
  if ((st = npu_ir_builder_status(&b, err)) != NPULM_OK) return st;
  return npu_plan(g, err);
}

/* The matmul whose outlier channels SHADOW node 'i' computes: the one whose output the shadow's
 * sum (an ADD of it and the TRANSFER of node i's output) reads; -1 if there is none. */
static int32_t shadowed_matmul(const struct npu_graph *g, int32_t i) {
  int32_t copy = npu_ir_reader_of(g, g->nodes[i].out, i + 1);
  if (copy < 0 || g->nodes[copy].op != NPU_OP_TRANSFER) return -1;
  int32_t sum = npu_ir_reader_of(g, g->nodes[copy].out, copy + 1);
  if (sum < 0 || g->nodes[sum].op != NPU_OP_ADD) return -1;
  return npu_ir_writer_of(g, g->nodes[sum].in[0]);
}

npulm_status npu_quant_link(const struct npu_program *p, struct npu_graph *g, npulm_error *err) {
  free(g->node_site);
  g->node_site = malloc((size_t)(g->n_nodes > 0 ? g->n_nodes : 1) * sizeof(int32_t));
  if (g->node_site == NULL) return npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
  for (int32_t i = 0; i < g->n_nodes; i++) {
    const struct npu_ir_node *n = &g->nodes[i];
    g->node_site[i] = -1;
    /* the node whose output names the data: this one, or for a shadow its matmul */
    int32_t named = i;
    if (n->op == NPU_OP_SHADOW) {
      named = shadowed_matmul(g, i);
    } else if (n->backend != NPU_BE_NPU) {
      continue;
    }
    const struct npu_qsite *site =
        named >= 0 ? npu_program_qsite(p, g->tensors[g->nodes[named].out].name) : NULL;
    enum npu_op want = n->op == NPU_OP_SHADOW ? NPU_OP_MATMUL : (enum npu_op)n->op;
    if (site == NULL || site->op != want) {
      return npu_fail(err, NPULM_ERR_FORMAT, "NPU node writing '%.*s' has no integer data",
                      NPU_IR_NAME_MAX, g->tensors[n->out].name);
    }
    g->node_site[i] = (int32_t)(site - p->qsites);
  }
  return NPULM_OK;
}

/* The graphs for generation copy the last real row of the residual stream before the output
 * norm (LAST_ROW), an op the graph of the table above (graph 0) lacks: its output takes its
 * input's quantization (the same integers) and the op its (empty) integer data. */
static npulm_status add_row_copies(const struct npulm_model *m, struct npu_program *p,
                                   const struct npu_calib *cal, const struct npu_quant_options *o,
                                   npulm_error *err) {
  for (int32_t gi = 0; gi < p->n_graphs; gi++) {
    const struct npu_graph *g = &p->graphs[gi];
    for (int32_t i = 0; i < g->n_nodes; i++) {
      const struct npu_ir_node *n = &g->nodes[i];
      if (n->op != NPU_OP_LAST_ROW || n->backend != NPU_BE_NPU) continue;
      const char *name = g->tensors[n->out].name;
      if (npu_program_qsite(p, name) != NULL) continue;
      const struct npu_qtensor *in = npu_program_qtensor(p, g->tensors[n->in[0]].name);
      if (in == NULL) return npu_fail(err, NPULM_ERR_ARG, "no quantization for '%s'", name);
      struct npu_qtensor *t = &p->qtensors[p->n_qtensors++];
      *t = *in;
      snprintf(t->name, sizeof(t->name), "%s", name);
      npulm_status st = make_site(m, p, g, n, cal, o, NULL, err);
      if (st != NPULM_OK) return st;
    }
  }
  return NPULM_OK;
}

/* ---- The pass ------------------------------------------------------------------------------- */

/* Quantization of the NPU tensors of block 'layer' (-1: outside the blocks) not quantized yet,
 * from the statistics 'cal': with 'embd_only', only the embedding's (what block 0 reads before
 * the head's statistics exist). The NPU's int8 copies of the caches its attention ops read take
 * the range of what the cache holds: k after RoPE, v. 'outliers' has room for any width. */
static npulm_status quantize_tensors(const struct npulm_model *m, struct npu_program *p,
                                     const struct npu_calib *cal, const struct npu_quant_options *o,
                                     int32_t layer, bool embd_only, int32_t *outliers,
                                     npulm_error *err) {
  const struct npu_graph *g0 = &p->graphs[0];
  npulm_status st = NPULM_OK;
  for (int32_t t = 0; t < g0->n_tensors && st == NPULM_OK; t++) {
    const struct npu_ir_tensor *tensor = &g0->tensors[t];
    bool on_npu = (tensor->kind == NPU_TK_ACT && tensor->backend == NPU_BE_NPU) ||
                  tensor->kind == NPU_TK_LOGITS;
    if (!on_npu || tensor->layer != layer || (embd_only && tensor->role != NPU_ROLE_EMBD) ||
        npu_program_qtensor(p, tensor->name) != NULL) {
      continue;
    }
    if (tensor->role == NPU_ROLE_KQ_SOFTMAX) {
      /* probabilities: Q15, no calibration needed */
      struct npu_qtensor *probs = &p->qtensors[p->n_qtensors++];
      memset(probs, 0, sizeof(*probs));
      snprintf(probs->name, sizeof(probs->name), "%s", tensor->name);
      probs->dtype = NPU_DT_I16;
      probs->q = (struct npu_qparams){.scale = npu_prob_scale(), .zero_point = 0};
      continue;
    }
    enum npu_dtype dt = npu_dtype_of(g0, t, npu_quant_act_bits(o->mode));
    const struct npu_act_stats *stats = npu_calib_find(cal, tensor->name);
    int32_t n_out = 0;
    if (npu_quant_outliers(o->mode) == NPU_OUTLIERS_SHADOW && stats != NULL &&
        feeds_matmul(g0, t) && shadowable(g0, t) && stats->n_channels <= 4 * m->cfg.ffn_dim + 16) {
      n_out = find_outliers(stats, o->shadow_threshold, outliers);
    }
    st = add_qtensor(p, tensor->name, dt, stats, outliers, n_out > 0 ? n_out : 0, err);
  }
  for (int32_t i = 0; i < g0->n_nodes && st == NPULM_OK && !embd_only; i++) {
    const struct npu_ir_node *n = &g0->nodes[i];
    if (n->layer != layer || n->backend != NPU_BE_NPU ||
        (n->op != NPU_OP_QK && n->op != NPU_OP_PV)) {
      continue;
    }
    char name[NPU_IR_NAME_MAX];
    kv_copy_name(n->layer, n->op == NPU_OP_PV, name);
    if (npu_program_qtensor(p, name) == NULL) {
      const struct npu_act_stats *src =
          stats_of(cal, g0, n->layer, n->op == NPU_OP_PV ? NPU_ROLE_V : NPU_ROLE_K_ROPE);
      st = add_qtensor(p, name, NPU_DT_I8, src, NULL, 0, err);
    }
  }
  return st;
}

/* The integer data of every NPU operation of block 'layer' (-1: outside the blocks). */
static npulm_status quantize_sites(const struct npulm_model *m, struct npu_program *p,
                                   const struct npu_calib *cal, const struct npu_quant_options *o,
                                   struct npu_pool *pool, int32_t layer, npulm_error *err) {
  const struct npu_graph *g0 = &p->graphs[0];
  npulm_status st = NPULM_OK;
  for (int32_t i = 0; i < g0->n_nodes && st == NPULM_OK; i++) {
    const struct npu_ir_node *n = &g0->nodes[i];
    if (n->layer != layer || n->backend != NPU_BE_NPU || n->op == NPU_OP_TRANSFER) continue;
    st = make_site(m, p, g0, n, cal, o, pool, err);
  }
  return st;
}

/* Whether weight 'wi' is of block 'l' (its name "blk.L.*"). */
static bool of_layer(const struct npu_program *p, int32_t wi, int32_t l) {
  char prefix[24];
  int len = snprintf(prefix, sizeof(prefix), "blk.%d.", (int)l);
  return strncmp(p->weights[wi].name, prefix, (size_t)len) == 0;
}

/* A streaming compile reads the matrices of block 'l' into memory the program owns (so that
 * SmoothQuant rewrites them in place), and lets go of them once the block's sites are made
 * (release_layer). */
static npulm_status acquire_layer(const struct npulm_model *m, struct npu_program *p, int32_t l,
                                  npulm_error *err) {
  for (int32_t i = 0; i < p->n_weights; i++) {
    struct npu_weight *w = &p->weights[i];
    if (w->data != NULL || !w->deferred || !of_layer(p, i, l)) continue;
    float **grown = realloc(p->owned, (size_t)(p->n_owned + 1) * sizeof(*grown));
    if (grown == NULL) return npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
    p->owned = grown;
    float *rows = malloc((size_t)w->ne0 * (size_t)w->ne1 * sizeof(float));
    if (rows == NULL) return npu_fail(err, NPULM_ERR_NOMEM, "out of memory reading '%s'", w->name);
    p->owned[p->n_owned++] = rows;
    w->data = rows;
    npulm_status st = npu_model_read_rows(m, w->name, 0, (uint64_t)w->ne1, rows, err);
    if (st != NPULM_OK) return st;
  }
  return NPULM_OK;
}

static void release_layer(struct npu_program *p, int32_t l) {
  for (int32_t i = 0; i < p->n_weights; i++) {
    struct npu_weight *w = &p->weights[i];
    if (w->data == NULL || !w->deferred || !of_layer(p, i, l)) continue;
    for (int32_t k = 0; k < p->n_owned; k++) {
      if (p->owned[k] != w->data) continue;
      free(p->owned[k]);
      p->owned[k] = p->owned[--p->n_owned];
      break;
    }
    w->data = NULL;
  }
}

/* The weight that the op writing the tensor of 'role' (outside the blocks) reads, as rows for
 * calibration (npu_calib_rows_fn). */
struct rows_source {
  const struct npulm_model *m;
  const struct npu_program *p;
  int32_t wi;
};

static npulm_status source_rows(void *user, int64_t row0, int64_t n_rows, float *scratch,
                                const float **rows_out, npulm_error *err) {
  const struct rows_source *src = user;
  return weight_rows(src->m, src->p, src->wi, (size_t)row0, (size_t)n_rows, scratch, rows_out, err);
}

/* Bytes a streaming compile's spill file needs: every matrix packed for its matmul, the
 * embedding once more as the gather's table, each 64-byte aligned. */
static size_t spill_bound(const struct npu_program *p) {
  const int32_t embd = npu_ir_weight_of(&p->graphs[0], -1, NPU_ROLE_EMBD, 1);
  size_t total = 0;
  for (int32_t i = 0; i < p->n_weights; i++) {
    const struct npu_weight *w = &p->weights[i];
    bool seen = w->ne1 < 2;
    for (int32_t j = 0; j < i && !seen; j++) seen = strcmp(p->weights[j].name, w->name) == 0;
    if (!seen) total += npu_qs8_gemm_packed_size((size_t)w->ne1, (size_t)w->ne0) + 64;
  }
  if (embd >= 0) total += (size_t)p->weights[embd].ne0 * (size_t)p->weights[embd].ne1 + 64;
  return total;
}

/* Calibrate block 'l' and quantize it: with SmoothQuant, first over the model as read ('plain'),
 * whose statistics give the factors, then over the smoothed block ('final'), whose statistics the
 * quantization takes. */
static npulm_status quantize_layer(const struct npulm_model *m, struct npu_program *p,
                                   struct npu_calib_run *plain, struct npu_calib_run *final,
                                   const struct npu_quant_options *o, struct npu_pool *pool,
                                   int32_t l, int32_t *outliers, npulm_error *err) {
  struct npu_layer_weights lw;
  npulm_status st = acquire_layer(m, p, l, err);
  if (st == NPULM_OK && plain != NULL) {
    layer_view(p, l, &lw);
    if ((st = npu_calib_layer(plain, &lw, m->w.rope_freqs, l, err)) == NPULM_OK) {
      st = npu_smooth_layer(m, p, npu_calib_run_stats(plain), o->smooth_alpha, l, err);
    }
  }
  if (st == NPULM_OK) {
    layer_view(p, l, &lw);
    st = npu_calib_layer(final, &lw, m->w.rope_freqs, l, err);
  }
  const struct npu_calib *cal = npu_calib_run_stats(final);
  if (st == NPULM_OK) st = quantize_tensors(m, p, cal, o, l, false, outliers, err);
  if (st == NPULM_OK) st = quantize_sites(m, p, cal, o, pool, l, err);
  release_layer(p, l);
  return st;
}

npulm_status npu_quantize_program(const struct npulm_model *m, struct npu_program *p,
                                  const int32_t *tokens, size_t n_tokens, int32_t bos,
                                  const struct npu_quant_options *o,
                                  npulm_phase_progress_fn progress, void *user, npulm_error *err) {
  enum { WINDOW = 256 };
  if (o->mode == NPU_QUANT_F32) return NPULM_OK;
  if (npu_quant_float_ops(o->mode, p->opts.float_ops) != p->opts.float_ops) {
    return npu_fail(err, NPULM_ERR_ARG, "%s needs a program compiled with its norms in float",
                    npu_quant_mode_name(o->mode));
  }
  if (npu_quant_act_bits(o->mode) == 16 && !npu_attention_fused(p->opts.float_ops)) {
    return npu_fail(err, NPULM_ERR_UNSUPPORTED,
                    "%s computes attention in float (the default --float-ops): the integer "
                    "NPU's attention reads int8 queries and caches",
                    npu_quant_mode_name(o->mode));
  }
  const struct npu_config *c = &m->cfg;
  const struct npu_graph *g0 = &p->graphs[0];
  struct npu_pool *pool = NULL;
  struct npu_calib_run *plain = NULL, *final = NULL;
  int32_t *outliers = NULL;
  long cpus = o->n_threads > 0 ? o->n_threads : sysconf(_SC_NPROCESSORS_ONLN);
  int threads = cpus < 1 ? 1 : cpus > 64 ? 64 : (int)cpus;
  npulm_status st = npu_pool_create(threads, threads - 1, &pool, err);
  if (st != NPULM_OK) return st;
  /* room for a shadow sum per matmul and two tensors per shadow, and for the row copy of the
   * graphs for generation (add_row_copies) */
  p->qtensors = calloc(3 * (size_t)g0->n_tensors + 2, sizeof(*p->qtensors));
  p->qsites = calloc(2 * (size_t)g0->n_nodes + 2, sizeof(*p->qsites));
  outliers = malloc((size_t)c->ffn_dim * 4 * sizeof(int32_t) + 64);
  if (p->qtensors == NULL || p->qsites == NULL || outliers == NULL) {
    st = npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
    goto done;
  }
  p->quant_mode = o->mode;
  npu_ukernels_select(npu_isa_detect(), &p->uk);
  p->smooth_alpha = o->smooth_alpha;
  p->shadow_threshold = o->shadow_threshold;
  if (o->spill_dir != NULL) {
    p->spill_size = spill_bound(p);
    p->spill = npu_pages_map_scratch(o->spill_dir, p->spill_size);
    p->qsites_mapped = true; /* the sites' packed weights are not the heap's */
    if (p->spill == NULL) {
      st = npu_fail(err, NPULM_ERR_IO,
                    "cannot write a %zu MiB scratch file for the packed weights in '%s': %s",
                    p->spill_size >> 20, o->spill_dir, strerror(errno));
      goto done;
    }
  }
  struct rows_source embd = {m, p, npu_ir_weight_of(g0, -1, NPU_ROLE_EMBD, 1)};
  struct rows_source output = {m, p, npu_ir_weight_of(g0, -1, NPU_ROLE_LOGITS, 1)};
  int32_t output_norm = npu_ir_weight_of(g0, -1, NPU_ROLE_OUTPUT_NORM, 1);
  if (embd.wi < 0 || output.wi < 0 || output_norm < 0) {
    st = npu_fail(err, NPULM_ERR_ARG, "the graph has no embedding, output norm or classifier");
    goto done;
  }
  /* the statistics of attention scores and probabilities serve only attention on the NPU */
  const bool scores = !npu_attention_fused(p->opts.float_ops);
  if ((st = npu_calib_run_create(c, tokens, n_tokens, WINDOW, bos, scores, pool, &final, err)) ||
      (npu_quant_outliers(o->mode) == NPU_OUTLIERS_SMOOTH &&
       (st = npu_calib_run_create(c, tokens, n_tokens, WINDOW, bos, scores, pool, &plain, err))) ||
      (st = npu_calib_embed(final, source_rows, &embd, err)) ||
      (plain != NULL && (st = npu_calib_embed(plain, source_rows, &embd, err))) ||
      (st = quantize_tensors(m, p, npu_calib_run_stats(final), o, -1, true, outliers, err))) {
    goto done;
  }
  /* a block at a time: only its float weights are in memory (progress: the blocks, and the head
   * as one more) */
  const uint64_t n_steps = (uint64_t)c->n_layers + 1;
  if (progress != NULL) progress(user, "quantize", "blocks", 0, n_steps);
  for (int32_t l = 0; l < c->n_layers && st == NPULM_OK; l++) {
    st = quantize_layer(m, p, plain, final, o, pool, l, outliers, err);
    if (progress != NULL) progress(user, "quantize", "blocks", (uint64_t)l + 1, n_steps);
  }
  if (st != NPULM_OK) goto done;
  /* the head: output norm, classifier (a block of rows at a time), embedding */
  const struct npu_calib *cal = npu_calib_run_stats(final);
  if ((st = npu_calib_head(final, p->weights[output_norm].data, source_rows, &output, err)) ||
      (st = quantize_tensors(m, p, cal, o, -1, false, outliers, err)) ||
      (st = quantize_sites(m, p, cal, o, pool, -1, err)) ||
      (st = add_row_copies(m, p, cal, o, err))) {
    goto done;
  }
  if (progress != NULL) progress(user, "quantize", "blocks", n_steps, n_steps);
  share_tied_tables(p);
  /* a program that will run gets its weights placed; a streaming compile's only go to a file */
  if (p->spill == NULL && (st = npu_quant_place_packed(p, err)) != NPULM_OK) goto done;
  /* shadowed matmuls: the CPU share and the sum take the matmul's quantization */
  int32_t n_sites = p->n_qsites;
  for (int32_t i = 0; i < n_sites && st == NPULM_OK; i++) {
    const struct npu_qsite *mm = &p->qsites[i];
    if (mm->op != NPU_OP_MATMUL || mm->n_outliers == 0) continue;
    const struct npu_qtensor *y = npu_program_qtensor(p, mm->name);
    char base[NPU_IR_NAME_MAX - 10];
    snprintf(base, sizeof(base), "%.*s", (int)sizeof(base) - 1, mm->name);
    struct npu_qsite *add = &p->qsites[p->n_qsites++];
    memset(add, 0, sizeof(*add));
    add->table_site = -1;
    snprintf(add->name, sizeof(add->name), "%s.shadowed", base);
    add->op = NPU_OP_ADD;
    const char *suffixes[2] = {".shadow", ".shadowed"};
    for (int k = 0; k < 2; k++) {
      struct npu_qtensor *t = &p->qtensors[p->n_qtensors++];
      *t = *y;
      snprintf(t->name, sizeof(t->name), "%s%s", base, suffixes[k]);
    }
    if (!npu_qadd_params_make(y->q.scale, y->q.zero_point, y->q.scale, y->q.zero_point, y->q.scale,
                              y->q.zero_point, y->dtype == NPU_DT_I16, &add->add)) {
      st = npu_fail(err, NPULM_ERR_ARG, "'%s': shadow sum cannot be quantized", mm->name);
    }
  }
  for (int32_t i = 0; i < p->n_graphs && st == NPULM_OK; i++) {
    if ((st = rewrite_graph(p, &p->graphs[i], err)) == NPULM_OK) {
      st = npu_quant_link(p, &p->graphs[i], err);
    }
  }
done:
  npu_calib_run_free(plain);
  npu_calib_run_free(final);
  npu_pool_free(pool);
  free(outliers);
  if (st != NPULM_OK) npu_quant_free(p);
  return st;
}
