/* The partitioner: places every node on the NPU or the CPU, inserts a TRANSFER where a value
 * crosses between the backends' arenas, and cuts the node list into single-backend subgraphs. */
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "graph/program.h"

const char *npu_fallback_reason(enum npu_op op, uint32_t float_ops) {
  if (op == NPU_OP_ATTN) {
    /* the builder makes it only where the policy pins all three (npu_attention_fused) */
    return "qk, softmax and pv pinned to float by the precision policy, fused (online softmax)";
  }
  if (!npu_op_info(op)->on_npu) return "not on the NPU's supported list";
  if (float_ops & (1u << op)) return "pinned to float by the precision policy";
  return NULL;
}

bool npu_attention_fused(uint32_t float_ops) {
  return npu_fallback_reason(NPU_OP_QK, float_ops) != NULL &&
         npu_fallback_reason(NPU_OP_SOFTMAX, float_ops) != NULL &&
         npu_fallback_reason(NPU_OP_PV, float_ops) != NULL;
}

npulm_status npu_partition(struct npu_graph *g, uint32_t float_ops, npulm_error *err) {
  /* every input of a node may need a copy, so the lists at most quadruple / grow by 3 per node */
  size_t max_nodes = (size_t)g->n_nodes * (1 + NPU_IR_MAX_IN);
  size_t max_tensors = (size_t)g->n_tensors + (size_t)g->n_nodes * NPU_IR_MAX_IN;
  struct npu_ir_node *nodes = malloc(max_nodes * sizeof(*nodes));
  struct npu_ir_tensor *tensors = realloc(g->tensors, max_tensors * sizeof(*tensors));
  /* copy_on[be][t]: id of tensor t's copy in backend be's arena, or -1 */
  int32_t *copy_on = malloc(2 * max_tensors * sizeof(int32_t));
  if (tensors != NULL) g->tensors = tensors;
  if (nodes == NULL || tensors == NULL || copy_on == NULL) {
    free(nodes);
    free(copy_on);
    return npu_fail(err, NPULM_ERR_NOMEM, "out of memory partitioning a graph");
  }
  for (size_t i = 0; i < 2 * max_tensors; i++) copy_on[i] = -1;

  int32_t n_nodes = 0, n_tensors = g->n_tensors;
  g->n_transfers = 0;
  for (int32_t i = 0; i < g->n_nodes; i++) {
    struct npu_ir_node node = g->nodes[i];
    enum npu_backend be =
        npu_fallback_reason((enum npu_op)node.op, float_ops) == NULL ? NPU_BE_NPU : NPU_BE_CPU;
    node.backend = (uint8_t)be;
    node.pinned = (npu_op_info((enum npu_op)node.op)->on_npu || node.op == NPU_OP_ATTN) &&
                  be == NPU_BE_CPU;
    for (int s = 0; s < NPU_IR_MAX_IN; s++) {
      int32_t src = node.in[s];
      if (src < 0 || tensors[src].kind != NPU_TK_ACT || tensors[src].backend == be) continue;
      int32_t *copy = &copy_on[(size_t)be * max_tensors + (size_t)src];
      if (*copy < 0) {
        /* the value crosses to this backend: copy it once into this backend's arena */
        *copy = n_tensors++;
        tensors[*copy] = tensors[src];
        tensors[*copy].backend = (uint8_t)be;
        nodes[n_nodes++] = (struct npu_ir_node){.op = NPU_OP_TRANSFER, .backend = (uint8_t)be,
                                                .in = {src, -1, -1}, .out = *copy,
                                                .layer = node.layer};
        g->n_transfers++;
      }
      node.in[s] = *copy;
    }
    if (tensors[node.out].kind == NPU_TK_ACT) tensors[node.out].backend = (uint8_t)be;
    nodes[n_nodes++] = node;
  }
  free(copy_on);
  free(g->nodes);
  g->nodes = nodes;
  g->n_nodes = n_nodes;
  g->n_tensors = n_tensors;

  /* subgraphs: maximal runs of one backend */
  free(g->subgraphs);
  g->subgraphs = malloc((size_t)(n_nodes > 0 ? n_nodes : 1) * sizeof(*g->subgraphs));
  if (g->subgraphs == NULL) return npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
  g->n_subgraphs = 0;
  for (int32_t i = 0; i < n_nodes; i++) {
    if (i == 0 || nodes[i].backend != nodes[i - 1].backend) {
      g->subgraphs[g->n_subgraphs++] =
          (struct npu_subgraph){.first = i, .count = 0, .backend = nodes[i].backend};
    }
    g->subgraphs[g->n_subgraphs - 1].count++;
  }
  return NPULM_OK;
}
