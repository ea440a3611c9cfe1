/* Verifying a program, loaded or compiled, against its model: every id, shape, type, offset and
 * integer parameter within what the executor and the kernels may be given (npu_program_verify).
 * The file format is described in program_file.h. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "compiler/program.h"
#include "compiler/qparams.h"
#include "compiler/quantize.h"
#include "compiler/sparse.h"
#include "program/program_file.h"

#define ARENA_SLACK 4096u /* per tensor: the most alignment padding a plan may add */

npulm_status npu_program_fail_prefixed(npulm_error *err, npulm_status st, const char *prefix,
                                       const npulm_error *inner) {
  return npu_fail(err, st, "%s: %s", prefix, inner->msg);
}

int32_t npu_program_graph_shapes(const struct npu_compile_options *o, bool for_generation,
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

bool npu_program_tensor_name(const struct npu_weight *weights, int32_t n_weights,
                             const struct npu_ir_tensor *t, char name[NPU_IR_NAME_MAX]) {
  int len;
  if (t->kind == NPU_TK_WEIGHT) {
    if (t->ref < 0 || t->ref >= n_weights) return false;
    len = snprintf(name, NPU_IR_NAME_MAX, "%s", weights[t->ref].name);
  } else if (t->role != NPU_ROLE_NONE && t->role < NPU_ROLE_COUNT && t->layer >= -1) {
    const char *what = npu_tensor_role_name((enum npu_tensor_role)t->role);
    len = t->layer >= 0 ? snprintf(name, NPU_IR_NAME_MAX, "blk.%d.%s", t->layer, what)
                        : snprintf(name, NPU_IR_NAME_MAX, "%s", what);
  } else {
    return false;
  }
  return len > 0 && len < NPU_IR_NAME_MAX; /* a cut name is stored */
}

/* ---- Verification --------------------------------------------------------------------------- */

struct verify_ctx {
  const struct npulm_model *m;
  const struct npu_program *p;
  const struct npu_graph *g;
  int32_t gi;
  int32_t logit_rows;  /* g->rows, or 1 for a graph for generation (checked before use) */
  const bool *omitted; /* per weight: the model's file holds no float copy of it (a lean one) */
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
      if (!integer && !f32) why = "is not F32";
      else if (integer && !is_int(t->dtype)) why = "is not I8 or I16 on the integer NPU";
      else if (integer && !zp_fits(t->dtype, t->q.zero_point))
        why = "has a zero point outside its type's range";
      else if (integer && q == NULL) why = "has no entry in the quantization table";
      else if (integer && (q->dtype != t->dtype || !bits_equal(q->q.scale, t->q.scale) ||
                           q->q.zero_point != t->q.zero_point))
        why = "does not match its quantization table entry";
      else if (!is_rows(v, t) && !is_scores(g, c, t) && !(integer && is_cache_shape(g, c, t)))
        why = "has a shape that is neither [rows, n] nor [heads, rows, ctx]";
      else if (t->kind == NPU_TK_LOGITS && (t->ne[1] != c->n_vocab || t->ne[2] != 1))
        why = "is not [rows, n_vocab]";
      else if (t->kind == NPU_TK_LOGITS && t->offset != 0) why = "has an arena offset";
      break;
    }
    case NPU_TK_WEIGHT: {
      const struct npu_weight *w = &v->p->weights[t->ref]; /* ref checked by npu_ir_validate */
      if (!f32) why = "is not F32";
      else if (w->data == NULL && !v->omitted[t->ref])
        why = "refers to a weight the model does not have"; /* a lean file's: verify_nodes */
      else if (t->ne[0] != w->ne1 || t->ne[1] != w->ne0 || t->ne[2] != 1)
        why = "does not have its weight's shape";
      else if (t->offset != 0) why = "has an arena offset";
      break;
    }
    case NPU_TK_INPUT_IDS:
      if (t->ne[1] != 1 || t->ne[2] != 1 || t->offset != 0) why = "is not [rows] token ids";
      break;
    case NPU_TK_KV:
      if (!f32) why = "is not F32";
      else if (t->ne[0] != g->ctx || t->ne[1] != kv_dim || t->ne[2] != 1)
        why = "is not a [ctx, kv_dim] cache";
      else if (t->offset != 0) why = "has an arena offset";
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
  if (!npu_op_info((enum npu_op)n->op)->on_npu) return "has no integer kernel on the NPU";
  /* values of an NPU node live in the NPU arena (npu_emu_exec_node addresses them there) */
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
    if (a->dtype == NPU_DT_I16 ? a->q.zero_point != 0 || out->dtype != NPU_DT_I16
                               : a->dtype != NPU_DT_I8 || !is_int(out->dtype)) {
      return "is not I8 -> I8/I16 nor symmetric I16 -> I16";
    }
    if (a->dtype == NPU_DT_I8 && site->gemm16.acc_shift != 0) {
      return "narrows the sums of an I8 input";
    }
    if (site->k != a->ne[1] || site->n != out->ne[1]) {
      snprintf(why, cap, "has integer data of [n %d, k %d] for a [%d] -> [%d] product", site->n,
               site->k, a->ne[1], out->ne[1]);
      return why;
    }
    if (site->gemm.x_zero_point != (a->dtype == NPU_DT_I8 ? a->q.zero_point : 0) ||
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
    if (a->dtype != out->dtype || b->dtype != out->dtype || !is_int(out->dtype)) {
      return "is not I8 x I8 -> I8 nor I16 x I16 -> I16";
    }
    if (out->dtype == NPU_DT_I16 &&
        (a->q.zero_point != 0 || b->q.zero_point != 0 || out->q.zero_point != 0)) {
      return "multiplies I16 tensors that are not symmetric";
    }
    if (site->mul.a_zero_point != a->q.zero_point || site->mul.b_zero_point != b->q.zero_point ||
        site->mul.y_zero_point != out->q.zero_point) {
      return "has multiply zero points that are not its tensors'";
    }
    return NULL;
  case NPU_OP_SILU:
    if (site->lut_wide ? a->dtype != NPU_DT_I16 || out->dtype != NPU_DT_I16 ||
                             a->q.zero_point != 0 || out->q.zero_point != 0
                       : a->dtype != NPU_DT_I8 || out->dtype != NPU_DT_I8) {
      return site->lut_wide ? "has an int16 table but is not symmetric I16 -> I16"
                            : "has an int8 table but is not I8 -> I8";
    }
    return NULL;
  case NPU_OP_RMSNORM: /* the site's own ranges: verify_site */
    if (a->dtype != NPU_DT_I16 || a->q.zero_point != 0 || !is_int(out->dtype)) {
      return "is not symmetric I16 -> I8/I16";
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
    if (g->ctx > NPU_QS16_SOFTMAX_MAX_LEN) {
      return "has a context beyond the integer softmax's 2^24";
    }
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
    if (n->backend == NPU_BE_NPU && op != NPU_OP_TRANSFER && !npu_op_info(op)->on_npu) {
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
      if (want_cache    ? !is_cache_shape(g, c, t)
          : want_scores ? !is_scores(g, c, t)
                        : !scores_ok && !is_rows(v, t)) {
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
    /* what the executor reads in float it reads from the weight's view: one the file holds */
    for (int s = 0; s < NPU_IR_MAX_IN && why == NULL && npu_node_reads_float(v->p, n); s++) {
      const struct npu_ir_tensor *t = n->in[s] >= 0 ? &g->tensors[n->in[s]] : NULL;
      if (t != NULL && t->kind == NPU_TK_WEIGHT && v->p->weights[t->ref].data == NULL) {
        snprintf(detail, sizeof(detail),
                 "reads weight '%.64s' in float, but the program file holds no float copy of it",
                 v->p->weights[t->ref].name);
        why = detail;
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
    if (c[mid] < x) lo = mid + 1;
    else hi = mid;
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
      if (!requant_ok(s->mult[c], s->shift[c])) {
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
    if (q->left_shift < 0 || q->left_shift > 22 || !add_input_ok(q->a_mult, q->a_shift) ||
        !add_input_ok(q->b_mult, q->b_shift) || !requant_ok(q->y_mult, q->y_shift)) {
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
    if (!requant_ok(q->y_mult, q->y_shift) || q->a_zero_point < INT8_MIN ||
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
    if (!requant_ok(q->mult, q->shift) || !zp_fits(NPU_DT_I8, q->q_zero_point) ||
        !zp_fits(NPU_DT_I8, q->k_zero_point) || !zp_fits(NPU_DT_I16, q->s_zero_point)) {
      return npu_program_site_fail(
          err, p, i,
          "has score parameters out of range (multiplier %d, shift %d, zero points "
          "%d, %d, %d)",
          q->mult, q->shift, q->q_zero_point, q->k_zero_point, q->s_zero_point);
    }
    return NPULM_OK;
  }
  case NPU_OP_SOFTMAX:
    if (!requant_ok(s->softmax.mult, s->softmax.shift)) {
      return npu_program_site_fail(err, p, i,
                                   "has softmax parameters out of range (multiplier %d, shift %d)",
                                   s->softmax.mult, s->softmax.shift);
    }
    return NPULM_OK;
  case NPU_OP_PV: {
    const struct npu_qs16_pv_params *q = &s->pv;
    if (!requant_ok(q->mult, q->shift) || !zp_fits(NPU_DT_I8, q->v_zero_point) ||
        !zp_fits(NPU_DT_I8, q->y_zero_point)) {
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
        !zp_fits(NPU_DT_I8, q->y_zero_point)) {
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
    else if (!is_int(t->dtype)) why = "is not I8 or I16";
    else if (!(t->q.scale > 0.0f) || !isfinite(t->q.scale))
      why = "has a scale that is not positive and finite";
    else if (!zp_fits(t->dtype, t->q.zero_point)) why = "has a zero point outside its type's range";
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
static npulm_status verify_sparse(const struct npu_program *p, npulm_error *err) {
  const struct npu_sparse *sp = p->sparse;
  for (int32_t l = 0; sp != NULL && l < sp->n_layers; l++) {
    const struct npu_sparse_layer *ly = &sp->layers[l];
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

static npulm_status verify_quant(const struct npu_program *p, const struct npu_gguf *g,
                                 npulm_error *err) {
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
    /* under a memory budget the weights stay in the file: checked, they are let go of */
    const uint8_t *w = p->qsites[i].packed;
    if (g != NULL && g->stream && w != NULL && w >= g->base && w < g->base + g->size) {
      const uint64_t at = (uint64_t)(w - g->base);
      npu_gguf_drop(g, at, at + p->qsites[i].packed_size, false);
    }
  }
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

/* Every graph: the specializations the options ask for, each verified whole. */
static npulm_status verify_graphs(const struct npulm_model *m, const struct npu_program *p,
                                  const bool *omitted, npulm_error *err) {
  npulm_status st;
  enum { MAX_GRAPHS = (1 + 2 * NPU_MAX_CHUNKS) * NPU_MAX_BUCKETS };
  int32_t rows[MAX_GRAPHS], ctx[MAX_GRAPHS], logit_rows[MAX_GRAPHS];
  bool for_generation = p->n_graphs != npu_program_graph_shapes(&p->opts, false, NULL, NULL, NULL);
  int32_t n = npu_program_graph_shapes(&p->opts, for_generation, rows, ctx, logit_rows);
  if (p->n_graphs != n) {
    return npu_fail(err, NPULM_ERR_FORMAT, "program has %d graphs but its options make %d",
                    p->n_graphs, n);
  }
  for (int32_t i = 0; i < n; i++) {
    struct verify_ctx v = {.m = m,
                           .p = p,
                           .g = &p->graphs[i],
                           .gi = i,
                           .logit_rows = logit_rows[i],
                           .omitted = omitted,
                           .err = err};
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

npulm_status npu_program_verify(const struct npulm_model *m, const struct npu_program *p,
                                npulm_error *err) {
  npulm_error inner;
  if (npu_compile_check_options(&m->cfg, &p->opts, &inner) != NPULM_OK) {
    return npu_program_fail_prefixed(err, NPULM_ERR_FORMAT, "program compile options", &inner);
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
  if ((st = verify_quant(p, m->gguf, err)) != NPULM_OK) return st;
  if ((st = verify_sparse(p, err)) != NPULM_OK) return st;
  bool *omitted = calloc((size_t)p->n_weights + 1, sizeof(*omitted));
  if (omitted == NULL) return npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
  for (int32_t i = 0; i < p->n_weights && m->n_omitted > 0; i++) {
    omitted[i] = npu_model_omits(m, p->weights[i].name);
  }
  st = verify_graphs(m, p, omitted, err);
  free(omitted);
  return st;
}
