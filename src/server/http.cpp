// Minimal HTTP/1.1 on POSIX sockets: see http.h for what it does and does not do.
#include "http.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "kvboost/common.h"

namespace kvboost::server {

namespace {

std::string lower(std::string_view s) {
  std::string r(s);
  for (char& c : r) c = char(std::tolower((unsigned char)c));
  return r;
}

std::string trim(std::string_view s) {
  size_t a = 0, b = s.size();
  while (a < b && (s[a] == ' ' || s[a] == '\t')) ++a;
  while (b > a && (s[b - 1] == ' ' || s[b - 1] == '\t' || s[b - 1] == '\r')) --b;
  return std::string(s.substr(a, b - a));
}

std::string find_header(const Headers& h, std::string_view name) {
  for (const auto& [k, v] : h)
    if (k == name) return v;
  return {};
}

// Waits until fd is readable (true) or the deadline passes (false).
bool wait_readable(int fd, double deadline_ms, const std::atomic<bool>* abort = nullptr) {
  for (;;) {
    if (abort && abort->load()) return false;
    const double left = deadline_ms - now_ms();
    if (left <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    const int r = ::poll(&p, 1, int(std::min(left, 100.0)) + 1);
    if (r > 0) return true;
    if (r < 0 && errno != EINTR) return true;  // let the read report the error
  }
}

// Parses "Status-Line / request line + headers" from `head` (without the final blank line).
bool parse_header_lines(std::string_view head, std::string& first, Headers& headers) {
  size_t pos = head.find("\r\n");
  first = std::string(head.substr(0, pos));
  while (pos != std::string_view::npos) {
    const size_t start = pos + 2;
    pos = head.find("\r\n", start);
    std::string_view line = head.substr(start, pos == std::string_view::npos ? std::string_view::npos : pos - start);
    if (line.empty()) continue;
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos || colon == 0) return false;
    headers.emplace_back(lower(trim(line.substr(0, colon))), trim(line.substr(colon + 1)));
  }
  return true;
}

bool parse_size(const std::string& s, int64_t& out, int base = 10) {
  if (s.empty() || s.size() > 18) return false;
  int64_t v = 0;
  for (char c : s) {
    int d;
    if (c >= '0' && c <= '9') d = c - '0';
    else if (base == 16 && c >= 'a' && c <= 'f') d = c - 'a' + 10;
    else if (base == 16 && c >= 'A' && c <= 'F') d = c - 'A' + 10;
    else return false;
    v = v * base + d;
  }
  out = v;
  return true;
}

}  // namespace

std::string HttpRequest::header(std::string_view name) const { return find_header(headers, name); }
std::string HttpResponse::header(std::string_view name) const { return find_header(headers, name); }

const char* status_text(int status) {
  switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 411: return "Length Required";
    case 413: return "Payload Too Large";
    case 415: return "Unsupported Media Type";
    case 422: return "Unprocessable Entity";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    default: return "Unknown";
  }
}

// ---- HttpConn ----------------------------------------------------------------------------------

HttpConn::~HttpConn() { close(); }

ReadStatus HttpConn::read_request(HttpRequest& req, const HttpLimits& lim, std::string* why) {
  const double deadline = now_ms() + lim.read_timeout_ms;
  auto say = [&](const std::string& s) {
    if (why) *why = s;
  };
  std::string data;
  data.swap(buf_);  // a pipelined request's first bytes
  size_t head_end;
  char tmp[16384];
  for (;;) {
    head_end = data.find("\r\n\r\n");
    if (head_end != std::string::npos) break;
    if (data.size() > lim.max_header_bytes) {
      say("request headers exceed " + std::to_string(lim.max_header_bytes) + " bytes");
      return ReadStatus::kHeaderTooLarge;
    }
    if (!wait_readable(fd_, deadline, lim.abort)) {
      say("timed out reading the request headers");
      return data.empty() ? ReadStatus::kClosed : ReadStatus::kTimeout;
    }
    const ssize_t n = ::recv(fd_, tmp, sizeof tmp, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      say("connection closed in the request headers");
      return data.empty() ? ReadStatus::kClosed : ReadStatus::kBadRequest;
    }
    data.append(tmp, size_t(n));
  }
  if (head_end > lim.max_header_bytes) {
    say("request headers exceed " + std::to_string(lim.max_header_bytes) + " bytes");
    return ReadStatus::kHeaderTooLarge;
  }
  std::string first;
  if (!parse_header_lines(std::string_view(data).substr(0, head_end), first, req.headers)) {
    say("malformed header line");
    return ReadStatus::kBadRequest;
  }
  // Request line: METHOD SP TARGET SP VERSION
  const size_t s1 = first.find(' '), s2 = first.rfind(' ');
  if (s1 == std::string::npos || s2 == s1) {
    say("malformed request line");
    return ReadStatus::kBadRequest;
  }
  req.method = first.substr(0, s1);
  req.target = first.substr(s1 + 1, s2 - s1 - 1);
  req.version = first.substr(s2 + 1);
  if (req.version.rfind("HTTP/1.", 0) != 0 || req.target.empty() || req.target[0] != '/') {
    say("malformed request line");
    return ReadStatus::kBadRequest;
  }
  req.path = req.target.substr(0, req.target.find('?'));
  data.erase(0, head_end + 4);

  const std::string te = lower(req.header("transfer-encoding"));
  const std::string cl = req.header("content-length");
  if (!te.empty() && te != "identity") {
    say("chunked request bodies are not accepted; send Content-Length");
    return ReadStatus::kLengthRequired;
  }
  int64_t length = 0;
  if (!cl.empty() && !parse_size(cl, length)) {
    say("invalid Content-Length '" + cl + "'");
    return ReadStatus::kBadRequest;
  }
  if (size_t(length) > lim.max_body_bytes) {
    say("the request body of " + std::to_string(length) + " bytes exceeds the limit of " +
        std::to_string(lim.max_body_bytes) + " bytes");
    return ReadStatus::kTooLarge;
  }
  if (length > 0 && lower(req.header("expect")) == "100-continue" && data.empty())
    write_all("HTTP/1.1 100 Continue\r\n\r\n");
  while (int64_t(data.size()) < length) {
    if (!wait_readable(fd_, deadline, lim.abort)) {
      say("timed out reading the request body");
      return ReadStatus::kTimeout;
    }
    const ssize_t n = ::recv(fd_, tmp, std::min<size_t>(sizeof tmp, size_t(length) - data.size()), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      say("connection closed in the request body");
      return ReadStatus::kBadRequest;
    }
    data.append(tmp, size_t(n));
  }
  req.body = data.substr(0, size_t(length));
  buf_ = data.substr(size_t(length));
  return ReadStatus::kOk;
}

bool HttpConn::write_all(std::string_view data) {
  if (fd_ < 0) return false;
  while (!data.empty()) {
    const ssize_t n = ::send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      keep_alive_ = false;
      return false;
    }
    data.remove_prefix(size_t(n));
  }
  return true;
}

static std::string head_of(int status, std::string_view content_type, const Headers& extra, bool keep_alive) {
  std::string h = "HTTP/1.1 " + std::to_string(status) + " " + status_text(status) + "\r\n";
  if (!content_type.empty()) h += "Content-Type: " + std::string(content_type) + "\r\n";
  for (const auto& [k, v] : extra) h += k + ": " + v + "\r\n";
  h += keep_alive ? "Connection: keep-alive\r\n" : "Connection: close\r\n";
  return h;
}

bool HttpConn::wait_request(int timeout_ms, const std::atomic<bool>* abort) {
  if (fd_ < 0) return false;
  if (!buf_.empty()) return true;
  if (!wait_readable(fd_, now_ms() + timeout_ms, abort)) return false;
  char c;
  const ssize_t n = ::recv(fd_, &c, 1, MSG_PEEK);
  return n > 0;
}

bool HttpConn::send_response(int status, std::string_view content_type, std::string_view body,
                             const Headers& extra) {
  std::string h = head_of(status, content_type, extra, keep_alive_);
  h += "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n";
  h.append(body);
  return write_all(h);
}

bool HttpConn::begin_stream(int status, std::string_view content_type, const Headers& extra) {
  std::string h = head_of(status, content_type, extra, keep_alive_);
  h += "Transfer-Encoding: chunked\r\n\r\n";
  return write_all(h);
}

bool HttpConn::send_chunk(std::string_view data) {
  if (data.empty()) return true;  // an empty chunk would end the body
  char len[32];
  std::snprintf(len, sizeof len, "%zx\r\n", data.size());
  std::string c = len;
  c.append(data);
  c += "\r\n";
  return write_all(c);
}

bool HttpConn::end_stream() { return write_all("0\r\n\r\n"); }

bool HttpConn::peer_closed() {
  if (fd_ < 0) return true;
  pollfd p{fd_, POLLIN | POLLRDHUP, 0};
  const int r = ::poll(&p, 1, 0);
  if (r <= 0) return false;
  if (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) return true;
  if (p.revents & POLLIN) {
    // Readable with no request pending: either EOF (closed) or unexpected bytes (kept).
    char c;
    const ssize_t n = ::recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0) return true;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return true;
  }
  return false;
}

void HttpConn::close(bool drain_input) {
  if (fd_ < 0) return;
  ::shutdown(fd_, SHUT_WR);
  if (drain_input) {
    // Lingering close: read and drop what the client still sends (bounded in time and bytes).
    const double deadline = now_ms() + 500;
    size_t total = 0;
    char tmp[16384];
    while (total < (64u << 20) && wait_readable(fd_, deadline)) {
      const ssize_t n = ::recv(fd_, tmp, sizeof tmp, 0);
      if (n <= 0) break;
      total += size_t(n);
    }
  }
  ::close(fd_);
  fd_ = -1;
}

// ---- HttpListener ------------------------------------------------------------------------------

HttpListener::~HttpListener() { close(); }

void HttpListener::bind(const std::string& host, int port) {
  if (port < 0 || port > 65535) fail("port ", port, " is out of range [0, 65535]");
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  const int gai = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &res);
  if (gai != 0) fail("cannot resolve host '", host, "': ", gai_strerror(gai));
  std::string last_err = "no address";
  for (addrinfo* a = res; a; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      last_err = std::strerror(errno);
      continue;
    }
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd, 128) != 0) {
      last_err = std::strerror(errno);
      ::close(fd);
      continue;
    }
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
    port_ = ss.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                                     : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
    fd_ = fd;
    break;
  }
  ::freeaddrinfo(res);
  if (fd_ < 0) fail("cannot listen on ", host, ":", port, ": ", last_err);
}

int HttpListener::accept(int timeout_ms) {
  if (fd_ < 0) return -1;
  pollfd p{fd_, POLLIN, 0};
  if (::poll(&p, 1, timeout_ms) <= 0) return -1;
  const int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
  if (c < 0) return -1;
  const int one = 1;
  ::setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);  // stream tokens as they come
  return c;
}

void HttpListener::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

// ---- client ------------------------------------------------------------------------------------

int http_connect(const std::string& host, int port, int timeout_ms) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0) return -1;
  int fd = -1;
  for (addrinfo* a = res; a && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(res);
  if (fd >= 0) {
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    (void)timeout_ms;
  }
  return fd;
}

HttpStream::~HttpStream() { close(); }

void HttpStream::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

bool HttpStream::fill() {
  if (fd_ < 0) return false;
  if (!wait_readable(fd_, now_ms() + timeout_ms_)) return false;
  char tmp[16384];
  for (;;) {
    const ssize_t n = ::recv(fd_, tmp, sizeof tmp, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    raw_.append(tmp, size_t(n));
    return true;
  }
}

bool HttpStream::open(const std::string& host, int port, const std::string& method, const std::string& path,
                      const std::string& body, const Headers& headers, int timeout_ms) {
  timeout_ms_ = timeout_ms;
  fd_ = http_connect(host, port, timeout_ms);
  if (fd_ < 0) return false;
  std::string req = method + " " + path + " HTTP/1.1\r\nHost: " + host + ":" + std::to_string(port) + "\r\n";
  bool has_ct = false;
  for (const auto& [k, v] : headers) {
    req += k + ": " + v + "\r\n";
    if (lower(k) == "content-type") has_ct = true;
  }
  if (!body.empty() && !has_ct) req += "Content-Type: application/json\r\n";
  if (method != "GET" || !body.empty()) req += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  req += "\r\n";
  req += body;
  std::string_view d = req;
  while (!d.empty()) {
    const ssize_t n = ::send(fd_, d.data(), d.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // the server may answer (413) before reading everything
    d.remove_prefix(size_t(n));
  }
  for (;;) {
    size_t end = raw_.find("\r\n\r\n");
    if (end != std::string::npos) {
      std::string first;
      Headers h;
      if (!parse_header_lines(std::string_view(raw_).substr(0, end), first, h)) return false;
      raw_.erase(0, end + 4);
      // "HTTP/1.1 100 Continue": skip it
      if (first.size() >= 12 && first.compare(9, 3, "100") == 0) continue;
      if (first.size() < 12) return false;
      status_ = std::atoi(first.c_str() + 9);
      headers_ = std::move(h);
      chunked_ = lower(find_header(headers_, "transfer-encoding")) == "chunked";
      const std::string cl = find_header(headers_, "content-length");
      int64_t v;
      if (!chunked_ && !cl.empty() && parse_size(cl, v)) content_left_ = v;
      return true;
    }
    if (!fill()) return false;
  }
}

bool HttpStream::next_body_bytes() {
  if (body_done_) return false;
  if (!chunked_) {
    if (content_left_ == 0) {
      body_done_ = true;
      return false;
    }
    if (raw_.empty() && !fill()) {
      body_done_ = true;
      return false;
    }
    size_t take = raw_.size();
    if (content_left_ > 0) take = std::min<size_t>(take, size_t(content_left_));
    body_.append(raw_, 0, take);
    raw_.erase(0, take);
    if (content_left_ > 0) content_left_ -= int64_t(take);
    return true;
  }
  for (;;) {
    if (chunk_left_ > 0) {
      if (raw_.empty() && !fill()) {
        body_done_ = true;
        return false;
      }
      const size_t take = std::min<size_t>(raw_.size(), size_t(chunk_left_));
      body_.append(raw_, 0, take);
      raw_.erase(0, take);
      chunk_left_ -= int64_t(take);
      if (chunk_left_ == 0) chunk_left_ = -2;  // expect CRLF
      return true;
    }
    if (chunk_left_ == -2) {
      while (raw_.size() < 2)
        if (!fill()) {
          body_done_ = true;
          return false;
        }
      raw_.erase(0, 2);
      chunk_left_ = 0;
    }
    size_t eol = raw_.find("\r\n");
    while (eol == std::string::npos) {
      if (!fill()) {
        body_done_ = true;
        return false;
      }
      eol = raw_.find("\r\n");
    }
    int64_t n = 0;
    std::string hex = raw_.substr(0, eol);
    hex = hex.substr(0, hex.find(';'));
    if (!parse_size(trim(hex), n, 16)) {
      body_done_ = true;
      return false;
    }
    raw_.erase(0, eol + 2);
    if (n == 0) {
      body_done_ = true;
      return false;
    }
    chunk_left_ = n;
  }
}

bool HttpStream::next_event(std::string& data) {
  for (;;) {
    // An event ends with a blank line.
    const size_t end = body_.find("\n\n");
    if (end != std::string::npos) {
      std::string ev = body_.substr(0, end);
      body_.erase(0, end + 2);
      std::string out;
      bool any = false;
      size_t pos = 0;
      while (pos <= ev.size()) {
        size_t nl = ev.find('\n', pos);
        if (nl == std::string::npos) nl = ev.size();
        std::string_view line(ev.data() + pos, nl - pos);
        if (line.rfind("data:", 0) == 0) {
          line.remove_prefix(5);
          if (!line.empty() && line[0] == ' ') line.remove_prefix(1);
          if (any) out += '\n';
          out.append(line);
          any = true;
        }
        pos = nl + 1;
      }
      if (!any) continue;  // a comment or keep-alive
      data = std::move(out);
      return true;
    }
    if (!next_body_bytes()) return false;
  }
}

std::string HttpStream::read_all() {
  while (next_body_bytes()) {
  }
  std::string r = std::move(body_);
  body_.clear();
  return r;
}

HttpResponse http_request(const std::string& host, int port, const std::string& method, const std::string& path,
                          const std::string& body, const Headers& headers, int timeout_ms, std::string* why) {
  HttpResponse r;
  HttpStream s;
  if (!s.open(host, port, method, path, body, headers, timeout_ms)) {
    if (why) *why = "no response from " + host + ":" + std::to_string(port);
    return r;
  }
  r.status = s.status();
  r.headers = s.headers();
  r.body = s.read_all();
  return r;
}

}  // namespace kvboost::server
