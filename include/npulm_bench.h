/* npulm's measurement API: synthetic models of real shapes, this host's roofline (compute and
 * bandwidth ceilings, and repetitions paired with the ceiling measured around each), public NPU
 * parts and the cost model that predicts a program's speed on them. What `npulm bench` and
 * `npulm synth` are made of; an application that only runs models needs npulm.h alone. The
 * threads paragraph of npulm.h holds for these calls too. */
#ifndef NPULM_BENCH_H
#define NPULM_BENCH_H

#include "npulm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Synthetic models of real shapes, for speed work -------------------------------------- */

/* Names of the shapes 'npulm_synth' knows, NULL-terminated. */
const char *const *npulm_synth_shapes(void);

/* Write a GGUF with the tensor shapes and metadata of 'shape', seeded random weights of realistic
 * scale and a synthetic SentencePiece tokenizer. 'type' is the matrices' type: "f32", "f16",
 * "bf16", "q4_0", "q8_0", "q4_k" or "q6_k" (any case), quantized as llama-quantize does; norms stay
 * F32, and "q4_0" is its Q4_0 mix (the classifier in Q6_K, or Q8_0 where its rows are not whole
 * 256-value blocks). The K types need shapes whose rows are whole 256-value blocks. Another type,
 * or a K type on another shape, is NPULM_ERR_ARG, its message naming the accepted types or the row
 * length. The weights are made and written in chunks: memory use does not grow with the shape.
 * 'progress' (may be NULL) is called as tensor data is written. */
npulm_status npulm_synth(const char *shape, uint64_t seed, const char *type, const char *path,
                         npulm_progress_fn progress, void *user, npulm_error *err);

/* ---- Speed: the host's roofline, and the NPU cost model ------------------------------------
 * Decode speed ~ memory bandwidth / bytes per token; prefill speed ~ int8 MAC rate. These calls
 * measure both ceilings on this machine and predict what a compiled program would take on public
 * NPU parts, so that every measured speed can be placed against them. */

/* The two ceilings of this machine, as npulm_roofline_measure found them. */
typedef struct npulm_roofline {
  int n_threads;     /* threads measured with (each pinned to nothing: the OS places them) */
  double int8_macs;  /* int8 multiply-accumulates per second, all threads: the NPU's own int8
                        GEMM kernel ('kernel') on cache-resident shapes, the best of several */
  double f32_macs;   /* float MACs per second of the CPU backend's matmul kernel, the same way */
  double read_bytes; /* bytes per second read streaming through 'buffer_bytes' */
  double copy_bytes; /* bytes per second of a streaming copy, counting bytes read + written */
  double mem_bytes;  /* the bandwidth ceiling: the larger of read_bytes and copy_bytes */
  uint64_t buffer_bytes; /* bytes streamed per pass (well above the last-level cache) */
  uint64_t cache_bytes;  /* the last-level cache size the system reports (0 if unknown) */
  char kernel[32];       /* the int8 GEMM variant measured, e.g. "qs8_gemm__avx2" */
  /* the third ceiling, of models larger than memory: bytes per second read from storage, a file
   * of 'storage_file_bytes' in $TMPDIR (else /tmp) written, dropped from the page cache and read
   * back with pread in 1 MiB pieces (0 if it could not be measured; npulm_roofline_measure
   * only) */
  double storage_bytes;
  uint64_t storage_file_bytes;
  double seconds; /* how long measuring took */
  /* The other precisions' GEMM kernels, measured the way int8_macs is (one cache-resident
   * shape each): MAC/s and the variant measured */
  double w4a8_macs;        /* int4 weights x int8 inputs: qs8_qc4w_gemm */
  double w8a16_macs;       /* int8 weights x int16 inputs: qs16_gemm_qs16 */
  double w4a16_macs;       /* int4 weights per channel x int16: qs16_qc4w_gemm_qs16, block 0 */
  double w4a16_block_macs; /* int4 weights in 32-k blocks x int16: the same, block 32 */
  char kernel_w4a8[32];    /* e.g. "qs8_qc4w_gemm__scalar" */
  char kernel_w8a16[32];
  char kernel_w4a16[32]; /* both int4 x int16 measurements */
} npulm_roofline;

/* The host's compute ceiling for a program computing in 'quant' (a mode name, as
 * npulm_decode_traffic names it: "w4a16-naive", or a precision alone: "w4a16"): the MAC/s of the
 * GEMM kernel of its matmuls' precision (f32_macs for "f32"); 0 for a name it does not know. */
double npulm_roofline_peak(const npulm_roofline *host, const char *quant);

/* Measure int8 MAC/s with the NPU's GEMM microkernel (and the MAC/s of the int4-weight and
 * int16-input GEMMs) and memory bandwidth with a streaming read and copy, on 'n_threads' threads
 * (0: one per online CPU) that persist for the whole measurement and work at once. Takes a second
 * or two; allocates a few hundred MiB for the duration. */
npulm_status npulm_roofline_measure(int n_threads, npulm_roofline *out, npulm_error *err);

/* npulm_roofline_measure's memory ceiling alone (read_bytes, copy_bytes, mem_bytes; the compute
 * rates 0): about half a second, to take right before and after a test on a host whose
 * bandwidth drifts (npulm bench --roofline pairs every repetition with one). */
npulm_status npulm_roofline_measure_memory(int n_threads, npulm_roofline *out, npulm_error *err);

/* How far apart, as a fraction of the higher, the two ceilings around a repetition may be for
 * npulm_roofline_pair to count its ceiling as known (0.10: the lower at least 90 % of the higher).
 * A shared host's bandwidth can change state within seconds (this project's host has two, ~1.8x
 * apart, each steady to a few % while it lasts): two measurements further apart saw a change
 * somewhere around the repetition, which then ran against a ceiling anywhere between them, or
 * partly at one and partly at the other. */
#define NPULM_PAIR_SPREAD 0.10

/* n repetitions of a test, each placed against the roofline measured right around it. */
typedef struct npulm_paired {
  double pct;     /* the median % of the ceiling over the repetitions whose ceiling is known
                     (NAN if none) */
  int n_known;    /* how many had a known ceiling */
  double pct_all; /* the median % over all, each against the higher of its two ceilings (for
                     one whose ceiling is not known, the upper end of where it lies) */
} npulm_paired;

/* Place repetition i, which achieved 'rate[i]' (MAC/s, or bytes/s with intensity 1), against the
 * ceiling min(peak, intensity * bandwidth) for each of the bandwidths mem[i] and mem[i + 1]
 * measured right before and after it (mem has n + 1 values; peak may be INFINITY for the
 * bandwidth alone). Its ceiling is known when the lower of the two is within NPULM_PAIR_SPREAD of
 * the higher (so always when both are the peak). NPULM_ERR_ARG for n < 1, a NULL array, or a
 * value that is not a finite number >= 0 (rates) or > 0 (bandwidths, intensity; the peak may be
 * INFINITY); NPULM_ERR_NOMEM. */
npulm_status npulm_roofline_pair(const double *rate, const double *mem, int n, double peak,
                                 double intensity, npulm_paired *out, npulm_error *err);

/* A public NPU part for the cost model. Figures are vendor or third-party public numbers where
 * they exist; 'estimates' names the ones that are npulm's estimates (src/analysis/costmodel.c cites
 * every source). */
typedef struct npulm_npu_profile {
  const char *name;      /* short id: "hexagon-v75", "m4-ane", "mtl-npu" */
  const char *part;      /* e.g. "Qualcomm Hexagon V75 NPU (Snapdragon 8 Gen 3)" */
  double int8_tops;      /* dense int8 tera-operations per second (1 MAC = 2 operations) */
  double w8a16_tops;     /* int16 activations x int8 weights, the same way */
  double w4a8_tops;      /* int4 weights x int8 activations */
  double w4a16_tops;     /* int4 weights x int16 activations (per channel or in blocks) */
  double fp16_tflops;    /* dense fp16 tera-FLOPs per second */
  double dram_gbs;       /* DRAM bandwidth, 1e9 bytes per second */
  double sram_mib;       /* on-chip memory that holds a graph's activations */
  double dispatch_us;    /* overhead of launching one NPU subgraph */
  const char *estimates; /* which of the figures above are estimates */
} npulm_npu_profile;

/* The built-in NPU profiles; '*n_out' receives their number. */
const npulm_npu_profile *npulm_npu_profiles(int *n_out);

/* The profile's peak MAC/s for a program computing in 'quant' (as for npulm_roofline_peak): the
 * rate of its matmuls' precision (fp16 for "f32"); 0 for a name it does not know. */
double npulm_npu_profile_peak(const npulm_npu_profile *profile, const char *quant);

/* What one decode step (one token) of the model's program reads. */
typedef struct npulm_decode_traffic {
  const char *quant; /* how the program's NPU computes: "w8a8-naive", ..., "w4a16-block-naive",
                        or "f32" */
  uint64_t weight_bytes_npu; /* weights the NPU nodes read: int8 packed matmul weights with their
                                per-channel data (float for an "f32" program), norm weights,
                                embedding rows */
  uint64_t weight_bytes_cpu; /* float weights the CPU nodes read (norms kept in float, float
                                matmuls, outlier channels) */
  uint64_t kv_bytes;         /* KV cache bytes read (positions 0 .. pos) and written (pos) */
  uint64_t bytes;            /* the sum: what a token must move at least */
  uint64_t macs;             /* multiply-accumulates of the step (matmuls and attention) */
  uint64_t model_bytes;      /* every weight the program's graphs hold (whole embedding table) */
} npulm_decode_traffic;

/* The traffic of a decode step at cache position 'pos' (0-based: the token's own position) on the
 * model's program. NPULM_ERR_ARG if the model has no program or 'pos' is outside its contexts. */
npulm_status npulm_decode_traffic_at(const npulm_model *model, int pos, npulm_decode_traffic *out,
                                     npulm_error *err);

/* The cost model's prediction of one run. */
typedef struct npulm_prediction {
  double seconds;    /* the whole run: the sum of the four parts below */
  double npu_s;      /* NPU nodes: each max(MACs / peak, DRAM bytes / bandwidth), a matmul's
                        peak that of its precision (its weights' bits and its input's type) */
  double cpu_s;      /* CPU nodes, the same at the host's measured rates */
  double dispatch_s; /* one dispatch per NPU subgraph per step */
  double transfer_s; /* tensors crossing between CPU and NPU (written, then read, in DRAM) */
  uint64_t macs;     /* MACs of the run's matmuls and attention, both backends */
  uint64_t bytes;    /* DRAM bytes of the run, both backends */
  int n_steps;       /* graph executions */
  int n_dispatches;  /* NPU subgraph launches */
} npulm_prediction;

/* Predict a llama-bench test on the model's program: 'n_prompt' tokens in one evaluation (pp), or
 * 'n_gen' single-token evaluations (tg), starting from an empty cache, cut into steps as a session
 * cuts them. NPU nodes run on 'profile' (NULL: on this host at 'host''s GEMM rates and bandwidth,
 * with no dispatch or transfer cost: the host's own roofline bound); CPU nodes at the 'host' rates.
 * An NPU matmul runs at the rate of its precision: the bits of its weights (8 or 4, per channel or
 * in blocks) and the type of its input (int8 or int16), at the profile's *_tops or the host's
 * *_macs; the other NPU nodes at the int8 rate (fp16 for an "f32" program).
 * Activations count as DRAM traffic only when a graph's NPU arena exceeds the profile's SRAM (the
 * host's last-level cache for NULL). Element-wise ops count one MAC per output element. CPU and
 * NPU work is summed, not overlapped: a bound for a serial schedule. NPULM_ERR_ARG if a rate the
 * program needs is not positive (a profile's, or a host's measured without that kernel). */
npulm_status npulm_predict(const npulm_model *model, const npulm_npu_profile *profile,
                           const npulm_roofline *host, int n_prompt, int n_gen,
                           npulm_prediction *out, npulm_error *err);

#ifdef __cplusplus
}
#endif

#endif /* NPULM_BENCH_H */
