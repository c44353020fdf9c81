// One request's state while the pipeline works on it. Each part has one owner at a time:
// tokenize fills the prompt; the scheduler (whichever thread holds its scheduling) owns the block
// table; the model stages (prefill, decode: serial, and never both at once) append generated tokens
// and drive the sampler; detokenize owns the text state; every sink call goes through `stream`.
// Hand-offs happen along graph edges, so those parts need no lock of their own; what other threads
// touch while the owner works is synchronised where it is declared (`stream`'s mutex, the text
// state's in-order tokens, the `stopped` and `last_token_drawn` flags, the drawn tokens' count
// and the waiting count's atomics).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "graph/in_order.h"
#include "graph/metrics.h"
#include "graph/request.h"
#include "graph/response_stream.h"
#include "io/incremental_decoder.h"
#include "io/stop_strings.h"
#include "model/kv_cache.h"
#include "model/sampling.h"

namespace pipeline {

// A sampled token as the detokenizer receives it.
struct GeneratedToken {
  SampledToken sampled;
  std::optional<FinishReason> finish;
  std::chrono::steady_clock::time_point drawn_at;  // SampledOutput::drawn_at
  std::vector<SampledToken> prompt_scores;         // SampledOutput::prompt_scores
};

// Detokenize's per-sequence state: tokens come back into order, then become text.
struct TextState {
  TextState(const Tokenizer& tokenizer, std::span<const int32_t> prompt,
            std::vector<std::string> stops, bool keep_stop)
      : decoder(tokenizer, prompt),
        first_prompt_token(prompt.empty() ? 0 : prompt.front()),
        stops(std::move(stops), keep_stop) {}

  InOrder<GeneratedToken> tokens;  // its lock guards the fields below
  IncrementalDecoder decoder;
  // Request::prompt_logprobs: the prompt's first token, which the scores (of the tokens after
  // it) do not name. Sequence::tokens is the model stages' and may move while detokenize runs.
  int32_t first_prompt_token;
  StopStringMatcher stops;
  bool done = false;
  int completion_tokens = 0;
  uint64_t next_event = 0;  // numbers the StreamEvents sent to emit
  // Sequence::fail_unless_answered's error, while it waits for the tokens drawn before it.
  std::optional<RequestError> failure_after_drawn;
};

// Whether a sequence counts among the engine's waiting requests (Metrics::waiting_sequences,
// which admission holds to server.max_queue): from submission until its prefill starts, again
// while preempted, never after its end. The scheduler and the thread that ends the
// sequence may race; the three states give every +1 exactly one -1.
class WaitingCount {
 public:
  // Back in the waiting queue (preempted), unless it ended meanwhile.
  void enter(Gauge& waiting) {
    State expected = State::Out;
    if (state_.compare_exchange_strong(expected, State::In)) waiting.add(1);
  }
  // Its prefill starts.
  void leave(Gauge& waiting) {
    State expected = State::In;
    if (state_.compare_exchange_strong(expected, State::Out)) waiting.add(-1);
  }
  // It ended (answered, failed or cancelled).
  void end(Gauge& waiting) {
    if (state_.exchange(State::Ended) == State::In) waiting.add(-1);
  }

 private:
  enum class State : uint8_t { Out, In, Ended };
  std::atomic<State> state_{State::In};  // Engine::submit counted it
};

struct Sequence {
  // Runs once, right before the request's sink receives its ending.
  using OnEnd = std::function<void(Sequence&, const ResponseStream::Payload& ending)>;

  Sequence(std::shared_ptr<Request> request, uint64_t number, OnEnd on_end)
      : request(std::move(request)),
        number(number),
        stream(this->request->sink,
               [this, on_end = std::move(on_end)](const ResponseStream::Payload& ending) {
                 on_end(*this, ending);
               }) {}
  Sequence(const Sequence&) = delete;
  Sequence& operator=(const Sequence&) = delete;

  const std::shared_ptr<Request> request;
  const uint64_t number;  // arrival order: the newest sequence has the largest
  ResponseStream stream;

  // Set by tokenize.
  std::vector<int32_t> tokens;  // the prompt, then every generated token
  int prompt_len = 0;
  int max_tokens = 0;  // generated tokens allowed, already capped to the context and KV pool
  std::unique_ptr<Sampler> sampler;
  std::unique_ptr<TextState> text;

  // The scheduler only (the thread that holds its scheduling).
  std::vector<int32_t> block_table;
  int computed = 0;     // positions whose keys and values are in the KV cache (or being computed)
  int prefill_end = 0;  // positions its prefill covers: its tokens when it was admitted
  // Prefix cache: its first blocks that are registered (or were found there), and while it
  // waits, the cached blocks this round's lookup found.
  int registered_blocks = 0;
  std::vector<int32_t> cached_prefix;
  // Prompt tokens the cache held at its first admission (a resumed sequence's own blocks are
  // not the client's cache hits). Set once, before its first pass; the one field here another
  // stage reads: detokenize, with each token.
  std::optional<int> cached_prompt_tokens;
  // Waiting: a batch window closed over it and left it for lack of room, or it was preempted;
  // either way it goes as soon as there is room.
  bool window_closed = false;
  std::chrono::steady_clock::time_point queued_at;  // arrival in the queue (preemption keeps it)
  // Its first admission, set with cached_prompt_tokens; the engine reads it when the sequence
  // ends (vLLM's queue, prefill and inference times).
  std::chrono::steady_clock::time_point scheduled_at;

  // Model stages only (the engine reads first_token_at when the sequence ends).
  std::chrono::steady_clock::time_point first_token_at;
  std::chrono::steady_clock::time_point last_token_at;
  // Request::prompt_logprobs: prompt tokens 1, 2, ... scored so far (the first token has no
  // score); handed on with the first generated token.
  std::vector<SampledToken> prompt_scores;

  // Detokenize sets it when a stop string ended the text; the scheduler then drops the sequence.
  std::atomic<bool> stopped{false};
  // The model step sets it when it draws the token that ends the answer.
  std::atomic<bool> last_token_drawn{false};
  // Generated tokens the model step has drawn: detokenize has had them all once its text state's
  // in-order tokens have handled as many.
  std::atomic<int> tokens_drawn{0};
  WaitingCount waiting;

  int generated() const { return int(tokens.size()) - prompt_len; }
  // Whether its answer is complete, so that only detokenize and emit, which need no model, are
  // left to deliver it: an engine that fails for good lets it arrive. Any thread.
  bool answer_complete() const { return last_token_drawn.load() || stopped.load(); }
  // Ends the request with `error` (its pass failed, or the engine did for good) unless the tokens
  // already drawn end its answer. Some may still be on their way to detokenize, whose stop
  // strings may end it there: then the failure waits until detokenize has had them all
  // (DetokenizeStage), and ends the request only if they did not. Any thread.
  void fail_unless_answered(const RequestError& error) {
    if (answer_complete()) return;
    const int drawn = tokens_drawn.load();
    bool now = drawn == 0;  // nothing drawn: perhaps not through tokenize, and `text` unset
    if (!now)
      text->tokens.locked([&](uint64_t handled) {
        if (stopped.load()) return;  // detokenize found a stop string just now
        now = handled >= uint64_t(drawn);
        if (!now && !text->failure_after_drawn) text->failure_after_drawn = error;
      });
    if (now) stream.fail(error);
  }
  // Prefill tokens still to compute; 0 once it decodes (the scheduler).
  int prompt_left() const { return std::max(0, prefill_end - computed); }
  // Whether its prompt still needs logits rows for its scores (rows 0 .. prompt_len - 2 score
  // tokens 1 .. prompt_len - 1): until its first token, sampled in the pass that ends the prompt
  // (the scheduler, between passes).
  bool scores_prompt() const {
    return request->prompt_logprobs && prompt_len > 1 && generated() == 0;
  }
};

using SequencePtr = std::shared_ptr<Sequence>;

}  // namespace pipeline
