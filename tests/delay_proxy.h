// A TCP proxy on loopback that delays every byte by a fixed time each way (a "slow Redis"),
// for the remote chunk tier's tests and bench/remote_bench. No test framework dependency.
#pragma once
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace kvboost::test {

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
