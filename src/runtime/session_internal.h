/* What the library's own tools (error attribution) may do to a session beyond the public API. */
#ifndef NPU_RUNTIME_SESSION_INTERNAL_H
#define NPU_RUNTIME_SESSION_INTERNAL_H

#include "backends/exec.h"
#include "npulm.h"

typedef void (*npu_node_observer)(void *user, const struct npu_graph *g, int32_t node,
                                  const struct npu_exec_ctx *ctx);

/* Call 'fn' after every node the session's graphs execute (NULL: stop). Observers run on the
 * backend worker threads, one node at a time for a single-chunk step. */
void npu_session_observe(npulm_session *session, npu_node_observer fn, void *user);

/* The program the session runs: the model's, or the one it was created with. */
const struct npu_program *npu_session_program(const npulm_session *session);

/* The checks npulm_session_create makes of 'params' (NULL: the defaults) before it builds
 * anything: a caller that must compile first makes them before compiling. */
npulm_status npu_session_check_params(const npulm_model *model, const npulm_session_params *params,
                                      npulm_error *err);

/* npulm_session_create for program 'prog' of 'model' instead of the model's own (a compile that
 * measures the program it is making). */
npulm_status npu_session_create_program(const npulm_model *model, const struct npu_program *prog,
                                        const npulm_session_params *params,
                                        npulm_session **session_out, npulm_error *err);

/* The same for a program the session takes: freed with the session, or at once if this fails. */
npulm_status npu_session_create_owning(const npulm_model *model, struct npu_program *prog,
                                       const npulm_session_params *params,
                                       npulm_session **session_out, npulm_error *err);

#endif /* NPU_RUNTIME_SESSION_INTERNAL_H */
