/* Program files: a compiled program with its model as one checksummed, mmap-able GGUF file,
 * checked, loaded, verified and saved here (the format: program_file.h, private to this folder). */
#ifndef NPU_PROGRAM_PROGRAM_IO_H
#define NPU_PROGRAM_PROGRAM_IO_H

#include <stdbool.h>
#include <stdint.h>

#include "io/gguf.h"
#include "program/program.h"

#define NPU_PROGRAM_VERSION 10 /* 'npulm.program.version' this build writes and reads */
#define NPU_PROGRAM_CHECKSUMS "npulm.checksums" /* their key (gguf_checksum.h) */

/* Whether 'g' is a program file: '*is_program' is set when it has 'npulm.program.version'. A
 * version other than NPU_PROGRAM_VERSION is NPULM_ERR_UNSUPPORTED naming it; a value of the wrong
 * type is NPULM_ERR_FORMAT. Checked before anything else is read, so that a newer file says so.
 * Then every checksum of a program file is checked, so that nothing else is read from a damaged
 * one: NPULM_ERR_FORMAT names the first damaged part (the header or a tensor) and its bytes. */
npulm_status npu_program_file_check(const struct npu_gguf *g, bool *is_program, npulm_error *err);

/* One damaged part of a program file: 'what' says which ("the header", "tensor 'NAME'"), its
 * bytes are [begin, end). */
typedef void (*npu_damage_fn)(void *user, const char *what, uint64_t begin, uint64_t end);
/* Check every checksum of the program file 'g', calling 'damaged' (may be NULL) for each part
 * that fails, and count them in '*n_damaged'. An error, as npu_program_file_check's, if 'g' is
 * not a program file of this version or its checksums are missing or do not cover the file. */
npulm_status npu_program_file_damage(const struct npu_gguf *g, npu_damage_fn damaged, void *user,
                                     int64_t *n_damaged, npulm_error *err);

/* The weights of the model that program file 'g' (accepted by npu_program_file_check) holds no
 * float copy of (npulm.weights.float: only the integer NPU reads them, from its int8 data): a
 * malloc'd array of '*n_out' malloc'd names (NULL and 0 if none), for the model reader
 * (struct npulm_model's 'omitted'). NPULM_ERR_FORMAT if the list is malformed. */
npulm_status npu_program_file_omitted(const struct npu_gguf *g, char ***names_out, int32_t *n_out,
                                      npulm_error *err);

/* Read the program stored in 'm->gguf' (a program file whose model 'm' is otherwise loaded): the
 * compile options, the weight-name list (which must equal npu_weight_table's), and every graph,
 * each range-checked and then checked with npu_program_verify. On error '*err' names the key,
 * graph and record at fault. */
npulm_status npu_program_load(const struct npulm_model *m, struct npu_program **out,
                              npulm_error *err);

/* Everything an executor relies on, for a program from any source: the options are valid for
 * the model; the graphs are exactly the specializations the options ask for; each passes
 * npu_ir_validate; every tensor's shape agrees with the model (weights with the weight table,
 * KV caches, logits, attention heads); the NPU runs only ops it supports; the subgraphs cover the
 * nodes contiguously with the nodes' backends; every node reads and writes activations in its own
 * backend's arena (a TRANSFER, on either backend, connects the two: F32 <-> I8/I16 or one type);
 * and the plan keeps every activation inside its arena, aligned, with no two live at once
 * sharing bytes. Every value is F32 except, in an integer program (quant_mode != 0), the NPU's
 * activations: I8/I16 with their quantization table entry. There, each NPU node runs an op with
 * an integer kernel and is linked (node_site) to the site of its name and op, whose sizes match
 * the node's tensors (packed size, n, k, table rows) and whose multipliers, shifts, zero points,
 * add shifts, packed weights (bias range, weight sums, padding) and outlier channels (in range,
 * ascending) are within what the kernels accept; each SHADOW runs on the CPU, from an F32
 * activation as wide as its matmul's outliers need to F32 [rows, n]; transfers run on the CPU. */
npulm_status npu_program_verify(const struct npulm_model *m, const struct npu_program *p,
                                npulm_error *err);

/* npu_program_verify, calling 'after_site' (if not NULL) as soon as site i has passed its checks:
 * what the caller does with a site once it is read (the loader, under a memory budget, lets go
 * of the file pages the checks read) stays the caller's; the verification only reads. */
typedef void (*npu_site_checked_fn)(void *user, const struct npu_program *p, int32_t site);
npulm_status npu_program_verify_each_site(const struct npulm_model *m, const struct npu_program *p,
                                          npu_site_checked_fn after_site, void *user,
                                          npulm_error *err);

/* Write model 'm' with program 'p' as a program file at 'path', checksummed and atomically
 * (npu_gguf_writer_open_file): on failure the file at 'path' is as it was. 'progress' (may be
 * NULL) is called as tensor bytes (weights, then the sites' integer data) are written. */
npulm_status npu_program_save(const struct npulm_model *m, const struct npu_program *p,
                              const char *path, npulm_progress_fn progress, void *user,
                              npulm_error *err);

#endif /* NPU_PROGRAM_PROGRAM_IO_H */
