// The model stages' shared body when the forward pass throws: the prompts of the pass fail with
// a 500 naming the cause, and the decoding sequences that rode along a prefill pass are handed
// back untouched, to decode again in the next pass, instead of failing with the prompt.
#include <gtest/gtest.h>

#include <stdexcept>

#include "graph/engine_context.h"
#include "stages/model_step.h"
#include "tests/support/collecting_sink.h"
#include "tests/support/shared_data.h"

namespace pipeline {
namespace {

using testing::CollectingSink;

// A runner whose every forward pass fails, as one that runs out of device memory would.
class FailingRunner final : public ModelRunner {
 public:
  FailingRunner() {
    config_.vocab_size = 512;
    kv_shape_.block_size = 16;
    kv_shape_.num_blocks = 64;
  }
  const LlamaConfig& config() const override { return config_; }
  const KvCacheShape& kv_shape() const override { return kv_shape_; }
  std::string device_name() const override { return "failing"; }
  void forward(const Batch&, Logits&) override { throw std::runtime_error("out of memory"); }

 private:
  LlamaConfig config_;
  KvCacheShape kv_shape_;
};

struct StepFixture {
  ServeConfig config;
  Tokenizer tokenizer{testing::shared_path("models/stories260K/tokenizer.model")};
  FailingRunner runner;
  Metrics metrics;
  Scheduler scheduler{config.scheduler, runner.kv_shape().num_blocks, runner.kv_shape().block_size,
                      metrics};
  EngineContext context{config, runner.config(), tokenizer, ChatTemplate::Raw,
                        runner, scheduler,       metrics,   1};
  uint64_t next_number = 0;

  // A sequence of `tokens`, with its new tokens from `start` in `batch`.
  SequencePtr add(std::vector<int32_t> tokens, int start, std::vector<SequencePtr>& seqs,
                  Batch& batch) {
    auto request = std::make_shared<Request>();
    request->id = "cmpl-step-" + std::to_string(next_number);
    request->sink = std::make_shared<CollectingSink>();
    auto seq = std::make_shared<Sequence>(request, next_number++,
                                          [](Sequence&, const ResponseStream::Payload&) {});
    seq->tokens = tokens;
    batch.seqs.push_back({{tokens.begin() + start, tokens.end()}, start, {0}, false});
    seqs.push_back(seq);
    return seq;
  }
};

CollectingSink& sink_of(const SequencePtr& seq) {
  return static_cast<CollectingSink&>(*seq->request->sink);
}

TEST(ModelStep, AFailedPrefillPassFailsItsPromptsAndHandsBackTheSequencesDecodingAlongside) {
  StepFixture f;
  std::vector<SequencePtr> seqs;
  Batch batch;
  const auto prompt = f.add({1, 10, 11, 12}, 0, seqs, batch);
  const auto chunk = f.add({1, 20, 21, 22, 23}, 2, seqs, batch);  // its prompt's second chunk
  const auto decoding = f.add({1, 30, 31}, 2, seqs, batch);
  Logits logits;
  const StepResult result =
      run_model_step(f.context, seqs, batch, /*prefill=*/true, logits, /*riders=*/1);
  EXPECT_EQ(result.failed, (std::vector<SequencePtr>{prompt, chunk}));
  EXPECT_EQ(result.retry, (std::vector<SequencePtr>{decoding}));
  EXPECT_TRUE(result.outputs.empty());
  for (const auto& seq : {prompt, chunk}) {
    ASSERT_TRUE(sink_of(seq).error().has_value()) << seq->request->id;
    EXPECT_EQ(sink_of(seq).error()->http_status, 500);
    EXPECT_EQ(sink_of(seq).error()->message, "forward pass failed: out of memory");
  }
  EXPECT_FALSE(decoding->stream.ended()) << "the decoding sequence went down with the prompts";
  EXPECT_EQ(decoding->tokens, (std::vector<int32_t>{1, 30, 31}));
}

TEST(ModelStep, AFailedDecodePassFailsEverySequence) {
  StepFixture f;
  std::vector<SequencePtr> seqs;
  Batch batch;
  f.add({1, 10, 11}, 2, seqs, batch);
  f.add({1, 20, 21}, 2, seqs, batch);
  Logits logits;
  const StepResult result = run_model_step(f.context, seqs, batch, /*prefill=*/false, logits);
  EXPECT_EQ(result.failed, seqs);
  EXPECT_TRUE(result.retry.empty());
  for (const auto& seq : seqs) EXPECT_TRUE(sink_of(seq).error().has_value());
}

}  // namespace
}  // namespace pipeline
