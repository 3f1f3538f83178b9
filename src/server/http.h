// Internal to kvboost_server: the HTTP/1.1 server on Boost.Beast + Boost.Asio (Debian
// libboost1.74-dev, header-only), and a small client on POSIX sockets (tests, bench/server_load).
// What an OpenAI-style API needs: persistent connections (HTTP/1.1 keep-alive, pipelined requests
// answered in order), Content-Length and chunked request bodies with size limits, chunked
// responses for Server-Sent Events, and a way to notice that the peer went away while a response
// is still being produced (to cancel its work). Why not cpp-httplib's server: see
// docs/reliability.md (its thread-per-connection pool is starved by slow clients).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvboost::server {

using Headers = std::vector<std::pair<std::string, std::string>>;

struct HttpRequest {
  std::string method, target, path, version;
  Headers headers;  // names lower-cased
  std::string body;
  // The first header of that (lower-case) name, or "" when absent.
  std::string header(std::string_view name) const;
};

const char* status_text(int status);

// Limits and deadlines of the server side. Each phase of a request has its own deadline, so a
// client that trickles bytes (slowloris) is cut off after header_timeout_ms / body_timeout_ms
// however steadily it sends, and a Content-Length larger than the body times out after the body
// phase's deadline, not after some long whole-request timeout.
struct HttpServerOptions {
  size_t max_header_bytes = 64 << 10;  // request line + headers (and chunked trailers); more: 431
  size_t max_body_bytes = 8 << 20;     // Content-Length or decoded chunked body; more: 413
  int header_timeout_ms = 10'000;      // first byte of a request -> end of its headers; then 408
  int body_timeout_ms = 10'000;        // end of headers -> end of body; then 408
  int keep_alive_ms = 5'000;           // idle between requests, then closed; 0: one request each
  int send_timeout_ms = 30'000;        // a response write that makes no progress this long fails
  int max_connections = 4096;          // open connections in all; at the cap the oldest connection
                                       // with no request in progress (idle, or still sending its
                                       // headers) is closed to make room; if none, 503
  int max_connections_per_client = 128;  // per client IP address; more: 429 at once
  int n_workers = 16;                  // threads running handlers (complete requests only)
  // The body of an error the layer answers itself (400, 408, 413, 429, 431, 501, 503), and a
  // hook that counts it. Both optional.
  std::function<std::string(int status, const std::string& message, const std::string& code)> error_body;
  std::function<void(int status)> on_error;
};

// The incremental HTTP/1.1 request parser: Boost.Beast's request_parser (header_limit =
// max_header_bytes, body_limit = max_body_bytes, chunked bodies decoded by Beast), plus the few
// checks where Beast is laxer than our framing rules (RFC 9112): a bare LF or CR anywhere in the
// head is refused at once (before the head is complete), no obsolete line folding, at most one
// Content-Length and no list in it, Transfer-Encoding exactly "chunked", never together with
// Content-Length and never in HTTP/1.0, HTTP/1.0 or 1.1 only, an absolute-path target.
class RequestParser {
 public:
  enum class State { kNeedMore, kDone, kError };
  enum class Phase { kIdle, kHead, kBody };
  explicit RequestParser(const HttpServerOptions* lim);
  ~RequestParser();
  RequestParser(const RequestParser&) = delete;
  RequestParser& operator=(const RequestParser&) = delete;
  // Feeds more bytes. kDone: take() the request; the bytes after it stay buffered (pipelining)
  // and reset() starts parsing them. kError: error_status()/error()/error_code() say why.
  State feed(std::string_view data);
  State state() const { return state_; }
  Phase phase() const;
  HttpRequest take() { return std::move(req_); }
  void reset();          // the next request, starting with the buffered bytes
  bool want_continue();  // true once, when a "100 Continue" should be sent
  int error_status() const { return err_status_; }
  const std::string& error() const { return err_; }
  const std::string& error_code() const { return err_code_; }

 private:
  struct Beast;  // the Beast parser (http_parser.cpp), kept out of this header
  State fail(int status, std::string why, std::string code);
  State parse();
  State check_head(size_t head_end);  // our checks on a complete head, before Beast sees it
  State check_fields();               // our checks on the fields Beast parsed
  void finish();

  const HttpServerOptions* lim_;
  std::unique_ptr<Beast> beast_;
  std::string buf_;
  size_t pos_ = 0;   // bytes of buf_ consumed (by Beast, or leading CRLFs)
  size_t scan_ = 0;  // head: bytes already checked for bare CR/LF
  bool head_checked_ = false, header_done_ = false;
  State state_ = State::kNeedMore;
  bool continue_ = false;
  HttpRequest req_;
  int err_status_ = 0;
  std::string err_, err_code_;
};

// One connection while a handler answers its request. Does not own the socket (the server does).
class HttpConn {
 public:
  HttpConn(int fd, int send_timeout_ms) : fd_(fd), send_timeout_ms_(send_timeout_ms) {}
  HttpConn(const HttpConn&) = delete;
  HttpConn& operator=(const HttpConn&) = delete;

  // A complete response. Returns false when the peer is gone.
  bool send_response(int status, std::string_view content_type, std::string_view body,
                     const Headers& extra = {});
  // A chunked (streamed) response: begin, any number of chunks, end.
  bool begin_stream(int status, std::string_view content_type, const Headers& extra = {});
  bool send_chunk(std::string_view data);
  bool end_stream();
  // Whether responses say "Connection: keep-alive" (the server then reads another request on the
  // connection) or "Connection: close". Off after a failed write.
  void set_keep_alive(bool on) { keep_alive_ = on; }
  bool keep_alive() const { return keep_alive_; }
  // Headers added to every response of the current request (e.g. CORS).
  void set_extra_headers(Headers h) { extra_ = std::move(h); }
  // True when the peer has closed its side or reset the connection (non-blocking check). As in
  // uvicorn, a client that half-closes (shuts down its writing side) counts as gone: no request
  // follows ours on the connection, so EOF can only mean the client is leaving.
  bool peer_closed();
  const std::string& peer() const { return peer_; }  // the client's IP address
  void set_peer(std::string p) { peer_ = std::move(p); }

 private:
  bool write_all(std::string_view data);
  std::string head_of(int status, std::string_view content_type, const Headers& extra) const;
  int fd_;
  int send_timeout_ms_;
  bool keep_alive_ = false;
  bool failed_ = false;
  Headers extra_;
  std::string peer_;
};

// The server side: one Asio io_context thread accepts and reads every connection and parses
// requests (Beast) without blocking; only complete requests reach the bounded pool of handler
// threads. Slow or
// idle clients therefore cost a socket and a buffer, never a thread, and cannot starve others.
// After a handler the connection goes back to the event loop (keep-alive) or is closed.
class HttpServer {
 public:
  using Handler = std::function<void(HttpConn&, HttpRequest&)>;
  HttpServer(HttpServerOptions opt, Handler handler);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;
  // Binds host:port (port 0: an ephemeral port) and listens. Throws Error naming host and port.
  void bind(const std::string& host, int port);
  int port() const;
  void start();           // the event loop and the handler threads
  void stop_accepting();  // closes the listening socket; open connections go on
  // Closes idle connections, lets running handlers finish (they should watch their own abort
  // flag), joins every thread. Idempotent.
  void stop();
  int open_connections() const;
  int64_t refused() const;  // connections refused or evicted by the caps

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// ---- client (tests, the load program) ------------------------------------------------------

struct HttpResponse {
  int status = 0;
  Headers headers;  // names lower-cased
  std::string body;
  std::string header(std::string_view name) const;
};

// Connects to host:port (from the local address `source` when given, e.g. "127.0.0.2" to act as
// another client on loopback); returns the socket or -1.
int http_connect(const std::string& host, int port, int timeout_ms = 5000, const std::string& source = "");

// One request on a new connection, reading the whole response (chunked bodies decoded).
// status 0 when the connection failed or broke before a response; `why` then says why.
HttpResponse http_request(const std::string& host, int port, const std::string& method,
                          const std::string& path, const std::string& body = "",
                          const Headers& headers = {}, int timeout_ms = 60'000,
                          std::string* why = nullptr);

// A streamed response, read incrementally: Server-Sent Events of a chunked body.
class HttpStream {
 public:
  HttpStream() = default;
  ~HttpStream();
  HttpStream(const HttpStream&) = delete;
  HttpStream& operator=(const HttpStream&) = delete;
  // Sends the request and reads the status line and headers. False on connection failure.
  bool open(const std::string& host, int port, const std::string& method, const std::string& path,
            const std::string& body, const Headers& headers = {}, int timeout_ms = 60'000);
  int status() const { return status_; }
  const Headers& headers() const { return headers_; }
  // The next SSE event's data (the text after "data: "), false at the end of the body.
  bool next_event(std::string& data);
  // The rest of the body (for non-stream responses).
  std::string read_all();
  // Abruptly closes the connection (a client going away mid-stream).
  void close();

 private:
  bool fill();                  // reads more raw bytes into raw_
  bool next_body_bytes();       // decodes more of the body into body_ (chunked or not)
  int fd_ = -1;
  int timeout_ms_ = 60'000;
  int status_ = 0;
  Headers headers_;
  std::string raw_, body_;
  bool chunked_ = false, body_done_ = false;
  int64_t content_left_ = -1;   // unchunked with Content-Length
  int64_t chunk_left_ = 0;      // chunked: bytes left in the current chunk
};

}  // namespace kvboost::server
