/* Opening a model file, for the API's own use beyond npulm_model_open. */
#ifndef NPU_PIPELINE_OPEN_H
#define NPU_PIPELINE_OPEN_H

#include <stdbool.h>

#include "npulm.h"

/* npulm_model_open_params (params may be NULL); with 'defer_matrices' a GGUF model's matrices
 * are left unread (see npulm_model.defer_matrices), for a compile that streams them. */
npulm_status npu_model_open(const char *path, bool defer_matrices, const npulm_open_params *params,
                            npulm_model **model_out, npulm_error *err);

#endif /* NPU_PIPELINE_OPEN_H */
