// The HTTP/1.1 request parser of http.h: Boost.Beast's request_parser does the parsing (request
// line, fields, Content-Length and chunked bodies, trailers, the header and body limits); we add
// the checks where Beast 1.74 is laxer than our framing rules, each a scan of the raw head or a
// look at the fields Beast parsed, never a second parser:
//   - a bare LF or CR in the head: refused as soon as it arrives (RFC 9112 2.2 says a server MAY
//     accept a bare LF; we refuse, at once, rather than guess). Beast waits for CRLFCRLF first, so
//     "GET / HTTP/1.1\nHost: x\n\n" would only time out.
//   - obsolete line folding (RFC 9112 5.2): Beast unfolds it; we refuse it.
//   - Content-Length twice, or a list "5, 5": Beast accepts equal values; we refuse any repeat, so
//     that no proxy in front can frame the request differently (request smuggling, RFC 9112 6.3).
//   - Transfer-Encoding other than exactly "chunked" (Beast takes "gzip, chunked" as chunked):
//     501; Transfer-Encoding in HTTP/1.0: 400; Transfer-Encoding with Content-Length: 400 naming
//     both (Beast refuses it too, with a vaguer message).
//   - HTTP/1.0 or 1.1 only (Beast parses "HTTP/2.0"), and an absolute-path target (or OPTIONS *).
#include <boost/beast/core/error.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>

#include "http.h"

namespace kvboost::server {

namespace http = boost::beast::http;

struct RequestParser::Beast {
  std::optional<http::request_parser<http::string_body>> p;
  // Beast keeps a reference to the callback: it lives here, beside the parser.
  std::function<void(std::uint64_t, boost::beast::string_view, boost::beast::error_code&)> on_chunk;
  uint64_t n_chunks = 0, last_chunk = 0;
  void make(const HttpServerOptions& lim) {
    p.emplace();
    n_chunks = last_chunk = 0;
    if (!on_chunk)
      on_chunk = [this](std::uint64_t size, boost::beast::string_view, boost::beast::error_code&) {
        ++n_chunks;
        last_chunk = size;
      };
    p->on_chunk_header(on_chunk);
    p->eager(true);
    // Beast counts the final CRLFCRLF in the head; ours (check in parse) does not.
    p->header_limit(uint32_t(std::min<size_t>(lim.max_header_bytes + 4, std::numeric_limits<uint32_t>::max())));
    p->body_limit(uint64_t(lim.max_body_bytes));
  }
};

namespace {

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

std::string printable(std::string_view s) {
  std::string r;
  for (char c : s.substr(0, 64)) r += (c >= 32 && c < 127) ? c : '?';
  return r;
}

}  // namespace

RequestParser::RequestParser(const HttpServerOptions* lim) : lim_(lim), beast_(std::make_unique<Beast>()) {
  beast_->make(*lim_);
}

RequestParser::~RequestParser() = default;

RequestParser::State RequestParser::fail(int status, std::string why, std::string code) {
  err_status_ = status;
  err_ = std::move(why);
  err_code_ = std::move(code);
  return state_ = State::kError;
}

RequestParser::Phase RequestParser::phase() const {
  if (header_done_) return Phase::kBody;
  return pos_ < buf_.size() ? Phase::kHead : Phase::kIdle;
}

void RequestParser::reset() {
  buf_.erase(0, pos_);
  pos_ = scan_ = 0;
  head_checked_ = header_done_ = false;
  state_ = State::kNeedMore;
  continue_ = false;
  req_ = HttpRequest{};
  err_status_ = 0;
  err_.clear();
  err_code_.clear();
  beast_->make(*lim_);
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

// The framing fields of a complete head (request line + fields, without the final CRLFCRLF).
RequestParser::State RequestParser::check_head(size_t head_end) {
  const std::string_view head(buf_.data() + pos_, head_end - pos_);
  int n_length = 0, n_te = 0, n_fields = 0;
  std::string te_value;
  for (size_t eol = head.find("\r\n"); eol != std::string_view::npos;) {
    const size_t start = eol + 2;
    eol = head.find("\r\n", start);
    const std::string_view line = head.substr(start, eol == std::string_view::npos ? std::string_view::npos : eol - start);
    if (line.empty()) continue;
    if (line[0] == ' ' || line[0] == '\t') return fail(400, "obsolete line folding in the request headers", "bad_http_request");
    if (++n_fields > 256) return fail(431, "more than 256 request headers", "headers_too_large");
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos) continue;  // Beast refuses it
    const std::string name = lower(line.substr(0, colon));
    const std::string_view value = trim_ows(line.substr(colon + 1));
    if (name == "content-length") {
      ++n_length;
      if (value.find(',') != std::string_view::npos)
        return fail(400, "a list in Content-Length ('" + printable(value) + "')", "bad_http_request");
    } else if (name == "transfer-encoding") {
      ++n_te;
      te_value = lower(value);
    }
  }
  if (n_te > 0 && n_length > 0)
    return fail(400, "both Transfer-Encoding and Content-Length (ambiguous framing)", "bad_http_request");
  if (n_length > 1) return fail(400, "more than one Content-Length header", "bad_http_request");
  if (n_te > 1) return fail(400, "more than one Transfer-Encoding header", "bad_http_request");
  if (n_te == 1 && te_value != "chunked")
    return fail(501, "unsupported Transfer-Encoding '" + printable(te_value) + "' (only chunked)", "not_implemented");
  return State::kNeedMore;
}

// The request line and fields as Beast parsed them.
RequestParser::State RequestParser::check_fields() {
  const auto& m = beast_->p->get();
  const unsigned v = m.version();
  if (v != 10 && v != 11)
    return fail(400, "unsupported HTTP version " + std::to_string(v / 10) + "." + std::to_string(v % 10) +
                         " (HTTP/1.0 or HTTP/1.1)",
                "bad_http_request");
  const std::string_view target(m.target().data(), m.target().size());
  const std::string_view method(m.method_string().data(), m.method_string().size());
  if (target.empty() || (target[0] != '/' && !(method == "OPTIONS" && target == "*")))
    return fail(400, "the request target must be an absolute path", "bad_http_request");
  if (v == 10 && beast_->p->chunked())
    return fail(400, "Transfer-Encoding in an HTTP/1.0 request", "bad_http_request");
  req_.method = std::string(method);
  req_.target = std::string(target);
  req_.version = v == 10 ? "HTTP/1.0" : "HTTP/1.1";
  req_.path = req_.target.substr(0, req_.target.find('?'));
  for (const auto& f : m)  // trailers come later and are not copied: dropped
    req_.headers.emplace_back(lower(std::string_view(f.name_string().data(), f.name_string().size())),
                              std::string(f.value().data(), f.value().size()));
  const bool has_body = beast_->p->chunked() || beast_->p->content_length().value_or(0) > 0;
  // Only when the client waits: no body byte has come with the head.
  continue_ = has_body && lower(req_.header("expect")) == "100-continue" && pos_ == buf_.size();
  return State::kNeedMore;
}

void RequestParser::finish() {
  req_.body = std::move(beast_->p->get().body());
  state_ = State::kDone;
}

RequestParser::State RequestParser::parse() {
  if (!head_checked_) {
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
    if (check_head(head_end) == State::kError) return state_;
    head_checked_ = true;
  }
  // The head is complete: Beast takes it in one put, then as much body as there is.
  while (pos_ < buf_.size()) {
    boost::beast::error_code ec;
    const size_t n = beast_->p->put(boost::asio::buffer(buf_.data() + pos_, buf_.size() - pos_), ec);
    pos_ += n;
    if (!header_done_ && beast_->p->is_header_done()) {
      header_done_ = true;
      if (check_fields() == State::kError) return state_;
    }
    if (ec == http::error::need_more) {
      // After a chunk's data Beast waits for the whole next chunk-size line before it looks at
      // the CRLF that must end the data; we refuse a wrong byte there at once.
      if (beast_->p->chunked() && beast_->n_chunks > 0 && beast_->last_chunk > 0 && pos_ < buf_.size() &&
          (buf_[pos_] != '\r' || (pos_ + 1 < buf_.size() && buf_[pos_ + 1] != '\n')))
        return fail(400, "chunk data not followed by CRLF", "bad_http_request");
      return State::kNeedMore;
    }
    if (ec) {
      if (ec.category() != http::make_error_code(http::error::need_more).category())
        return fail(400, "malformed request: " + ec.message(), "bad_http_request");
      switch (http::error(ec.value())) {
        case http::error::header_limit:
          return fail(431, "request headers exceed " + std::to_string(lim_->max_header_bytes) + " bytes",
                      "headers_too_large");
        case http::error::body_limit:
          return fail(413, "the request body exceeds the limit of " + std::to_string(lim_->max_body_bytes) + " bytes",
                      "request_too_large");
        case http::error::bad_method: return fail(400, "malformed request line: invalid method", "bad_http_request");
        case http::error::bad_target:
          return fail(400, "malformed request line: invalid request target", "bad_http_request");
        case http::error::bad_version:
          return fail(400, "malformed request line: invalid HTTP version", "bad_http_request");
        case http::error::bad_field:
          return fail(400, "invalid character in header name, or a malformed header line", "bad_http_request");
        case http::error::bad_value: return fail(400, "control character in a header value", "bad_http_request");
        case http::error::bad_content_length: return fail(400, "invalid Content-Length", "bad_http_request");
        case http::error::bad_transfer_encoding: return fail(400, "invalid Transfer-Encoding", "bad_http_request");
        case http::error::bad_chunk:
          return fail(400, "invalid chunk size line, or chunk data not followed by CRLF", "bad_http_request");
        case http::error::bad_chunk_extension: return fail(400, "invalid chunk extension", "bad_http_request");
        case http::error::bad_obs_fold:
          return fail(400, "obsolete line folding in the request headers", "bad_http_request");
        case http::error::bad_line_ending: return fail(400, "bare CR or LF in the request", "bad_http_request");
        default: return fail(400, "malformed request: " + ec.message(), "bad_http_request");
      }
    }
    if (beast_->p->is_done()) {
      finish();
      return state_;
    }
    if (n == 0) break;
  }
  return State::kNeedMore;
}

}  // namespace kvboost::server
