// Test helpers for the remote chunk tier: a real `redis-server` (Debian package) on a free
// loopback port, started and killed by the test, a hiredis client to inspect or corrupt it, and
// a TCP proxy on loopback that delays every byte by a fixed time each way (a "slow Redis").
//
// Tests call KVBOOST_REQUIRE_REDIS() first: it skips when redis-server is not installed, and
// fails instead when KVBOOST_REQUIRE_REDIS=1 (set by .ci/run).
#pragma once
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace kvboost::test {

inline std::string redis_server_binary() {
  for (const char* p : {"/usr/bin/redis-server", "/usr/local/bin/redis-server", "/usr/bin/valkey-server"})
    if (::access(p, X_OK) == 0) return p;
  return "";
}

inline bool redis_required() {
  const char* e = std::getenv("KVBOOST_REQUIRE_REDIS");
  return e && std::string(e) == "1";
}

inline int free_loopback_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

// A redis-server child process on 127.0.0.1:port, no persistence.
class RedisServer {
 public:
  explicit RedisServer(int port = 0, std::vector<std::string> extra = {}) : port_(port ? port : free_loopback_port()) {
    extra_ = std::move(extra);
    start();
  }
  ~RedisServer() { kill(); }
  int port() const { return port_; }
  std::string url() const { return "redis://127.0.0.1:" + std::to_string(port_); }
  bool running() const { return pid_ > 0; }

  void start() {
    const std::string bin = redis_server_binary();
    std::vector<std::string> args{bin, "--port", std::to_string(port_), "--bind", "127.0.0.1", "--save", "",
                                  "--appendonly", "no", "--daemonize", "no", "--loglevel", "warning"};
    args.insert(args.end(), extra_.begin(), extra_.end());
    pid_ = ::fork();
    if (pid_ == 0) {
      const int null = ::open("/dev/null", O_WRONLY);
      ::dup2(null, 1);  // its start-up banner and warnings would bury the test's output
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(bin.c_str(), argv.data());
      ::_exit(127);
    }
    // Wait until it answers PING (up to 10 s).
    for (int i = 0; i < 200; ++i) {
      if (auto c = client(); c) {
        redisReply* r = static_cast<redisReply*>(redisCommand(c.get(), "PING"));
        const bool ok = r && r->type == REDIS_REPLY_STATUS;
        if (r) freeReplyObject(r);
        if (ok) return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ADD_FAILURE() << "redis-server on port " << port_ << " did not answer PING";
  }
  void kill() {  // SIGKILL: as abrupt as a crash
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

  struct Free {
    void operator()(redisContext* c) const { redisFree(c); }
  };
  using Client = std::unique_ptr<redisContext, Free>;
  Client client() const {
    const timeval tv{1, 0};
    redisContext* c = redisConnectWithTimeout("127.0.0.1", port_, tv);
    if (!c || c->err) {
      if (c) redisFree(c);
      return nullptr;
    }
    return Client(c);
  }
  // Runs a command (argv form, binary-safe); returns the reply as a string (status, string,
  // integer as text, error as "ERR..."; array: its elements joined by '\n'; nil: "(nil)").
  std::string cmd(const std::vector<std::string>& args) const {
    Client c = client();
    if (!c) return "(no connection)";
    std::vector<const char*> argv;
    std::vector<size_t> lens;
    for (const auto& a : args) argv.push_back(a.data()), lens.push_back(a.size());
    redisReply* r = static_cast<redisReply*>(redisCommandArgv(c.get(), int(args.size()), argv.data(), lens.data()));
    if (!r) return "(io error)";
    std::string out;
    auto one = [](const redisReply* x) -> std::string {
      if (x->type == REDIS_REPLY_INTEGER) return std::to_string(x->integer);
      if (x->type == REDIS_REPLY_NIL) return "(nil)";
      return std::string(x->str, x->len);
    };
    if (r->type == REDIS_REPLY_ARRAY) {
      for (size_t i = 0; i < r->elements; ++i) out += (i ? "\n" : "") + one(r->element[i]);
    } else {
      out = one(r);
    }
    freeReplyObject(r);
    return out;
  }
  std::vector<std::string> keys(const std::string& pattern = "*") const {
    std::vector<std::string> out;
    const std::string s = cmd({"KEYS", pattern});
    size_t b = 0;
    while (b < s.size()) {
      size_t e = s.find('\n', b);
      if (e == std::string::npos) e = s.size();
      out.push_back(s.substr(b, e - b));
      b = e + 1;
    }
    return out;
  }

 private:
  int port_;
  pid_t pid_ = -1;
  std::vector<std::string> extra_;
};

// Listens on a free loopback port and forwards each connection to 127.0.0.1:target, holding
// every piece of data for delay_ms in each direction (so a round trip gains 2 * delay_ms).
class DelayProxy {
 public:
  DelayProxy(int target, int delay_ms) : target_(target), delay_ms_(delay_ms) {
    lfd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    const int one = 1;
    ::setsockopt(lfd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(lfd_, reinterpret_cast<sockaddr*>(&a), sizeof a);
    socklen_t len = sizeof a;
    ::getsockname(lfd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    ::listen(lfd_, 16);
    acceptor_ = std::thread([this] { accept_loop(); });
  }
  ~DelayProxy() {
    stop_ = true;
    ::shutdown(lfd_, SHUT_RDWR);
    ::close(lfd_);
    acceptor_.join();
    for (auto& t : pumps_) t.join();
  }
  int port() const { return port_; }
  std::string url() const { return "redis://127.0.0.1:" + std::to_string(port_); }

 private:
  void accept_loop() {
    while (!stop_) {
      pollfd p{lfd_, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      const int c = ::accept(lfd_, nullptr, nullptr);
      if (c < 0) continue;
      const int s = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      a.sin_port = htons(uint16_t(target_));
      if (::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
        ::close(c), ::close(s);
        continue;
      }
      pumps_.emplace_back([this, c, s] { pump(c, s); });
      pumps_.emplace_back([this, c, s] { pump(s, c); });
    }
  }
  // A delay line: the reader stamps each piece, the sender releases it delay_ms later, so the
  // latency is added once per direction, not once per read (bandwidth is not capped).
  void pump(int from, int to) {
    struct Piece {
      std::chrono::steady_clock::time_point due;
      std::string data;
    };
    std::mutex mu;
    std::condition_variable cv;
    std::deque<Piece> q;
    bool eof = false;
    std::thread sender([&] {
      std::unique_lock<std::mutex> lock(mu);
      for (;;) {
        cv.wait(lock, [&] { return eof || !q.empty(); });
        if (q.empty()) break;
        Piece pc = std::move(q.front());
        q.pop_front();
        lock.unlock();
        std::this_thread::sleep_until(pc.due);
        bool ok = true;
        for (size_t off = 0; ok && off < pc.data.size();) {
          const ssize_t w = ::send(to, pc.data.data() + off, pc.data.size() - off, MSG_NOSIGNAL);
          if (w <= 0) ok = false;
          else off += size_t(w);
        }
        lock.lock();
        if (!ok) break;
      }
      ::shutdown(to, SHUT_RDWR);
    });
    std::vector<char> buf(1 << 20);
    while (!stop_) {
      pollfd p{from, POLLIN, 0};
      const int pr = ::poll(&p, 1, 100);
      if (pr == 0) continue;
      if (pr < 0) break;
      const ssize_t n = ::recv(from, buf.data(), buf.size(), 0);
      if (n <= 0) break;
      std::lock_guard<std::mutex> lock(mu);
      q.push_back({std::chrono::steady_clock::now() + std::chrono::milliseconds(delay_ms_), std::string(buf.data(), size_t(n))});
      cv.notify_one();
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      eof = true;
    }
    cv.notify_one();
    sender.join();
    ::shutdown(from, SHUT_RDWR);
  }
  int target_, delay_ms_, lfd_ = -1, port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread acceptor_;
  std::vector<std::thread> pumps_;
};

}  // namespace kvboost::test

#define KVBOOST_REQUIRE_REDIS()                                                                             \
  do {                                                                                                      \
    if (::kvboost::test::redis_server_binary().empty()) {                                                   \
      if (::kvboost::test::redis_required()) FAIL() << "redis-server is not installed (KVBOOST_REQUIRE_REDIS=1)"; \
      GTEST_SKIP() << "redis-server is not installed (apt-get install redis-server): remote tier not tested";  \
    }                                                                                                       \
  } while (0)
