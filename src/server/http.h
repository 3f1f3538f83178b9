// Internal to kvboost_server: a small HTTP/1.1 server and client on POSIX sockets — exactly what
// an OpenAI-style API needs: persistent connections (HTTP/1.1 keep-alive, one request at a time),
// Content-Length bodies with a size limit, chunked responses for Server-Sent Events, and a way to
// notice that the peer went away while a response is still being produced (to cancel its work).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
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

struct HttpLimits {
  size_t max_header_bytes = 64 << 10;
  size_t max_body_bytes = 8 << 20;
  int read_timeout_ms = 30'000;  // for the whole request (slow clients cannot hold a thread forever)
  const std::atomic<bool>* abort = nullptr;  // when set and true, reading gives up (shutdown)
};

enum class ReadStatus {
  kOk,
  kClosed,          // the peer closed before sending a request
  kBadRequest,      // malformed request line / headers / length
  kTooLarge,        // Content-Length above the limit (413)
  kHeaderTooLarge,  // headers above the limit (431)
  kLengthRequired,  // a body without Content-Length (chunked uploads are not accepted) (411)
  kTimeout,         // (408)
};

const char* status_text(int status);

// One accepted connection. Owns the socket.
class HttpConn {
 public:
  explicit HttpConn(int fd) : fd_(fd) {}
  ~HttpConn();
  HttpConn(const HttpConn&) = delete;
  HttpConn& operator=(const HttpConn&) = delete;

  // Reads one request. On kTooLarge the body is not read (the response then goes out at once).
  ReadStatus read_request(HttpRequest& req, const HttpLimits& lim, std::string* why);

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
  // Waits up to timeout_ms for the start of another request (bytes already buffered count).
  // False when none came, the peer closed, or *abort became true.
  bool wait_request(int timeout_ms, const std::atomic<bool>* abort);
  // True when the peer has closed its side or reset the connection (non-blocking check). As in
  // uvicorn, a client that half-closes (shuts down its writing side) counts as gone: no request
  // follows ours on the connection, so EOF can only mean the client is leaving.
  bool peer_closed();
  // Closes the connection; when the request body was not read, discards what the client still
  // sends for a moment first, so that it sees our response rather than a reset.
  void close(bool drain_input = false);

 private:
  bool write_all(std::string_view data);
  int fd_;
  bool keep_alive_ = false;
  std::string buf_;  // bytes read past the request: the start of the next one (pipelining)
};

// A listening TCP socket.
class HttpListener {
 public:
  HttpListener() = default;
  ~HttpListener();
  // Binds host:port (port 0: an ephemeral port) and listens. Throws Error naming host and port.
  void bind(const std::string& host, int port);
  int port() const { return port_; }
  // The next connection's socket, or -1 when none arrived within timeout_ms (or the socket is closed).
  int accept(int timeout_ms);
  void close();

 private:
  int fd_ = -1;
  int port_ = 0;
};

// ---- client (tests, the load program) ------------------------------------------------------

struct HttpResponse {
  int status = 0;
  Headers headers;  // names lower-cased
  std::string body;
  std::string header(std::string_view name) const;
};

// Connects to host:port; returns the socket or -1.
int http_connect(const std::string& host, int port, int timeout_ms = 5000);

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
