/* The NPU executor: one node of a quantized graph, integer kernels only. */
#include "npu/executor.h"

#include <assert.h>

#include "runtime/pool.h"

static void *addr(const struct npu_graph *g, int32_t id, uint8_t *const arena[NPU_BE_COUNT]) {
  const struct npu_ir_tensor *t = &g->tensors[id];
  return arena[t->backend] + t->offset;
}

/* A gather whose table is the packed weights of a matmul (a tied embedding): each row is read back
 * out of the packed layout a piece at a time and requantized by the gather kernel as a one-row
 * table with that row's multiplier. */
static void gather_packed(const struct npu_qsite *site, const struct npu_ukernels *uk,
                          size_t rows, size_t cols, const int32_t *ids, void *y, bool wide) {
  enum { PIECE = 1024 };
  int8_t row[PIECE];
  const int32_t first = 0;
  for (size_t t = 0; t < rows; t++) {
    const int32_t id = ids[t];
    assert(id >= 0 && id < site->n);
    const struct npu_qs8_gather_params one = {site->mult + id, site->shift + id,
                                              site->gather.y_zero_point};
    for (size_t c0 = 0; c0 < cols; c0 += PIECE) {
      const size_t c1 = c0 + PIECE < cols ? c0 + PIECE : cols;
      npu_qs8_gemm_unpack_row((size_t)site->k, site->packed, (size_t)id, c0, c1, row);
      if (wide) {
        uk->qs8_gather_qs16(1, &first, 1, c1 - c0, row, (int16_t *)y + t * cols + c0, cols, &one);
      } else {
        uk->qs8_gather(1, &first, 1, c1 - c0, row, (int8_t *)y + t * cols + c0, cols, &one);
      }
    }
  }
}

/* Matmuls on one input run as one loop: their columns laid end to end (each from a whole number
 * of the kernels' widest column tile, two packed blocks), cut into ranges, one per pool task; a
 * range that crosses from one matmul into the next runs a piece of each. */
struct matmul_group {
  const struct npu_ukernels *uk;
  const int8_t *x;
  size_t rows, k, total, cols_per_task;
  int32_t count;
  struct {
    const struct npu_qsite *site;
    void *y;
    size_t cols, at; /* its columns and where they start in the group's */
    bool wide;
  } mm[NPU_MATMUL_GROUP_MAX];
};

enum { TILE = 2 * NPU_QS8_GEMM_NR };

static void group_task(void *arg, size_t task) {
  const struct matmul_group *mg = arg;
  const size_t a = task * mg->cols_per_task;
  const size_t b = a + mg->cols_per_task < mg->total ? a + mg->cols_per_task : mg->total;
  for (int32_t i = 0; i < mg->count; i++) {
    const size_t at = mg->mm[i].at, end = at + mg->mm[i].cols;
    if (b <= at || a >= end) continue;
    const size_t n0 = (a > at ? a : at) - at, n1 = (b < end ? b : end) - at;
    const struct npu_qsite *site = mg->mm[i].site;
    if (mg->mm[i].wide) {
      mg->uk->qs8_gemm_qs16(mg->rows, n0, n1, mg->k, mg->x, mg->k, site->packed, mg->mm[i].y,
                            mg->mm[i].cols, &site->gemm);
    } else {
      mg->uk->qs8_gemm(mg->rows, n0, n1, mg->k, mg->x, mg->k, site->packed, mg->mm[i].y,
                       mg->mm[i].cols, &site->gemm);
    }
  }
}

/* Columns per task, a whole number of tiles. Prefill: a few tasks per thread, so that a
 * descheduled thread delays little. Decode: one per thread, so that each thread reads its share of
 * the weights as one stream; several shorter ones each start the hardware prefetcher over
 * (stories110M's 85 decode matmuls from both threads, in this host's fast bandwidth state: 89 % of
 * a plain read's rate with four tasks per thread, 94 % with one). */
static size_t cols_per_task(size_t rows, size_t cols, int threads) {
  enum { TASKS_PER_THREAD = 4 };
  if (threads <= 1) return cols;
  size_t tasks = (size_t)threads * (rows == 1 ? 1 : TASKS_PER_THREAD);
  size_t per = (cols + tasks - 1) / tasks;
  return (per + TILE - 1) / TILE * TILE;
}

int32_t npu_npu_matmul_group(const struct npu_graph *g, int32_t first, int32_t end) {
  const struct npu_ir_node *n = &g->nodes[first];
  if (g->node_site == NULL || n->backend != NPU_BE_NPU || n->op != NPU_OP_MATMUL) return 1;
  int32_t count = 1;
  while (count < NPU_MATMUL_GROUP_MAX && first + count < end) {
    const struct npu_ir_node *m = &g->nodes[first + count];
    if (m->backend != NPU_BE_NPU || m->op != NPU_OP_MATMUL || m->in[0] != n->in[0]) break;
    count++;
  }
  return count;
}

void npu_npu_exec_matmuls(const struct npu_graph *g, int32_t first, int32_t count,
                          const struct npu_qsite *sites, const struct npu_ukernels *uk,
                          struct npu_pool *pool, uint8_t *const arena[NPU_BE_COUNT]) {
  const struct npu_ir_node *n = &g->nodes[first];
  const struct npu_ir_tensor *x = &g->tensors[n->in[0]];
  struct matmul_group mg = {.uk = uk, .x = addr(g, n->in[0], arena), .rows = (size_t)x->ne[0],
                            .k = (size_t)x->ne[1], .count = count};
  assert(count >= 1 && count <= NPU_MATMUL_GROUP_MAX);
  for (int32_t i = 0; i < count; i++) {
    const struct npu_ir_tensor *out = &g->tensors[n[i].out];
    mg.mm[i].site = &sites[g->node_site[first + i]];
    assert(n[i].in[0] == n->in[0] && (size_t)mg.mm[i].site->k == mg.k);
    mg.mm[i].y = addr(g, n[i].out, arena);
    mg.mm[i].cols = (size_t)out->ne[1];
    mg.mm[i].at = (mg.total + TILE - 1) / TILE * TILE;
    mg.mm[i].wide = out->dtype == NPU_DT_I16;
    mg.total = mg.mm[i].at + mg.mm[i].cols;
  }
  mg.cols_per_task = cols_per_task(mg.rows, mg.total, npu_pool_threads(pool));
  npu_pool_run(pool, (mg.total + mg.cols_per_task - 1) / mg.cols_per_task, group_task, &mg);
}

void npu_npu_exec_node(const struct npu_graph *g, const struct npu_ir_node *n,
                       const struct npu_qsite *site, const struct npu_ukernels *uk,
                       uint8_t *const arena[NPU_BE_COUNT], const int32_t *ids, int32_t pos0,
                       int32_t n_valid) {
  const struct npu_ir_tensor *out = &g->tensors[n->out];
  size_t rows = (size_t)out->ne[0], cols = (size_t)out->ne[1];
  size_t count = rows * cols * (size_t)out->ne[2];
  void *y = addr(g, n->out, arena);
  bool wide = out->dtype == NPU_DT_I16;
  switch ((enum npu_op)n->op) {
  case NPU_OP_GATHER:
    if (site->table_site >= 0) {
      gather_packed(site, uk, rows, cols, ids, y, wide);
      return;
    }
    if (wide) {
      uk->qs8_gather_qs16(rows, ids, (size_t)site->n, cols, site->packed, y, cols, &site->gather);
    } else {
      uk->qs8_gather(rows, ids, (size_t)site->n, cols, site->packed, y, cols, &site->gather);
    }
    return;
  case NPU_OP_ADD:
    if (wide) uk->qs16_vadd(count, addr(g, n->in[0], arena), addr(g, n->in[1], arena), y, &site->add);
    else uk->qs8_vadd(count, addr(g, n->in[0], arena), addr(g, n->in[1], arena), y, &site->add);
    return;
  case NPU_OP_MUL:
    uk->qs8_vmul(count, addr(g, n->in[0], arena), addr(g, n->in[1], arena), y, &site->mul);
    return;
  case NPU_OP_SILU:
    uk->x8_lut(count, addr(g, n->in[0], arena), y, site->lut);
    return;
  case NPU_OP_QK: {
    /* q [rows, heads * hd], K copy [ctx, kv_dim] -> scores [heads, rows, ctx] */
    const struct npu_ir_tensor *q = &g->tensors[n->in[0]], *k = &g->tensors[n->in[1]];
    const int32_t heads = out->ne[0], hd = q->ne[1] / heads;
    const struct npu_attn_shape shape = {heads, k->ne[1] / hd, hd, out->ne[1], out->ne[2], pos0,
                                         n_valid};
    uk->qs8_qk_qs16(&shape, addr(g, n->in[0], arena), addr(g, n->in[1], arena), y, &site->qk);
    return;
  }
  case NPU_OP_SOFTMAX: {
    const struct npu_attn_shape shape = {out->ne[0], out->ne[0], 1, out->ne[1], out->ne[2], pos0,
                                         n_valid};
    uk->qs16_softmax(&shape, addr(g, n->in[0], arena), y, &site->softmax);
    return;
  }
  case NPU_OP_PV: {
    /* probabilities [heads, rows, ctx], V copy [ctx, kv_dim] -> out [rows, heads * hd] */
    const struct npu_ir_tensor *pr = &g->tensors[n->in[0]], *v = &g->tensors[n->in[1]];
    const int32_t heads = pr->ne[0], hd = out->ne[1] / heads;
    const struct npu_attn_shape shape = {heads, v->ne[1] / hd, hd, pr->ne[1], pr->ne[2], pos0,
                                         n_valid};
    uk->qs16_pv_qs8(&shape, addr(g, n->in[0], arena), addr(g, n->in[1], arena), y, &site->pv);
    return;
  }
  default:
    assert(!"op without an integer kernel: the quantizer rejects it");
  }
}
