/* Opening a model file, for the API's own use beyond npulm_model_open. */
#ifndef NPU_API_OPEN_H
#define NPU_API_OPEN_H

#include <stdbool.h>

#include "npulm.h"

/* npulm_model_open; with 'defer_matrices' a GGUF model's matrices are left unread (see
 * npulm_model.defer_matrices), for a compile that streams them. A program file is read whole. */
npulm_status npu_model_open(const char *path, bool defer_matrices, npulm_model **model_out,
                            npulm_error *err);

#endif /* NPU_API_OPEN_H */
