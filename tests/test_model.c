/* Model loading treats files as hostile: missing or misshapen tensors, missing keys and
 * unsupported architectures or tensor types are one clear error each, never a crash. */
#include <string.h>

#include "gguf_write.h"
#include "npulm.h"
#include "test_util.h"

/* What to break in the tiny model. */
struct breakage {
  const char *skip_tensor;  /* leave this tensor out */
  const char *skip_key;     /* leave this key out */
  const char *arch;         /* general.architecture (default "llama") */
  const char *wide_tensor;  /* give this tensor a wrong row length */
  uint32_t matrix_type;     /* ggml type of the matrices (default F32) */
  uint32_t heads_kv;        /* attention.head_count_kv (default 1) */
  const char *bad_tensor;   /* write 'bad_bits' into element 'bad_at' of this tensor */
  size_t bad_at;            /* an element of it */
  uint32_t bad_bits;        /* F32 bits, or F16 bits in an F16 matrix */
  bool no_tensors;          /* a vocabulary only, as llama.cpp's ggml-vocab-*.gguf files */
};

enum { DIM = 32, HEADS = 2, FFN = 64, VOCAB = 259 + 5 };

/* Write a tiny llama model (1 layer) with a byte-fallback SPM vocabulary to 'path'. */
static void write_tiny(const char *path, const struct breakage *b) {
  struct npu_gguf_writer *w;
  npulm_error err;
  assert_int_equal(npu_gguf_writer_open_file(path, &w, &err), NPULM_OK);
  const char *arch = b->arch ? b->arch : "llama";
  char key[128];
#define KEY(suffix) (snprintf(key, sizeof(key), "%s.%s", arch, suffix), key)
#define SKIP(k) (b->skip_key != NULL && strcmp(b->skip_key, k) == 0)
  npu_gguf_writer_add_str(w, "general.architecture", arch);
  if (!SKIP("embedding_length")) npu_gguf_writer_add_u32(w, KEY("embedding_length"), DIM);
  if (!SKIP("block_count")) npu_gguf_writer_add_u32(w, KEY("block_count"), 1);
  if (!SKIP("feed_forward_length")) npu_gguf_writer_add_u32(w, KEY("feed_forward_length"), FFN);
  if (!SKIP("attention.head_count")) npu_gguf_writer_add_u32(w, KEY("attention.head_count"), HEADS);
  npu_gguf_writer_add_u32(w, KEY("attention.head_count_kv"), b->heads_kv ? b->heads_kv : 1);
  if (!SKIP("context_length")) npu_gguf_writer_add_u32(w, KEY("context_length"), 64);
  npu_gguf_writer_add_f32(w, KEY("attention.layer_norm_rms_epsilon"), 1e-5f);
  npu_gguf_writer_add_str(w, "tokenizer.ggml.model", "llama");
  static char names[VOCAB][16];
  const char *tokens[VOCAB];
  float scores[VOCAB];
  int32_t types[VOCAB];
  for (int i = 0; i < VOCAB; i++) {
    if (i < 3) snprintf(names[i], 16, "%s", i == 0 ? "<unk>" : i == 1 ? "<s>" : "</s>");
    else if (i < 259) snprintf(names[i], 16, "<0x%02X>", i - 3);
    else snprintf(names[i], 16, "\xe2\x96\x81%c", 'a' + (i - 259));
    tokens[i] = names[i];
    scores[i] = (float)-i;
    types[i] = i == 0 ? 2 : i < 3 ? 3 : i < 259 ? 6 : 1;
  }
  npu_gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", tokens, VOCAB);
  npu_gguf_writer_add_arr(w, "tokenizer.ggml.scores", NPU_GGUF_F32, scores, VOCAB);
  npu_gguf_writer_add_arr(w, "tokenizer.ggml.token_type", NPU_GGUF_I32, types, VOCAB);
  npu_gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", 1);
  npu_gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", 2);
  uint32_t mt = b->matrix_type;
  struct { const char *name; uint64_t ne0, ne1; } specs[] = {
      {"token_embd.weight", DIM, VOCAB},     {"output_norm.weight", DIM, 0},
      {"blk.0.attn_norm.weight", DIM, 0},    {"blk.0.attn_q.weight", DIM, DIM},
      {"blk.0.attn_k.weight", DIM, DIM / HEADS}, {"blk.0.attn_v.weight", DIM, DIM / HEADS},
      {"blk.0.attn_output.weight", DIM, DIM}, {"blk.0.ffn_norm.weight", DIM, 0},
      {"blk.0.ffn_gate.weight", DIM, FFN},   {"blk.0.ffn_up.weight", DIM, FFN},
      {"blk.0.ffn_down.weight", FFN, DIM},
  };
  size_t n_declared = 0, idx[16];
  const char *declared[16];
  uint32_t declared_type[16];
  for (size_t i = 0; i < sizeof(specs) / sizeof(specs[0]); i++) {
    if (b->no_tensors) break;
    if (b->skip_tensor != NULL && strcmp(b->skip_tensor, specs[i].name) == 0) continue;
    uint64_t ne[2] = {specs[i].ne0, specs[i].ne1};
    if (b->wide_tensor != NULL && strcmp(b->wide_tensor, specs[i].name) == 0) ne[0] += 32;
    uint32_t type = specs[i].ne1 ? mt : NPU_GGML_F32;
    assert_int_equal(npu_gguf_writer_add_tensor(w, specs[i].name, type, specs[i].ne1 ? 2 : 1, ne,
                                                &idx[n_declared]),
                     NPULM_OK);
    declared[n_declared] = specs[i].name;
    declared_type[n_declared] = type;
    n_declared++;
  }
  for (size_t i = 0; i < n_declared; i++) {
    size_t nbytes = (size_t)npu_gguf_writer_tensor_nbytes(w, idx[i]);
    uint8_t *data = calloc(nbytes, 1);
    for (size_t j = 0; j + 4 <= nbytes; j += 4) {
      float v = 0.01f * (float)((j / 4) % 7);
      memcpy(data + j, &v, 4);
    }
    if (b->bad_tensor != NULL && strcmp(b->bad_tensor, declared[i]) == 0) {
      uint16_t bits16 = (uint16_t)b->bad_bits;
      if (declared_type[i] == NPU_GGML_F16) {
        memcpy(data + b->bad_at * 2, &bits16, 2);
      } else {
        memcpy(data + b->bad_at * 4, &b->bad_bits, 4);
      }
    }
    assert_int_equal(npu_gguf_writer_write_tensor(w, idx[i], data, &err), NPULM_OK);
    free(data);
  }
  assert_int_equal(npu_gguf_writer_finish(w, &err), NPULM_OK);
  npu_gguf_writer_free(w);
#undef KEY
#undef SKIP
}

/* Open a tiny model broken as 'b'; expect 'want' and a message containing 'needle'. */
static void expect_open(const struct breakage *b, npulm_status want, const char *needle) {
  char path[] = "/tmp/npulm-test-model-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  write_tiny(path, b);
  npulm_model *m = NULL;
  npulm_error err = {{0}};
  npulm_status st = npulm_model_open(path, &m, &err);
  unlink(path);
  if (st != want) fail_msg("status %d (want %d): %s", st, want, err.msg);
  if (want == NPULM_OK) {
    assert_non_null(m);
    npulm_model_close(m);
    return;
  }
  assert_null(m);
  if (strstr(err.msg, needle) == NULL) fail_msg("message '%s' lacks '%s'", err.msg, needle);
  assert_null(strchr(err.msg, '\n'));
}

static void test_tiny_model_opens(void **state) {
  (void)state;
  struct breakage ok = {0};
  expect_open(&ok, NPULM_OK, NULL);
  struct breakage q8 = {.matrix_type = NPU_GGML_Q8_0};
  expect_open(&q8, NPULM_OK, NULL);
  struct breakage f16 = {.matrix_type = NPU_GGML_F16};
  expect_open(&f16, NPULM_OK, NULL);
}

static void test_missing_tensors(void **state) {
  (void)state;
  const char *names[] = {"token_embd.weight", "output_norm.weight", "blk.0.attn_q.weight",
                         "blk.0.ffn_down.weight", "blk.0.attn_norm.weight"};
  for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
    struct breakage b = {.skip_tensor = names[i]};
    expect_open(&b, NPULM_ERR_FORMAT, names[i]);
  }
}

static void test_wrong_shapes(void **state) {
  (void)state;
  const char *names[] = {"blk.0.attn_k.weight", "blk.0.ffn_up.weight", "output_norm.weight"};
  for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
    struct breakage b = {.wide_tensor = names[i]};
    expect_open(&b, NPULM_ERR_FORMAT, names[i]);
  }
}

static void test_missing_keys(void **state) {
  (void)state;
  const char *keys[] = {"embedding_length", "block_count", "feed_forward_length",
                        "attention.head_count", "context_length"};
  for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
    struct breakage b = {.skip_key = keys[i]};
    expect_open(&b, NPULM_ERR_FORMAT, keys[i]);
  }
}

static void test_unsupported(void **state) {
  (void)state;
  struct breakage arch = {.arch = "mamba"};
  expect_open(&arch, NPULM_ERR_UNSUPPORTED, "mamba");
  struct breakage q40 = {.matrix_type = 2 /* Q4_0 */};
  expect_open(&q40, NPULM_ERR_UNSUPPORTED, "Q4_0");
  struct breakage gqa = {.heads_kv = 3};
  expect_open(&gqa, NPULM_ERR_FORMAT, "KV heads");
}

/* A weight that is not finite is refused at open, naming the tensor, whether it is used in place
 * (F32) or dequantized (F16): the FP32 reference and the f32 program compute from these views as
 * the integer NPU's quantization does, so none of them gets a model it cannot run. */
static void test_non_finite_weights(void **state) {
  (void)state;
  /* (token_embd has 8448 values: whole blocks of 1024 and a tail of 256) */
  const struct {
    struct breakage b;
    const char *want;
  } bad[] = {
      {{.bad_tensor = "blk.0.attn_q.weight", .bad_at = 5, .bad_bits = 0x7fc00000}, "nan at 5"},
      {{.bad_tensor = "blk.0.ffn_down.weight", .bad_at = 0, .bad_bits = 0x7f800000}, ": inf at 0"},
      {{.bad_tensor = "token_embd.weight", .bad_at = 2047, .bad_bits = 0xff800000}, "-inf at 2047"},
      {{.bad_tensor = "token_embd.weight", .bad_at = 8447, .bad_bits = 0x7f800001}, "nan at 8447"},
      {{.bad_tensor = "output_norm.weight", .bad_at = DIM - 1, .bad_bits = 0xffc00001},
       "nan at 31"},
      {{.bad_tensor = "blk.0.ffn_up.weight",
        .matrix_type = NPU_GGML_F16,
        .bad_at = 1500,
        .bad_bits = 0x7e00},
       "nan at 1500"},
      {{.bad_tensor = "blk.0.attn_v.weight",
        .matrix_type = NPU_GGML_F16,
        .bad_at = 7,
        .bad_bits = 0xfc00},
       "-inf at 7"},
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    char want[128];
    snprintf(want, sizeof(want),
             "tensor '%s' has a value that is not finite: ", bad[i].b.bad_tensor);
    expect_open(&bad[i].b, NPULM_ERR_FORMAT, want);
    expect_open(&bad[i].b, NPULM_ERR_FORMAT, bad[i].want); /* (the sign of a NaN is not asserted) */
  }
  /* the largest finite values are no reason to refuse */
  struct breakage big = {.bad_tensor = "blk.0.attn_q.weight", .bad_at = 5, .bad_bits = 0x7f7fffff};
  expect_open(&big, NPULM_OK, NULL);
  struct breakage big16 = {.bad_tensor = "blk.0.ffn_up.weight",
                           .matrix_type = NPU_GGML_F16,
                           .bad_at = 5,
                           .bad_bits = 0xfbff};
  expect_open(&big16, NPULM_OK, NULL);
}

/* A vocabulary-only file opens with npulm_model_open_vocab (so does a whole model, without its
 * weights) and tokenizes as the model does; npulm_model_open refuses it, and a model opened for its
 * vocabulary cannot be compiled or run. */
static void test_vocab_only(void **state) {
  (void)state;
  char vocab[] = "/tmp/npulm-test-vocab-XXXXXX", full[] = "/tmp/npulm-test-model-XXXXXX";
  int fd1 = mkstemp(vocab), fd2 = mkstemp(full);
  assert_true(fd1 >= 0 && fd2 >= 0);
  close(fd1);
  close(fd2);
  write_tiny(vocab, &(struct breakage){.no_tensors = true});
  write_tiny(full, &(struct breakage){0});
  npulm_model *m = NULL, *v = NULL, *vf = NULL;
  npulm_error err = {{0}};
  assert_int_equal(npulm_model_open(vocab, &m, &err), NPULM_ERR_FORMAT);
  assert_null(m);
  assert_non_null(strstr(err.msg, "no tensors: a vocabulary only"));
  assert_int_equal(npulm_model_open(full, &m, &err), NPULM_OK);
  assert_int_equal(npulm_model_open_vocab(vocab, &v, &err), NPULM_OK);
  assert_int_equal(npulm_model_open_vocab(full, &vf, &err), NPULM_OK);
  unlink(vocab);
  unlink(full);

  /* the same ids and pieces as the whole model's */
  const char *text = "ab c\xff";
  int32_t want[16], got[16];
  size_t n_want, n_got;
  assert_int_equal(npulm_tokenize(m, text, strlen(text), true, true, want, 16, &n_want, &err),
                   NPULM_OK);
  assert_true(n_want > 4);
  npulm_model *vocabs[] = {v, vf};
  for (int i = 0; i < 2; i++) {
    npulm_model *x = vocabs[i];
    assert_int_equal(npulm_tokenize(x, text, strlen(text), true, true, got, 16, &n_got, &err),
                     NPULM_OK);
    assert_int_equal(n_got, n_want);
    assert_memory_equal(got, want, n_want * sizeof(int32_t));
    char a[16], b[16];
    for (size_t t = 0; t < n_want; t++) {
      int32_t prev = t > 0 ? want[t - 1] : -1;
      size_t la = npulm_token_to_piece(m, prev, want[t], a, sizeof(a));
      assert_int_equal(npulm_token_to_piece(x, prev, want[t], b, sizeof(b)), la);
      assert_memory_equal(a, b, la);
      assert_string_equal(npulm_token_text(x, want[t]), npulm_token_text(m, want[t]));
    }
    assert_true(npulm_token_is_eog(x, 2));
    npulm_model_info info;
    npulm_model_get_info(x, &info);
    assert_string_equal(info.arch, "");
    assert_int_equal(info.n_vocab, VOCAB);
    assert_int_equal(info.bos_id, 1);
    assert_int_equal(info.eos_id, 2);
    assert_true(info.add_bos);
    assert_int_equal(info.n_layers, 0);
    assert_int_equal(info.n_params, 0);

    /* nothing to compile or run */
    assert_false(npulm_model_has_program(x));
    assert_int_equal(npulm_model_compile(x, NULL, &err), NPULM_ERR_ARG);
    assert_non_null(strstr(err.msg, "vocabulary only"));
    for (int reference = 0; reference < 2; reference++) {
      npulm_session_params sp = npulm_session_default_params();
      sp.reference = reference;
      npulm_session *s = NULL;
      err.msg[0] = '\0';
      assert_int_equal(npulm_session_create(x, &sp, &s, &err), NPULM_ERR_ARG);
      assert_null(s);
      assert_non_null(strstr(err.msg, "vocabulary only"));
    }
    npulm_ppl_result ppl;
    for (int reference = 0; reference < 2; reference++) {
      err.msg[0] = '\0';
      assert_int_equal((reference ? npulm_perplexity_reference : npulm_perplexity)(
                           x, "ab ab ab ab ab ab", 17, 4, 1, NULL, NULL, &ppl, &err),
                       NPULM_ERR_ARG);
      assert_non_null(strstr(err.msg, "vocabulary only"));
    }
    npulm_diff_report *r = NULL;
    assert_int_equal(npulm_diff(x, "ab", 2, &r, &err), NPULM_ERR_ARG);
    assert_null(r);
    assert_non_null(strstr(err.msg, "vocabulary only"));
    npulm_model_close(x);
  }
  npulm_model_close(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_tiny_model_opens),
      cmocka_unit_test(test_missing_tensors),
      cmocka_unit_test(test_wrong_shapes),
      cmocka_unit_test(test_missing_keys),
      cmocka_unit_test(test_unsupported),
      cmocka_unit_test(test_non_finite_weights),
      cmocka_unit_test(test_vocab_only),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
