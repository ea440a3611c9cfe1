/* The emulated NPU's declared operator list: what the partitioner may place on it. */
#ifndef NPU_IR_SUPPORTED_H
#define NPU_IR_SUPPORTED_H

#include <stdbool.h>

#include "ir/ir.h"

/* True if the NPU backend can run 'op' (possibly only when the precision policy allows). */
bool npu_emu_supports(enum npu_op op);

#endif /* NPU_IR_SUPPORTED_H */
