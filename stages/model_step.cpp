#include "stages/model_step.h"

#include <oneapi/tbb/parallel_for.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "graph/log.h"
#include "graph/nvtx.h"
#include "io/grammar_syntax.h"
#include "model/seconds.h"

namespace pipeline {
namespace {

using Clock = std::chrono::steady_clock;

RequestError server_error(const std::string& what) {
  return {500, what, "server_error", "", ""};
}

// Why a sequence's draw failed, as its client is told. A request whose own constraints leave
// nothing to draw, or whose grammar grows past what can be followed, is the client's to mend:
// a 400 (naming the guide, for a grammar); anything else is the server's.
RequestError sampling_error(const Request& request) {
  try {
    throw;
  } catch (const GrammarError& e) {
    return {400, std::string("the answer cannot go on: ") + e.what(), "invalid_request_error",
            request.guide_param, ""};
  } catch (const NothingToDraw& e) {
    return {400, e.what(), "invalid_request_error", "", ""};
  } catch (const std::exception& e) {
    return server_error(std::string("sampling failed: ") + e.what());
  }
}

// Whether the pass computed the sequence up to its last token, so that its next is sampled.
bool reaches_the_end(const SequenceChunk& chunk, const Sequence& seq) {
  return chunk.start_pos + chunk.tokens.size() == seq.tokens.size();
}

// Whether `token` ends the sequence's answer: one of its sampler's ending tokens (the end of
// sequence unless ignored, the stop token ids), as the tokenize stage listed them.
bool ends_the_answer(const Sequence& seq, int32_t token) {
  const std::vector<int32_t>& ending = seq.sampler->params().ending_tokens;
  return std::find(ending.begin(), ending.end(), token) != ending.end();
}

// Each chunk's first row of logits: one row per chunk, or one per token with all_logits.
std::vector<int> first_rows(const Batch& batch) {
  std::vector<int> rows;
  int row = 0;
  for (const SequenceChunk& chunk : batch.seqs) {
    rows.push_back(row);
    row += chunk.all_logits ? int(chunk.tokens.size()) : 1;
  }
  return rows;
}

// A logits row that scores a prompt token: row `row` predicts prompt token `position`.
struct ScoreRow {
  size_t seq = 0;
  int row = 0;
  int position = 0;
};

// The rows of this pass that score prompt tokens not scored yet. A sequence preempted before its
// first token computes its prompt again; the rows it scored then are not scored twice.
std::vector<ScoreRow> rows_to_score(const std::vector<SequencePtr>& seqs, const Batch& batch,
                                    const std::vector<int>& first_row) {
  std::vector<ScoreRow> rows;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const SequenceChunk& chunk = batch.seqs[i];
    const Sequence& seq = *seqs[i];
    if (!chunk.all_logits) continue;
    for (int j = 0; j < int(chunk.tokens.size()); ++j) {
      const int position = chunk.start_pos + j + 1;
      if (position >= seq.prompt_len) break;
      if (position > int(seq.prompt_scores.size())) rows.push_back({i, first_row[i] + j, position});
    }
  }
  return rows;
}

// Request::prompt_logprobs: scores the prompt tokens this pass's logits predict, into each
// sequence's prompt_scores. Returns, per sequence, why scoring failed (or nothing).
std::vector<std::optional<std::string>> score_prompts(const std::vector<SequencePtr>& seqs,
                                                      const Batch& batch, const Logits& logits,
                                                      const std::vector<int>& first_row) {
  std::vector<std::optional<std::string>> errors(seqs.size());
  const std::vector<ScoreRow> rows = rows_to_score(seqs, batch, first_row);
  if (rows.empty()) return errors;
  std::vector<SampledToken> scores(rows.size());
  std::vector<std::optional<std::string>> row_errors(rows.size());
  tbb::parallel_for(size_t(0), rows.size(), [&](size_t r) {
    const Sequence& seq = *seqs[rows[r].seq];
    try {
      scores[r] = score_token(logits.row(rows[r].row), seq.tokens[size_t(rows[r].position)],
                              seq.request->sampling.top_logprobs);
    } catch (const std::exception& e) {
      row_errors[r] = e.what();
    }
  });
  for (size_t r = 0; r < rows.size(); ++r) {
    if (row_errors[r]) errors[rows[r].seq] = row_errors[r];
    seqs[rows[r].seq]->prompt_scores.push_back(std::move(scores[r]));
  }
  return errors;
}

// For one pass: tells the runner that the pass is wanted while any of its sequences has not
// ended, so that it stops a pass every client has left (or shutdown has failed) part-way.
class PassWatch {
 public:
  PassWatch(ModelRunner& runner, const std::vector<SequencePtr>& seqs) : runner_(runner) {
    runner_.watch_pass([&seqs] {
      return std::any_of(seqs.begin(), seqs.end(),
                         [](const SequencePtr& seq) { return !seq->stream.ended(); });
    });
  }
  ~PassWatch() { runner_.watch_pass(nullptr); }
  PassWatch(const PassWatch&) = delete;
  PassWatch& operator=(const PassWatch&) = delete;

 private:
  ModelRunner& runner_;
};

// The forward pass, or, where it throws, the sequences it fails in `result` (see model_step.h).
// Returns whether it ran.
bool forward(EngineContext& ctx, const std::vector<SequencePtr>& seqs, const Batch& batch,
             bool prefill, Logits& logits, int riders, StepResult& result) {
  try {
    const PassWatch watch(ctx.runner, seqs);
    ctx.runner.forward(batch, logits);
    return true;
  } catch (const PassAbandoned& e) {
    // Every sequence has ended already: the scheduler drops them and frees their blocks.
    log_line("%s %s", prefill ? "prefill:" : "decode:", e.what());
    result.failed = seqs;
  } catch (const RunnerFailure& e) {
    log_line("%s forward pass failed, and the runner with it: %s", prefill ? "prefill" : "decode",
             e.what());
    const std::string why = std::string("the model runner failed: ") + e.what();
    // One whose drawn tokens end its answer (with a stop string the scheduler has not seen) is
    // delivered, not failed.
    for (const SequencePtr& seq : seqs) seq->fail_unless_answered(engine_failed_error(why));
    result.failed = seqs;
    ctx.engine_failed(why);
  } catch (const std::exception& e) {
    log_line("%s forward pass failed: %s", prefill ? "prefill" : "decode", e.what());
    const auto first_rider = seqs.end() - riders;
    // As above, an answer the drawn tokens end is delivered, not failed.
    for (auto it = seqs.begin(); it != first_rider; ++it)
      (*it)->fail_unless_answered(server_error(std::string("forward pass failed: ") + e.what()));
    result.failed.assign(seqs.begin(), first_rider);
    result.retry.assign(first_rider, seqs.end());
  }
  result.pass_failed = true;
  return false;
}

// Each sequence's next token, drawn from its own row (a chunk's last) with its own sampler, and
// its prompt's scores where asked for; or why that failed. In parallel, since a large batch's
// sampling would otherwise stall the device between steps; a pass that returned only its rows'
// argmaxes (Batch::argmax_only) leaves each draw a few instructions, done in turn.
struct Draws {
  std::vector<SampledToken> sampled;
  std::vector<std::optional<RequestError>> errors;
};

Draws draw_tokens(const std::vector<SequencePtr>& seqs, const Batch& batch, const Logits& logits) {
  static const NvtxName kSampling("sampling");
  NvtxRange range(kSampling);
  Draws draws{std::vector<SampledToken>(seqs.size()),
              std::vector<std::optional<RequestError>>(seqs.size())};
  const std::vector<int> first_row = first_rows(batch);
  const std::vector<std::optional<std::string>> scoring_errors =
      score_prompts(seqs, batch, logits, first_row);
  for (size_t i = 0; i < seqs.size(); ++i)
    if (scoring_errors[i]) draws.errors[i] = server_error("sampling failed: " + *scoring_errors[i]);
  const bool argmaxes = !logits.argmax.empty();
  auto draw = [&](size_t i) {
    if (!reaches_the_end(batch.seqs[i], *seqs[i]) || draws.errors[i]) return;
    const SequenceChunk& chunk = batch.seqs[i];
    const int row = first_row[i] + (chunk.all_logits ? int(chunk.tokens.size()) - 1 : 0);
    Sampler& sampler = *seqs[i]->sampler;
    try {
      draws.sampled[i] = argmaxes ? sampler.take_argmax(logits.argmax[size_t(row)])
                                  : sampler.sample(logits.row(row), seqs[i]->tokens);
    } catch (const std::exception&) {
      draws.errors[i] = sampling_error(*seqs[i]->request);
    }
  };
  if (argmaxes) {
    for (size_t i = 0; i < seqs.size(); ++i) draw(i);
  } else {
    tbb::parallel_for(size_t(0), seqs.size(), draw);
  }
  return draws;
}

// Appends the drawn token to its sequence, times it, and lists it in `result` with whether it
// ends the answer; a sequence's first token carries its prompt's scores (empty unless asked for).
// Returns the tokens it counts for vLLM's iteration tokens (Metrics::iteration_tokens): itself,
// and with a sequence's first token its prompt.
int64_t append_token(EngineContext& ctx, const SequencePtr& seq_ptr, SampledToken sampled,
                     Clock::time_point now, StepResult& result) {
  Sequence& seq = *seq_ptr;
  seq.tokens.push_back(sampled.token);
  const int index = seq.generated() - 1;
  std::optional<FinishReason> finish;
  if (ends_the_answer(seq, sampled.token))
    finish = FinishReason::Stop;
  else if (seq.generated() >= seq.max_tokens)
    finish = FinishReason::Length;
  if (finish) seq.last_token_drawn.store(true);
  seq.tokens_drawn.fetch_add(1);
  std::vector<SampledToken> scores;
  int64_t iteration_tokens = 1;
  if (index == 0) {
    ctx.metrics.time_to_first_token.observe(seconds_between(seq.request->arrival, now));
    ctx.metrics.prompt_tokens_prefilled.add(uint64_t(seq.prompt_len));
    seq.first_token_at = now;
    scores = std::move(seq.prompt_scores);
    iteration_tokens += seq.prompt_len;
  } else {
    ctx.metrics.inter_token_latency.observe(seconds_between(seq.last_token_at, now));
  }
  seq.last_token_at = now;
  result.outputs.push_back({seq_ptr, index, std::move(sampled), finish, now, std::move(scores)});
  return iteration_tokens;
}

// Metrics::decode_turnaround_seconds, for a decode pass that ran. Each sequence's last_token_at
// is the end of the forward pass that drew its latest token (not yet this pass's); the latest
// of them is the pass just before this one, unless a pass failed in between, whose time then
// counts in.
void observe_turnaround(EngineContext& ctx, const std::vector<SequencePtr>& seqs,
                        Clock::time_point start) {
  Clock::time_point latest{};
  for (const SequencePtr& seq : seqs) latest = std::max(latest, seq->last_token_at);
  if (latest != Clock::time_point{})
    ctx.metrics.decode_turnaround_seconds.observe(seconds_between(latest, start));
}

}  // namespace

StepResult run_model_step(EngineContext& ctx, const std::vector<SequencePtr>& seqs,
                          const Batch& batch, bool prefill, Logits& logits, int riders) {
  StepResult result;
  result.prefill = prefill;
  result.batch_tokens = batch.total_tokens();
  const auto start = Clock::now();
  if (!forward(ctx, seqs, batch, prefill, logits, riders, result)) return result;
  const auto now = Clock::now();
  if (!prefill) observe_turnaround(ctx, seqs, start);
  (prefill ? ctx.metrics.prefill_forward_seconds : ctx.metrics.decode_forward_seconds)
      .observe(seconds_between(start, now));
  ctx.metrics.pass_tokens.observe(double(result.batch_tokens));

  Draws draws = draw_tokens(seqs, batch, logits);
  int64_t iteration_tokens = 0;  // vLLM's count: see Metrics::iteration_tokens
  for (size_t i = 0; i < seqs.size(); ++i) {
    if (draws.errors[i]) {
      seqs[i]->fail_unless_answered(*draws.errors[i]);
      result.failed.push_back(seqs[i]);
    } else if (reaches_the_end(batch.seqs[i], *seqs[i])) {
      iteration_tokens += append_token(ctx, seqs[i], std::move(draws.sampled[i]), now, result);
    }
  }
  ctx.metrics.iteration_tokens.observe(double(iteration_tokens));
  result.seconds = seconds_between(start, Clock::now());
  return result;
}

}  // namespace pipeline
