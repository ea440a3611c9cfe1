/* The emulated NPU's declared operator list. Like Hexagon HTP it runs matmuls, element-wise ops,
 * lookup-table activations, gathers, RMSNorm, row copies and the attention matmuls and softmax
 * (the last three only when the precision policy lets them off the CPU). RoPE and KV-cache writes
 * are not on the list: they fall back to the CPU. */
#include "ir/supported.h"

bool npu_emu_supports(enum npu_op op) {
  switch (op) {
  case NPU_OP_GATHER:
  case NPU_OP_MATMUL:
  case NPU_OP_ADD:
  case NPU_OP_MUL:
  case NPU_OP_SILU:
  case NPU_OP_QK:
  case NPU_OP_SOFTMAX:
  case NPU_OP_PV:
  case NPU_OP_RMSNORM:
  case NPU_OP_LAST_ROW:
    return true;
  case NPU_OP_ROPE:
  case NPU_OP_KV_WRITE:
  case NPU_OP_TRANSFER:
  case NPU_OP_SHADOW:
  case NPU_OP_ATTN: /* fused attention is the CPU's; the NPU runs QK, SOFTMAX and PV apart */
  case NPU_OP_COUNT:
    break;
  }
  return false;
}
