/* npulm export: one specialization of a compiled model as ONNX with QDQ, and its AIMET-style
 * encodings, for the vendors' NPU converters. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli_util.h"
#include "commands.h"
#include "npulm.h"

const char npulm_usage_export[] =
    "usage: npulm export [-m MODEL] -o OUT.onnx [--specialization decode|prefill:C] [--ctx K]\n"
    "\n"
    "Write one static specialization of the compiled model (decode, or a prefill chunk of C\n"
    "rows, over a context bucket of K positions) as an ONNX model (opset 17) with the weights\n"
    "inside, and beside it OUT.encodings.json, the quantization in AIMET's encodings format\n"
    "(activation_encodings, param_encodings per channel), keyed by the ONNX tensor names.\n"
    "QuantizeLinear/DequantizeLinear pairs stand wherever npulm's NPU quantizes, with its own\n"
    "scales and zero points (weights per output channel, activations per tensor; int16 ones in\n"
    "the com.microsoft domain, int4 weights as int8 tensors of values in [-8, 7]); attention,\n"
    "RoPE and the KV cache stay float, as npulm runs them.\n"
    "\n"
    "The model's interface, the static-cache form of the vendors' flows (P = K - C):\n"
    "  inputs   input_ids, position_ids   int32 [1, C]\n"
    "           attention_mask            float [1, 1, C, K]: 0 to attend, -1e9 not; columns\n"
    "                                     0..P-1 are past slots 0..P-1, P..K-1 this step's rows\n"
    "           past_key_L, past_value_L  float [1, P, kv_dim] for each layer L (none if P = 0)\n"
    "  outputs  logits                    float [1, C, n_vocab]\n"
    "           present_key_L, _value_L   float [1, C, kv_dim]: this step's cache rows, for the\n"
    "                                     host to put in slots pos0 .. pos0 + n - 1 (n real rows)\n"
    "\n"
    "  -m, --model FILE   a program file (.npu), or a GGUF, compiled first in memory with the\n"
    "                     options below at the one context exported (default: $NPULM_MODEL,\n"
    "                     else " CLI_DEFAULT_MODEL_PATH ")\n"
    "  -o, --output FILE  the ONNX model to write (the encodings go to FILE less .onnx, plus\n"
    "                     .encodings.json)\n"
    "  --specialization S decode (default) or prefill:C, a chunk size the program has\n"
    "  --ctx K            the context bucket (default: the program's largest; a GGUF's own\n"
    "                     context, or any K it is compiled for)\n"
    "  --external-data    the weights in FILE.data beside the model (always done past 2 GiB)\n"
    "  --quant MODE, --float-ops LIST, --calib FILE, --calib-tokens N, --smooth-alpha A,\n"
    "  --shadow-threshold T  how a GGUF model is compiled, as 'npulm compile --help' says\n";

/* "decode" -> 1, "prefill:C" -> C; 0 for anything else. */
static int parse_specialization(const char *s) {
  if (strcmp(s, "decode") == 0) return 1;
  if (strncmp(s, "prefill:", 8) != 0) return 0;
  char *end;
  const long c = strtol(s + 8, &end, 10);
  return *end == '\0' && end != s + 8 && c >= 1 && c <= (1L << 24) ? (int)c : 0;
}

static void progress_bytes(void *user, uint64_t done, uint64_t total) {
  cli_progress(user, "write", "bytes", done, total);
}

int npulm_cmd_export(int argc, char **argv) {
  struct cli_args args = {.argc = argc, .argv = argv, .cmd = "export", .usage = npulm_usage_export};
  struct cli_args *a = &args;
  const char *model_path = NULL, *out = NULL, *compile_opt = NULL;
  npulm_compile_params cp = npulm_compile_default_params();
  npulm_export_params ep = npulm_export_default_params();
  for (a->i = 2; a->i < a->argc; a->i++) {
    const char *o = a->argv[a->i];
    if (cli_wants_help(a)) return 0;
    else if (cli_is_opt(o, "-m", "--model")) model_path = cli_opt_value(a);
    else if (cli_is_opt(o, "-o", "--output")) out = cli_opt_value(a);
    else if (cli_is_opt(o, NULL, "--ctx")) ep.ctx = (int)cli_opt_int(a, 1, 1L << 24);
    else if (cli_is_opt(o, NULL, "--external-data")) ep.external_data = true;
    else if (cli_is_opt(o, NULL, "--specialization")) {
      const char *v = cli_opt_value(a);
      ep.rows = parse_specialization(v);
      if (ep.rows == 0) {
        cli_die(a->cmd, "option --specialization: '%s' is not decode nor prefill:C", v);
      }
    } else if (cli_compile_option(a, &cp, false)) {
      if (compile_opt == NULL) compile_opt = o;
      if (cp.n_chunks > 0 || cp.n_buckets > 0 || cp.sparsity != 0.0f || cp.keep_float) {
        cli_die(a->cmd,
                "option %s does not apply: export compiles the one specialization it "
                "writes, dense",
                o);
      }
    } else cli_unknown_option(a);
  }
  if (out == NULL) cli_die(a->cmd, "%s", "no output file: pass -o OUT.onnx");
  model_path = cli_resolve_model(a->cmd, model_path);
  const double t0 = cli_now();
  npulm_model *model;
  npulm_error err;
  /* each file written, before a GGUF is compiled: the library checks them again */
  char enc_path[4096], data_path[4096];
  npulm_export_encodings_path(out, enc_path, sizeof(enc_path));
  npulm_export_data_path(out, data_path, sizeof(data_path));
  const char *const outputs[] = {out, enc_path, data_path};
  for (size_t i = 0; i < sizeof(outputs) / sizeof(outputs[0]); i++) {
    if (npulm_check_output(model_path, outputs[i], &err) != NPULM_OK) {
      cli_die(a->cmd, "%s", err.msg);
    }
  }
  if (npulm_model_open(model_path, &model, &err) != NPULM_OK) cli_die(a->cmd, "%s", err.msg);
  struct cli_progress progress = {.lines = false};
  if (npulm_model_has_program(model) && compile_opt != NULL) {
    cli_die(a->cmd, "option %s applies to a GGUF model, and '%s' is a compiled program",
            compile_opt, model_path);
  }
  if (!npulm_model_has_program(model)) {
    /* the one bucket exported (default: the model's context, the largest a program has) and a
     * prefill's chunk; the decode graph is always there */
    npulm_model_info info;
    npulm_model_get_info(model, &info);
    if (ep.rows > 1) {
      cp.chunks[0] = ep.rows;
      cp.n_chunks = 1;
    }
    cp.buckets[0] = ep.ctx > 0 ? ep.ctx : info.n_ctx_train;
    cp.n_buckets = 1;
    cp.progress = cli_progress;
    cp.progress_user = &progress;
    const npulm_status st = npulm_model_compile(model, &cp, &err);
    cli_free_compile_params(&cp);
    if (st != NPULM_OK) cli_die(a->cmd, "%s", err.msg);
  }
  struct cli_progress write_progress = {.lines = false};
  ep.progress = progress_bytes;
  ep.progress_user = &write_progress;
  npulm_export_info info;
  const npulm_status st = npulm_model_export_onnx(model, out, &ep, &info, &err);
  npulm_model_close(model);
  if (st != NPULM_OK) cli_die(a->cmd, "%s", err.msg);
  struct stat st_onnx, st_enc;
  const double mb = stat(out, &st_onnx) == 0 ? (double)st_onnx.st_size / 1e6 : 0.0;
  const double enc_mb =
      stat(info.encodings_path, &st_enc) == 0 ? (double)st_enc.st_size / 1e6 : 0.0;
  char spec[32];
  if (info.rows == 1) snprintf(spec, sizeof(spec), "decode");
  else snprintf(spec, sizeof(spec), "prefill:%d", info.rows);
  fprintf(stderr,
          "wrote %s (%s at context %d: %d nodes, %d QDQ, %.1f MB%s) and %s (%.1f MB) in %.2f s\n",
          out, spec, info.ctx, info.n_nodes, info.n_qdq, mb,
          info.external_data ? " + weights in .data" : "", info.encodings_path, enc_mb,
          cli_now() - t0);
  return 0;
}
