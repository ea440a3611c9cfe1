/* The partitioner: places every node on the NPU or the CPU, inserts a TRANSFER where a value
 * crosses between the backends' arenas, and cuts the node list into single-backend subgraphs. */
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "compiler/compiler.h"

npulm_status npu_partition(struct npu_graph *g, uint32_t float_ops, npulm_error *err) {
  /* every input of a node may need a copy: at most 3 new tensors per node */
  size_t max_tensors = (size_t)g->n_tensors + (size_t)g->n_nodes * NPU_IR_MAX_IN;
  /* copy_on[be][t]: id of tensor t's copy in backend be's arena, or -1 */
  int32_t *copy_on = malloc(2 * max_tensors * sizeof(int32_t));
  if (copy_on == NULL) return npu_fail(err, NPULM_ERR_NOMEM, "out of memory partitioning a graph");
  for (size_t i = 0; i < 2 * max_tensors; i++) copy_on[i] = -1;

  struct npu_ir_builder b;
  npu_ir_builder_resume(&b, g);
  g->n_subgraphs = 0; /* cut once all nodes are placed */
  g->n_transfers = 0;
  for (int32_t i = 0; i < g->n_nodes && b.status == NPULM_OK; i++) {
    struct npu_ir_node *node = &g->nodes[i];
    enum npu_backend be =
        npu_fallback_reason((enum npu_op)node->op, float_ops) == NULL ? NPU_BE_NPU : NPU_BE_CPU;
    node->backend = (uint8_t)be;
    node->pinned =
        (npu_op_info((enum npu_op)node->op)->on_npu || node->op == NPU_OP_ATTN) && be == NPU_BE_CPU;
    for (int s = 0; s < NPU_IR_MAX_IN && b.status == NPULM_OK; s++) {
      int32_t src = g->nodes[i].in[s];
      if (src < 0 || g->tensors[src].kind != NPU_TK_ACT || g->tensors[src].backend == be) continue;
      int32_t *copy = &copy_on[(size_t)be * max_tensors + (size_t)src];
      if (*copy < 0) {
        /* the value crosses to this backend: copy it once into this backend's arena, before
         * this node, which moves one up */
        *copy = npu_ir_add_copy(&b, src, be, NULL);
        struct npu_ir_node transfer = {.op = NPU_OP_TRANSFER,
                                       .backend = (uint8_t)be,
                                       .in = {src, -1, -1},
                                       .out = *copy,
                                       .layer = g->nodes[i].layer};
        if (npu_ir_insert_node(&b, i, &transfer) < 0) break;
        i++;
        g->n_transfers++;
      }
      g->nodes[i].in[s] = *copy;
    }
    int32_t out = g->nodes[i].out;
    if (g->tensors[out].kind == NPU_TK_ACT) g->tensors[out].backend = (uint8_t)be;
  }
  free(copy_on);
  npu_ir_cut_subgraphs(&b);
  return npu_ir_builder_status(&b, err);
}
