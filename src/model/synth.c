/* Synthetic models: GGUF files with the exact tensor shapes and metadata that llama.cpp's
 * convert_hf_to_gguf.py writes for real llama-family models, seeded random weights of realistic
 * scale and a synthetic SentencePiece vocabulary. They exist for speed work (npulm vs llama.cpp
 * on the same file); accuracy is measured on trained models. */
#include <assert.h>
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/common.h"
#include "io/gguf.h"
#include "io/gguf_write.h"
#include "model/synth.h"
#include "npulm.h"
#include "npulm_bench.h"

/* ---- Shapes --------------------------------------------------------------------------------- */

static const struct npu_synth_shape shapes[] = {
    /* Tiny shapes for tests: every code path (GQA, biases, tied output) at a few hundred KB. */
    {.name = "tiny",
     .arch = "llama",
     .title = "tiny",
     .dim = 64,
     .n_layers = 2,
     .n_heads = 4,
     .n_kv_heads = 2,
     .ffn_dim = 160,
     .n_vocab = 512,
     .n_ctx = 256,
     .rope_base = 10000.0f,
     .rms_eps = 1e-5f},
    {.name = "tiny-qwen2",
     .arch = "qwen2",
     .title = "tiny-qwen2",
     .dim = 64,
     .n_layers = 2,
     .n_heads = 4,
     .n_kv_heads = 1,
     .ffn_dim = 160,
     .n_vocab = 640,
     .n_ctx = 512,
     .rope_base = 1000000.0f,
     .rms_eps = 1e-6f,
     .tied = true,
     .qkv_bias = true},
    /* llama2.c TinyStories models (karpathy/tinyllamas): the classifier shares the embedding,
     * and their GGUF conversions (like ../shared/models/stories260K.gguf) have no output.weight. */
    {.name = "stories15M",
     .arch = "llama",
     .title = "stories15M",
     .dim = 288,
     .n_layers = 6,
     .n_heads = 6,
     .n_kv_heads = 6,
     .ffn_dim = 768,
     .n_vocab = 32000,
     .n_ctx = 256,
     .rope_base = 10000.0f,
     .rms_eps = 1e-5f,
     .tied = true},
    {.name = "stories110M",
     .arch = "llama",
     .title = "stories110M",
     .dim = 768,
     .n_layers = 12,
     .n_heads = 12,
     .n_kv_heads = 12,
     .ffn_dim = 2048,
     .n_vocab = 32000,
     .n_ctx = 1024,
     .rope_base = 10000.0f,
     .rms_eps = 1e-5f,
     .tied = true},
    /* HuggingFaceTB/SmolLM2-135M */
    {.name = "smollm2-135m",
     .arch = "llama",
     .title = "SmolLM2 135M",
     .dim = 576,
     .n_layers = 30,
     .n_heads = 9,
     .n_kv_heads = 3,
     .ffn_dim = 1536,
     .n_vocab = 49152,
     .n_ctx = 8192,
     .rope_base = 100000.0f,
     .rms_eps = 1e-5f,
     .tied = true},
    /* Qwen/Qwen2.5-0.5B */
    {.name = "qwen2.5-0.5b",
     .arch = "qwen2",
     .title = "Qwen2.5 0.5B",
     .dim = 896,
     .n_layers = 24,
     .n_heads = 14,
     .n_kv_heads = 2,
     .ffn_dim = 4864,
     .n_vocab = 151936,
     .n_ctx = 32768,
     .rope_base = 1000000.0f,
     .rms_eps = 1e-6f,
     .tied = true,
     .qkv_bias = true},
    /* meta-llama/Llama-3.2-1B */
    {.name = "llama-3.2-1b",
     .arch = "llama",
     .title = "Llama 3.2 1B",
     .dim = 2048,
     .n_layers = 16,
     .n_heads = 32,
     .n_kv_heads = 8,
     .ffn_dim = 8192,
     .n_vocab = 128256,
     .n_ctx = 131072,
     .rope_base = 500000.0f,
     .rms_eps = 1e-5f,
     .tied = true,
     .head_dim_key = true,
     .rope_llama3_factor = 32.0f,
     .rope_low_freq_factor = 1.0f,
     .rope_high_freq_factor = 4.0f,
     .rope_orig_ctx = 8192},
    /* The bigger shapes, from each model's config.json on Hugging Face (hidden_size,
     * num_hidden_layers, num_attention_heads, num_key_value_heads, intermediate_size, vocab_size,
     * max_position_embeddings, rope_theta, rms_norm_eps, tie_word_embeddings, rope_scaling). Write
     * them as q4_0 or q8_0: as F32 they take 6-32 GB. */
    /* meta-llama/Llama-3.2-3B: 3.21B parameters */
    {.name = "llama-3.2-3b",
     .arch = "llama",
     .title = "Llama 3.2 3B",
     .dim = 3072,
     .n_layers = 28,
     .n_heads = 24,
     .n_kv_heads = 8,
     .ffn_dim = 8192,
     .n_vocab = 128256,
     .n_ctx = 131072,
     .rope_base = 500000.0f,
     .rms_eps = 1e-5f,
     .tied = true,
     .head_dim_key = true,
     .rope_llama3_factor = 32.0f,
     .rope_low_freq_factor = 1.0f,
     .rope_high_freq_factor = 4.0f,
     .rope_orig_ctx = 8192},
    /* meta-llama/Llama-3.1-8B: 8.03B parameters; a separate output matrix. (Its first config.json
     * had no "head_dim"; the current one says 128, as dim / heads does.) */
    {.name = "llama-3.1-8b",
     .arch = "llama",
     .title = "Llama 3.1 8B",
     .dim = 4096,
     .n_layers = 32,
     .n_heads = 32,
     .n_kv_heads = 8,
     .ffn_dim = 14336,
     .n_vocab = 128256,
     .n_ctx = 131072,
     .rope_base = 500000.0f,
     .rms_eps = 1e-5f,
     .head_dim_key = true,
     .rope_llama3_factor = 8.0f,
     .rope_low_freq_factor = 1.0f,
     .rope_high_freq_factor = 4.0f,
     .rope_orig_ctx = 8192},
    /* Qwen/Qwen2.5-1.5B: 1.54B parameters (context 131072: the base model's; -Instruct's is 32K) */
    {.name = "qwen2.5-1.5b",
     .arch = "qwen2",
     .title = "Qwen2.5 1.5B",
     .dim = 1536,
     .n_layers = 28,
     .n_heads = 12,
     .n_kv_heads = 2,
     .ffn_dim = 8960,
     .n_vocab = 151936,
     .n_ctx = 131072,
     .rope_base = 1000000.0f,
     .rms_eps = 1e-6f,
     .tied = true,
     .qkv_bias = true},
    /* Qwen/Qwen2.5-7B: 7.61B parameters, untied output, the vocabulary padded to 152064 */
    {.name = "qwen2.5-7b",
     .arch = "qwen2",
     .title = "Qwen2.5 7B",
     .dim = 3584,
     .n_layers = 28,
     .n_heads = 28,
     .n_kv_heads = 4,
     .ffn_dim = 18944,
     .n_vocab = 152064,
     .n_ctx = 131072,
     .rope_base = 1000000.0f,
     .rms_eps = 1e-6f,
     .qkv_bias = true},
};
#define N_SHAPES (sizeof(shapes) / sizeof(shapes[0]))

static const char *const shape_names[N_SHAPES + 1] = {
    "tiny",         "tiny-qwen2",   "stories15M",   "stories110M",  "smollm2-135m", "qwen2.5-0.5b",
    "llama-3.2-1b", "llama-3.2-3b", "llama-3.1-8b", "qwen2.5-1.5b", "qwen2.5-7b",   NULL,
};

const char *const *npulm_synth_shapes(void) { return shape_names; }

const struct npu_synth_shape *npu_synth_shape_find(const char *name) {
  for (size_t i = 0; i < N_SHAPES && name != NULL; i++) {
    if (strcmp(shapes[i].name, name) == 0) return &shapes[i];
  }
  return NULL;
}

/* ---- Deterministic random numbers ----------------------------------------------------------- */

static uint64_t splitmix64(uint64_t *state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* An approximately standard normal number: the sum of four uniform 16-bit lanes of one random
 * word (Irwin-Hall), centred and scaled to unit variance. Integer-derived, so the same seed gives
 * the same bits on every libm; the tails stop at +-3.46, which suits weights. */
static float rand_normal(uint64_t *state) {
  uint64_t r = splitmix64(state);
  uint32_t s = (uint32_t)(r & 0xffff) + (uint32_t)((r >> 16) & 0xffff) +
               (uint32_t)((r >> 32) & 0xffff) + (uint32_t)(r >> 48);
  /* s + 2 is the sum of four (lane + 0.5); each lane/65536 is uniform on (0, 1), mean 1/2,
   * variance 1/12, so (sum - 2) * sqrt(3) has mean 0 and variance 1. */
  return ((float)(s + 2) / 65536.0f - 2.0f) * 1.7320508f;
}

/* ---- Tensor plan ---------------------------------------------------------------------------- */

enum init_kind { INIT_MATRIX, INIT_NORM, INIT_BIAS, INIT_ROPE_FREQS };

struct plan_tensor {
  char name[64];
  uint32_t n_dims;
  uint64_t ne[2];
  uint32_t type; /* ggml type in the file */
  enum init_kind init;
};

struct plan {
  struct plan_tensor *t;
  size_t n;
  size_t cap;
};

/* Add a tensor to the plan, unless 'o' leaves it out; widened where 'o' says so. */
static npulm_status plan_add(struct plan *p, const struct npu_synth_options *o, const char *name,
                             uint32_t n_dims, uint64_t ne0, uint64_t ne1, enum init_kind init,
                             npulm_error *err) {
  if (o->omit_tensor != NULL && strcmp(o->omit_tensor, name) == 0) return NPULM_OK;
  if (o->wide_tensor != NULL && strcmp(o->wide_tensor, name) == 0) ne0 += 32;
  if (p->n == p->cap) {
    size_t cap = p->cap ? 2 * p->cap : 64;
    struct plan_tensor *t = realloc(p->t, cap * sizeof(*t));
    if (t == NULL) return npu_fail(err, NPULM_ERR_NOMEM, "out of memory planning tensors");
    p->t = t;
    p->cap = cap;
  }
  struct plan_tensor *t = &p->t[p->n++];
  snprintf(t->name, sizeof(t->name), "%s", name);
  t->n_dims = n_dims;
  t->ne[0] = ne0;
  t->ne[1] = ne1;
  t->type = n_dims == 2 ? o->type2d : NPU_GGML_F32; /* as llama.cpp: 1-D tensors stay F32 */
  t->init = init;
  return NPULM_OK;
}

/* The classifier's type (output.weight, or token_embd.weight when the output is tied to it) in a
 * file whose matrices are 'type2d', as llama-quantize's Q4_0 mix (llama_tensor_get_type) picks it:
 * Q6_K, or Q8_0 where its rows ('ne0') are not whole 256-value blocks. Other types: unchanged. */
static uint32_t classifier_type(uint32_t type2d, uint64_t ne0) {
  if (type2d != NPU_GGML_Q4_0) return type2d;
  return ne0 % NPU_QK_K == 0 ? NPU_GGML_Q6_K : NPU_GGML_Q8_0;
}

/* Every tensor of 'sh' in file order, 2-D weights of ggml type 'o->type2d' but the classifier. */
static npulm_status make_plan(const struct npu_synth_shape *sh, const struct npu_synth_options *o,
                              struct plan *p, npulm_error *err) {
  const uint64_t dim = sh->dim, hd = sh->dim / sh->n_heads;
  const uint64_t q_dim = hd * sh->n_heads, kv_dim = hd * sh->n_kv_heads;
  npulm_status st;
  char name[64];
#define ADD1(nm, n0, init) plan_add(p, o, (nm), 1, (n0), 1, (init), err)
#define ADD2(nm, n0, n1) plan_add(p, o, (nm), 2, (n0), (n1), INIT_MATRIX, err)
#define TRY(expr)                                                                                  \
  do {                                                                                             \
    if ((st = (expr)) != NPULM_OK) return st;                                                      \
  } while (0)
  TRY(ADD2("token_embd.weight", dim, sh->n_vocab));
  if (sh->tied && p->n > 0 && strcmp(p->t[p->n - 1].name, "token_embd.weight") == 0) {
    p->t[p->n - 1].type = classifier_type(o->type2d, p->t[p->n - 1].ne[0]);
  }
  if (sh->rope_llama3_factor > 0.0f) TRY(ADD1("rope_freqs.weight", hd / 2, INIT_ROPE_FREQS));
  for (uint32_t l = 0; l < sh->n_layers; l++) {
#define BLK(suffix) (snprintf(name, sizeof(name), "blk.%u." suffix, l), name)
    TRY(ADD1(BLK("attn_norm.weight"), dim, INIT_NORM));
    TRY(ADD2(BLK("attn_q.weight"), dim, q_dim));
    if (sh->qkv_bias) TRY(ADD1(BLK("attn_q.bias"), q_dim, INIT_BIAS));
    TRY(ADD2(BLK("attn_k.weight"), dim, kv_dim));
    if (sh->qkv_bias) TRY(ADD1(BLK("attn_k.bias"), kv_dim, INIT_BIAS));
    TRY(ADD2(BLK("attn_v.weight"), dim, kv_dim));
    if (sh->qkv_bias) TRY(ADD1(BLK("attn_v.bias"), kv_dim, INIT_BIAS));
    TRY(ADD2(BLK("attn_output.weight"), q_dim, dim));
    TRY(ADD1(BLK("ffn_norm.weight"), dim, INIT_NORM));
    TRY(ADD2(BLK("ffn_gate.weight"), dim, sh->ffn_dim));
    TRY(ADD2(BLK("ffn_up.weight"), dim, sh->ffn_dim));
    TRY(ADD2(BLK("ffn_down.weight"), sh->ffn_dim, dim));
#undef BLK
  }
  TRY(ADD1("output_norm.weight", dim, INIT_NORM));
  if (!sh->tied) {
    TRY(ADD2("output.weight", dim, sh->n_vocab));
    if (p->n > 0 && strcmp(p->t[p->n - 1].name, "output.weight") == 0) {
      p->t[p->n - 1].type = classifier_type(o->type2d, p->t[p->n - 1].ne[0]);
    }
  }
#undef ADD1
#undef ADD2
#undef TRY
  return NPULM_OK;
}

uint64_t npu_synth_n_params(const struct npu_synth_shape *sh) {
  const struct npu_synth_options o = {0};
  struct plan p = {0};
  npulm_error err;
  uint64_t n = 0;
  if (make_plan(sh, &o, &p, &err) == NPULM_OK) {
    for (size_t i = 0; i < p.n; i++) n += p.t[i].ne[0] * p.t[i].ne[1];
  }
  free(p.t);
  return n;
}

/* ---- Metadata ------------------------------------------------------------------------------- */

/* llama.cpp's general.file_type (enum llama_ftype) for the majority type. */
static uint32_t file_type_of(uint32_t type2d) {
  switch (type2d) {
  case NPU_GGML_F16: return 1;   /* MOSTLY_F16 */
  case NPU_GGML_Q4_0: return 2;  /* MOSTLY_Q4_0 */
  case NPU_GGML_Q8_0: return 7;  /* MOSTLY_Q8_0 */
  case NPU_GGML_Q4_K: return 15; /* MOSTLY_Q4_K_M, as llama-quantize --pure Q4_K_M writes */
  case NPU_GGML_Q6_K: return 18; /* MOSTLY_Q6_K */
  case NPU_GGML_BF16: return 32; /* MOSTLY_BF16 */
  default: return 0;             /* ALL_F32 */
  }
}

/* The writer's add calls, less the key 'o' leaves out. */
static bool keep_key(const struct npu_synth_options *o, const char *key) {
  return o->omit_key == NULL || strcmp(o->omit_key, key) != 0;
}
static void put_str(struct npu_gguf_writer *w, const struct npu_synth_options *o, const char *key,
                    const char *v) {
  if (keep_key(o, key)) npu_gguf_writer_add_str(w, key, v);
}
static void put_u32(struct npu_gguf_writer *w, const struct npu_synth_options *o, const char *key,
                    uint32_t v) {
  if (keep_key(o, key)) npu_gguf_writer_add_u32(w, key, v);
}
static void put_f32(struct npu_gguf_writer *w, const struct npu_synth_options *o, const char *key,
                    float v) {
  if (keep_key(o, key)) npu_gguf_writer_add_f32(w, key, v);
}

/* Hyperparameters, in the order and with the keys convert_hf_to_gguf.py writes them. Failures
 * stay in the writer (npu_gguf_writer_status). */
static void add_hparams(struct npu_gguf_writer *w, const struct npu_synth_shape *sh,
                        const struct npu_synth_options *o) {
  char key[96];
  const uint32_t hd = sh->dim / sh->n_heads;
#define K(suffix) (snprintf(key, sizeof(key), "%s." suffix, sh->arch), key)
  put_str(w, o, "general.architecture", sh->arch);
  put_str(w, o, "general.type", "model");
  put_str(w, o, "general.name", sh->title);
  put_str(w, o, "general.description", "npulm synthetic model: real shapes, seeded random weights");
  put_u32(w, o, "general.alignment", 32);
  put_u32(w, o, K("block_count"), sh->n_layers);
  put_u32(w, o, K("context_length"), sh->n_ctx);
  put_u32(w, o, K("embedding_length"), sh->dim);
  put_u32(w, o, K("feed_forward_length"), sh->ffn_dim);
  put_u32(w, o, K("attention.head_count"), sh->n_heads);
  put_u32(w, o, K("attention.head_count_kv"), sh->n_kv_heads);
  put_f32(w, o, K("rope.freq_base"), sh->rope_base);
  put_f32(w, o, K("attention.layer_norm_rms_epsilon"), sh->rms_eps);
  if (sh->head_dim_key) {
    put_u32(w, o, K("attention.key_length"), hd);
    put_u32(w, o, K("attention.value_length"), hd);
  }
  put_u32(w, o, "general.file_type", file_type_of(o->type2d));
  if (strcmp(sh->arch, "llama") == 0) { /* LlamaModel adds these two; Qwen2Model does not */
    put_u32(w, o, K("vocab_size"), sh->n_vocab);
    put_u32(w, o, K("rope.dimension_count"), hd);
  }
#undef K
  put_u32(w, o, "general.quantization_version", 2);
}

/* Append the UTF-8 of U+2581 (SentencePiece's word-start mark) and 'len' bytes of 's'. */
static size_t piece(char *dst, bool word_start, const char *s, size_t len) {
  size_t n = 0;
  if (word_start) {
    memcpy(dst, "\xe2\x96\x81", 3);
    n = 3;
  }
  memcpy(dst + n, s, len);
  dst[n + len] = '\0';
  return n + len + 1;
}

/* A SentencePiece ("llama") vocabulary of 'n_vocab' unique pieces: <unk>, <s>, </s>, the 256
 * byte tokens, then "▁", single characters and lowercase strings of growing length, each alone
 * and after "▁" — every prefix of a piece is a piece, so BPE-style merging reaches them all. */
static npulm_status add_vocab(struct npu_gguf_writer *w, uint32_t n_vocab, npulm_error *err) {
  static const char singles[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
                                ".,!?'\"-:;()";
  const size_t n_singles = sizeof(singles) - 1;
  npulm_status st = NPULM_OK;
  const char **tokens = malloc((size_t)n_vocab * sizeof(*tokens));
  float *scores = malloc((size_t)n_vocab * sizeof(*scores));
  int32_t *types = malloc((size_t)n_vocab * sizeof(*types));
  /* At most 3 ("▁") + 8 letters + NUL per piece: vocabularies stay far below 26^8. */
  char *arena = malloc((size_t)n_vocab * 12);
  if (tokens == NULL || scores == NULL || types == NULL || arena == NULL) {
    st = npu_fail(err, NPULM_ERR_NOMEM, "out of memory building the vocabulary");
    goto done;
  }
  size_t used = 0, id = 0;
#define PUSH(word_start, s, len, type)                                                             \
  do {                                                                                             \
    tokens[id] = arena + used;                                                                     \
    used += piece(arena + used, (word_start), (s), (len));                                         \
    types[id] = (type);                                                                            \
    scores[id] = (type) == 1 ? -(float)(id - 259) : 0.0f;                                          \
    id++;                                                                                          \
  } while (0)
  PUSH(false, "<unk>", 5, 2);
  PUSH(false, "<s>", 3, 3);
  PUSH(false, "</s>", 4, 3);
  for (int b = 0; b < 256; b++) {
    char hex[8];
    snprintf(hex, sizeof(hex), "<0x%02X>", b);
    PUSH(false, hex, 6, 6);
  }
  if (id < n_vocab) PUSH(true, "", 0, 1);
  for (size_t i = 0; i < n_singles && id < n_vocab; i++) {
    PUSH(true, &singles[i], 1, 1);
    if (id < n_vocab) PUSH(false, &singles[i], 1, 1);
  }
  /* Lowercase strings of length 2, 3, ... in lexicographic order (an odometer over a..z). */
  for (size_t len = 2; id < n_vocab && len <= 8; len++) {
    char s[8];
    memset(s, 'a', len);
    for (;;) {
      PUSH(true, s, len, 1);
      if (id < n_vocab) PUSH(false, s, len, 1);
      if (id >= n_vocab) break;
      size_t k = len;
      while (k > 0 && s[k - 1] == 'z') s[--k] = 'a';
      if (k == 0) break;
      s[k - 1]++;
    }
  }
#undef PUSH
  npu_gguf_writer_add_str(w, "tokenizer.ggml.model", "llama");
  npu_gguf_writer_add_str(w, "tokenizer.ggml.pre", "default");
  npu_gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", tokens, id);
  npu_gguf_writer_add_arr(w, "tokenizer.ggml.scores", NPU_GGUF_F32, scores, id);
  npu_gguf_writer_add_arr(w, "tokenizer.ggml.token_type", NPU_GGUF_I32, types, id);
  npu_gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", 1);
  npu_gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", 2);
  npu_gguf_writer_add_u32(w, "tokenizer.ggml.unknown_token_id", 0);
  npu_gguf_writer_add_bool(w, "tokenizer.ggml.add_bos_token", true);
  npu_gguf_writer_add_bool(w, "tokenizer.ggml.add_eos_token", false);
  st = npu_gguf_writer_status(w, err);
done:
  free(tokens);
  free(scores);
  free(types);
  free(arena);
  return st;
}

/* ---- Weights -------------------------------------------------------------------------------- */

#define CHUNK_ELEMS 65536 /* values generated per step: a multiple of every block size */
#define PROGRESS_BYTES (8u << 20)

/* Llama 3 rope frequency factors (LlamaModel.generate_extra_tensors in convert_hf_to_gguf.py). */
static void llama3_rope_factors(const struct npu_synth_shape *sh, float *out, size_t n) {
  const double dim = 2.0 * (double)n, pi = 3.14159265358979323846;
  const double low_wavelen = sh->rope_orig_ctx / sh->rope_low_freq_factor;
  const double high_wavelen = sh->rope_orig_ctx / sh->rope_high_freq_factor;
  for (size_t i = 0; i < n; i++) {
    double freq = 1.0 / pow(sh->rope_base, (double)(2 * i) / dim);
    double wavelen = 2.0 * pi / freq;
    if (wavelen < high_wavelen) {
      out[i] = 1.0f;
    } else if (wavelen > low_wavelen) {
      out[i] = sh->rope_llama3_factor;
    } else {
      double smooth = (sh->rope_orig_ctx / wavelen - sh->rope_low_freq_factor) /
                      (sh->rope_high_freq_factor - sh->rope_low_freq_factor);
      out[i] = (float)(1.0 / ((1.0 - smooth) / sh->rope_llama3_factor + smooth));
    }
  }
}

struct progress {
  npulm_progress_fn fn;
  void *user;
  uint64_t total;
  uint64_t last;
};

static void report_progress(struct progress *pr, const struct npu_gguf_writer *w, bool force) {
  if (pr->fn == NULL) return;
  uint64_t done = npu_gguf_writer_data_written(w);
  if (force || done - pr->last >= PROGRESS_BYTES) {
    pr->fn(pr->user, done, pr->total);
    pr->last = done;
  }
}

/* Generate tensor 'index' of the plan chunk by chunk, convert it to its type and stream it. */
static npulm_status write_weights(struct npu_gguf_writer *w, const struct npu_synth_shape *sh,
                                  const struct npu_synth_options *o, const struct plan_tensor *t,
                                  size_t index, float *vals, uint8_t *bytes, struct progress *pr,
                                  npulm_error *err) {
  const struct npu_synth_tensor view = {
      .name = t->name, .n_dims = t->n_dims, .ne = {t->ne[0], t->ne[1]}, .type = t->type};
  const bool poke = o->poke_tensor != NULL && strcmp(o->poke_tensor, t->name) == 0;
  const npu_ggml_from_f32_fn quantize = npu_ggml_type_from_f32(t->type);
  uint32_t block = 1, block_bytes = 4;
  if (quantize == NULL || !npu_ggml_type_size(t->type, &block, &block_bytes)) {
    /* a type npulm does not write (tests of the reader's refusal): zero bytes */
    memset(bytes, 0, CHUNK_ELEMS * sizeof(float));
    for (uint64_t left = npu_gguf_writer_tensor_nbytes(w, index); left > 0;) {
      size_t n = left < CHUNK_ELEMS * sizeof(float) ? (size_t)left : CHUNK_ELEMS * sizeof(float);
      npulm_status st = npu_gguf_writer_write_data(w, bytes, n, err);
      if (st != NPULM_OK) return st;
      left -= n;
    }
    return NPULM_OK;
  }
  uint64_t rng = o->seed ^ (0xD1B54A32D192ED03ull * (uint64_t)(index + 1));
  splitmix64(&rng);
  const uint64_t n_elems = t->ne[0] * t->ne[1];
  const float scale = 1.0f / sqrtf((float)t->ne[0]); /* 1/sqrt(fan_in) keeps activations O(1) */
  for (uint64_t done = 0; done < n_elems;) {
    size_t n = n_elems - done < CHUNK_ELEMS ? (size_t)(n_elems - done) : CHUNK_ELEMS;
    if (o->fill != NULL) {
      o->fill(o->user, &view, done, vals, n);
    } else if (t->init == INIT_ROPE_FREQS) {
      llama3_rope_factors(sh, vals, n);
    } else {
      for (size_t i = 0; i < n; i++) {
        float r = rand_normal(&rng);
        vals[i] = t->init == INIT_MATRIX ? r * scale
                  : t->init == INIT_NORM ? 1.0f + 0.02f * r
                                         : 0.02f * r;
      }
    }
    assert(n % block == 0); /* chunks and rows are whole blocks (ne[0] % block == 0) */
    quantize(vals, bytes, n / block);
    const size_t nbytes = n / block * block_bytes;
    if (poke && o->poke_at >= done && o->poke_at < done + n) {
      size_t at = (size_t)(o->poke_at - done);
      if (t->type == NPU_GGML_F16 || t->type == NPU_GGML_BF16) {
        uint16_t bits = (uint16_t)o->poke_bits;
        memcpy(bytes + 2 * at, &bits, 2);
      } else {
        assert(t->type == NPU_GGML_F32); /* a block type's element has no bits of its own */
        memcpy(bytes + 4 * at, &o->poke_bits, 4);
      }
    }
    npulm_status st = npu_gguf_writer_write_data(w, bytes, nbytes, err);
    if (st != NPULM_OK) return st;
    done += n;
    report_progress(pr, w, false);
  }
  return NPULM_OK;
}

/* ---- Entry points -------------------------------------------------------------------------- */

npulm_status npu_synth_write(struct npu_gguf_writer *w, const struct npu_synth_shape *sh,
                             const struct npu_synth_options *o, npulm_error *err) {
  assert(sh->n_vocab >= 259 && sh->n_heads > 0 && sh->dim % sh->n_heads == 0);
  struct plan plan = {0};
  float *vals = NULL;
  uint8_t *bytes = NULL;
  npulm_status st;
  if (!o->no_tensors && (st = make_plan(sh, o, &plan, err)) != NPULM_OK) goto done;
  vals = malloc(CHUNK_ELEMS * sizeof(*vals));
  bytes = malloc(CHUNK_ELEMS * sizeof(float));
  if (vals == NULL || bytes == NULL) {
    st = npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
    goto done;
  }
  add_hparams(w, sh, o);
  if ((st = add_vocab(w, sh->n_vocab, err)) != NPULM_OK) goto done;
  for (size_t i = 0; i < plan.n; i++) {
    const struct plan_tensor *t = &plan.t[i];
    npu_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, NULL);
  }
  if ((st = npu_gguf_writer_status(w, err)) != NPULM_OK) goto done;
  struct progress pr = {
      .fn = o->progress, .user = o->progress_user, .total = npu_gguf_writer_data_size(w)};
  for (size_t i = 0; i < plan.n; i++) {
    st = write_weights(w, sh, o, &plan.t[i], i, vals, bytes, &pr, err);
    if (st != NPULM_OK) goto done;
    report_progress(&pr, w, true);
  }
  st = NPULM_OK;
done:
  free(plan.t);
  free(vals);
  free(bytes);
  return st;
}

npulm_status npulm_synth(const char *shape, uint64_t seed, const char *type, const char *path,
                         npulm_progress_fn progress, void *user, npulm_error *err) {
  const struct npu_synth_shape *sh = npu_synth_shape_find(shape);
  if (sh == NULL) {
    char names[256] = "";
    for (size_t i = 0; i < N_SHAPES; i++) {
      size_t len = strlen(names);
      snprintf(names + len, sizeof(names) - len, "%s%s", i ? ", " : "", shapes[i].name);
    }
    return npu_fail(err, NPULM_ERR_ARG, "unknown synthetic shape '%s' (known: %s)",
                    shape ? shape : "(null)", names);
  }
  /* The weight types are the ones ggml_blocks.c has a quantizer for, by their lowercase names. */
  struct npu_synth_options o = {.seed = seed, .progress = progress, .progress_user = user};
  bool known = false;
  for (uint32_t t = 0; t < 64 && type != NULL && !known; t++) { /* ggml's type ids are < 64 */
    const char *name = npu_ggml_type_name(t);
    if (name != NULL && npu_ggml_type_from_f32(t) != NULL && strcasecmp(name, type) == 0) {
      o.type2d = t;
      known = true;
    }
  }
  if (!known) {
    char names[160];
    npu_ggml_writable_types(names, sizeof(names));
    for (char *c = names; *c != '\0'; c++) *c = (char)tolower((unsigned char)*c);
    return npu_fail(err, NPULM_ERR_ARG, "unknown weight type '%s' (known: %s)",
                    type ? type : "(null)", names);
  }

  /* Rows are dim (and heads * head_dim = dim) or ffn_dim long; block types need whole blocks. */
  uint32_t block, block_bytes;
  npu_ggml_type_size(o.type2d, &block, &block_bytes);
  if (sh->dim % block != 0 || sh->ffn_dim % block != 0) {
    return npu_fail(err, NPULM_ERR_ARG,
                    "weight type '%s' packs %u values a block: shape '%s' has rows of %u and %u",
                    type, block, sh->name, sh->dim, sh->ffn_dim);
  }
  if (path == NULL || path[0] == '\0') return npu_fail(err, NPULM_ERR_ARG, "no output path");

  struct npu_gguf_writer *w = NULL;
  npulm_status st;
  if ((st = npu_gguf_writer_open_file(path, &w, err)) == NPULM_OK &&
      (st = npu_synth_write(w, sh, &o, err)) == NPULM_OK) {
    st = npu_gguf_writer_finish(w, err);
  }
  npu_gguf_writer_free(w); /* removes the file unless finished */
  return st;
}
