// UTF-8 helpers: validation with byte positions, lossy decoding as Rust does it, and the two
// Unicode properties the added-token matcher needs (via ICU).
#include <unicode/uchar.h>

#include "internal.h"

namespace kvboost::tok {
namespace {

// Length of the valid UTF-8 sequence at s[i], or 0 when invalid; `*bad_len` is the length of
// the maximal invalid subpart (Unicode "substitution of maximal subparts", as Rust uses).
size_t seq_len(std::string_view s, size_t i, size_t* bad_len) {
  const auto b = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  uint8_t c = b(i);
  *bad_len = 1;
  if (c < 0x80) return 1;
  size_t n;
  uint8_t lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) n = 2;
  else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  for (size_t k = 1; k < n; ++k) {
    if (i + k >= s.size()) return 0;
    uint8_t d = b(i + k);
    uint8_t l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (d < l || d > h) return 0;
    *bad_len = k + 1;
  }
  return n;
}

}  // namespace

void validate_utf8(std::string_view s) {
  size_t i = 0, bad;
  while (i < s.size()) {
    if (static_cast<uint8_t>(s[i]) < 0x80) { ++i; continue; }
    size_t n = seq_len(s, i, &bad);
    if (n == 0) fail("invalid UTF-8 at byte ", i);
    i += n;
  }
}

bool is_valid_utf8(std::string_view s) {
  size_t i = 0, bad;
  while (i < s.size()) {
    size_t n = seq_len(s, i, &bad);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string utf8_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0, bad;
  while (i < s.size()) {
    size_t n = seq_len(s, i, &bad);
    if (n) {
      out.append(s.data() + i, n);
      i += n;
    } else {
      out += "\xEF\xBF\xBD";
      i += bad;  // lead byte plus the continuation bytes that were still valid
    }
  }
  return out;
}

uint32_t next_cp(std::string_view s, size_t& i) {
  uint8_t c = static_cast<uint8_t>(s[i]);
  if (c < 0x80) { ++i; return c; }
  int n = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
  uint32_t cp = c & (0x7F >> n);
  for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<uint8_t>(s[i + k]) & 0x3F);
  i += n;
  return cp;
}

uint32_t prev_cp(std::string_view s, size_t& i) {
  size_t j = i - 1;
  while (j > 0 && (static_cast<uint8_t>(s[j]) & 0xC0) == 0x80) --j;
  size_t k = j;
  uint32_t cp = next_cp(s, k);
  i = j;
  return cp;
}

void append_cp(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

bool is_white_space(uint32_t cp) { return u_hasBinaryProperty(static_cast<UChar32>(cp), UCHAR_WHITE_SPACE); }

bool is_word_char(uint32_t cp) {
  UChar32 c = static_cast<UChar32>(cp);
  if (u_hasBinaryProperty(c, UCHAR_ALPHABETIC) || u_hasBinaryProperty(c, UCHAR_JOIN_CONTROL)) return true;
  int8_t t = u_charType(c);
  return t == U_NON_SPACING_MARK || t == U_ENCLOSING_MARK || t == U_COMBINING_SPACING_MARK ||
         t == U_DECIMAL_DIGIT_NUMBER || t == U_CONNECTOR_PUNCTUATION;
}

}  // namespace kvboost::tok
