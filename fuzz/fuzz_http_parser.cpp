// The HTTP request parser (src/server/http_parser.cpp) on arbitrary bytes, fed in pieces whose
// sizes the first byte chooses, then the pipelined rest: it must end in a request, an error with
// a 4xx/5xx status and a message, or a wish for more bytes -- never a crash or a body over the
// limit.
#include <cstdint>
#include <string_view>

#include "http.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using kvboost::server::RequestParser;
  kvboost::server::HttpServerOptions o;
  o.max_header_bytes = 4096;
  o.max_body_bytes = 8192;
  RequestParser p(&o);
  if (size == 0) return 0;
  const size_t step = 1 + data[0] % 64;
  std::string_view in(reinterpret_cast<const char*>(data) + 1, size - 1);
  for (int requests = 0; requests < 64;) {
    RequestParser::State st = p.state();
    while (st == RequestParser::State::kNeedMore && !in.empty()) {
      const size_t n = std::min(step, in.size());
      st = p.feed(in.substr(0, n));
      in.remove_prefix(n);
    }
    if (st == RequestParser::State::kError) {
      if (p.error_status() < 400 || p.error_status() > 599 || p.error().empty()) __builtin_trap();
      return 0;
    }
    if (st != RequestParser::State::kDone) return 0;
    const kvboost::server::HttpRequest r = p.take();
    if (r.body.size() > o.max_body_bytes || r.method.empty() || r.target.empty()) __builtin_trap();
    p.reset();
    ++requests;
  }
  return 0;
}
