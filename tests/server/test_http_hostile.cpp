// The HTTP layer against hostile clients (issue 23), over real HTTP on loopback: strict framing
// (request smuggling), per-phase read deadlines, slow-client starvation, connection caps, chunked
// request bodies, CORS. Clients on other loopback addresses (127.0.0.2, ...) act as other hosts.
// Waits are bounded (a receive timeout), not timed assertions: a server that hangs fails the test.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <memory>
#include <thread>

#include <nlohmann/json.hpp>

#include "http.h"
#include "kvboost/model.h"
#include "kvboost/server.h"
#include "testing/fixture.h"
#include "test_util.h"

namespace kvboost {
namespace {

using json = nlohmann::ordered_json;
using server::HttpServerOptions;
using server::RequestParser;

// ---- the parser alone ----------------------------------------------------------------------

struct Parsed {
  RequestParser::State state;
  int status = 0;
  std::string error;
  server::HttpRequest req;
};

Parsed parse(const std::string& bytes, size_t max_body = 1 << 20) {
  static HttpServerOptions o;
  o.max_body_bytes = max_body;
  RequestParser p(&o);
  Parsed r;
  r.state = p.feed(bytes);
  r.status = p.error_status();
  r.error = p.error();
  if (r.state == RequestParser::State::kDone) r.req = p.take();
  return r;
}

TEST(HttpParser, StrictFraming) {
  using S = RequestParser::State;
  struct Case {
    const char* what;
    std::string bytes;
    S state;
    int status;
    const char* says;
  };
  const std::vector<Case> cases = {
      {"two different Content-Length", "POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 50\r\n\r\nhello", S::kError,
       400, "Content-Length"},
      {"two equal Content-Length", "POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello", S::kError, 400,
       "Content-Length"},
      {"Content-Length list", "POST / HTTP/1.1\r\nContent-Length: 5, 5\r\n\r\nhello", S::kError, 400, "Content-Length"},
      {"Transfer-Encoding with Content-Length",
       "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n", S::kError, 400,
       "Transfer-Encoding"},
      {"unknown Transfer-Encoding", "POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", S::kError, 501,
       "Transfer-Encoding"},
      {"bare LF ends the request line (refused before the head is complete)", "GET / HTTP/1.1\nHost: x", S::kError, 400,
       "bare LF"},
      {"bare LF in headers", "GET / HTTP/1.1\r\nHost: x\n\n", S::kError, 400, "bare LF"},
      {"bare CR", "GET / HTTP/1.1\rHost: x\r\n\r\n", S::kError, 400, "bare CR"},
      {"obs-fold", "GET / HTTP/1.1\r\nX-A: a\r\n b\r\n\r\n", S::kError, 400, "folding"},
      {"space before the colon", "GET / HTTP/1.1\r\nContent-Length : 5\r\n\r\n", S::kError, 400, "header name"},
      {"negative Content-Length", "POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n", S::kError, 400, "Content-Length"},
      {"huge Content-Length", "POST / HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n", S::kError, 400,
       "Content-Length"},
      {"body over the limit", "POST / HTTP/1.1\r\nContent-Length: 2000000\r\n\r\n", S::kError, 413, "limit"},
      {"HTTP/2 preface", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", S::kError, 400, "version"},
      {"double space in the request line", "GET  / HTTP/1.1\r\n\r\n", S::kError, 400, "request line"},
      {"NUL in a header value", std::string("GET / HTTP/1.1\r\nX-A: a\0b\r\n\r\n", 28), S::kError, 400, "control"},
      {"relative target", "GET index HTTP/1.1\r\n\r\n", S::kError, 400, "target"},
      {"bad chunk size", "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", S::kError, 400, "chunk size"},
      {"chunk data without CRLF", "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcXY", S::kError, 400,
       "CRLF"},
      {"chunked over the limit", "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nFFFFFFFF\r\n", S::kError, 413,
       "limit"},
      {"Transfer-Encoding in HTTP/1.0", "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", S::kError, 400,
       "HTTP/1.0"},
      {"incomplete head", "GET / HTTP/1.1\r\nHost: x\r\n", S::kNeedMore, 0, ""},
      {"short body", "POST / HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc", S::kNeedMore, 0, ""},
      {"complete GET", "GET /health HTTP/1.1\r\nHost: x\r\n\r\n", S::kDone, 0, ""},
      {"leading CRLF ignored", "\r\n\r\nGET /health HTTP/1.1\r\n\r\n", S::kDone, 0, ""},
      {"OPTIONS *", "OPTIONS * HTTP/1.1\r\n\r\n", S::kDone, 0, ""},
  };
  for (const Case& c : cases) {
    const Parsed p = parse(c.bytes);
    EXPECT_EQ(p.state, c.state) << c.what << ": " << p.error;
    EXPECT_EQ(p.status, c.status) << c.what << ": " << p.error;
    EXPECT_NE(p.error.find(c.says), std::string::npos) << c.what << ": '" << p.error << "' should say '" << c.says << "'";
  }
}

TEST(HttpParser, ChunkedBodiesAndPipelining) {
  HttpServerOptions o;
  RequestParser p(&o);
  const std::string two = "POST /a HTTP/1.1\r\nTransfer-Encoding: Chunked\r\n\r\n5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\n"
                          "X-Trailer: t\r\n\r\nGET /b HTTP/1.1\r\n\r\n";
  // Byte by byte: the parser is incremental.
  RequestParser::State st = RequestParser::State::kNeedMore;
  size_t i = 0;
  for (; i < two.size() && st == RequestParser::State::kNeedMore; ++i) st = p.feed(two.substr(i, 1));
  ASSERT_EQ(st, RequestParser::State::kDone) << p.error();
  server::HttpRequest a = p.take();
  EXPECT_EQ(a.path, "/a");
  EXPECT_EQ(a.body, "hello world");
  p.feed(two.substr(i));
  p.reset();
  ASSERT_EQ(p.state(), RequestParser::State::kDone) << p.error();
  EXPECT_EQ(p.take().path, "/b");
}

// ---- the server ----------------------------------------------------------------------------

const std::string& tiny_dir() {
  static const std::string dir = [] {
    const std::string d = test::make_temp_dir("http_hostile_tiny");
    write_fixture_model(d, fixture_preset("tiny"));
    return d;
  }();
  return dir;
}

Engine& tiny_engine() {
  static std::unique_ptr<Engine> e = [] {
    EngineOptions eo;
    eo.max_batch = 4;
    return Engine::load(tiny_dir(), eo);
  }();
  return *e;
}

struct TestServer {
  std::unique_ptr<Server> srv;
  int port = 0;
  explicit TestServer(ServerOptions o = {}) {
    signal(SIGPIPE, SIG_IGN);
    o.host = "127.0.0.1";
    o.port = 0;
    o.model_dir = tiny_dir();
    o.model_name = "tiny";
    srv = std::make_unique<Server>(tiny_engine(), o);
    srv->start();
    port = srv->port();
  }
};

// Sends raw bytes from `source` and reads until the server closes or `wait_s` passes without data.
std::string talk(int port, const std::string& bytes, double wait_s = 3, const std::string& source = "") {
  const int fd = server::http_connect("127.0.0.1", port, 5000, source);
  if (fd < 0) return "<connect failed>";
  timeval tv{time_t(wait_s), suseconds_t((wait_s - double(time_t(wait_s))) * 1e6)};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  if (!bytes.empty()) (void)!::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
  std::string got;
  char buf[4096];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) got.append(buf, size_t(n));
  ::close(fd);
  return got;
}

int count_responses(const std::string& s) {
  int n = 0;
  for (size_t p = 0; (p = s.find("HTTP/1.1 ", p)) != std::string::npos; ++p) ++n;
  return n;
}

void raise_fd_limit() {
  rlimit r{};
  getrlimit(RLIMIT_NOFILE, &r);
  r.rlim_cur = r.rlim_max;
  setrlimit(RLIMIT_NOFILE, &r);
}

TEST(HttpHostile, SmugglingAttemptsAre400AndCloseTheConnection) {
  TestServer s;
  // Two different Content-Length: the bytes after the short body must not become a request.
  const std::string smuggled = "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n";
  std::string got = talk(s.port, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: " +
                                         std::to_string(2 + smuggled.size()) + "\r\n\r\n{}" + smuggled);
  EXPECT_EQ(got.rfind("HTTP/1.1 400", 0), 0u) << got;
  EXPECT_NE(got.find("Content-Length"), std::string::npos) << "the error names the problem: " << got;
  EXPECT_EQ(count_responses(got), 1) << "the smuggled request was served: " << got;
  got = talk(s.port, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n"
                         "0\r\n\r\n" + smuggled);
  EXPECT_EQ(got.rfind("HTTP/1.1 400", 0), 0u) << got;
  EXPECT_EQ(count_responses(got), 1) << got;
  // Bare LF: refused at once, not after a deadline.
  const double t0 = now_ms();
  got = talk(s.port, "GET /health HTTP/1.1\nHost: x\n\n", 5);
  EXPECT_EQ(got.rfind("HTTP/1.1 400", 0), 0u) << got;
  EXPECT_LT(now_ms() - t0, 4000) << "a bare-LF request must be answered at once";
}

TEST(HttpHostile, ShortBodyTimesOutAfterTheBodyPhase) {
  ServerOptions o;
  o.body_timeout_s = 0.5;
  o.header_timeout_s = 0.5;
  TestServer s(o);
  // Content-Length larger than the body: 408 after the body phase's deadline (the receive
  // timeout of 5 s is what a hang would hit).
  std::string got = talk(s.port, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"a\":", 5);
  EXPECT_EQ(got.rfind("HTTP/1.1 408", 0), 0u) << got;
  EXPECT_NE(got.find("body"), std::string::npos) << got;
  // Headers that never end: 408 after the header phase.
  got = talk(s.port, "GET /health HTTP/1.1\r\nHost: x\r\n", 5);
  EXPECT_EQ(got.rfind("HTTP/1.1 408", 0), 0u) << got;
  EXPECT_NE(got.find("headers"), std::string::npos) << got;
}

TEST(HttpHostile, SlowClientsDoNotStarveNewOnes) {
  raise_fd_limit();
  ServerOptions o;
  o.max_connections_per_client = 1024;  // all the slow ones come from 127.0.0.2
  TestServer s(o);
  constexpr int kSlow = 512;
  std::vector<int> fds;
  for (int i = 0; i < kSlow; ++i) {
    const int fd = server::http_connect("127.0.0.1", s.port, 5000, "127.0.0.2");
    ASSERT_GE(fd, 0) << "connection " << i;
    fds.push_back(fd);
  }
  const std::string head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n";
  // Two rounds of one byte per connection, a second apart; new clients between them.
  for (int round = 0; round < 2; ++round) {
    for (int fd : fds) (void)!::send(fd, head.data() + round, 1, MSG_NOSIGNAL);
    std::string got = talk(s.port, "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 1.0);
    EXPECT_EQ(got.rfind("HTTP/1.1 200", 0), 0u) << "round " << round << ": /health within 1 s: " << got;
    const std::string body = json{{"model", "tiny"}, {"prompt", "hi"}, {"max_tokens", 2}}.dump();
    got = talk(s.port,
                   "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: " +
                       std::to_string(body.size()) + "\r\n\r\n" + body,
                   5.0);
    EXPECT_EQ(got.rfind("HTTP/1.1 200", 0), 0u) << "round " << round << ": " << got;
    std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  }
  for (int fd : fds) ::close(fd);
}

TEST(HttpHostile, ManyConnectionsAtOnceAreServed) {
  raise_fd_limit();
  ServerOptions o;
  o.max_connections_per_client = 1024;
  TestServer s(o);
  // 500 connections opened at once, each asking for /health: all answered, none 503.
  constexpr int kN = 500;
  std::vector<int> fds;
  const std::string req = "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  for (int i = 0; i < kN; ++i) {
    const int fd = server::http_connect("127.0.0.1", s.port, 5000, "127.0.0.4");
    ASSERT_GE(fd, 0);
    fds.push_back(fd);
  }
  for (int fd : fds) ASSERT_EQ(::send(fd, req.data(), req.size(), MSG_NOSIGNAL), ssize_t(req.size()));
  int ok = 0;
  for (int fd : fds) {
    timeval tv{5, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    std::string got;
    char buf[2048];
    for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) got.append(buf, size_t(n));
    ok += got.rfind("HTTP/1.1 200", 0) == 0;
    ::close(fd);
  }
  EXPECT_EQ(ok, kN);
}

TEST(HttpHostile, ConnectionCaps) {
  ServerOptions o;
  o.max_connections_per_client = 4;
  o.max_connections = 8;
  TestServer s(o);
  std::vector<int> held;
  for (int i = 0; i < 4; ++i) held.push_back(server::http_connect("127.0.0.1", s.port, 5000, "127.0.0.3"));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  // The fifth from the same address: 429 at once.
  std::string got = talk(s.port, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n", 3, "127.0.0.3");
  EXPECT_EQ(got.rfind("HTTP/1.1 429", 0), 0u) << got;
  EXPECT_NE(got.find("127.0.0.3"), std::string::npos) << got;
  // Fill the total cap with idle connections from other addresses: a new client is still served
  // (the oldest idle connection makes room).
  for (int i = 0; i < 4; ++i) held.push_back(server::http_connect("127.0.0.1", s.port, 5000, "127.0.0." + std::to_string(10 + i)));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  got = talk(s.port, "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 3, "127.0.0.20");
  EXPECT_EQ(got.rfind("HTTP/1.1 200", 0), 0u) << got;
  for (int fd : held) ::close(fd);
}

TEST(HttpHostile, ChunkedRequestBody) {
  TestServer s;
  const std::string body = json{{"model", "tiny"}, {"prompt", "hello"}, {"max_tokens", 2}}.dump();
  std::string chunked;
  for (size_t i = 0; i < body.size(); i += 7) {
    const std::string part = body.substr(i, 7);
    char len[16];
    std::snprintf(len, sizeof len, "%zx\r\n", part.size());
    chunked += len + part + "\r\n";
  }
  chunked += "0\r\n\r\n";
  std::string got = talk(s.port, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                                     "Transfer-Encoding: chunked\r\n\r\n" + chunked);
  EXPECT_EQ(got.rfind("HTTP/1.1 200", 0), 0u) << got;
  EXPECT_NE(got.find("\"choices\""), std::string::npos) << got;
}

// The HTTP library's paths our handlers rely on, over real HTTP: 100-continue, pipelined
// requests answered in order, the header and body limits, and the framing checks we add where
// Beast is laxer (equal duplicate Content-Length, a Content-Length list, obs-fold).
TEST(HttpHostile, ContinuePipeliningLimitsAndLaxFraming) {
  ServerOptions o;
  o.max_body_bytes = 4096;
  TestServer s(o);
  const std::string body = json{{"model", "tiny"}, {"prompt", "hi"}, {"max_tokens", 2}}.dump();
  {
    const int fd = server::http_connect("127.0.0.1", s.port, 5000);
    ASSERT_GE(fd, 0);
    timeval tv{5, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    const std::string head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nConnection: close\r\n"
                             "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n";
    ASSERT_EQ(::send(fd, head.data(), head.size(), MSG_NOSIGNAL), ssize_t(head.size()));
    char buf[4096];
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    ASSERT_GT(n, 0);
    EXPECT_EQ(std::string(buf, size_t(n)).rfind("HTTP/1.1 100 Continue\r\n\r\n", 0), 0u) << std::string(buf, size_t(n));
    ASSERT_EQ(::send(fd, body.data(), body.size(), MSG_NOSIGNAL), ssize_t(body.size()));
    std::string got;
    for (ssize_t k; (k = ::recv(fd, buf, sizeof buf, 0)) > 0;) got.append(buf, size_t(k));
    ::close(fd);
    EXPECT_NE(got.find("HTTP/1.1 200"), std::string::npos) << got;
    EXPECT_NE(got.find("\"choices\""), std::string::npos) << got;
  }
  // Three pipelined requests in one write: three answers, in order.
  std::string got = talk(s.port, "GET /health HTTP/1.1\r\nHost: x\r\n\r\nGET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"
                                 "GET /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(count_responses(got), 3) << got;
  const size_t a = got.find("HTTP/1.1 200"), b = got.find("\"object\":\"list\""), c = got.find("HTTP/1.1 404");
  EXPECT_TRUE(a != std::string::npos && b != std::string::npos && c != std::string::npos && a < b && b < c) << got;
  // Limits: 431 for a head over 64 KiB, 413 for a body over max_body_bytes.
  got = talk(s.port, "GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(70 << 10, 'a') + "\r\n\r\n");
  EXPECT_EQ(got.rfind("HTTP/1.1 431", 0), 0u) << got.substr(0, 200);
  got = talk(s.port, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n" + std::string(5000, '{'));
  EXPECT_EQ(got.rfind("HTTP/1.1 413", 0), 0u) << got.substr(0, 200);
  // Framing Beast alone would accept.
  for (const std::string& bad : std::vector<std::string>{
           "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(body.size()) +
            "\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body,
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(body.size()) + ", " +
            std::to_string(body.size()) + "\r\n\r\n" + body,
        "GET /health HTTP/1.1\r\nHost: x\r\nX-A: a\r\n b\r\n\r\n",
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n"}) {
    got = talk(s.port, bad);
    EXPECT_TRUE(got.rfind("HTTP/1.1 400", 0) == 0 || got.rfind("HTTP/1.1 501", 0) == 0) << bad << " -> " << got;
    EXPECT_EQ(count_responses(got), 1) << got;
  }
}

TEST(HttpHostile, Cors) {
  {
    TestServer s;  // default: no CORS
    std::string got = talk(s.port, "GET /health HTTP/1.1\r\nHost: x\r\nOrigin: http://app.example\r\nConnection: close\r\n\r\n");
    EXPECT_EQ(got.rfind("HTTP/1.1 200", 0), 0u) << got;
    EXPECT_EQ(got.find("Access-Control-Allow-Origin"), std::string::npos) << got;
    got = talk(s.port, "OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: x\r\nOrigin: http://app.example\r\n"
                           "Access-Control-Request-Method: POST\r\nConnection: close\r\n\r\n");
    EXPECT_EQ(got.rfind("HTTP/1.1 403", 0), 0u) << got;
  }
  ServerOptions o;
  o.allowed_origins = {"http://app.example"};
  TestServer s(o);
  std::string got = talk(s.port, "OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: x\r\nOrigin: http://app.example\r\n"
                                     "Access-Control-Request-Method: POST\r\nAccess-Control-Request-Headers: "
                                     "authorization, content-type\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(got.rfind("HTTP/1.1 204", 0), 0u) << got;
  EXPECT_NE(got.find("Access-Control-Allow-Origin: http://app.example"), std::string::npos) << got;
  EXPECT_NE(got.find("Access-Control-Allow-Methods: GET, POST, OPTIONS"), std::string::npos) << got;
  EXPECT_NE(got.find("Access-Control-Allow-Headers: authorization, content-type"), std::string::npos) << got;
  got = talk(s.port, "GET /v1/models HTTP/1.1\r\nHost: x\r\nOrigin: http://app.example\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(got.rfind("HTTP/1.1 200", 0), 0u) << got;
  EXPECT_NE(got.find("Access-Control-Allow-Origin: http://app.example"), std::string::npos) << got;
  got = talk(s.port, "GET /v1/models HTTP/1.1\r\nHost: x\r\nOrigin: http://evil.example\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(got.find("Access-Control-Allow-Origin"), std::string::npos) << got;
}


// Finding: /v1/warm pinned chunks without limit and ignored --chunk-ram (27,835 chunks, 3.5 GB
// RSS under a 1 MiB budget). Now pins count against the budget, per tenant too: a flood of warm
// requests ends in 507s and the pinned bytes stay under both limits.
TEST(HttpHostile, WarmFloodStaysWithinThePinBudget) {
  EngineOptions eo;
  eo.max_batch = 4;
  eo.chunk_size = 16;
  eo.chunk_store.ram_bytes = 1 << 20;
  eo.chunk_store.max_pinned_per_owner = 256 << 10;
  auto engine = Engine::load(tiny_dir(), eo);
  ServerOptions o;
  o.api_keys = {"tenant-a", "tenant-b"};
  o.host = "127.0.0.1";
  o.port = 0;
  o.model_dir = tiny_dir();
  o.model_name = "tiny";
  Server srv(*engine, o);
  srv.start();
  const server::Headers ka{{"Authorization", "Bearer tenant-a"}}, kb{{"Authorization", "Bearer tenant-b"}};
  auto warm = [&](int i, const server::Headers& h) {
    std::string prompt = "flood " + std::to_string(i);
    for (int w = 0; w < 40; ++w) prompt += " word" + std::to_string((i * 7 + w) % 97);
    return server::http_request("127.0.0.1", srv.port(), "POST", "/v1/warm",
                                json{{"model", "tiny"}, {"prompt", prompt}}.dump(), h);
  };
  int n_ok = 0, n_507 = 0;
  std::string last_507;
  for (int i = 0; i < 120; ++i) {
    server::HttpResponse r = warm(i, ka);
    if (r.status == 200) ++n_ok;
    else if (r.status == 507) ++n_507, last_507 = r.body;
    else ADD_FAILURE() << "warm " << i << ": " << r.status << " " << r.body;
  }
  EXPECT_GT(n_ok, 0);
  EXPECT_GT(n_507, 0) << "a tenant past its pin share must be told so";
  EXPECT_NE(last_507.find("pinned"), std::string::npos) << last_507;
  const kv::ChunkStats st = engine->chunk_store()->stats();
  EXPECT_LE(engine->chunk_store()->pinned_bytes("key0"), size_t(256 << 10));
  EXPECT_LE(st.pinned_bytes, 1 << 20);
  EXPECT_LE(st.bytes_ram, 1 << 20) << st.to_string();
  // Another tenant still has its own share.
  EXPECT_EQ(warm(1000, kb).status, 200);
  srv.stop();
}

// Findings: max_tokens 9223372036854775807 overflowed a signed int (UBSan killed the server),
// 1e400 was a 500, blend_check_layer 999 on a small model was accepted.
TEST(HttpHostile, NumbersInRequestsAreRangeChecked) {
  TestServer s;
  struct Case {
    std::string body;
    const char* param;  // "" = the error names no field (a JSON-level problem)
    const char* says;
  };
  const int64_t n_layers = tiny_engine().model().config().n_layers;
  const std::vector<Case> cases = {
      {R"({"prompt":"hi","max_tokens":9223372036854775807})", "max_tokens", "max_tokens"},
      {R"({"prompt":"hi","max_completion_tokens":9223372036854775807})", "max_completion_tokens", "max_completion_tokens"},
      {R"({"prompt":"hi","max_tokens":18446744073709551615})", "max_tokens", "max_tokens"},
      {R"({"prompt":"hi","max_tokens":-9223372036854775808})", "max_tokens", "max_tokens"},
      {R"({"prompt":"hi","max_tokens":1e400})", "", "out of range"},
      {R"({"prompt":"hi","max_tokens":2,"temperature":1e400})", "", "out of range"},
      {R"({"prompt":"hi","max_tokens":2,"top_k":9223372036854775807})", "top_k", "top_k"},
      {R"({"prompt":"hi","max_tokens":2,"logprobs":9223372036854775807})", "logprobs", "logprobs"},
      {R"({"prompt":"hi","max_tokens":2,"reuse":{"mode":"cacheblend","blend_check_layer":999}})", "blend_check_layer",
       "blend_check_layer"},
      {R"({"prompt":"hi","max_tokens":2,"reuse":{"mode":"cacheblend","blend_check_layer":)" + std::to_string(n_layers) +
           "}}",
       "blend_check_layer", "blend_check_layer"},
      {R"({"prompt":"hi","max_tokens":2,"reuse":{"mode":"cacheblend","repair_tokens":1e300}})", "repair_tokens",
       "repair_tokens"},
      {R"({"prompt":[1,2,9223372036854775807],"max_tokens":2})", "prompt", "prompt"},
  };
  for (const Case& c : cases) {
    const server::HttpResponse r = server::http_request("127.0.0.1", s.port, "POST", "/v1/completions", c.body);
    EXPECT_EQ(r.status, 400) << c.body << " -> " << r.body;
    const json e = json::parse(r.body)["error"];
    if (*c.param) EXPECT_EQ(e["param"], c.param) << r.body;
    EXPECT_NE(e["message"].get<std::string>().find(c.says), std::string::npos) << r.body;
  }
  // The last layer is a valid check layer.
  const server::HttpResponse ok = server::http_request(
      "127.0.0.1", s.port, "POST", "/v1/completions",
      R"({"prompt":"hi","max_tokens":2,"reuse":{"mode":"cacheblend","blend_check_layer":)" + std::to_string(n_layers - 1) +
          "}}");
  EXPECT_EQ(ok.status, 200) << ok.body;
}

}  // namespace
}  // namespace kvboost
