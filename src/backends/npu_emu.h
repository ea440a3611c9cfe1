/* The NPU executor: runs one node of a quantized graph on the emulated NPU with the integer
 * kernels. Integer-only by contract: every scale was turned into fixed-point data at compile time.
 * Its functions are npu_emu_*: the emulated NPU's (npu_backend_* take any backend). */
#ifndef NPU_BACKENDS_NPU_EMU_H
#define NPU_BACKENDS_NPU_EMU_H

#include <stdint.h>

#include "ir/ir.h"
#include "kernels/npu/npu_ukernels.h"
#include "program/program.h"

struct npu_pool;

/* Rows [r0, r1) of row-wise node 'n' of 'g' (an op marked ROWWISE in ir/ops.inc: each row of
 * its output comes from the same rows of its inputs, by a kernel whose bits do not depend on how
 * many rows it is given), with integer data 'site', on the calling thread (operands as for
 * npu_emu_exec_node). */
void npu_emu_exec_rows(const struct npu_graph *g, const struct npu_ir_node *n,
                       const struct npu_qsite *site, const struct npu_ukernels *uk,
                       uint8_t *const arena[NPU_BE_COUNT], int32_t r0, int32_t r1);

/* Run node 'n' of 'g' (an NPU node other than a matmul or a row-wise one, with integer data
 * 'site') on the calling thread: operands in the arenas ('arena[be] + tensor.offset'), token ids
 * 'ids' (g->rows). The step starts at cache position 'pos0' with 'n_valid' real rows (the
 * attention ops' mask; 1 <= n_valid <= g->rows and pos0 + n_valid <= g->ctx). */
void npu_emu_exec_node(const struct npu_graph *g, const struct npu_ir_node *n,
                       const struct npu_qsite *site, const struct npu_ukernels *uk,
                       uint8_t *const arena[NPU_BE_COUNT], const int32_t *ids, int32_t pos0,
                       int32_t n_valid);

/* Matmuls that read one input (a layer's q, k and v; its gate and up) run as one loop over their
 * columns laid end to end, each thread one range of them, front to back, and then the rest of
 * another's that it has not reached: one join instead of several, each thread's share of the
 * weights one longer stream (the sites' packed weights lie in node order, npu_quant_place_packed),
 * and a thread that falls behind is helped with its last columns. At most this many in one loop. */
#define NPU_MATMUL_GROUP_MAX 4

/* How many nodes from 'first' (before 'end', the end of its subgraph) run as one loop: the
 * matmuls on the NPU that read the input of node 'first', up to NPU_MATMUL_GROUP_MAX, when node
 * 'first' is such a matmul; else 1. */
int32_t npu_emu_matmul_group(const struct npu_graph *g, int32_t first, int32_t end);

/* Run the 'count' matmuls of 'g' from node 'first' (as npu_emu_matmul_group counted them) on the
 * threads of 'pool', cut into column ranges; 'sites' is the program's (g->node_site indexes it). */
void npu_emu_exec_matmuls(const struct npu_graph *g, int32_t first, int32_t count,
                          const struct npu_qsite *sites, const struct npu_ukernels *uk,
                          struct npu_pool *pool, uint8_t *const arena[NPU_BE_COUNT]);

#endif /* NPU_BACKENDS_NPU_EMU_H */
