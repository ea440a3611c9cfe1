/* Perplexity with a choice of engine: the compiled graphs (what npulm_perplexity runs) or the FP32
 * reference forward, so that tests can hold the two side by side. */
#ifndef NPU_ANALYSIS_PERPLEXITY_H
#define NPU_ANALYSIS_PERPLEXITY_H

#include <stdbool.h>

#include "npulm.h"

/* npulm_perplexity, with every session created with params.reference = 'reference'. */
npulm_status npu_perplexity_run(const npulm_model *model, const char *text, size_t len, int n_ctx,
                                int n_threads, bool reference, npulm_ppl_progress_fn progress,
                                void *user, npulm_ppl_result *result_out, npulm_error *err);

#endif /* NPU_ANALYSIS_PERPLEXITY_H */
