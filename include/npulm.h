/* npulm — run llama-family language models the way a mobile NPU must run them.
 * This is the public C API of what an application embeds (models, compiling, sessions, sampling,
 * chat, perplexity, diff, export, serving); the measurement machinery (synthetic models, the
 * roofline, the NPU cost model) is in npulm_bench.h. The CLI uses only these two headers.
 *
 * Threads. The library keeps no global state, so calls on different objects may run on any
 * threads at once. An open model is read-only to every call that takes a 'const npulm_model *':
 * any number of threads may use one model at the same time — create sessions of it, run them,
 * tokenize, describe it, measure its perplexity. Only npulm_model_compile and npulm_model_close
 * change a model: each needs it to itself (no other call on it in progress, no session of it
 * alive). A session, like a sampler, is used by one thread at a time: calls on it must not
 * overlap, but they may come from different threads in turn (ordered by a join, a mutex, ...).
 * Sessions, perplexity and the roofline start threads of their own (a session's run until
 * npulm_session_free, the others' end before they return); progress callbacks run on the calling
 * thread. Calls that take no object (npulm_version, npulm_compile_file, npulm_synth, ...) may
 * run on any threads at once too; calls that overlap each need their own npulm_error.
 * tests/test_threads.c checks this under ThreadSanitizer (make TSAN=1 test). */
#ifndef NPULM_H
#define NPULM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The library's version. A release that changes the ABI changes MAJOR, the shared library's
 * soname (libnpulm.so.MAJOR); NPULM_VERSION is the three numbers, as the Makefile and npulm.pc
 * read them. */
#define NPULM_VERSION_MAJOR 0
#define NPULM_VERSION_MINOR 9
#define NPULM_VERSION_PATCH 0
#define NPULM_VERSION "0.9.0"

/* The version of the library linked (which may be newer than the header a program was built
 * with) and the git commit it was built from: "0.9.0 (COMMIT)", COMMIT as `git describe --always
 * --dirty` names it, "unknown" if built outside a git checkout. */
const char *npulm_version(void);

/* Every fallible call returns a status; on failure the optional 'err' holds one line naming the
 * problem (no trailing newline). */
typedef enum npulm_status {
  NPULM_OK = 0,
  NPULM_ERR_IO,          /* a file could not be opened, mapped, read or written */
  NPULM_ERR_FORMAT,      /* a file is malformed, truncated or inconsistent */
  NPULM_ERR_UNSUPPORTED, /* well-formed, but npulm does not handle it (tensor type, architecture) */
  NPULM_ERR_ARG,         /* a bad argument: unknown name, prompt longer than the context, ... */
  NPULM_ERR_NOMEM,       /* an allocation failed */
} npulm_status;

#define NPULM_ERROR_MAX 512
typedef struct npulm_error {
  char msg[NPULM_ERROR_MAX];
} npulm_error;

/* Short name of a status ("ok", "I/O error", ...). */
const char *npulm_status_name(npulm_status status);

/* Progress of long work: 'done' of 'total' units (bytes, tokens, ...). */
typedef void (*npulm_progress_fn)(void *user, uint64_t done, uint64_t total);

/* Progress of long work in phases: 'done' of 'total' 'unit's of phase 'phase' (a compile's
 * "load", "graphs", "quantize" in blocks (each calibrated, quantized and packed before the next),
 * "write" in bytes). A phase's calls come together, the first
 * with done == 0 and the last with done == total. */
typedef void (*npulm_phase_progress_fn)(void *user, const char *phase, const char *unit,
                                        uint64_t done, uint64_t total);

/* ---- Models ------------------------------------------------------------------------------- */

typedef struct npulm_model npulm_model;

typedef struct npulm_model_info {
  const char *arch; /* "llama" or "qwen2" */
  const char *name; /* general.name, or "" */
  int n_vocab;
  int dim; /* embedding width */
  int n_layers;
  int n_heads;
  int n_kv_heads;
  int head_dim;
  int ffn_dim;
  int n_ctx_train; /* context length the model was trained for */
  float rope_base;
  float rms_eps;
  bool tied_output; /* output projection shares the token embedding */
  int32_t bos_id;   /* -1 if none */
  int32_t eos_id;   /* -1 if none */
  bool add_bos;     /* the tokenizer wants BOS at the start of a text */
  uint64_t n_params;
} npulm_model_info;

/* Open a GGUF model (llama or qwen2 architecture) or a program file. The file is mapped and
 * checked (a weight that is NaN or infinite is NPULM_ERR_FORMAT, naming its tensor; a program
 * file's checksums must hold for every byte, else NPULM_ERR_FORMAT names the damaged part);
 * weights that are not F32 are dequantized once. Return NPULM_OK and '*model_out', or an error.
 * The model is then immutable (until npulm_model_compile) and may be shared by threads. */
npulm_status npulm_model_open(const char *path, npulm_model **model_out, npulm_error *err);
/* Opening a program file whose weights need not fit in memory. */
typedef struct npulm_open_params {
  /* Bytes of weights to hold in memory (0: no budget, everything in memory). Needs a program file
   * compiled with a sparsity: the weights stay in the file and are read as steps need them. The
   * weights every decode step reads whole (attention, norms, classifier, predictors) stay in
   * memory, smallest first, within 90 % of the budget; the others, and the FFN's dense weights
   * (prefill's), are read from the file at each use and let go of after; the rest of the budget
   * is the neuron cache of sparse decode: the gate rows and up/down pairs that calibration says
   * decode uses most per byte, a window of recently kept pairs and a scratch, the others read
   * by I/O threads while the step computes the neurons it has (docs/sparse.md). KV cache and
   * arenas come on top. The budget is each session's (each has its neuron cache): a program's
   * sessions share its mapping. */
  uint64_t mem_budget;
  /* Under a budget the neurons are read with O_DIRECT where the file system allows it, bypassing
   * the page cache: every byte from storage and none charged to the page cache, in requests
   * that read through the rows between close misses. This asks for buffered reads of just the
   * rows missed instead, dropped from the page cache after; on the machine of bench/RESULTS.md
   * most of those came from the page cache all the same (its readahead, outside the budget). */
  bool buffered_io;
  /* Drop the file from the page cache when opened (and pages as they are checked), so that the
   * reads a run makes come from storage: a cold start. */
  bool cold;
} npulm_open_params;

npulm_status npulm_model_open_params(const char *path, const npulm_open_params *params,
                                     npulm_model **model_out, npulm_error *err);

/* Open only the tokenizer of a GGUF file: a model, a program file, or a vocabulary-only file such
 * as llama.cpp's ggml-vocab-*.gguf (any architecture; npulm_model_open refuses one, as it has no
 * tensors). No weight is read. The model serves the tokenizer calls, npulm_model_get_info (the
 * vocabulary's fields and name; arch "" and the shape 0) and npulm_model_close; compiling it or
 * creating a session on it is NPULM_ERR_ARG. */
npulm_status npulm_model_open_vocab(const char *path, npulm_model **model_out, npulm_error *err);
/* Accepts NULL. No other call on the model may be in progress, nor any session of it alive. */
void npulm_model_close(npulm_model *model);
void npulm_model_get_info(const npulm_model *model, npulm_model_info *info_out);

/* ---- Compilation: static graphs for the NPU ---------------------------------------------- */

#define NPULM_MAX_CHUNKS 8
#define NPULM_MAX_BUCKETS 32

/* npulm_compile_params.smooth_alpha: SmoothQuant's alpha chosen per block and matmul input. */
#define NPULM_SMOOTH_ALPHA_AUTO (-1.0f)

typedef struct npulm_compile_params {
  int chunks[NPULM_MAX_CHUNKS]; /* prefill chunk sizes; n_chunks = 0: 16, 64 and 128, less
                                   those longer than the model's context */
  int n_chunks;
  int buckets[NPULM_MAX_BUCKETS]; /* context buckets; n_buckets = 0: powers of two from 128 up to
                                     the model's context (always included) */
  int n_buckets;
  /* How the NPU computes: "PRECISION-OUTLIERS", PRECISION one of w8a8, w8a16, w4a16,
   * w4a16-block, w4a8 (int8 or int4 weights, per output channel or in blocks of 32 along k with
   * integer block scales; int8 asymmetric or int16 symmetric activations per tensor; the
   * classifier keeps int8 weights), OUTLIERS one of smooth, shadow, naive (a precision alone is
   * naive): "w8a8-smooth" (NULL: the default), "w4a16-block", "w8a16-shadow", ...; or "f32" (no
   * quantization: the static graphs compute in FP32). */
  const char *quant;
  /* Ops the precision policy keeps in float on the CPU: a comma list of softmax, qk, pv (NULL:
   * all three; "" or "none": none). */
  const char *float_ops;
  const char *calib_text; /* calibration text (NULL: a built-in text) */
  size_t calib_len;
  int calib_tokens; /* use at most this many tokens of it (0: 1024) */
  /* SmoothQuant strength: in (0, 1) one alpha for every matmul input (0: 0.5);
   * NPULM_SMOOTH_ALPHA_AUTO: chosen for each block and matmul input (those of q/k/v, gate/up,
   * down, the output projection) as the one of least predicted int8 error, no smoothing among
   * the candidates (it helps stories27M, not the two small models: bench/ACCURACY.md) */
  float smooth_alpha;
  float shadow_threshold; /* outlier channel: absmax > this x the median channel's (0: 6) */
  /* A program file saved from an integer program holds, besides the NPU's int8 data, only the
   * float weights the CPU reads: it cannot run the reference forward nor be compiled again (the
   * GGUF model can). true: it holds every float weight as well, as FP32 programs always do. */
  bool keep_float;
  npulm_phase_progress_fn progress; /* progress by phase (may be NULL) */
  void *progress_user;
  int n_threads; /* threads of the calibration (0: one per online CPU) */
  /* Sparse decode: the share in [0, 1) of what sparse_form skips (0: none, dense decode).
   * NPULM_SPARSE_FORM_INPUT: of each sparsified matmul's input channels, those of least
   * magnitude on the calibration text; NPULM_SPARSITY_AUTO: the largest of 0.5, 0.4, 0.25, 0.1
   * whose decode perplexity on the calibration text is within 1 % of dense.
   * NPULM_SPARSE_FORM_NEURON: of each layer's FFN neurons, those of least |SiLU(gate)| on the
   * calibration text; auto: the largest of 0.7, 0.5, 0.3, 0.15 within 1 %. Adds each neuron's
   * weights as a bundle and a predictor per layer to the program. */
  float sparsity;
  int sparse_rank; /* the predictors' rank, in every layer (0: dim / 8, rounded up to a multiple
                      of 16, and no predictor in a layer where it would read more bytes than the
                      gate rows it spares) */
  /* the share of the kept neurons' calibration |SiLU(gate)| the predictor's candidates must
   * cover, in (0, 1] (0: 0.998): higher keeps perplexity nearer the exact gate's, lower skips
   * more gate rows */
  float sparse_recall;
  /* What --sparsity skips: NPULM_SPARSE_FORM_INPUT (0): the input channels of every decode
   * matmul but the classifier (TEAL), by magnitude thresholds on their integer inputs, the same
   * share of each matmul's channels, any integer mode; NPULM_SPARSE_FORM_NEURON: FFN neurons,
   * with predictors (w8a8-naive or -smooth; what --mem-budget's neuron cache reads) */
  int sparse_form;
} npulm_compile_params;

#define NPULM_SPARSE_FORM_INPUT 0
#define NPULM_SPARSE_FORM_NEURON 1

#define NPULM_SPARSITY_AUTO (-1.0f)

npulm_compile_params npulm_compile_default_params(void);

/* Compile the model into static graphs, one per specialization (decode and each prefill chunk
 * size, times each context bucket), partitioned between NPU and CPU and memory-planned. Replaces
 * any program the model carries. A model opened from a program file already carries one.
 * Changes the model: no other call on it may be in progress, nor any session of it alive (a
 * session runs the program it was created with, which this frees). */
npulm_status npulm_model_compile(npulm_model *model, const npulm_compile_params *params,
                                 npulm_error *err);
bool npulm_model_has_program(const npulm_model *model);

/* Whether a command reading the model file at 'model_path' may write 'out_path', said before the
 * work: NPULM_ERR_ARG for an empty path, a directory, or the model's own file (by device and
 * inode, whatever names them: the write would replace the model), NPULM_ERR_IO for a directory
 * that does not exist or cannot be written in. npulm_compile_file and npulm_model_export_onnx
 * check each file they write so (the export: its model, encodings and data file). */
npulm_status npulm_check_output(const char *model_path, const char *out_path, npulm_error *err);

/* Compile the model file at 'model_path' (GGUF) into the program file 'out_path', as
 * npulm_model_open, npulm_model_compile and npulm_model_save_program would (the same file, byte for
 * byte), but reading the model a block at a time: an integer program compiled without keep_float
 * needs about one block's float weights in memory, whatever the model's size, its packed weights
 * going to a scratch file beside 'out_path' (removed whatever happens) until they are written.
 * Other programs (FP32, keep_float, a program file as input) are compiled in memory. The phases
 * of 'params->progress' include "load" (opening the model) and "write". */
npulm_status npulm_compile_file(const char *model_path, const char *out_path,
                                const npulm_compile_params *params, npulm_error *err);

/* Write the model with its program as one program file (.npu), which npulm_model_open reads
 * back. The file is written whole or not at all: until it is complete, synced and renamed into
 * place, 'path' keeps its old contents, and a failure (a full disk, a killed process) leaves no
 * partial or temporary file (but for a kill between naming the complete temporary and renaming
 * it, which leaves a complete "PATH.tmp.PID.N": the next write of 'path' removes it). Every byte of
 * it is covered by a checksum that npulm_model_open checks. NPULM_ERR_ARG if 'path' is the file the
 * model was opened from. 'progress' (may be NULL) is called as weight bytes are written. */
npulm_status npulm_model_save_program(const npulm_model *model, const char *path,
                                      void (*progress)(void *user, uint64_t done, uint64_t total),
                                      void *user, npulm_error *err);

/* Check the program file at 'path' whole, for people: first every checksum (the header's and each
 * tensor's, together every byte of the file), printing one line to 'out' for each damaged part
 * (the header, or a tensor by name, with its bytes); then, if none is, everything
 * npulm_model_open checks (graphs, quantization, plan). Ends with a summary line. NPULM_OK if the
 * file is sound; otherwise the status of the problem found, '*err' summarizing it. */
npulm_status npulm_program_verify_file(const char *path, FILE *out, npulm_error *err);

/* Describe the model's program for people: specializations, per-op placement with counts, the
 * CPU fallbacks with their reasons, arena sizes, KV cache size and weights size. */
npulm_status npulm_model_print_program(const npulm_model *model, FILE *out, npulm_error *err);

/* ---- Tokenizer ---------------------------------------------------------------------------- */

/* Encode 'len' bytes of UTF-8 'text'. BOS is prepended when 'add_bos'; special-token text such as
 * "<s>" is matched as the special token when 'parse_special'. Writes at most 'cap' ids and sets
 * '*n_out' to the number the text needs: if that exceeds 'cap', returns NPULM_ERR_ARG. */
npulm_status npulm_tokenize(const npulm_model *model, const char *text, size_t len, bool add_bos,
                            bool parse_special, int32_t *ids, size_t cap, size_t *n_out,
                            npulm_error *err);

/* The vocabulary string of token 'id' as stored in the model (e.g. "▁the", "Ġthe", "<0x0A>"),
 * or NULL if 'id' is out of range. */
const char *npulm_token_text(const npulm_model *model, int32_t id);

/* Decode one token to the bytes it stands for, given the previous token ('prev' = -1 at the
 * start of a text, which drops SentencePiece's leading space). Special tokens such as BOS decode
 * to nothing. Writes at most 'cap' bytes; returns the number of bytes the piece has. A byte-level
 * token may be part of a multi-byte UTF-8 character: concatenated pieces form exact UTF-8. */
size_t npulm_token_to_piece(const npulm_model *model, int32_t prev, int32_t id, char *buf,
                            size_t cap);

/* True for tokens that end generation (EOS, end-of-turn, ...). */
bool npulm_token_is_eog(const npulm_model *model, int32_t id);

/* ---- Chat templates ----------------------------------------------------------------------- */

typedef struct npulm_chat_message {
  const char *role;    /* "system", "user" or "assistant" */
  const char *content; /* UTF-8 */
} npulm_chat_message;

/* The chat template names npulm knows, NULL-terminated (llama.cpp's names: "chatml", "llama2",
 * "llama3", "mistral-v1", "mistral-v3", "mistral-v7", "gemma", "phi3", "zephyr", ...). */
const char *const *npulm_chat_templates(void);

/* The template the model's tokenizer.chat_template names or matches, as llama.cpp detects them;
 * "chatml" (the stated default) when the model has none or it is not recognized. */
const char *npulm_model_chat_template(const npulm_model *model);

/* Format 'n' messages with template 'name' (NULL: the model's, npulm_model_chat_template; 'model'
 * may be NULL when 'name' is given), ending with the opening of the assistant's turn when
 * 'add_assistant' (templates that have one), byte for byte as llama.cpp's built-in templates
 * (llm_chat_apply_template). Writes at most 'cap' bytes and a NUL and sets '*len_out' to the
 * length the text needs (without the NUL): if that is >= cap, NPULM_ERR_ARG and the caller
 * retries with more room. NPULM_ERR_ARG for an unknown template or role. */
npulm_status npulm_chat_apply(const npulm_model *model, const char *name,
                              const npulm_chat_message *msgs, size_t n, bool add_assistant,
                              char *buf, size_t cap, size_t *len_out, npulm_error *err);

/* ---- Sessions: evaluate tokens over a KV cache -------------------------------------------- */

typedef struct npulm_session npulm_session;

typedef struct npulm_session_params {
  int n_ctx;      /* context length (KV cache size); 0 = the model's, at most 4096 */
  int n_threads;  /* threads the NPU's matmuls are cut across: the NPU worker, the CPU worker
                   * (the thread calling npulm_session_eval) while it waits, and n_threads - 2
                   * more; 0 = one per online CPU */
  bool reference; /* run the FP32 reference forward instead of the compiled graphs (the oracle) */
  bool profile;   /* time every node by operator (npulm_session_profile): a clock read per node */
  /* Decode of a program compiled with a sparsity (npulm_compile_params.sparsity): */
  int sparse;        /* NPULM_SPARSE_PREDICT (0): the predictor picks each step's FFN neurons;
                        NPULM_SPARSE_OFF: dense; NPULM_SPARSE_EXACT: the thresholds on every
                        neuron's exact gate (the bound a predictor is judged against) */
  bool sparse_audit; /* measure the predictor's recall on every step (slower: npulm_sparse_stats) */
} npulm_session_params;

#define NPULM_SPARSE_PREDICT 0
#define NPULM_SPARSE_OFF 1
#define NPULM_SPARSE_EXACT 2
/* A session runs the model's program (npulm_model_compile, or the one a program file carries).
 * On a model without one it compiles FP32 static graphs of its own: calibrating for the integer
 * NPU needs text and time, so it is never done implicitly; the model is not changed. A session
 * is used by one thread at a time; sessions of one model may run at once on different threads. */

/* Where a session's time went (compiled engine; zeros for the reference). */
typedef struct npulm_session_stats {
  uint64_t n_steps;     /* graph executions */
  double wall_s;        /* time inside npulm_session_eval */
  double npu_busy_s;    /* time the NPU worker spent executing subgraphs */
  double cpu_busy_s;    /* time the CPU worker spent executing subgraphs */
  double overlap_s;     /* time both workers were busy at once */
  uint64_t n_transfers; /* tensors copied between the backends */
} npulm_session_stats;

void npulm_session_get_stats(const npulm_session *session, npulm_session_stats *stats_out);

/* Sparse decode since the session was created or its statistics cleared (zeros when decode is
 * dense). */
typedef struct npulm_sparse_stats {
  uint64_t layer_steps; /* FFNs run sparse (layers x decode steps) */
  double kept;          /* share of their neurons computed */
  double candidates;    /* share the predictor picked (every neuron for NPULM_SPARSE_EXACT) */
  double recall;        /* |SiLU(gate)| mass of the kept over that of the neurons the thresholds
                           keep on the exact gate (params.sparse_audit; else NaN) */
  double predict_s;     /* time in the predictors */
  double ffn_s;         /* time in the rest of the sparse FFNs */
  /* input-sparse decode (npulm_compile_params.sparse_form NPULM_SPARSE_FORM_INPUT; else 0 and
   * NaN): */
  uint64_t input_steps; /* matmul groups run input-sparse (layers x 4 x decode steps) */
  double input_kept;    /* share of their input channels read */
  double bytes_share;   /* weight bytes every decode matmul read (the dense ones, the classifier
                           among them, too) over what dense decode reads */
  double select_s;      /* time thresholding the matmul inputs */
  double gemv_s;        /* time in the input-sparse GEMVs */
  uint64_t input_bytes; /* memory of the channel-major weights the sparse GEMVs read */
} npulm_sparse_stats;

void npulm_session_sparse_stats(const npulm_session *session, npulm_sparse_stats *stats_out);
/* Whether the session's decode steps run sparse: its program was compiled with a sparsity and
 * its params.sparse is not NPULM_SPARSE_OFF. */
bool npulm_session_is_sparse(const npulm_session *session);

/* Where a session's weights are under a memory budget (npulm_open_params.mem_budget; zeros
 * without one), and what it read from storage since created or cleared. */
typedef struct npulm_memory_stats {
  uint64_t budget;
  uint64_t pinned_bytes;   /* weights held in memory (and read every step) */
  uint64_t streamed_bytes; /* weights read from the file at each use */
  uint64_t hot_bytes;      /* neuron cache: gate rows and hot up/down pairs, pinned */
  uint64_t cache_bytes;    /* neuron cache: the window of recently kept neurons' pairs */
  uint64_t scratch_bytes;  /* neuron cache: a step's misses that the window did not take */
  uint64_t bytes_read;     /* neuron weights read from the file */
  uint64_t bytes_used;     /* neuron weights decode used (candidates' gate rows, the kept's up
                              rows and down columns); 1 - bytes_read / bytes_used of them came
                              from memory */
  uint64_t storage_bytes;  /* bytes the neuron reads moved: bytes_read, widened to whole 4 KiB
                              blocks, a pair's two parts in one read through the rows between */
  uint64_t streamed_read;  /* bytes of streamed weights used (read from the file as used) */
  uint64_t hits, misses;   /* neuron cache lookups of the candidates' gate rows */
  uint64_t kept_hits, kept_misses; /* and of the kept neurons' up rows and down columns */
  bool direct_io;   /* neuron reads bypass the page cache (O_DIRECT), else buffered and dropped
                       from it after */
  double read_s;    /* time the I/O threads were reading (from a get's reads posted to their end) */
  double io_wait_s; /* time decode waited for it */
} npulm_memory_stats;

void npulm_session_memory_stats(const npulm_session *session, npulm_memory_stats *stats_out);
/* Clear the sparse and the memory statistics. */
void npulm_session_sparse_stats_clear(npulm_session *session);

/* Where node time went, by operator and backend (a session created with params.profile; none
 * otherwise, nor for the reference). The two workers' times add up, so with overlap the sum of
 * 'seconds' can exceed the wall time. */
typedef struct npulm_profile_entry {
  const char *op;        /* "matmul", "attn", "rmsnorm", "transfer", ... */
  const char *backend;   /* "NPU" or "CPU" */
  uint64_t calls;        /* nodes run */
  double seconds;        /* wall time inside them */
  uint64_t macs;         /* multiply-accumulates: weight matmuls (padded rows included) and
                            attention (the keys each real row attends to); 0 for other ops */
  uint64_t weight_bytes; /* weight bytes the matmuls read (packed int8 on the integer NPU) */
} npulm_profile_entry;

/* Write up to 'cap' entries, the most time first, one per operator and backend that ran since
 * the session was created or its profile cleared; return how many there are. */
int npulm_session_profile(const npulm_session *session, npulm_profile_entry *out, int cap);

/* Start the profile again from zero (as between a warmup and the measured runs). */
void npulm_session_profile_clear(npulm_session *session);

npulm_session_params npulm_session_default_params(void);

/* Any number of threads may create sessions of one model at the same time. The session's worker
 * threads run until npulm_session_free. */
npulm_status npulm_session_create(const npulm_model *model, const npulm_session_params *params,
                                  npulm_session **session_out, npulm_error *err);
void npulm_session_free(npulm_session *session); /* accepts NULL */

/* Forget every token evaluated so far. */
void npulm_session_reset(npulm_session *session);

/* Number of tokens in the KV cache, and its capacity. */
int npulm_session_pos(const npulm_session *session);
int npulm_session_ctx(const npulm_session *session);

/* Evaluate 'n' tokens at the next positions. If 'logits_out' is not NULL it receives n * n_vocab
 * logits, row i for token i. Returns NPULM_ERR_ARG (and evaluates nothing) if the tokens do not
 * fit in the remaining context or an id is out of range. Returns NPULM_ERR_IO if the model's file
 * has been written since it was opened (its weights are read from it as steps need them: mapped,
 * or under a memory budget streamed and read by the neuron cache): looked at after each step,
 * whose logits are then not to be trusted; a file replaced by a rename is another file, and the
 * session keeps reading the one it opened. */
npulm_status npulm_session_eval(npulm_session *session, const int32_t *tokens, size_t n,
                                float *logits_out, npulm_error *err);

/* Evaluate 'n' tokens of several sessions as one step (continuous batching, as a server runs its
 * requests: each running request's next token, and pieces of new requests' prompts): token r goes
 * to session sessions[r], a session's tokens taking its next positions in the order they come.
 * The step is one static graph, the program's smallest prefill chunk size that holds n (compile
 * with npulm_compile_params.chunks holding the batch sizes: 2, 4, 8, ...; rows past n are padding,
 * computed and not written anywhere), so the weights are read once for all of them; each row has
 * its session's position, KV cache and attention. Each session's npulm_session_logits then holds
 * the logits of its last token in the step, bit for bit those npulm_session_eval of its tokens
 * alone would give, and its position advances by its number of tokens. The step runs on
 * sessions[0]'s threads (its statistics count it). The sessions must be of one model and program
 * (not the reference), with one context length; a batch of several sessions runs its FFNs dense,
 * also for sessions that decode sparse (npulm_session_is_sparse: their one-row steps alone are
 * sparse, so a token batched with others may differ from the one npulm_session_eval gives); their
 * program must keep attention in float (the default policy). No other call
 * may be in progress on any of them. NPULM_ERR_ARG (nothing evaluated) otherwise, for a token
 * outside the vocabulary or a session whose tokens do not fit its context; NPULM_ERR_UNSUPPORTED
 * if the program has no chunk size of at least n (or no graph of it for the step's positions) or
 * computes attention on the NPU. Tokens all of one session, past those checks, are
 * npulm_session_eval of them. */
npulm_status npulm_session_eval_batch(npulm_session *const *sessions, const int32_t *tokens,
                                      size_t n, npulm_error *err);

/* Logits of the last evaluated token (n_vocab floats), valid until the next eval or reset. */
const float *npulm_session_logits(const npulm_session *session);

/* ---- Sampling ----------------------------------------------------------------------------- */

typedef struct npulm_sampler npulm_sampler;

typedef struct npulm_sampler_params {
  float temp;  /* 0 = greedy (argmax) */
  int top_k;   /* 0 = off */
  float top_p; /* 1 = off */
  uint64_t seed;
} npulm_sampler_params;

npulm_sampler_params npulm_sampler_default_params(void);
npulm_status npulm_sampler_create(const npulm_sampler_params *params, int n_vocab,
                                  npulm_sampler **sampler_out, npulm_error *err);
void npulm_sampler_free(npulm_sampler *sampler); /* accepts NULL */
/* Pick a token from 'logits' (n_vocab floats). Deterministic for a given seed. A sampler is used
 * by one thread at a time. */
int32_t npulm_sampler_sample(npulm_sampler *sampler, const float *logits);

/* ---- Perplexity (llama.cpp's llama-perplexity method) ------------------------------------- */

typedef struct npulm_ppl_result {
  double ppl;        /* exp(mean negative log-likelihood) */
  double ppl_stderr; /* standard error of 'ppl' (as llama-perplexity reports it) */
  int n_chunks;
  int n_ctx;
  uint64_t n_scored; /* tokens whose likelihood was counted */
  double seconds;
} npulm_ppl_result;

/* Called after each chunk with the running estimate. */
typedef void (*npulm_ppl_progress_fn)(void *user, int chunks_done, int n_chunks,
                                      double running_ppl);

/* Tokenize 'text' (with BOS), split it into non-overlapping windows of 'n_ctx' tokens whose first
 * token is replaced by BOS, and score the second half of every window, on 'n_threads' threads of
 * its own, each with a session of the model (of one thread). */
npulm_status npulm_perplexity(const npulm_model *model, const char *text, size_t len, int n_ctx,
                              int n_threads, npulm_ppl_progress_fn progress, void *user,
                              npulm_ppl_result *result_out, npulm_error *err);
/* The same with every token of a window evaluated alone, as a decode step, in sessions made with
 * 'session' (its n_ctx and n_threads are set per worker; its sparse mode and audit are used):
 * the perplexity that decode, dense or sparse, gives. 'sparse_out' (may be NULL) receives the
 * sessions' sparse statistics together (shares weighted by steps). */
npulm_status npulm_perplexity_decode(const npulm_model *model, const char *text, size_t len,
                                     int n_ctx, int n_threads, const npulm_session_params *session,
                                     npulm_ppl_progress_fn progress, void *user,
                                     npulm_ppl_result *result_out, npulm_sparse_stats *sparse_out,
                                     npulm_error *err);
/* The same on the FP32 reference forward instead of the compiled graphs (the oracle). */
npulm_status npulm_perplexity_reference(const npulm_model *model, const char *text, size_t len,
                                        int n_ctx, int n_threads, npulm_ppl_progress_fn progress,
                                        void *user, npulm_ppl_result *result_out, npulm_error *err);

/* ---- Error attribution: compiled model against the FP32 reference ------------------------ */

typedef struct npulm_diff_entry {
  char name[48];       /* activation, e.g. "blk.3.ffn_down" */
  const char *op;      /* the op that writes it: "matmul", "add", ... */
  const char *backend; /* "NPU" or "CPU" */
  const char *dtype;   /* how it is stored: "f32", "i8", "i16" */
  int layer;           /* -1 outside the blocks */
  double sqnr_db;      /* 10 log10(sum ref^2 / sum (x - ref)^2); infinity when exact */
  double max_abs_err;
  uint64_t n_values;
} npulm_diff_entry;

typedef struct npulm_diff_report {
  const char *quant; /* how the compared program computes: "w8a8-smooth", ..., or "f32" */
  int n_tokens;
  int n_entries;
  npulm_diff_entry *entries; /* in data-flow order */
  double kl_mean;            /* KL(reference || compiled) of the next-token distributions */
  double kl_max;
  double top1_agreement; /* share of positions whose argmax agrees */
} npulm_diff_report;

/* Run the FP32 reference and the model's program (compiled with the defaults if it has none)
 * side by side over 'text' (tokenized with BOS, at most the session context), one token at a time,
 * and compare every named activation and the final logits. */
npulm_status npulm_diff(const npulm_model *model, const char *text, size_t len,
                        npulm_diff_report **report_out, npulm_error *err);
void npulm_diff_free(npulm_diff_report *report); /* accepts NULL */

/* ---- Export to the vendors' flow: ONNX with QDQ, and AIMET-style encodings ---------------- */

typedef struct npulm_export_params {
  int rows; /* the specialization: 1 (or 0) decode, else the prefill chunk of this many rows */
  int ctx;  /* its context bucket (0: the program's largest) */
  bool external_data; /* the weights in '<path>.data' beside the model (always past 2 GiB) */
  npulm_progress_fn progress; /* called as weight bytes are written (may be NULL) */
  void *progress_user;
} npulm_export_params;

npulm_export_params npulm_export_default_params(void);

typedef struct npulm_export_info {
  int rows, ctx;
  int n_nodes; /* ONNX nodes */
  int n_qdq;   /* QuantizeLinear/DequantizeLinear pairs on activations and DequantizeLinear on
                  weights and biases */
  bool external_data;
  char encodings_path[4096];
} npulm_export_info;

/* Write one specialization of the model's program (a graph that computes every row's logits) as
 * a self-contained ONNX model (opset 17; int16 QDQ in the com.microsoft domain) at 'path', with
 * QuantizeLinear/DequantizeLinear wherever the program's NPU quantizes, carrying its scales and
 * zero points (weights per output channel), and float ops where it keeps float; and beside it
 * the encodings in AIMET's 0.6.1 format (npulm_export_encodings_path). Inputs: input_ids and
 * position_ids int32 [1, rows], attention_mask float [1, 1, rows, ctx] (additive; columns
 * 0 .. ctx-rows-1 are the past slots, the rest this step's rows), past_key_<L> and
 * past_value_<L> float [1, ctx - rows, kv_dim] (none if ctx == rows); outputs logits float
 * [1, rows, n_vocab] and present_key_<L>, present_value_<L> float [1, rows, kv_dim] (this step's
 * cache rows). Each file is written whole or not at all. NPULM_ERR_ARG if the program lacks the
 * specialization (the message lists those it has); NPULM_ERR_UNSUPPORTED for what has no ONNX
 * form here (partial RoPE). '*info_out' may be
 * NULL. */
npulm_status npulm_model_export_onnx(const npulm_model *model, const char *path,
                                     const npulm_export_params *params, npulm_export_info *info_out,
                                     npulm_error *err);

/* The encodings file of 'onnx_path': its name less ".onnx", plus ".encodings.json". */
void npulm_export_encodings_path(const char *onnx_path, char *buf, size_t cap);
/* The external data file of 'onnx_path' (params.external_data, or past 2 GiB): 'onnx_path' plus
 * ".data". */
void npulm_export_data_path(const char *onnx_path, char *buf, size_t cap);

/* ---- Serving -------------------------------------------------------------------------------- */

/* Rows of the largest step of the model's program: its largest prefill chunk (what llama.cpp
 * calls n_ubatch); 0 if the model has no program. */
int npulm_program_max_rows(const npulm_model *model);

/* The length of the well-formed UTF-8 sequence at 's' (of 'n' bytes): 1 to 4, or 0 where it is
 * invalid, cut short, overlong, a surrogate or past U+10FFFF (what a JSON string cannot hold).
 * Generated text is bytes, not characters: a token may end inside a character. */
size_t npulm_utf8_sequence(const char *s, size_t n);

#ifdef __cplusplus
}
#endif

#endif /* NPULM_H */
