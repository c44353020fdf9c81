// The Prometheus histogram's text: cumulative buckets, and a `_count` equal to its +Inf bucket
// in every scrape, also one taken while other threads observe.
#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "graph/metrics.h"

namespace pipeline {
namespace {

// The value of the first line of `text` that begins with `prefix`; fails the test without one.
uint64_t value_after(const std::string& text, const std::string& prefix) {
  const size_t at = text.find(prefix);
  if (at == std::string::npos) {
    ADD_FAILURE() << "no line begins with " << prefix << " in\n" << text;
    return 0;
  }
  return std::stoull(text.substr(at + prefix.size()));
}

TEST(Histogram, WritesCumulativeBucketsItsSumAndItsCount) {
  Histogram h({1.0, 2.0});
  for (double v : {0.5, 1.0, 1.5, 3.0}) h.observe(v);
  std::string text;
  h.write(text, "x", "stage=\"s\"");
  EXPECT_EQ(text,
            "x_bucket{stage=\"s\",le=\"1\"} 2\n"
            "x_bucket{stage=\"s\",le=\"2\"} 3\n"
            "x_bucket{stage=\"s\",le=\"+Inf\"} 4\n"
            "x_sum{stage=\"s\"} 6\n"
            "x_count{stage=\"s\"} 4\n");
  EXPECT_EQ(h.count(), 4u);
}

TEST(Histogram, AScrapeDuringObservationsWritesACountEqualToItsInfBucket) {
  Histogram h({0.001, 0.01, 0.1});
  std::atomic<bool> done{false};
  std::vector<std::thread> observers;
  for (int t = 0; t < 2; ++t)
    observers.emplace_back([&] {
      for (int i = 0; i < 200000; ++i) h.observe(0.05);
      done = true;
    });
  int scrapes = 0, mismatches = 0;
  while (!done || scrapes < 100) {
    std::string text;
    h.write(text, "x", "");
    ++scrapes;
    if (value_after(text, "x_bucket{le=\"+Inf\"} ") != value_after(text, "x_count ")) ++mismatches;
  }
  for (auto& t : observers) t.join();
  EXPECT_EQ(mismatches, 0) << "of " << scrapes << " scrapes";
  EXPECT_EQ(h.count(), 400000u);
}

}  // namespace
}  // namespace pipeline
