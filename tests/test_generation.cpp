// The simple generation loop, on a fake ModelRunner whose next token is a function of the
// whole history it reads back through the block tables: a sequence whose blocks were mixed
// up, shared or lost would continue differently. The fake also checks every Batch's
// positions and block tables.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "model/generation.h"

namespace pipeline {
namespace {

constexpr int kVocab = 32;
constexpr int32_t kEos = 2;
constexpr float kNextLogit = 4.0f;  // the predicted token's logit; every other token has 0

// The model: the next token after `history` (which ends at position history.size() - 1).
int32_t next_token(const std::vector<int32_t>& history) {
  const int64_t sum = std::accumulate(history.begin(), history.end(), int64_t(0));
  return int32_t((7 * history.back() + 3 * int64_t(history.size() - 1) + sum) % kVocab);
}

class FakeRunner : public ModelRunner {
 public:
  FakeRunner(int context, int block_size, int num_blocks) {
    config_.vocab_size = kVocab;
    config_.max_position_embeddings = context;
    config_.eos_token_ids = {kEos};
    shape_.num_layers = 1;
    shape_.num_kv_heads = 1;
    shape_.head_dim = 1;
    shape_.block_size = block_size;
    shape_.num_blocks = num_blocks;
    slots_.assign(size_t(num_blocks) * block_size, kEmpty);
  }

  const LlamaConfig& config() const override { return config_; }
  const KvCacheShape& kv_shape() const override { return shape_; }
  std::string device_name() const override { return "fake"; }

  void forward(const Batch& batch, Logits& logits) override {
    batches.push_back({batch.is_decode(), int(batch.seqs.size())});
    std::set<int32_t> blocks_in_batch;
    logits.vocab = kVocab;
    logits.data.assign(size_t(batch.logit_rows()) * kVocab, 0.0f);
    for (size_t row = 0; row < batch.seqs.size(); ++row) {
      const SequenceChunk& seq = batch.seqs[row];
      const int end = seq.start_pos + int(seq.tokens.size());
      ASSERT_FALSE(seq.tokens.empty());
      ASSERT_FALSE(seq.all_logits);
      ASSERT_GE(int(seq.block_table.size()), shape_.blocks_for(end)) << "table too short";
      for (int32_t block : seq.block_table) {
        ASSERT_TRUE(block >= 0 && block < shape_.num_blocks) << "block " << block;
        ASSERT_TRUE(blocks_in_batch.insert(block).second) << "block " << block << " is shared";
      }
      for (int pos = 0; pos < int(seq.tokens.size()); ++pos)
        slot(seq.block_table, seq.start_pos + pos) = seq.tokens[pos];
      // Read the whole history back through the table.
      std::vector<int32_t> history;
      for (int pos = 0; pos < end; ++pos) {
        const int32_t token = slot(seq.block_table, pos);
        ASSERT_NE(token, kEmpty) << "position " << pos << " was never written";
        history.push_back(token);
      }
      logits.row(int(row))[next_token(history)] = kNextLogit;
    }
    if (drop_a_row) logits.data.resize(logits.data.size() - kVocab);
  }

  struct BatchSeen {
    bool decode;
    int sequences;
    bool operator==(const BatchSeen&) const = default;
  };
  std::vector<BatchSeen> batches;
  bool drop_a_row = false;  // a broken runner, for the loop's check

 private:
  static constexpr int32_t kEmpty = -1;
  int32_t& slot(const std::vector<int32_t>& table, int pos) {
    return slots_[size_t(table[pos / shape_.block_size]) * shape_.block_size +
                  pos % shape_.block_size];
  }

  LlamaConfig config_;
  KvCacheShape shape_;
  std::vector<int32_t> slots_;  // the "KV cache": the token at each block slot
};

// What greedy generation must produce, computed without the loop.
std::vector<int32_t> reference(std::vector<int32_t> prompt, int max_new, bool ignore_eos) {
  std::vector<int32_t> generated;
  while (int(generated.size()) < max_new) {
    generated.push_back(next_token(prompt));
    prompt.push_back(generated.back());
    if (!ignore_eos && generated.back() == kEos) break;
  }
  return generated;
}

GenerationRequest greedy(std::vector<int32_t> prompt, int max_tokens) {
  GenerationRequest request;
  request.prompt = std::move(prompt);
  request.sampling.temperature = 0.0f;
  request.max_tokens = max_tokens;
  return request;
}

std::vector<int32_t> prompt_of_length(int length, int32_t first) {
  std::vector<int32_t> prompt;
  for (int i = 0; i < length; ++i) prompt.push_back((first + 5 * i) % kVocab);
  return prompt;
}

// A two-token prompt whose greedy continuation reaches EOS after a few tokens.
std::pair<std::vector<int32_t>, int> prompt_reaching_eos() {
  for (int32_t second = 3; second < kVocab; ++second) {
    const std::vector<int32_t> prompt{1, second};
    const std::vector<int32_t> generated = reference(prompt, 30, false);
    if (generated.size() >= 3 && generated.size() < 30) return {prompt, int(generated.size())};
  }
  throw std::logic_error("no prompt of the fake model reaches EOS within 30 tokens");
}

TEST(Generation, GreedyFollowsTheModelUpToMaxTokens) {
  FakeRunner runner(64, 4, 32);
  Generator generator(runner, 0);
  GenerationRequest request = greedy({1, 5, 9}, 10);
  request.ignore_eos = true;
  request.sampling.logprobs = true;
  const std::vector<GenerationResult> results =
      generator.run(std::vector<GenerationRequest>{request});
  ASSERT_EQ(results.size(), 1u);
  EXPECT_EQ(results[0].tokens, reference({1, 5, 9}, 10, true));
  EXPECT_EQ(results[0].finish, FinishReason::Length);
  ASSERT_EQ(results[0].sampled.size(), 10u);
  const float expected_logprob = kNextLogit - std::log(std::exp(kNextLogit) + float(kVocab - 1));
  for (const SampledToken& sampled : results[0].sampled)
    EXPECT_NEAR(sampled.logprob, expected_logprob, 1e-5);
  EXPECT_GT(results[0].prefill_seconds, 0.0);
  EXPECT_GT(results[0].decode_seconds, 0.0);
  EXPECT_EQ(generator.blocks().num_used(), 0);
  // One prefill, then one decode step per token after the first.
  ASSERT_EQ(runner.batches.size(), 10u);
  EXPECT_FALSE(runner.batches[0].decode);
  EXPECT_TRUE(runner.batches[1].decode);
}

TEST(Generation, StopsAtEndOfSequenceUnlessIgnored) {
  const auto [prompt, length] = prompt_reaching_eos();
  FakeRunner runner(64, 4, 32);
  Generator generator(runner, 0);
  std::vector<GenerationResult> results =
      generator.run(std::vector<GenerationRequest>{greedy(prompt, 0)});
  EXPECT_EQ(results[0].tokens, reference(prompt, 30, false));
  EXPECT_EQ(int(results[0].tokens.size()), length);
  EXPECT_EQ(results[0].tokens.back(), kEos);  // the stop token is reported
  EXPECT_EQ(results[0].finish, FinishReason::Stop);

  GenerationRequest ignoring = greedy(prompt, length + 3);
  ignoring.ignore_eos = true;
  results = generator.run(std::vector<GenerationRequest>{ignoring});
  EXPECT_EQ(results[0].tokens, reference(prompt, length + 3, true));
  EXPECT_EQ(results[0].tokens[length - 1], kEos);
  EXPECT_EQ(results[0].finish, FinishReason::Length);
  EXPECT_EQ(generator.blocks().num_used(), 0);
}

TEST(Generation, StopsAtTheEndOfTheContext) {
  FakeRunner runner(24, 4, 12);
  Generator generator(runner, 0);
  GenerationRequest request = greedy(prompt_of_length(20, 3), 0);  // 0: up to the context end
  request.ignore_eos = true;
  GenerationRequest capped = request;
  capped.max_tokens = 100;
  const std::vector<GenerationResult> results =
      generator.run(std::vector<GenerationRequest>{request, capped});
  for (const GenerationResult& result : results) {
    EXPECT_EQ(result.tokens, reference(request.prompt, 4, true));
    EXPECT_EQ(result.finish, FinishReason::Length);
  }
  EXPECT_EQ(generator.blocks().num_used(), 0);
}

TEST(Generation, JoiningAtDifferentStepsGivesTheSameTokensAsRunningAlone) {
  std::vector<GenerationRequest> requests;
  const int lengths[] = {3, 6, 9, 4, 5};
  const int join_steps[] = {0, 0, 2, 5, 5};
  for (int i = 0; i < 5; ++i) {
    GenerationRequest request;
    request.prompt = prompt_of_length(lengths[i], 1 + i);
    request.sampling.temperature = 1.0f;  // the fake's predicted token has p = 0.64
    request.sampling.seed = 100 + i;
    request.sampling.top_logprobs = 2;
    request.max_tokens = 12 - i;
    request.ignore_eos = true;
    request.join_step = join_steps[i];
    requests.push_back(request);
  }
  requests[4].sampling.temperature = 0.0f;

  FakeRunner runner(64, 4, 64);
  Generator generator(runner, 0);
  const std::vector<GenerationResult> together = generator.run(requests);
  EXPECT_EQ(generator.blocks().num_used(), 0);

  // Joins: two prompts prefilled together, decoded together; one more at step 2, two at 5.
  const std::vector<FakeRunner::BatchSeen> expected_start{{false, 2}, {true, 2},  {true, 2},
                                                          {false, 1}, {true, 3},  {true, 3},
                                                          {true, 3},  {false, 2}, {true, 5}};
  ASSERT_GE(runner.batches.size(), expected_start.size());
  EXPECT_TRUE(std::equal(expected_start.begin(), expected_start.end(), runner.batches.begin()));

  for (size_t i = 0; i < requests.size(); ++i) {
    GenerationRequest alone = requests[i];
    alone.join_step = 0;
    FakeRunner solo_runner(64, 4, 64);
    const GenerationResult solo =
        Generator(solo_runner, 0).run(std::vector<GenerationRequest>{alone})[0];
    EXPECT_EQ(together[i].tokens, solo.tokens) << "request " << i;
    ASSERT_EQ(together[i].sampled.size(), solo.sampled.size());
    for (size_t t = 0; t < solo.sampled.size(); ++t) {
      EXPECT_EQ(together[i].sampled[t].logprob, solo.sampled[t].logprob);
      ASSERT_EQ(together[i].sampled[t].top.size(), 2u);
      EXPECT_EQ(together[i].sampled[t].top[0].token, solo.sampled[t].top[0].token);
    }
    EXPECT_EQ(int(together[i].tokens.size()), requests[i].max_tokens);
  }
  // Sampling did draw other tokens than the greedy prediction somewhere.
  std::vector<int32_t> history = requests[0].prompt;
  int off_prediction = 0;
  for (int32_t token : together[0].tokens) {
    off_prediction += token != next_token(history);
    history.push_back(token);
  }
  EXPECT_GT(off_prediction, 0);
}

TEST(Generation, UnseededRequestsUseTheFallbackSeedPlusTheirIndex) {
  std::vector<GenerationRequest> unseeded(2);
  for (GenerationRequest& request : unseeded) {
    request.prompt = {1, 4, 7};
    request.max_tokens = 10;
    request.ignore_eos = true;
  }
  FakeRunner runner(64, 4, 16);
  const std::vector<GenerationResult> results = Generator(runner, 500).run(unseeded);
  for (size_t i = 0; i < 2; ++i) {
    GenerationRequest seeded = unseeded[i];
    seeded.sampling.seed = 500 + i;
    FakeRunner solo_runner(64, 4, 16);
    EXPECT_EQ(Generator(solo_runner, 0).run(std::vector<GenerationRequest>{seeded})[0].tokens,
              results[i].tokens);
  }
}

TEST(Generation, CallbackSeesEveryTokenInOrder) {
  std::vector<GenerationRequest> requests{greedy({1, 3}, 5), greedy({1, 8, 8}, 7)};
  requests[1].join_step = 2;
  for (GenerationRequest& request : requests) request.ignore_eos = true;
  std::vector<std::vector<int32_t>> streamed(2);
  FakeRunner runner(64, 4, 16);
  const std::vector<GenerationResult> results =
      Generator(runner, 0).run(requests, [&](size_t request, const SampledToken& token) {
        streamed.at(request).push_back(token.token);
      });
  EXPECT_EQ(streamed[0], results[0].tokens);
  EXPECT_EQ(streamed[1], results[1].tokens);
  EXPECT_EQ(results[1].tokens.size(), 7u);
}

TEST(Generation, RequestThatEndsInPrefillFreesItsBlocksAtOnce) {
  const auto [prompt, length] = prompt_reaching_eos();
  FakeRunner runner(64, 4, 16);
  Generator generator(runner, 0);
  std::vector<GenerationRequest> requests{greedy(prompt_of_length(8, 2), 1), greedy(prompt, 0)};
  requests[0].ignore_eos = true;
  const std::vector<GenerationResult> results = generator.run(requests);
  EXPECT_EQ(results[0].tokens.size(), 1u);
  EXPECT_EQ(int(results[1].tokens.size()), length);
  // After the prefill only the second request decodes.
  for (size_t i = 1; i < runner.batches.size(); ++i)
    EXPECT_EQ(runner.batches[i], (FakeRunner::BatchSeen{true, 1}));
}

void expect_error(Generator& generator, const std::vector<GenerationRequest>& requests,
                  const std::string& message) {
  try {
    generator.run(requests);
    ADD_FAILURE() << "no error, expected: " << message;
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
  }
}

TEST(Generation, BadRequestsAreRejectedByName) {
  FakeRunner runner(24, 4, 8);
  Generator generator(runner, 0);
  const GenerationRequest good = greedy({1, 2, 3}, 4);
  expect_error(generator, {good, greedy({}, 4)}, "request 1: the prompt is empty");
  expect_error(generator, {greedy(prompt_of_length(24, 1), 4)},
               "request 0: the prompt has 24 tokens, which leaves no room in the context of 24");
  expect_error(generator, {greedy({1, 32}, 4)},
               "request 0: prompt token 32 at index 1 is outside the vocabulary of 32");
  GenerationRequest hot = good;
  hot.sampling.temperature = 3.0f;
  expect_error(generator, {good, hot}, "request 1: temperature must be between 0 and 2");
  GenerationRequest negative = good;
  negative.max_tokens = -1;
  expect_error(generator, {negative}, "request 0: max_tokens must be at least 0");
  negative = good;
  negative.join_step = -1;
  expect_error(generator, {negative}, "request 0: join_step must be at least 0");
  EXPECT_EQ(runner.batches.size(), 0u);  // all checked before any work
}

TEST(Generation, KvPoolTooSmallIsAClearError) {
  // One request alone needs 5 blocks of 4 for its 19 cached tokens; the pool has 4.
  FakeRunner small(64, 4, 4);
  Generator generator(small, 0);
  expect_error(generator, {greedy(prompt_of_length(10, 1), 10)},
               "request 0: needs 5 KV blocks for 19 tokens, the pool holds only 4");

  // Each fits alone, not all together: the run fails while they decode together...
  FakeRunner shared(64, 4, 6);
  Generator crowded(shared, 0);
  std::vector<GenerationRequest> requests{greedy(prompt_of_length(8, 1), 12),
                                          greedy(prompt_of_length(8, 2), 12)};
  for (GenerationRequest& request : requests) request.ignore_eos = true;
  expect_error(crowded, requests, "the KV cache ran out");
  // ... or at admission, and the generator stays usable afterwards.
  requests[1].prompt = prompt_of_length(13, 2);
  requests[1].max_tokens = 3;
  requests[1].join_step = 1;
  expect_error(crowded, requests, "request 1: the KV cache is full");
  const std::vector<GenerationResult> results =
      crowded.run(std::vector<GenerationRequest>{requests[0]});
  EXPECT_EQ(results[0].tokens, reference(requests[0].prompt, 12, true));
  EXPECT_EQ(crowded.blocks().num_used(), 0);
}

TEST(Generation, RunnerReturningTheWrongRowsIsAnError) {
  FakeRunner runner(64, 4, 16);
  runner.drop_a_row = true;
  Generator generator(runner, 0);
  EXPECT_THROW(generator.run(std::vector<GenerationRequest>{greedy({1, 2}, 3)}), std::logic_error);
}

TEST(Batch, CountsTokensAndLogitRows) {
  Batch prefill;
  prefill.seqs.push_back({.tokens = {1, 2, 3}, .start_pos = 0, .block_table = {0}});
  prefill.seqs.push_back(
      {.tokens = {4, 5}, .start_pos = 0, .block_table = {1}, .all_logits = true});
  EXPECT_EQ(prefill.total_tokens(), 5);
  EXPECT_EQ(prefill.logit_rows(), 3);
  EXPECT_FALSE(prefill.is_decode());

  Batch decode;
  decode.seqs.push_back({.tokens = {7}, .start_pos = 3, .block_table = {0}});
  decode.seqs.push_back({.tokens = {8}, .start_pos = 2, .block_table = {1}});
  EXPECT_EQ(decode.total_tokens(), 2);
  EXPECT_EQ(decode.logit_rows(), 2);
  EXPECT_TRUE(decode.is_decode());
  EXPECT_FALSE(Batch{}.is_decode());
}

}  // namespace
}  // namespace pipeline
