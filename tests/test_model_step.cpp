// The model stages' shared body. When the forward pass throws, the prompts of the pass fail with
// a 500 naming the cause, and the decoding sequences that rode along a prefill pass are handed
// back untouched, to decode again in the next pass, instead of failing with the prompt; when the
// runner fails for good, every sequence of the pass fails, but one whose answer a stop string
// already ended, and the engine is told. A prompt to score gets each token's score from the row
// before it, once. A token sampled after a stop string ended the text counts nowhere: neither in
// the usage nor among the metrics' generated tokens.
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>

#include "graph/engine_context.h"
#include "stages/detokenize.h"
#include "stages/model_step.h"
#include "tests/support/collecting_sink.h"
#include "tests/support/shared_data.h"

namespace pipeline {
namespace {

using testing::CollectingSink;

// A runner of a 512-word vocabulary and 64 KV blocks; what its forward pass does is the
// subclass's.
class TestRunner : public ModelRunner {
 public:
  TestRunner() {
    config_.vocab_size = 512;
    kv_shape_.block_size = 16;
    kv_shape_.num_blocks = 64;
  }
  const LlamaConfig& config() const override { return config_; }
  const KvCacheShape& kv_shape() const override { return kv_shape_; }
  std::string device_name() const override { return "test"; }

 protected:
  LlamaConfig config_;
  KvCacheShape kv_shape_;
};

// A runner whose every forward pass fails, as one that runs out of device memory would.
class FailingRunner final : public TestRunner {
 public:
  void forward(const Batch&, Logits&) override { throw std::runtime_error("out of memory"); }
};

// A runner whose device is lost: it can run nothing more.
class LostRunner final : public TestRunner {
 public:
  void forward(const Batch&, Logits&) override { throw RunnerFailure("device lost"); }
};

// A runner whose logits depend only on the position: the row of position p puts 10 on token
// p + 1 and 0 elsewhere, so a row's scores tell which row they came from.
class PositionRunner final : public TestRunner {
 public:
  void forward(const Batch& batch, Logits& logits) override {
    logits.vocab = config_.vocab_size;
    logits.data.assign(size_t(batch.logit_rows()) * size_t(logits.vocab), 0.0f);
    int row = 0;
    for (const SequenceChunk& chunk : batch.seqs) {
      const int end = chunk.start_pos + int(chunk.tokens.size());
      for (int p = chunk.all_logits ? chunk.start_pos : end - 1; p < end; ++p)
        logits.row(row++)[size_t(p + 1)] = 10.0f;
    }
  }
};

// A runner that answers every pass with the argmaxes it is given, as a runner answers a batch
// that is argmax_only(); it fails the test if a pass wants rows.
class ArgmaxRunner final : public TestRunner {
 public:
  std::vector<RowArgmax> argmaxes;
  void forward(const Batch& batch, Logits& logits) override {
    EXPECT_TRUE(batch.argmax_only());
    logits.vocab = config_.vocab_size;
    logits.data.clear();
    logits.argmax = argmaxes;
  }
};

template <typename Runner>
struct StepFixture {
  ServeConfig config;
  Tokenizer tokenizer{testing::shared_path("models/stories260K/tokenizer.model")};
  Runner runner;
  Metrics metrics;
  Scheduler scheduler{config.scheduler, runner.kv_shape().num_blocks, runner.kv_shape().block_size,
                      metrics};
  GuidedVocabulary guided_vocabulary{tokenizer, runner.config()};
  std::vector<std::string> runner_failures;  // what the context's engine_failed heard
  EngineContext context{config,
                        runner.config(),
                        tokenizer,
                        guided_vocabulary,
                        ChatTemplate::Raw,
                        runner,
                        scheduler,
                        metrics,
                        1,
                        [this](const std::string& why) { runner_failures.push_back(why); }};
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
  StepFixture<FailingRunner> f;
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
  EXPECT_TRUE(result.pass_failed);  // the prefill stage logs no "prefilled" line for it
  for (const auto& seq : {prompt, chunk}) {
    ASSERT_TRUE(sink_of(seq).error().has_value()) << seq->request->id;
    EXPECT_EQ(sink_of(seq).error()->http_status, 500);
    EXPECT_EQ(sink_of(seq).error()->message, "forward pass failed: out of memory");
  }
  EXPECT_FALSE(decoding->stream.ended()) << "the decoding sequence went down with the prompts";
  EXPECT_EQ(decoding->tokens, (std::vector<int32_t>{1, 30, 31}));
}

TEST(ModelStep, AFailedDecodePassFailsEverySequence) {
  StepFixture<FailingRunner> f;
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

TEST(ModelStep, ARunnerFailureFailsEverySequenceRidersTooAndIsReported) {
  StepFixture<LostRunner> f;
  std::vector<SequencePtr> seqs;
  Batch batch;
  f.add({1, 10, 11, 12}, 0, seqs, batch);
  f.add({1, 30, 31}, 2, seqs, batch);  // decoding alongside
  Logits logits;
  const StepResult result =
      run_model_step(f.context, seqs, batch, /*prefill=*/true, logits, /*riders=*/1);
  EXPECT_EQ(result.failed, seqs);
  EXPECT_TRUE(result.retry.empty());
  for (const auto& seq : seqs) {
    ASSERT_TRUE(sink_of(seq).error().has_value()) << seq->request->id;
    EXPECT_EQ(sink_of(seq).error()->http_status, 503);
    EXPECT_EQ(sink_of(seq).error()->code, "engine_failed");
  }
  EXPECT_EQ(f.runner_failures, (std::vector<std::string>{"the model runner failed: device lost"}));
}

// Detokenize found a stop string in a sequence's last token, and the scheduler, which had not
// seen it yet, put the sequence in the next pass, which fails: its answer is complete, on its
// way to the client, and the failure does not take it. Returns the other sequence's error.
template <typename Runner>
RequestError error_beside_a_stopped_answer(StepFixture<Runner>& f) {
  std::vector<SequencePtr> seqs;
  Batch batch;
  const auto stopped = f.add({1, 10, 11}, 2, seqs, batch);
  stopped->stopped.store(true);
  const auto decoding = f.add({1, 20, 21}, 2, seqs, batch);
  Logits logits;
  const StepResult result = run_model_step(f.context, seqs, batch, /*prefill=*/false, logits);
  EXPECT_EQ(result.failed, seqs) << "the scheduler frees both";
  EXPECT_FALSE(stopped->stream.ended()) << "the complete answer was failed";
  EXPECT_TRUE(sink_of(decoding).error().has_value());
  return sink_of(decoding).error().value_or(RequestError{});
}

TEST(ModelStep, ARunnerFailureLeavesAnAnswerAStopStringEndedToBeDelivered) {
  StepFixture<LostRunner> f;
  EXPECT_EQ(error_beside_a_stopped_answer(f).code, "engine_failed");
  EXPECT_EQ(f.runner_failures, (std::vector<std::string>{"the model runner failed: device lost"}));
}

// The same for a pass that fails without the runner (a 500).
TEST(ModelStep, AFailedPassLeavesAnAnswerAStopStringEndedToBeDelivered) {
  StepFixture<FailingRunner> f;
  EXPECT_EQ(error_beside_a_stopped_answer(f).http_status, 500);
}

// A prompt preempted during its prefill after two of its tokens were scored computes its prompt
// again from the start: the rows it scored then are not scored twice, the others are, each
// token from the row before it, and the first token sampled comes from the chunk's last row.
TEST(ModelStep, AScoredPromptScoresEachTokenOnceFromTheRowBeforeIt) {
  StepFixture<PositionRunner> f;
  std::vector<SequencePtr> seqs;
  Batch batch;
  const std::vector<int32_t> prompt = {1, 1, 2, 3, 99, 5};  // token 4 is not what row 3 expects
  const auto seq = f.add(prompt, 0, seqs, batch);
  batch.seqs[0].all_logits = true;
  seq->request->prompt_logprobs = true;
  seq->request->sampling.temperature = 0.0f;
  seq->request->sampling.top_logprobs = 1;
  seq->prompt_len = int(prompt.size());
  seq->max_tokens = 4;
  seq->sampler = std::make_unique<Sampler>(seq->request->sampling, 1);
  seq->prompt_scores = {SampledToken{1, -42.0f, {}}, SampledToken{2, -42.0f, {}}};
  Logits logits;
  const StepResult result = run_model_step(f.context, seqs, batch, /*prefill=*/true, logits);
  EXPECT_FALSE(result.pass_failed);
  ASSERT_EQ(result.outputs.size(), 1u);
  const SampledOutput& out = result.outputs[0];
  EXPECT_EQ(out.sampled.token, 6);  // the last row's
  ASSERT_EQ(out.prompt_scores.size(), prompt.size() - 1);
  EXPECT_EQ(out.prompt_scores[0].logprob, -42.0f);
  EXPECT_EQ(out.prompt_scores[1].logprob, -42.0f);
  const float likely = float(10.0 - std::log(std::exp(10.0) + 511.0));
  const float unlikely = float(0.0 - std::log(std::exp(10.0) + 511.0));
  for (size_t i = 2; i < out.prompt_scores.size(); ++i) {
    SCOPED_TRACE("score of prompt token " + std::to_string(i + 1));
    EXPECT_EQ(out.prompt_scores[i].token, prompt[i + 1]);
    EXPECT_NEAR(out.prompt_scores[i].logprob, prompt[i + 1] == 99 ? unlikely : likely, 1e-5);
    ASSERT_EQ(out.prompt_scores[i].top.size(), 1u);
    EXPECT_EQ(out.prompt_scores[i].top[0].token, int32_t(i + 1));
  }
  EXPECT_TRUE(seq->prompt_scores.empty()) << "the scores went out with the first token";
}

// A pass that returned only its rows' argmaxes draws each greedy sequence's token from its own;
// a row without a finite maximum fails its sequence as a row of logits without one would.
TEST(ModelStep, AnArgmaxOnlyPassDrawsEachTokenFromItsRowsArgmax) {
  StepFixture<ArgmaxRunner> f;
  f.runner.argmaxes = {{7, 3.5f}, {9, -INFINITY}};
  std::vector<SequencePtr> seqs;
  Batch batch;
  const auto drawn = f.add({1, 10, 11}, 2, seqs, batch);
  const auto lost = f.add({1, 20, 21}, 2, seqs, batch);
  for (size_t i = 0; i < seqs.size(); ++i) {
    seqs[i]->request->sampling.temperature = 0.0f;
    seqs[i]->prompt_len = 2;
    seqs[i]->max_tokens = 4;
    seqs[i]->sampler = std::make_unique<Sampler>(seqs[i]->request->sampling, 1);
    batch.seqs[i].argmax_only = true;
  }
  Logits logits;
  const StepResult result = run_model_step(f.context, seqs, batch, /*prefill=*/false, logits);
  ASSERT_EQ(result.outputs.size(), 1u);
  EXPECT_EQ(result.outputs[0].seq, drawn);
  EXPECT_EQ(result.outputs[0].sampled.token, 7);
  EXPECT_EQ(drawn->tokens, (std::vector<int32_t>{1, 10, 11, 7}));
  EXPECT_EQ(result.failed, (std::vector<SequencePtr>{lost}));
  ASSERT_TRUE(sink_of(lost).error().has_value());
  EXPECT_EQ(sink_of(lost).error()->http_status, 500);
  EXPECT_EQ(sink_of(lost).error()->message,
            "sampling failed: Sampler::sample: logits have no finite maximum");
}

// The scheduler may run a sequence once more before detokenize has found that a stop string
// ended it: the token of that pass is dropped, and as usage does not count it, the generated
// tokens metric does not either.
TEST(ModelStep, ATokenSampledAfterAStopStringIsNotCountedAsGenerated) {
  StepFixture<PositionRunner> f;
  DetokenizeStage detokenize(f.context);
  constexpr int32_t kStopToken = 300;  // what the row of the prompt's last position samples
  std::vector<int32_t> prompt(size_t(kStopToken), 300);
  prompt.front() = 1;
  std::vector<int32_t> stopped = prompt;
  stopped.push_back(kStopToken);
  const std::string stop = f.tokenizer.decode(stopped).substr(f.tokenizer.decode(prompt).size());
  ASSERT_FALSE(stop.empty());
  std::vector<SequencePtr> seqs;
  Batch batch;
  const auto seq = f.add(prompt, kStopToken - 1, seqs, batch);
  seq->request->sampling.temperature = 0.0f;
  seq->prompt_len = kStopToken;
  seq->max_tokens = 8;
  seq->sampler = std::make_unique<Sampler>(seq->request->sampling, 1);
  seq->text =
      std::make_unique<TextState>(f.tokenizer, seq->tokens, std::vector<std::string>{stop}, false);
  std::vector<StreamEvent> events;
  const auto collect = [&](Message message) {
    for (StreamEvent& event : std::get<StreamEvents>(message).events)
      events.push_back(std::move(event));
  };
  Logits logits;
  detokenize(run_model_step(f.context, seqs, batch, /*prefill=*/false, logits), collect);
  ASSERT_TRUE(seq->stopped.load());
  Batch again;  // as the scheduler ran it before it saw the stop
  again.seqs.push_back({{kStopToken}, kStopToken, {0}, false});
  detokenize(run_model_step(f.context, seqs, again, /*prefill=*/false, logits), collect);
  ASSERT_FALSE(events.empty());
  const auto* completion = std::get_if<Completion>(&events.back().payload);
  ASSERT_NE(completion, nullptr);
  EXPECT_EQ(completion->completion_tokens, 1);
  EXPECT_EQ(f.metrics.generated_tokens.value(), 1u);
}

}  // namespace
}  // namespace pipeline
