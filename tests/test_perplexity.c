/* Perplexity: agrees with llama.cpp's llama-perplexity on stories260K, does not depend on the
 * thread count, and refuses texts too short for the context. */
#include <math.h>
#include <string.h>

#include "npulm.h"
#include "test_util.h"

static void test_stories260k_matches_llama_cpp(void **state) {
  (void)state;
  const char *model_path = test_shared_path("models/stories260K.gguf");
  TEST_REQUIRE_FILE(model_path);
  npulm_model *m;
  npulm_error err;
  assert_int_equal(npulm_model_open(model_path, &m, &err), NPULM_OK);
  size_t len;
  char *text = test_slurp_shared("data/tinystories-valid.txt", &len);
  npulm_ppl_result one, two;
  assert_int_equal(npulm_perplexity(m, text, len, 256, 1, NULL, NULL, &one, &err), NPULM_OK);
  assert_int_equal(npulm_perplexity(m, text, len, 256, 2, NULL, NULL, &two, &err), NPULM_OK);
  /* llama.cpp's F32 figure for this model, text and context */
  const double llama_cpp = 4.4546;
  print_message("PPL %.4f +/- %.4f over %d chunks (llama.cpp %.4f)\n", one.ppl, one.ppl_stderr,
                one.n_chunks, llama_cpp);
  assert_true(fabs(one.ppl - llama_cpp) / llama_cpp < 0.005);
  assert_true(one.ppl == two.ppl);
  assert_int_equal(one.n_scored, (uint64_t)one.n_chunks * 127);
  assert_true(one.ppl_stderr > 0 && one.ppl_stderr < 0.2);
  /* too short for two windows */
  assert_int_equal(npulm_perplexity(m, text, 300, 256, 1, NULL, NULL, &one, &err), NPULM_ERR_ARG);
  assert_non_null(strstr(err.msg, "needs at least 512"));
  assert_int_equal(npulm_perplexity(m, text, len, 1024, 1, NULL, NULL, &one, &err), NPULM_ERR_ARG);
  free(text);
  npulm_model_close(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_stories260k_matches_llama_cpp),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
