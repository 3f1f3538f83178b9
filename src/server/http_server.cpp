// The server side of http.h: one epoll event loop that accepts, reads and parses every
// connection, and a bounded pool of handler threads that see complete requests only.
//
// A connection is always in exactly one place: in the event loop (registered with epoll, its
// parser filling) or with one handler thread (removed from epoll; the handler writes the response
// on the non-blocking socket). The loop alone creates, counts and closes connections; handlers
// hand theirs back through `back` and an eventfd.
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "http.h"
#include "kvboost/common.h"

namespace kvboost::server {

namespace {

struct Conn {
  int fd = -1;
  std::string peer;
  RequestParser parser;
  RequestParser::Phase phase = RequestParser::Phase::kIdle;
  double since = 0, deadline = 0;  // the current phase's start and deadline (ms)
  bool fresh = true;               // no request yet: idle time counts as header time
  bool in_worker = false;
  bool draining = false;  // answered an error (or refused): dropping input until EOF or deadline
  bool counted = true;    // counts against the connection caps (refused ones do not)
  size_t drained = 0;
  HttpRequest req;        // while in_worker
  bool close_after = false;
  explicit Conn(const HttpServerOptions* o) : parser(o) {}
};

std::string peer_address(const sockaddr_storage& ss) {
  char buf[INET6_ADDRSTRLEN] = "?";
  if (ss.ss_family == AF_INET)
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&ss)->sin_addr, buf, sizeof buf);
  else if (ss.ss_family == AF_INET6)
    ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&ss)->sin6_addr, buf, sizeof buf);
  return buf;
}

// A small response on a non-blocking socket, best effort (an error reply, or a refusal).
void send_small(int fd, int status, const std::string& body, const char* extra) {
  std::string h = "HTTP/1.1 " + std::to_string(status) + " " + status_text(status) +
                  "\r\nContent-Type: application/json\r\nConnection: close\r\n" + extra +
                  "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  (void)!::send(fd, h.data(), h.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
}

}  // namespace

struct HttpServer::Impl {
  HttpServerOptions opt;
  Handler handler;
  int listen_fd = -1, port = 0, ep = -1, wake_fd = -1;
  std::thread loop_thread;
  std::vector<std::thread> workers;
  bool started = false;

  std::mutex jobs_mu;
  std::condition_variable jobs_cv;
  std::deque<Conn*> jobs;
  bool workers_stop = false;

  std::mutex back_mu;
  std::vector<Conn*> back;

  // The event loop's own.
  std::unordered_map<int, std::unique_ptr<Conn>> conns;
  std::unordered_map<std::string, int> per_client;
  int n_counted = 0, n_in_worker = 0;

  std::atomic<int> n_open{0};
  std::atomic<int64_t> n_refused{0};
  std::atomic<bool> stop_accept{false}, stopping{false};

  void wake() {
    const uint64_t one = 1;
    (void)!::write(wake_fd, &one, sizeof one);
  }

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
    if (!c.in_worker) ::epoll_ctl(ep, EPOLL_CTL_DEL, c.fd, nullptr);
    if (c.counted) {
      --n_counted;
      if (--per_client[c.peer] <= 0) per_client.erase(c.peer);
    }
    ::close(c.fd);
    const int fd = c.fd;
    conns.erase(fd);  // destroys c
    n_open = n_counted;
  }

  // Answers an error the layer found itself, then drains: reads and drops what the client still
  // sends for a moment, so that it sees the response rather than a reset.
  void answer_and_drain(Conn& c, int status, const std::string& why, const std::string& code) {
    const char* extra = status == 503 || status == 429 ? "Retry-After: 1\r\n" : "";
    send_small(c.fd, status, error_body(status, why, code), extra);
    ::shutdown(c.fd, SHUT_WR);
    c.draining = true;
    c.deadline = now_ms() + 500;
  }

  void dispatch(Conn& c) {
    c.req = c.parser.take();
    ::epoll_ctl(ep, EPOLL_CTL_DEL, c.fd, nullptr);
    c.in_worker = true;
    c.fresh = false;
    ++n_in_worker;
    {
      std::lock_guard<std::mutex> l(jobs_mu);
      jobs.push_back(&c);
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
    char buf[65536];
    for (int round = 0; round < 4; ++round) {  // at most 256 KiB per wake-up: fair to the others
      const ssize_t n = ::recv(c.fd, buf, sizeof buf, 0);
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
      c.parser.feed(std::string_view(buf, size_t(n)));
      after_parse(c);
      if (c.in_worker || c.draining) return;
    }
  }

  // At the total cap: closes the connection that has waited longest without a request in
  // progress (idle, or still sending headers). False when every connection is busy.
  bool evict_one() {
    Conn* victim = nullptr;
    for (auto& [fd, cp] : conns) {
      Conn& c = *cp;
      if (c.in_worker || c.draining || !c.counted || c.phase == RequestParser::Phase::kBody) continue;
      if (!victim || c.since < victim->since) victim = &c;
    }
    if (!victim) return false;
    n_refused.fetch_add(1);
    close_conn(*victim);
    return true;
  }

  void refuse(int fd, const std::string& peer, int status, const std::string& why, const std::string& code) {
    n_refused.fetch_add(1);
    auto c = std::make_unique<Conn>(&opt);
    c->fd = fd;
    c->peer = peer;
    c->counted = false;
    Conn& r = *c;
    conns[fd] = std::move(c);
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.fd = fd;
    ::epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
    answer_and_drain(r, status, why, code);
  }

  void accept_all() {
    for (;;) {
      sockaddr_storage ss{};
      socklen_t len = sizeof ss;
      const int fd = ::accept4(listen_fd, reinterpret_cast<sockaddr*>(&ss), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno == EMFILE || errno == ENFILE) {
          // Out of file descriptors: make room rather than spin on a readable listener.
          if (!evict_one()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
        return;
      }
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);  // stream tokens as they come
      const std::string peer = peer_address(ss);
      auto pc = per_client.find(peer);
      if (pc != per_client.end() && pc->second >= opt.max_connections_per_client) {
        refuse(fd, peer, 429,
               "too many open connections from " + peer + " (limit " + std::to_string(opt.max_connections_per_client) +
                   ")",
               "too_many_connections");
        continue;
      }
      if (n_counted >= opt.max_connections && !evict_one()) {
        refuse(fd, peer, 503, "too many open connections", "too_many_connections");
        continue;
      }
      auto c = std::make_unique<Conn>(&opt);
      c->fd = fd;
      c->peer = peer;
      set_phase(*c, RequestParser::Phase::kIdle);
      epoll_event ev{};
      ev.events = EPOLLIN | EPOLLRDHUP;
      ev.data.fd = fd;
      if (::epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) != 0) {
        ::close(fd);
        continue;
      }
      conns[fd] = std::move(c);
      ++n_counted;
      ++per_client[peer];
      n_open = n_counted;
    }
  }

  // Connections handlers gave back: closed, or registered again for the next request (which may
  // already be buffered: pipelining).
  void take_back() {
    std::vector<Conn*> got;
    {
      std::lock_guard<std::mutex> l(back_mu);
      got.swap(back);
    }
    for (Conn* c : got) {
      --n_in_worker;
      c->in_worker = false;
      if (c->close_after || stopping) {
        ::shutdown(c->fd, SHUT_WR);
        c->in_worker = true;  // not registered with epoll
        close_conn(*c);
        continue;
      }
      epoll_event ev{};
      ev.events = EPOLLIN | EPOLLRDHUP;
      ev.data.fd = c->fd;
      ::epoll_ctl(ep, EPOLL_CTL_ADD, c->fd, &ev);
      c->parser.reset();
      set_phase(*c, c->parser.phase());
      after_parse(*c);
    }
  }

  void check_deadlines() {
    const double now = now_ms();
    std::vector<Conn*> due;
    for (auto& [fd, c] : conns)
      if (!c->in_worker && c->deadline <= now) due.push_back(c.get());
    for (Conn* c : due) {
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

  void loop() {
    epoll_event events[256];
    double last_check = 0;
    for (;;) {
      if (stop_accept && listen_fd >= 0) {
        ::epoll_ctl(ep, EPOLL_CTL_DEL, listen_fd, nullptr);
        ::close(listen_fd);
        listen_fd = -1;
      }
      if (stopping) {
        // Idle connections go now; busy ones when their handler gives them back.
        std::vector<Conn*> idle;
        for (auto& [fd, c] : conns)
          if (!c->in_worker) idle.push_back(c.get());
        for (Conn* c : idle) close_conn(*c);
        if (n_in_worker == 0) {
          std::lock_guard<std::mutex> l(back_mu);
          if (back.empty()) return;
        }
      }
      const int n = ::epoll_wait(ep, events, 256, 20);
      for (int i = 0; i < n; ++i) {
        const int fd = events[i].data.fd;
        if (fd == listen_fd) {
          accept_all();
        } else if (fd == wake_fd) {
          uint64_t v;
          (void)!::read(wake_fd, &v, sizeof v);
        } else {
          auto it = conns.find(fd);
          if (it != conns.end() && !it->second->in_worker) on_readable(*it->second);
        }
      }
      take_back();
      const double now = now_ms();
      if (now - last_check >= 20) {
        last_check = now;
        check_deadlines();
      }
    }
  }

  void worker() {
    for (;;) {
      Conn* c;
      {
        std::unique_lock<std::mutex> l(jobs_mu);
        jobs_cv.wait(l, [&] { return workers_stop || !jobs.empty(); });
        if (jobs.empty()) return;
        c = jobs.front();
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
      {
        std::lock_guard<std::mutex> l(back_mu);
        back.push_back(c);
      }
      wake();
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

HttpServer::~HttpServer() {
  stop();
  if (impl_->listen_fd >= 0) ::close(impl_->listen_fd);
  if (impl_->ep >= 0) ::close(impl_->ep);
  if (impl_->wake_fd >= 0) ::close(impl_->wake_fd);
}

void HttpServer::bind(const std::string& host, int port) {
  Impl& s = *impl_;
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
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) {
      last_err = std::strerror(errno);
      continue;
    }
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd, 1024) != 0) {
      last_err = std::strerror(errno);
      ::close(fd);
      continue;
    }
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
    s.port = ss.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                                      : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
    s.listen_fd = fd;
    break;
  }
  ::freeaddrinfo(res);
  if (s.listen_fd < 0) fail("cannot listen on ", host, ":", port, ": ", last_err);
}

int HttpServer::port() const { return impl_->port; }

void HttpServer::start() {
  Impl& s = *impl_;
  if (s.listen_fd < 0) fail("HttpServer::start before bind");
  s.ep = ::epoll_create1(EPOLL_CLOEXEC);
  s.wake_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (s.ep < 0 || s.wake_fd < 0) fail("cannot create the HTTP event loop: ", std::strerror(errno));
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = s.listen_fd;
  ::epoll_ctl(s.ep, EPOLL_CTL_ADD, s.listen_fd, &ev);
  ev.data.fd = s.wake_fd;
  ::epoll_ctl(s.ep, EPOLL_CTL_ADD, s.wake_fd, &ev);
  s.started = true;
  for (int i = 0; i < s.opt.n_workers; ++i) s.workers.emplace_back([&s] { s.worker(); });
  s.loop_thread = std::thread([&s] { s.loop(); });
}

void HttpServer::stop_accepting() {
  impl_->stop_accept = true;
  if (impl_->started) impl_->wake();
}

void HttpServer::stop() {
  Impl& s = *impl_;
  if (!s.started) return;
  s.stop_accept = true;
  s.stopping = true;
  s.wake();
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
