// The server side of http.h on Boost.Asio: one io_context thread accepts, waits for and reads
// every connection and feeds its bytes to the request parser (Boost.Beast, http_parser.cpp); a
// bounded pool of handler threads sees complete requests only.
//
// A connection is always in exactly one place: with the io_context (a read wait armed, its parser
// filling) or with one handler thread (no wait armed; the handler writes the response on the
// non-blocking socket, http.cpp). The io_context thread alone creates, counts and closes
// connections; a handler hands its connection back by posting to the io_context.
//
// Why readiness waits (socket::async_wait + a non-blocking recv into one shared buffer) rather
// than async_read_some into a buffer per connection: an idle or slow connection then costs a
// socket and its parser's few bytes, not a 64 KiB read buffer -- thousands of them are cheap.
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>

#include <sys/socket.h>

#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include "http.h"
#include "kvboost/common.h"

namespace kvboost::server {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using boost::system::error_code;

namespace {

struct Conn {
  tcp::socket sock;
  int fd = -1;
  uint64_t id = 0;
  std::string peer;
  RequestParser parser;
  RequestParser::Phase phase = RequestParser::Phase::kIdle;
  double since = 0, deadline = 0;  // the current phase's start and deadline (ms)
  bool fresh = true;               // no request yet: idle time counts as header time
  bool in_worker = false;
  bool waiting = false;   // a read wait is armed
  bool closed = false;
  bool draining = false;  // answered an error (or refused): dropping input until EOF or deadline
  bool counted = true;    // counts against the connection caps (refused ones do not)
  size_t drained = 0;
  HttpRequest req;        // while in_worker
  bool close_after = false;
  Conn(tcp::socket s, const HttpServerOptions* o) : sock(std::move(s)), parser(o) { fd = sock.native_handle(); }
};

using ConnPtr = std::shared_ptr<Conn>;

// A small response on a non-blocking socket, best effort (an error reply, or a refusal).
void send_small(int fd, int status, const std::string& body, const char* extra) {
  std::string h = "HTTP/1.1 " + std::to_string(status) + " " + status_text(status) +
                  "\r\nContent-Type: application/json\r\nConnection: close\r\n" + extra +
                  "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  (void)!::send(fd, h.data(), h.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
}

std::string peer_address(const tcp::socket& s) {
  error_code ec;
  const tcp::endpoint ep = s.remote_endpoint(ec);
  if (ec) return "?";
  asio::ip::address a = ep.address();
  if (a.is_v6() && a.to_v6().is_v4_mapped()) a = asio::ip::make_address_v4(asio::ip::v4_mapped, a.to_v6());
  return a.to_string();
}

}  // namespace

struct HttpServer::Impl {
  // Declared first: destroyed last, after every socket, timer and pending handler.
  asio::io_context ioc{1};
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work;
  tcp::acceptor acceptor{ioc};
  asio::steady_timer sweep{ioc}, accept_retry{ioc};
  HttpServerOptions opt;
  Handler handler;
  int port = 0;
  std::thread loop_thread;
  std::vector<std::thread> workers;
  bool started = false;

  std::mutex jobs_mu;
  std::condition_variable jobs_cv;
  std::deque<ConnPtr> jobs;
  bool workers_stop = false;

  // The io_context thread's own.
  std::unordered_map<uint64_t, ConnPtr> conns;
  std::unordered_map<std::string, int> per_client;
  int n_counted = 0, n_in_worker = 0;
  uint64_t next_id = 1;
  bool finished = false;
  char rbuf[65536];

  std::atomic<int> n_open{0};
  std::atomic<int64_t> n_refused{0};
  std::atomic<bool> stop_accept{false}, stopping{false};

  std::string error_body(int status, const std::string& why, const std::string& code) {
    if (opt.on_error) opt.on_error(status);
    if (opt.error_body) return opt.error_body(status, why, code);
    return "{\"error\":{\"message\":\"" + code + "\",\"type\":\"invalid_request_error\",\"param\":null,\"code\":\"" +
           code + "\"}}";
  }

  void set_phase(Conn& c, RequestParser::Phase p) {
    const double now = now_ms();
    c.phase = p;
    c.since = now;
    using P = RequestParser::Phase;
    const int ms = p == P::kHead ? opt.header_timeout_ms
                   : p == P::kBody ? opt.body_timeout_ms
                   : c.fresh ? opt.header_timeout_ms
                             : opt.keep_alive_ms;
    c.deadline = now + ms;
  }

  void close_conn(Conn& c) {
    if (c.closed) return;
    c.closed = true;
    if (c.counted) {
      --n_counted;
      if (--per_client[c.peer] <= 0) per_client.erase(c.peer);
    }
    error_code ec;
    c.sock.close(ec);  // cancels an armed wait (its handler sees operation_aborted)
    const uint64_t id = c.id;
    conns.erase(id);   // the wait handler may still hold the last reference
    n_open = n_counted;
  }

  void arm(const ConnPtr& c) {
    if (c->waiting || c->closed || c->in_worker) return;
    c->waiting = true;
    c->sock.async_wait(tcp::socket::wait_read, [this, c](const error_code& ec) {
      c->waiting = false;
      if (c->closed || c->in_worker) return;
      if (ec) {  // a socket error (not a cancellation: closed ones returned above)
        close_conn(*c);
        return;
      }
      on_readable(*c);
      arm(c);
    });
  }

  // Answers an error the layer found itself, then drains: reads and drops what the client still
  // sends for a moment, so that it sees the response rather than a reset.
  void answer_and_drain(Conn& c, int status, const std::string& why, const std::string& code) {
    const char* extra = status == 503 || status == 429 ? "Retry-After: 1\r\n" : "";
    send_small(c.fd, status, error_body(status, why, code), extra);
    error_code ec;
    c.sock.shutdown(tcp::socket::shutdown_send, ec);
    c.draining = true;
    c.deadline = now_ms() + 500;
  }

  void dispatch(Conn& c) {
    c.req = c.parser.take();
    c.in_worker = true;
    c.fresh = false;
    ++n_in_worker;
    {
      std::lock_guard<std::mutex> l(jobs_mu);
      jobs.push_back(conns.at(c.id));
    }
    jobs_cv.notify_one();
  }

  // After the parser moved: dispatch a complete request, answer an error, or keep reading.
  void after_parse(Conn& c) {
    const RequestParser::State st = c.parser.state();
    if (st == RequestParser::State::kDone) {
      dispatch(c);
    } else if (st == RequestParser::State::kError) {
      answer_and_drain(c, c.parser.error_status(), c.parser.error(), c.parser.error_code());
    } else {
      if (c.parser.phase() != c.phase) set_phase(c, c.parser.phase());
      if (c.parser.want_continue()) {
        static const char kContinue[] = "HTTP/1.1 100 Continue\r\n\r\n";
        (void)!::send(c.fd, kContinue, sizeof kContinue - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
      }
    }
  }

  void on_readable(Conn& c) {
    for (int round = 0; round < 4; ++round) {  // at most 256 KiB per wake-up: fair to the others
      const ssize_t n = ::recv(c.fd, rbuf, sizeof rbuf, MSG_DONTWAIT);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      if (n <= 0) {  // EOF or reset: nothing more will come; a partial request is dropped
        close_conn(c);
        return;
      }
      if (c.draining) {
        c.drained += size_t(n);
        if (c.drained > (64u << 20)) {
          close_conn(c);
          return;
        }
        continue;
      }
      c.parser.feed(std::string_view(rbuf, size_t(n)));
      after_parse(c);
      if (c.in_worker || c.draining) return;
    }
  }

  // At the total cap: closes the connection that has waited longest without a request in
  // progress (idle, or still sending headers). False when every connection is busy.
  bool evict_one() {
    Conn* victim = nullptr;
    for (auto& [id, cp] : conns) {
      Conn& c = *cp;
      if (c.in_worker || c.draining || !c.counted || c.phase == RequestParser::Phase::kBody) continue;
      if (!victim || c.since < victim->since) victim = &c;
    }
    if (!victim) return false;
    n_refused.fetch_add(1);
    close_conn(*victim);
    return true;
  }

  ConnPtr add(tcp::socket s, const std::string& peer, bool counted) {
    auto c = std::make_shared<Conn>(std::move(s), &opt);
    c->id = next_id++;
    c->peer = peer;
    c->counted = counted;
    conns[c->id] = c;
    if (counted) {
      ++n_counted;
      ++per_client[peer];
      n_open = n_counted;
    }
    return c;
  }

  void refuse(tcp::socket s, const std::string& peer, int status, const std::string& why, const std::string& code) {
    n_refused.fetch_add(1);
    ConnPtr c = add(std::move(s), peer, false);
    answer_and_drain(*c, status, why, code);
    arm(c);
  }

  void on_accept(tcp::socket s) {
    error_code ec;
    s.set_option(tcp::no_delay(true), ec);  // stream tokens as they come
    s.non_blocking(true, ec);               // handlers write with poll() and a send deadline
    const std::string peer = peer_address(s);
    auto pc = per_client.find(peer);
    if (pc != per_client.end() && pc->second >= opt.max_connections_per_client) {
      refuse(std::move(s), peer, 429,
             "too many open connections from " + peer + " (limit " + std::to_string(opt.max_connections_per_client) +
                 ")",
             "too_many_connections");
      return;
    }
    if (n_counted >= opt.max_connections && !evict_one()) {
      refuse(std::move(s), peer, 503, "too many open connections", "too_many_connections");
      return;
    }
    ConnPtr c = add(std::move(s), peer, true);
    set_phase(*c, RequestParser::Phase::kIdle);
    arm(c);
  }

  void do_accept() {
    if (stop_accept || !acceptor.is_open()) return;
    acceptor.async_accept([this](const error_code& ec, tcp::socket s) {
      if (ec == asio::error::operation_aborted || stop_accept) return;
      if (ec == asio::error::no_descriptors || ec.value() == ENFILE) {
        // Out of file descriptors: make room rather than spin on a readable listener.
        if (!evict_one()) {
          accept_retry.expires_after(std::chrono::milliseconds(5));
          accept_retry.async_wait([this](const error_code& e) {
            if (!e) do_accept();
          });
          return;
        }
      } else if (!ec) {
        on_accept(std::move(s));
      }
      do_accept();
    });
  }

  // A connection its handler gave back: closed, or read again for the next request (which may
  // already be buffered: pipelining).
  void take_back(const ConnPtr& c) {
    --n_in_worker;
    c->in_worker = false;
    if (c->close_after || stopping) {
      error_code ec;
      c->sock.shutdown(tcp::socket::shutdown_send, ec);
      close_conn(*c);
      maybe_finish();
      return;
    }
    c->parser.reset();
    set_phase(*c, c->parser.phase());
    after_parse(*c);
    arm(c);
  }

  void check_deadlines() {
    const double now = now_ms();
    std::vector<ConnPtr> due;
    for (auto& [id, c] : conns)
      if (!c->in_worker && c->deadline <= now) due.push_back(c);
    for (const ConnPtr& c : due) {
      if (c->draining || c->phase == RequestParser::Phase::kIdle) {
        close_conn(*c);
      } else if (c->phase == RequestParser::Phase::kHead) {
        answer_and_drain(*c, 408,
                         "timed out reading the request headers (limit " + std::to_string(opt.header_timeout_ms) +
                             " ms)",
                         "request_timeout");
      } else {
        answer_and_drain(*c, 408,
                         "timed out reading the request body (limit " + std::to_string(opt.body_timeout_ms) + " ms)",
                         "request_timeout");
      }
    }
  }

  // Stopping: idle connections go now; busy ones when their handler gives them back. Then the
  // io_context runs out of work and its thread returns.
  void maybe_finish() {
    if (!stopping || finished) return;
    std::vector<ConnPtr> idle;
    for (auto& [id, c] : conns)
      if (!c->in_worker) idle.push_back(c);
    for (const ConnPtr& c : idle) close_conn(*c);
    if (n_in_worker > 0) return;
    finished = true;
    error_code ec;
    acceptor.close(ec);
    sweep.cancel();
    accept_retry.cancel();
    work.reset();
  }

  void arm_sweep() {
    sweep.expires_after(std::chrono::milliseconds(20));
    sweep.async_wait([this](const error_code& ec) {
      if (ec || finished) return;
      if (stop_accept && acceptor.is_open()) {
        error_code e;
        acceptor.close(e);
      }
      if (stopping) maybe_finish();
      else check_deadlines();
      if (!finished) arm_sweep();
    });
  }

  void worker() {
    for (;;) {
      ConnPtr c;
      {
        std::unique_lock<std::mutex> l(jobs_mu);
        jobs_cv.wait(l, [&] { return workers_stop || !jobs.empty(); });
        if (jobs.empty()) return;
        c = std::move(jobs.front());
        jobs.pop_front();
      }
      HttpConn hc(c->fd, opt.send_timeout_ms);
      hc.set_peer(c->peer);
      try {
        handler(hc, c->req);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "kvboost serve: request handler failed: %s\n", e.what());
        hc.set_keep_alive(false);
      }
      c->close_after = !hc.keep_alive();
      c->req = HttpRequest{};
      asio::post(ioc, [this, c] { take_back(c); });
    }
  }
};

HttpServer::HttpServer(HttpServerOptions opt, Handler handler) : impl_(std::make_unique<Impl>()) {
  if (opt.max_connections < 1) fail("max_connections ", opt.max_connections, " must be >= 1");
  if (opt.max_connections_per_client < 1)
    fail("max_connections_per_client ", opt.max_connections_per_client, " must be >= 1");
  if (opt.n_workers < 1) fail("the number of HTTP worker threads (", opt.n_workers, ") must be >= 1");
  if (opt.header_timeout_ms < 1 || opt.body_timeout_ms < 1)
    fail("HTTP read timeouts must be positive (headers ", opt.header_timeout_ms, " ms, body ", opt.body_timeout_ms,
         " ms)");
  impl_->opt = std::move(opt);
  impl_->handler = std::move(handler);
}

HttpServer::~HttpServer() { stop(); }

void HttpServer::bind(const std::string& host, int port) {
  Impl& s = *impl_;
  if (port < 0 || port > 65535) fail("port ", port, " is out of range [0, 65535]");
  error_code ec;
  tcp::resolver resolver(s.ioc);
  const auto results = resolver.resolve(host, std::to_string(port),
                                        tcp::resolver::passive | tcp::resolver::numeric_service, ec);
  if (ec) fail("cannot resolve host '", host, "': ", ec.message());
  std::string last_err = "no address";
  for (const auto& r : results) {
    error_code e;
    s.acceptor.open(r.endpoint().protocol(), e);
    if (!e) s.acceptor.set_option(tcp::acceptor::reuse_address(true), e);
    if (!e) s.acceptor.bind(r.endpoint(), e);
    if (!e) s.acceptor.listen(1024, e);
    if (e) {
      last_err = e.message();
      error_code ignored;
      s.acceptor.close(ignored);
      continue;
    }
    s.port = s.acceptor.local_endpoint(e).port();
    break;
  }
  if (!s.acceptor.is_open()) fail("cannot listen on ", host, ":", port, ": ", last_err);
}

int HttpServer::port() const { return impl_->port; }

void HttpServer::start() {
  Impl& s = *impl_;
  if (!s.acceptor.is_open()) fail("HttpServer::start before bind");
  s.work.emplace(s.ioc.get_executor());
  s.started = true;
  for (int i = 0; i < s.opt.n_workers; ++i) s.workers.emplace_back([&s] { s.worker(); });
  s.do_accept();
  s.arm_sweep();
  s.loop_thread = std::thread([&s] { s.ioc.run(); });
}

void HttpServer::stop_accepting() {
  impl_->stop_accept = true;
  if (impl_->started) asio::post(impl_->ioc, [&s = *impl_] {
      error_code ec;
      s.acceptor.close(ec);
    });
}

void HttpServer::stop() {
  Impl& s = *impl_;
  if (!s.started) return;
  s.stop_accept = true;
  s.stopping = true;
  asio::post(s.ioc, [&s] { s.maybe_finish(); });
  if (s.loop_thread.joinable()) s.loop_thread.join();
  {
    std::lock_guard<std::mutex> l(s.jobs_mu);
    s.workers_stop = true;
  }
  s.jobs_cv.notify_all();
  for (std::thread& t : s.workers)
    if (t.joinable()) t.join();
  s.workers.clear();
  s.started = false;
}

int HttpServer::open_connections() const { return impl_->n_open.load(); }
int64_t HttpServer::refused() const { return impl_->n_refused.load(); }

}  // namespace kvboost::server
