/* Chat templates, for the API's own use and its tests: detecting a template from a text. */
#ifndef NPU_MODEL_CHAT_H
#define NPU_MODEL_CHAT_H

#include <stddef.h>

/* The name of the built-in template that 'len' bytes of 'tmpl' (a template's name, or the Jinja
 * text of a tokenizer.chat_template) stand for, tested in llama.cpp's order
 * (llm_chat_detect_template); NULL when none matches or llama.cpp's match is a template npulm
 * does not have. */
const char *npu_chat_detect(const char *tmpl, size_t len);

#endif /* NPU_MODEL_CHAT_H */
