// The HTTP server's connection threads: the pool httplib runs its connections on, and which of
// their clients have a request being answered, which tells the connections that may be ended
// (idle ones) from those that may not.
#pragma once

#include <cstddef>
#include <functional>
#include <mutex>
#include <set>
#include <string>
#include <utility>

#include <httplib.h>

#include "server/on_demand_thread_pool.h"

namespace pipeline {

// The clients (host, port) with a request being answered: from its handler's start (its body
// read) until the answer is written (httplib's logger runs then, whatever the outcome). The
// others' connections are idle, or still sending a request.
class ConnectionsAnswering {
 public:
  void begin(const httplib::Request& req);
  void end(const httplib::Request& req);
  bool contains(const std::string& host, int port) const;

 private:
  mutable std::mutex mutex_;
  std::set<std::pair<std::string, int>> clients_;
};

// httplib's connection threads, started as connections need them. A thread stays with its
// connection between requests (for httplib's keep-alive timeout, 5 s) and while a client sends a
// request, however slowly: clients that keep their connections open, as HTTP client pools do,
// or that send a header line now and then, could take every thread, and a new connection, a
// /health probe's too, would wait unanswered. While one waits, `relieve` ends the connections
// that hold a thread without a request to answer: idle, or sending one for kSlowRequestLimit
// (server/http_server.cpp).
class ConnectionThreads final : public httplib::TaskQueue {
 public:
  ConnectionThreads(size_t max_threads, std::function<void()> relieve)
      : pool_(max_threads, std::move(relieve)) {}
  void enqueue(std::function<void()> task) override { pool_.enqueue(std::move(task)); }
  void shutdown() override { pool_.shutdown(); }

 private:
  OnDemandThreadPool pool_;
};

}  // namespace pipeline
