/* UTF-8, once for the library: the encoder the tokenizers and their tests share, and the strict
 * check of one sequence that npulm_utf8_sequence (npulm.h) makes public for the server. The
 * tokenizer's own decoder (model/tokenizer.c) is lenient on purpose, as llama.cpp's is. */
#ifndef NPU_BASE_UTF8_H
#define NPU_BASE_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* Append the UTF-8 encoding of code point 'cp' (< 0x110000) to 'dst' (room for 4 bytes); return
 * its length. */
size_t npu_utf8_put(char *dst, uint32_t cp);

#endif /* NPU_BASE_UTF8_H */
