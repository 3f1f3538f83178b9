// Internal: UTF-8 decoding state shared by the matcher and the mask walk. Overlong forms,
// surrogates and code points past U+10FFFF are rejected, so that (for example) C0 A2 can never
// sneak a '"' past a class that excludes it.
#pragma once

#include <cstdint>

namespace kvboost::grammar::utf8 {

// Starts a character at lead byte b: sets bits/left/len; false for a byte that cannot lead.
inline bool lead(uint8_t b, uint32_t& bits, uint8_t& left, uint8_t& len) {
  if (b < 0x80) return false;
  if (b >= 0xC2 && b <= 0xDF) bits = b & 0x1F, left = 1, len = 2;
  else if ((b >> 4) == 14) bits = b & 0x0F, left = 2, len = 3;
  else if (b >= 0xF0 && b <= 0xF4) bits = b & 0x07, left = 3, len = 4;
  else return false;
  return true;
}

inline bool valid(uint32_t cp, uint8_t len) {
  const uint32_t min = len == 2 ? 0x80 : len == 3 ? 0x800 : 0x10000;
  return cp >= min && cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF);
}

// The code points a partial character can still become; false when none is valid.
inline bool range(uint32_t bits, uint8_t left, uint8_t len, uint32_t& lo, uint32_t& hi) {
  lo = bits << (6 * left);
  hi = lo | ((1u << (6 * left)) - 1);
  const uint32_t min = len == 2 ? 0x80 : len == 3 ? 0x800 : 0x10000;
  if (lo < min) lo = min;
  if (hi > 0x10FFFF) hi = 0x10FFFF;
  if (lo >= 0xD800 && hi <= 0xDFFF) return false;
  return lo <= hi;
}

// Whether `s` is a sequence of valid characters, the last of which may be cut short (its bytes
// so far can still become a valid character).
template <class S>
bool well_formed(const S& s) {
  uint32_t bits = 0;
  uint8_t left = 0, len = 0;
  for (const char ch : s) {
    const uint8_t b = uint8_t(ch);
    if (left == 0) {
      if (b >= 0x80 && !lead(b, bits, left, len)) return false;
    } else {
      if ((b & 0xC0) != 0x80) return false;
      bits = (bits << 6) | (b & 0x3F);
      if (--left == 0 && !valid(bits, len)) return false;
    }
  }
  uint32_t lo, hi;
  return left == 0 || range(bits, left, len, lo, hi);
}

}  // namespace kvboost::grammar::utf8
