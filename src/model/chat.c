/* Chat templates: a conversation written as the prompt a chat model was trained on, with the
 * built-in templates of llama.cpp (llm_chat_apply_template), byte for byte, and its detection of
 * them from a model's tokenizer.chat_template (llm_chat_detect_template). No Jinja is run: like
 * llama.cpp's built-ins, each template is a fixed pattern recognized by distinctive substrings. */
#include "model/chat.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "base/common.h"
#include "io/gguf.h"
#include "model/model.h"

enum { ROLE_SYSTEM, ROLE_USER, ROLE_ASSISTANT, N_ROLES };

static const char *const ROLE_NAMES[N_ROLES] = {"system", "user", "assistant"};

enum {
  TRIM_ALL = 1 << 0,       /* every message's content without leading and trailing whitespace */
  TRIM_ASSISTANT = 1 << 1, /* only the assistant's */
  MERGE_SYSTEM = 1 << 2,   /* no system turn: system messages, held, open the next user turn,
                              followed by a blank line (gemma, orion) */
};

/* One template: every message is open[role] + content + close[role]. 'begin' comes first;
 * 'between' between two messages; 'gen' opens the assistant's turn (NULL: the template has no
 * such opening, as llama.cpp's [INST] ones). With 'turn', messages are grouped in [INST] turns
 * that an assistant message closes: 'turn' opens the next one, and a template with 'begin' starts
 * inside the first (llama2's "[INST] " is written even before any message). */
struct chat_template {
  const char *begin, *between, *turn, *gen;
  const char *open[N_ROLES], *close[N_ROLES];
  unsigned flags;
};

static const char *const NAMES[] = {"chatml",
                                    "llama2",
                                    "llama2-sys",
                                    "llama2-sys-bos",
                                    "llama2-sys-strip",
                                    "mistral-v1",
                                    "mistral-v3",
                                    "mistral-v3-tekken",
                                    "mistral-v7",
                                    "mistral-v7-tekken",
                                    "phi3",
                                    "phi4",
                                    "falcon3",
                                    "zephyr",
                                    "monarch",
                                    "gemma",
                                    "orion",
                                    "openchat",
                                    "vicuna",
                                    "vicuna-orca",
                                    "deepseek",
                                    "deepseek2",
                                    "deepseek3",
                                    "command-r",
                                    "llama3",
                                    "chatglm3",
                                    "chatglm4",
                                    "glmedge",
                                    "minicpm",
                                    "exaone3",
                                    "megrez",
                                    "bailing",
                                    "llama4",
                                    "smolvlm",
                                    NULL};

/* {system, user, assistant} */
#define ROLES(s, u, a)                                                                             \
  { s, u, a }

/* The templates of NAMES, in its order. */
static const struct chat_template TEMPLATES[] = {
    {/* chatml */
     .open = ROLES("<|im_start|>system\n", "<|im_start|>user\n", "<|im_start|>assistant\n"),
     .close = ROLES("<|im_end|>\n", "<|im_end|>\n", "<|im_end|>\n"),
     .gen = "<|im_start|>assistant\n"},
    {/* llama2 */
     .begin = "[INST] ",
     .turn = "[INST] ",
     .open = ROLES("", "", ""),
     .close = ROLES("\n", " [/INST]", "</s>")},
    {/* llama2-sys */
     .begin = "[INST] ",
     .turn = "[INST] ",
     .open = ROLES("<<SYS>>\n", "", ""),
     .close = ROLES("\n<</SYS>>\n\n", " [/INST]", "</s>")},
    {/* llama2-sys-bos */
     .begin = "[INST] ",
     .turn = "<s>[INST] ",
     .open = ROLES("<<SYS>>\n", "", ""),
     .close = ROLES("\n<</SYS>>\n\n", " [/INST]", "</s>")},
    {/* llama2-sys-strip */
     .begin = "[INST] ",
     .turn = "[INST] ",
     .open = ROLES("<<SYS>>\n", "", ""),
     .close = ROLES("\n<</SYS>>\n\n", " [/INST]", "</s>"),
     .flags = TRIM_ALL},
    {/* mistral-v1 */
     .turn = " [INST] ",
     .open = ROLES("", "", " "),
     .close = ROLES("\n\n", " [/INST]", "</s>")},
    {/* mistral-v3 */
     .turn = "[INST] ",
     .open = ROLES("", "", " "),
     .close = ROLES("\n\n", "[/INST]", "</s>"),
     .flags = TRIM_ASSISTANT},
    {/* mistral-v3-tekken */
     .turn = "[INST]",
     .open = ROLES("", "", ""),
     .close = ROLES("\n\n", "[/INST]", "</s>")},
    {/* mistral-v7 */
     .open = ROLES("[SYSTEM_PROMPT] ", "[INST] ", " "),
     .close = ROLES("[/SYSTEM_PROMPT]", "[/INST]", "</s>")},
    {/* mistral-v7-tekken */
     .open = ROLES("[SYSTEM_PROMPT]", "[INST]", ""),
     .close = ROLES("[/SYSTEM_PROMPT]", "[/INST]", "</s>")},
    {/* phi3 */
     .open = ROLES("<|system|>\n", "<|user|>\n", "<|assistant|>\n"),
     .close = ROLES("<|end|>\n", "<|end|>\n", "<|end|>\n"),
     .gen = "<|assistant|>\n"},
    {/* phi4 */
     .open = ROLES("<|im_start|>system<|im_sep|>", "<|im_start|>user<|im_sep|>",
                   "<|im_start|>assistant<|im_sep|>"),
     .close = ROLES("<|im_end|>", "<|im_end|>", "<|im_end|>"),
     .gen = "<|im_start|>assistant<|im_sep|>"},
    {/* falcon3 */
     .open = ROLES("<|system|>\n", "<|user|>\n", "<|assistant|>\n"),
     .close = ROLES("\n", "\n", "\n"),
     .gen = "<|assistant|>\n"},
    {/* zephyr */
     .open = ROLES("<|system|>\n", "<|user|>\n", "<|assistant|>\n"),
     .close = ROLES("<|endoftext|>\n", "<|endoftext|>\n", "<|endoftext|>\n"),
     .gen = "<|assistant|>\n"},
    {/* monarch */
     .between = "<s>",
     .open = ROLES("system\n", "user\n", "assistant\n"),
     .close = ROLES("</s>\n", "</s>\n", "</s>\n"),
     .gen = "<s>assistant\n"},
    {/* gemma */
     .open = ROLES("", "<start_of_turn>user\n", "<start_of_turn>model\n"),
     .close = ROLES("", "<end_of_turn>\n", "<end_of_turn>\n"),
     .gen = "<start_of_turn>model\n",
     .flags = TRIM_ALL | MERGE_SYSTEM},
    {/* orion */
     .open = ROLES("", "Human: ", ""),
     .close = ROLES("", "\n\nAssistant: </s>", "</s>"),
     .flags = MERGE_SYSTEM},
    {/* openchat */
     .open = ROLES("", "GPT4 Correct User: ", "GPT4 Correct Assistant: "),
     .close = ROLES("<|end_of_turn|>", "<|end_of_turn|>", "<|end_of_turn|>"),
     .gen = "GPT4 Correct Assistant:"},
    {/* vicuna */
     .open = ROLES("", "USER: ", "ASSISTANT: "),
     .close = ROLES("\n\n", "\n", "</s>\n"),
     .gen = "ASSISTANT:"},
    {/* vicuna-orca */
     .open = ROLES("SYSTEM: ", "USER: ", "ASSISTANT: "),
     .close = ROLES("\n", "\n", "</s>\n"),
     .gen = "ASSISTANT:"},
    {/* deepseek */
     .open = ROLES("", "### Instruction:\n", "### Response:\n"),
     .close = ROLES("", "\n", "\n<|EOT|>\n"),
     .gen = "### Response:\n"},
    {/* deepseek2 */
     .open = ROLES("", "User: ", "Assistant: "),
     .close = ROLES("\n\n", "\n\n",
                    "<\xef\xbd\x9c"
                    "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"),
     .gen = "Assistant:"},
    {/* deepseek3 */
     .open = ROLES("", "<\xef\xbd\x9cUser\xef\xbd\x9c>",
                   "<\xef\xbd\x9c"
                   "Assistant\xef\xbd\x9c>"),
     .close = ROLES("\n\n", "",
                    "<\xef\xbd\x9c"
                    "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"),
     .gen = "<\xef\xbd\x9c"
            "Assistant\xef\xbd\x9c>"},
    {/* command-r */
     .open =
         ROLES("<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>", "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>",
               "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"),
     .close = ROLES("<|END_OF_TURN_TOKEN|>", "<|END_OF_TURN_TOKEN|>", "<|END_OF_TURN_TOKEN|>"),
     .gen = "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>",
     .flags = TRIM_ALL},
    {/* llama3 */
     .open = ROLES("<|start_header_id|>system<|end_header_id|>\n\n",
                   "<|start_header_id|>user<|end_header_id|>\n\n",
                   "<|start_header_id|>assistant<|end_header_id|>\n\n"),
     .close = ROLES("<|eot_id|>", "<|eot_id|>", "<|eot_id|>"),
     .gen = "<|start_header_id|>assistant<|end_header_id|>\n\n",
     .flags = TRIM_ALL},
    {/* chatglm3 */
     .begin = "[gMASK]sop",
     .open = ROLES("<|system|>\n ", "<|user|>\n ", "<|assistant|>\n "),
     .close = ROLES("", "", ""),
     .gen = "<|assistant|>"},
    {/* chatglm4 */
     .begin = "[gMASK]<sop>",
     .open = ROLES("<|system|>\n", "<|user|>\n", "<|assistant|>\n"),
     .close = ROLES("", "", ""),
     .gen = "<|assistant|>\n"},
    {/* glmedge */
     .open = ROLES("<|system|>\n", "<|user|>\n", "<|assistant|>\n"),
     .close = ROLES("", "", ""),
     .gen = "<|assistant|>"},
    {/* minicpm */
     .open = ROLES("", "<\xe7\x94\xa8\xe6\x88\xb7>", ""),
     .close = ROLES("", "<AI>", ""),
     .flags = TRIM_ALL},
    {/* exaone3 */
     .open = ROLES("[|system|]", "[|user|]", "[|assistant|]"),
     .close = ROLES("[|endofturn|]\n", "\n", "[|endofturn|]\n"),
     .gen = "[|assistant|]",
     .flags = TRIM_ALL},
    {/* megrez */
     .open = ROLES("<|role_start|>system<|role_end|>", "<|role_start|>user<|role_end|>",
                   "<|role_start|>assistant<|role_end|>"),
     .close = ROLES("<|turn_end|>", "<|turn_end|>", "<|turn_end|>"),
     .gen = "<|role_start|>assistant<|role_end|>"},
    {/* bailing */
     .open = ROLES("<role>SYSTEM</role>", "<role>HUMAN</role>", "<role>ASSISTANT</role>"),
     .close = ROLES("", "", ""),
     .gen = "<role>ASSISTANT</role>"},
    {/* llama4 */
     .open =
         ROLES("<|header_start|>system<|header_end|>\n\n", "<|header_start|>user<|header_end|>\n\n",
               "<|header_start|>assistant<|header_end|>\n\n"),
     .close = ROLES("<|eot|>", "<|eot|>", "<|eot|>"),
     .gen = "<|header_start|>assistant<|header_end|>\n\n",
     .flags = TRIM_ALL},
    {/* smolvlm */
     .begin = "<|im_start|>",
     .open = ROLES("", "User: ", "Assistant: "),
     .close = ROLES("\n\n", "<end_of_utterance>\n", "<end_of_utterance>\n"),
     .gen = "Assistant:"},
};

#define N_TEMPLATES (sizeof(TEMPLATES) / sizeof(TEMPLATES[0]))

_Static_assert(sizeof(NAMES) / sizeof(NAMES[0]) == N_TEMPLATES + 1, "a name for every template");

const char *const *npulm_chat_templates(void) { return NAMES; }

static const struct chat_template *find_template(const char *name, size_t len) {
  for (size_t i = 0; i < N_TEMPLATES; i++) {
    if (strlen(NAMES[i]) == len && memcmp(NAMES[i], name, len) == 0) return &TEMPLATES[i];
  }
  return NULL;
}

/* Whether 'len' bytes of 'text' contain 'needle'. */
static bool has(const char *text, size_t len, const char *needle) {
  size_t n = strlen(needle);
  for (size_t i = 0; i + n <= len; i++) {
    if (memcmp(text + i, needle, n) == 0) return true;
  }
  return false;
}

const char *npu_chat_detect(const char *t, size_t len) {
  const struct chat_template *named = find_template(t, len);
  if (named != NULL) return NAMES[named - TEMPLATES];
  /* llama.cpp's tests, in its order: an earlier test wins over a later one that also matches */
  if (has(t, len, "<|im_start|>")) {
    if (has(t, len, "<|im_sep|>")) return "phi4";
    return has(t, len, "<end_of_utterance>") ? "smolvlm" : "chatml";
  }
  if ((len >= 7 && memcmp(t, "mistral", 7) == 0) || has(t, len, "[INST]")) {
    if (has(t, len, "[SYSTEM_PROMPT]")) return "mistral-v7";
    if (has(t, len, "' [INST] ' + system_message") || has(t, len, "[AVAILABLE_TOOLS]")) {
      if (has(t, len, " [INST]")) return "mistral-v1";
      if (has(t, len, "\"[INST]\"")) return "mistral-v3-tekken";
      return "mistral-v3";
    }
    if (has(t, len, "content.strip()")) return "llama2-sys-strip";
    if (has(t, len, "bos_token + '[INST]")) return "llama2-sys-bos";
    if (has(t, len, "<<SYS>>")) return "llama2-sys";
    return "llama2";
  }
  if (has(t, len, "<|assistant|>") && has(t, len, "<|end|>")) return "phi3";
  if (has(t, len, "[gMASK]<sop>")) return "chatglm4";
  if (has(t, len, "<|assistant|>") && has(t, len, "<|user|>")) {
    return has(t, len, "</s>") ? "falcon3" : "glmedge";
  }
  if (has(t, len, "<|{{ item['role'] }}|>") && has(t, len, "<|begin_of_image|>")) return "glmedge";
  if (has(t, len, "<|user|>") && has(t, len, "<|endoftext|>")) return "zephyr";
  if (has(t, len, "bos_token + message['role']")) return "monarch";
  if (has(t, len, "<start_of_turn>")) return "gemma";
  if (has(t, len, "'\\n\\nAssistant: ' + eos_token")) return "orion";
  if (has(t, len, "GPT4 Correct ")) return "openchat";
  if (has(t, len, "USER: ") && has(t, len, "ASSISTANT: ")) {
    return has(t, len, "SYSTEM: ") ? "vicuna-orca" : "vicuna";
  }
  if (has(t, len, "### Instruction:") && has(t, len, "<|EOT|>")) return "deepseek";
  if (has(t, len, "<|START_OF_TURN_TOKEN|>") && has(t, len, "<|USER_TOKEN|>")) return "command-r";
  if (has(t, len, "<|start_header_id|>") && has(t, len, "<|end_header_id|>")) return "llama3";
  if (has(t, len, "[gMASK]sop")) return "chatglm3";
  if (has(t, len, "<\xe7\x94\xa8\xe6\x88\xb7>")) return "minicpm";
  if (has(t, len, "'Assistant: ' + message['content'] + eos_token")) return "deepseek2";
  if (has(t, len,
          "<\xef\xbd\x9c"
          "Assistant\xef\xbd\x9c>") &&
      has(t, len, "<\xef\xbd\x9cUser\xef\xbd\x9c>") &&
      has(t, len,
          "<\xef\xbd\x9c"
          "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>")) {
    return "deepseek3";
  }
  if (has(t, len, "[|system|]") && has(t, len, "[|assistant|]") && has(t, len, "[|endofturn|]")) {
    return has(t, len, "[|tool|]") ? NULL : "exaone3"; /* exaone4: not built in */
  }
  /* rwkv-world, granite, gigachat: not built in */
  if (has(t, len, "rwkv-world") ||
      has(t, len, "{{- 'User: ' + message['content']|trim + '\\n\\n' -}}") ||
      has(t, len, "<|start_of_role|>") ||
      has(t, len,
          "message['role'] + additional_special_tokens[0] + message['content'] + "
          "additional_special_tokens[1]")) {
    return NULL;
  }
  if (has(t, len, "<|role_start|>")) return "megrez";
  if (has(t, len, " \xd0\x90\xd1\x81\xd1\x81\xd0\xb8\xd1\x81\xd1\x82\xd0\xb5\xd0\xbd\xd1\x82:")) {
    return NULL; /* yandex: not built in */
  }
  if (has(t, len, "<role>ASSISTANT</role>") && has(t, len, "'HUMAN'")) return "bailing";
  if (has(t, len, "<|header_start|>") && has(t, len, "<|header_end|>")) return "llama4";
  return NULL;
}

const char *npulm_model_chat_template(const npulm_model *model) {
  struct npu_gguf_str s;
  /* no key (or a value that is not a string) is no template */
  if (model != NULL && model->gguf != NULL &&
      npu_gguf_get_str(model->gguf, "tokenizer.chat_template", &s, NULL) == NPULM_OK) {
    const char *name = npu_chat_detect(s.ptr, (size_t)s.len);
    if (name != NULL) return name;
  }
  return "chatml";
}

/* Output that counts what it is given and keeps what fits (one byte is kept for the NUL). */
struct out {
  char *buf;
  size_t cap, len;
};

static void put_n(struct out *o, const char *s, size_t n) {
  if (o->len < o->cap) {
    size_t room = o->cap - 1 - o->len;
    memcpy(o->buf + o->len, s, n < room ? n : room);
  }
  o->len += n;
}

static void put(struct out *o, const char *s) {
  if (s != NULL) put_n(o, s, strlen(s));
}

static bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

/* 'content', without surrounding whitespace when 'trim' (as llama.cpp's trim: ASCII isspace). */
static void put_content(struct out *o, const char *content, bool trim) {
  size_t a = 0, b = strlen(content);
  while (trim && a < b && is_space(content[a])) a++;
  while (trim && b > a && is_space(content[b - 1])) b--;
  put_n(o, content + a, b - a);
}

static int role_of(const char *role) {
  for (int r = 0; r < N_ROLES; r++) {
    if (role != NULL && strcmp(role, ROLE_NAMES[r]) == 0) return r;
  }
  return -1;
}

static bool trims(const struct chat_template *t, int role) {
  return (t->flags & TRIM_ALL) || ((t->flags & TRIM_ASSISTANT) && role == ROLE_ASSISTANT);
}

/* Write the held system messages of [from, to) (MERGE_SYSTEM) and the blank line after them, if
 * together they are not empty. */
static void put_held_system(struct out *o, const struct chat_template *t,
                            const npulm_chat_message *msgs, size_t from, size_t to) {
  size_t start = o->len;
  for (size_t j = from; j < to; j++) {
    if (role_of(msgs[j].role) == ROLE_SYSTEM)
      put_content(o, msgs[j].content, trims(t, ROLE_SYSTEM));
  }
  if (o->len > start) put(o, "\n\n");
}

static void apply(const struct chat_template *t, const npulm_chat_message *msgs, size_t n,
                  bool add_assistant, struct out *o) {
  put(o, t->begin);
  bool in_turn = t->begin != NULL;
  size_t held = 0; /* the first system message not yet written (MERGE_SYSTEM) */
  bool first = true;
  for (size_t i = 0; i < n; i++) {
    int role = role_of(msgs[i].role);
    if ((t->flags & MERGE_SYSTEM) && role == ROLE_SYSTEM) continue;
    if (!first) put(o, t->between);
    first = false;
    if (t->turn != NULL && !in_turn) {
      put(o, t->turn);
      in_turn = true;
    }
    put(o, t->open[role]);
    if ((t->flags & MERGE_SYSTEM) && role == ROLE_USER) {
      put_held_system(o, t, msgs, held, i);
      held = i + 1;
    }
    put_content(o, msgs[i].content, trims(t, role));
    put(o, t->close[role]);
    if (role == ROLE_ASSISTANT) in_turn = false;
  }
  if (add_assistant) put(o, t->gen);
}

npulm_status npulm_chat_apply(const npulm_model *model, const char *name,
                              const npulm_chat_message *msgs, size_t n, bool add_assistant,
                              char *buf, size_t cap, size_t *len_out, npulm_error *err) {
  *len_out = 0;
  if (name == NULL && model == NULL) {
    return npu_fail(err, NPULM_ERR_ARG, "a chat template needs a model or a template name");
  }
  if (name == NULL) name = npulm_model_chat_template(model);
  const struct chat_template *t = find_template(name, strlen(name));
  if (t == NULL) {
    char list[400]; /* every name: the message stays within NPULM_ERROR_MAX */
    size_t at = 0;
    for (size_t i = 0; i < N_TEMPLATES && at < sizeof(list); i++) {
      at += (size_t)snprintf(list + at, sizeof(list) - at, "%s%s", i > 0 ? ", " : "", NAMES[i]);
    }
    return npu_fail(err, NPULM_ERR_ARG, "unknown chat template '%.64s' (known: %s)", name, list);
  }
  for (size_t i = 0; i < n; i++) {
    if (role_of(msgs[i].role) < 0) {
      return npu_fail(err, NPULM_ERR_ARG,
                      "message %zu: unknown role '%.32s' (system, user or assistant)", i,
                      msgs[i].role != NULL ? msgs[i].role : "(null)");
    }
    if (msgs[i].content == NULL) {
      return npu_fail(err, NPULM_ERR_ARG, "message %zu has no content", i);
    }
  }
  struct out o = {.buf = buf, .cap = buf != NULL ? cap : 0};
  apply(t, msgs, n, add_assistant, &o);
  if (o.cap > 0) buf[o.len < o.cap ? o.len : o.cap - 1] = '\0';
  *len_out = o.len;
  if (o.len >= cap) {
    return npu_fail(err, NPULM_ERR_ARG, "the formatted chat needs %zu bytes and a NUL; %zu given",
                    o.len, cap);
  }
  return NPULM_OK;
}
