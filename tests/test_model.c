/* Model loading treats files as hostile: missing or misshapen tensors, missing keys and
 * unsupported architectures or tensor types are one clear error each, never a crash. */
#include <string.h>

#include "io/gguf_write.h"
#include "model/synth.h"
#include "npulm.h"
#include "test_util.h"

/* What to break in the tiny model (as npu_synth_options says). */
struct breakage {
  const char *skip_tensor; /* leave this tensor out */
  const char *skip_key;    /* leave this key out (its name after "llama.") */
  const char *arch;        /* general.architecture (default "llama") */
  const char *wide_tensor; /* give this tensor a wrong row length */
  uint32_t matrix_type;    /* ggml type of the matrices (default F32) */
  uint32_t heads_kv;       /* attention.head_count_kv (default 1) */
  const char *bad_tensor;  /* write 'bad_bits' into element 'bad_at' of this tensor */
  size_t bad_at;           /* an element of it */
  uint32_t bad_bits;       /* F32 bits, or F16 bits in an F16 matrix */
  bool no_tensors;         /* a vocabulary only, as llama.cpp's ggml-vocab-*.gguf files */
};

enum { DIM = 32, HEADS = 2, FFN = 64, VOCAB = 259 + 5 };

/* Element i of every tensor: small, finite, the same in every file. */
static void fill_small(void *user, const struct npu_synth_tensor *t, uint64_t first, float *vals,
                       size_t n) {
  (void)user;
  (void)t;
  for (size_t i = 0; i < n; i++) vals[i] = 0.01f * (float)((first + i) % 7);
}

/* Write a tiny llama model (1 layer) with a byte-fallback SPM vocabulary to 'path'. */
static void write_tiny(const char *path, const struct breakage *b) {
  const struct npu_synth_shape sh = {.arch = b->arch ? b->arch : "llama",
                                     .title = "tiny",
                                     .dim = DIM,
                                     .n_layers = 1,
                                     .n_heads = HEADS,
                                     .n_kv_heads = b->heads_kv ? b->heads_kv : 1,
                                     .ffn_dim = FFN,
                                     .n_vocab = VOCAB,
                                     .n_ctx = 64,
                                     .rope_base = 10000.0f,
                                     .rms_eps = 1e-5f,
                                     .tied = true};
  char key[128] = "";
  if (b->skip_key != NULL) snprintf(key, sizeof(key), "%s.%s", sh.arch, b->skip_key);
  const struct npu_synth_options o = {.type2d = b->matrix_type,
                                      .fill = fill_small,
                                      .omit_key = b->skip_key ? key : NULL,
                                      .omit_tensor = b->skip_tensor,
                                      .wide_tensor = b->wide_tensor,
                                      .poke_tensor = b->bad_tensor,
                                      .poke_at = b->bad_at,
                                      .poke_bits = b->bad_bits,
                                      .no_tensors = b->no_tensors};
  struct npu_gguf_writer *w;
  npulm_error err;
  assert_int_equal(npu_gguf_writer_open_file(path, &w, &err), NPULM_OK);
  assert_int_equal(npu_synth_write(w, &sh, &o, &err), NPULM_OK);
  assert_int_equal(npu_gguf_writer_finish(w, &err), NPULM_OK);
  npu_gguf_writer_free(w);
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
  struct breakage mxfp4 = {.matrix_type = 39 /* MXFP4 */};
  expect_open(&mxfp4, NPULM_ERR_UNSUPPORTED, "blk.0.attn_q.weight (MXFP4)");
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
      cmocka_unit_test(test_tiny_model_opens), cmocka_unit_test(test_missing_tensors),
      cmocka_unit_test(test_wrong_shapes),     cmocka_unit_test(test_missing_keys),
      cmocka_unit_test(test_unsupported),      cmocka_unit_test(test_non_finite_weights),
      cmocka_unit_test(test_vocab_only),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
