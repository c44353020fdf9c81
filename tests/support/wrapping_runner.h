// A test's ModelRunner around another (the CPU runner, usually): everything is passed on to the
// runner it wraps, so a test's runner overrides only what it changes, forward() mostly, and
// calls WrappingRunner::forward() to run the pass.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "model/model_runner.h"

namespace pipeline {

class WrappingRunner : public ModelRunner {
 public:
  explicit WrappingRunner(std::unique_ptr<ModelRunner> runner) : runner_(std::move(runner)) {}
  const LlamaConfig& config() const override { return runner_->config(); }
  const KvCacheShape& kv_shape() const override { return runner_->kv_shape(); }
  std::string device_name() const override { return runner_->device_name(); }
  std::vector<std::string> setup_report() const override { return runner_->setup_report(); }
  void forward(const Batch& batch, Logits& logits) override { runner_->forward(batch, logits); }
  void watch_pass(std::function<bool()> wanted) override { runner_->watch_pass(std::move(wanted)); }

 private:
  std::unique_ptr<ModelRunner> runner_;
};

}  // namespace pipeline
