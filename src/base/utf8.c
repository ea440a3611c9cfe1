/* UTF-8 (see utf8.h). */
#include "base/utf8.h"

#include "npulm.h"

size_t npu_utf8_put(char *dst, uint32_t cp) {
  if (cp < 0x80) {
    dst[0] = (char)cp;
    return 1;
  }
  if (cp < 0x800) {
    dst[0] = (char)(0xC0 | (cp >> 6));
    dst[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
  }
  if (cp < 0x10000) {
    dst[0] = (char)(0xE0 | (cp >> 12));
    dst[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
    dst[2] = (char)(0x80 | (cp & 0x3F));
    return 3;
  }
  dst[0] = (char)(0xF0 | (cp >> 18));
  dst[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
  dst[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
  dst[3] = (char)(0x80 | (cp & 0x3F));
  return 4;
}

size_t npulm_utf8_sequence(const char *s, size_t n) {
  const unsigned char *p = (const unsigned char *)s;
  size_t len;
  uint32_t min, c;
  if (n == 0) return 0;
  if (p[0] < 0x80) return 1;
  if ((p[0] & 0xe0) == 0xc0) len = 2, min = 0x80, c = p[0] & 0x1f;
  else if ((p[0] & 0xf0) == 0xe0) len = 3, min = 0x800, c = p[0] & 0x0f;
  else if ((p[0] & 0xf8) == 0xf0) len = 4, min = 0x10000, c = p[0] & 0x07;
  else return 0;
  if (len > n) return 0;
  for (size_t i = 1; i < len; i++) {
    if ((p[i] & 0xc0) != 0x80) return 0;
    c = c << 6 | (p[i] & 0x3f);
  }
  /* JSON strings take no overlong form, surrogate or code point past U+10FFFF */
  if (c < min || (c >= 0xd800 && c <= 0xdfff) || c > 0x10ffff) return 0;
  return len;
}
