/* Input-sparse decode (sparse_input.h). */
#include "backends/sparse_input.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "backends/npu_emu.h"
#include "base/common.h"
#include "base/pool.h"
#include "kernels/npu/fixedpoint.h" /* npu_narrow */

/* Channels a GEMV call adds into int32 before an int16 input's sums are widened to int64: every
 * partial sum then stays below 2^31 (512 x 32768 x 127 for int8 weights; 16 blocks of 32 x 15 x
 * 32768 x 8 for int4 ones), as npu_qcol8_gemv / npu_qcol4_gemv require. An int8 input's
 * |d| <= 255 never needs it (32768 x 255 x 127 < 2^31). */
enum { WIDEN_CHANNELS = 512, MAX_GROUP = NPU_MATMUL_GROUP_MAX };

/* A sparsified matmul's channel-major weights. */
struct site_cols {
  void *cols;    /* k rows of row_bytes (npu_qcol8/4_from_packed) */
  uint8_t *q;    /* w_block 32: the block scales [ceil(k / 32)][np]; else NULL */
  int32_t *bias; /* (n) as packed */
  size_t np, row_bytes;
};

/* One member's kept channels in a step. */
struct kept {
  int32_t *idx;         /* (k) ascending */
  int16_t *d;           /* (k) their x - zero point */
  int32_t *block_start; /* (ceil(k / 32) + 1) w_block 32: where block b's channels start */
  size_t count;
};

struct npu_input_run {
  const struct npu_program *prog;
  struct site_cols *sites; /* (n_qsites); cols NULL where the site is dense */
  int n_tasks;
  size_t max_np, max_k;
  struct kept kept[MAX_GROUP];
  int32_t *acc32; /* (n_tasks, max_np) */
  int64_t *acc64; /* (n_tasks, max_np) */
  struct npu_input_stats stats;
};

void npu_input_run_free(struct npu_input_run *r) {
  if (r == NULL) return;
  for (int32_t i = 0; r->sites != NULL && i < r->prog->n_qsites; i++) {
    free(r->sites[i].cols);
    free(r->sites[i].q);
    free(r->sites[i].bias);
  }
  free(r->sites);
  for (int i = 0; i < MAX_GROUP; i++) {
    free(r->kept[i].idx);
    free(r->kept[i].d);
    free(r->kept[i].block_start);
  }
  free(r->acc32);
  free(r->acc64);
  free(r);
}

static npulm_status prepare_site(const struct npu_qsite *s, struct site_cols *sc,
                                 npulm_error *err) {
  const size_t n = (size_t)s->n, k = (size_t)s->k;
  sc->np = npu_qcol_np(n);
  sc->row_bytes = npu_qcol_row_bytes(n, s->w_bits);
  sc->cols = malloc(npu_qcol_size(n, k, s->w_bits));
  sc->bias = malloc(n * sizeof(int32_t));
  const size_t kb = (k + NPU_QC4W_BLOCK - 1) / NPU_QC4W_BLOCK;
  if (s->w_bits == 4 && s->w_block != 0) sc->q = malloc(kb * sc->np);
  if (sc->cols == NULL || sc->bias == NULL || (s->w_bits == 4 && s->w_block != 0 && sc->q == NULL))
    return npu_fail(err, NPULM_ERR_NOMEM, "out of memory for the channel-major weights");
  bool ok;
  if (s->w_bits == 8) {
    ok = npu_qcol8_from_packed(n, k, s->packed, sc->cols);
    for (size_t j = 0; j < n; j++) sc->bias[j] = npu_qs8_gemm_bias(k, s->packed, j);
  } else {
    ok = npu_qcol4_from_packed(n, k, s->w_block, s->packed, sc->cols, sc->q);
    for (size_t j = 0; j < n; j++) sc->bias[j] = npu_qc4w_gemm_bias(k, s->w_block, s->packed, j);
  }
  if (!ok) return npu_fail(err, NPULM_ERR_NOMEM, "out of memory for the channel-major weights");
  return NPULM_OK;
}

npulm_status npu_input_run_create(const struct npu_program *p, int n_threads,
                                  struct npu_input_run **out, uint64_t *bytes_out,
                                  npulm_error *err) {
  *out = NULL;
  struct npu_input_run *r = calloc(1, sizeof(*r));
  if (r == NULL) return npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
  r->prog = p;
  r->n_tasks = n_threads > 0 ? n_threads : 1;
  r->sites = calloc((size_t)p->n_qsites, sizeof(*r->sites));
  npulm_status st = r->sites != NULL ? NPULM_OK : npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
  uint64_t bytes = 0;
  for (int32_t i = 0; st == NPULM_OK && i < p->n_qsites; i++) {
    const struct npu_qsite *s = &p->qsites[i];
    if (s->skip_below <= 0 || s->op != NPU_OP_MATMUL) continue;
    st = prepare_site(s, &r->sites[i], err);
    bytes += npu_qcol_size((size_t)s->n, (size_t)s->k, s->w_bits);
    if (r->sites[i].np > r->max_np) r->max_np = r->sites[i].np;
    if ((size_t)s->k > r->max_k) r->max_k = (size_t)s->k;
  }
  for (int i = 0; st == NPULM_OK && i < MAX_GROUP; i++) {
    struct kept *kp = &r->kept[i];
    kp->idx = malloc((r->max_k + 1) * sizeof(int32_t));
    kp->d = malloc((r->max_k + 1) * sizeof(int16_t));
    kp->block_start = malloc((r->max_k / NPU_QC4W_BLOCK + 2) * sizeof(int32_t));
    if (kp->idx == NULL || kp->d == NULL || kp->block_start == NULL)
      st = npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
  }
  if (st == NPULM_OK) {
    const size_t cells = (size_t)r->n_tasks * (r->max_np > 0 ? r->max_np : 1);
    r->acc32 = malloc(cells * sizeof(int32_t));
    r->acc64 = malloc(cells * sizeof(int64_t));
    if (r->acc32 == NULL || r->acc64 == NULL) st = npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
  }
  if (st != NPULM_OK) {
    npu_input_run_free(r);
    return st;
  }
  if (bytes_out != NULL) *bytes_out = bytes;
  *out = r;
  return NPULM_OK;
}

bool npu_input_run_covers(const struct npu_input_run *r, const struct npu_graph *g, int32_t first,
                          int32_t count) {
  if (g->rows != 1 || g->node_site == NULL || count > MAX_GROUP) return false;
  for (int32_t i = first; i < first + count; i++) {
    const int32_t site = g->node_site[i];
    if (g->nodes[i].op != NPU_OP_MATMUL || site < 0 || r->sites[site].cols == NULL) return false;
  }
  return true;
}

/* The channels of input x (k values, int8 with zero point zx, or int16 when x16) that site 's'
 * keeps: |d| >= its skip_below, and its shadow outliers. */
static void select_channels(const struct npu_qsite *s, const int8_t *x8, const int16_t *x16,
                            size_t k, struct kept *kp) {
  const int32_t below = s->skip_below, zx = x16 != NULL ? 0 : s->gemm.x_zero_point;
  size_t count = 0;
  if (s->n_outliers == 0) {
    /* branchless: every channel is written, the count moves past the kept ones (half of them
     * at 50 %: a branch would mispredict every other channel) */
    const int32_t lo = -below; /* kept: d <= lo or d >= below */
    if (x16 != NULL) {
      for (size_t c = 0; c < k; c++) {
        const int32_t d = x16[c];
        kp->idx[count] = (int32_t)c;
        kp->d[count] = (int16_t)d;
        count += (size_t)((d >= below) | (d <= lo));
      }
    } else {
      for (size_t c = 0; c < k; c++) {
        const int32_t d = x8[c] - zx;
        kp->idx[count] = (int32_t)c;
        kp->d[count] = (int16_t)d;
        count += (size_t)((d >= below) | (d <= lo));
      }
    }
  } else {
    int32_t next_outlier = s->outliers[0], o = 0;
    for (size_t c = 0; c < k; c++) {
      const int32_t d = (x16 != NULL ? x16[c] : x8[c]) - zx;
      const bool outlier = (int32_t)c == next_outlier;
      if (outlier) next_outlier = ++o < s->n_outliers ? s->outliers[o] : -1;
      if (d >= below || -d >= below || outlier) {
        kp->idx[count] = (int32_t)c;
        kp->d[count++] = (int16_t)d;
      }
    }
  }
  kp->count = count;
  if (s->w_bits != 4 || s->w_block == 0) return;
  const size_t kb = (k + NPU_QC4W_BLOCK - 1) / NPU_QC4W_BLOCK;
  size_t i = 0;
  for (size_t b = 0; b <= kb; b++) {
    while (i < count && (size_t)kp->idx[i] < b * NPU_QC4W_BLOCK) i++;
    kp->block_start[b] = (int32_t)i;
  }
}

struct group_run {
  struct npu_input_run *r;
  const struct npu_graph *g;
  int32_t first, count;
  const int8_t *x8;
  const int16_t *x16;
  void *y[MAX_GROUP];
  bool wide[MAX_GROUP];
  int n_tasks;
};

/* Outputs [a, b) of member 'm' into task 't''s accumulators (starting from the bias), then
 * requantized into y by the requantization kernels. */
static void member_range(const struct group_run *gr, int32_t m, size_t a, size_t b, int t) {
  const struct npu_input_run *r = gr->r;
  const struct npu_qsite *s = &r->prog->qsites[gr->g->node_site[gr->first + m]];
  const struct site_cols *sc = &r->sites[gr->g->node_site[gr->first + m]];
  const struct kept *kp = &r->kept[m];
  const struct npu_ukernels *uk = &r->prog->uk;
  int32_t *acc = r->acc32 + (size_t)t * r->max_np;
  int64_t *acc64 = r->acc64 + (size_t)t * r->max_np;
  const size_t width = b - a, end = b < (size_t)s->n ? b : (size_t)s->n;
  const bool x16 = gr->x16 != NULL;
  /* the bias first (padded outputs past n: 0) */
  for (size_t j = 0; j < width; j++) acc[j] = a + j < end ? sc->bias[a + j] : 0;
  if (x16) {
    for (size_t j = 0; j < width; j++) acc64[j] = acc[j];
    memset(acc, 0, width * sizeof(int32_t));
  }
  const size_t kb = ((size_t)s->k + NPU_QC4W_BLOCK - 1) / NPU_QC4W_BLOCK;
  const bool blocks = s->w_bits == 4 && s->w_block != 0;
  /* calls of at most WIDEN_CHANNELS channels (int16 inputs; an int8 input's in one), each
   * widened into int64 after it */
  const size_t step = blocks ? WIDEN_CHANNELS / NPU_QC4W_BLOCK : x16 ? WIDEN_CHANNELS : kp->count;
  const size_t units = blocks ? kb : kp->count;
  for (size_t u0 = 0; u0 < units; u0 += step) {
    const size_t u1 = u0 + step < units ? u0 + step : units;
    if (blocks) {
      for (size_t blk = u0; blk < u1; blk++) {
        const size_t i0 = (size_t)kp->block_start[blk], i1 = (size_t)kp->block_start[blk + 1];
        if (i1 > i0)
          uk->qcol4_gemv(a, b, i1 - i0, kp->idx + i0, kp->d + i0, sc->cols, sc->row_bytes,
                         sc->q + blk * sc->np, acc);
      }
    } else if (s->w_bits == 8) {
      uk->qcol8_gemv(a, b, u1 - u0, kp->idx + u0, kp->d + u0, sc->cols, sc->row_bytes, acc);
    } else {
      uk->qcol4_gemv(a, b, u1 - u0, kp->idx + u0, kp->d + u0, sc->cols, sc->row_bytes, NULL, acc);
    }
    if (x16) {
      for (size_t j = 0; j < width; j++) acc64[j] += acc[j];
      memset(acc, 0, width * sizeof(int32_t));
    }
  }
  if (end <= a) return;
  if (x16) {
    for (size_t j = 0; j < end - a; j++) acc[j] = npu_narrow(acc64[j], s->gemm16.acc_shift);
    uk->qs32_requant_qs16(end - a, acc, s->mult + a, s->shift + a, s->gemm16.y_zero_point,
                          (int16_t *)gr->y[m] + a);
  } else if (gr->wide[m]) {
    uk->qs32_requant_qs16(end - a, acc, s->mult + a, s->shift + a, s->gemm.y_zero_point,
                          (int16_t *)gr->y[m] + a);
  } else {
    uk->qs32_requant_qs8(end - a, acc, s->mult + a, s->shift + a, s->gemm.y_zero_point,
                         (int8_t *)gr->y[m] + a);
  }
}

/* Task t: its share of every member's outputs, in whole NPU_QCOL_NR tiles. */
static void group_task(void *arg, size_t task) {
  const struct group_run *gr = arg;
  for (int32_t m = 0; m < gr->count; m++) {
    const size_t np = gr->r->sites[gr->g->node_site[gr->first + m]].np;
    const size_t tiles = np / NPU_QCOL_NR, n = (size_t)gr->n_tasks;
    const size_t t0 = tiles * task / n, t1 = tiles * (task + 1) / n;
    if (t1 > t0) member_range(gr, m, t0 * NPU_QCOL_NR, t1 * NPU_QCOL_NR, (int)task);
  }
}

static uint64_t member_bytes(const struct npu_input_run *r, const struct npu_qsite *s,
                             const struct kept *kp) {
  const struct site_cols *sc = &r->sites[s - r->prog->qsites];
  uint64_t bytes = (uint64_t)kp->count * sc->row_bytes + (uint64_t)s->n * sizeof(int32_t);
  if (s->w_bits == 4 && s->w_block != 0) {
    const size_t kb = ((size_t)s->k + NPU_QC4W_BLOCK - 1) / NPU_QC4W_BLOCK;
    for (size_t b = 0; b < kb; b++)
      if (kp->block_start[b + 1] > kp->block_start[b]) bytes += sc->np;
  }
  return bytes;
}

void npu_input_run_exec(struct npu_input_run *r, const struct npu_graph *g, int32_t first,
                        int32_t count, struct npu_pool *pool, uint8_t *const arena[NPU_BE_COUNT]) {
  const double t0 = npu_now();
  const struct npu_ir_tensor *xt = &g->tensors[g->nodes[first].in[0]];
  struct group_run gr = {.r = r, .g = g, .first = first, .count = count};
  const void *x = arena[xt->backend] + xt->offset;
  if (xt->dtype == NPU_DT_I16) gr.x16 = x;
  else gr.x8 = x;
  const size_t k = (size_t)xt->ne[1];
  for (int32_t m = 0; m < count; m++) {
    const struct npu_ir_tensor *yt = &g->tensors[g->nodes[first + m].out];
    gr.y[m] = arena[yt->backend] + yt->offset;
    gr.wide[m] = yt->dtype == NPU_DT_I16;
    const struct npu_qsite *s = &r->prog->qsites[g->node_site[first + m]];
    const struct npu_qsite *prev = m > 0 ? &r->prog->qsites[g->node_site[first + m - 1]] : NULL;
    /* the matmuls of one input share their threshold: one list, unless outliers differ */
    if (prev != NULL && prev->skip_below == s->skip_below && s->n_outliers == 0 &&
        prev->n_outliers == 0 && prev->w_bits == s->w_bits && prev->w_block == s->w_block) {
      struct kept *kp = &r->kept[m], *kq = &r->kept[m - 1];
      memcpy(kp->idx, kq->idx, kq->count * sizeof(int32_t));
      memcpy(kp->d, kq->d, kq->count * sizeof(int16_t));
      if (s->w_bits == 4 && s->w_block != 0)
        memcpy(kp->block_start, kq->block_start, (k / NPU_QC4W_BLOCK + 2) * sizeof(int32_t));
      kp->count = kq->count;
    } else {
      select_channels(s, gr.x8, gr.x16, k, &r->kept[m]);
    }
  }
  const double t1 = npu_now();
  const int threads = npu_pool_threads(pool);
  gr.n_tasks = threads < r->n_tasks ? threads : r->n_tasks;
  if (gr.n_tasks < 1) gr.n_tasks = 1;
  npu_pool_run(pool, (size_t)gr.n_tasks, group_task, &gr);
  struct npu_input_stats *st = &r->stats;
  for (int32_t m = 0; m < count; m++) {
    const struct npu_qsite *s = &r->prog->qsites[g->node_site[first + m]];
    st->channels += k;
    st->kept += r->kept[m].count;
    st->bytes_read += member_bytes(r, s, &r->kept[m]);
    st->bytes_dense += s->packed_size;
  }
  st->steps++;
  st->decode_matmuls++;
  st->select_s += t1 - t0;
  st->gemv_s += npu_now() - t1;
}

void npu_input_run_count_dense(struct npu_input_run *r, const struct npu_graph *g, int32_t first,
                               int32_t count) {
  if (g->rows != 1 || g->node_site == NULL) return;
  for (int32_t i = first; i < first + count; i++) {
    const uint64_t bytes = r->prog->qsites[g->node_site[i]].packed_size;
    r->stats.bytes_read += bytes;
    r->stats.bytes_dense += bytes;
  }
  r->stats.decode_matmuls++;
}

void npu_input_run_stats(const struct npu_input_run *r, struct npu_input_stats *out) {
  *out = r->stats;
}

void npu_input_run_reset_stats(struct npu_input_run *r) { memset(&r->stats, 0, sizeof(r->stats)); }
