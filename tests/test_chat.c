/* Chat templates: every built-in template against llama.cpp's expected text for the conversation
 * of its tests/test-chat-template.cpp, detection from template texts (by npu_chat_detect and from
 * a model's tokenizer.chat_template), the default, and the errors. */
#include <string.h>

#include "test_util.h"

#include "io/gguf.h"
#include "io/gguf_write.h"
#include "model/chat.h"

/* llama.cpp's test conversation */
static const npulm_chat_message CONV[] = {
    {"system", "You are a helpful assistant"},
    {"user", "Hello"},
    {"assistant", "Hi there"},
    {"user", "Who are you"},
    {"assistant", "   I am an assistant   "},
    {"user", "Another question"},
};
#define N_CONV (sizeof(CONV) / sizeof(CONV[0]))

struct expected {
  const char *name;
  const char *text; /* with add_assistant */
};

/* llama.cpp's expected outputs (tests/test-chat-template.cpp), by the template its test's text
 * detects. zephyr and llama2-sys have no case there: theirs follow llm_chat_apply_template. */
static const struct expected EXPECTED[] = {
    {"chatml", "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\nHello"
               "<|im_end|>\n<|im_start|>assistant\nHi there<|im_end|>\n<|im_start|>user\nWho are "
               "you<|im_end|>\n<|im_start|>assistant\n   I am an assistant   <|im_end|>\n"
               "<|im_start|>user\nAnother question<|im_end|>\n<|im_start|>assistant\n"},
    {"llama2", "[INST] You are a helpful assistant\nHello [/INST]Hi there</s>[INST] Who are you "
               "[/INST]   I am an assistant   </s>[INST] Another question [/INST]"},
    {"llama2-sys", "[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST]Hi "
                   "there</s>[INST] Who are you [/INST]   I am an assistant   </s>[INST] Another "
                   "question [/INST]"},
    {"llama2-sys-bos", "[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST]Hi "
                       "there</s><s>[INST] Who are you [/INST]   I am an assistant   </s><s>[INST] "
                       "Another question [/INST]"},
    {"llama2-sys-strip", "[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST]Hi "
                         "there</s>[INST] Who are you [/INST]I am an assistant</s>[INST] Another "
                         "question [/INST]"},
    {"mistral-v1",
     " [INST] You are a helpful assistant\n\nHello [/INST] Hi there</s> [INST] Who are "
     "you [/INST]    I am an assistant   </s> [INST] Another question [/INST]"},
    {"mistral-v3", "[INST] You are a helpful assistant\n\nHello[/INST] Hi there</s>[INST] Who are "
                   "you[/INST] I am an assistant</s>[INST] Another question[/INST]"},
    {"mistral-v3-tekken", "[INST]You are a helpful assistant\n\nHello[/INST]Hi there</s>[INST]Who "
                          "are you[/INST]   I am an assistant   </s>[INST]Another question[/INST]"},
    {"mistral-v7", "[SYSTEM_PROMPT] You are a helpful assistant[/SYSTEM_PROMPT][INST] "
                   "Hello[/INST] Hi there</s>[INST] Who are you[/INST]    I am an assistant   "
                   "</s>[INST] Another question[/INST]"},
    {"monarch", "system\nYou are a helpful assistant</s>\n<s>user\nHello</s>\n<s>assistant\nHi "
                "there</s>\n<s>user\nWho are you</s>\n<s>assistant\n   I am an assistant   </s>\n"
                "<s>user\nAnother question</s>\n<s>assistant\n"},
    {"gemma", "<start_of_turn>user\nYou are a helpful assistant\n\nHello<end_of_turn>\n<start_of_"
              "turn>model\nHi there<end_of_turn>\n<start_of_turn>user\nWho are you<end_of_turn>\n"
              "<start_of_turn>model\nI am an assistant<end_of_turn>\n<start_of_turn>user\nAnother "
              "question<end_of_turn>\n<start_of_turn>model\n"},
    {"orion", "Human: You are a helpful assistant\n\nHello\n\nAssistant: </s>Hi there</s>Human: "
              "Who are you\n\nAssistant: </s>   I am an assistant   </s>Human: Another "
              "question\n\nAssistant: </s>"},
    {"openchat", "You are a helpful assistant<|end_of_turn|>GPT4 Correct User: Hello<|end_of_turn|>"
                 "GPT4 Correct Assistant: Hi there<|end_of_turn|>GPT4 Correct User: Who are "
                 "you<|end_of_turn|>GPT4 Correct Assistant:    I am an assistant   "
                 "<|end_of_turn|>GPT4 Correct User: Another question<|end_of_turn|>GPT4 Correct "
                 "Assistant:"},
    {"deepseek", "You are a helpful assistant### Instruction:\nHello\n### Response:\nHi "
                 "there\n<|EOT|>\n### Instruction:\nWho are you\n### Response:\n   I am an "
                 "assistant   \n<|EOT|>\n### Instruction:\nAnother question\n### Response:\n"},
    {"vicuna", "You are a helpful assistant\n\nUSER: Hello\nASSISTANT: Hi there</s>\nUSER: Who are "
               "you\nASSISTANT:    I am an assistant   </s>\nUSER: Another question\nASSISTANT:"},
    {"vicuna-orca", "SYSTEM: You are a helpful assistant\nUSER: Hello\nASSISTANT: Hi there</s>\n"
                    "USER: Who are you\nASSISTANT:    I am an assistant   </s>\nUSER: Another "
                    "question\nASSISTANT:"},
    {"command-r",
     "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>You are a helpful assistant<|END_OF_TURN_"
     "TOKEN|><|START_OF_TURN_TOKEN|><|USER_TOKEN|>Hello<|END_OF_TURN_TOKEN|><|START_OF"
     "_TURN_TOKEN|><|CHATBOT_TOKEN|>Hi there<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN"
     "|><|USER_TOKEN|>Who are you<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT"
     "_TOKEN|>I am an assistant<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|USER_TOKE"
     "N|>Another question<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"},
    {"llama3",
     "<|start_header_id|>system<|end_header_id|>\n\nYou are a helpful assistant<|eot_id|>"
     "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|><|start_header_id|>"
     "assistant<|end_header_id|>\n\nHi there<|eot_id|><|start_header_id|>user<|end_header"
     "_id|>\n\nWho are you<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nI am "
     "an assistant<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nAnother "
     "question<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"},
    {"phi3", "<|system|>\nYou are a helpful assistant<|end|>\n<|user|>\nHello<|end|>\n<|assistant|>"
             "\nHi there<|end|>\n<|user|>\nWho are you<|end|>\n<|assistant|>\n   I am an assistant "
             "  <|end|>\n<|user|>\nAnother question<|end|>\n<|assistant|>\n"},
    {"zephyr",
     "<|system|>\nYou are a helpful assistant<|endoftext|>\n<|user|>\nHello<|endoftext|>\n"
     "<|assistant|>\nHi there<|endoftext|>\n<|user|>\nWho are you<|endoftext|>\n"
     "<|assistant|>\n   I am an assistant   <|endoftext|>\n<|user|>\nAnother "
     "question<|endoftext|>\n<|assistant|>\n"},
    {"chatglm3",
     "[gMASK]sop<|system|>\n You are a helpful assistant<|user|>\n Hello<|assistant|>\n "
     "Hi there<|user|>\n Who are you<|assistant|>\n    I am an assistant   <|user|>\n "
     "Another question<|assistant|>"},
    {"chatglm4", "[gMASK]<sop><|system|>\nYou are a helpful assistant<|user|>\nHello<|assistant|>\n"
                 "Hi there<|user|>\nWho are you<|assistant|>\n   I am an assistant   <|user|>\n"
                 "Another question<|assistant|>\n"},
    {"glmedge", "<|system|>\nYou are a helpful assistant<|user|>\nHello<|assistant|>\nHi there"
                "<|user|>\nWho are you<|assistant|>\n   I am an assistant   <|user|>\nAnother "
                "question<|assistant|>"},
    {"minicpm",
     "You are a helpful assistant<\xe7\x94\xa8\xe6\x88\xb7>Hello<AI>Hi there<\xe7\x94\xa8"
     "\xe6\x88\xb7>Who are you<AI>I am an assistant<\xe7\x94\xa8\xe6\x88\xb7>Another "
     "question<AI>"},
    {"deepseek2",
     "You are a helpful assistant\n\nUser: Hello\n\nAssistant: Hi there<\xef\xbd\x9c"
     "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>User: Who are you\n\nAssistant:"
     "    I am an assistant   <\xef\xbd\x9c"
     "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>User: Another question\n\n"
     "Assistant:"},
    {"megrez",
     "<|role_start|>system<|role_end|>You are a helpful assistant<|turn_end|><|role_start|"
     ">user<|role_end|>Hello<|turn_end|><|role_start|>assistant<|role_end|>Hi there<|turn_"
     "end|><|role_start|>user<|role_end|>Who are you<|turn_end|><|role_start|>assistant<|"
     "role_end|>   I am an assistant   <|turn_end|><|role_start|>user<|role_end|>Another "
     "question<|turn_end|><|role_start|>assistant<|role_end|>"},
    {"phi4",
     "<|im_start|>system<|im_sep|>You are a helpful assistant<|im_end|><|im_start|>user<|im_"
     "sep|>Hello<|im_end|><|im_start|>assistant<|im_sep|>Hi there<|im_end|><|im_start|>user"
     "<|im_sep|>Who are you<|im_end|><|im_start|>assistant<|im_sep|>   I am an assistant   "
     "<|im_end|><|im_start|>user<|im_sep|>Another question<|im_end|><|im_start|>assistant"
     "<|im_sep|>"},
    {"bailing",
     "<role>SYSTEM</role>You are a helpful assistant<role>HUMAN</role>Hello<role>"
     "ASSISTANT</role>Hi there<role>HUMAN</role>Who are you<role>ASSISTANT</role>   I am "
     "an assistant   <role>HUMAN</role>Another question<role>ASSISTANT</role>"},
};

static char *apply(const char *name, const npulm_chat_message *msgs, size_t n, bool add) {
  static char buf[4096];
  size_t len = 0;
  npulm_error err = {{0}};
  npulm_status st = npulm_chat_apply(NULL, name, msgs, n, add, buf, sizeof(buf), &len, &err);
  if (st != NPULM_OK) fail_msg("%s: %s", name, err.msg);
  assert_int_equal(strlen(buf), len);
  return buf;
}

static void test_expected_outputs(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof(EXPECTED) / sizeof(EXPECTED[0]); i++) {
    const char *got = apply(EXPECTED[i].name, CONV, N_CONV, true);
    if (strcmp(got, EXPECTED[i].text) != 0) {
      fail_msg("%s:\n got: %s\nwant: %s", EXPECTED[i].name, got, EXPECTED[i].text);
    }
  }
}

/* Without the assistant's opening, a template that has one ends at the last message. */
static void test_no_assistant_opening(void **state) {
  (void)state;
  const npulm_chat_message one[] = {{"user", "Hi"}};
  assert_string_equal(apply("chatml", one, 1, false), "<|im_start|>user\nHi<|im_end|>\n");
  assert_string_equal(apply("chatml", one, 1, true),
                      "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  /* llama2 has none either way, and opens its [INST] even before any message */
  assert_string_equal(apply("llama2", one, 1, true), "[INST] Hi [/INST]");
  assert_string_equal(apply("llama2", one, 0, true), "[INST] ");
  assert_string_equal(apply("mistral-v7", one, 0, true), "");
  /* gemma: a system message alone is held for a user turn that never comes */
  const npulm_chat_message sys[] = {{"system", " S "}, {"user", " U "}};
  assert_string_equal(apply("gemma", sys, 1, true), "<start_of_turn>model\n");
  assert_string_equal(apply("gemma", sys, 2, false), "<start_of_turn>user\nS\n\nU<end_of_turn>\n");
}

/* Every listed name formats; the list is llama.cpp's names. */
static void test_names(void **state) {
  (void)state;
  const char *const *names = npulm_chat_templates();
  size_t n = 0;
  for (; names[n] != NULL; n++) {
    apply(names[n], CONV, N_CONV, true);
    assert_string_equal(npu_chat_detect(names[n], strlen(names[n])), names[n]);
  }
  assert_true(n >= 10);
  const char *must[] = {"chatml",     "llama2", "llama3", "mistral-v1", "mistral-v3",
                        "mistral-v7", "gemma",  "phi3",   "zephyr"};
  for (size_t i = 0; i < sizeof(must) / sizeof(must[0]); i++) {
    bool found = false;
    for (size_t j = 0; j < n; j++) found = found || strcmp(names[j], must[i]) == 0;
    if (!found) fail_msg("%s is not listed", must[i]);
  }
}

struct detect_case {
  const char *text;
  const char *name; /* NULL: none */
};

/* Template texts (from llama.cpp's tests, shortened to what detection reads) and what they are. */
static const struct detect_case DETECT[] = {
    {"{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] "
     "+ '<|im_end|>' + '\\n'}}{% endfor %}",
     "chatml"},
    {"{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ '[INST] ' + "
     "message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ "
     "message['content'] + eos_token}}{% endif %}{% endfor %}",
     "llama2"},
    {"{{- bos_token + '[INST] ' + messages[idx]['content'] + ' [/INST]' -}}{{- '[INST] <<SYS>>\\n' "
     "+ messages[idx]['content'] + '\\n<</SYS>>\\n\\n' -}}",
     "llama2-sys-bos"},
    {"{% if message['role'] == 'user' %}{{ '[INST] ' + content.strip() + ' [/INST]' }}{% elif "
     "message['role'] == 'system' %}{{ '<<SYS>>\\n' + content.strip() + '\\n<</SYS>>\\n\\n' }}",
     "llama2-sys-strip"},
    {"{{ '[INST] <<SYS>>\\n' + system + '\\n<</SYS>>\\n\\n' + content + ' [/INST]' }}",
     "llama2-sys"},
    {"{{- ' [INST] ' + system_message + '\\n\\n' + message['content'] + ' [/INST]' }}",
     "mistral-v1"},
    {"{{- \"[AVAILABLE_TOOLS] [\" }}{{- \"[INST] \" + message[\"content\"] + \"[/INST]\" }}",
     "mistral-v3"},
    {"{{- \"[AVAILABLE_TOOLS][\" }}{{- \"[INST]\" + message[\"content\"] + \"[/INST]\" }}",
     "mistral-v3-tekken"},
    {"{{ '[INST] ' + message['content'] + '[/INST]' }}{% elif message['role'] == 'system' %}{{ "
     "'[SYSTEM_PROMPT] ' + message['content'] + '[/SYSTEM_PROMPT]' }}",
     "mistral-v7"},
    {"{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}",
     "gemma"},
    {"{{'<|user|>' + '\\n' + message['content'] + '<|end|>' + '\\n' + '<|assistant|>' + '\\n'}}",
     "phi3"},
    {"{{ '<|user|>\\n' + message['content'] + '<|endoftext|>' }}", "zephyr"},
    {"{{ '<|user|>\\n' + message['content'] + '</s>' }}{{ '<|assistant|>\\n' }}", "falcon3"},
    {"{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ "
     "message['content'] | trim + '<|eot_id|>' %}",
     "llama3"},
    {"{{'<|im_start|>system<|im_sep|>' + message['content'] + '<|im_end|>'}}", "phi4"},
    {"{{ 'GPT4 Correct ' + message['role'].title() + ': ' + message['content'] }}", "openchat"},
    {"{{bos_token + message['role'] + '\\n' + message['content'] + eos_token + '\\n'}}", "monarch"},
    {"mistral", "llama2"}, /* a text starting with "mistral" is an [INST] template */
    /* not built in, or nothing llama.cpp knows */
    {"{{ '<|start_of_role|>' + message['role'] + '<|end_of_role|>' }}", NULL},
    {"{% for m in messages %}{{ m['content'] }}{% endfor %}", NULL},
    {"", NULL},
};

static void test_detect(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof(DETECT) / sizeof(DETECT[0]); i++) {
    const char *got = npu_chat_detect(DETECT[i].text, strlen(DETECT[i].text));
    if (DETECT[i].name == NULL ? got != NULL : got == NULL || strcmp(got, DETECT[i].name) != 0) {
      fail_msg("%s: got %s, want %s", DETECT[i].text, got ? got : "none",
               DETECT[i].name ? DETECT[i].name : "none");
    }
  }
}

/* A vocabulary-only GGUF at 'path' whose tokenizer.chat_template is 'tmpl' (NULL: none). */
static void write_vocab(const char *path, const char *tmpl) {
  static const char *const tokens[] = {"<unk>", "<s>", "</s>", "a"};
  static const float scores[] = {0, 0, 0, -1};
  static const int32_t types[] = {2, 3, 3, 1};
  struct npu_gguf_writer *w = NULL;
  npulm_error err = {{0}};
  assert_int_equal(npu_gguf_writer_open_file(path, &w, &err), NPULM_OK);
  npu_gguf_writer_add_str(w, "general.architecture", "llama");
  npu_gguf_writer_add_str(w, "tokenizer.ggml.model", "llama");
  npu_gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", tokens, 4);
  npu_gguf_writer_add_arr(w, "tokenizer.ggml.scores", NPU_GGUF_F32, scores, 4);
  npu_gguf_writer_add_arr(w, "tokenizer.ggml.token_type", NPU_GGUF_I32, types, 4);
  if (tmpl != NULL) npu_gguf_writer_add_str(w, "tokenizer.chat_template", tmpl);
  if (npu_gguf_writer_finish(w, &err) != NPULM_OK) fail_msg("%s", err.msg);
  npu_gguf_writer_free(w);
}

static const char *model_template(const char *tmpl) {
  char path[] = "/tmp/npulm-test-chat-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  write_vocab(path, tmpl);
  npulm_model *m = NULL;
  npulm_error err = {{0}};
  if (npulm_model_open_vocab(path, &m, &err) != NPULM_OK) fail_msg("%s", err.msg);
  unlink(path);
  const char *name = npulm_model_chat_template(m);
  /* NULL: the model's template */
  const npulm_chat_message one[] = {{"user", "x"}};
  char a[256], b[256];
  size_t la, lb;
  assert_int_equal(npulm_chat_apply(m, NULL, one, 1, true, a, sizeof(a), &la, &err), NPULM_OK);
  assert_int_equal(npulm_chat_apply(NULL, name, one, 1, true, b, sizeof(b), &lb, &err), NPULM_OK);
  assert_string_equal(a, b);
  npulm_model_close(m);
  return name;
}

/* The model's tokenizer.chat_template, a name or a text; chatml without one or for a stranger. */
static void test_model_template(void **state) {
  (void)state;
  assert_string_equal(model_template(NULL), "chatml");
  assert_string_equal(model_template("gemma"), "gemma");
  assert_string_equal(model_template("{{ '<|start_header_id|>' + role + '<|end_header_id|>' }}"),
                      "llama3");
  assert_string_equal(model_template("{{ messages[0]['content'] }}"), "chatml");
}

/* The shared models have no chat template: chatml. */
static void test_shared_models_default(void **state) {
  (void)state;
  npulm_model *m = test_open_shared("models/stories260K.gguf");
  assert_string_equal(npulm_model_chat_template(m), "chatml");
  npulm_model_close(m);
}

static void test_errors(void **state) {
  (void)state;
  char buf[64];
  size_t len = 99;
  npulm_error err = {{0}};
  /* too small: the length it needs, and what fits, NUL-terminated */
  const npulm_chat_message one[] = {{"user", "Hello"}};
  const char *want = "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n";
  assert_int_equal(npulm_chat_apply(NULL, "chatml", one, 1, true, buf, 10, &len, &err),
                   NPULM_ERR_ARG);
  assert_int_equal(len, strlen(want));
  assert_string_equal(buf, "<|im_star");
  assert_non_null(strstr(err.msg, "needs"));
  /* exactly the length: no room for the NUL */
  assert_int_equal(npulm_chat_apply(NULL, "chatml", one, 1, true, buf, strlen(want), &len, &err),
                   NPULM_ERR_ARG);
  assert_int_equal(
      npulm_chat_apply(NULL, "chatml", one, 1, true, buf, strlen(want) + 1, &len, &err), NPULM_OK);
  assert_string_equal(buf, want);
  /* no buffer: the length alone */
  assert_int_equal(npulm_chat_apply(NULL, "chatml", one, 1, true, NULL, 0, &len, &err),
                   NPULM_ERR_ARG);
  assert_int_equal(len, strlen(want));
  /* unknown template, role, missing content */
  assert_int_equal(npulm_chat_apply(NULL, "nope", one, 1, true, buf, sizeof(buf), &len, &err),
                   NPULM_ERR_ARG);
  assert_non_null(strstr(err.msg, "unknown chat template 'nope'"));
  assert_non_null(strstr(err.msg, "chatml"));
  const npulm_chat_message bad[] = {{"user", "a"}, {"tool", "b"}};
  assert_int_equal(npulm_chat_apply(NULL, "chatml", bad, 2, true, buf, sizeof(buf), &len, &err),
                   NPULM_ERR_ARG);
  assert_non_null(strstr(err.msg, "unknown role 'tool'"));
  const npulm_chat_message none[] = {{NULL, "a"}};
  assert_int_equal(npulm_chat_apply(NULL, "chatml", none, 1, true, buf, sizeof(buf), &len, &err),
                   NPULM_ERR_ARG);
  const npulm_chat_message empty[] = {{"user", NULL}};
  assert_int_equal(npulm_chat_apply(NULL, "chatml", empty, 1, true, buf, sizeof(buf), &len, &err),
                   NPULM_ERR_ARG);
  /* neither a model nor a name */
  assert_int_equal(npulm_chat_apply(NULL, NULL, one, 1, true, buf, sizeof(buf), &len, &err),
                   NPULM_ERR_ARG);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_expected_outputs),
      cmocka_unit_test(test_no_assistant_opening),
      cmocka_unit_test(test_names),
      cmocka_unit_test(test_detect),
      cmocka_unit_test(test_model_template),
      cmocka_unit_test(test_shared_models_default),
      cmocka_unit_test(test_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
