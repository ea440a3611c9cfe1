/* The quantizer's graph rewrites: shadow outlier execution, the NPU's int8 copies of the caches,
 * int16 logits, and every NPU tensor's dtype and scale (see quantize.h). */
#include <stdio.h>

#include "base/common.h"
#include "compiler/compiler.h"
#include "compiler/quant_internal.h"

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
    npu_quant_kv_copy_name(layer, value, name);
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
npulm_status npu_quant_rewrite_graph(const struct npu_program *p, struct npu_graph *g,
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
