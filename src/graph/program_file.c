/* The program file: a compiled model — configuration, tokenizer, static graphs with placement and
 * memory plan, weights and, for an integer NPU, every NPU operation's integer data — as one
 * mmap-able file, read back as hostile input.
 *
 * Format, version 5. A program file is a GGUF v3 file (ggml/docs/gguf.md), so the bounds-checked
 * GGUF reader parses it, the model loader and the tokenizer read it unchanged, and the float
 * weights are used in place from the mapping. It is written whole or not at all (a temporary
 * file renamed into place) and every byte of it is checksummed (gguf_checksum.h). It holds:
 *
 *   general.alignment          u32   64: every tensor's data starts on a cache line
 *   (the source model's metadata, value for value and in its order: general.*, {arch}.*,
 *    tokenizer.ggml.*; except general.alignment, the npulm.* keys of an earlier program, and
 *    general.file_type, which becomes 0 = all F32 where the source has it)
 *   npulm.program.version      u32   5; any other value is refused (NPULM_ERR_UNSUPPORTED: version
 *                                    1 files, FP32 only, version 2 files, without attention on
 *                                    the integer NPU, version 3 files, without its RMSNorm, and
 *                                    version 4 files, without checksums, must be recompiled)
 *   npulm.compile.chunks       i32[] prefill chunk sizes, ascending (may be empty)
 *   npulm.compile.buckets      i32[] context buckets, ascending
 *   npulm.compile.float_ops    u32   ops the precision policy keeps in float: bits 1 << enum npu_op
 *   npulm.weights              str[] npu_weight_table's names in its order (a weight the model
 *                                    lacks, such as an absent bias, is listed all the same)
 *   npulm.graph.count          u32   graphs: rows 1, then each chunk size, each with every bucket
 *                                    >= rows, in that order (as npu_compile makes them)
 *   npulm.graph.G.info         i32[3] rows, ctx, n_transfers            (G = 0 .. count - 1)
 *   npulm.graph.G.arena_size   u64[2] bytes of the NPU arena, of the CPU arena
 *   npulm.graph.G.tensors      i32[12 * n_tensors], per tensor: kind, dtype, backend,
 *                                    kv_is_value, ne0, ne1, ne2, ref, offset (low 32 bits),
 *                                    offset (high 32 bits), q.scale (f32 bits), q.zero_point
 *   npulm.graph.G.tensor_names str[n_tensors], each shorter than NPU_IR_NAME_MAX bytes
 *   npulm.graph.G.nodes        i32[9 * n_nodes], per node: op, backend, pinned, in0, in1, in2,
 *                                    out, layer, param (f32 bits)
 *   npulm.graph.G.subgraphs    i32[3 * n_subgraphs], per subgraph: first, count, backend
 *   npulm.quant.mode           u32   enum npu_quant_mode: 0 = f32 (the NPU computes in FP32; no
 *                                    other npulm.quant / npulm.qsite key is read), 1 = w8a8-naive,
 *                                    2 = w8a8-shadow, 3 = w8a8-smooth
 *   npulm.quant.smooth_alpha   f32   } the options the program was quantized with (mode != 0)
 *   npulm.quant.shadow_threshold f32 }
 *   npulm.qtensors             i32[3 * n], per quantized tensor name: dtype, scale (f32 bits),
 *                                    zero point (struct npu_qtensor)
 *   npulm.qtensor_names        str[n]
 *   npulm.qsites               i32[38 * n_sites], per site (struct npu_qsite): op, n, k,
 *                                    n_outliers, outlier_dim; gemm x_zero_point, y_zero_point;
 *                                    gather y_zero_point; add a_zero_point, b_zero_point,
 *                                    left_shift, a_mult, a_shift, b_mult, b_shift, y_mult, y_shift,
 *                                    y_zero_point; mul a_zero_point, b_zero_point, y_mult, y_shift,
 *                                    y_zero_point (fields 0 .. 22); qk q_zero_point, k_zero_point,
 *                                    mult, shift, s_zero_point (23 .. 27); softmax mult, shift
 *                                    (28, 29); pv v_zero_point, mult, shift, y_zero_point
 *                                    (30 .. 33); rmsnorm eps (low, high 32 bits), shift,
 *                                    y_zero_point (34 .. 37), with n its width. The fields of
 *                                    other ops than the site's are 0; a LAST_ROW site has none.
 *   npulm.qsite_names          str[n_sites], each shorter than NPU_IR_NAME_MAX bytes
 *   npulm.qsites.luts          i8[256 * number of SILU sites]: their tables, in site order
 *   npulm.qsites.tables        i32[n_sites], optional: per site -1, or for a gather that reads
 *                                    its table out of a matmul's packed weights of the same
 *                                    [n, k] (a tied embedding, stored once) that matmul's site;
 *                                    such a gather has no packed tensor of its own
 *   npulm.checksums            u64[1 + n_tensors], the last key: XXH3-64 of the header (bytes
 *                                    0 .. data offset, this array's values read as 0), then of
 *                                    each tensor's data with its padding; the tensors lie back to
 *                                    back to the end of the file, so every byte is covered. All
 *                                    are checked when the file is opened, before any other key
 *                                    but the version is read (npu_program_file_check).
 *
 *   tensors: every weight the model reads, under its GGUF name and shape, as F32 (a tied output
 *   is stored once, as token_embd.weight; a SmoothQuant program stores its smoothed weights);
 *   then for each site S (0 .. n_sites - 1), those of its arrays it has:
 *     npulm.qsite.S.packed     I8  [packed_size]  matmul: npu_qs8_gemm_pack's layout of [n, k];
 *                                                 gather: the int8 table [n rows, k]
 *     npulm.qsite.S.mult       I32 [n]            } per output channel / table row (an
 *     npulm.qsite.S.shift      I32 [n]            } rmsnorm: mult only, per channel)
 *     npulm.qsite.S.outliers   I32 [n_outliers]   shadow outliers: input channels, ascending
 *     npulm.qsite.S.outlier_w  F32 [n_outliers, n] their weight columns (ggml order: ne0 first)
 *     npulm.qsite.S.outlier_gate F32 [outlier_dim, n_outliers] } when outlier_dim > 0: the FFN
 *     npulm.qsite.S.outlier_up   F32 [outlier_dim, n_outliers] } gate and up rows of them
 *   The packed weights of matmuls are copied out of the mapping into huge pages
 *   (npu_quant_place_packed), those of gathers used in place (64-byte aligned, like all tensors);
 *   the small arrays are copied.
 *
 * Version 3 graphs compute in FP32 (quant.mode 0: activations, weights, caches and logits F32,
 * token ids I32) or, for an integer NPU, with I8/I16 activations on the NPU and F32 everywhere
 * else. Attention on the integer NPU (QK, SOFTMAX, PV not in float_ops) reads, as its second
 * operand, an NPU I8 activation [ctx, kv_dim] named blk.L.k_cache / blk.L.v_cache (ref -1,
 * kv_is_value that of its cache) that a CPU TRANSFER from the layer's F32 cache fills, rows
 * 0 .. pos0 + n_valid - 1 each step; its scores are I16 [heads, rows, ctx], its probabilities
 * I16 Q15 (scale 2^-15, zero point 0). Attention that the policy keeps all in float (QK, SOFTMAX
 * and PV in float_ops, the default) is one CPU node of op 13, ATTN: in0 q [rows, q_dim], in1 and
 * in2 the layer's own F32 K and V caches, param the scale, out [rows, q_dim]; it has no scores or
 * probabilities tensors. (Files written before ATTN existed hold QK, SOFTMAX and PV on the CPU
 * instead; they load and run as they are. Op 13 came without a new version: a reader that
 * predates it refuses such a file as having an unknown op.) After the decode graphs, each chunk
 * size has its graphs (one per bucket) with the logits of every row [rows, n_vocab], then those
 * for generation, whose logits are the last real row's only [1, n_vocab]: a node of op 14,
 * LAST_ROW (in0 [rows, dim], out [1, dim]), copies row n_valid - 1 of the last block's output,
 * and the output norm and classifier run on that one row. (Files without the graphs for
 * generation still load and run, computing every row's logits; an older reader refuses the new
 * ones for op 14.) Since version 4 the integer NPU runs RMSNORM (int16 in, int8 out) and
 * LAST_ROW (a copy, its output quantized as its input), and the CPU no longer does between a
 * block's residual add and its next matmul. Enumerations are stored as numbered
 * in graph/ir.h and quant/quantize.h (pinned by the static asserts below): a change of numbering
 * or of a record's fields needs a new version.
 * Loading range-checks every field, runs npu_ir_validate on every graph, links every NPU node to
 * its site (npu_quant_link) and runs npu_program_verify on the whole program, so that no file can
 * make the executor or an integer kernel index outside a tensor, an arena, a site's arrays, the KV
 * cache or the logits. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "atomic_file.h"
#include "common.h"
#include "gguf_checksum.h"
#include "gguf_write.h"
#include "graph/program.h"
#include "npu/supported.h"
#include "quant/qparams.h"
#include "quant/quantize.h"

#define FILE_ALIGNMENT 64u
#define TENSOR_FIELDS 12
#define NODE_FIELDS 9
#define SUBGRAPH_FIELDS 3
#define INFO_FIELDS 3
#define QTENSOR_FIELDS 3
#define SMALL_TENSOR_BYTES (64u << 10) /* tensors below this are stored together, first */
#define SITE_FIELDS 38
#define DAMAGE_NAME_MAX 112 /* "tensor '...'" with up to 96 bytes of a name */
#define SITE_QK 23      /* first field of the qk, softmax and pv parameters */
#define SITE_SOFTMAX 28
#define SITE_PV 30
#define SITE_RMSNORM 34 /* first field of the rmsnorm parameters */
#define LUT_SIZE 256
#define GGML_I8 24  /* ggml type ids of the sites' integer arrays */
#define GGML_I32 26
#define WRITE_CHUNK_BYTES (4u << 20) /* weight bytes between progress calls */
#define ARENA_SLACK 4096u            /* per tensor: the most alignment padding a plan may add */

/* The numbering the file format stores. */
_Static_assert(NPU_DT_F32 == 0 && NPU_DT_I8 == 1 && NPU_DT_I16 == 2 && NPU_DT_I32 == 3,
               "enum npu_dtype is stored in program files: bump NPU_PROGRAM_VERSION");
_Static_assert(NPU_BE_NPU == 0 && NPU_BE_CPU == 1 && NPU_BE_COUNT == 2,
               "enum npu_backend is stored in program files: bump NPU_PROGRAM_VERSION");
_Static_assert(NPU_TK_ACT == 0 && NPU_TK_WEIGHT == 1 && NPU_TK_INPUT_IDS == 2 && NPU_TK_KV == 3 &&
                   NPU_TK_LOGITS == 4,
               "enum npu_tensor_kind is stored in program files: bump NPU_PROGRAM_VERSION");
_Static_assert(NPU_OP_GATHER == 0 && NPU_OP_RMSNORM == 1 && NPU_OP_MATMUL == 2 &&
                   NPU_OP_ROPE == 3 && NPU_OP_KV_WRITE == 4 && NPU_OP_QK == 5 &&
                   NPU_OP_SOFTMAX == 6 && NPU_OP_PV == 7 && NPU_OP_ADD == 8 && NPU_OP_MUL == 9 &&
                   NPU_OP_SILU == 10 && NPU_OP_TRANSFER == 11 && NPU_OP_SHADOW == 12 &&
                   NPU_OP_ATTN == 13 && NPU_OP_LAST_ROW == 14 && NPU_OP_COUNT <= 32,
               "enum npu_op is stored in program files: bump NPU_PROGRAM_VERSION");
_Static_assert(NPU_QUANT_F32 == 0 && NPU_QUANT_NAIVE == 1 && NPU_QUANT_SHADOW == 2 &&
                   NPU_QUANT_SMOOTH == 3 && NPU_QUANT_MODE_COUNT == 4,
               "enum npu_quant_mode is stored in program files: bump NPU_PROGRAM_VERSION");
_Static_assert(sizeof(((struct npu_qsite *)0)->lut) == LUT_SIZE, "a site's LUT is 256 bytes");
_Static_assert(sizeof(struct npu_qs8_qk_params) == 5 * 4 &&
                   sizeof(struct npu_qs16_softmax_params) == 2 * 4 &&
                   sizeof(struct npu_qs16_pv_params) == 4 * 4 && SITE_PV + 4 == SITE_RMSNORM &&
                   SITE_RMSNORM + 4 == SITE_FIELDS,
               "the attention parameters are stored in a site's record: bump NPU_PROGRAM_VERSION");

static const char *const KEY_VERSION = "npulm.program.version";

/* ---- Small helpers -------------------------------------------------------------------------- */

static int32_t f32_bits(float f) {
  int32_t v;
  memcpy(&v, &f, sizeof(v));
  return v;
}

static float bits_f32(int32_t v) {
  float f;
  memcpy(&f, &v, sizeof(f));
  return f;
}

/* Element i of an (already bounds-checked) i32 array in the mapping. */
static int32_t arr_i32(const struct npu_gguf_arr *a, uint64_t i) {
  int32_t v;
  memcpy(&v, a->data + 4 * i, sizeof(v));
  return v;
}

/* Re-prefix an error: "<prefix>: <message>". */
static npulm_status with_prefix(npulm_error *err, npulm_status st, const char *prefix,
                                const npulm_error *inner) {
  return npu_fail(err, st, "%s: %s", prefix, inner->msg);
}

/* The graphs npu_compile makes for 'o', in its order: graph i serves rows_out[i] x ctx_out[i].
 * Return their count; the arrays (may be NULL) hold (1 + NPU_MAX_CHUNKS) * NPU_MAX_BUCKETS. */
/* The graphs npu_compile makes for options 'o', in its order: their rows, contexts and logit
 * rows. 'for_generation': each chunk also has graphs whose logits are the last row's only (files
 * written before those existed have not). */
static int32_t expected_graphs(const struct npu_compile_options *o, bool for_generation,
                               int32_t *rows_out, int32_t *ctx_out, int32_t *logit_rows_out) {
  int32_t n = 0, per_chunk = for_generation ? 2 : 1;
  for (int32_t r = -1; r < per_chunk * o->n_chunks; r++) {
    int32_t rows = r < 0 ? 1 : o->chunks[r / per_chunk];
    bool last = r >= 0 && r % per_chunk == 1;
    for (int32_t b = 0; b < o->n_buckets; b++) {
      if (o->buckets[b] < rows) continue;
      if (rows_out != NULL) rows_out[n] = rows;
      if (ctx_out != NULL) ctx_out[n] = o->buckets[b];
      if (logit_rows_out != NULL) logit_rows_out[n] = last ? 1 : rows;
      n++;
    }
  }
  return n;
}

/* Sizes derived from the model and options (as npu_compile computes them). */
static void program_sizes(const struct npulm_model *m, struct npu_program *p) {
  const struct npu_config *c = &m->cfg;
  p->weight_bytes = 0;
  for (int32_t i = 0; i < p->n_weights; i++) {
    bool seen = p->weights[i].data == NULL;
    for (int32_t j = 0; j < i && !seen; j++) seen = p->weights[j].data == p->weights[i].data;
    if (!seen) p->weight_bytes += (uint64_t)p->weights[i].ne0 * (uint64_t)p->weights[i].ne1 * 4;
  }
  p->kv_bytes = 2ull * (uint64_t)c->n_layers * (uint64_t)p->opts.buckets[p->opts.n_buckets - 1] *
                (uint64_t)(c->n_kv_heads * c->head_dim) * sizeof(float);
}

/* ---- Verification --------------------------------------------------------------------------- */

struct verify_ctx {
  const struct npulm_model *m;
  const struct npu_program *p;
  const struct npu_graph *g;
  int32_t gi;
  int32_t logit_rows; /* g->rows, or 1 for a graph for generation (checked before use) */
  npulm_error *err;
};

/* Fail naming the graph: "program graph G (rows R, ctx K): <what>". */
static npulm_status NPU_PRINTF(2, 3) vfail(const struct verify_ctx *v, const char *fmt, ...) {
  char what[NPULM_ERROR_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof(what), fmt, ap);
  va_end(ap);
  return npu_fail(v->err, NPULM_ERR_FORMAT, "program graph %d (rows %d, ctx %d): %s", v->gi,
                  v->g->rows, v->g->ctx, what);
}

/* An activation of the shape [rows, cols, 1], or [1, cols, 1] in a graph for generation's output
 * head (npu_ir_validate keeps each op's rows consistent, and only LAST_ROW changes them). */
static bool is_rows(const struct verify_ctx *v, const struct npu_ir_tensor *t) {
  return (t->ne[0] == v->g->rows || t->ne[0] == v->logit_rows) && t->ne[2] == 1;
}

/* Attention scores [n_heads, rows, ctx]. */
static bool is_scores(const struct npu_graph *g, const struct npu_config *c,
                      const struct npu_ir_tensor *t) {
  return t->ne[0] == c->n_heads && t->ne[1] == g->rows && t->ne[2] == g->ctx;
}

/* A cache's shape [ctx, kv_dim] (the caches, and the integer NPU's int8 copies of them). */
static bool is_cache_shape(const struct npu_graph *g, const struct npu_config *c,
                           const struct npu_ir_tensor *t) {
  return t->ne[0] == g->ctx && t->ne[1] == c->n_kv_heads * c->head_dim && t->ne[2] == 1;
}

static bool in_arena(const struct npu_ir_tensor *t) { return t->kind == NPU_TK_ACT; }

static bool is_int(uint8_t dt) { return dt == NPU_DT_I8 || dt == NPU_DT_I16; }

/* A zero point the type 'dt' (I8 or I16) can hold. */
static bool zp_fits(uint8_t dt, int32_t zp) {
  return dt == NPU_DT_I8 ? zp >= INT8_MIN && zp <= INT8_MAX
                         : dt == NPU_DT_I16 && zp >= INT16_MIN && zp <= INT16_MAX;
}

/* A multiplier/shift pair in the range of npu_requantize (fixedpoint.h). */
static bool requant_ok(int32_t mult, int32_t shift) {
  return mult >= 0 && shift >= -31 && shift <= 30;
}

/* An input multiplier of the integer add: at most 0.5 (ukernels.h). */
static bool add_input_ok(int32_t mult, int32_t shift) {
  return requant_ok(mult, shift) && (shift <= -1 || (shift == 0 && mult <= (1 << 30)));
}

static bool bits_equal(float a, float b) { return memcmp(&a, &b, sizeof(a)) == 0; }

/* The side of the CPU/NPU divide a value lives on: its arena's backend; the logits are the
 * caller's (CPU) memory. */
static int side(const struct npu_ir_tensor *t) {
  return t->kind == NPU_TK_ACT ? t->backend : NPU_BE_CPU;
}

/* Every tensor's shape and type against the model. */
static npulm_status verify_tensors(const struct verify_ctx *v) {
  const struct npu_graph *g = v->g;
  const struct npu_config *c = &v->m->cfg;
  bool quant = v->p->quant_mode != NPU_QUANT_F32;
  int32_t kv_dim = c->n_kv_heads * c->head_dim;
  for (int32_t i = 0; i < g->n_tensors; i++) {
    const struct npu_ir_tensor *t = &g->tensors[i];
    const char *why = NULL;
    bool f32 = t->dtype == NPU_DT_F32;
    switch ((enum npu_tensor_kind)t->kind) {
    case NPU_TK_ACT:
    case NPU_TK_LOGITS: {
      /* an integer program's NPU activations are I8/I16 with the quantization of their name;
       * everything else computes in FP32 */
      bool integer = quant && t->kind == NPU_TK_ACT && t->backend == NPU_BE_NPU;
      const struct npu_qtensor *q = integer ? npu_program_qtensor(v->p, t->name) : NULL;
      if (!integer && !f32)
        why = "is not F32";
      else if (integer && !is_int(t->dtype))
        why = "is not I8 or I16 on the integer NPU";
      else if (integer && !zp_fits(t->dtype, t->q.zero_point))
        why = "has a zero point outside its type's range";
      else if (integer && q == NULL)
        why = "has no entry in the quantization table";
      else if (integer && (q->dtype != t->dtype || !bits_equal(q->q.scale, t->q.scale) ||
                           q->q.zero_point != t->q.zero_point))
        why = "does not match its quantization table entry";
      else if (!is_rows(v, t) && !is_scores(g, c, t) && !(integer && is_cache_shape(g, c, t)))
        why = "has a shape that is neither [rows, n] nor [heads, rows, ctx]";
      else if (t->kind == NPU_TK_LOGITS && (t->ne[1] != c->n_vocab || t->ne[2] != 1))
        why = "is not [rows, n_vocab]";
      else if (t->kind == NPU_TK_LOGITS && t->offset != 0)
        why = "has an arena offset";
      break;
    }
    case NPU_TK_WEIGHT: {
      const struct npu_weight *w = &v->p->weights[t->ref]; /* ref checked by npu_ir_validate */
      if (!f32)
        why = "is not F32";
      else if (w->data == NULL)
        why = "refers to a weight the model does not have";
      else if (t->ne[0] != w->ne1 || t->ne[1] != w->ne0 || t->ne[2] != 1)
        why = "does not have its weight's shape";
      else if (t->offset != 0)
        why = "has an arena offset";
      break;
    }
    case NPU_TK_INPUT_IDS:
      if (t->ne[1] != 1 || t->ne[2] != 1 || t->offset != 0) why = "is not [rows] token ids";
      break;
    case NPU_TK_KV:
      if (!f32)
        why = "is not F32";
      else if (t->ne[0] != g->ctx || t->ne[1] != kv_dim || t->ne[2] != 1)
        why = "is not a [ctx, kv_dim] cache";
      else if (t->offset != 0)
        why = "has an arena offset";
      break;
    }
    if (why == NULL && t->kind != NPU_TK_WEIGHT && t->kind != NPU_TK_KV && t->ref != -1) {
      why = "has a reference but is not a weight or a cache";
    }
    /* only a cache, or the integer NPU's copy of a V cache, holds values */
    if (why == NULL && t->kind != NPU_TK_KV && t->kv_is_value &&
        !(quant && t->kind == NPU_TK_ACT && t->backend == NPU_BE_NPU && is_cache_shape(g, c, t))) {
      why = "is marked a V cache";
    }
    if (why != NULL) return vfail(v, "tensor %d ('%s') %s", i, t->name, why);
  }
  return NPULM_OK;
}

/* A TRANSFER copies between the two sides, converting F32 <-> I8/I16 or keeping the type. */
static const char *check_transfer(const struct npu_program *p, const struct npu_ir_node *n,
                                  const struct npu_ir_tensor *a, const struct npu_ir_tensor *out) {
  if (side(a) == side(out)) return "copies a tensor within one arena";
  if (p->quant_mode != NPU_QUANT_F32 && n->backend != NPU_BE_CPU) {
    return "is a transfer of an integer program not run by the CPU";
  }
  bool ok = a->dtype == out->dtype || (a->dtype == NPU_DT_F32 && is_int(out->dtype)) ||
            (is_int(a->dtype) && out->dtype == NPU_DT_F32);
  return ok ? NULL : "converts between types no transfer converts";
}

/* The node before 'before' that writes tensor 'id', or -1 (npu_ir_validate: at most one does). */
static int32_t writer_of(const struct npu_graph *g, int32_t id, int32_t before) {
  for (int32_t j = 0; j < before; j++) {
    if (g->nodes[j].out == id) return j;
  }
  return -1;
}

/* The cache operand (in1) of attention node 'i': the layer's F32 K (V) cache itself, or, for an
 * NPU node of an integer program, the NPU's I8 copy of it [ctx, kv_dim] that a TRANSFER from
 * that cache made (the step's rows 0 .. pos0 + n_valid - 1, all the kernels read). */
static const char *check_cache(const struct verify_ctx *v, int32_t i, bool value) {
  const struct npu_graph *g = v->g;
  const struct npu_ir_node *n = &g->nodes[i];
  const struct npu_ir_tensor *b = &g->tensors[n->in[1]];
  if (b->kv_is_value != value) return value ? "does not read a V cache" : "does not read a K cache";
  if (v->p->quant_mode == NPU_QUANT_F32 || n->backend != NPU_BE_NPU) {
    return b->kind == NPU_TK_KV ? NULL : "reads a copy of a cache but is not on the integer NPU";
  }
  if (b->kind != NPU_TK_ACT || b->backend != NPU_BE_NPU || b->dtype != NPU_DT_I8 ||
      !is_cache_shape(g, &v->m->cfg, b)) {
    return "does not read an NPU I8 [ctx, kv_dim] copy of a cache";
  }
  int32_t w = writer_of(g, n->in[1], i);
  const struct npu_ir_node *t = w >= 0 ? &g->nodes[w] : NULL;
  const struct npu_ir_tensor *src = t != NULL && t->in[0] >= 0 ? &g->tensors[t->in[0]] : NULL;
  if (t == NULL || t->op != NPU_OP_TRANSFER || src == NULL || src->kind != NPU_TK_KV ||
      src->kv_is_value != value || src->ref != n->layer) {
    return "reads a tensor that is not a transfer of its layer's cache";
  }
  return NULL;
}

/* An NPU node of an integer program: an op with an integer kernel, integer NPU activations only,
 * and a site of its op, its name, and shapes, types and zero points that agree with the node's
 * tensors. 'why' gets room for a detailed message. */
static const char *check_int_node(const struct verify_ctx *v, int32_t i, char *why, size_t cap) {
  const struct npu_graph *g = v->g;
  const struct npu_ir_node *n = &g->nodes[i];
  const struct npu_ir_tensor *out = &g->tensors[n->out];
  const struct npu_ir_tensor *a = n->in[0] >= 0 ? &g->tensors[n->in[0]] : NULL;
  const struct npu_ir_tensor *b = n->in[1] >= 0 ? &g->tensors[n->in[1]] : NULL;
  switch ((enum npu_op)n->op) {
  case NPU_OP_MATMUL:
  case NPU_OP_GATHER:
  case NPU_OP_ADD:
  case NPU_OP_MUL:
  case NPU_OP_SILU:
  case NPU_OP_QK:
  case NPU_OP_SOFTMAX:
  case NPU_OP_PV:
  case NPU_OP_RMSNORM:
  case NPU_OP_LAST_ROW: break;
  default: return "has no integer kernel on the NPU";
  }
  /* values of an NPU node live in the NPU arena (npu_npu_exec_node addresses them there) */
  for (int s = -1; s < NPU_IR_MAX_IN; s++) {
    int32_t id = s < 0 ? n->out : n->in[s];
    if (id < 0) continue;
    const struct npu_ir_tensor *t = &g->tensors[id];
    if (t->kind == NPU_TK_LOGITS) return "uses the logits on the integer NPU (a CPU transfer must)";
  }
  int32_t si = g->node_site[i];
  if (si < 0 || si >= v->p->n_qsites) return "has no integer data";
  const struct npu_qsite *site = &v->p->qsites[si];
  if (site->op != n->op || strcmp(site->name, out->name) != 0) {
    snprintf(why, cap, "is linked to the integer data of '%s' (%s)", site->name,
             npu_op_name((enum npu_op)site->op));
    return why;
  }
  switch ((enum npu_op)n->op) {
  case NPU_OP_MATMUL:
    if (a->dtype != NPU_DT_I8 || !is_int(out->dtype)) return "is not I8 -> I8/I16";
    if (site->k != a->ne[1] || site->n != out->ne[1]) {
      snprintf(why, cap, "has integer data of [n %d, k %d] for a [%d] -> [%d] product", site->n,
               site->k, a->ne[1], out->ne[1]);
      return why;
    }
    if (site->gemm.x_zero_point != a->q.zero_point ||
        site->gemm.y_zero_point != out->q.zero_point) {
      return "has GEMM zero points that are not its tensors'";
    }
    return NULL;
  case NPU_OP_GATHER:
    if (!is_int(out->dtype)) return "is not -> I8/I16";
    if (site->n != b->ne[0] || site->k != out->ne[1]) {
      snprintf(why, cap, "has a table of [%d rows, %d] for [%d rows, %d]", site->n, site->k,
               b->ne[0], out->ne[1]);
      return why;
    }
    if (site->gather.y_zero_point != out->q.zero_point) {
      return "has an output zero point that is not its tensor's";
    }
    return NULL;
  case NPU_OP_ADD:
    if (a->dtype != out->dtype || b->dtype != out->dtype) return "adds tensors of different types";
    if (out->dtype == NPU_DT_I16 && site->add.left_shift > 14) {
      return "has an int16 left shift above 14";
    }
    if (site->add.a_zero_point != a->q.zero_point || site->add.b_zero_point != b->q.zero_point ||
        site->add.y_zero_point != out->q.zero_point) {
      return "has add zero points that are not its tensors'";
    }
    return NULL;
  case NPU_OP_MUL:
    if (a->dtype != NPU_DT_I8 || b->dtype != NPU_DT_I8 || out->dtype != NPU_DT_I8) {
      return "is not I8 x I8 -> I8";
    }
    if (site->mul.a_zero_point != a->q.zero_point || site->mul.b_zero_point != b->q.zero_point ||
        site->mul.y_zero_point != out->q.zero_point) {
      return "has multiply zero points that are not its tensors'";
    }
    return NULL;
  case NPU_OP_SILU:
    if (a->dtype != NPU_DT_I8 || out->dtype != NPU_DT_I8) return "is not I8 -> I8";
    return NULL;
  case NPU_OP_RMSNORM: /* the site's own ranges: verify_site */
    if (a->dtype != NPU_DT_I16 || a->q.zero_point != 0 || out->dtype != NPU_DT_I8) {
      return "is not symmetric I16 -> I8";
    }
    if (site->n != a->ne[1]) {
      snprintf(why, cap, "has %d multipliers for a norm of width %d", site->n, a->ne[1]);
      return why;
    }
    if (site->rmsnorm.y_zero_point != out->q.zero_point) {
      return "has an output zero point not its tensor's";
    }
    return NULL;
  case NPU_OP_LAST_ROW: /* the same type on both sides: verify_nodes */
    if (!bits_equal(a->q.scale, out->q.scale) || a->q.zero_point != out->q.zero_point) {
      return "copies a row into a tensor of another quantization";
    }
    return NULL;
  case NPU_OP_QK: /* the cache copy b: check_cache */
    if (a->dtype != NPU_DT_I8 || out->dtype != NPU_DT_I16) return "is not I8 x I8 -> I16";
    if (v->m->cfg.head_dim > NPU_QS8_GEMM_MAX_K)
      return "has heads wider than the integer kernel's 32768";
    if (site->qk.q_zero_point != a->q.zero_point || site->qk.k_zero_point != b->q.zero_point ||
        site->qk.s_zero_point != out->q.zero_point) {
      return "has score zero points that are not its tensors'";
    }
    return NULL;
  case NPU_OP_SOFTMAX:
    if (a->dtype != NPU_DT_I16 || out->dtype != NPU_DT_I16) return "is not I16 -> I16";
    if (g->ctx >= (1 << 24)) return "has a context beyond the integer softmax's 2^24";
    if (!bits_equal(out->q.scale, npu_prob_scale()) || out->q.zero_point != 0) {
      return "does not write Q15 probabilities (scale 2^-15, zero point 0)";
    }
    return NULL;
  case NPU_OP_PV: {
    if (a->dtype != NPU_DT_I16 || out->dtype != NPU_DT_I8) return "is not I16 x I8 -> I8";
    if (!bits_equal(a->q.scale, npu_prob_scale()) || a->q.zero_point != 0) {
      return "does not read Q15 probabilities (scale 2^-15, zero point 0)";
    }
    /* probabilities: a softmax's (on the NPU, or on the CPU and transferred), whose rows sum
     * to at most 2^16, so the kernel's int32 sums cannot overflow */
    int32_t w = writer_of(g, n->in[0], i);
    if (w >= 0 && g->nodes[w].op == NPU_OP_TRANSFER) w = writer_of(g, g->nodes[w].in[0], w);
    if (w < 0 || g->nodes[w].op != NPU_OP_SOFTMAX) return "does not read a softmax's output";
    if (site->pv.v_zero_point != b->q.zero_point || site->pv.y_zero_point != out->q.zero_point) {
      return "has weighted-value zero points that are not its tensors'";
    }
    return NULL;
  }
  default: break;
  }
  return "has no integer kernel on the NPU";
}

/* A SHADOW node: the float share of the outlier channels of the matmul whose site it is linked
 * to, from a CPU F32 activation into a CPU F32 [rows, N]. */
static const char *check_shadow(const struct verify_ctx *v, int32_t i, char *why, size_t cap) {
  const struct npu_graph *g = v->g;
  const struct npu_ir_node *n = &g->nodes[i];
  const struct npu_ir_tensor *out = &g->tensors[n->out];
  const struct npu_ir_tensor *a = &g->tensors[n->in[0]];
  if (v->p->quant_mode == NPU_QUANT_F32) return "is shadow outlier execution in an FP32 program";
  int32_t si = g->node_site[i];
  if (si < 0 || si >= v->p->n_qsites) return "has no integer data";
  const struct npu_qsite *site = &v->p->qsites[si];
  size_t len = strlen(site->name);
  if (site->op != NPU_OP_MATMUL || strncmp(out->name, site->name, len) != 0 ||
      strcmp(out->name + len, ".shadow") != 0) {
    snprintf(why, cap, "is linked to the integer data of '%s' (%s)", site->name,
             npu_op_name((enum npu_op)site->op));
    return why;
  }
  if (site->n_outliers <= 0) return "shadows a matmul without outlier channels";
  if (a->kind != NPU_TK_ACT || a->dtype != NPU_DT_F32 || out->kind != NPU_TK_ACT ||
      out->dtype != NPU_DT_F32) {
    return "does not read and write F32 activations";
  }
  int32_t want = site->outlier_gate != NULL ? site->outlier_dim : site->k;
  if (a->ne[1] != want || out->ne[1] != site->n) {
    snprintf(why, cap, "maps [%d] -> [%d] but its matmul's outliers need [%d] -> [%d]", a->ne[1],
             out->ne[1], want, site->n);
    return why;
  }
  return NULL;
}

/* Every node: placement, operand arenas, and shapes that the model's dimensions fix; in an
 * integer program, each NPU node's and shadow's integer data. */
static npulm_status verify_nodes(const struct verify_ctx *v, int32_t *n_transfers) {
  const struct npu_graph *g = v->g;
  const struct npu_config *c = &v->m->cfg;
  bool quant = v->p->quant_mode != NPU_QUANT_F32;
  int32_t q_dim = c->n_heads * c->head_dim, kv_dim = c->n_kv_heads * c->head_dim;
  char detail[NPULM_ERROR_MAX / 2];
  *n_transfers = 0;
  if (quant != (g->node_site != NULL)) {
    return vfail(v, "%s",
                 quant ? "is not linked to the program's integer data"
                       : "is linked to integer data but the program is FP32");
  }
  for (int32_t i = 0; i < g->n_nodes; i++) {
    const struct npu_ir_node *n = &g->nodes[i];
    enum npu_op op = (enum npu_op)n->op;
    const struct npu_ir_tensor *out = &g->tensors[n->out]; /* ids checked by npu_ir_validate */
    const struct npu_ir_tensor *a = n->in[0] >= 0 ? &g->tensors[n->in[0]] : NULL;
    const struct npu_ir_tensor *b = n->in[1] >= 0 ? &g->tensors[n->in[1]] : NULL;
    const char *why = NULL;
    if (op == NPU_OP_TRANSFER) (*n_transfers)++;
    if (n->backend == NPU_BE_NPU && op != NPU_OP_TRANSFER && !npu_npu_supports(op)) {
      why = "is placed on the NPU, which does not support it";
    } else if (n->pinned > 1 || n->pad != 0 || !isfinite(n->param)) {
      why = "has an invalid flag or parameter";
    }
    /* operands live in the node's backend's arena; a TRANSFER connects the two sides */
    if (why == NULL && op == NPU_OP_TRANSFER) why = check_transfer(v->p, n, a, out);
    for (int s = -1; s < NPU_IR_MAX_IN && why == NULL && op != NPU_OP_TRANSFER; s++) {
      int32_t id = s < 0 ? n->out : n->in[s];
      if (id < 0 || !in_arena(&g->tensors[id])) continue;
      if (g->tensors[id].backend != n->backend) why = "uses a tensor in the other backend's arena";
    }
    /* [heads, rows, ctx] scores only where attention makes them; everything else is [rows, n] */
    bool scores_ok = op == NPU_OP_TRANSFER; /* either shape */
    for (int s = -1; s < NPU_IR_MAX_IN && why == NULL; s++) {
      int32_t id = s < 0 ? n->out : n->in[s];
      if (id < 0 || (g->tensors[id].kind != NPU_TK_ACT && g->tensors[id].kind != NPU_TK_LOGITS)) {
        continue;
      }
      const struct npu_ir_tensor *t = &g->tensors[id];
      bool want_scores =
          (op == NPU_OP_QK && s < 0) || (op == NPU_OP_PV && s == 0) || op == NPU_OP_SOFTMAX;
      bool want_cache = (op == NPU_OP_QK || op == NPU_OP_PV) && s == 1; /* a copy of a cache */
      if (want_cache ? !is_cache_shape(g, c, t)
                     : want_scores ? !is_scores(g, c, t) : !scores_ok && !is_rows(v, t)) {
        why = "operand shape";
      }
    }
    if (why == NULL) {
      switch (op) {
      case NPU_OP_GATHER:
        if (b->ne[0] != c->n_vocab) why = "gathers from a table without a row per token";
        break;
      case NPU_OP_ROPE:
        if (a->ne[1] != q_dim && a->ne[1] != kv_dim) why = "rotates a tensor that is not q or k";
        break;
      case NPU_OP_KV_WRITE:
        if (a->ne[1] != kv_dim) why = "writes rows that are not kv_dim wide";
        break;
      case NPU_OP_QK:
        if (a->ne[1] != q_dim || b->kv_is_value) why = "does not read q and the K cache";
        if (why == NULL) why = check_cache(v, i, false);
        break;
      case NPU_OP_PV:
        if (out->ne[1] != q_dim || !b->kv_is_value) why = "does not read the V cache into q_dim";
        if (why == NULL) why = check_cache(v, i, true);
        break;
      case NPU_OP_ATTN:
        /* npu_ir_validate: in1 and in2 are a K and a V cache of one layer, of the graph's ctx */
        if (a->ne[1] != q_dim || out->ne[1] != q_dim) why = "does not map q to q_dim";
        else if (b->ref != n->layer) why = "does not read its own layer's caches";
        break;
      case NPU_OP_SHADOW: why = check_shadow(v, i, detail, sizeof(detail)); break;
      case NPU_OP_LAST_ROW:
        /* npu_ir_validate: [rows, cols] -> [1, cols] */
        if (v->logit_rows != 1 || a->dtype != out->dtype) {
          why = "is not a row copy ahead of a one-row output head";
        }
        break;
      case NPU_OP_RMSNORM:
      case NPU_OP_MATMUL:
      case NPU_OP_SOFTMAX:
      case NPU_OP_ADD:
      case NPU_OP_MUL:
      case NPU_OP_TRANSFER:
        /* a cache copied for the integer NPU's attention: into an NPU I8 activation that holds
         * the same cache (npu_ir_validate: of its shape) */
        if (a->kind == NPU_TK_KV &&
            (!quant || out->kind != NPU_TK_ACT || out->backend != NPU_BE_NPU ||
             out->dtype != NPU_DT_I8 || out->kv_is_value != a->kv_is_value)) {
          why = "copies a cache into anything but an NPU I8 copy of it";
        }
        break;
      case NPU_OP_SILU: break; /* npu_ir_validate and the rules above fix every size they use */
      default:
        /* an op added since: verify it here before letting it into a program */
        why = "is not an op this verifier knows";
        break;
      }
    }
    if (why == NULL && quant) {
      if (n->backend == NPU_BE_NPU) {
        why = check_int_node(v, i, detail, sizeof(detail));
      } else if (op != NPU_OP_SHADOW && g->node_site[i] != -1) {
        why = "is a CPU node linked to integer data";
      }
    }
    if (why != NULL) {
      return vfail(v, "node %d (%s -> '%s') %s", i, npu_op_name(op), out->name, why);
    }
  }
  if (*n_transfers != g->n_transfers) {
    return vfail(v, "claims %d transfers but has %d", g->n_transfers, *n_transfers);
  }
  return NPULM_OK;
}

/* Subgraphs: consecutive runs that cover the nodes in order, each on its nodes' backend. */
static npulm_status verify_subgraphs(const struct verify_ctx *v) {
  const struct npu_graph *g = v->g;
  int32_t next = 0;
  for (int32_t s = 0; s < g->n_subgraphs; s++) {
    const struct npu_subgraph *sg = &g->subgraphs[s];
    if (sg->first != next || sg->count < 1 || sg->count > g->n_nodes - next || sg->backend < 0 ||
        sg->backend >= NPU_BE_COUNT) {
      return vfail(v, "subgraph %d (first %d, count %d, backend %d) does not continue at node %d",
                   s, sg->first, sg->count, sg->backend, next);
    }
    for (int32_t i = sg->first; i < sg->first + sg->count; i++) {
      if (g->nodes[i].backend != sg->backend) {
        return vfail(v, "node %d is on the %s but its subgraph %d on the %s", i,
                     npu_backend_name((enum npu_backend)g->nodes[i].backend), s,
                     npu_backend_name((enum npu_backend)sg->backend));
      }
    }
    next += sg->count;
  }
  if (next != g->n_nodes) return vfail(v, "subgraphs cover %d of %d nodes", next, g->n_nodes);
  return NPULM_OK;
}

/* ---- Liveness: no two activations alive at the same node share arena bytes ----------------- */

/* An activation with its lifetime (nodes first .. last, as the planner counts them) and its bytes
 * as elementary ranges lo .. hi - 1 of the arena's compressed offsets. */
struct live_item {
  int32_t id, first, last, lo, hi;
};

/* A segment tree over elementary ranges: add to a range, maximum over a range. max[k] includes
 * add[k], the amount added to the whole of node k's range. */
struct segtree {
  int32_t *max, *add;
};

static int32_t max_i32(int32_t a, int32_t b) { return a > b ? a : b; }

static void seg_add(struct segtree *s, int32_t k, int32_t l, int32_t r, int32_t a, int32_t b,
                    int32_t v) {
  if (b <= l || r <= a) return;
  if (a <= l && r <= b) {
    s->max[k] += v;
    s->add[k] += v;
    return;
  }
  int32_t mid = l + (r - l) / 2;
  seg_add(s, 2 * k + 1, l, mid, a, b, v);
  seg_add(s, 2 * k + 2, mid, r, a, b, v);
  s->max[k] = s->add[k] + max_i32(s->max[2 * k + 1], s->max[2 * k + 2]);
}

static int32_t seg_max(const struct segtree *s, int32_t k, int32_t l, int32_t r, int32_t a,
                       int32_t b) {
  if (b <= l || r <= a) return 0;
  if (a <= l && r <= b) return s->max[k];
  int32_t mid = l + (r - l) / 2;
  return s->add[k] +
         max_i32(seg_max(s, 2 * k + 1, l, mid, a, b), seg_max(s, 2 * k + 2, mid, r, a, b));
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

static int by_first(const void *a, const void *b) {
  const struct live_item *x = a, *y = b;
  return x->first != y->first ? (x->first < y->first ? -1 : 1) : (x->id > y->id) - (x->id < y->id);
}

static int by_last(const void *a, const void *b) {
  const struct live_item *x = *(const struct live_item *const *)a;
  const struct live_item *y = *(const struct live_item *const *)b;
  return (x->last > y->last) - (x->last < y->last);
}

/* Index of 'x' among the 'm' sorted distinct values 'c' (it is one of them). */
static int32_t coord(const uint64_t *c, int32_t m, uint64_t x) {
  int32_t lo = 0, hi = m - 1;
  while (lo < hi) {
    int32_t mid = lo + (hi - lo) / 2;
    if (c[mid] < x)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

struct live_scratch {
  struct live_item *items;
  const struct live_item **ending; /* items by 'last' */
  uint64_t *coords;
  uint8_t *alive;
  struct segtree tree;
};

/* Sweep backend 'be' in node order: when an activation comes alive, the bytes it takes must be
 * free of every activation still alive. O(n log n) in the number of activations. */
static npulm_status sweep_backend(const struct verify_ctx *v, const int32_t *first,
                                  const int32_t *last, int be, struct live_scratch *w) {
  const struct npu_graph *g = v->g;
  int32_t n = 0, m = 0;
  for (int32_t i = 0; i < g->n_tensors; i++) {
    const struct npu_ir_tensor *t = &g->tensors[i];
    if (!in_arena(t) || t->backend != be) continue;
    w->items[n++] = (struct live_item){.id = i, .first = first[i], .last = last[i]};
    w->coords[m++] = t->offset;
    w->coords[m++] = t->offset + npu_ir_tensor_bytes(t); /* in the arena: no overflow */
  }
  if (n == 0) return NPULM_OK;
  qsort(w->coords, (size_t)m, sizeof(*w->coords), cmp_u64);
  int32_t u = 1;
  for (int32_t i = 1; i < m; i++) {
    if (w->coords[i] != w->coords[u - 1]) w->coords[u++] = w->coords[i];
  }
  int32_t segs = u - 1; /* elementary ranges between consecutive offsets; >= 1 */
  for (int32_t i = 0; i < n; i++) {
    const struct npu_ir_tensor *t = &g->tensors[w->items[i].id];
    w->items[i].lo = coord(w->coords, u, t->offset);
    w->items[i].hi = coord(w->coords, u, t->offset + npu_ir_tensor_bytes(t));
  }
  qsort(w->items, (size_t)n, sizeof(*w->items), by_first);
  for (int32_t i = 0; i < n; i++) w->ending[i] = &w->items[i];
  qsort(w->ending, (size_t)n, sizeof(*w->ending), by_last);
  memset(w->tree.max, 0, (size_t)4 * (size_t)segs * sizeof(int32_t));
  memset(w->tree.add, 0, (size_t)4 * (size_t)segs * sizeof(int32_t));
  memset(w->alive, 0, (size_t)n);
  int32_t k = 0;
  for (int32_t i = 0; i < n; i++) {
    const struct live_item *it = &w->items[i];
    /* activations whose last reader ran before this one is written are dead (and were added:
     * first <= last < it->first) */
    for (; k < n && w->ending[k]->last < it->first; k++) {
      seg_add(&w->tree, 0, 0, segs, w->ending[k]->lo, w->ending[k]->hi, -1);
      w->alive[w->ending[k] - w->items] = 0;
    }
    if (seg_max(&w->tree, 0, 0, segs, it->lo, it->hi) > 0) {
      for (int32_t j = 0; j < n; j++) {
        const struct live_item *o = &w->items[j];
        if (w->alive[j] && o->lo < it->hi && it->lo < o->hi) {
          return vfail(v, "tensors %d ('%s') and %d ('%s') share arena bytes while both are live",
                       o->id, g->tensors[o->id].name, it->id, g->tensors[it->id].name);
        }
      }
    }
    seg_add(&w->tree, 0, 0, segs, it->lo, it->hi, 1);
    w->alive[i] = 1;
  }
  return NPULM_OK;
}

static npulm_status verify_liveness(const struct verify_ctx *v) {
  const struct npu_graph *g = v->g;
  size_t n = (size_t)(g->n_tensors > 0 ? g->n_tensors : 1);
  int32_t *first = malloc(2 * n * sizeof(int32_t));
  struct live_scratch w = {
      .items = malloc(n * sizeof(*w.items)),
      .ending = malloc(n * sizeof(*w.ending)),
      .coords = malloc(2 * n * sizeof(*w.coords)),
      .alive = malloc(n),
      .tree = {.max = malloc(8 * n * sizeof(int32_t)), .add = malloc(8 * n * sizeof(int32_t))},
  };
  npulm_status st = NPULM_OK;
  if (first == NULL || w.items == NULL || w.ending == NULL || w.coords == NULL || w.alive == NULL ||
      w.tree.max == NULL || w.tree.add == NULL) {
    st = npu_fail(v->err, NPULM_ERR_NOMEM, "out of memory checking a plan");
    goto done;
  }
  int32_t *last = first + n;
  for (int32_t i = 0; i < g->n_tensors; i++) first[i] = last[i] = -1;
  for (int32_t i = 0; i < g->n_nodes; i++) {
    const struct npu_ir_node *node = &g->nodes[i];
    if (first[node->out] < 0) first[node->out] = last[node->out] = i;
    for (int s = 0; s < NPU_IR_MAX_IN; s++) {
      if (node->in[s] >= 0) last[node->in[s]] = i;
    }
  }
  /* every activation is some node's output, so its shape follows from the model's */
  for (int32_t i = 0; i < g->n_tensors && st == NPULM_OK; i++) {
    if (in_arena(&g->tensors[i]) && first[i] < 0) {
      st = vfail(v, "tensor %d ('%s') is no node's output", i, g->tensors[i].name);
    }
  }
  for (int be = 0; be < NPU_BE_COUNT && st == NPULM_OK; be++) {
    st = sweep_backend(v, first, last, be, &w);
  }
done:
  free(first);
  free(w.items);
  free(w.ending);
  free(w.coords);
  free(w.alive);
  free(w.tree.max);
  free(w.tree.add);
  return st;
}

/* The plan: each activation aligned and inside its arena; arenas no larger than all their
 * activations need; two activations alive at the same node never share bytes. */
static npulm_status verify_plan(const struct verify_ctx *v) {
  const struct npu_graph *g = v->g;
  uint64_t bound[NPU_BE_COUNT] = {0};
  for (int32_t i = 0; i < g->n_tensors; i++) {
    const struct npu_ir_tensor *t = &g->tensors[i];
    if (!in_arena(t)) continue;
    uint64_t bytes = npu_ir_tensor_bytes(t), end; /* shape bounded by npu_ir_validate */
    if (t->offset % npu_dtype_size((enum npu_dtype)t->dtype) != 0) {
      return vfail(v, "tensor %d ('%s') at arena offset %llu is not aligned to its type", i,
                   t->name, (unsigned long long)t->offset);
    }
    if (!npu_add_u64(t->offset, bytes, &end) || end > g->arena_size[t->backend]) {
      return vfail(v,
                   "tensor %d ('%s', %llu bytes at offset %llu) lies outside the %s arena of "
                   "%llu bytes",
                   i, t->name, (unsigned long long)bytes, (unsigned long long)t->offset,
                   npu_backend_name((enum npu_backend)t->backend),
                   (unsigned long long)g->arena_size[t->backend]);
    }
    if (!npu_add_u64(bound[t->backend], bytes + ARENA_SLACK, &bound[t->backend])) {
      bound[t->backend] = UINT64_MAX;
    }
  }
  for (int be = 0; be < NPU_BE_COUNT; be++) {
    if (g->arena_size[be] > bound[be]) {
      return vfail(v, "the %s arena of %llu bytes is larger than its tensors need",
                   npu_backend_name((enum npu_backend)be), (unsigned long long)g->arena_size[be]);
    }
  }
  return verify_liveness(v);
}

/* ---- Integer data: sites and the quantization table ------------------------------------- */

/* Fail naming site 'i': "program site I ('name'): <what>". */
static npulm_status NPU_PRINTF(4, 5) sfail(npulm_error *err, const struct npu_program *p, int32_t i,
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
    if (strcmp(p->qsites[j].name, s->name) == 0) return sfail(err, p, i, "is named twice");
  }
  bool table = s->op == NPU_OP_MATMUL || s->op == NPU_OP_GATHER;
  /* a gather may read its table out of a matmul's packed weights of the same [n, k] */
  const struct npu_qsite *owner = NULL;
  if (s->table_site != -1) {
    if (s->op != NPU_OP_GATHER || s->table_site < 0 || s->table_site >= p->n_qsites) {
      return sfail(err, p, i, "reads a table from site %d", s->table_site);
    }
    owner = &p->qsites[s->table_site];
    if (owner->op != NPU_OP_MATMUL || owner->n != s->n || owner->k != s->k ||
        owner->packed != s->packed) {
      return sfail(err, p, i, "reads its table from site %d, which is not a [n %d, k %d] matmul",
                   s->table_site, s->n, s->k);
    }
  }
  if (table) {
    if (s->n < 1 || s->k < 1 ||
        ((s->op == NPU_OP_MATMUL || owner) && s->k > NPU_QS8_GEMM_MAX_K)) {
      return sfail(err, p, i, "has an invalid shape [n %d, k %d]", s->n, s->k);
    }
    uint64_t want = s->op == NPU_OP_MATMUL || owner
                        ? npu_qs8_gemm_packed_size((size_t)s->n, (size_t)s->k)
                        : (uint64_t)s->n * (uint64_t)s->k;
    if (s->packed == NULL || s->packed_size != want) {
      return sfail(err, p, i, "has %llu bytes of packed weights, not the %llu of [n %d, k %d]",
                   (unsigned long long)s->packed_size, (unsigned long long)want, s->n, s->k);
    }
    if (s->mult == NULL || s->shift == NULL) return sfail(err, p, i, "lacks its multipliers");
    for (int32_t c = 0; c < s->n; c++) {
      if (!requant_ok(s->mult[c], s->shift[c])) {
        return sfail(err, p, i, "channel %d has multiplier %d, shift %d (valid: >= 0, -31..30)", c,
                     s->mult[c], s->shift[c]);
      }
    }
  }
  if (s->op != NPU_OP_MATMUL && (s->n_outliers != 0 || s->outliers != NULL ||
                                 s->outlier_w != NULL || s->outlier_gate != NULL ||
                                 s->outlier_up != NULL)) {
    return sfail(err, p, i, "has shadow outliers but is not a matmul");
  }
  switch ((enum npu_op)s->op) {
  case NPU_OP_MATMUL: {
    const struct npu_qs8_gemm_params *q = &s->gemm;
    if (q->mult != s->mult || q->shift != s->shift) return sfail(err, p, i, "GEMM parameters");
    if (q->x_zero_point < INT8_MIN || q->x_zero_point > INT8_MAX ||
        q->y_zero_point < INT16_MIN || q->y_zero_point > INT16_MAX) {
      return sfail(err, p, i, "has GEMM zero points %d, %d out of range", q->x_zero_point,
                   q->y_zero_point);
    }
    const char *why = check_packed(s, detail, sizeof(detail));
    if (why != NULL) return sfail(err, p, i, "%s", why);
    if (s->n_outliers < 0 || s->n_outliers > s->k) {
      return sfail(err, p, i, "has %d outlier channels of %d", s->n_outliers, s->k);
    }
    if (s->n_outliers > 0 && (s->outliers == NULL || s->outlier_w == NULL)) {
      return sfail(err, p, i, "lacks its outlier data");
    }
    for (int32_t o = 0; o < s->n_outliers; o++) {
      int32_t prev = o > 0 ? s->outliers[o - 1] : -1;
      if (s->outliers[o] <= prev || s->outliers[o] >= s->k) {
        return sfail(err, p, i, "outlier %d is channel %d (channels ascend, below %d)", o,
                     s->outliers[o], s->k);
      }
    }
    size_t n_w = (size_t)s->n * (size_t)s->n_outliers;
    bool gate = s->outlier_gate != NULL || s->outlier_up != NULL || s->outlier_dim != 0;
    size_t n_g = gate ? (size_t)s->n_outliers * (size_t)s->outlier_dim : 0;
    if (gate && (s->outlier_gate == NULL || s->outlier_up == NULL || s->outlier_dim < 1 ||
                 s->n_outliers == 0)) {
      return sfail(err, p, i, "has incomplete FFN outlier rows (dim %d)", s->outlier_dim);
    }
    if ((n_w > 0 && !all_finite(s->outlier_w, n_w)) ||
        (n_g > 0 && (!all_finite(s->outlier_gate, n_g) || !all_finite(s->outlier_up, n_g)))) {
      return sfail(err, p, i, "has outlier weights that are not finite");
    }
    return NPULM_OK;
  }
  case NPU_OP_GATHER: {
    const struct npu_qs8_gather_params *q = &s->gather;
    if (q->mult != s->mult || q->shift != s->shift) return sfail(err, p, i, "gather parameters");
    if (q->y_zero_point < INT16_MIN || q->y_zero_point > INT16_MAX) {
      return sfail(err, p, i, "has gather zero point %d out of range", q->y_zero_point);
    }
    return NPULM_OK;
  }
  case NPU_OP_ADD: {
    const struct npu_qadd_params *q = &s->add;
    if (q->left_shift < 0 || q->left_shift > 22 || !add_input_ok(q->a_mult, q->a_shift) ||
        !add_input_ok(q->b_mult, q->b_shift) || !requant_ok(q->y_mult, q->y_shift)) {
      return sfail(err, p, i,
                   "has add parameters out of range (left shift %d, multipliers %d/%d, %d/%d, "
                   "%d/%d)",
                   q->left_shift, q->a_mult, q->a_shift, q->b_mult, q->b_shift, q->y_mult,
                   q->y_shift);
    }
    if (q->a_zero_point < INT16_MIN || q->a_zero_point > INT16_MAX ||
        q->b_zero_point < INT16_MIN || q->b_zero_point > INT16_MAX ||
        q->y_zero_point < INT16_MIN || q->y_zero_point > INT16_MAX) {
      return sfail(err, p, i, "has add zero points out of range");
    }
    return NPULM_OK;
  }
  case NPU_OP_MUL: {
    const struct npu_qmul_params *q = &s->mul;
    if (!requant_ok(q->y_mult, q->y_shift) || q->a_zero_point < INT8_MIN ||
        q->a_zero_point > INT8_MAX || q->b_zero_point < INT8_MIN || q->b_zero_point > INT8_MAX ||
        q->y_zero_point < INT8_MIN || q->y_zero_point > INT8_MAX) {
      return sfail(err, p, i, "has multiply parameters out of range");
    }
    return NPULM_OK;
  }
  case NPU_OP_SILU: return NPULM_OK; /* any table of 256 int8 values */
  case NPU_OP_QK: {
    const struct npu_qs8_qk_params *q = &s->qk;
    if (!requant_ok(q->mult, q->shift) || !zp_fits(NPU_DT_I8, q->q_zero_point) ||
        !zp_fits(NPU_DT_I8, q->k_zero_point) || !zp_fits(NPU_DT_I16, q->s_zero_point)) {
      return sfail(err, p, i,
                   "has score parameters out of range (multiplier %d, shift %d, zero points "
                   "%d, %d, %d)",
                   q->mult, q->shift, q->q_zero_point, q->k_zero_point, q->s_zero_point);
    }
    return NPULM_OK;
  }
  case NPU_OP_SOFTMAX:
    if (!requant_ok(s->softmax.mult, s->softmax.shift)) {
      return sfail(err, p, i, "has softmax parameters out of range (multiplier %d, shift %d)",
                   s->softmax.mult, s->softmax.shift);
    }
    return NPULM_OK;
  case NPU_OP_PV: {
    const struct npu_qs16_pv_params *q = &s->pv;
    if (!requant_ok(q->mult, q->shift) || !zp_fits(NPU_DT_I8, q->v_zero_point) ||
        !zp_fits(NPU_DT_I8, q->y_zero_point)) {
      return sfail(err, p, i,
                   "has weighted-value parameters out of range (multiplier %d, shift %d, zero "
                   "points %d, %d)",
                   q->mult, q->shift, q->v_zero_point, q->y_zero_point);
    }
    return NPULM_OK;
  }
  case NPU_OP_RMSNORM: {
    const struct npu_qs16_rmsnorm_params *q = &s->rmsnorm;
    if (q->eps < 1 || q->eps > ((int64_t)1 << 62) || q->shift < -16 || q->shift > 46 ||
        !zp_fits(NPU_DT_I8, q->y_zero_point)) {
      return sfail(err, p, i,
                   "has norm parameters out of range (eps %lld, shift %d, zero point %d)",
                   (long long)q->eps, q->shift, q->y_zero_point);
    }
    return NPULM_OK;
  }
  case NPU_OP_LAST_ROW: return NPULM_OK; /* a copy: nothing to check */
  default: break;
  }
  return sfail(err, p, i, "is a %s, which has no integer kernel", npu_op_name((enum npu_op)s->op));
}

/* The quantization table: integer types, positive finite scales, zero points that fit. */
static npulm_status verify_qtensors(const struct npu_program *p, npulm_error *err) {
  for (int32_t i = 0; i < p->n_qtensors; i++) {
    const struct npu_qtensor *t = &p->qtensors[i];
    const char *why = NULL;
    if (memchr(t->name, '\0', sizeof(t->name)) == NULL || t->name[0] == '\0')
      why = "has an invalid name";
    else if (!is_int(t->dtype))
      why = "is not I8 or I16";
    else if (!(t->q.scale > 0.0f) || !isfinite(t->q.scale))
      why = "has a scale that is not positive and finite";
    else if (!zp_fits(t->dtype, t->q.zero_point))
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
static npulm_status verify_quant(const struct npu_program *p, npulm_error *err) {
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
  for (int32_t i = 0; i < p->n_qsites && st == NPULM_OK; i++) st = verify_site(p, i, err);
  return st;
}

static npulm_status verify_graph(const struct verify_ctx *v) {
  npulm_error inner;
  npulm_status st = npu_ir_validate(v->g, v->p->n_weights, v->m->cfg.n_layers, &inner);
  if (st != NPULM_OK) return vfail(v, "%s", inner.msg);
  int32_t n_transfers;
  if ((st = verify_tensors(v)) != NPULM_OK || (st = verify_nodes(v, &n_transfers)) != NPULM_OK ||
      (st = verify_subgraphs(v)) != NPULM_OK) {
    return st;
  }
  return verify_plan(v);
}

npulm_status npu_program_verify(const struct npulm_model *m, const struct npu_program *p,
                                npulm_error *err) {
  npulm_error inner;
  if (npu_compile_check_options(&m->cfg, &p->opts, &inner) != NPULM_OK) {
    return with_prefix(err, NPULM_ERR_FORMAT, "program compile options", &inner);
  }
  if (p->opts.float_ops >> NPU_OP_COUNT != 0) {
    return npu_fail(err, NPULM_ERR_FORMAT, "program float_ops 0x%x names unknown ops",
                    p->opts.float_ops);
  }
  struct npu_weight *table = NULL;
  int32_t n_table = 0;
  npulm_status st = npu_weight_table(m, &table, &n_table, err);
  if (st != NPULM_OK) return st;
  bool same = n_table == p->n_weights;
  for (int32_t i = 0; i < n_table && same; i++) {
    /* the model's weight, or a copy the quantizer rewrote (SmoothQuant) of the same shape */
    const float *data = p->weights[i].data;
    bool owned = false;
    for (int32_t j = 0; j < p->n_owned && !owned && data != NULL; j++) owned = p->owned[j] == data;
    same = strcmp(table[i].name, p->weights[i].name) == 0 && table[i].ne0 == p->weights[i].ne0 &&
           table[i].ne1 == p->weights[i].ne1 &&
           (table[i].data == data || (owned && table[i].data != NULL));
  }
  free(table);
  if (!same)
    return npu_fail(err, NPULM_ERR_FORMAT, "program weight table does not match the model");
  if ((st = verify_quant(p, err)) != NPULM_OK) return st;
  enum { MAX_GRAPHS = (1 + 2 * NPU_MAX_CHUNKS) * NPU_MAX_BUCKETS };
  int32_t rows[MAX_GRAPHS], ctx[MAX_GRAPHS], logit_rows[MAX_GRAPHS];
  bool for_generation = p->n_graphs != expected_graphs(&p->opts, false, NULL, NULL, NULL);
  int32_t n = expected_graphs(&p->opts, for_generation, rows, ctx, logit_rows);
  if (p->n_graphs != n) {
    return npu_fail(err, NPULM_ERR_FORMAT, "program has %d graphs but its options make %d",
                    p->n_graphs, n);
  }
  for (int32_t i = 0; i < n; i++) {
    struct verify_ctx v = {.m = m, .p = p, .g = &p->graphs[i], .gi = i,
                           .logit_rows = logit_rows[i], .err = err};
    if (v.g->rows != rows[i] || v.g->ctx != ctx[i]) {
      return vfail(&v, "expected rows %d, ctx %d here", rows[i], ctx[i]);
    }
    if (npu_graph_logit_rows(v.g) != logit_rows[i]) {
      return vfail(&v, "expected logits for %d rows here", logit_rows[i]);
    }
    if ((st = verify_graph(&v)) != NPULM_OK) return st;
  }
  return NPULM_OK;
}

/* ---- Loading -------------------------------------------------------------------------------- */

/* The version check of npu_program_file_check. */
static npulm_status check_version(const struct npu_gguf *g, bool *is_program, npulm_error *err) {
  *is_program = npu_gguf_find(g, KEY_VERSION) != NULL;
  if (!*is_program) return NPULM_OK;
  uint32_t version;
  npulm_status st = npu_gguf_get_u32(g, KEY_VERSION, &version, err);
  if (st != NPULM_OK) return st;
  if (version != NPU_PROGRAM_VERSION) {
    return npu_fail(err, NPULM_ERR_UNSUPPORTED,
                    "program file version %u is not supported (this npulm reads version %d; "
                    "recompile the model)",
                    version, NPU_PROGRAM_VERSION);
  }
  return NPULM_OK;
}

npulm_status npu_program_file_damage(const struct npu_gguf *g, npu_damage_fn damaged, void *user,
                                     int64_t *n_damaged, npulm_error *err) {
  *n_damaged = 0;
  bool is_program;
  npulm_status st = check_version(g, &is_program, err);
  if (st != NPULM_OK) return st;
  if (!is_program) return npu_fail(err, NPULM_ERR_FORMAT, "not a program file (no '%s')", KEY_VERSION);
  struct npu_gguf_arr sums;
  npulm_error inner;
  if (npu_gguf_checksums_find(g, NPU_PROGRAM_CHECKSUMS, &sums, &inner) != NPULM_OK) {
    return with_prefix(err, NPULM_ERR_FORMAT, "program file checksums", &inner);
  }
  for (uint64_t r = 0; r < sums.n; r++) {
    if (npu_gguf_checksum_compute(g, &sums, r) == npu_gguf_checksum_stored(&sums, r)) continue;
    ++*n_damaged;
    if (damaged == NULL) continue;
    char what[DAMAGE_NAME_MAX];
    if (r == 0) {
      snprintf(what, sizeof(what), "the header");
    } else {
      const struct npu_gguf_str *s = &g->tensors[r - 1].name;
      snprintf(what, sizeof(what), "tensor '%.*s'", (int)(s->len < 96 ? s->len : 96), s->ptr);
    }
    uint64_t begin, end;
    npu_gguf_region_bounds(g, r, &begin, &end);
    damaged(user, what, begin, end);
  }
  return NPULM_OK;
}

struct first_damage {
  char what[DAMAGE_NAME_MAX];
  uint64_t begin, end;
};

static void note_first_damage(void *user, const char *what, uint64_t begin, uint64_t end) {
  struct first_damage *f = user;
  if (f->what[0] != '\0') return;
  snprintf(f->what, sizeof(f->what), "%s", what);
  f->begin = begin;
  f->end = end;
}

npulm_status npu_program_file_check(const struct npu_gguf *g, bool *is_program, npulm_error *err) {
  npulm_status st = check_version(g, is_program, err);
  if (st != NPULM_OK || !*is_program) return st;
  struct first_damage first = {0};
  int64_t n;
  if ((st = npu_program_file_damage(g, note_first_damage, &first, &n, err)) != NPULM_OK) return st;
  if (n > 0) {
    return npu_fail(err, NPULM_ERR_FORMAT,
                    "program file is damaged: the checksum of %s (bytes %llu-%llu) does not match"
                    "%s; `npulm verify` lists every damaged part",
                    first.what, (unsigned long long)first.begin, (unsigned long long)first.end,
                    n > 1 ? ", nor do others" : "");
  }
  return NPULM_OK;
}

/* An i32 array under 'key' of records of 'fields' values: '*n' records. */
static npulm_status get_records(const struct npu_gguf *g, const char *key, uint64_t fields,
                                struct npu_gguf_arr *a, int32_t *n, npulm_error *err) {
  npulm_status st = npu_gguf_get_arr(g, key, NPU_GGUF_I32, a, err);
  if (st != NPULM_OK) return st;
  if (a->n % fields != 0 || a->n / fields > INT32_MAX / 4) {
    return npu_fail(err, NPULM_ERR_FORMAT,
                    "metadata key '%s' has %llu values, not a whole number of %llu-value records",
                    key, (unsigned long long)a->n, (unsigned long long)fields);
  }
  *n = (int32_t)(a->n / fields);
  return NPULM_OK;
}

/* An i32 array of at most 'max' values, copied to 'out'. */
static npulm_status get_i32_list(const struct npu_gguf *g, const char *key, int32_t max,
                                 int32_t *out, int32_t *n, npulm_error *err) {
  struct npu_gguf_arr a;
  npulm_status st = npu_gguf_get_arr(g, key, NPU_GGUF_I32, &a, err);
  if (st != NPULM_OK) return st;
  if (a.n > (uint64_t)max) {
    return npu_fail(err, NPULM_ERR_FORMAT, "metadata key '%s' has %llu values (at most %d)", key,
                    (unsigned long long)a.n, max);
  }
  for (uint64_t i = 0; i < a.n; i++) out[i] = arr_i32(&a, i);
  *n = (int32_t)a.n;
  return NPULM_OK;
}

static npulm_status load_options(const struct npu_gguf *g, struct npu_compile_options *o,
                                 npulm_error *err) {
  memset(o, 0, sizeof(*o));
  npulm_status st;
  if ((st = get_i32_list(g, "npulm.compile.chunks", NPU_MAX_CHUNKS, o->chunks, &o->n_chunks,
                         err)) != NPULM_OK ||
      (st = get_i32_list(g, "npulm.compile.buckets", NPU_MAX_BUCKETS, o->buckets, &o->n_buckets,
                         err)) != NPULM_OK ||
      (st = npu_gguf_get_u32(g, "npulm.compile.float_ops", &o->float_ops, err)) != NPULM_OK) {
    return st;
  }
  return NPULM_OK;
}

/* The stored weight-name list must be the model's weight table, name for name. */
static npulm_status check_weight_names(const struct npu_gguf *g, const struct npu_program *p,
                                       npulm_error *err) {
  struct npu_gguf_arr a;
  npulm_status st = npu_gguf_get_arr(g, "npulm.weights", NPU_GGUF_STR, &a, err);
  if (st != NPULM_OK) return st;
  if (a.n != (uint64_t)p->n_weights) {
    return npu_fail(err, NPULM_ERR_FORMAT,
                    "program lists %llu weights but the model's weight table has %d",
                    (unsigned long long)a.n, p->n_weights);
  }
  struct npu_gguf_value *names = malloc((size_t)(a.n ? a.n : 1) * sizeof(*names));
  if (names == NULL) return npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
  npu_gguf_arr_values(&a, names);
  for (int32_t i = 0; i < p->n_weights && st == NPULM_OK; i++) {
    if (!npu_gguf_str_eq(names[i].v.s, p->weights[i].name)) {
      st = npu_fail(err, NPULM_ERR_FORMAT,
                    "program weight %d is '%.*s' but the model's weight table has '%s'", i,
                    (int)(names[i].v.s.len < 64 ? names[i].v.s.len : 64), names[i].v.s.ptr,
                    p->weights[i].name);
    }
  }
  free(names);
  return st;
}

/* Decode the tensor records and names of graph 'gi' into 'gr'. */
static npulm_status load_tensors(const struct npu_gguf *g, int32_t gi, struct npu_graph *gr,
                                 npulm_error *err) {
  char key[96], names_key[96];
  struct npu_gguf_arr rec, names_arr;
  snprintf(key, sizeof(key), "npulm.graph.%d.tensors", gi);
  snprintf(names_key, sizeof(names_key), "npulm.graph.%d.tensor_names", gi);
  npulm_status st;
  if ((st = get_records(g, key, TENSOR_FIELDS, &rec, &gr->n_tensors, err)) != NPULM_OK ||
      (st = npu_gguf_get_arr(g, names_key, NPU_GGUF_STR, &names_arr, err)) != NPULM_OK) {
    return st;
  }
  if (names_arr.n != (uint64_t)gr->n_tensors) {
    return npu_fail(err, NPULM_ERR_FORMAT, "'%s' has %llu names for %d tensors", names_key,
                    (unsigned long long)names_arr.n, gr->n_tensors);
  }
  size_t n = (size_t)(gr->n_tensors ? gr->n_tensors : 1);
  struct npu_gguf_value *names = malloc(n * sizeof(*names));
  gr->tensors = calloc(n, sizeof(*gr->tensors));
  if (names == NULL || gr->tensors == NULL) {
    free(names);
    return npu_fail(err, NPULM_ERR_NOMEM, "out of memory loading graph %d", gi);
  }
  npu_gguf_arr_values(&names_arr, names);
  for (int32_t i = 0; i < gr->n_tensors && st == NPULM_OK; i++) {
    int32_t f[TENSOR_FIELDS];
    for (int k = 0; k < TENSOR_FIELDS; k++)
      f[k] = arr_i32(&rec, (uint64_t)i * TENSOR_FIELDS + (uint64_t)k);
    struct npu_ir_tensor *t = &gr->tensors[i];
    struct npu_gguf_str name = names[i].v.s;
    const char *why = NULL;
    if (f[0] < 0 || f[0] > NPU_TK_LOGITS)
      why = "unknown kind";
    else if (f[1] < 0 || f[1] >= NPU_DT_COUNT)
      why = "unknown dtype";
    else if (f[2] < 0 || f[2] >= NPU_BE_COUNT)
      why = "unknown backend";
    else if (f[3] < 0 || f[3] > 1)
      why = "invalid kv_is_value";
    else if (f[4] <= 0 || f[5] <= 0 || f[6] <= 0)
      why = "non-positive dimension";
    else if (f[7] < -1)
      why = "invalid reference";
    else if (!(bits_f32(f[10]) > 0) || !isfinite(bits_f32(f[10])) || f[11] < -65536 ||
             f[11] > 65535) {
      why = "invalid quantization parameters";
    } else if (name.len >= NPU_IR_NAME_MAX || memchr(name.ptr, '\0', (size_t)name.len) != NULL) {
      why = "invalid name";
    }
    if (why != NULL) {
      st = npu_fail(err, NPULM_ERR_FORMAT, "program graph %d: tensor record %d: %s", gi, i, why);
      break;
    }
    t->kind = (uint8_t)f[0];
    t->dtype = (uint8_t)f[1];
    t->backend = (uint8_t)f[2];
    t->kv_is_value = (uint8_t)f[3];
    t->ne[0] = f[4];
    t->ne[1] = f[5];
    t->ne[2] = f[6];
    t->ref = f[7];
    t->offset = (uint64_t)(uint32_t)f[8] | (uint64_t)(uint32_t)f[9] << 32;
    t->q.scale = bits_f32(f[10]);
    t->q.zero_point = f[11];
    memcpy(t->name, name.ptr, (size_t)name.len);
    t->name[name.len] = '\0';
  }
  free(names);
  return st;
}

static npulm_status load_nodes(const struct npu_gguf *g, int32_t gi, int32_t n_layers,
                               struct npu_graph *gr, npulm_error *err) {
  char key[96];
  struct npu_gguf_arr rec;
  snprintf(key, sizeof(key), "npulm.graph.%d.nodes", gi);
  npulm_status st = get_records(g, key, NODE_FIELDS, &rec, &gr->n_nodes, err);
  if (st != NPULM_OK) return st;
  gr->nodes = calloc((size_t)(gr->n_nodes ? gr->n_nodes : 1), sizeof(*gr->nodes));
  if (gr->nodes == NULL)
    return npu_fail(err, NPULM_ERR_NOMEM, "out of memory loading graph %d", gi);
  for (int32_t i = 0; i < gr->n_nodes; i++) {
    int32_t f[NODE_FIELDS];
    for (int k = 0; k < NODE_FIELDS; k++)
      f[k] = arr_i32(&rec, (uint64_t)i * NODE_FIELDS + (uint64_t)k);
    const char *why = NULL;
    if (f[0] < 0 || f[0] >= NPU_OP_COUNT)
      why = "unknown op";
    else if (f[1] < 0 || f[1] >= NPU_BE_COUNT)
      why = "unknown backend";
    else if (f[2] < 0 || f[2] > 1)
      why = "invalid pinned flag";
    else if (f[6] < 0 || f[6] >= gr->n_tensors)
      why = "output tensor id out of range";
    else if (f[7] < -1 || f[7] >= n_layers)
      why = "layer out of range";
    else if (!isfinite(bits_f32(f[8])))
      why = "parameter is not finite";
    for (int s = 0; s < NPU_IR_MAX_IN && why == NULL; s++) {
      if (f[3 + s] < -1 || f[3 + s] >= gr->n_tensors) why = "input tensor id out of range";
    }
    if (why != NULL) {
      return npu_fail(err, NPULM_ERR_FORMAT, "program graph %d: node record %d: %s", gi, i, why);
    }
    struct npu_ir_node *n = &gr->nodes[i];
    n->op = (uint8_t)f[0];
    n->backend = (uint8_t)f[1];
    n->pinned = (uint8_t)f[2];
    for (int s = 0; s < NPU_IR_MAX_IN; s++) n->in[s] = f[3 + s];
    n->out = f[6];
    n->layer = f[7];
    n->param = bits_f32(f[8]);
  }
  return NPULM_OK;
}

static npulm_status load_graph(const struct npu_gguf *g, int32_t gi, int32_t n_layers,
                               struct npu_graph *gr, npulm_error *err) {
  char key[96];
  struct npu_gguf_arr a;
  int32_t n;
  npulm_status st;
  snprintf(key, sizeof(key), "npulm.graph.%d.info", gi);
  if ((st = get_records(g, key, INFO_FIELDS, &a, &n, err)) != NPULM_OK) return st;
  if (n != 1)
    return npu_fail(err, NPULM_ERR_FORMAT, "metadata key '%s' must hold %d values", key,
                    INFO_FIELDS);
  gr->rows = arr_i32(&a, 0);
  gr->ctx = arr_i32(&a, 1);
  gr->n_transfers = arr_i32(&a, 2);
  snprintf(key, sizeof(key), "npulm.graph.%d.arena_size", gi);
  if ((st = npu_gguf_get_arr(g, key, NPU_GGUF_U64, &a, err)) != NPULM_OK) return st;
  if (a.n != NPU_BE_COUNT) {
    return npu_fail(err, NPULM_ERR_FORMAT, "metadata key '%s' must hold %d values", key,
                    NPU_BE_COUNT);
  }
  memcpy(gr->arena_size, a.data, sizeof(gr->arena_size));
  if ((st = load_tensors(g, gi, gr, err)) != NPULM_OK ||
      (st = load_nodes(g, gi, n_layers, gr, err)) != NPULM_OK) {
    return st;
  }
  snprintf(key, sizeof(key), "npulm.graph.%d.subgraphs", gi);
  if ((st = get_records(g, key, SUBGRAPH_FIELDS, &a, &gr->n_subgraphs, err)) != NPULM_OK) return st;
  gr->subgraphs = calloc((size_t)(gr->n_subgraphs ? gr->n_subgraphs : 1), sizeof(*gr->subgraphs));
  if (gr->subgraphs == NULL)
    return npu_fail(err, NPULM_ERR_NOMEM, "out of memory loading graph %d", gi);
  for (int32_t s = 0; s < gr->n_subgraphs; s++) {
    gr->subgraphs[s].first = arr_i32(&a, (uint64_t)s * SUBGRAPH_FIELDS);
    gr->subgraphs[s].count = arr_i32(&a, (uint64_t)s * SUBGRAPH_FIELDS + 1);
    gr->subgraphs[s].backend = arr_i32(&a, (uint64_t)s * SUBGRAPH_FIELDS + 2);
  }
  return NPULM_OK;
}

/* ---- Loading the integer data ----------------------------------------------------------- */

/* A string array under 'key' of exactly 'n' names, each shorter than NPU_IR_NAME_MAX without NUL
 * bytes, copied into 'dst' + i * stride. */
static npulm_status get_names(const struct npu_gguf *g, const char *key, int32_t n, char *dst,
                              size_t stride, npulm_error *err) {
  struct npu_gguf_arr a;
  npulm_status st = npu_gguf_get_arr(g, key, NPU_GGUF_STR, &a, err);
  if (st != NPULM_OK) return st;
  if (a.n != (uint64_t)n) {
    return npu_fail(err, NPULM_ERR_FORMAT, "'%s' has %llu names for %d records", key,
                    (unsigned long long)a.n, n);
  }
  struct npu_gguf_value *names = malloc((size_t)(n ? n : 1) * sizeof(*names));
  if (names == NULL) return npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
  npu_gguf_arr_values(&a, names);
  for (int32_t i = 0; i < n && st == NPULM_OK; i++) {
    struct npu_gguf_str name = names[i].v.s;
    if (name.len == 0 || name.len >= NPU_IR_NAME_MAX ||
        memchr(name.ptr, '\0', (size_t)name.len) != NULL) {
      st = npu_fail(err, NPULM_ERR_FORMAT, "'%s': name %d is invalid", key, i);
    } else {
      memcpy(dst + (size_t)i * stride, name.ptr, (size_t)name.len);
      dst[(size_t)i * stride + name.len] = '\0';
    }
  }
  free(names);
  return st;
}

static npulm_status load_qtensors(const struct npu_gguf *g, struct npu_program *p,
                                  npulm_error *err) {
  struct npu_gguf_arr rec;
  int32_t n;
  npulm_status st = get_records(g, "npulm.qtensors", QTENSOR_FIELDS, &rec, &n, err);
  if (st != NPULM_OK) return st;
  p->qtensors = calloc((size_t)(n ? n : 1), sizeof(*p->qtensors));
  if (p->qtensors == NULL) return npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
  p->n_qtensors = n;
  if ((st = get_names(g, "npulm.qtensor_names", n, p->qtensors[0].name, sizeof(*p->qtensors),
                      err)) != NPULM_OK) {
    return st;
  }
  for (int32_t i = 0; i < n; i++) {
    int32_t dt = arr_i32(&rec, (uint64_t)i * QTENSOR_FIELDS);
    if (dt != NPU_DT_I8 && dt != NPU_DT_I16) {
      return npu_fail(err, NPULM_ERR_FORMAT, "program quantization table entry %d: dtype %d", i,
                      dt);
    }
    p->qtensors[i].dtype = (uint8_t)dt;
    p->qtensors[i].q.scale = bits_f32(arr_i32(&rec, (uint64_t)i * QTENSOR_FIELDS + 1));
    p->qtensors[i].q.zero_point = arr_i32(&rec, (uint64_t)i * QTENSOR_FIELDS + 2);
  }
  return NPULM_OK; /* values checked by npu_program_verify */
}

/* Tensor 'npulm.qsite.S.<field>' of ggml 'type' and shape [ne0] (ne1 = 0) or [ne0, ne1]. */
static npulm_status site_tensor(const struct npu_gguf *g, const struct npu_program *p, int32_t si,
                                const char *field, uint32_t type, uint64_t ne0, uint64_t ne1,
                                const struct npu_gguf_tensor **out, npulm_error *err) {
  char name[64];
  snprintf(name, sizeof(name), "npulm.qsite.%d.%s", si, field);
  const struct npu_gguf_tensor *t = npu_gguf_find_tensor(g, name);
  if (t == NULL) return sfail(err, p, si, "tensor '%s' is missing", name);
  if (t->type != type || t->n_dims != (ne1 ? 2u : 1u) || t->ne[0] != ne0 ||
      (ne1 && t->ne[1] != ne1)) {
    char shape[64];
    if (ne1) {
      snprintf(shape, sizeof(shape), "[%llu, %llu]", (unsigned long long)ne0,
               (unsigned long long)ne1);
    } else {
      snprintf(shape, sizeof(shape), "[%llu]", (unsigned long long)ne0);
    }
    return sfail(err, p, si, "tensor '%s' is not %s %s", name,
                 type == GGML_I8 ? "I8" : type == GGML_I32 ? "I32" : "F32", shape);
  }
  *out = t;
  return NPULM_OK;
}

/* A heap copy of 'bytes' bytes of tensor 't' (into '*dst'). */
static npulm_status copy_out(const struct npu_gguf_tensor *t, size_t bytes, void **dst,
                             npulm_error *err) {
  *dst = malloc(bytes ? bytes : 1);
  if (*dst == NULL) return npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
  memcpy(*dst, t->data, bytes);
  return NPULM_OK;
}

/* Decode site 'si' from its record 'f' and its tensors. Shapes are checked here, so that every
 * array has the size its record claims; values by npu_program_verify. */
static npulm_status load_site(const struct npu_gguf *g, struct npu_program *p, int32_t si,
                              const int32_t *f, npulm_error *err) {
  struct npu_qsite *s = &p->qsites[si];
  int32_t op = f[0];
  if (op < 0 || op >= NPU_OP_COUNT || !npu_npu_supports((enum npu_op)op)) {
    return sfail(err, p, si, "op %d has no integer kernel", op);
  }
  s->op = (uint8_t)op;
  s->n = f[1];
  s->k = f[2];
  s->n_outliers = f[3];
  s->outlier_dim = f[4];
  /* the fields of the site's op; all others must be 0 */
  int32_t first = 0, count = 0;
  switch ((enum npu_op)op) {
  case NPU_OP_MATMUL: first = 5, count = 2; break;
  case NPU_OP_GATHER: first = 7, count = 1; break;
  case NPU_OP_ADD: first = 8, count = 10; break;
  case NPU_OP_MUL: first = 18, count = 5; break;
  case NPU_OP_QK: first = SITE_QK, count = 5; break;
  case NPU_OP_SOFTMAX: first = SITE_SOFTMAX, count = 2; break;
  case NPU_OP_PV: first = SITE_PV, count = 4; break;
  case NPU_OP_RMSNORM: first = SITE_RMSNORM, count = 4; break;
  default: break; /* SILU: its table, in npulm.qsites.luts; LAST_ROW: nothing */
  }
  bool table = op == NPU_OP_MATMUL || op == NPU_OP_GATHER;
  for (int32_t k = 1; k < SITE_FIELDS; k++) {
    bool used = (k >= first && k < first + count) || (table && k <= 2) ||
                (op == NPU_OP_MATMUL && k <= 4) || (op == NPU_OP_RMSNORM && k == 1);
    if (!used && f[k] != 0) return sfail(err, p, si, "record field %d must be 0 for a %s", k,
                                         npu_op_name((enum npu_op)op));
  }
  s->gemm.x_zero_point = f[5];
  s->gemm.y_zero_point = f[6];
  s->gather.y_zero_point = f[7];
  s->add = (struct npu_qadd_params){.a_zero_point = f[8], .b_zero_point = f[9],
                                    .left_shift = f[10], .a_mult = f[11], .a_shift = f[12],
                                    .b_mult = f[13], .b_shift = f[14], .y_mult = f[15],
                                    .y_shift = f[16], .y_zero_point = f[17]};
  s->mul = (struct npu_qmul_params){.a_zero_point = f[18], .b_zero_point = f[19],
                                    .y_mult = f[20], .y_shift = f[21], .y_zero_point = f[22]};
  const int32_t *q = f + SITE_QK, *sm = f + SITE_SOFTMAX, *pv = f + SITE_PV;
  s->qk = (struct npu_qs8_qk_params){.q_zero_point = q[0], .k_zero_point = q[1], .mult = q[2],
                                     .shift = q[3], .s_zero_point = q[4]};
  s->softmax = (struct npu_qs16_softmax_params){.mult = sm[0], .shift = sm[1]};
  s->pv = (struct npu_qs16_pv_params){.v_zero_point = pv[0], .mult = pv[1], .shift = pv[2],
                                      .y_zero_point = pv[3]};
  const int32_t *rn = f + SITE_RMSNORM;
  s->rmsnorm = (struct npu_qs16_rmsnorm_params){
      .eps = (int64_t)((uint64_t)(uint32_t)rn[1] << 32 | (uint32_t)rn[0]), .shift = rn[2],
      .y_zero_point = rn[3]};
  if (op == NPU_OP_RMSNORM) {
    /* its multipliers, one per channel */
    const struct npu_gguf_tensor *t;
    npulm_status st;
    if (s->n < 1 || s->n > NPU_QS16_RMSNORM_MAX_COLS)
      return sfail(err, p, si, "has width %d", s->n);
    if ((st = site_tensor(g, p, si, "mult", GGML_I32, (uint64_t)s->n, 0, &t, err)) != NPULM_OK ||
        (st = copy_out(t, (size_t)s->n * sizeof(int32_t), (void **)&s->mult, err)) != NPULM_OK) {
      return st;
    }
    s->rmsnorm.mult = s->mult;
    return NPULM_OK;
  }
  if (!table) return NPULM_OK;
  if (s->n < 1 || s->k < 1 || (op == NPU_OP_MATMUL && s->k > NPU_QS8_GEMM_MAX_K)) {
    return sfail(err, p, si, "has an invalid shape [n %d, k %d]", s->n, s->k);
  }
  const struct npu_gguf_tensor *t;
  npulm_status st;
  if (s->table_site < 0) {
    uint64_t packed = op == NPU_OP_MATMUL ? npu_qs8_gemm_packed_size((size_t)s->n, (size_t)s->k)
                                          : (uint64_t)s->n * (uint64_t)s->k;
    if ((st = site_tensor(g, p, si, "packed", GGML_I8, packed, 0, &t, err)) != NPULM_OK) return st;
    s->packed = (void *)t->data; /* in place: p->qsites_mapped */
    s->packed_size = packed;
  }
  size_t n = (size_t)s->n;
  if ((st = site_tensor(g, p, si, "mult", GGML_I32, n, 0, &t, err)) != NPULM_OK ||
      (st = copy_out(t, n * sizeof(int32_t), (void **)&s->mult, err)) != NPULM_OK ||
      (st = site_tensor(g, p, si, "shift", GGML_I32, n, 0, &t, err)) != NPULM_OK ||
      (st = copy_out(t, n * sizeof(int32_t), (void **)&s->shift, err)) != NPULM_OK) {
    return st;
  }
  if (op == NPU_OP_MATMUL) {
    s->gemm.mult = s->mult;
    s->gemm.shift = s->shift;
  } else {
    s->gather.mult = s->mult;
    s->gather.shift = s->shift;
  }
  if (op != NPU_OP_MATMUL || (s->n_outliers == 0 && s->outlier_dim == 0)) {
    if (s->n_outliers != 0 || s->outlier_dim != 0) {
      return sfail(err, p, si, "has shadow outliers but is not a matmul");
    }
    return NPULM_OK;
  }
  if (s->n_outliers < 1 || s->n_outliers > s->k || s->outlier_dim < 0) {
    return sfail(err, p, si, "has %d outlier channels of %d (dim %d)", s->n_outliers, s->k,
                 s->outlier_dim);
  }
  size_t no = (size_t)s->n_outliers, dim = (size_t)s->outlier_dim;
  if ((st = site_tensor(g, p, si, "outliers", GGML_I32, no, 0, &t, err)) != NPULM_OK ||
      (st = copy_out(t, no * sizeof(int32_t), (void **)&s->outliers, err)) != NPULM_OK ||
      (st = site_tensor(g, p, si, "outlier_w", NPU_GGML_F32, no, n, &t, err)) != NPULM_OK ||
      (st = copy_out(t, no * n * sizeof(float), (void **)&s->outlier_w, err)) != NPULM_OK) {
    return st;
  }
  if (dim == 0) return NPULM_OK;
  if ((st = site_tensor(g, p, si, "outlier_gate", NPU_GGML_F32, dim, no, &t, err)) != NPULM_OK ||
      (st = copy_out(t, no * dim * sizeof(float), (void **)&s->outlier_gate, err)) != NPULM_OK ||
      (st = site_tensor(g, p, si, "outlier_up", NPU_GGML_F32, dim, no, &t, err)) != NPULM_OK ||
      (st = copy_out(t, no * dim * sizeof(float), (void **)&s->outlier_up, err)) != NPULM_OK) {
    return st;
  }
  return NPULM_OK;
}

static npulm_status load_sites(const struct npu_gguf *g, struct npu_program *p, npulm_error *err) {
  struct npu_gguf_arr rec, luts;
  int32_t n;
  npulm_status st = get_records(g, "npulm.qsites", SITE_FIELDS, &rec, &n, err);
  if (st != NPULM_OK) return st;
  p->qsites = calloc((size_t)(n ? n : 1), sizeof(*p->qsites));
  if (p->qsites == NULL) return npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
  p->n_qsites = n;
  p->qsites_mapped = true; /* from here on, 'packed' may point into the mapping */
  if ((st = get_names(g, "npulm.qsite_names", n, p->qsites[0].name, sizeof(*p->qsites), err)) !=
      NPULM_OK) {
    return st;
  }
  int32_t n_silu = 0;
  for (int32_t i = 0; i < n; i++) n_silu += arr_i32(&rec, (uint64_t)i * SITE_FIELDS) == NPU_OP_SILU;
  if ((st = npu_gguf_get_arr(g, "npulm.qsites.luts", NPU_GGUF_I8, &luts, err)) != NPULM_OK) {
    return st;
  }
  if (luts.n != (uint64_t)n_silu * LUT_SIZE) {
    return npu_fail(err, NPULM_ERR_FORMAT,
                    "'npulm.qsites.luts' has %llu values for %d SILU sites of %d each",
                    (unsigned long long)luts.n, n_silu, LUT_SIZE);
  }
  /* which gathers read their table out of a matmul's packed weights (absent: none) */
  for (int32_t i = 0; i < n; i++) p->qsites[i].table_site = -1;
  if (npu_gguf_find(g, "npulm.qsites.tables") != NULL) {
    struct npu_gguf_arr tables;
    if ((st = npu_gguf_get_arr(g, "npulm.qsites.tables", NPU_GGUF_I32, &tables, err)) != NPULM_OK) {
      return st;
    }
    if (tables.n != (uint64_t)n) {
      return npu_fail(err, NPULM_ERR_FORMAT, "'npulm.qsites.tables' has %llu values for %d sites",
                      (unsigned long long)tables.n, n);
    }
    for (int32_t i = 0; i < n; i++) {
      int32_t owner = arr_i32(&tables, (uint64_t)i);
      if (owner < -1 || owner >= n || owner == i) {
        return npu_fail(err, NPULM_ERR_FORMAT, "program site %d reads its table from site %d", i,
                        owner);
      }
      p->qsites[i].table_site = owner;
    }
  }
  for (int32_t i = 0, silu = 0; i < n; i++) {
    int32_t f[SITE_FIELDS];
    for (int k = 0; k < SITE_FIELDS; k++) {
      f[k] = arr_i32(&rec, (uint64_t)i * SITE_FIELDS + (uint64_t)k);
    }
    if ((st = load_site(g, p, i, f, err)) != NPULM_OK) return st;
    if (p->qsites[i].op == NPU_OP_SILU) {
      memcpy(p->qsites[i].lut, luts.data + (size_t)silu++ * LUT_SIZE, LUT_SIZE);
    }
  }
  /* borrowed tables point at their matmul's packed weights (npu_program_verify checks the pair) */
  for (int32_t i = 0; i < n; i++) {
    struct npu_qsite *s = &p->qsites[i];
    if (s->table_site < 0) continue;
    s->packed = p->qsites[s->table_site].packed;
    s->packed_size = p->qsites[s->table_site].packed_size;
  }
  /* out of the mapping into huge pages, before npu_program_verify reads them: what is checked is
   * what runs */
  return npu_quant_place_packed(p, err);
}

/* The integer half of a program file: mode and options, the quantization table, the sites; then
 * the kernels for this CPU, and every graph's link to its sites. */
static npulm_status load_quant(const struct npu_gguf *g, struct npu_program *p, npulm_error *err) {
  uint32_t mode;
  npulm_status st = npu_gguf_get_u32(g, "npulm.quant.mode", &mode, err);
  if (st != NPULM_OK) return st;
  if (mode >= NPU_QUANT_MODE_COUNT) {
    return npu_fail(err, NPULM_ERR_FORMAT, "program quantization mode %u is unknown", mode);
  }
  p->quant_mode = (int32_t)mode;
  if (mode == NPU_QUANT_F32) return NPULM_OK;
  if ((st = npu_gguf_get_f32(g, "npulm.quant.smooth_alpha", &p->smooth_alpha, err)) != NPULM_OK ||
      (st = npu_gguf_get_f32(g, "npulm.quant.shadow_threshold", &p->shadow_threshold, err)) !=
          NPULM_OK ||
      (st = load_qtensors(g, p, err)) != NPULM_OK || (st = load_sites(g, p, err)) != NPULM_OK) {
    return st;
  }
  npu_ukernels_select(npu_isa_detect(), &p->uk);
  for (int32_t i = 0; i < p->n_graphs; i++) {
    npulm_error inner;
    if ((st = npu_quant_link(p, &p->graphs[i], &inner)) != NPULM_OK) {
      return npu_fail(err, st, "program graph %d: %s", i, inner.msg);
    }
  }
  return NPULM_OK;
}

npulm_status npu_program_load(const struct npulm_model *m, struct npu_program **out,
                              npulm_error *err) {
  *out = NULL;
  const struct npu_gguf *g = m->gguf;
  bool is_program;
  npulm_status st = npu_program_file_check(g, &is_program, err);
  if (st != NPULM_OK) return st;
  if (!is_program) return npu_fail(err, NPULM_ERR_FORMAT, "missing metadata key '%s'", KEY_VERSION);
  struct npu_program *p = calloc(1, sizeof(*p));
  if (p == NULL) return npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
  npulm_error inner;
  if ((st = load_options(g, &p->opts, err)) != NPULM_OK) goto fail;
  if (npu_compile_check_options(&m->cfg, &p->opts, &inner) != NPULM_OK) {
    st = with_prefix(err, NPULM_ERR_FORMAT, "program compile options", &inner);
    goto fail;
  }
  if ((st = npu_weight_table(m, &p->weights, &p->n_weights, err)) != NPULM_OK ||
      (st = check_weight_names(g, p, err)) != NPULM_OK) {
    goto fail;
  }
  uint32_t count;
  if ((st = npu_gguf_get_u32(g, "npulm.graph.count", &count, err)) != NPULM_OK) goto fail;
  int32_t want = expected_graphs(&p->opts, true, NULL, NULL, NULL);
  if (count != (uint32_t)want) want = expected_graphs(&p->opts, false, NULL, NULL, NULL);
  if (count != (uint32_t)want) {
    st = npu_fail(err, NPULM_ERR_FORMAT, "program has %u graphs but its options make %d", count,
                  expected_graphs(&p->opts, true, NULL, NULL, NULL));
    goto fail;
  }
  p->graphs = calloc((size_t)(want ? want : 1), sizeof(*p->graphs));
  if (p->graphs == NULL) {
    st = npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
    goto fail;
  }
  for (int32_t i = 0; i < want; i++) {
    p->n_graphs++; /* freed with the program, even if half loaded */
    if ((st = load_graph(g, i, m->cfg.n_layers, &p->graphs[i], err)) != NPULM_OK) goto fail;
  }
  if ((st = load_quant(g, p, err)) != NPULM_OK) goto fail;
  if ((st = npu_program_verify(m, p, err)) != NPULM_OK) goto fail;
  program_sizes(m, p);
  *out = p;
  return NPULM_OK;
fail:
  npu_program_free(p);
  return st;
}

/* ---- Saving --------------------------------------------------------------------------------- */

/* Append the encoded value 'v' (what follows its type in a GGUF file) to 'b'. */
static void encode_value(struct npu_gguf_buf *b, const struct npu_gguf_value *v) {
  switch ((enum npu_gguf_vtype)v->type) {
  case NPU_GGUF_U8:
  case NPU_GGUF_BOOL: npu_gguf_buf_put_u8(b, (uint8_t)v->v.u); break;
  case NPU_GGUF_I8: npu_gguf_buf_put_u8(b, (uint8_t)(int8_t)v->v.i); break;
  case NPU_GGUF_U16: npu_gguf_buf_put_u16(b, (uint16_t)v->v.u); break;
  case NPU_GGUF_I16: npu_gguf_buf_put_u16(b, (uint16_t)(int16_t)v->v.i); break;
  case NPU_GGUF_U32: npu_gguf_buf_put_u32(b, (uint32_t)v->v.u); break;
  case NPU_GGUF_I32: npu_gguf_buf_put_u32(b, (uint32_t)(int32_t)v->v.i); break;
  case NPU_GGUF_U64: npu_gguf_buf_put_u64(b, v->v.u); break;
  case NPU_GGUF_I64: npu_gguf_buf_put_u64(b, (uint64_t)v->v.i); break;
  case NPU_GGUF_F32: npu_gguf_buf_put_f32(b, (float)v->v.f); break;
  case NPU_GGUF_F64: npu_gguf_buf_put_f64(b, v->v.f); break;
  case NPU_GGUF_STR: npu_gguf_buf_put_strn(b, v->v.s.ptr, (size_t)v->v.s.len); break;
  case NPU_GGUF_ARR:
    /* the elements were validated in place and are stored back to back: copy them whole */
    npu_gguf_buf_put_u32(b, v->v.a.type);
    npu_gguf_buf_put_u64(b, v->v.a.n);
    npu_gguf_buf_put(b, v->v.a.data, (size_t)v->v.a.size);
    break;
  case NPU_GGUF_VTYPE_COUNT: break;
  }
}

/* The source model's metadata, value for value, except the keys this file owns. */
static npulm_status copy_metadata(struct npu_gguf_writer *w, const struct npu_gguf *src,
                                  npulm_error *err) {
  struct npu_gguf_buf b = {0};
  char *key = NULL;
  npulm_status st = NPULM_OK;
  for (uint64_t i = 0; i < src->n_kv && st == NPULM_OK; i++) {
    const struct npu_gguf_kv *kv = &src->kv[i];
    free(key);
    key = malloc((size_t)kv->key.len + 1);
    if (key == NULL) {
      st = npu_fail(err, NPULM_ERR_NOMEM, "out of memory copying metadata");
      break;
    }
    memcpy(key, kv->key.ptr, (size_t)kv->key.len);
    key[kv->key.len] = '\0';
    if (strlen(key) != kv->key.len || strcmp(key, "general.alignment") == 0 ||
        strncmp(key, "npulm.", 6) == 0) {
      continue; /* a key with a NUL byte cannot be re-added; the others are rewritten */
    }
    if (strcmp(key, "general.file_type") == 0) {
      st = npu_gguf_writer_add_u32(w, key, 0); /* LLAMA_FTYPE_ALL_F32: the weights are F32 now */
      continue;
    }
    b.size = 0;
    encode_value(&b, &kv->val);
    if (b.failed) {
      st = npu_fail(err, NPULM_ERR_NOMEM, "out of memory copying metadata");
      break;
    }
    st = npu_gguf_writer_add_raw(w, key, kv->val.type, b.data, b.size);
  }
  free(key);
  npu_gguf_buf_free(&b);
  if (npu_gguf_writer_status(w, NULL) != NPULM_OK) return npu_gguf_writer_status(w, err);
  return st;
}

/* The records of graph 'gi' as metadata. */
static npulm_status add_graph(struct npu_gguf_writer *w, int32_t gi, const struct npu_graph *g,
                              npulm_error *err) {
  size_t n_rec = (size_t)g->n_tensors * TENSOR_FIELDS;
  if ((size_t)g->n_nodes * NODE_FIELDS > n_rec) n_rec = (size_t)g->n_nodes * NODE_FIELDS;
  if ((size_t)g->n_subgraphs * SUBGRAPH_FIELDS > n_rec)
    n_rec = (size_t)g->n_subgraphs * SUBGRAPH_FIELDS;
  int32_t *rec = malloc((n_rec ? n_rec : 1) * sizeof(*rec));
  const char **names = malloc((size_t)(g->n_tensors ? g->n_tensors : 1) * sizeof(*names));
  if (rec == NULL || names == NULL) {
    free(rec);
    free(names);
    return npu_fail(err, NPULM_ERR_NOMEM, "out of memory writing graph %d", gi);
  }
  char key[96];
  int32_t info[INFO_FIELDS] = {g->rows, g->ctx, g->n_transfers};
  snprintf(key, sizeof(key), "npulm.graph.%d.info", gi);
  npu_gguf_writer_add_arr(w, key, NPU_GGUF_I32, info, INFO_FIELDS);
  snprintf(key, sizeof(key), "npulm.graph.%d.arena_size", gi);
  npu_gguf_writer_add_arr(w, key, NPU_GGUF_U64, g->arena_size, NPU_BE_COUNT);

  for (int32_t i = 0; i < g->n_tensors; i++) {
    const struct npu_ir_tensor *t = &g->tensors[i];
    int32_t *r = rec + (size_t)i * TENSOR_FIELDS;
    r[0] = t->kind;
    r[1] = t->dtype;
    r[2] = t->backend;
    r[3] = t->kv_is_value;
    r[4] = t->ne[0];
    r[5] = t->ne[1];
    r[6] = t->ne[2];
    r[7] = t->ref;
    r[8] = (int32_t)(uint32_t)(t->offset & 0xffffffffu);
    r[9] = (int32_t)(uint32_t)(t->offset >> 32);
    r[10] = f32_bits(t->q.scale);
    r[11] = t->q.zero_point;
    names[i] = t->name;
  }
  snprintf(key, sizeof(key), "npulm.graph.%d.tensors", gi);
  npu_gguf_writer_add_arr(w, key, NPU_GGUF_I32, rec, (size_t)g->n_tensors * TENSOR_FIELDS);
  snprintf(key, sizeof(key), "npulm.graph.%d.tensor_names", gi);
  npu_gguf_writer_add_arr_str(w, key, names, (size_t)g->n_tensors);

  for (int32_t i = 0; i < g->n_nodes; i++) {
    const struct npu_ir_node *n = &g->nodes[i];
    int32_t *r = rec + (size_t)i * NODE_FIELDS;
    r[0] = n->op;
    r[1] = n->backend;
    r[2] = n->pinned;
    for (int s = 0; s < NPU_IR_MAX_IN; s++) r[3 + s] = n->in[s];
    r[6] = n->out;
    r[7] = n->layer;
    r[8] = f32_bits(n->param);
  }
  snprintf(key, sizeof(key), "npulm.graph.%d.nodes", gi);
  npu_gguf_writer_add_arr(w, key, NPU_GGUF_I32, rec, (size_t)g->n_nodes * NODE_FIELDS);

  for (int32_t s = 0; s < g->n_subgraphs; s++) {
    rec[(size_t)s * SUBGRAPH_FIELDS] = g->subgraphs[s].first;
    rec[(size_t)s * SUBGRAPH_FIELDS + 1] = g->subgraphs[s].count;
    rec[(size_t)s * SUBGRAPH_FIELDS + 2] = g->subgraphs[s].backend;
  }
  snprintf(key, sizeof(key), "npulm.graph.%d.subgraphs", gi);
  npu_gguf_writer_add_arr(w, key, NPU_GGUF_I32, rec, (size_t)g->n_subgraphs * SUBGRAPH_FIELDS);
  free(rec);
  free(names);
  return npu_gguf_writer_status(w, err);
}

/* A tensor of the file: its name, ggml type, data and GGUF shape. */
struct file_tensor {
  const char *name;
  char buf[48]; /* the name of a site's array */
  uint32_t type;
  const void *data;
  uint32_t n_dims;
  uint64_t ne[2];
  uint64_t bytes;
};

/* Every weight the model reads, each once: the weight table's (a tied output shares the
 * embedding's name) and the llama 3 RoPE frequencies. Shapes as in the source file. */
static int32_t file_weights(const struct npulm_model *m, const struct npu_program *p,
                            struct file_tensor *fw) {
  int32_t n = 0;
  for (int32_t i = 0; i < p->n_weights; i++) {
    const struct npu_weight *w = &p->weights[i];
    bool seen = w->data == NULL;
    for (int32_t j = 0; j < n && !seen; j++) seen = strcmp(fw[j].name, w->name) == 0;
    if (seen) continue;
    fw[n] = (struct file_tensor){.name = w->name,
                                 .type = NPU_GGML_F32,
                                 .data = w->data,
                                 .n_dims = w->ne1 == 1 ? 1 : 2,
                                 .ne = {(uint64_t)w->ne0, (uint64_t)w->ne1}};
    const struct npu_gguf_tensor *t = npu_gguf_find_tensor(m->gguf, w->name);
    if (t != NULL && t->n_dims == 2 && t->ne[0] == fw[n].ne[0] && t->ne[1] == fw[n].ne[1]) {
      fw[n].n_dims = 2; /* a matrix of one row stays a matrix */
    }
    n++;
  }
  if (m->w.rope_freqs != NULL) {
    fw[n++] = (struct file_tensor){.name = "rope_freqs.weight",
                                   .type = NPU_GGML_F32,
                                   .data = m->w.rope_freqs,
                                   .n_dims = 1,
                                   .ne = {(uint64_t)m->cfg.rope_dim / 2, 1}};
  }
  for (int32_t i = 0; i < n; i++) fw[i].bytes = fw[i].ne[0] * fw[i].ne[1] * sizeof(float);
  return n;
}

/* The arrays of site 'si' (at most SITE_ARRAYS of them) appended to 'ft' from 'n'. */
#define SITE_ARRAYS 7
static int32_t site_tensors(const struct npu_qsite *s, int32_t si, struct file_tensor *ft,
                            int32_t n) {
  struct {
    const char *field;
    uint32_t type;
    const void *data;
    uint64_t ne0, ne1, size;
  } arrays[SITE_ARRAYS] = {
      {"packed", GGML_I8, s->packed, s->packed_size, 0, 1},
      {"mult", GGML_I32, s->mult, (uint64_t)s->n, 0, 4},
      {"shift", GGML_I32, s->shift, (uint64_t)s->n, 0, 4},
      {"outliers", GGML_I32, s->outliers, (uint64_t)s->n_outliers, 0, 4},
      {"outlier_w", NPU_GGML_F32, s->outlier_w, (uint64_t)s->n_outliers, (uint64_t)s->n, 4},
      {"outlier_gate", NPU_GGML_F32, s->outlier_gate, (uint64_t)s->outlier_dim,
       (uint64_t)s->n_outliers, 4},
      {"outlier_up", NPU_GGML_F32, s->outlier_up, (uint64_t)s->outlier_dim,
       (uint64_t)s->n_outliers, 4},
  };
  bool table = s->op == NPU_OP_MATMUL || s->op == NPU_OP_GATHER;
  for (int a = 0; a < SITE_ARRAYS; a++) {
    /* the packed table and multipliers of a matmul or gather; the outlier arrays it has */
    bool has = table ? (a == 0   ? s->table_site < 0
                        : a < 3  ? true
                        : a < 5  ? s->n_outliers > 0
                                 : s->outlier_dim > 0)
                     : s->op == NPU_OP_RMSNORM && a == 1;
    if (!has) continue;
    struct file_tensor *t = &ft[n++];
    snprintf(t->buf, sizeof(t->buf), "npulm.qsite.%d.%s", si, arrays[a].field);
    t->name = t->buf;
    t->type = arrays[a].type;
    t->data = arrays[a].data;
    t->n_dims = arrays[a].ne1 ? 2 : 1;
    t->ne[0] = arrays[a].ne0;
    t->ne[1] = arrays[a].ne1 ? arrays[a].ne1 : 1;
    t->bytes = t->ne[0] * t->ne[1] * arrays[a].size;
  }
  return n;
}

/* The integer half of program 'p' as metadata (its arrays are tensors, see site_tensors). */
static npulm_status add_quant(struct npu_gguf_writer *w, const struct npu_program *p,
                              npulm_error *err) {
  npu_gguf_writer_add_u32(w, "npulm.quant.mode", (uint32_t)p->quant_mode);
  if (p->quant_mode == NPU_QUANT_F32) return npu_gguf_writer_status(w, err);
  npu_gguf_writer_add_f32(w, "npulm.quant.smooth_alpha", p->smooth_alpha);
  npu_gguf_writer_add_f32(w, "npulm.quant.shadow_threshold", p->shadow_threshold);
  size_t n_rec = (size_t)p->n_qtensors * QTENSOR_FIELDS;
  if ((size_t)p->n_qsites * SITE_FIELDS > n_rec) n_rec = (size_t)p->n_qsites * SITE_FIELDS;
  size_t n_names = (size_t)(p->n_qtensors > p->n_qsites ? p->n_qtensors : p->n_qsites);
  int32_t *rec = malloc((n_rec ? n_rec : 1) * sizeof(*rec));
  const char **names = malloc((n_names ? n_names : 1) * sizeof(*names));
  int8_t *luts = malloc((size_t)(p->n_qsites ? p->n_qsites : 1) * LUT_SIZE);
  if (rec == NULL || names == NULL || luts == NULL) {
    free(rec);
    free(names);
    free(luts);
    return npu_fail(err, NPULM_ERR_NOMEM, "out of memory writing the integer data");
  }
  for (int32_t i = 0; i < p->n_qtensors; i++) {
    const struct npu_qtensor *t = &p->qtensors[i];
    int32_t *r = rec + (size_t)i * QTENSOR_FIELDS;
    r[0] = t->dtype;
    r[1] = f32_bits(t->q.scale);
    r[2] = t->q.zero_point;
    names[i] = t->name;
  }
  npu_gguf_writer_add_arr(w, "npulm.qtensors", NPU_GGUF_I32, rec, (size_t)p->n_qtensors * 3);
  npu_gguf_writer_add_arr_str(w, "npulm.qtensor_names", names, (size_t)p->n_qtensors);
  size_t n_silu = 0;
  for (int32_t i = 0; i < p->n_qsites; i++) {
    const struct npu_qsite *s = &p->qsites[i];
    int32_t *r = rec + (size_t)i * SITE_FIELDS;
    memset(r, 0, SITE_FIELDS * sizeof(*r));
    bool table = s->op == NPU_OP_MATMUL || s->op == NPU_OP_GATHER;
    r[0] = s->op;
    if (table) {
      r[1] = s->n;
      r[2] = s->k;
    }
    if (s->op == NPU_OP_MATMUL) {
      r[3] = s->n_outliers;
      r[4] = s->outlier_dim;
      r[5] = s->gemm.x_zero_point;
      r[6] = s->gemm.y_zero_point;
    } else if (s->op == NPU_OP_GATHER) {
      r[7] = s->gather.y_zero_point;
    } else if (s->op == NPU_OP_ADD) {
      const struct npu_qadd_params *a = &s->add;
      int32_t v[10] = {a->a_zero_point, a->b_zero_point, a->left_shift, a->a_mult,
                       a->a_shift,      a->b_mult,       a->b_shift,    a->y_mult,
                       a->y_shift,      a->y_zero_point};
      memcpy(r + 8, v, sizeof(v));
    } else if (s->op == NPU_OP_MUL) {
      const struct npu_qmul_params *m = &s->mul;
      int32_t v[5] = {m->a_zero_point, m->b_zero_point, m->y_mult, m->y_shift, m->y_zero_point};
      memcpy(r + 18, v, sizeof(v));
    } else if (s->op == NPU_OP_SILU) {
      memcpy(luts + n_silu++ * LUT_SIZE, s->lut, LUT_SIZE);
    } else if (s->op == NPU_OP_QK) {
      const struct npu_qs8_qk_params *q = &s->qk;
      int32_t v[5] = {q->q_zero_point, q->k_zero_point, q->mult, q->shift, q->s_zero_point};
      memcpy(r + SITE_QK, v, sizeof(v));
    } else if (s->op == NPU_OP_SOFTMAX) {
      r[SITE_SOFTMAX] = s->softmax.mult;
      r[SITE_SOFTMAX + 1] = s->softmax.shift;
    } else if (s->op == NPU_OP_PV) {
      const struct npu_qs16_pv_params *q = &s->pv;
      int32_t v[4] = {q->v_zero_point, q->mult, q->shift, q->y_zero_point};
      memcpy(r + SITE_PV, v, sizeof(v));
    } else if (s->op == NPU_OP_RMSNORM) {
      const struct npu_qs16_rmsnorm_params *q = &s->rmsnorm;
      const uint64_t eps = (uint64_t)q->eps;
      int32_t v[4] = {(int32_t)(uint32_t)eps, (int32_t)(uint32_t)(eps >> 32), q->shift,
                      q->y_zero_point};
      r[1] = s->n;
      memcpy(r + SITE_RMSNORM, v, sizeof(v));
    }
    names[i] = s->name;
  }
  npu_gguf_writer_add_arr(w, "npulm.qsites", NPU_GGUF_I32, rec, (size_t)p->n_qsites * SITE_FIELDS);
  npu_gguf_writer_add_arr_str(w, "npulm.qsite_names", names, (size_t)p->n_qsites);
  npu_gguf_writer_add_arr(w, "npulm.qsites.luts", NPU_GGUF_I8, luts, n_silu * LUT_SIZE);
  bool borrowed = false;
  for (int32_t i = 0; i < p->n_qsites; i++) {
    rec[i] = p->qsites[i].table_site;
    borrowed |= rec[i] >= 0;
  }
  if (borrowed) {
    npu_gguf_writer_add_arr(w, "npulm.qsites.tables", NPU_GGUF_I32, rec, (size_t)p->n_qsites);
  }
  free(rec);
  free(names);
  free(luts);
  return npu_gguf_writer_status(w, err);
}

npulm_status npu_program_save(const struct npulm_model *m, const struct npu_program *p,
                              const char *path, npulm_progress_fn progress, void *user,
                              npulm_error *err) {
  struct npu_gguf_writer *w = NULL;
  size_t cap = (size_t)p->n_weights + 1 + (size_t)p->n_qsites * SITE_ARRAYS;
  struct file_tensor *ft = calloc(cap, sizeof(*ft));
  int32_t *order = calloc(cap, sizeof(*order)); /* the order the tensors are written in */
  const char **weight_names = calloc((size_t)p->n_weights + 1, sizeof(*weight_names));
  npulm_status st;
  if (ft == NULL || order == NULL || weight_names == NULL) {
    st = npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
    goto fail;
  }
  /* the written file would take the place of the one the weights are read from: even written
   * safely, that destroys the user's model file, which is never what was meant */
  if (m->gguf->owns_mapping && npu_file_is(path, m->gguf->file_dev, m->gguf->file_ino)) {
    st = npu_fail(err, NPULM_ERR_ARG,
                  "'%s' is the model's own file: write the program to another path", path);
    goto fail;
  }
  if ((st = npu_gguf_writer_open_file(path, &w, err)) != NPULM_OK) goto fail;
  npu_gguf_writer_add_u32(w, "general.alignment", FILE_ALIGNMENT);
  if ((st = copy_metadata(w, m->gguf, err)) != NPULM_OK) goto fail;

  /* the program */
  for (int32_t i = 0; i < p->n_weights; i++) weight_names[i] = p->weights[i].name;
  npu_gguf_writer_add_u32(w, KEY_VERSION, NPU_PROGRAM_VERSION);
  npu_gguf_writer_add_checksums(w, NPU_PROGRAM_CHECKSUMS);
  npu_gguf_writer_add_arr(w, "npulm.compile.chunks", NPU_GGUF_I32, p->opts.chunks,
                          (size_t)p->opts.n_chunks);
  npu_gguf_writer_add_arr(w, "npulm.compile.buckets", NPU_GGUF_I32, p->opts.buckets,
                          (size_t)p->opts.n_buckets);
  npu_gguf_writer_add_u32(w, "npulm.compile.float_ops", p->opts.float_ops);
  npu_gguf_writer_add_arr_str(w, "npulm.weights", weight_names, (size_t)p->n_weights);
  npu_gguf_writer_add_u32(w, "npulm.graph.count", (uint32_t)p->n_graphs);
  for (int32_t i = 0; i < p->n_graphs; i++) {
    if ((st = add_graph(w, i, &p->graphs[i], err)) != NPULM_OK) goto fail;
  }
  if ((st = add_quant(w, p, err)) != NPULM_OK) goto fail;

  /* the weights, then the sites' arrays */
  int32_t n_ft = file_weights(m, p, ft);
  for (int32_t i = 0; i < p->n_qsites && p->quant_mode != NPU_QUANT_F32; i++) {
    n_ft = site_tensors(&p->qsites[i], i, ft, n_ft);
  }
  /* the small tensors (norms, biases, multipliers) first, side by side: the CPU reads the norms
   * at run time, and a page cache of large folios maps a whole folio (up to megabytes) for one
   * touched page, so each norm stored between two big F32 matrices would bring a megabyte of
   * them into the resident set */
  int32_t n_order = 0;
  for (int pass = 0; pass < 2; pass++) {
    for (int32_t i = 0; i < n_ft; i++) {
      if ((ft[i].bytes < SMALL_TENSOR_BYTES) == (pass == 0)) order[n_order++] = i;
    }
  }
  uint64_t total = 0, done = 0;
  for (int32_t o = 0; o < n_ft; o++) {
    const struct file_tensor *t = &ft[order[o]];
    npu_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, NULL);
    total += t->bytes;
  }
  if ((st = npu_gguf_writer_status(w, err)) != NPULM_OK) goto fail;
  if (progress != NULL) progress(user, 0, total);
  for (int32_t o = 0; o < n_ft; o++) {
    const int32_t i = order[o];
    const uint8_t *data = (const uint8_t *)ft[i].data;
    uint64_t left = ft[i].bytes;
    while (left > 0) {
      size_t k = left < WRITE_CHUNK_BYTES ? (size_t)left : WRITE_CHUNK_BYTES;
      if ((st = npu_gguf_writer_write_data(w, data, k, err)) != NPULM_OK) goto fail;
      data += k;
      left -= k;
      done += k;
      if (progress != NULL) progress(user, done, total);
    }
  }
  st = npu_gguf_writer_finish(w, err);
fail:
  npu_gguf_writer_free(w); /* removes the file unless finished */
  free(ft);
  free(order);
  free(weight_names);
  return st;
}
