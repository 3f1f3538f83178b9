// Test helpers for the remote chunk tier: a real `redis-server` (Debian package) on a free
// loopback port, started and killed by the test, a hiredis client to inspect or corrupt it, and
// a TCP proxy on loopback that delays every byte by a fixed time each way (a "slow Redis").
//
// Tests call KVBOOST_REQUIRE_REDIS() first: it skips when redis-server is not installed, and
// fails instead when KVBOOST_REQUIRE_REDIS=1 (set by .ci/run).
#pragma once
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>

#include "delay_proxy.h"

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

}  // namespace kvboost::test

#define KVBOOST_REQUIRE_REDIS()                                                                             \
  do {                                                                                                      \
    if (::kvboost::test::redis_server_binary().empty()) {                                                   \
      if (::kvboost::test::redis_required()) FAIL() << "redis-server is not installed (KVBOOST_REQUIRE_REDIS=1)"; \
      GTEST_SKIP() << "redis-server is not installed (apt-get install redis-server): remote tier not tested";  \
    }                                                                                                       \
  } while (0)
