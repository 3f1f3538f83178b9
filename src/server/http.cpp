// HTTP/1.1 on POSIX sockets, the parts a handler and a client use: responses on a connection, and
// the small client of the tests and bench/server_load. The event loop is in http_server.cpp, the
// request parser in http_parser.cpp.
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
    case 204: return "No Content";
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
    case 507: return "Insufficient Storage";
    default: return "Unknown";
  }
}

// ---- HttpConn ----------------------------------------------------------------------------------

// The socket is non-blocking (the event loop owns it); a write waits for room up to
// send_timeout_ms without progress, so a client that stops reading cannot hold a handler forever.
bool HttpConn::write_all(std::string_view data) {
  if (fd_ < 0 || failed_) return false;
  while (!data.empty()) {
    const ssize_t n = ::send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd_, POLLOUT, 0};
      const int r = ::poll(&p, 1, send_timeout_ms_);
      if (r > 0 && !(p.revents & (POLLERR | POLLHUP | POLLNVAL))) continue;
      if (r < 0 && errno == EINTR) continue;
    }
    if (n <= 0) {
      keep_alive_ = false;
      failed_ = true;
      return false;
    }
    data.remove_prefix(size_t(n));
  }
  return true;
}

std::string HttpConn::head_of(int status, std::string_view content_type, const Headers& extra) const {
  std::string h = "HTTP/1.1 " + std::to_string(status) + " " + status_text(status) + "\r\n";
  if (!content_type.empty()) h += "Content-Type: " + std::string(content_type) + "\r\n";
  for (const auto& [k, v] : extra_) h += k + ": " + v + "\r\n";
  for (const auto& [k, v] : extra) h += k + ": " + v + "\r\n";
  h += keep_alive_ ? "Connection: keep-alive\r\n" : "Connection: close\r\n";
  return h;
}

bool HttpConn::send_response(int status, std::string_view content_type, std::string_view body,
                             const Headers& extra) {
  std::string h = head_of(status, content_type, extra);
  h += "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n";
  h.append(body);
  return write_all(h);
}

bool HttpConn::begin_stream(int status, std::string_view content_type, const Headers& extra) {
  std::string h = head_of(status, content_type, extra);
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
  if (fd_ < 0 || failed_) return true;
  pollfd p{fd_, POLLIN | POLLRDHUP, 0};
  const int r = ::poll(&p, 1, 0);
  if (r <= 0) return false;
  if (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) return true;
  if (p.revents & POLLIN) {
    // Readable with no request pending: either EOF (closed) or pipelined bytes (kept).
    char c;
    const ssize_t n = ::recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0) return true;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return true;
  }
  return false;
}

// ---- client ------------------------------------------------------------------------------------

int http_connect(const std::string& host, int port, int timeout_ms, const std::string& source) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0) return -1;
  int fd = -1;
  for (addrinfo* a = res; a && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    if (!source.empty() && a->ai_family == AF_INET) {
      sockaddr_in src{};
      src.sin_family = AF_INET;
      if (::inet_pton(AF_INET, source.c_str(), &src.sin_addr) != 1 ||
          ::bind(fd, reinterpret_cast<sockaddr*>(&src), sizeof src) != 0) {
        ::close(fd);
        fd = -1;
        continue;
      }
    }
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
