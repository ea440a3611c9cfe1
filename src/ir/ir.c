/* Graph IR: construction with validation, whole-graph validation for graphs read from files. */
#include "ir/ir.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"

/* The values of ir/ops.inc's 'where' and 'rows' columns. */
#define OP_ON_NPU true
#define OP_ON_CPU false
#define OP_ROWWISE true
#define OP_WHOLE false

static const struct npu_op_info op_infos[NPU_OP_COUNT] = {
#define NPU_OP(id, nm, where, rows, site_groups, cost_class)                                       \
  [NPU_OP_##id] = {.name = nm,                                                                     \
                   .on_npu = OP_##where,                                                           \
                   .rowwise = OP_##rows,                                                           \
                   .sites = site_groups,                                                           \
                   .cost = NPU_COST_##cost_class},
#include "ir/ops.inc"
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
  t->layer = -1;
  t->q.scale = 1.0f;
  snprintf(t->name, sizeof(t->name), "%s", name);
  return g->n_tensors++;
}

int32_t npu_ir_add_node(struct npu_ir_builder *b, enum npu_op op, int32_t in0, int32_t in1,
                        int32_t in2, int32_t out, int32_t layer, float param) {
  struct npu_ir_node n = {.op = (uint8_t)op,
                          .backend = NPU_BE_CPU,
                          .in = {in0, in1, in2},
                          .out = out,
                          .layer = layer,
                          .param = param};
  return npu_ir_insert_node(b, b->g->n_nodes, &n);
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
    return npu_fail(err, NPULM_ERR_FORMAT, "graph has invalid rows %d / context %d", g->rows,
                    g->ctx);
  }
  for (int32_t i = 0; i < g->n_tensors; i++) {
    const struct npu_ir_tensor *t = &g->tensors[i];
    uint64_t elems;
    bool ok = t->kind <= NPU_TK_LOGITS && t->dtype < NPU_DT_COUNT && t->backend < NPU_BE_COUNT &&
              t->role < NPU_ROLE_COUNT && t->layer >= -1 && t->layer < n_layers &&
              shape_elems(t->ne, &elems) && elems < (1ull << 40);
    if (ok && t->kind == NPU_TK_WEIGHT) ok = t->ref >= 0 && t->ref < n_weights;
    if (ok && t->kind == NPU_TK_KV) ok = t->ref >= 0 && t->ref < n_layers;
    if (ok && t->kind == NPU_TK_INPUT_IDS) ok = t->dtype == NPU_DT_I32 && t->ne[0] == g->rows;
    if (!ok)
      return npu_fail(err, NPULM_ERR_FORMAT, "graph tensor %d ('%.*s') is invalid", i,
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
      if (id >= 0 && g->tensors[id].kind == NPU_TK_ACT && !written[id])
        why = "reads an unwritten tensor";
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

/* ---- Tensor roles and graph editing for passes ---------------------------------------------- */

static const char *const role_names[NPU_ROLE_COUNT] = {
    [NPU_ROLE_NONE] = "",
    [NPU_ROLE_EMBD] = "embd",
    [NPU_ROLE_ATTN_NORM] = "attn_norm",
    [NPU_ROLE_Q] = "attn_q",
    [NPU_ROLE_K] = "attn_k",
    [NPU_ROLE_V] = "attn_v",
    [NPU_ROLE_Q_ROPE] = "q_rope",
    [NPU_ROLE_K_ROPE] = "k_rope",
    [NPU_ROLE_K_CACHE] = "k_cache",
    [NPU_ROLE_V_CACHE] = "v_cache",
    [NPU_ROLE_KQ] = "kq",
    [NPU_ROLE_KQ_SOFTMAX] = "kq_softmax",
    [NPU_ROLE_KQV] = "kqv",
    [NPU_ROLE_ATTN_OUT] = "attn_out",
    [NPU_ROLE_ATTN_RESIDUAL] = "attn_residual",
    [NPU_ROLE_FFN_NORM] = "ffn_norm",
    [NPU_ROLE_FFN_GATE] = "ffn_gate",
    [NPU_ROLE_FFN_UP] = "ffn_up",
    [NPU_ROLE_FFN_SILU] = "ffn_silu",
    [NPU_ROLE_FFN_GATE_PAR] = "ffn_gate_par",
    [NPU_ROLE_FFN_DOWN] = "ffn_down",
    [NPU_ROLE_FFN_RESIDUAL] = "ffn_residual",
    [NPU_ROLE_LAST_ROW] = "last_row",
    [NPU_ROLE_OUTPUT_NORM] = "output_norm",
    [NPU_ROLE_LOGITS] = "logits",
    [NPU_ROLE_K_CACHE_COPY] = "k_cache",
    [NPU_ROLE_V_CACHE_COPY] = "v_cache",
    [NPU_ROLE_SHADOW] = "shadow",
    [NPU_ROLE_SHADOW_SUM] = "shadowed",
};

const char *npu_tensor_role_name(enum npu_tensor_role role) {
  return (unsigned)role < NPU_ROLE_COUNT ? role_names[role] : "?";
}

void npu_ir_set_role(struct npu_ir_builder *b, int32_t t, int32_t layer,
                     enum npu_tensor_role role) {
  if (b->status != NPULM_OK) return;
  if (t < 0 || t >= b->g->n_tensors || (unsigned)role >= NPU_ROLE_COUNT || layer < -1) {
    builder_fail(b, NPULM_ERR_ARG, "bad tensor id, layer or role");
    return;
  }
  b->g->tensors[t].layer = layer;
  b->g->tensors[t].role = (uint8_t)role;
}

void npu_ir_builder_resume(struct npu_ir_builder *b, struct npu_graph *g) {
  memset(b, 0, sizeof(*b));
  b->g = g;
  /* the arrays hold exactly what they have: the first add grows them */
  b->cap_tensors = g->n_tensors;
  b->cap_nodes = g->n_nodes;
  b->cap_subgraphs = g->n_subgraphs;
}

npulm_status npu_ir_builder_status(const struct npu_ir_builder *b, npulm_error *err) {
  if (b->status != NPULM_OK && err != NULL) *err = b->err;
  return b->status;
}

int32_t npu_ir_add_copy(struct npu_ir_builder *b, int32_t like, enum npu_backend be,
                        const char *name) {
  struct npu_graph *g = b->g;
  if (b->status != NPULM_OK) return -1;
  if (like < 0 || like >= g->n_tensors || (unsigned)be >= NPU_BE_COUNT) {
    return builder_fail(b, NPULM_ERR_ARG, "copy of a bad tensor id or to a bad backend");
  }
  if (!grow((void **)&g->tensors, &b->cap_tensors, g->n_tensors, sizeof(*g->tensors))) {
    return builder_fail(b, NPULM_ERR_NOMEM, "out of memory");
  }
  struct npu_ir_tensor *t = &g->tensors[g->n_tensors];
  *t = g->tensors[like];
  t->kind = NPU_TK_ACT;
  t->ref = -1;
  t->backend = (uint8_t)be;
  if (name != NULL) snprintf(t->name, sizeof(t->name), "%s", name);
  return g->n_tensors++;
}

int32_t npu_ir_insert_node(struct npu_ir_builder *b, int32_t at, const struct npu_ir_node *node) {
  struct npu_graph *g = b->g;
  if (b->status != NPULM_OK) return -1;
  if (at < 0 || at > g->n_nodes) return builder_fail(b, NPULM_ERR_ARG, "bad node index");
  for (int i = 0; i < NPU_IR_MAX_IN; i++) {
    if (node->in[i] < -1 || node->in[i] >= g->n_tensors) {
      return builder_fail(b, NPULM_ERR_ARG, "bad input id");
    }
  }
  if (node->out < 0 || node->out >= g->n_tensors) {
    return builder_fail(b, NPULM_ERR_ARG, "bad output id");
  }
  /* node_site, where the graph has it, grows with the nodes to the same capacity */
  int32_t cap_nodes = b->cap_nodes, cap_sites = b->cap_nodes;
  if (!grow((void **)&g->nodes, &cap_nodes, g->n_nodes, sizeof(*g->nodes)) ||
      (g->node_site != NULL &&
       !grow((void **)&g->node_site, &cap_sites, g->n_nodes, sizeof(*g->node_site)))) {
    return builder_fail(b, NPULM_ERR_NOMEM, "out of memory");
  }
  b->cap_nodes = cap_nodes;
  size_t moved = (size_t)(g->n_nodes - at);
  memmove(&g->nodes[at + 1], &g->nodes[at], moved * sizeof(*g->nodes));
  g->nodes[at] = *node;
  if (g->node_site != NULL) {
    memmove(&g->node_site[at + 1], &g->node_site[at], moved * sizeof(*g->node_site));
    g->node_site[at] = -1;
  }
  g->n_nodes++;
  npulm_error err;
  /* validate the node's shapes as soon as it exists: a builder or pass bug fails at build time */
  if (npu_ir_validate(g, INT32_MAX, INT32_MAX, &err) != NPULM_OK) {
    g->n_nodes--;
    memmove(&g->nodes[at], &g->nodes[at + 1], moved * sizeof(*g->nodes));
    if (g->node_site != NULL) {
      memmove(&g->node_site[at], &g->node_site[at + 1], moved * sizeof(*g->node_site));
    }
    return builder_fail(b, NPULM_ERR_ARG, err.msg);
  }
  if (g->n_subgraphs > 0) npu_ir_cut_subgraphs(b);
  return b->status == NPULM_OK ? at : -1;
}

void npu_ir_cut_subgraphs(struct npu_ir_builder *b) {
  struct npu_graph *g = b->g;
  if (b->status != NPULM_OK) return;
  g->n_subgraphs = 0;
  for (int32_t i = 0; i < g->n_nodes; i++) {
    if (i == 0 || g->nodes[i].backend != g->nodes[i - 1].backend) {
      if (!grow((void **)&g->subgraphs, &b->cap_subgraphs, g->n_subgraphs, sizeof(*g->subgraphs))) {
        builder_fail(b, NPULM_ERR_NOMEM, "out of memory");
        return;
      }
      g->subgraphs[g->n_subgraphs++] =
          (struct npu_subgraph){.first = i, .count = 0, .backend = g->nodes[i].backend};
    }
    g->subgraphs[g->n_subgraphs - 1].count++;
  }
}

int32_t npu_ir_find_tensor(const struct npu_graph *g, int32_t layer, enum npu_tensor_role role) {
  for (int32_t t = 0; t < g->n_tensors; t++) {
    if (g->tensors[t].role == role && g->tensors[t].layer == layer) return t;
  }
  return -1;
}

int32_t npu_ir_writer_of(const struct npu_graph *g, int32_t t) {
  for (int32_t i = 0; i < g->n_nodes; i++) {
    if (g->nodes[i].out == t) return i;
  }
  return -1;
}

int32_t npu_ir_weight_of(const struct npu_graph *g, int32_t layer, enum npu_tensor_role role,
                         int slot) {
  int32_t w = npu_ir_writer_of(g, npu_ir_find_tensor(g, layer, role));
  if (w < 0 || g->nodes[w].in[slot] < 0) return -1;
  const struct npu_ir_tensor *t = &g->tensors[g->nodes[w].in[slot]];
  return t->kind == NPU_TK_WEIGHT ? t->ref : -1;
}

int32_t npu_ir_reader_of(const struct npu_graph *g, int32_t t, int32_t from) {
  for (int32_t i = from < 0 ? 0 : from; i < g->n_nodes; i++) {
    for (int s = 0; s < NPU_IR_MAX_IN; s++) {
      if (g->nodes[i].in[s] == t) return i;
    }
  }
  return -1;
}

/* Whether tensor 't' is an activation in backend 'be's arena. */
static bool act_on(const struct npu_graph *g, int32_t t, enum npu_backend be) {
  return t >= 0 && g->tensors[t].kind == NPU_TK_ACT && g->tensors[t].backend == be;
}

int32_t npu_ir_value_on(const struct npu_graph *g, int32_t t, enum npu_backend be) {
  if (t < 0 || t >= g->n_tensors) return -1;
  if (act_on(g, t, be)) return t;
  int32_t w = npu_ir_writer_of(g, t);
  if (w >= 0 && g->nodes[w].op == NPU_OP_TRANSFER && act_on(g, g->nodes[w].in[0], be)) {
    return g->nodes[w].in[0];
  }
  for (int32_t i = 0; i < g->n_nodes; i++) {
    const struct npu_ir_node *n = &g->nodes[i];
    if (n->op == NPU_OP_TRANSFER && n->in[0] == t && act_on(g, n->out, be)) return n->out;
  }
  return -1;
}
