/* TEMPORARY stand-ins for the library calls npulm serve needs before they land on main (see
 * serve_fallback.h): batched decode as one npulm_session_eval per session, and ChatML as the only
 * chat template. */
#include "serve_fallback.h"

#include <stdio.h>
#include <string.h>

npulm_status npulm_session_eval_batch(npulm_session *const *sessions, const int32_t *tokens,
                                      size_t n, npulm_error *err) {
  for (size_t i = 0; i < n; i++) {
    const npulm_status st = npulm_session_eval(sessions[i], &tokens[i], 1, NULL, err);
    if (st != NPULM_OK) return st;
  }
  return NPULM_OK;
}

const char *const *npulm_chat_templates(void) {
  static const char *const names[] = {"chatml", NULL};
  return names;
}

const char *npulm_model_chat_template(const npulm_model *model) {
  (void)model;
  return "chatml";
}

npulm_status npulm_chat_apply(const npulm_model *model, const char *name,
                              const npulm_chat_message *msgs, size_t n, bool add_assistant,
                              char *buf, size_t cap, size_t *len_out, npulm_error *err) {
  (void)model;
  if (name != NULL && strcmp(name, "chatml") != 0) {
    if (err != NULL) snprintf(err->msg, sizeof(err->msg), "unknown chat template '%s'", name);
    return NPULM_ERR_ARG;
  }
  size_t len = 0;
  for (size_t i = 0; i <= n; i++) {
    const char *role = i < n ? msgs[i].role : "assistant";
    if (i == n && !add_assistant) break;
    if (strcmp(role, "system") != 0 && strcmp(role, "user") != 0 &&
        strcmp(role, "assistant") != 0) {
      if (err != NULL) snprintf(err->msg, sizeof(err->msg), "unknown role '%s'", role);
      return NPULM_ERR_ARG;
    }
    const int k = snprintf(len < cap ? buf + len : NULL, len < cap ? cap - len : 0,
                           i < n ? "<|im_start|>%s\n%s<|im_end|>\n" : "<|im_start|>%s\n", role,
                           i < n ? msgs[i].content : "");
    len += (size_t)k;
  }
  *len_out = len;
  if (len >= cap) {
    if (err != NULL) snprintf(err->msg, sizeof(err->msg), "%zu bytes needed", len + 1);
    return NPULM_ERR_ARG;
  }
  return NPULM_OK;
}
