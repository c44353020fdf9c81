#include "server/http_counters.h"

namespace pipeline {

void HttpCounters::count(const std::string& route, int status) {
  std::lock_guard lock(mutex_);
  ++answered_[{route, status}];
}

std::string HttpCounters::prometheus_text(int64_t active_responses) const {
  std::string out =
      "# HELP pipeline_http_requests_total HTTP requests answered, by route and status.\n"
      "# TYPE pipeline_http_requests_total counter\n";
  {
    std::lock_guard lock(mutex_);
    for (const auto& [key, count] : answered_)
      out += "pipeline_http_requests_total{route=\"" + key.first + "\",status=\"" +
             std::to_string(key.second) + "\"} " + std::to_string(count) + "\n";
  }
  out +=
      "# HELP pipeline_http_active_responses Completion requests being answered.\n"
      "# TYPE pipeline_http_active_responses gauge\n"
      "pipeline_http_active_responses " +
      std::to_string(active_responses) + "\n";
  return out;
}

}  // namespace pipeline
