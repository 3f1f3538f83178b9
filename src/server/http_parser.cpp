// The strict incremental HTTP/1.1 request parser (see http.h). Framing rules follow RFC 9112
// sections 2.2 (bare CR refused; we refuse a bare LF too, at once, rather than guess), 5.1-5.2
// (no whitespace before the colon, no obs-fold), 6.1-6.3 (Transfer-Encoding and Content-Length
// together: refused, since a proxy in front may frame it the other way -- request smuggling) and
// 7.1 (chunked coding).
#include <algorithm>
#include <cctype>
#include <cstring>

#include "http.h"

namespace kvboost::server {

namespace {

bool is_tchar(unsigned char c) {
  return std::isalnum(c) || std::strchr("!#$%&'*+-.^_`|~", c) != nullptr;
}

std::string lower(std::string_view s) {
  std::string r(s);
  for (char& c : r) c = char(std::tolower((unsigned char)c));
  return r;
}

std::string_view trim_ows(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// Only digits, at most 18 of them (no sign, no overflow).
bool parse_decimal(std::string_view s, int64_t& out) {
  if (s.empty() || s.size() > 18) return false;
  int64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  out = v;
  return true;
}

std::string printable(std::string_view s) {
  std::string r;
  for (char c : s.substr(0, 64)) r += (c >= 32 && c < 127) ? c : '?';
  return r;
}

}  // namespace

RequestParser::State RequestParser::fail(int status, std::string why, std::string code) {
  err_status_ = status;
  err_ = std::move(why);
  err_code_ = std::move(code);
  return state_ = State::kError;
}

RequestParser::Phase RequestParser::phase() const {
  if (step_ != Step::kHead) return Phase::kBody;
  return pos_ < buf_.size() ? Phase::kHead : Phase::kIdle;
}

void RequestParser::reset() {
  buf_.erase(0, pos_);
  pos_ = scan_ = 0;
  step_ = Step::kHead;
  state_ = State::kNeedMore;
  left_ = 0;
  continue_ = false;
  req_ = HttpRequest{};
  err_status_ = 0;
  err_.clear();
  err_code_.clear();
  if (!buf_.empty()) parse();
}

bool RequestParser::want_continue() {
  const bool c = continue_;
  continue_ = false;
  return c;
}

RequestParser::State RequestParser::feed(std::string_view data) {
  buf_.append(data);  // past a complete request: the next one's bytes, parsed after reset()
  if (state_ != State::kNeedMore) return state_;
  return parse();
}

RequestParser::State RequestParser::parse() {
  for (;;) {
    switch (step_) {
      case Step::kHead: {
        // Empty lines before a request line are ignored (RFC 9112 2.2: robustness after a body).
        while (buf_.size() - pos_ >= 2 && buf_[pos_] == '\r' && buf_[pos_ + 1] == '\n') pos_ += 2;
        if (scan_ < pos_) scan_ = pos_;
        size_t head_end = std::string::npos;
        for (size_t i = scan_; i < buf_.size(); ++i) {
          const char c = buf_[i];
          if (c == '\n' && (i == pos_ || buf_[i - 1] != '\r'))
            return fail(400, "bare LF in the request head (lines must end with CRLF)", "bad_http_request");
          if (c == '\r' && i + 1 < buf_.size() && buf_[i + 1] != '\n')
            return fail(400, "bare CR in the request head", "bad_http_request");
          if (c == '\n' && i >= pos_ + 3 && buf_[i - 2] == '\n') {
            head_end = i - 3;
            break;
          }
        }
        if (head_end == std::string::npos) {
          // The last byte may be a CR whose LF has not arrived: check it again next time.
          scan_ = buf_.empty() ? 0 : std::max(pos_, buf_.size() - 1);
          if (buf_.size() - pos_ > lim_->max_header_bytes)
            return fail(431, "request headers exceed " + std::to_string(lim_->max_header_bytes) + " bytes",
                        "headers_too_large");
          return State::kNeedMore;
        }
        if (head_end - pos_ > lim_->max_header_bytes)
          return fail(431, "request headers exceed " + std::to_string(lim_->max_header_bytes) + " bytes",
                      "headers_too_large");
        if (parse_head(head_end) == State::kError) return state_;
        pos_ = head_end + 4;
        break;
      }
      case Step::kLength: {
        const size_t take = size_t(std::min<int64_t>(left_, int64_t(buf_.size() - pos_)));
        req_.body.append(buf_, pos_, take);
        pos_ += take;
        left_ -= int64_t(take);
        if (left_ > 0) return State::kNeedMore;
        return state_ = State::kDone;
      }
      case Step::kChunkSize: {
        const size_t eol = buf_.find("\r\n", pos_);
        const size_t lf = buf_.find('\n', pos_);
        if (lf != std::string::npos && (eol == std::string::npos || lf < eol + 1))
          return fail(400, "bare LF in a chunk-size line", "bad_http_request");
        if (eol == std::string::npos) {
          if (buf_.size() - pos_ > 1024) return fail(400, "chunk-size line longer than 1024 bytes", "bad_http_request");
          return State::kNeedMore;
        }
        std::string_view line(buf_.data() + pos_, eol - pos_);
        line = line.substr(0, line.find(';'));  // chunk extensions are ignored
        line = trim_ows(line);
        if (line.empty() || line.size() > 15)
          return fail(400, "invalid chunk size '" + printable(line) + "'", "bad_http_request");
        int64_t n = 0;
        for (char c : line) {
          int d;
          if (c >= '0' && c <= '9') d = c - '0';
          else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
          else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
          else return fail(400, "invalid chunk size '" + printable(line) + "'", "bad_http_request");
          n = n * 16 + d;
        }
        pos_ = eol + 2;
        if (n == 0) {
          step_ = Step::kTrailers;
          trailer_start_ = pos_;
          break;
        }
        if (uint64_t(n) > lim_->max_body_bytes - std::min(lim_->max_body_bytes, req_.body.size()))
          return fail(413, "the chunked request body exceeds the limit of " + std::to_string(lim_->max_body_bytes) +
                               " bytes",
                      "request_too_large");
        left_ = n;
        step_ = Step::kChunkData;
        break;
      }
      case Step::kChunkData: {
        const size_t take = size_t(std::min<int64_t>(left_, int64_t(buf_.size() - pos_)));
        req_.body.append(buf_, pos_, take);
        pos_ += take;
        left_ -= int64_t(take);
        if (left_ > 0) return State::kNeedMore;
        step_ = Step::kChunkCrlf;
        break;
      }
      case Step::kChunkCrlf: {
        if (buf_.size() - pos_ < 2) return State::kNeedMore;
        if (buf_.compare(pos_, 2, "\r\n") != 0) return fail(400, "chunk data not followed by CRLF", "bad_http_request");
        pos_ += 2;
        step_ = Step::kChunkSize;
        break;
      }
      case Step::kTrailers: {
        // Trailer fields, each ending in CRLF, then an empty line. Dropped.
        for (;;) {
          const size_t eol = buf_.find("\r\n", pos_);
          const size_t lf = buf_.find('\n', pos_);
          if (lf != std::string::npos && (eol == std::string::npos || lf < eol + 1))
            return fail(400, "bare LF in the chunked trailers", "bad_http_request");
          if (eol == std::string::npos) {
            if (buf_.size() - trailer_start_ > lim_->max_header_bytes)
              return fail(431, "chunked trailers exceed " + std::to_string(lim_->max_header_bytes) + " bytes",
                          "headers_too_large");
            return State::kNeedMore;
          }
          const bool empty = eol == pos_;
          pos_ = eol + 2;
          if (empty) return state_ = State::kDone;
        }
      }
    }
  }
}

RequestParser::State RequestParser::parse_head(size_t head_end) {
  std::string_view head(buf_.data() + pos_, head_end - pos_);
  size_t eol = head.find("\r\n");
  const std::string_view first = head.substr(0, eol);
  // Request line: METHOD SP request-target SP HTTP-version, single spaces.
  const size_t s1 = first.find(' ');
  const size_t s2 = s1 == std::string_view::npos ? s1 : first.find(' ', s1 + 1);
  if (s1 == std::string_view::npos || s2 == std::string_view::npos || first.find(' ', s2 + 1) != std::string_view::npos ||
      s1 == 0 || s2 == s1 + 1)
    return fail(400, "malformed request line '" + printable(first) + "'", "bad_http_request");
  const std::string_view method = first.substr(0, s1), target = first.substr(s1 + 1, s2 - s1 - 1),
                         version = first.substr(s2 + 1);
  for (char c : method)
    if (!is_tchar((unsigned char)c)) return fail(400, "malformed request method", "bad_http_request");
  for (char c : target)
    if ((unsigned char)c <= 32 || (unsigned char)c == 127)
      return fail(400, "control character in the request target", "bad_http_request");
  if (version != "HTTP/1.1" && version != "HTTP/1.0")
    return fail(400, "unsupported HTTP version '" + printable(version) + "' (HTTP/1.0 or HTTP/1.1)", "bad_http_request");
  if (target.empty() || (target[0] != '/' && !(method == "OPTIONS" && target == "*")))
    return fail(400, "the request target must be an absolute path", "bad_http_request");
  req_.method = std::string(method);
  req_.target = std::string(target);
  req_.version = std::string(version);
  req_.path = req_.target.substr(0, req_.target.find('?'));
  int n_length = 0, n_te = 0;
  std::string length_value, te_value;
  while (eol != std::string_view::npos) {
    const size_t start = eol + 2;
    eol = head.find("\r\n", start);
    const std::string_view line = head.substr(start, eol == std::string_view::npos ? std::string_view::npos : eol - start);
    if (line.empty()) continue;
    if (line[0] == ' ' || line[0] == '\t')
      return fail(400, "obsolete line folding in the request headers", "bad_http_request");
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos || colon == 0)
      return fail(400, "malformed header line '" + printable(line) + "'", "bad_http_request");
    const std::string_view name = line.substr(0, colon);
    for (char c : name)
      if (!is_tchar((unsigned char)c))
        return fail(400, "invalid character in header name '" + printable(name) + "'", "bad_http_request");
    const std::string_view value = trim_ows(line.substr(colon + 1));
    for (char c : value)
      if (((unsigned char)c < 32 && c != '\t') || (unsigned char)c == 127)
        return fail(400, "control character in header '" + printable(name) + "'", "bad_http_request");
    std::string lname = lower(name);
    if (lname == "content-length") {
      ++n_length;
      length_value = std::string(value);
    } else if (lname == "transfer-encoding") {
      ++n_te;
      te_value = lower(value);
    }
    if (req_.headers.size() >= 256) return fail(431, "more than 256 request headers", "headers_too_large");
    req_.headers.emplace_back(std::move(lname), std::string(value));
  }
  if (n_te > 0 && n_length > 0)
    return fail(400, "both Transfer-Encoding and Content-Length (ambiguous framing)", "bad_http_request");
  if (n_length > 1) return fail(400, "more than one Content-Length header", "bad_http_request");
  if (n_te > 1) return fail(400, "more than one Transfer-Encoding header", "bad_http_request");
  if (n_te == 1) {
    if (req_.version == "HTTP/1.0") return fail(400, "Transfer-Encoding in an HTTP/1.0 request", "bad_http_request");
    if (te_value != "chunked")
      return fail(501, "unsupported Transfer-Encoding '" + printable(te_value) + "' (only chunked)", "not_implemented");
    step_ = Step::kChunkSize;
  } else {
    int64_t length = 0;
    if (n_length == 1 && !parse_decimal(length_value, length))
      return fail(400, "invalid Content-Length '" + printable(length_value) + "'", "bad_http_request");
    if (uint64_t(length) > lim_->max_body_bytes)
      return fail(413,
                  "the request body of " + std::to_string(length) + " bytes exceeds the limit of " +
                      std::to_string(lim_->max_body_bytes) + " bytes",
                  "request_too_large");
    left_ = length;
    step_ = Step::kLength;
    if (length > 0) req_.body.reserve(size_t(length));
  }
  std::string expect;
  for (const auto& [k, v] : req_.headers)
    if (k == "expect") expect = lower(v);
  continue_ = expect == "100-continue" && (step_ == Step::kChunkSize || left_ > 0) && buf_.size() == head_end + 4;
  return State::kNeedMore;
}

}  // namespace kvboost::server
