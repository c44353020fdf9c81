// A RequestSink that keeps everything it receives, for in-process engine tests: the text, the
// ending, the tokens with their logprobs, and when the first delta and the ending came. wait()
// blocks until the ending.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "graph/request.h"

namespace pipeline::testing {

class CollectingSink : public RequestSink {
 public:
  using Clock = std::chrono::steady_clock;

  void on_delta(Delta delta) override {
    std::lock_guard lock(mutex_);
    if (ended_) out_of_order_ = true;
    if (!first_delta_at_) first_delta_at_ = Clock::now();
    text_ += delta.text;
    tokens_.insert(tokens_.end(), delta.tokens.begin(), delta.tokens.end());
    if (!delta.prompt.empty()) {
      if (!prompt_.empty()) out_of_order_ = true;  // a prompt is scored once
      prompt_ = std::move(delta.prompt);
    }
    ++deltas_;
    changed_.notify_all();
  }
  void on_finish(const Completion& completion) override {
    std::lock_guard lock(mutex_);
    if (ended_) out_of_order_ = true;
    completion_ = completion;
    end(lock);
  }
  void on_error(const RequestError& error) override {
    std::lock_guard lock(mutex_);
    if (ended_) out_of_order_ = true;
    error_ = error;
    end(lock);
  }

  // False when the ending did not come within `timeout`.
  bool wait(std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
    std::unique_lock lock(mutex_);
    return changed_.wait_for(lock, timeout, [&] { return ended_; });
  }
  bool wait_for_delta(std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
    std::unique_lock lock(mutex_);
    return changed_.wait_for(lock, timeout, [&] { return deltas_ > 0 || ended_; });
  }

  std::string text() const {
    std::lock_guard l(mutex_);
    return text_;
  }
  // With logprobs: the generated tokens, and the scored prompt (Request::prompt_logprobs).
  std::vector<TokenOutput> tokens() const {
    std::lock_guard l(mutex_);
    return tokens_;
  }
  std::vector<TokenOutput> prompt() const {
    std::lock_guard l(mutex_);
    return prompt_;
  }
  std::optional<Completion> completion() const {
    std::lock_guard l(mutex_);
    return completion_;
  }
  std::optional<RequestError> error() const {
    std::lock_guard l(mutex_);
    return error_;
  }
  std::optional<Clock::time_point> first_delta_at() const {
    std::lock_guard l(mutex_);
    return first_delta_at_;
  }
  std::optional<Clock::time_point> ended_at() const {
    std::lock_guard l(mutex_);
    return ended_at_;
  }
  // Anything after the ending, or a second ending.
  bool out_of_order() const {
    std::lock_guard l(mutex_);
    return out_of_order_;
  }

 private:
  void end(const std::lock_guard<std::mutex>&) {
    ended_ = true;
    ended_at_ = Clock::now();
    changed_.notify_all();
  }

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::string text_;
  std::vector<TokenOutput> tokens_;
  std::vector<TokenOutput> prompt_;
  int deltas_ = 0;
  bool ended_ = false;
  bool out_of_order_ = false;
  std::optional<Completion> completion_;
  std::optional<RequestError> error_;
  std::optional<Clock::time_point> first_delta_at_;
  std::optional<Clock::time_point> ended_at_;
};

}  // namespace pipeline::testing
