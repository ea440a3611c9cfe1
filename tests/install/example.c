/* The minimal program on the npulm library, as docs/library.md shows it:
 * open a model, tokenize a prompt, evaluate it, then greedily pick, print and evaluate one token
 * at a time. tests/cli/test_install.sh builds it against the installed library. */
#include <stdio.h>
#include <string.h>

#include <npulm.h>

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s MODEL.gguf PROMPT\n", argv[0]);
    return 1;
  }
  const char *prompt = argv[2];
  npulm_model *model = NULL;
  npulm_session *session = NULL;
  npulm_sampler *sampler = NULL;
  npulm_error err;
  int status = 1;

  if (npulm_model_open(argv[1], &model, &err) != NPULM_OK) goto fail;
  npulm_model_info info;
  npulm_model_get_info(model, &info);
  /* a session's defaults: the model's context (at most 4096), one thread per CPU */
  npulm_session_params sp = npulm_session_default_params();
  if (npulm_session_create(model, &sp, &session, &err) != NPULM_OK) goto fail;
  npulm_sampler_params samp = npulm_sampler_default_params();
  samp.temp = 0; /* greedy: the most likely token */
  if (npulm_sampler_create(&samp, info.n_vocab, &sampler, &err) != NPULM_OK) goto fail;

  int32_t tokens[256];
  size_t n;
  if (npulm_tokenize(model, prompt, strlen(prompt), info.add_bos, false, tokens, 256, &n, &err) !=
      NPULM_OK)
    goto fail;
  if (n == 0) {
    snprintf(err.msg, sizeof(err.msg), "the prompt is empty and the model adds no BOS token");
    goto fail;
  }
  if (npulm_session_eval(session, tokens, n, NULL, &err) != NPULM_OK) goto fail;

  fputs(prompt, stdout);
  int32_t prev = tokens[n - 1];
  for (int i = 0; i < 32 && npulm_session_pos(session) < npulm_session_ctx(session); i++) {
    int32_t next = npulm_sampler_sample(sampler, npulm_session_logits(session));
    if (npulm_token_is_eog(model, next)) break;
    char piece[256];
    size_t len = npulm_token_to_piece(model, prev, next, piece, sizeof(piece));
    fwrite(piece, 1, len < sizeof(piece) ? len : sizeof(piece), stdout);
    prev = next;
    if (npulm_session_eval(session, &next, 1, NULL, &err) != NPULM_OK) goto fail;
  }
  putchar('\n');
  status = 0;

fail:
  if (status != 0) fprintf(stderr, "%s: %s\n", argv[0], err.msg);
  npulm_sampler_free(sampler);
  npulm_session_free(session);
  npulm_model_close(model);
  return status;
}
