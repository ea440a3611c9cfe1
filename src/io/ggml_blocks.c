/* ggml's tensor types and their block formats. Each dequantizer is written from the block layout
 * (ggml-common.h's block_* structs, read here byte by byte, little-endian, at any alignment) and
 * computes every value with the same float operations in the same order as llama.cpp's
 * dequantize_row_*: its output must match llama.cpp's bit for bit (tests/test_dequant.c checks
 * SHA-256 digests of llama.cpp's own output). The build's -ffp-contract=off keeps 'a * b - c'
 * two roundings, as ggml's reference C code is written. All plain C, laid out so that the compiler
 * vectorizes the value loops, except F16 rows, which use F16C where the CPU has it. The quantizers
 * (F32, F16, BF16, Q4_0, Q8_0, Q4_K, Q6_K) follow llama.cpp's quantize_row_*_ref the same way, and
 * test_dequant.c checks their bytes against llama-quantize's files. */
#include "io/ggml_blocks.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* ---- Half precision ------------------------------------------------------------------------- */

float npu_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13); /* inf or nan */
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign; /* signed zero */
  } else {
    /* subnormal: value = man * 2^-24 */
    float f = ldexpf((float)man, -24);
    return sign ? -f : f;
  }
  float f;
  memcpy(&f, &bits, sizeof(f));
  return f;
}

uint16_t npu_f32_to_f16(float f) {
  uint32_t x;
  memcpy(&x, &f, sizeof(x));
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
  uint32_t exp = (x >> 23) & 0xffu;
  uint32_t man = x & 0x7fffffu;
  if (exp == 0xff) { /* inf or nan (keep nan quiet and non-zero) */
    return (uint16_t)(sign | 0x7c00u | (man ? 0x200u | (man >> 13) : 0));
  }
  int32_t e = (int32_t)exp - 127 + 15;
  if (e >= 0x1f) return (uint16_t)(sign | 0x7c00u); /* overflow to inf */
  if (e <= 0) {
    /* subnormal or zero in half: shift the full mantissa, round to nearest even */
    if (e < -10) return sign;
    man |= 0x800000u;
    uint32_t shift = (uint32_t)(14 - e);
    uint32_t half = man >> shift;
    uint32_t rem = man & ((1u << shift) - 1);
    uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1u))) half++;
    return (uint16_t)(sign | half);
  }
  uint32_t half = ((uint32_t)e << 10) | (man >> 13);
  uint32_t rem = man & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) half++; /* may carry into inf: correct */
  return (uint16_t)(sign | half);
}

float npu_bf16_to_f32(uint16_t h) {
  uint32_t bits = (uint32_t)h << 16;
  float f;
  memcpy(&f, &bits, sizeof(f));
  return f;
}

/* Little-endian fields of a block. */
static inline uint16_t rd_u16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline uint32_t rd_u32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline float rd_f16(const uint8_t *p) { return npu_f16_to_f32(rd_u16(p)); }

/* ---- Plain floats --------------------------------------------------------------------------- */

void npu_ggml_f32_to_f32(const uint8_t *restrict src, float *restrict dst, size_t n_blocks) {
  memcpy(dst, src, n_blocks * sizeof(float));
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>

/* F16C (CPUID.1:ECX bit 29) with AVX enabled by the OS; clang 14's __builtin_cpu_supports does
 * not know "f16c". */
static bool have_f16c(void) {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !((c >> 29) & 1u)) return false;
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx");
}

/* F16C converts eight halves an instruction, exactly as the scalar code (subnormals included;
 * a signalling NaN comes out quiet, as in llama.cpp's own x86 build, which converts with F16C
 * too): 1.5-2.3 ns a value becomes ~0.2, seconds off loading an F16 model of 1B parameters. */
__attribute__((target("avx,f16c"))) static size_t f16_to_f32_f16c(const uint8_t *restrict src,
                                                                  float *restrict dst, size_t n) {
  size_t i = 0;
  for (; n - i >= 8; i += 8) {
    const __m128i h = _mm_loadu_si128((const __m128i *)(const void *)(src + 2 * i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
  return i;
}
#define NPU_HAVE_F16C_PATH 1
#endif

void npu_ggml_f16_to_f32(const uint8_t *restrict src, float *restrict dst, size_t n_blocks) {
  size_t i = 0;
#ifdef NPU_HAVE_F16C_PATH
  if (n_blocks >= 8 && have_f16c()) i = f16_to_f32_f16c(src, dst, n_blocks);
#endif
  for (; i < n_blocks; i++) dst[i] = rd_f16(src + 2 * i);
}

void npu_ggml_bf16_to_f32(const uint8_t *restrict src, float *restrict dst, size_t n_blocks) {
  for (size_t i = 0; i < n_blocks; i++) dst[i] = npu_bf16_to_f32(rd_u16(src + 2 * i));
}

/* ---- 32-value blocks: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL ---------------------------------- */
/* Byte j of the 16 packed bytes holds value j in its low nibble and value j + 16 in its high one.
 */

/* Q4_0 (18 bytes): f16 d, 16 bytes of nibbles; value = (q - 8) * d. */
void npu_ggml_q4_0_to_f32(const uint8_t *restrict src, float *restrict dst, size_t n_blocks) {
  for (size_t b = 0; b < n_blocks; b++, src += 18, dst += 32) {
    const float d = rd_f16(src);
    const uint8_t *qs = src + 2;
    for (int j = 0; j < 16; j++) {
      dst[j] = (float)((qs[j] & 0xf) - 8) * d;
      dst[j + 16] = (float)((qs[j] >> 4) - 8) * d;
    }
  }
}

/* Q4_1 (20 bytes): f16 d, f16 m, 16 bytes of nibbles; value = q * d + m. */
void npu_ggml_q4_1_to_f32(const uint8_t *restrict src, float *restrict dst, size_t n_blocks) {
  for (size_t b = 0; b < n_blocks; b++, src += 20, dst += 32) {
    const float d = rd_f16(src), m = rd_f16(src + 2);
    const uint8_t *qs = src + 4;
    for (int j = 0; j < 16; j++) {
      dst[j] = (float)(qs[j] & 0xf) * d + m;
      dst[j + 16] = (float)(qs[j] >> 4) * d + m;
    }
  }
}

/* high[i] = bit i of qh, as 16 or 0: the fifth bit of value i of a Q5_0/Q5_1 block. */
static inline void spread_bits(uint32_t qh, uint8_t high[32]) {
  for (int i = 0; i < 32; i++) high[i] = (uint8_t)(((qh >> i) & 1u) << 4);
}

/* Q5_0 (22 bytes): f16 d, u32 qh (bit i: the fifth bit of value i), 16 bytes of nibbles;
 * value = (q - 16) * d. */
void npu_ggml_q5_0_to_f32(const uint8_t *restrict src, float *restrict dst, size_t n_blocks) {
  for (size_t b = 0; b < n_blocks; b++, src += 22, dst += 32) {
    const float d = rd_f16(src);
    uint8_t high[32]; /* the fifth bits, spread out first so that the loop below vectorizes */
    spread_bits(rd_u32(src + 2), high);
    const uint8_t *qs = src + 6;
    for (int j = 0; j < 16; j++) {
      dst[j] = (float)(((qs[j] & 0xf) | high[j]) - 16) * d;
      dst[j + 16] = (float)(((qs[j] >> 4) | high[j + 16]) - 16) * d;
    }
  }
}

/* Q5_1 (24 bytes): f16 d, f16 m, u32 qh, 16 bytes of nibbles; value = q * d + m. */
void npu_ggml_q5_1_to_f32(const uint8_t *restrict src, float *restrict dst, size_t n_blocks) {
  for (size_t b = 0; b < n_blocks; b++, src += 24, dst += 32) {
    const float d = rd_f16(src), m = rd_f16(src + 2);
    uint8_t high[32];
    spread_bits(rd_u32(src + 4), high);
    const uint8_t *qs = src + 8;
    for (int j = 0; j < 16; j++) {
      dst[j] = (float)((qs[j] & 0xf) | high[j]) * d + m;
      dst[j + 16] = (float)((qs[j] >> 4) | high[j + 16]) * d + m;
    }
  }
}

/* Q8_0 (34 bytes): f16 d, 32 int8; value = q * d. */
void npu_ggml_q8_0_to_f32(const uint8_t *restrict src, float *restrict dst, size_t n_blocks) {
  for (size_t b = 0; b < n_blocks; b++, src += 34, dst += 32) {
    const float d = rd_f16(src);
    for (int j = 0; j < 32; j++) dst[j] = (float)(int8_t)src[2 + j] * d;
  }
}

/* The 16 non-linear levels of IQ4_NL and IQ4_XS (ggml's kvalues_iq4nl). */
static const int8_t iq4nl_levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                        1,    13,   25,  38,  53,  69,  89,  113};

/* IQ4_NL (18 bytes): f16 d, 16 bytes of nibbles indexing the levels; value = d * level. */
void npu_ggml_iq4_nl_to_f32(const uint8_t *restrict src, float *restrict dst, size_t n_blocks) {
  for (size_t b = 0; b < n_blocks; b++, src += 18, dst += 32) {
    const float d = rd_f16(src);
    const uint8_t *qs = src + 2;
    for (int j = 0; j < 16; j++) {
      dst[j] = d * (float)iq4nl_levels[qs[j] & 0xf];
      dst[j + 16] = d * (float)iq4nl_levels[qs[j] >> 4];
    }
  }
}

/* ---- 256-value super-blocks: the K-quants, IQ4_XS, TQ1_0, TQ2_0 ----------------------------- */

/* Q2_K (84 bytes): scales[16] (low nibble: scale, high nibble: min, of 16 values each), qs[64]
 * (2-bit values), f16 d, f16 dmin. Per 128 values: 4 passes over the same 32 bytes, taking bits
 * 0-1, 2-3, 4-5, 6-7; each pass is two groups of 16 (bytes 0-15, then 16-31).
 * value = (d * scale) * q - (dmin * min). */
void npu_ggml_q2_k_to_f32(const uint8_t *restrict src, float *restrict dst, size_t n_blocks) {
  for (size_t b = 0; b < n_blocks; b++, src += 84) {
    const uint8_t *scales = src, *qs = src + 16;
    const float d = rd_f16(src + 80), dmin = rd_f16(src + 82);
    int g = 0; /* group of 16 values */
    for (int half = 0; half < 2; half++, qs += 32) {
      for (int shift = 0; shift < 8; shift += 2) {
        for (int part = 0; part < 32; part += 16, g++) {
          const float dl = d * (float)(scales[g] & 0xf), ml = dmin * (float)(scales[g] >> 4);
          for (int l = 0; l < 16; l++) *dst++ = dl * (float)((qs[part + l] >> shift) & 3) - ml;
        }
      }
    }
  }
}

/* Q3_K (110 bytes): hmask[32] (the third bit), qs[64] (low 2 bits, packed as Q2_K), scales[12]
 * (16 six-bit signed scales, offset by 32: low 4 bits in bytes 0-7, high 2 bits in bytes 8-11),
 * f16 d. value = (d * (scale - 32)) * (q - (high bit ? 0 : 4)). The hmask bit advances with each
 * pass over the 2-bit planes, across both halves. */
void npu_ggml_q3_k_to_f32(const uint8_t *restrict src, float *restrict dst, size_t n_blocks) {
  for (size_t b = 0; b < n_blocks; b++, src += 110) {
    const uint8_t *hmask = src, *qs = src + 32, *sc = src + 96;
    const float d = rd_f16(src + 108);
    int scales[16];
    for (int j = 0; j < 16; j++) {
      const int lo = j < 8 ? sc[j] & 0xf : sc[j - 8] >> 4;
      const int hi = (sc[8 + j % 4] >> (2 * (j / 4))) & 3;
      scales[j] = (lo | hi << 4) - 32;
    }
    int g = 0;
    unsigned bit = 1;
    for (int half = 0; half < 2; half++, qs += 32) {
      for (int shift = 0; shift < 8; shift += 2, bit <<= 1) {
        for (int part = 0; part < 32; part += 16, g++) {
          const float dl = d * (float)scales[g];
          for (int l = 0; l < 16; l++) {
            const int q = ((qs[part + l] >> shift) & 3) - ((hmask[part + l] & bit) ? 0 : 4);
            *dst++ = dl * (float)q;
          }
        }
      }
    }
  }
}

/* The 6-bit scale and min of sub-block j (0..7) of a Q4_K/Q5_K block's 12 scale bytes: j < 4 in
 * the low 6 bits of bytes j and j + 4; j >= 4 in the nibbles of byte j + 4, with their top 2 bits
 * in the high bits of bytes j - 4 (scale) and j (min). */
static inline void k4_scale_min(const uint8_t *s, int j, int *scale, int *min) {
  if (j < 4) {
    *scale = s[j] & 63;
    *min = s[j + 4] & 63;
  } else {
    *scale = (s[j + 4] & 0xf) | (s[j - 4] >> 6) << 4;
    *min = (s[j + 4] >> 4) | (s[j] >> 6) << 4;
  }
}

/* Q4_K (144 bytes): f16 d, f16 dmin, scales[12], qs[128]. Per 64 values, 32 bytes: low nibbles
 * (sub-block 2i), then high nibbles (2i + 1). value = (d * scale) * q - (dmin * min). */
void npu_ggml_q4_k_to_f32(const uint8_t *restrict src, float *restrict dst, size_t n_blocks) {
  for (size_t b = 0; b < n_blocks; b++, src += 144) {
    const float d = rd_f16(src), dmin = rd_f16(src + 2);
    const uint8_t *sc = src + 4, *qs = src + 16;
    for (int j = 0; j < 8; j += 2, qs += 32) {
      int s, m;
      k4_scale_min(sc, j, &s, &m);
      const float d1 = d * (float)s, m1 = dmin * (float)m;
      k4_scale_min(sc, j + 1, &s, &m);
      const float d2 = d * (float)s, m2 = dmin * (float)m;
      for (int l = 0; l < 32; l++) *dst++ = d1 * (float)(qs[l] & 0xf) - m1;
      for (int l = 0; l < 32; l++) *dst++ = d2 * (float)(qs[l] >> 4) - m2;
    }
  }
}

/* Q5_K (176 bytes): f16 d, f16 dmin, scales[12], qh[32] (the fifth bit: bit 2i for sub-block 2i,
 * bit 2i + 1 for 2i + 1), qs[128] as Q4_K. value = (d * scale) * q - (dmin * min). */
void npu_ggml_q5_k_to_f32(const uint8_t *restrict src, float *restrict dst, size_t n_blocks) {
  for (size_t b = 0; b < n_blocks; b++, src += 176) {
    const float d = rd_f16(src), dmin = rd_f16(src + 2);
    const uint8_t *sc = src + 4, *qh = src + 16, *qs = src + 48;
    for (int j = 0; j < 8; j += 2, qs += 32) {
      int s, m;
      k4_scale_min(sc, j, &s, &m);
      const float d1 = d * (float)s, m1 = dmin * (float)m;
      k4_scale_min(sc, j + 1, &s, &m);
      const float d2 = d * (float)s, m2 = dmin * (float)m;
      const unsigned u1 = 1u << j, u2 = 2u << j;
      for (int l = 0; l < 32; l++) {
        *dst++ = d1 * (float)((qs[l] & 0xf) + ((qh[l] & u1) ? 16 : 0)) - m1;
      }
      for (int l = 0; l < 32; l++) {
        *dst++ = d2 * (float)((qs[l] >> 4) + ((qh[l] & u2) ? 16 : 0)) - m2;
      }
    }
  }
}

/* Q6_K (210 bytes): ql[128] (low 4 bits), qh[64] (high 2 bits), int8 scales[16], f16 d. Per 128
 * values (64 ql bytes, 32 qh bytes, 8 scales), value l + 32k (k = 0..3) takes nibble k / 2 of
 * ql[l + 32 (k % 2)] and bits 2k..2k+1 of qh[l]; scale index l / 16 + 2k.
 * value = (d * scale) * (q - 32). */
void npu_ggml_q6_k_to_f32(const uint8_t *restrict src, float *restrict dst, size_t n_blocks) {
  for (size_t b = 0; b < n_blocks; b++, src += 210) {
    const uint8_t *ql = src, *qh = src + 128;
    const int8_t *sc = (const int8_t *)(src + 192);
    const float d = rd_f16(src + 208);
    for (int half = 0; half < 2; half++, ql += 64, qh += 32, sc += 8, dst += 128) {
      for (int is = 0; is < 2; is++) { /* values l = 16 is .. 16 is + 15 of each quarter */
        /* (d * scale) first, as llama.cpp's d * sc[is] * q associates */
        const float s1 = d * (float)sc[is], s2 = d * (float)sc[is + 2];
        const float s3 = d * (float)sc[is + 4], s4 = d * (float)sc[is + 6];
        for (int l = 16 * is; l < 16 * is + 16; l++) {
          const int q1 = ((ql[l] & 0xf) | ((qh[l] >> 0) & 3) << 4) - 32;
          const int q2 = ((ql[l + 32] & 0xf) | ((qh[l] >> 2) & 3) << 4) - 32;
          const int q3 = ((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) - 32;
          const int q4 = ((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) - 32;
          dst[l] = s1 * (float)q1;
          dst[l + 32] = s2 * (float)q2;
          dst[l + 64] = s3 * (float)q3;
          dst[l + 96] = s4 * (float)q4;
        }
      }
    }
  }
}

/* IQ4_XS (136 bytes): f16 d, u16 scales_h (top 2 bits of each sub-block's scale), scales_l[4]
 * (low 4 bits, two sub-blocks a byte), qs[128]: per sub-block of 32, 16 bytes of nibbles as
 * IQ4_NL. value = (d * (scale - 32)) * level. */
void npu_ggml_iq4_xs_to_f32(const uint8_t *restrict src, float *restrict dst, size_t n_blocks) {
  for (size_t b = 0; b < n_blocks; b++, src += 136) {
    const float d = rd_f16(src);
    const unsigned scales_h = rd_u16(src + 2);
    const uint8_t *scales_l = src + 4, *qs = src + 8;
    for (int ib = 0; ib < 8; ib++, qs += 16, dst += 32) {
      const int lo = (scales_l[ib / 2] >> (4 * (ib % 2))) & 0xf, hi = (scales_h >> (2 * ib)) & 3;
      const int ls = lo | hi << 4;
      const float dl = d * (float)(ls - 32);
      for (int j = 0; j < 16; j++) {
        dst[j] = dl * (float)iq4nl_levels[qs[j] & 0xf];
        dst[j + 16] = dl * (float)iq4nl_levels[qs[j] >> 4];
      }
    }
  }
}

/* Trit n (0..4) of a TQ1_0 byte, 0..2: the byte is a base-3 fraction (x * 256 / 243, rounded
 * up), so multiplying by 3^n (mod 256) shifts trit n to the top, and * 3 >> 8 reads it. */
static inline int tq1_trit(uint8_t byte, int n) {
  static const uint8_t pow3[5] = {1, 3, 9, 27, 81};
  const uint8_t q = (uint8_t)(byte * pow3[n]);
  return (q * 3) >> 8;
}

/* TQ1_0 (54 bytes): qs[48] (5 trits a byte), qh[4] (4 trits a byte), f16 d. Values in order:
 * trits 0-4 of qs[0..31] (32 values per trit), trits 0-4 of qs[32..47] (16 per trit), trits 0-3
 * of qh[0..3] (4 per trit). value = (trit - 1) * d. */
void npu_ggml_tq1_0_to_f32(const uint8_t *restrict src, float *restrict dst, size_t n_blocks) {
  for (size_t b = 0; b < n_blocks; b++, src += 54) {
    const uint8_t *qs = src, *qh = src + 48;
    const float d = rd_f16(src + 52);
    for (int n = 0; n < 5; n++) {
      for (int m = 0; m < 32; m++) *dst++ = (float)(tq1_trit(qs[m], n) - 1) * d;
    }
    for (int n = 0; n < 5; n++) {
      for (int m = 32; m < 48; m++) *dst++ = (float)(tq1_trit(qs[m], n) - 1) * d;
    }
    for (int n = 0; n < 4; n++) {
      for (int m = 0; m < 4; m++) *dst++ = (float)(tq1_trit(qh[m], n) - 1) * d;
    }
  }
}

/* TQ2_0 (66 bytes): qs[64] (2 bits a value), f16 d. Per 128 values, 4 passes over 32 bytes taking
 * bits 0-1, 2-3, 4-5, 6-7. value = (q - 1) * d. */
void npu_ggml_tq2_0_to_f32(const uint8_t *restrict src, float *restrict dst, size_t n_blocks) {
  for (size_t b = 0; b < n_blocks; b++, src += 66) {
    const float d = rd_f16(src + 64);
    for (int j = 0; j < 64; j += 32) {
      for (int shift = 0; shift < 8; shift += 2) {
        for (int m = 0; m < 32; m++) *dst++ = (float)(((src[j + m] >> shift) & 3) - 1) * d;
      }
    }
  }
}

/* ---- Quantizers ----------------------------------------------------------------------------- */

static inline void wr_u16(uint8_t *p, uint16_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
}

void npu_ggml_f32_from_f32(const float *restrict src, uint8_t *restrict dst, size_t n_blocks) {
  memcpy(dst, src, n_blocks * sizeof(float));
}

void npu_ggml_f16_from_f32(const float *restrict src, uint8_t *restrict dst, size_t n_blocks) {
  for (size_t i = 0; i < n_blocks; i++) wr_u16(dst + 2 * i, npu_f32_to_f16(src[i]));
}

/* ggml's GGML_FP32_TO_BF16: a NaN keeps its sign and top payload bits and is made quiet; every
 * other value (infinities included) rounds to nearest even. */
void npu_ggml_bf16_from_f32(const float *restrict src, uint8_t *restrict dst, size_t n_blocks) {
  for (size_t i = 0; i < n_blocks; i++) {
    uint32_t u;
    memcpy(&u, &src[i], sizeof(u));
    const uint16_t h = (u & 0x7fffffffu) > 0x7f800000u
                           ? (uint16_t)((u >> 16) | 64u)
                           : (uint16_t)((u + (0x7fffu + ((u >> 16) & 1u))) >> 16);
    wr_u16(dst + 2 * i, h);
  }
}

/* Q4_0 as quantize_row_q4_0_ref: the scale maps the value of largest magnitude to -8 (so its sign
 * picks which end of [-8, 7] is used to the full); q = x / d + 8 rounded half up, as a truncation
 * of x * id + 8.5, capped at 15 (x * id >= -8 by construction, so no lower clamp is needed). */
void npu_ggml_q4_0_from_f32(const float *restrict src, uint8_t *restrict dst, size_t n_blocks) {
  for (size_t b = 0; b < n_blocks; b++, src += 32, dst += 18) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < 32; j++) {
      if (amax < fabsf(src[j])) { /* the first of equal magnitudes wins, as in ggml */
        amax = fabsf(src[j]);
        max = src[j];
      }
    }
    const float d = max / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    wr_u16(dst, npu_f32_to_f16(d));
    for (int j = 0; j < 16; j++) {
      const int q0 = (int)(src[j] * id + 8.5f), q1 = (int)(src[j + 16] * id + 8.5f);
      dst[2 + j] = (uint8_t)((q0 < 15 ? q0 : 15) | (q1 < 15 ? q1 : 15) << 4);
    }
  }
}

/* Q8_0 as quantize_row_q8_0_ref: d = max|x| / 127, q = roundf(x * (1/d)) (half away from zero),
 * within [-127, 127] by construction. */
void npu_ggml_q8_0_from_f32(const float *restrict src, uint8_t *restrict dst, size_t n_blocks) {
  for (size_t b = 0; b < n_blocks; b++, src += 32, dst += NPU_Q8_0_BLOCK_BYTES) {
    float amax = 0.0f;
    for (int j = 0; j < 32; j++) amax = amax > fabsf(src[j]) ? amax : fabsf(src[j]);
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    wr_u16(dst, npu_f32_to_f16(d));
    for (int j = 0; j < 32; j++) dst[2 + j] = (uint8_t)(int8_t)roundf(src[j] * id);
  }
}

/* ggml's nearest_int: round half to even through the float adder (|v| <= 4194303). */
static inline int nearest_int(float v) {
  const float biased = v + 12582912.0f; /* 1.5 * 2^23: the integer lands in the low mantissa */
  int32_t bits;
  memcpy(&bits, &biased, sizeof(bits));
  return (bits & 0x007fffff) - 0x00400000;
}

/* ggml's make_qkx2_quants (no MAD): scale and min (returned, and -min in '*neg_min_out') of the
 * 'n' values 'x' on levels 0..nmax, weighted, minimizing the weighted squared error over the plain
 * range fit and 'nstep' + 1 trial scales (nmax + rmin + rdelta * is) / (max - min), each refined
 * by weighted least squares; the levels go to 'L' ('Laux' is scratch of n). */
static float make_qkx2_quants(int n, int nmax, const float *restrict x,
                              const float *restrict weights, uint8_t *restrict L,
                              float *restrict neg_min_out, uint8_t *restrict Laux, float rmin,
                              float rdelta, int nstep) {
  float min = x[0], max = x[0];
  float sum_w = weights[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; i++) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    const float w = weights[i];
    sum_w += w;
    sum_x += w * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    memset(L, 0, (size_t)n);
    *neg_min_out = -min;
    return 0.0f;
  }
  float iscale = (float)nmax / (max - min);
  float scale = 1 / iscale;
  float best_err = 0;
  for (int i = 0; i < n; i++) {
    const int l = nearest_int(iscale * (x[i] - min));
    L[i] = (uint8_t)(l < 0 ? 0 : l > nmax ? nmax : l);
    const float diff = scale * (float)L[i] + min - x[i];
    best_err += weights[i] * (diff * diff);
  }
  for (int is = 0; is <= nstep; is++) {
    iscale = (rmin + rdelta * (float)is + (float)nmax) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; i++) {
      int l = nearest_int(iscale * (x[i] - min));
      l = l < 0 ? 0 : l > nmax ? nmax : l;
      Laux[i] = (uint8_t)l;
      const float w = weights[i];
      sum_l += w * (float)l;
      sum_l2 += w * (float)l * (float)l;
      sum_xl += w * (float)l * x[i];
    }
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D > 0) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
      if (this_min > 0) {
        this_min = 0;
        this_scale = sum_xl / sum_l2;
      }
      float err = 0;
      for (int i = 0; i < n; i++) {
        const float diff = this_scale * (float)Laux[i] + this_min - x[i];
        err += weights[i] * (diff * diff);
      }
      if (err < best_err) {
        memcpy(L, Laux, (size_t)n);
        best_err = err;
        scale = this_scale;
        min = this_min;
      }
    }
  }
  *neg_min_out = -min;
  return scale;
}

/* Q4_K as quantize_row_q4_K_ref: per sub-block of 32, weights av + |x| (av = rms of the
 * sub-block) and make_qkx2_quants(15, rmin -1, rdelta 0.1, 20 steps); the 8 scales and mins on
 * 6 bits against the largest of each (d = max scale / 63, dmin = max min / 63); then every value
 * requantized with the stored (f16-rounded) d * scale and dmin * min. */
void npu_ggml_q4_k_from_f32(const float *restrict src, uint8_t *restrict dst, size_t n_blocks) {
  for (size_t b = 0; b < n_blocks; b++, src += 256, dst += 144) {
    uint8_t L[256], Laux[32];
    float weights[32], mins[8], scales[8];
    float max_scale = 0, max_min = 0; /* the min is subtracted: scales are never negative */
    for (int j = 0; j < 8; j++) {
      const float *x = src + 32 * j;
      float sum_x2 = 0;
      for (int l = 0; l < 32; l++) sum_x2 += x[l] * x[l];
      const float av_x = sqrtf(sum_x2 / 32);
      for (int l = 0; l < 32; l++) weights[l] = av_x + fabsf(x[l]);
      scales[j] = make_qkx2_quants(32, 15, x, weights, L + 32 * j, &mins[j], Laux, -1.0f, 0.1f, 20);
      if (scales[j] > max_scale) max_scale = scales[j];
      if (mins[j] > max_min) max_min = mins[j];
    }
    const float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f;
    const float inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
    uint8_t *sc = dst + 4;
    for (int j = 0; j < 8; j++) {
      uint8_t ls = (uint8_t)nearest_int(inv_scale * scales[j]);
      uint8_t lm = (uint8_t)nearest_int(inv_min * mins[j]);
      ls = ls < 63 ? ls : 63;
      lm = lm < 63 ? lm : 63;
      if (j < 4) {
        sc[j] = ls;
        sc[j + 4] = lm;
      } else { /* low nibbles in byte j + 4, the top 2 bits over bytes j - 4 and j */
        sc[j + 4] = (uint8_t)((ls & 0xf) | (lm & 0xf) << 4);
        sc[j - 4] |= (uint8_t)((ls >> 4) << 6);
        sc[j] |= (uint8_t)((lm >> 4) << 6);
      }
    }
    wr_u16(dst, npu_f32_to_f16(max_scale / 63.0f));
    wr_u16(dst + 2, npu_f32_to_f16(max_min / 63.0f));
    const float d_all = rd_f16(dst), dmin_all = rd_f16(dst + 2);
    for (int j = 0; j < 8; j++) {
      int s, m;
      k4_scale_min(sc, j, &s, &m);
      const float d = d_all * (float)s;
      if (d == 0.0f) continue; /* keeps make_qkx2_quants' levels, as ggml does */
      const float dm = dmin_all * (float)m;
      for (int i = 0; i < 32; i++) {
        const int l = nearest_int((src[32 * j + i] + dm) / d);
        L[32 * j + i] = (uint8_t)(l < 0 ? 0 : l > 15 ? 15 : l);
      }
    }
    uint8_t *qs = dst + 16;
    for (int j = 0; j < 256; j += 64, qs += 32) {
      for (int l = 0; l < 32; l++) qs[l] = (uint8_t)(L[j + l] | L[j + l + 32] << 4);
    }
  }
}

/* ggml's make_qx_quants with rmse_type 1 and no importance weights: a signed scale for the 'n'
 * values 'x' on levels -nmax..nmax-1 (stored biased by nmax in 'L'), weighted by x^2: the fit
 * that maps the value of largest magnitude to -nmax, then 18 nearby trial scales
 * -(nmax + 0.1 * is) / max, keeping the least-squares scale of the best. */
static float make_qx_quants(int n, int nmax, const float *restrict x, uint8_t *restrict L) {
  float max = 0, amax = 0;
  for (int i = 0; i < n; i++) {
    const float ax = fabsf(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < 1e-15f) { /* GROUP_MAX_EPS: all zero */
    memset(L, 0, (size_t)n);
    return 0.0f;
  }
  float iscale = (float)-nmax / max;
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; i++) {
    int l = nearest_int(iscale * x[i]);
    l = l < -nmax ? -nmax : l > nmax - 1 ? nmax - 1 : l;
    L[i] = (uint8_t)(l + nmax);
    const float w = x[i] * x[i];
    sumlx += w * x[i] * (float)l;
    suml2 += w * (float)l * (float)l;
  }
  float scale = suml2 != 0.0f ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; is++) {
    if (is == 0) continue;
    iscale = -((float)nmax + 0.1f * (float)is) / max;
    sumlx = suml2 = 0;
    for (int i = 0; i < n; i++) {
      int l = nearest_int(iscale * x[i]);
      l = l < -nmax ? -nmax : l > nmax - 1 ? nmax - 1 : l;
      const float w = x[i] * x[i];
      sumlx += w * x[i] * (float)l;
      suml2 += w * (float)l * (float)l;
    }
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; i++) {
        const int l = nearest_int(iscale * x[i]);
        L[i] = (uint8_t)(nmax + (l < -nmax ? -nmax : l > nmax - 1 ? nmax - 1 : l));
      }
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

/* Q6_K as quantize_row_q6_K_ref: a signed scale per 16 values (make_qx_quants, levels -32..31);
 * the 16 scales on int8 against the one of largest magnitude (d = its scale / -128); then every
 * value requantized with the stored d * scale. A block whose scales are all ~0 is all zero. */
void npu_ggml_q6_k_from_f32(const float *restrict src, uint8_t *restrict dst, size_t n_blocks) {
  for (size_t b = 0; b < n_blocks; b++, src += 256, dst += 210) {
    uint8_t L[256];
    float scales[16], max_scale = 0, max_abs_scale = 0;
    for (int ib = 0; ib < 16; ib++) {
      scales[ib] = make_qx_quants(16, 32, src + 16 * ib, L + 16 * ib);
      if (fabsf(scales[ib]) > max_abs_scale) {
        max_abs_scale = fabsf(scales[ib]);
        max_scale = scales[ib];
      }
    }
    memset(dst, 0, 210);
    if (max_abs_scale < 1e-15f) continue; /* GROUP_MAX_EPS: d = 0, all zero */
    uint8_t *ql = dst, *qh = dst + 128, *sc = dst + 192;
    const float iscale = -128.0f / max_scale;
    wr_u16(dst + 208, npu_f32_to_f16(1 / iscale));
    for (int ib = 0; ib < 16; ib++) {
      const int l = nearest_int(iscale * scales[ib]);
      sc[ib] = (uint8_t)(int8_t)(l < 127 ? l : 127);
    }
    const float d_all = rd_f16(dst + 208);
    for (int j = 0; j < 16; j++) {
      const float d = d_all * (float)(int8_t)sc[j];
      if (d == 0.0f) continue; /* keeps make_qx_quants' levels, as ggml does */
      for (int i = 0; i < 16; i++) {
        const int l = nearest_int(src[16 * j + i] / d);
        L[16 * j + i] = (uint8_t)((l < -32 ? -32 : l > 31 ? 31 : l) + 32);
      }
    }
    for (int j = 0; j < 256; j += 128, ql += 64, qh += 32) {
      for (int l = 0; l < 32; l++) {
        const uint8_t *q = L + j + l;
        ql[l] = (uint8_t)((q[0] & 0xf) | (q[64] & 0xf) << 4);
        ql[l + 32] = (uint8_t)((q[32] & 0xf) | (q[96] & 0xf) << 4);
        qh[l] = (uint8_t)(q[0] >> 4 | (q[32] >> 4) << 2 | (q[64] >> 4) << 4 | (q[96] >> 4) << 6);
      }
    }
  }
}

/* ---- The type table ------------------------------------------------------------------------- */

struct ggml_type_traits {
  const char *name;
  uint32_t block;                /* values per block */
  uint32_t nbytes;               /* bytes per block */
  npu_ggml_to_f32_fn to_f32;     /* NULL: npulm does not read it */
  npu_ggml_from_f32_fn from_f32; /* NULL: npulm does not write it */
};

/* Indexed by ggml type id; ids ggml has retired have no name. */
static const struct ggml_type_traits ggml_types[] = {
    [0] = {"F32", 1, 4, npu_ggml_f32_to_f32, npu_ggml_f32_from_f32},
    [1] = {"F16", 1, 2, npu_ggml_f16_to_f32, npu_ggml_f16_from_f32},
    [2] = {"Q4_0", 32, 18, npu_ggml_q4_0_to_f32, npu_ggml_q4_0_from_f32},
    [3] = {"Q4_1", 32, 20, npu_ggml_q4_1_to_f32, NULL},
    [6] = {"Q5_0", 32, 22, npu_ggml_q5_0_to_f32, NULL},
    [7] = {"Q5_1", 32, 24, npu_ggml_q5_1_to_f32, NULL},
    [8] = {"Q8_0", 32, 34, npu_ggml_q8_0_to_f32, npu_ggml_q8_0_from_f32},
    [9] = {"Q8_1", 32, 36, NULL, NULL},
    [10] = {"Q2_K", 256, 84, npu_ggml_q2_k_to_f32, NULL},
    [11] = {"Q3_K", 256, 110, npu_ggml_q3_k_to_f32, NULL},
    [12] = {"Q4_K", 256, 144, npu_ggml_q4_k_to_f32, npu_ggml_q4_k_from_f32},
    [13] = {"Q5_K", 256, 176, npu_ggml_q5_k_to_f32, NULL},
    [14] = {"Q6_K", 256, 210, npu_ggml_q6_k_to_f32, npu_ggml_q6_k_from_f32},
    [15] = {"Q8_K", 256, 292, NULL, NULL},
    [16] = {"IQ2_XXS", 256, 66, NULL, NULL},
    [17] = {"IQ2_XS", 256, 74, NULL, NULL},
    [18] = {"IQ3_XXS", 256, 98, NULL, NULL},
    [19] = {"IQ1_S", 256, 50, NULL, NULL},
    [20] = {"IQ4_NL", 32, 18, npu_ggml_iq4_nl_to_f32, NULL},
    [21] = {"IQ3_S", 256, 110, NULL, NULL},
    [22] = {"IQ2_S", 256, 82, NULL, NULL},
    [23] = {"IQ4_XS", 256, 136, npu_ggml_iq4_xs_to_f32, NULL},
    [24] = {"I8", 1, 1, NULL, NULL},
    [25] = {"I16", 1, 2, NULL, NULL},
    [26] = {"I32", 1, 4, NULL, NULL},
    [27] = {"I64", 1, 8, NULL, NULL},
    [28] = {"F64", 1, 8, NULL, NULL},
    [29] = {"IQ1_M", 256, 56, NULL, NULL},
    [30] = {"BF16", 1, 2, npu_ggml_bf16_to_f32, npu_ggml_bf16_from_f32},
    [34] = {"TQ1_0", 256, 54, npu_ggml_tq1_0_to_f32, NULL},
    [35] = {"TQ2_0", 256, 66, npu_ggml_tq2_0_to_f32, NULL},
    [39] = {"MXFP4", 32, 17, NULL, NULL},
};
#define GGML_TYPE_COUNT (sizeof(ggml_types) / sizeof(ggml_types[0]))

const char *npu_ggml_type_name(uint32_t type) {
  return type < GGML_TYPE_COUNT ? ggml_types[type].name : NULL;
}

bool npu_ggml_type_size(uint32_t type, uint32_t *block_out, uint32_t *nbytes_out) {
  if (npu_ggml_type_name(type) == NULL) return false;
  *block_out = ggml_types[type].block;
  *nbytes_out = ggml_types[type].nbytes;
  return true;
}

npu_ggml_to_f32_fn npu_ggml_type_to_f32(uint32_t type) {
  return type < GGML_TYPE_COUNT ? ggml_types[type].to_f32 : NULL;
}

npu_ggml_from_f32_fn npu_ggml_type_from_f32(uint32_t type) {
  return type < GGML_TYPE_COUNT ? ggml_types[type].from_f32 : NULL;
}

/* The names of the types with a dequantizer ('writable' false) or a quantizer (true). */
static void list_types(char *buf, size_t cap, bool writable) {
  size_t len = 0;
  if (cap == 0) return;
  buf[0] = '\0';
  for (uint32_t t = 0; t < GGML_TYPE_COUNT; t++) {
    if (writable ? ggml_types[t].from_f32 == NULL : ggml_types[t].to_f32 == NULL) continue;
    int n = snprintf(buf + len, cap - len, "%s%s", len ? ", " : "", ggml_types[t].name);
    if (n < 0 || (size_t)n >= cap - len) return; /* truncated */
    len += (size_t)n;
  }
}

void npu_ggml_readable_types(char *buf, size_t cap) { list_types(buf, cap, false); }
void npu_ggml_writable_types(char *buf, size_t cap) { list_types(buf, cap, true); }
