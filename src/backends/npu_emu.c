/* The NPU executor: one node of a quantized graph, integer kernels only. */
#include "backends/npu_emu.h"

#include <assert.h>
#include <stdatomic.h>
#include <string.h>

#include "base/pool.h"

static void *addr(const struct npu_graph *g, int32_t id, uint8_t *const arena[NPU_BE_COUNT]) {
  const struct npu_ir_tensor *t = &g->tensors[id];
  return arena[t->backend] + t->offset;
}

/* A gather whose table is the packed weights of a matmul (a tied embedding): each row is read back
 * out of the packed layout a piece at a time and requantized by the gather kernel as a one-row
 * table with that row's multiplier. */
static void gather_packed(const struct npu_qsite *site, const struct npu_ukernels *uk, size_t rows,
                          size_t cols, const int32_t *ids, void *y, bool wide) {
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
 * of tiles, the kernels' widest column block pair), cut into tiles and the tiles into one range
 * per thread. A task runs its range's tiles from the front, then takes the untouched half of what
 * is left of another range, from its back, until none is left: a thread that the host delays, or
 * whose share streams slower, is helped with its last tiles, while each range is still read front
 * to back as one stream. The owner of a range takes tiles a claim at a time, each claim an atomic
 * compare-and-swap, a full barrier on x86 that waits for the loads in flight before it: a decode
 * tile at k = 768 (25 KB) is ~1 us of one thread's streaming, and claiming one at a time measured
 * ~1 % slower than CLAIM_MACS' worth (never more than a quarter of what is left, so that a
 * helper still finds half to take). */
enum {
  TILE = 2 * NPU_QS8_GEMM_NR,
  MAX_RANGES = 64,              /* threads past the 64th only help with the other loops */
  CLAIM_MACS = 16 * TILE * 768, /* 16 tiles of a decode step at k = 768: ~400 KB of weights */
};

struct range {
  _Alignas(64) _Atomic uint64_t todo; /* (next tile << 32) | end tile: [next, end) not taken */
};

struct matmul_group {
  const struct npu_ukernels *uk;
  const int8_t *x;    /* the input: int8, */
  const int16_t *x16; /* or int16 (then x is NULL) */
  size_t rows, k, total;
  int32_t count;
  struct {
    const struct npu_qsite *site;
    void *y;
    size_t cols, at; /* its columns and where they start in the group's */
    bool wide;
  } mm[NPU_MATMUL_GROUP_MAX];
  size_t n_ranges;
  struct range *ranges; /* (n_ranges) on the caller's stack, set up for this loop only */
  uint32_t claim;       /* tiles an owner takes at once, at most */
};

/* Columns [a, b) of the group: a piece of each member they cross. */
static void run_cols(const struct matmul_group *mg, size_t a, size_t b) {
  for (int32_t i = 0; i < mg->count; i++) {
    const size_t at = mg->mm[i].at, end = at + mg->mm[i].cols;
    if (b <= at || a >= end) continue;
    const size_t n0 = (a > at ? a : at) - at, n1 = (b < end ? b : end) - at;
    const struct npu_qsite *site = mg->mm[i].site;
    void *y = mg->mm[i].y;
    const size_t rows = mg->rows, k = mg->k, cols = mg->mm[i].cols;
    if (mg->x16 != NULL) { /* an int16 input: int16 output */
      if (site->w_bits == 8) {
        mg->uk->qs16_gemm_qs16(rows, n0, n1, k, mg->x16, k, site->packed, y, cols, &site->gemm16);
      } else {
        mg->uk->qs16_qc4w_gemm_qs16(rows, n0, n1, k, mg->x16, k, site->packed, y, cols,
                                    &site->gemm16);
      }
    } else if (site->w_bits == 8) {
      if (mg->mm[i].wide) {
        mg->uk->qs8_gemm_qs16(rows, n0, n1, k, mg->x, k, site->packed, y, cols, &site->gemm);
      } else {
        mg->uk->qs8_gemm(rows, n0, n1, k, mg->x, k, site->packed, y, cols, &site->gemm);
      }
    } else if (mg->mm[i].wide) {
      mg->uk->qs8_qc4w_gemm_qs16(rows, n0, n1, k, mg->x, k, site->packed, y, cols, &site->gemm);
    } else {
      mg->uk->qs8_qc4w_gemm(rows, n0, n1, k, mg->x, k, site->packed, y, cols, &site->gemm);
    }
  }
}

/* Take tiles of range 'r': as its owner ('claim' > 0) its next ones, up to 'claim' and a quarter
 * of what is left (at least one), else half of what is left (at least one) from its end. Sets
 * [*t0, *t1) and returns true, or returns false when none is left. */
static bool take_tiles(struct range *r, uint32_t claim, size_t *t0, size_t *t1) {
  uint64_t v = atomic_load_explicit(&r->todo, memory_order_relaxed);
  for (;;) {
    const uint32_t next = (uint32_t)(v >> 32), end = (uint32_t)v;
    if (next >= end) return false;
    const bool owner = claim > 0;
    const uint32_t quarter = (end - next + 3) / 4;
    const uint32_t n = !owner ? (end - next + 1) / 2 : claim < quarter ? claim : quarter;
    const uint64_t left = owner ? v + ((uint64_t)n << 32) : v - n;
    if (atomic_compare_exchange_weak_explicit(&r->todo, &v, left, memory_order_relaxed,
                                              memory_order_relaxed)) {
      *t0 = owner ? next : end - n;
      *t1 = owner ? next + n : end;
      return true;
    }
  }
}

/* A task starts on the range of its thread's lane (npu_pool_lane), so each thread takes the same
 * range loop after loop and writes the same outputs step after step. By task number, range 0
 * went to whichever thread claimed first: the threads swapped in 30 % of stories110M's decode
 * loops, and fixing them measured x1.009-x1.021 on decode with the two threads on different
 * core complexes (x0.996-x1.004 on one). */
static void group_task(void *arg, size_t task) {
  struct matmul_group *mg = arg;
  const size_t lane = npu_pool_lane(), first = lane < mg->n_ranges ? lane : task;
  size_t t0, t1;
  for (size_t i = 0; i < mg->n_ranges; i++) {
    struct range *r = &mg->ranges[(first + i) % mg->n_ranges];
    while (take_tiles(r, i == 0 ? mg->claim : 0, &t0, &t1)) {
      const size_t b = t1 * TILE < mg->total ? t1 * TILE : mg->total;
      run_cols(mg, t0 * TILE, b);
    }
  }
}

int32_t npu_emu_matmul_group(const struct npu_graph *g, int32_t first, int32_t end) {
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

void npu_emu_exec_matmuls(const struct npu_graph *g, int32_t first, int32_t count,
                          const struct npu_qsite *sites, const struct npu_ukernels *uk,
                          struct npu_pool *pool, uint8_t *const arena[NPU_BE_COUNT]) {
  const struct npu_ir_node *n = &g->nodes[first];
  const struct npu_ir_tensor *x = &g->tensors[n->in[0]];
  const bool x16 = x->dtype == NPU_DT_I16;
  struct matmul_group mg = {.uk = uk,
                            .x = x16 ? NULL : addr(g, n->in[0], arena),
                            .x16 = x16 ? addr(g, n->in[0], arena) : NULL,
                            .rows = (size_t)x->ne[0],
                            .k = (size_t)x->ne[1],
                            .count = count};
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
  const size_t tiles = (mg.total + TILE - 1) / TILE;
  const int threads = npu_pool_threads(pool);
  struct range ranges[MAX_RANGES];
  mg.ranges = ranges;
  const size_t tile_macs = mg.rows * TILE * mg.k;
  mg.claim = tile_macs < CLAIM_MACS ? (uint32_t)(CLAIM_MACS / tile_macs) : 1;
  mg.n_ranges = threads < MAX_RANGES ? (size_t)threads : MAX_RANGES;
  if (mg.n_ranges > tiles) mg.n_ranges = tiles;
  const size_t per = (tiles + mg.n_ranges - 1) / mg.n_ranges;
  for (size_t r = 0; r < mg.n_ranges; r++) {
    const size_t t0 = r * per < tiles ? r * per : tiles, t1 = t0 + per < tiles ? t0 + per : tiles;
    atomic_init(&ranges[r].todo, (uint64_t)t0 << 32 | t1);
  }
  npu_pool_run(pool, mg.n_ranges, group_task, &mg);
}

/* Address of outer row 'r' of activation 'id' (rows of ne[1] * ne[2] elements of its dtype). */
static void *row_addr(const struct npu_graph *g, int32_t id, uint8_t *const arena[NPU_BE_COUNT],
                      int32_t r) {
  const struct npu_ir_tensor *t = &g->tensors[id];
  const size_t row = (size_t)t->ne[1] * (size_t)t->ne[2];
  return (uint8_t *)addr(g, id, arena) + (size_t)r * row * npu_dtype_size((enum npu_dtype)t->dtype);
}

void npu_emu_exec_rows(const struct npu_graph *g, const struct npu_ir_node *n,
                       const struct npu_qsite *site, const struct npu_ukernels *uk,
                       uint8_t *const arena[NPU_BE_COUNT], int32_t r0, int32_t r1) {
  const struct npu_ir_tensor *out = &g->tensors[n->out];
  const size_t rows = (size_t)(r1 - r0), cols = (size_t)out->ne[1] * (size_t)out->ne[2];
  const size_t count = rows * cols;
  void *y = row_addr(g, n->out, arena, r0);
  const void *a = row_addr(g, n->in[0], arena, r0);
  switch ((enum npu_op)n->op) {
  case NPU_OP_ADD: {
    const void *b = row_addr(g, n->in[1], arena, r0);
    if (out->dtype == NPU_DT_I16) uk->qs16_vadd(count, a, b, y, &site->add);
    else uk->qs8_vadd(count, a, b, y, &site->add);
    return;
  }
  case NPU_OP_MUL: {
    const void *b = row_addr(g, n->in[1], arena, r0);
    if (out->dtype == NPU_DT_I16) uk->qs16_vmul(count, a, b, y, &site->mul);
    else uk->qs8_vmul(count, a, b, y, &site->mul);
    return;
  }
  case NPU_OP_SILU:
    if (out->dtype == NPU_DT_I16) uk->qs16_lut(count, a, y, site->lut16);
    else uk->x8_lut(count, a, y, site->lut);
    return;
  case NPU_OP_RMSNORM:
    assert(out->ne[2] == 1);
    if (out->dtype == NPU_DT_I16) uk->qs16_rmsnorm_qs16(rows, cols, a, y, &site->rmsnorm);
    else uk->qs16_rmsnorm_qs8(rows, cols, a, y, &site->rmsnorm);
    return;
  default: assert(!"not a row-wise op (ir/ops.inc)");
  }
}

void npu_emu_exec_node(const struct npu_graph *g, const struct npu_ir_node *n,
                       const struct npu_qsite *site, const struct npu_ukernels *uk,
                       uint8_t *const arena[NPU_BE_COUNT], const int32_t *ids, int32_t pos0,
                       int32_t n_valid) {
  const struct npu_ir_tensor *out = &g->tensors[n->out];
  size_t rows = (size_t)out->ne[0], cols = (size_t)out->ne[1];
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
  case NPU_OP_LAST_ROW: {
    /* the step's last real row: n_valid - 1 of the input's rows */
    const size_t row = cols * npu_dtype_size((enum npu_dtype)out->dtype);
    memcpy(y, (const uint8_t *)addr(g, n->in[0], arena) + (size_t)(n_valid - 1) * row, row);
    return;
  }
  case NPU_OP_QK: {
    /* q [rows, heads * hd], K copy [ctx, kv_dim] -> scores [heads, rows, ctx] */
    const struct npu_ir_tensor *q = &g->tensors[n->in[0]], *k = &g->tensors[n->in[1]];
    const int32_t heads = out->ne[0], hd = q->ne[1] / heads;
    const struct npu_attn_shape shape = {heads,      k->ne[1] / hd, hd,     out->ne[1],
                                         out->ne[2], pos0,          n_valid};
    uk->qs8_qk_qs16(&shape, addr(g, n->in[0], arena), addr(g, n->in[1], arena), y, &site->qk);
    return;
  }
  case NPU_OP_SOFTMAX: {
    const struct npu_attn_shape shape = {out->ne[0], out->ne[0], 1,      out->ne[1],
                                         out->ne[2], pos0,       n_valid};
    uk->qs16_softmax(&shape, addr(g, n->in[0], arena), y, &site->softmax);
    return;
  }
  case NPU_OP_PV: {
    /* probabilities [heads, rows, ctx], V copy [ctx, kv_dim] -> out [rows, heads * hd] */
    const struct npu_ir_tensor *pr = &g->tensors[n->in[0]], *v = &g->tensors[n->in[1]];
    const int32_t heads = pr->ne[0], hd = out->ne[1] / heads;
    const struct npu_attn_shape shape = {heads,     v->ne[1] / hd, hd,     pr->ne[1],
                                         pr->ne[2], pos0,          n_valid};
    uk->qs16_pv_qs8(&shape, addr(g, n->in[0], arena), addr(g, n->in[1], arena), y, &site->pv);
    return;
  }
  default:
    assert(!"op without an integer kernel (the quantizer rejects it), or a row-wise one "
            "(npu_emu_exec_rows runs those)");
  }
}
