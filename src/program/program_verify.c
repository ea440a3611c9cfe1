/* Verifying a program, loaded or compiled, against its model: every id, shape, type, offset and
 * integer parameter within what the executor and the kernels may be given (npu_program_verify):
 * here the graphs, their tensors, nodes, subgraphs and plan; the integer data in
 * program_verify_sites.c. The file format is described in program_file.h. */
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
      else if (integer && !npu_verify_is_int(t->dtype)) why = "is not I8 or I16 on the integer NPU";
      else if (integer && !npu_verify_zp_fits(t->dtype, t->q.zero_point))
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
  bool ok = a->dtype == out->dtype || (a->dtype == NPU_DT_F32 && npu_verify_is_int(out->dtype)) ||
            (npu_verify_is_int(a->dtype) && out->dtype == NPU_DT_F32);
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
                               : a->dtype != NPU_DT_I8 || !npu_verify_is_int(out->dtype)) {
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
    if (!npu_verify_is_int(out->dtype)) return "is not -> I8/I16";
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
    if (a->dtype != out->dtype || b->dtype != out->dtype || !npu_verify_is_int(out->dtype)) {
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
    if (a->dtype != NPU_DT_I16 || a->q.zero_point != 0 || !npu_verify_is_int(out->dtype)) {
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
  return npu_program_verify_each_site(m, p, NULL, NULL, err);
}

npulm_status npu_program_verify_each_site(const struct npulm_model *m, const struct npu_program *p,
                                          npu_site_checked_fn after_site, void *user,
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
  if ((st = npu_program_verify_quant(p, after_site, user, err)) != NPULM_OK) return st;
  if ((st = npu_program_verify_sparse(p, err)) != NPULM_OK) return st;
  bool *omitted = calloc((size_t)p->n_weights + 1, sizeof(*omitted));
  if (omitted == NULL) return npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
  for (int32_t i = 0; i < p->n_weights && m->n_omitted > 0; i++) {
    omitted[i] = npu_model_omits(m, p->weights[i].name);
  }
  st = verify_graphs(m, p, omitted, err);
  free(omitted);
  return st;
}
