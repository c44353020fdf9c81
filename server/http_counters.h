// The HTTP server's own metrics, which GET /metrics writes after the engine's: the requests
// answered, by route and status, and the completion requests being answered.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>

namespace pipeline {

// HTTP requests answered, by route and status, for GET /metrics.
class HttpCounters {
 public:
  void count(const std::string& route, int status);

  std::string prometheus_text(int64_t active_responses) const;

 private:
  mutable std::mutex mutex_;
  std::map<std::pair<std::string, int>, uint64_t> answered_;
};

// Counts a completion request as active from its arrival until its response object is gone
// (for a stream: until the last chunk was written or the client left).
class ActiveResponse {
 public:
  explicit ActiveResponse(std::atomic<int64_t>& active) : active_(active) { active_.fetch_add(1); }
  ~ActiveResponse() { active_.fetch_sub(1); }
  ActiveResponse(const ActiveResponse&) = delete;
  ActiveResponse& operator=(const ActiveResponse&) = delete;

 private:
  std::atomic<int64_t>& active_;
};

}  // namespace pipeline
