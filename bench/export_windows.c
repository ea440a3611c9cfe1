/* npulm's logits at every position of windows of a text, the reference that
 * bench/export_agreement.mjs compares an exported ONNX model's against (the agreement figures of
 * npulm export in bench/RESULTS.md). Public API only.
 *
 *   export_windows MODEL.npu TEXT OUT.bin WINDOWS LEN
 *
 * The text is tokenized whole (with BOS if the model wants it); window w is its tokens
 * [w * LEN, (w + 1) * LEN), each evaluated from an empty cache one token at a time (decode: its
 * rows are bit for bit a prefill chunk's). OUT.bin, in the host's byte order: int32 windows, len,
 * n_vocab; int32 tokens[windows * len]; float32 logits[windows * len * n_vocab] (row t: after token
 * t). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "npulm.h"

static int fail(const char *what) {
  fprintf(stderr, "export_windows: %s\n", what);
  return 1;
}

int main(int argc, char **argv) {
  if (argc != 6) return fail("usage: export_windows MODEL.npu TEXT OUT.bin WINDOWS LEN");
  const int windows = atoi(argv[4]), len = atoi(argv[5]);
  if (windows < 1 || len < 1) return fail("WINDOWS and LEN must be positive");
  npulm_model *model;
  npulm_error err;
  if (npulm_model_open(argv[1], &model, &err) != NPULM_OK) return fail(err.msg);
  npulm_model_info info;
  npulm_model_get_info(model, &info);
  FILE *f = fopen(argv[2], "rb");
  if (f == NULL) return fail("cannot read the text");
  fseek(f, 0, SEEK_END);
  const long text_len = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *text = malloc((size_t)text_len + 1);
  if (text == NULL || fread(text, 1, (size_t)text_len, f) != (size_t)text_len) {
    return fail("cannot read the text");
  }
  fclose(f);
  const size_t cap = (size_t)text_len + 8, want = (size_t)windows * (size_t)len;
  int32_t *tokens = malloc(cap * sizeof(int32_t));
  size_t n = 0;
  if (tokens == NULL || npulm_tokenize(model, text, (size_t)text_len, info.add_bos, false, tokens,
                                       cap, &n, &err) != NPULM_OK) {
    return fail(tokens == NULL ? "out of memory" : err.msg);
  }
  if (n < want) return fail("the text has fewer tokens than WINDOWS x LEN");
  float *logits = malloc(want * (size_t)info.n_vocab * sizeof(float));
  npulm_session *s;
  npulm_session_params sp = npulm_session_default_params();
  sp.n_ctx = len;
  if (logits == NULL) return fail("out of memory");
  if (npulm_session_create(model, &sp, &s, &err) != NPULM_OK) return fail(err.msg);
  for (size_t i = 0; i < want; i++) {
    if (i % (size_t)len == 0) npulm_session_reset(s);
    if (npulm_session_eval(s, &tokens[i], 1, NULL, &err) != NPULM_OK) return fail(err.msg);
    memcpy(logits + i * (size_t)info.n_vocab, npulm_session_logits(s),
           (size_t)info.n_vocab * sizeof(float));
  }
  FILE *out = fopen(argv[3], "wb");
  const int32_t head[3] = {windows, len, info.n_vocab};
  if (out == NULL || fwrite(head, sizeof(head), 1, out) != 1 ||
      fwrite(tokens, sizeof(int32_t), want, out) != want ||
      fwrite(logits, sizeof(float) * (size_t)info.n_vocab, want, out) != want || fclose(out) != 0) {
    return fail("cannot write OUT.bin");
  }
  npulm_session_free(s);
  npulm_model_close(model);
  free(logits);
  free(tokens);
  free(text);
  return 0;
}
