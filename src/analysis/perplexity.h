/* Perplexity with a choice of engine: the compiled graphs (what npulm_perplexity runs) or the FP32
 * reference forward, so that tests can hold the two side by side. */
#ifndef NPU_ANALYSIS_PERPLEXITY_H
#define NPU_ANALYSIS_PERPLEXITY_H

#include <stdbool.h>

#include "npulm.h"

/* npulm_perplexity with every session created with 'session' (its n_ctx and n_threads set per
 * worker), each token of a window evaluated alone with 'decode'; 'sparse_out' (may be NULL): the
 * sessions' sparse statistics added up. */
npulm_status npu_perplexity_run(const npulm_model *model, const char *text, size_t len, int n_ctx,
                                int n_threads, const npulm_session_params *session, bool decode,
                                npulm_ppl_progress_fn progress, void *user,
                                npulm_ppl_result *result_out, npulm_sparse_stats *sparse_out,
                                npulm_error *err);

#endif /* NPU_ANALYSIS_PERPLEXITY_H */
