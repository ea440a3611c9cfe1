/* The NPU executor: runs one node of a quantized graph on the emulated NPU with the integer
 * kernels. Integer-only by contract: every scale was turned into fixed-point data at compile time. */
#ifndef NPU_NPU_EXECUTOR_H
#define NPU_NPU_EXECUTOR_H

#include <stdint.h>

#include "graph/ir.h"
#include "npu/ukernels.h"
#include "quant/quantize.h"

struct npu_pool;

/* Run node 'n' of 'g' (an NPU node with integer data 'site') on the threads of 'pool' (NULL: the
 * caller alone; matmuls are cut into column ranges): operands in the arenas
 * ('arena[be] + tensor.offset'), token ids 'ids' (g->rows). The step starts at cache position
 * 'pos0' with 'n_valid' real rows (the attention ops' mask; 1 <= n_valid <= g->rows and
 * pos0 + n_valid <= g->ctx). */
void npu_npu_exec_node(const struct npu_graph *g, const struct npu_ir_node *n,
                       const struct npu_qsite *site, const struct npu_ukernels *uk,
                       struct npu_pool *pool, uint8_t *const arena[NPU_BE_COUNT],
                       const int32_t *ids, int32_t pos0, int32_t n_valid);

#endif /* NPU_NPU_EXECUTOR_H */
