/* TEMPORARY, until the library's own land on main: the declarations of the batched decode
 * (npulm_session_eval_batch) and chat template calls that npulm serve codes against, as they will
 * read in npulm.h. tools/serve_fallback.c stands in for them; both files go when they land. */
#ifndef NPULM_TOOLS_SERVE_FALLBACK_H
#define NPULM_TOOLS_SERVE_FALLBACK_H

#include "npulm.h"

npulm_status npulm_session_eval_batch(npulm_session *const *sessions, const int32_t *tokens,
                                      size_t n, npulm_error *err);

typedef struct npulm_chat_message {
  const char *role;    /* "system", "user" or "assistant" */
  const char *content; /* UTF-8 */
} npulm_chat_message;

const char *const *npulm_chat_templates(void);
const char *npulm_model_chat_template(const npulm_model *model);
npulm_status npulm_chat_apply(const npulm_model *model, const char *name,
                              const npulm_chat_message *msgs, size_t n, bool add_assistant,
                              char *buf, size_t cap, size_t *len_out, npulm_error *err);

#endif /* NPULM_TOOLS_SERVE_FALLBACK_H */
