/* Graph IR: construction with validation, whole-graph validation for graphs read from files. */
#include "graph/ir.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

/* The values of graph/ops.inc's 'where' and 'rows' columns. */
#define OP_ON_NPU true
#define OP_ON_CPU false
#define OP_ROWWISE true
#define OP_WHOLE false

static const struct npu_op_info op_infos[NPU_OP_COUNT] = {
#define NPU_OP(id, nm, where, rows, site_groups, cost_class)                                      \
  [NPU_OP_##id] = {.name = nm,                                                                    \
                   .on_npu = OP_##where,                                                          \
                   .rowwise = OP_##rows,                                                          \
                   .sites = site_groups,                                                          \
                   .cost = NPU_COST_##cost_class},
#include "graph/ops.inc"
#undef NPU_OP
};

const struct npu_op_info *npu_op_info(enum npu_op op) {
  assert((unsigned)op < NPU_OP_COUNT);
  return &op_infos[op];
}

const char *npu_op_name(enum npu_op op) {
  return (unsigned)op < NPU_OP_COUNT ? op_infos[op].name : "?";
}

const char *npu_backend_name(enum npu_backend be) {
  return be == NPU_BE_NPU ? "NPU" : be == NPU_BE_CPU ? "CPU" : "?";
}

size_t npu_dtype_size(enum npu_dtype dt) {
  static const size_t sizes[NPU_DT_COUNT] = {4, 1, 2, 4};
  return (unsigned)dt < NPU_DT_COUNT ? sizes[dt] : 0;
}

/* Elements of shape 'ne', or false if a dimension is not positive or the product overflows. */
static bool shape_elems(const int32_t ne[3], uint64_t *n) {
  *n = 1;
  for (int d = 0; d < 3; d++) {
    if (ne[d] <= 0 || !npu_mul_u64(*n, (uint64_t)ne[d], n)) return false;
  }
  return true;
}

uint64_t npu_ir_tensor_bytes(const struct npu_ir_tensor *t) {
  uint64_t n, bytes;
  size_t size = npu_dtype_size((enum npu_dtype)t->dtype);
  if (!shape_elems(t->ne, &n) || !npu_mul_u64(n, size, &bytes)) {
    return UINT64_MAX; /* only for a tensor npu_ir_validate rejects */
  }
  return bytes;
}

void npu_ir_builder_init(struct npu_ir_builder *b, struct npu_graph *g, int32_t rows, int32_t ctx) {
  memset(b, 0, sizeof(*b));
  memset(g, 0, sizeof(*g));
  b->g = g;
  g->rows = rows;
  g->ctx = ctx;
}

/* Record the first failure; later calls see it and do nothing. */
static int32_t builder_fail(struct npu_ir_builder *b, npulm_status st, const char *what) {
  if (b->status == NPULM_OK) {
    b->status = npu_fail(&b->err, st, "graph (rows %d, ctx %d): %s", b->g->rows, b->g->ctx, what);
  }
  return -1;
}

/* Grow an array of 'size'-byte items to hold one more than 'n'. */
static bool grow(void **items, int32_t *cap, int32_t n, size_t size) {
  if (n < *cap) return true;
  int32_t new_cap = *cap ? *cap * 2 : 64;
  void *p = realloc(*items, (size_t)new_cap * size);
  if (p == NULL) return false;
  *items = p;
  *cap = new_cap;
  return true;
}

int32_t npu_ir_add_tensor(struct npu_ir_builder *b, enum npu_tensor_kind kind, enum npu_dtype dt,
                          int32_t ne0, int32_t ne1, int32_t ne2, int32_t ref, const char *name) {
  struct npu_graph *g = b->g;
  if (b->status != NPULM_OK) return -1;
  if (ne0 <= 0 || ne1 <= 0 || ne2 <= 0 || (unsigned)dt >= NPU_DT_COUNT) {
    return builder_fail(b, NPULM_ERR_ARG, "tensor with an invalid shape or type");
  }
  if (!grow((void **)&g->tensors, &b->cap_tensors, g->n_tensors, sizeof(*g->tensors))) {
    return builder_fail(b, NPULM_ERR_NOMEM, "out of memory");
  }
  struct npu_ir_tensor *t = &g->tensors[g->n_tensors];
  memset(t, 0, sizeof(*t));
  t->kind = (uint8_t)kind;
  t->dtype = (uint8_t)dt;
  t->backend = NPU_BE_CPU;
  t->ne[0] = ne0;
  t->ne[1] = ne1;
  t->ne[2] = ne2;
  t->ref = ref;
  t->q.scale = 1.0f;
  snprintf(t->name, sizeof(t->name), "%s", name);
  return g->n_tensors++;
}

int32_t npu_ir_add_node(struct npu_ir_builder *b, enum npu_op op, int32_t in0, int32_t in1,
                        int32_t in2, int32_t out, int32_t layer, float param) {
  struct npu_graph *g = b->g;
  if (b->status != NPULM_OK) return -1;
  int32_t ins[NPU_IR_MAX_IN] = {in0, in1, in2};
  for (int i = 0; i < NPU_IR_MAX_IN; i++) {
    if (ins[i] < -1 || ins[i] >= g->n_tensors) return builder_fail(b, NPULM_ERR_ARG, "bad input id");
  }
  if (out < 0 || out >= g->n_tensors) return builder_fail(b, NPULM_ERR_ARG, "bad output id");
  if (!grow((void **)&g->nodes, &b->cap_nodes, g->n_nodes, sizeof(*g->nodes))) {
    return builder_fail(b, NPULM_ERR_NOMEM, "out of memory");
  }
  struct npu_ir_node *n = &g->nodes[g->n_nodes];
  memset(n, 0, sizeof(*n));
  n->op = (uint8_t)op;
  n->backend = NPU_BE_CPU;
  memcpy(n->in, ins, sizeof(ins));
  n->out = out;
  n->layer = layer;
  n->param = param;
  int32_t id = g->n_nodes++;
  npulm_error err;
  /* validate the node's shapes as soon as it exists: a builder bug fails at build time */
  if (npu_ir_validate(g, INT32_MAX, INT32_MAX, &err) != NPULM_OK) {
    g->n_nodes--;
    return builder_fail(b, NPULM_ERR_ARG, err.msg);
  }
  return id;
}

void npu_graph_free(struct npu_graph *g) {
  if (g == NULL) return;
  free(g->tensors);
  free(g->nodes);
  free(g->subgraphs);
  free(g->node_site);
  memset(g, 0, sizeof(*g));
}

/* ---- Validation ----------------------------------------------------------------------------- */

/* Tensor 'id' as input slot 'slot' of node 'n': must exist and have 'kind' (or any if < 0). */
static const struct npu_ir_tensor *input(const struct npu_graph *g, const struct npu_ir_node *n,
                                         int slot, int kind) {
  int32_t id = n->in[slot];
  if (id < 0 || id >= g->n_tensors) return NULL;
  const struct npu_ir_tensor *t = &g->tensors[id];
  return kind < 0 || t->kind == kind ? t : NULL;
}

static bool is_value(const struct npu_ir_tensor *t) {
  return t != NULL && (t->kind == NPU_TK_ACT || t->kind == NPU_TK_LOGITS);
}

static bool same_shape(const struct npu_ir_tensor *a, const struct npu_ir_tensor *b) {
  return a->ne[0] == b->ne[0] && a->ne[1] == b->ne[1] && a->ne[2] == b->ne[2];
}

/* Check the operands of node 'i'; return NULL or what is wrong. */
static const char *check_node(const struct npu_graph *g, int32_t i) {
  const struct npu_ir_node *n = &g->nodes[i];
  if (n->op >= NPU_OP_COUNT) return "unknown op";
  if (n->backend >= NPU_BE_COUNT) return "unknown backend";
  if (n->out < 0 || n->out >= g->n_tensors) return "output id out of range";
  for (int s = 0; s < NPU_IR_MAX_IN; s++) {
    if (n->in[s] < -1 || n->in[s] >= g->n_tensors) return "input id out of range";
  }
  const struct npu_ir_tensor *out = &g->tensors[n->out];
  const struct npu_ir_tensor *a = n->in[0] >= 0 ? &g->tensors[n->in[0]] : NULL;
  const struct npu_ir_tensor *w, *bias, *b;
  int32_t rows = g->rows;
  switch ((enum npu_op)n->op) {
  case NPU_OP_GATHER:
    w = input(g, n, 1, NPU_TK_WEIGHT);
    if (input(g, n, 0, NPU_TK_INPUT_IDS) == NULL || w == NULL || !is_value(out)) return "operands";
    if (out->ne[0] != rows || out->ne[1] != w->ne[1]) return "shape";
    return NULL;
  case NPU_OP_RMSNORM:
    w = input(g, n, 1, NPU_TK_WEIGHT);
    if (!is_value(a) || w == NULL || !is_value(out)) return "operands";
    if (!same_shape(a, out) || w->ne[1] != a->ne[1]) return "shape";
    return NULL;
  case NPU_OP_MATMUL:
    w = input(g, n, 1, NPU_TK_WEIGHT);
    bias = n->in[2] >= 0 ? input(g, n, 2, NPU_TK_WEIGHT) : NULL;
    if (!is_value(a) || w == NULL || !is_value(out) || (n->in[2] >= 0 && bias == NULL)) {
      return "operands";
    }
    /* weight tensors record [rows of W = N, cols = K] */
    if (w->ne[1] != a->ne[1] || out->ne[0] != a->ne[0] || out->ne[1] != w->ne[0]) return "shape";
    if (bias != NULL && bias->ne[1] != w->ne[0]) return "bias shape";
    return NULL;
  case NPU_OP_ROPE:
  case NPU_OP_SILU:
  case NPU_OP_SOFTMAX:
    if (!is_value(a) || !is_value(out) || !same_shape(a, out)) return "operands";
    return NULL;
  case NPU_OP_TRANSFER:
    /* between activations, or a KV cache copied into an activation of its shape (the integer
     * NPU's attention reads an int8 copy of the cache) */
    if (!is_value(out) || !(is_value(a) || (a != NULL && a->kind == NPU_TK_KV)) ||
        !same_shape(a, out) || (a->kind == NPU_TK_KV && out->kind != NPU_TK_ACT)) {
      return "operands";
    }
    return NULL;
  case NPU_OP_ADD:
  case NPU_OP_MUL:
    b = input(g, n, 1, -1);
    if (!is_value(a) || !is_value(b) || !is_value(out)) return "operands";
    if (!same_shape(a, b) || !same_shape(a, out)) return "shape";
    return NULL;
  case NPU_OP_SHADOW:
    if (!is_value(a) || !is_value(out) || out->ne[0] != a->ne[0]) return "operands";
    return NULL;
  case NPU_OP_KV_WRITE:
    if (!is_value(a) || out->kind != NPU_TK_KV) return "operands";
    if (a->ne[1] != out->ne[1] || out->ne[0] != g->ctx) return "shape";
    return NULL;
  case NPU_OP_QK:
  case NPU_OP_PV: {
    /* the cache, or an activation copy of it ([ctx, kv_dim], made by a TRANSFER) */
    const struct npu_ir_tensor *kv = input(g, n, 1, -1);
    if (kv != NULL && kv->kind != NPU_TK_KV && kv->kind != NPU_TK_ACT) kv = NULL;
    if (!is_value(a) || kv == NULL || !is_value(out) || kv->ne[0] != g->ctx || kv->ne[2] != 1) {
      return "operands";
    }
    if (n->op == NPU_OP_QK) {
      /* q [rows, heads * hd] -> scores [heads, rows, ctx] */
      if (out->ne[1] != rows || out->ne[2] != g->ctx || a->ne[0] != rows) return "shape";
      if (a->ne[1] % out->ne[0] != 0) return "heads";
    } else {
      /* probs [heads, rows, ctx] -> out [rows, heads * hd] */
      if (a->ne[1] != rows || a->ne[2] != g->ctx || out->ne[0] != rows) return "shape";
      if (out->ne[1] % a->ne[0] != 0) return "heads";
    }
    return NULL;
  }
  case NPU_OP_ATTN: {
    /* q [rows, heads * hd] over this layer's K and V caches [ctx, kv_dim] -> [rows, heads * hd] */
    const struct npu_ir_tensor *k = input(g, n, 1, NPU_TK_KV), *v = input(g, n, 2, NPU_TK_KV);
    if (!is_value(a) || k == NULL || v == NULL || !is_value(out) || k->kv_is_value ||
        !v->kv_is_value || k->ref != v->ref) {
      return "operands";
    }
    if (k->ne[0] != g->ctx || k->ne[2] != 1 || !same_shape(k, v)) return "cache shape";
    if (a->ne[0] != rows || !same_shape(a, out)) return "shape";
    return NULL;
  }
  case NPU_OP_LAST_ROW:
    if (!is_value(a) || !is_value(out)) return "operands";
    if (a->ne[0] != rows || out->ne[0] != 1 || a->ne[1] != out->ne[1] || a->ne[2] != 1 ||
        out->ne[2] != 1) {
      return "shape";
    }
    return NULL;
  case NPU_OP_COUNT: break;
  }
  return "unknown op";
}

int32_t npu_graph_logit_rows(const struct npu_graph *g) {
  for (int32_t i = 0; i < g->n_tensors; i++) {
    if (g->tensors[i].kind == NPU_TK_LOGITS) return g->tensors[i].ne[0];
  }
  return g->rows;
}

npulm_status npu_ir_validate(const struct npu_graph *g, int32_t n_weights, int32_t n_layers,
                             npulm_error *err) {
  if (g->rows <= 0 || g->ctx <= 0 || g->rows > g->ctx) {
    return npu_fail(err, NPULM_ERR_FORMAT, "graph has invalid rows %d / context %d", g->rows, g->ctx);
  }
  for (int32_t i = 0; i < g->n_tensors; i++) {
    const struct npu_ir_tensor *t = &g->tensors[i];
    uint64_t elems;
    bool ok = t->kind <= NPU_TK_LOGITS && t->dtype < NPU_DT_COUNT && t->backend < NPU_BE_COUNT &&
              shape_elems(t->ne, &elems) && elems < (1ull << 40);
    if (ok && t->kind == NPU_TK_WEIGHT) ok = t->ref >= 0 && t->ref < n_weights;
    if (ok && t->kind == NPU_TK_KV) ok = t->ref >= 0 && t->ref < n_layers;
    if (ok && t->kind == NPU_TK_INPUT_IDS) ok = t->dtype == NPU_DT_I32 && t->ne[0] == g->rows;
    if (!ok) return npu_fail(err, NPULM_ERR_FORMAT, "graph tensor %d ('%.*s') is invalid", i,
                             NPU_IR_NAME_MAX, t->name);
  }
  /* every activation is written once, before any node reads it */
  uint8_t *written = calloc((size_t)g->n_tensors + 1, 1);
  if (written == NULL) return npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
  npulm_status st = NPULM_OK;
  for (int32_t i = 0; i < g->n_nodes && st == NPULM_OK; i++) {
    const struct npu_ir_node *n = &g->nodes[i];
    const char *why = check_node(g, i);
    for (int s = 0; s < NPU_IR_MAX_IN && why == NULL; s++) {
      int32_t id = n->in[s];
      if (id >= 0 && g->tensors[id].kind == NPU_TK_ACT && !written[id]) why = "reads an unwritten tensor";
    }
    if (why == NULL && g->tensors[n->out].kind == NPU_TK_ACT && written[n->out]) {
      why = "writes a tensor twice";
    }
    if (why != NULL) {
      const char *out_name = n->out >= 0 && n->out < g->n_tensors ? g->tensors[n->out].name : "?";
      st = npu_fail(err, NPULM_ERR_FORMAT, "graph node %d (%s -> '%.*s'): %s", i,
                    npu_op_name((enum npu_op)n->op), NPU_IR_NAME_MAX, out_name, why);
    } else {
      written[n->out] = 1;
    }
  }
  free(written);
  return st;
}
