/* The graph executor: resolves each node's tensors to addresses (arena, weight, KV cache, ids,
 * logits) and calls the kernel of its op: the NPU's integer kernels (src/kernels/npu/) for the NPU
 * nodes of a quantized program, the FP32 kernels for the rest. */
#include "backends/exec.h"

#include <assert.h>
#include <math.h>
#include <string.h>

#include "backends/npu_emu.h"
#include "backends/sparse_ffn.h"
#include "backends/sparse_input.h"
#include "base/common.h"
#include "base/pool.h"
#include "io/gguf.h"
#include "kernels/cpu/kernels.h"
#include "ref/forward.h" /* npu_ref_silu */

/* Address of tensor 'id' for this step. */
static void *tensor_data(const struct npu_graph *g, int32_t id, const struct npu_exec_ctx *ctx) {
  const struct npu_ir_tensor *t = &g->tensors[id];
  switch ((enum npu_tensor_kind)t->kind) {
  case NPU_TK_ACT: return ctx->arena[t->backend] + t->offset;
  case NPU_TK_WEIGHT: return (void *)ctx->prog->weights[t->ref].data;
  case NPU_TK_INPUT_IDS: return (void *)ctx->ids;
  case NPU_TK_KV: return t->kv_is_value ? ctx->v_cache[t->ref] : ctx->k_cache[t->ref];
  case NPU_TK_LOGITS: return ctx->logits;
  }
  assert(!"unknown tensor kind");
  return NULL;
}

/* Copy the first 'n' values of a tensor between the backends' arenas (or from a KV cache to the
 * NPU); between a float tensor and an integer one this is where the CPU quantizes (with the
 * integer tensor's scale) or dequantizes, with the conversions of 'uk'. */
static void transfer(const struct npu_cpu_ukernels *uk, const struct npu_ir_tensor *src_t,
                     const void *src, const struct npu_ir_tensor *dst_t, void *dst, size_t n) {
  if (src_t->dtype == dst_t->dtype) {
    memcpy(dst, src, n * npu_dtype_size((enum npu_dtype)dst_t->dtype));
  } else if (src_t->dtype == NPU_DT_F32 && dst_t->dtype == NPU_DT_I8) {
    uk->quantize_s8(src, n, dst_t->q.scale, dst_t->q.zero_point, dst);
  } else if (src_t->dtype == NPU_DT_F32 && dst_t->dtype == NPU_DT_I16) {
    uk->quantize_s16(src, n, dst_t->q.scale, dst_t->q.zero_point, dst);
  } else if (src_t->dtype == NPU_DT_I8 && dst_t->dtype == NPU_DT_F32) {
    uk->dequantize_s8(src, n, src_t->q.scale, src_t->q.zero_point, dst);
  } else {
    assert(src_t->dtype == NPU_DT_I16 && dst_t->dtype == NPU_DT_F32);
    uk->dequantize_s16(src, n, src_t->q.scale, src_t->q.zero_point, dst);
  }
}

/* Shadow outlier execution, CPU side: the outlier input channels' share of a matmul, in float.
 * x is the matmul's float input, or for the FFN product the FFN norm output from which the CPU
 * recomputes silu(gate) * up for just those channels. */
static void shadow(const struct npu_qsite *s, const float *x, size_t x_cols, size_t rows,
                   float *out) {
  enum { MAX_CHUNK = 64 };
  for (size_t t = 0; t < rows; t++) {
    const float *xt = x + t * x_cols;
    float *o = out + t * (size_t)s->n;
    memset(o, 0, (size_t)s->n * sizeof(float));
    for (int32_t c0 = 0; c0 < s->n_outliers; c0 += MAX_CHUNK) {
      float v[MAX_CHUNK];
      int32_t cn = s->n_outliers - c0 < MAX_CHUNK ? s->n_outliers - c0 : MAX_CHUNK;
      for (int32_t j = 0; j < cn; j++) {
        int32_t c = c0 + j;
        if (s->outlier_gate != NULL) {
          float gsum = 0.0f, usum = 0.0f;
          const float *gr = s->outlier_gate + (size_t)c * (size_t)s->outlier_dim;
          const float *ur = s->outlier_up + (size_t)c * (size_t)s->outlier_dim;
          for (int32_t i = 0; i < s->outlier_dim; i++) {
            gsum += gr[i] * xt[i];
            usum += ur[i] * xt[i];
          }
          v[j] = npu_ref_silu(gsum) * usum;
        } else {
          v[j] = xt[s->outliers[c]];
        }
      }
      for (int32_t n = 0; n < s->n; n++) {
        const float *w = s->outlier_w + (size_t)n * (size_t)s->n_outliers + (size_t)c0;
        float acc = 0.0f;
        for (int32_t j = 0; j < cn; j++) acc += w[j] * v[j];
        o[n] += acc;
      }
    }
  }
}

/* Whether node 'n' runs on the NPU's integer kernels (g->node_site: the program is quantized). */
static bool integer_node(const struct npu_graph *g, const struct npu_ir_node *n) {
  return g->node_site != NULL && n->backend == NPU_BE_NPU;
}

/* Whether node 'n' may be cut into ranges of its output's outer dimension (rows; heads of a
 * [heads, rows, ctx] tensor): each range of the output depends only on the same range of the
 * inputs and comes from the same kernel, whose elements never depend on how many rows it is
 * given, so the bits never depend on the cut. */
static bool splits_by_rows(const struct npu_graph *g, const struct npu_ir_node *n) {
  if (integer_node(g, n)) return npu_op_info((enum npu_op)n->op)->rowwise;
  switch ((enum npu_op)n->op) {
  case NPU_OP_RMSNORM:
  case NPU_OP_ROPE:
  case NPU_OP_MATMUL:
  case NPU_OP_ADD:
  case NPU_OP_MUL:
  case NPU_OP_SILU:
  case NPU_OP_ATTN: return true;
  case NPU_OP_TRANSFER: return g->tensors[n->in[0]].kind != NPU_TK_KV;
  default: return false;
  }
}

/* Rows [r0, r1) of an ATTN node: q [rows, heads * hd], K and V caches [ctx, kv_dim] -> out
 * [rows, heads * hd]. Row t of the step is row t - r0 here:
 * it sees the same keys if the cut starts at cache position pos0 + r0 with the real rows that
 * remain (a cut of padded rows: the last real row's keys). */
static void attention(const struct npu_graph *g, const struct npu_ir_node *n,
                      const struct npu_exec_ctx *ctx, int32_t r0, int32_t r1) {
  const int32_t hd = ctx->cfg->head_dim, q_cols = g->tensors[n->in[0]].ne[1];
  if (ctx->batch != NULL) {
    /* each row over its own sequence's keys, as a decode step of that sequence computes it */
    const struct npu_ir_tensor *kv_t = &g->tensors[n->in[1]];
    for (int32_t r = r0; r < r1; r++) {
      const struct npu_batch_row *b = &ctx->batch[r < ctx->n_valid ? r : ctx->n_valid - 1];
      const size_t at = (size_t)r * (size_t)q_cols;
      ctx->cpu_uk->f32_attention((float *)tensor_data(g, n->out, ctx) + at,
                                 (const float *)tensor_data(g, n->in[0], ctx) + at,
                                 b->k_cache[kv_t->ref], b->v_cache[kv_t->ref], q_cols / hd,
                                 kv_t->ne[1] / hd, hd, 1, b->pos, 1, n->param);
    }
    return;
  }
  const int32_t pos0 = ctx->pos0 + (r0 < ctx->n_valid ? r0 : ctx->n_valid - 1);
  const int32_t n_valid = r0 < ctx->n_valid ? ctx->n_valid - r0 : 1;
  float *out = (float *)tensor_data(g, n->out, ctx) + (size_t)r0 * (size_t)q_cols;
  const float *q = (const float *)tensor_data(g, n->in[0], ctx) + (size_t)r0 * (size_t)q_cols;
  ctx->cpu_uk->f32_attention(out, q, tensor_data(g, n->in[1], ctx), tensor_data(g, n->in[2], ctx),
                             q_cols / hd, g->tensors[n->in[1]].ne[1] / hd, hd, r1 - r0, pos0,
                             n_valid, n->param);
}

/* Outer rows [r0, r1) of a node that splits_by_rows. */
static void exec_rows(const struct npu_graph *g, const struct npu_ir_node *n,
                      const struct npu_exec_ctx *ctx, int32_t r0, int32_t r1) {
  if (integer_node(g, n)) {
    npu_emu_exec_rows(g, n, &ctx->prog->qsites[g->node_site[n - g->nodes]], &ctx->prog->uk,
                      ctx->arena, r0, r1);
    return;
  }
  const struct npu_ir_tensor *out_t = &g->tensors[n->out], *a_t = &g->tensors[n->in[0]];
  const size_t in_inner = (size_t)a_t->ne[1] * (size_t)a_t->ne[2];
  const size_t out_inner = (size_t)out_t->ne[1] * (size_t)out_t->ne[2];
  const size_t in_size = npu_dtype_size((enum npu_dtype)a_t->dtype);
  const size_t out_size = npu_dtype_size((enum npu_dtype)out_t->dtype);
  const int32_t rows = r1 - r0;
  void *out = (uint8_t *)tensor_data(g, n->out, ctx) + (size_t)r0 * out_inner * out_size;
  const void *a = (const uint8_t *)tensor_data(g, n->in[0], ctx) + (size_t)r0 * in_inner * in_size;
  /* the second operand: norm or matmul weights (whole), or the other operand (same rows) */
  const float *b = n->in[1] >= 0 ? tensor_data(g, n->in[1], ctx) : NULL;
  const size_t count = (size_t)rows * out_inner;
  switch ((enum npu_op)n->op) {
  case NPU_OP_RMSNORM: npu_f32_rmsnorm(out, a, b, rows, a_t->ne[1], n->param); return;
  case NPU_OP_ROPE:
    if (ctx->batch == NULL) {
      ctx->cpu_uk->f32_rope(out, a, ctx->rope_cos, ctx->rope_sin, ctx->cfg, rows,
                            a_t->ne[1] / ctx->cfg->head_dim, ctx->pos0 + r0);
      return;
    }
    for (int32_t r = r0; r < r1; r++) { /* each row at its own sequence's position */
      const struct npu_batch_row *b = &ctx->batch[r < ctx->n_valid ? r : ctx->n_valid - 1];
      ctx->cpu_uk->f32_rope((float *)out + (size_t)(r - r0) * out_inner,
                            (const float *)a + (size_t)(r - r0) * in_inner, b->rope_cos,
                            b->rope_sin, ctx->cfg, 1, a_t->ne[1] / ctx->cfg->head_dim, b->pos);
    }
    return;
  case NPU_OP_MATMUL: {
    /* W is [N, K]; x [rows, K] */
    const float *bias = n->in[2] >= 0 ? tensor_data(g, n->in[2], ctx) : NULL;
    ctx->cpu_uk->f32_matmul(out, a, b, bias, rows, a_t->ne[1], g->tensors[n->in[1]].ne[0]);
    return;
  }
  case NPU_OP_ADD: npu_f32_add(out, a, b + (size_t)r0 * out_inner, count); return;
  case NPU_OP_MUL: npu_f32_mul(out, a, b + (size_t)r0 * out_inner, count); return;
  case NPU_OP_SILU: npu_f32_silu(out, a, count); return;
  case NPU_OP_TRANSFER: transfer(ctx->cpu_uk, a_t, a, out_t, out, count); return;
  case NPU_OP_ATTN: attention(g, n, ctx, r0, r1); return;
  default: assert(!"not a row-wise op");
  }
}

/* A row-wise node cut into ranges of rows, one per pool task. */
struct row_split {
  const struct npu_graph *g;
  const struct npu_ir_node *n;
  const struct npu_exec_ctx *ctx;
  int32_t rows, rows_per_task;
};

static void row_task(void *arg, size_t task) {
  const struct row_split *rs = arg;
  int32_t r0 = (int32_t)task * rs->rows_per_task;
  int32_t r1 = r0 + rs->rows_per_task < rs->rows ? r0 + rs->rows_per_task : rs->rows;
  exec_rows(rs->g, rs->n, rs->ctx, r0, r1);
}

/* A decode step's attention split by keys: the units of npu_f32_attention_tiles (a tile of keys of
 * one head, tile-major) cut into one contiguous range per pool task, each unit's result left in
 * ctx->attn_part; the caller then folds them in key order, so the bits do not depend on the cut.
 * A task first reads the K and V rows of its tiles front to back (npu_touch_lines): from a cold
 * cache (every layer's weights stream through between a layer's steps) a head's strided slices
 * alone leave too few lines in flight (one layer of stories110M at 64 positions, one thread, 9 MB
 * streamed between layers: 70 us, 42 us with the rows read first). Split by heads, as before,
 * each thread read every row's slice of its heads after both had brought in half of the rows, so
 * that with the two threads on different core complexes half of its reads came from the other's
 * caches: split by keys, stories110M's decode ran x1.016-x1.085 as fast there (in-process A/B,
 * 128-token blocks), qwen2.5-0.5b's x1.016. */
struct key_split {
  const struct npu_graph *g;
  const struct npu_ir_node *n;
  const struct npu_exec_ctx *ctx;
  int32_t len, units, tasks;
  atomic_uint sink; /* the reads' sums, kept so that they happen */
};

static void key_task(void *arg, size_t task) {
  struct key_split *ks = arg;
  const struct npu_graph *g = ks->g;
  const struct npu_ir_node *n = ks->n;
  const struct npu_exec_ctx *ctx = ks->ctx;
  const int32_t hd = ctx->cfg->head_dim, heads = g->tensors[n->in[0]].ne[1] / hd;
  const int32_t kv_cols = g->tensors[n->in[1]].ne[1];
  const int32_t u0 = (int32_t)((int64_t)ks->units * (int64_t)task / ks->tasks);
  const int32_t u1 = (int32_t)((int64_t)ks->units * (int64_t)(task + 1) / ks->tasks);
  /* the keys of its tiles: from the first unit's to the last unit's */
  const int32_t j0 = u0 / heads * NPU_REF_ATTN_TILE;
  const int32_t j_end = ((u1 - 1) / heads + 1) * NPU_REF_ATTN_TILE;
  const int32_t j1 = j_end < ks->len ? j_end : ks->len;
  const float *k = tensor_data(g, n->in[1], ctx), *v = tensor_data(g, n->in[2], ctx);
  const size_t at = (size_t)j0 * (size_t)kv_cols, bytes = (size_t)(j1 - j0) * (size_t)kv_cols * 4;
  const uint32_t sum = npu_touch_lines(k + at, bytes) + npu_touch_lines(v + at, bytes);
  atomic_fetch_add_explicit(&ks->sink, sum, memory_order_relaxed);
  ctx->cpu_uk->f32_attention_tiles(ctx->attn_part, tensor_data(g, n->in[0], ctx), k, v, heads,
                                   kv_cols / hd, hd, ks->len, u0, u1, n->param);
}

size_t npu_exec_attn_part_floats(const struct npu_config *cfg, int32_t n_ctx) {
  return (size_t)npu_attn_tiles(n_ctx) * (size_t)cfg->n_heads * ((size_t)cfg->head_dim + 2);
}

static void exec_key_split(const struct npu_graph *g, const struct npu_ir_node *n,
                           const struct npu_exec_ctx *ctx, struct npu_pool *pool, int threads) {
  const int32_t hd = ctx->cfg->head_dim, heads = g->tensors[n->in[0]].ne[1] / hd;
  struct key_split ks = {
      .g = g, .n = n, .ctx = ctx, .len = npu_attn_len(ctx->pos0, ctx->n_valid, 0)};
  const int32_t n_tiles = npu_attn_tiles(ks.len);
  ks.units = n_tiles * heads;
  ks.tasks = threads < ks.units ? threads : ks.units;
  npu_pool_run(pool, (size_t)ks.tasks, key_task, &ks);
  npu_f32_attention_fold(tensor_data(g, n->out, ctx), ctx->attn_part, heads, hd, n_tiles);
}

/* Run a row-wise node on the pool of its backend: a few tasks per thread, none so small that
 * claiming it costs more than running it. */
static void exec_split(const struct npu_graph *g, const struct npu_ir_node *n,
                       const struct npu_exec_ctx *ctx) {
  enum { TASKS_PER_THREAD = 4, MIN_TASK_ELEMS = 8192 };
  struct npu_pool *pool = ctx->pool[n->backend];
  const struct npu_ir_tensor *out_t = &g->tensors[n->out];
  const int32_t rows = out_t->ne[0];
  const int threads = npu_pool_threads(pool);
  if (n->op == NPU_OP_ATTN && rows == 1 && threads > 1) {
    exec_key_split(g, n, ctx, pool, threads);
    return;
  }
  const size_t inner = (size_t)out_t->ne[1] * (size_t)out_t->ne[2];
  size_t tasks = (size_t)threads * TASKS_PER_THREAD;
  /* a batch step's rows attend over caches of their own: each a decode step's attention */
  size_t by_size = n->op == NPU_OP_ATTN && ctx->batch != NULL
                       ? (size_t)ctx->n_valid
                       : (size_t)rows * inner / MIN_TASK_ELEMS;
  if (tasks > by_size) tasks = by_size;
  if (tasks <= 1) {
    exec_rows(g, n, ctx, 0, rows);
    return;
  }
  struct row_split rs = {g, n, ctx, rows, (int32_t)(((size_t)rows + tasks - 1) / tasks)};
  npu_pool_run(pool, ((size_t)rows + (size_t)rs.rows_per_task - 1) / (size_t)rs.rows_per_task,
               row_task, &rs);
}

static void run_node(const struct npu_graph *g, const struct npu_ir_node *n,
                     const struct npu_exec_ctx *ctx) {
  int32_t index = (int32_t)(n - g->nodes);
  if (splits_by_rows(g, n)) {
    exec_split(g, n, ctx);
    return;
  }
  if (integer_node(g, n)) {
    npu_emu_exec_node(g, n, &ctx->prog->qsites[g->node_site[index]], &ctx->prog->uk, ctx->arena,
                      ctx->ids, ctx->pos0, ctx->n_valid);
    return;
  }
  const struct npu_ir_tensor *out_t = &g->tensors[n->out];
  const struct npu_ir_tensor *a_t = n->in[0] >= 0 ? &g->tensors[n->in[0]] : NULL;
  const struct npu_ir_tensor *b_t = n->in[1] >= 0 ? &g->tensors[n->in[1]] : NULL;
  float *out = tensor_data(g, n->out, ctx);
  const float *a = n->in[0] >= 0 ? tensor_data(g, n->in[0], ctx) : NULL;
  const float *b = n->in[1] >= 0 ? tensor_data(g, n->in[1], ctx) : NULL;
  switch ((enum npu_op)n->op) {
  case NPU_OP_GATHER:
    npu_f32_gather(out, b, (const int32_t *)(const void *)a, out_t->ne[0], out_t->ne[1]);
    return;
  case NPU_OP_KV_WRITE:
    if (ctx->batch == NULL) {
      npu_f32_kv_write(out, a, ctx->pos0, ctx->n_valid, a_t->ne[1]);
      return;
    }
    for (int32_t r = 0; r < ctx->n_valid; r++) { /* each real row into its own sequence's cache */
      const struct npu_batch_row *b = &ctx->batch[r];
      float *cache = out_t->kv_is_value ? b->v_cache[out_t->ref] : b->k_cache[out_t->ref];
      npu_f32_kv_write(cache, a + (size_t)r * (size_t)a_t->ne[1], b->pos, 1, a_t->ne[1]);
    }
    return;
  case NPU_OP_LAST_ROW:
    memcpy(out, a + (size_t)(ctx->n_valid - 1) * (size_t)a_t->ne[1],
           (size_t)a_t->ne[1] * sizeof(float));
    return;
  case NPU_OP_QK: {
    /* q [rows, heads * hd], K cache [ctx, kv_dim] -> scores [heads, rows, ctx] */
    int32_t heads = out_t->ne[0], hd = a_t->ne[1] / heads;
    ctx->cpu_uk->f32_qk(out, a, b, heads, b_t->ne[1] / hd, hd, out_t->ne[1], out_t->ne[2],
                        ctx->pos0, ctx->n_valid, n->param);
    return;
  }
  case NPU_OP_SOFTMAX:
    npu_f32_softmax(out, a, a_t->ne[0], a_t->ne[1], a_t->ne[2], ctx->pos0, ctx->n_valid);
    return;
  case NPU_OP_PV: {
    /* probs [heads, rows, ctx], V cache [ctx, kv_dim] -> out [rows, heads * hd] */
    int32_t heads = a_t->ne[0], hd = out_t->ne[1] / heads;
    ctx->cpu_uk->f32_pv(out, a, b, heads, b_t->ne[1] / hd, hd, a_t->ne[1], a_t->ne[2], ctx->pos0,
                        ctx->n_valid);
    return;
  }
  case NPU_OP_TRANSFER:
    /* a KV cache copied for the integer NPU's attention: the rows this step attends over, which
     * are all the session's cache is sure to hold */
    transfer(ctx->cpu_uk, a_t, a, out_t, out,
             (size_t)(ctx->pos0 + ctx->n_valid) * (size_t)a_t->ne[1]);
    return;
  case NPU_OP_SHADOW:
    shadow(&ctx->prog->qsites[g->node_site[index]], a, (size_t)a_t->ne[1], (size_t)a_t->ne[0], out);
    return;
  default: break; /* the row-wise ops ran in exec_rows */
  }
  assert(!"unknown op");
}

/* The multiply-accumulates and weight bytes of node 'n' in this step: a matmul's rows x N x K
 * (padded rows included: the static graph computes them) and its weights (packed int8 on the
 * integer NPU, else F32); attention's q.k and p.v over the keys each real row attends to. */
static void node_work(const struct npu_graph *g, const struct npu_ir_node *n,
                      const struct npu_exec_ctx *ctx, uint64_t *macs, uint64_t *bytes) {
  const struct npu_ir_tensor *out = &g->tensors[n->out];
  *macs = *bytes = 0;
  if (n->op == NPU_OP_MATMUL) {
    const uint64_t k = (uint64_t)g->tensors[n->in[0]].ne[1], cols = (uint64_t)out->ne[1];
    *macs = (uint64_t)out->ne[0] * cols * k;
    const int32_t site = g->node_site != NULL ? g->node_site[n - g->nodes] : -1;
    *bytes = site >= 0 ? ctx->prog->qsites[site].packed_size : cols * k * sizeof(float);
  } else if (n->op == NPU_OP_ATTN || n->op == NPU_OP_QK || n->op == NPU_OP_PV) {
    /* keys attended: row t sees pos0 + t + 1 of them */
    const uint64_t v = (uint64_t)ctx->n_valid;
    const uint64_t keys = v * (uint64_t)ctx->pos0 + v * (v + 1) / 2;
    const uint64_t q_dim = (uint64_t)ctx->cfg->n_heads * (uint64_t)ctx->cfg->head_dim;
    *macs = keys * q_dim * (n->op == NPU_OP_ATTN ? 2 : 1);
  }
}

/* The bytes of the file that site 'site''s packed weights are, if it is streamed. */
static bool streamed_bytes(const struct npu_exec_ctx *ctx, int32_t site, uint64_t *begin,
                           uint64_t *end) {
  if (ctx->streamed == NULL || site < 0 || !ctx->streamed[site]) return false;
  const struct npu_qsite *s = &ctx->prog->qsites[site];
  *begin = (uint64_t)((const uint8_t *)s->packed - ctx->file->base);
  *end = *begin + s->packed_size;
  return true;
}

/* Under a memory budget, before matmuls 'first' .. 'first + count - 1': start reading the next
 * streamed site after them (a few nodes ahead), so that its reads overlap these. */
static void prefetch_next(const struct npu_graph *g, int32_t first, int32_t count,
                          const struct npu_exec_ctx *ctx) {
  enum { LOOKAHEAD = 16 };
  for (int32_t i = first + count; i < g->n_nodes && i < first + count + LOOKAHEAD; i++) {
    uint64_t begin, end;
    if (streamed_bytes(ctx, g->node_site[i], &begin, &end)) {
      npu_gguf_prefetch(ctx->file, begin, end);
      return;
    }
  }
}

/* Nodes 'first' .. 'first + count - 1' of 'g': one node, or matmuls on the NPU that run as one
 * loop (npu_emu_matmul_group). */
static void run_nodes(const struct npu_graph *g, int32_t first, int32_t count,
                      const struct npu_exec_ctx *ctx) {
  const struct npu_ir_node *n = &g->nodes[first];
  if (g->node_site != NULL && n->backend == NPU_BE_NPU && n->op == NPU_OP_MATMUL) {
    if (ctx->streamed != NULL) prefetch_next(g, first, count, ctx);
    struct npu_input_run *in = ctx->input_sparse;
    if (in != NULL && npu_input_run_covers(in, g, first, count)) {
      npu_input_run_exec(in, g, first, count, ctx->pool[NPU_BE_NPU], ctx->arena);
      return;
    }
    if (in != NULL) npu_input_run_count_dense(in, g, first, count);
    npu_emu_exec_matmuls(g, first, count, ctx->prog->qsites, &ctx->prog->uk, ctx->pool[NPU_BE_NPU],
                         ctx->arena);
    for (int32_t i = first; i < first + count && ctx->streamed != NULL; i++) {
      uint64_t begin, end;
      if (streamed_bytes(ctx, g->node_site[i], &begin, &end)) {
        npu_gguf_drop(ctx->file, begin, end, true);
      }
    }
    return;
  }
  assert(count == 1);
  run_node(g, n, ctx);
}

/* run_nodes, timed when profiling: the nodes of one loop share its time. */
static void exec_nodes(const struct npu_graph *g, int32_t first, int32_t count,
                       const struct npu_exec_ctx *ctx) {
  struct npu_profile *pr = ctx->profile;
  if (pr == NULL) {
    run_nodes(g, first, count, ctx);
    return;
  }
  const double t0 = npu_now();
  run_nodes(g, first, count, ctx);
  const uint64_t ns = (uint64_t)((npu_now() - t0) * 1e9);
  const int be = g->nodes[first].backend, op = g->nodes[first].op;
  atomic_fetch_add_explicit(&pr->ns[be][op], ns, memory_order_relaxed);
  for (int32_t i = first; i < first + count; i++) {
    uint64_t macs, bytes;
    node_work(g, &g->nodes[i], ctx, &macs, &bytes);
    atomic_fetch_add_explicit(&pr->calls[be][op], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&pr->macs[be][op], macs, memory_order_relaxed);
    atomic_fetch_add_explicit(&pr->bytes[be][op], bytes, memory_order_relaxed);
  }
}

/* The sparse FFN of nodes 'first' .. 'first + count - 1', timed as a matmul when profiling (its
 * work is counted by the sparse run's statistics, not here). */
static void exec_sparse(const struct npu_graph *g, int32_t first, int32_t count,
                        const struct npu_exec_ctx *ctx) {
  const double t0 = ctx->profile != NULL ? npu_now() : 0.0;
  npu_sparse_ffn_exec(ctx->sparse, g, first, count, ctx->pool[NPU_BE_NPU], ctx->arena);
  if (ctx->profile == NULL) return;
  const uint64_t ns = (uint64_t)((npu_now() - t0) * 1e9);
  atomic_fetch_add_explicit(&ctx->profile->ns[NPU_BE_NPU][NPU_OP_MATMUL], ns, memory_order_relaxed);
}

void npu_exec_subgraph(const struct npu_graph *g, const struct npu_subgraph *sg,
                       const struct npu_exec_ctx *ctx) {
  const int32_t end = sg->first + sg->count;
  for (int32_t i = sg->first; i < end;) {
    const int32_t span = ctx->sparse != NULL ? npu_sparse_span(ctx->sparse, g, i, end) : 0;
    const int32_t count = span > 0 ? span : npu_emu_matmul_group(g, i, end);
    if (span > 0) exec_sparse(g, i, count, ctx);
    else exec_nodes(g, i, count, ctx);
    /* a sparse FFN writes only its last node's output: the others are not shown */
    for (int32_t j = span > 0 ? i + count - 1 : i; j < i + count && ctx->observe != NULL; j++)
      ctx->observe(ctx->observe_user, g, j, ctx);
    i += count;
  }
}

void npu_exec_graph(const struct npu_graph *g, const struct npu_exec_ctx *ctx) {
  for (int32_t s = 0; s < g->n_subgraphs; s++) npu_exec_subgraph(g, &g->subgraphs[s], ctx);
}

int32_t npu_exec_plan_steps(const struct npu_program *p, int32_t pos, int32_t n, bool last_logits,
                            struct npu_step *steps_out) {
  const struct npu_compile_options *o = &p->opts;
  int32_t largest = o->n_chunks > 0 ? o->chunks[o->n_chunks - 1] : 1;
  int32_t n_steps = 0, done = 0;
  while (done < n) {
    int32_t left = n - done, rows = 1, take = 1;
    if (left >= largest) {
      rows = take = largest;
    } else if (left > 1) {
      for (int32_t i = 0; i < o->n_chunks && rows == 1; i++) {
        if (o->chunks[i] >= left) rows = o->chunks[i];
      }
      take = left;
    }
    const struct npu_graph *g = npu_program_find(p, rows, pos + done + take, last_logits);
    /* a program written before graphs for generation existed computes every row's logits */
    if (g == NULL && last_logits) g = npu_program_find(p, rows, pos + done + take, false);
    if (g == NULL) return -1;
    steps_out[n_steps++] =
        (struct npu_step){.g = g, .row0 = done, .pos0 = pos + done, .n_valid = take};
    done += take;
  }
  return n_steps;
}
