// Each stage of the serving graph alone: its node body called as the flow graph calls it, with
// LLaMA-2's tokenizer and vocabulary. This is the host's work per request and per step, the
// part of serving that a faster device does not shorten: on a GPU, every microsecond the model
// stages and the scheduler spend between two forward passes is a microsecond the device waits.
//
// The model stages (prefill, decode_step) run over FixedLogitsRunner, a ModelRunner whose
// forward pass leaves random logits of 32,000 words in place (drawn at the first call), so
// their figure is the stage's own work around the forward pass: each sequence's sampling (in
// parallel, as the stage does it) and the bookkeeping. bench_cpu_forward and bench_cuda_decode
// time the forward passes themselves, the logits' way to the host included.
//
// Needs LLaMA-2's tokenizer.model: PIPELINE_BENCH_TOKENIZER, default
// ../shared/models/llama2-tokenizer/tokenizer.model (from the repository root). The stages log as
// they do in a server (tokenize: a line per request): send stderr to a file.
#include <benchmark/benchmark.h>
#include <concurrentqueue/blockingconcurrentqueue.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "graph/engine_context.h"
#include "graph/message.h"
#include "graph/metrics.h"
#include "graph/scheduler.h"
#include "graph/serve_config.h"
#include "graph/stage_registry.h"
#include "io/grammar.h"
#include "io/json_schema.h"
#include "io/tokenizer.h"
#include "model/guided_decoding.h"
#include "model/model_runner.h"
#include "model/sampling.h"

namespace pipeline {
namespace {

constexpr int kVocab = 32000;

// LLaMA-2-7B's shape: what the stages read of a model is its vocabulary, context and EOS ids.
LlamaConfig llama2_7b_config() {
  LlamaConfig c;
  c.hidden_size = 4096;
  c.intermediate_size = 11008;
  c.num_layers = 32;
  c.num_heads = c.num_kv_heads = 32;
  c.head_dim = 128;
  c.vocab_size = kVocab;
  c.max_position_embeddings = 4096;
  return c;
}

// A ModelRunner without a model: forward() gives each logit row random logits, drawn when the
// rows are first needed and left in place after (normal, standard deviation 3: a few dozen words
// hold most of the probability, as in a trained model's next-word distribution). A batch that is
// argmax_only() gets the argmaxes of such rows, found once, as a GPU runner returns them.
class FixedLogitsRunner final : public ModelRunner {
 public:
  FixedLogitsRunner() : config_(llama2_7b_config()) {
    kv_shape_.num_layers = config_.num_layers;
    kv_shape_.num_kv_heads = config_.num_kv_heads;
    kv_shape_.head_dim = config_.head_dim;
    kv_shape_.block_size = 16;
    kv_shape_.num_blocks = 1 << 20;  // bookkeeping only: no KV memory behind it
  }
  const LlamaConfig& config() const override { return config_; }
  const KvCacheShape& kv_shape() const override { return kv_shape_; }
  std::string device_name() const override { return "fixed logits"; }
  void forward(const Batch& batch, Logits& logits) override {
    if (batch.argmax_only()) {
      if (argmaxes_.size() != size_t(batch.logit_rows())) {
        Logits rows;
        fill_rows(batch, rows);
        argmaxes_.clear();
        for (int r = 0; r < rows.rows(); ++r) argmaxes_.push_back(argmax_of(rows.row(r)));
      }
      logits.vocab = kVocab;
      logits.data.clear();
      logits.argmax = argmaxes_;
      return;
    }
    logits.argmax.clear();
    fill_rows(batch, logits);
  }

 private:
  void fill_rows(const Batch& batch, Logits& logits) {
    const size_t size = size_t(batch.logit_rows()) * kVocab;
    if (logits.vocab == kVocab && logits.data.size() == size) return;
    logits.vocab = kVocab;
    logits.data.resize(size);
    std::normal_distribution<float> normal(0.0f, 3.0f);
    for (float& x : logits.data) x = normal(rng_);
  }

  std::vector<RowArgmax> argmaxes_;
  LlamaConfig config_;
  KvCacheShape kv_shape_;
  std::mt19937 rng_{42};
};

// Counts the deltas that reach it and keeps nothing, so emit's figure is emit's own work and
// the benchmark can check that every delta arrived.
class CountingSink final : public RequestSink {
 public:
  void on_delta(Delta) override { ++deltas; }
  void on_finish(const Completion&) override {}
  void on_error(const RequestError&) override {}
  uint64_t deltas = 0;
};

// English prose of `words` words, for prompts.
std::string prose(int words) {
  static const char* kText[] = {"The",    "old",    "lighthouse", "keeper",   "climbed",  "the",
                                "spiral", "stairs", "every",      "evening,", "counting", "each",
                                "step",   "aloud",  "so",         "that",     "the",      "silence",
                                "would",  "not",    "feel",       "so",       "heavy."};
  std::string text;
  for (int i = 0; i < words; ++i) {
    if (i) text += ' ';
    text += kText[i % std::size(kText)];
  }
  return text;
}

// What every stage shares, with LLaMA-2's tokenizer and a FixedLogitsRunner.
struct StageBench {
  explicit StageBench(const std::filesystem::path& tokenizer_file)
      : tokenizer(tokenizer_file),
        scheduler(config.scheduler, runner.kv_shape().num_blocks, runner.kv_shape().block_size,
                  metrics),
        guided_vocabulary(tokenizer, runner.config()),
        context{config,
                runner.config(),
                tokenizer,
                guided_vocabulary,
                ChatTemplate::Llama2,
                runner,
                scheduler,
                metrics,
                1,
                nullptr}  // a FixedLogitsRunner never fails
  {}

  // The registry's stage `name`, on `on` (by default the shared context).
  std::unique_ptr<Stage> make(const std::string& name, EngineContext* on = nullptr) {
    GraphNodeSpec spec;
    spec.name = spec.stage = name;
    return StageRegistry::global().find(name)->make(spec, on ? *on : context);
  }

  // A chat request of a system prompt and a `words`-word user message, through tokenize.
  SequencePtr tokenized(int words, const SamplingParams& sampling, bool json_object = false,
                        int truncate_prompt_tokens = 0) {
    auto request = std::make_shared<Request>();
    request->id = "chatcmpl-bench-" + std::to_string(next_number);
    request->messages = {{"system", "You are a helpful assistant."}, {"user", prose(words)}};
    request->truncate_prompt_tokens = truncate_prompt_tokens;
    request->sampling = sampling;
    if (json_object) request->json_schema = JsonSchema::any_object();
    request->ignore_eos = true;   // random logits pick the EOS id too
    request->stop = {"\nUser:"};  // detokenize matches it across tokens
    request->sink = std::make_shared<CountingSink>();
    auto seq = std::make_shared<Sequence>(request, next_number++,
                                          [](Sequence&, const ResponseStream::Payload&) {});
    (*tokenize)(Submitted{seq}, [](Message) {});
    return seq;
  }

  // `count` requests of a 32-word question, tokenized.
  std::vector<SequencePtr> tokenized_requests(int count, const SamplingParams& sampling,
                                              bool json_object = false) {
    std::vector<SequencePtr> seqs;
    for (int i = 0; i < count; ++i) seqs.push_back(tokenized(32, sampling, json_object));
    return seqs;
  }

  ServeConfig config;
  Tokenizer tokenizer;
  FixedLogitsRunner runner;
  Metrics metrics;
  Scheduler scheduler;
  GuidedVocabulary guided_vocabulary;
  EngineContext context;
  std::unique_ptr<Stage> tokenize = make("tokenize");
  uint64_t next_number = 0;
};

std::filesystem::path tokenizer_file() {
  const char* path = std::getenv("PIPELINE_BENCH_TOKENIZER");
  return path && *path ? path : "../shared/models/llama2-tokenizer/tokenizer.model";
}

// The shared setup, or why there is none.
StageBench* bench(benchmark::State& state) {
  static std::string error;
  static std::unique_ptr<StageBench> instance = [] {
    const auto file = tokenizer_file();
    if (!std::filesystem::exists(file)) {
      error = "no tokenizer at " + file.string() +
              ": set PIPELINE_BENCH_TOKENIZER to LLaMA-2's tokenizer.model";
      return std::unique_ptr<StageBench>();
    }
    return std::make_unique<StageBench>(file);
  }();
  if (!instance) state.SkipWithError(error.c_str());
  return instance.get();
}

SamplingParams greedy() {
  SamplingParams p;
  p.temperature = 0.0f;
  return p;
}

SamplingParams nucleus() {
  SamplingParams p;
  p.temperature = 0.8f;
  p.top_p = 0.95f;
  return p;
}

// A decode step's batch: one token per sequence after its prompt (the runner reads no KV).
DecodeBatch decode_batch(const std::vector<SequencePtr>& seqs) {
  DecodeBatch work;
  work.seqs = seqs;
  for (const auto& seq : seqs)
    work.batch.seqs.push_back({{seq->tokens.back()}, int32_t(seq->tokens.size()) - 1, {}, false});
  return work;
}

// tokenize: a chat request (system prompt + a user message of range(0) words, its last range(1)
// tokens kept when not 0) → its token ids, sampler and text state, or its refusal when it does
// not fit LLaMA-2's 4,096 positions. Includes making the Sequence, as the engine does on submit.
void BM_Stage_tokenize(benchmark::State& state) {
  StageBench* b = bench(state);
  if (!b) return;
  const int words = int(state.range(0));
  const int keep = int(state.range(1));
  for (auto _ : state) benchmark::DoNotOptimize(b->tokenized(words, greedy(), false, keep));
  state.counters["prompt_tokens"] = double(b->tokenized(words, greedy(), false, keep)->prompt_len);
  // The user message alone: each iteration also builds it (about 1 ms a megabyte).
  state.counters["prompt_MB"] = double(prose(words).size()) / 1e6;
}
// 200,000 words: a 1.4 MB prompt, refused (0) or truncated to its last 1,000 tokens.
BENCHMARK(BM_Stage_tokenize)
    ->Args({32, 0})
    ->Args({1024, 0})
    ->Args({200000, 0})
    ->Args({200000, 1000})
    ->Unit(benchmark::kMicrosecond);

// batch_window: the scheduler's round trip in steady decoding. With range(0) sequences running,
// one iteration posts a decode step's result (each sequence one token longer) and takes the next
// DecodeBatch: the scheduling pass runs on the posting thread (Scheduler::post), so this is the
// pass alone, the policy, the block tables' growth and the batch's assembly, with no thread to
// wake. (The graph then hands the batch on through its arena's queue.)
void BM_Stage_batch_window(benchmark::State& state) {
  StageBench* b = bench(state);
  if (!b) return;
  const int seqs = int(state.range(0));
  SchedulerSection section;
  section.window_ms = 0;
  section.max_batch = section.max_num_seqs = seqs;
  Scheduler scheduler(section, b->runner.kv_shape().num_blocks, b->runner.kv_shape().block_size,
                      b->metrics);
  const EngineContext& shared = b->context;
  EngineContext own{
      shared.config,        shared.model,        shared.tokenizer, shared.guided_vocabulary,
      shared.chat_template, shared.runner,       scheduler,        shared.metrics,
      shared.seed_base,     shared.engine_failed};
  auto stage = b->make("batch_window", &own);
  // What the scheduling pass emits.
  moodycamel::BlockingConcurrentQueue<Message> emitted;
  const Emit gateway = [&](Message m) { emitted.enqueue(std::move(m)); };
  auto next_emitted = [&] {
    Message message;
    emitted.wait_dequeue(message);
    return message;
  };

  // The result of a step over `work`: every sequence whose chunk reached its last token one
  // token longer, as the model stages leave it.
  auto step_result = [](const std::vector<SequencePtr>& work, const Batch& batch, bool prefill) {
    StepResult result;
    result.prefill = prefill;
    for (size_t i = 0; i < work.size(); ++i) {
      const SequenceChunk& chunk = batch.seqs[i];
      Sequence& seq = *work[i];
      if (chunk.start_pos + chunk.tokens.size() != seq.tokens.size()) continue;
      seq.tokens.push_back(seq.tokens.back());
      result.outputs.push_back({work[i], seq.generated() - 1, {}, std::nullopt, {}, {}});
    }
    return result;
  };
  for (auto& seq : b->tokenized_requests(seqs, greedy())) (*stage)(Tokenized{seq}, gateway);
  // Answer prefills until all the sequences decode together.
  DecodeBatch running;
  for (;;) {
    Message next = next_emitted();
    if (auto* prefill = std::get_if<PrefillBatch>(&next)) {
      (*stage)(step_result(prefill->seqs, prefill->batch, true), gateway);
      continue;
    }
    running = std::get<DecodeBatch>(std::move(next));
    if (int(running.seqs.size()) == seqs) break;
    (*stage)(step_result(running.seqs, running.batch, false), gateway);
  }
  for (auto _ : state) {
    (*stage)(step_result(running.seqs, running.batch, false), gateway);
    running = std::get<DecodeBatch>(next_emitted());
  }
  scheduler.stop();
}
BENCHMARK(BM_Stage_batch_window)
    ->Arg(1)
    ->Arg(16)
    ->Arg(64)
    ->Iterations(2000)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

// prefill / decode_step: the model stage's body over range(0) sequences with fixed logits:
// sampling each sequence (range(1): 0 greedy, 1 temperature 0.8 with top-p 0.95, 2 the same in
// JSON mode, 3 greedy from passes that return each row's argmax, as the scheduler asks of a
// greedy batch) and the step's bookkeeping. The random logits rarely pick a token JSON mode
// allows outside a string, so 2 pays for the vocabulary's mask at most steps: JSON mode's worst
// case.
void model_stage(benchmark::State& state, const char* name, bool prefill) {
  StageBench* b = bench(state);
  if (!b) return;
  const int seqs = int(state.range(0));
  const SamplingParams sampling = state.range(1) == 1 || state.range(1) == 2 ? nucleus() : greedy();
  const bool json_object = state.range(1) == 2;
  const bool argmax_only = state.range(1) == 3;
  const std::vector<SequencePtr> work = b->tokenized_requests(seqs, sampling, json_object);
  auto stage = b->make(name);
  Message message;
  if (prefill) {
    PrefillBatch batch{work, {}};
    for (const auto& seq : work) batch.batch.seqs.push_back({seq->tokens, 0, {}, false});
    message = std::move(batch);
  } else {
    message = decode_batch(work);
  }
  Batch& batch =
      prefill ? std::get<PrefillBatch>(message).batch : std::get<DecodeBatch>(message).batch;
  for (SequenceChunk& chunk : batch.seqs) chunk.argmax_only = argmax_only;
  const int generated_before = work.front()->generated();
  for (auto _ : state) {
    // Every chunk ends at its sequence's last token, as the scheduler builds a pass, so that
    // each sequence samples (a chunk short of it is an unfinished prompt's).
    for (size_t i = 0; i < work.size(); ++i)
      batch.seqs[i].start_pos = int(work[i]->tokens.size() - batch.seqs[i].tokens.size());
    (*stage)(message, [](Message m) { benchmark::DoNotOptimize(m); });
  }
  if (work.front()->generated() - generated_before != int(state.iterations()))
    state.SkipWithError("the stage did not sample a token in every iteration");
  state.SetItemsProcessed(state.iterations() * seqs);
}
void BM_Stage_prefill(benchmark::State& state) {
  model_stage(state, "prefill", true);
}
void BM_Stage_decode_step(benchmark::State& state) {
  model_stage(state, "decode_step", false);
}
BENCHMARK(BM_Stage_prefill)->Args({16, 0})->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Stage_decode_step)
    ->ArgsProduct({{1, 16, 64}, {0, 1, 2, 3}})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

// JSON mode's mask over LLaMA-2's vocabulary, the redraw's cost in decode_step's sampling 2, in
// states of response_format json_object (range 0-3) and json_schema (4-6): what the answer has
// written decides how many tokens are tried and how far into each.
void BM_JsonMode_mask(benchmark::State& state) {
  StageBench* b = bench(state);
  if (!b) return;
  struct Written {
    const char* label;
    bool schema;
    const char* text;
  };
  static const Written kWritten[] = {
      {"object: after {", false, "{"},
      {"object: after a key's colon", false, R"({"name":)"},
      {"object: in a number", false, R"({"n":12)"},
      {"object: in a string", false, R"({"name":"Li)"},
      {"schema: a key begun", true, R"({")"},
      {"schema: in a string of at most 12", true, R"({"name":"Li)"},
      {"schema: in an enum", true, R"({"name":"Li","mood":"h)"},
  };
  static const char* kSchema = R"({"type": "object", "properties": {
      "name": {"type": "string", "maxLength": 12},
      "mood": {"enum": ["happy", "hungry", "sad", "sleepy"]}, "age": {"type": "integer"}},
      "required": ["name", "mood", "age"]})";
  const Written& written = kWritten[state.range(0)];
  GuidedDecoding mode(b->guided_vocabulary,
                      written.schema ? JsonSchema::compile(nlohmann::ordered_json::parse(kSchema))
                                     : JsonSchema::any_object());
  for (int32_t token : b->tokenizer.encode(written.text, false)) mode.advance(token);
  std::vector<float> logits(size_t(kVocab), 0.0f);
  size_t allowed = 0;
  for (auto _ : state) allowed = mode.mask(logits);
  state.SetLabel(std::string(written.label) + ": " + std::to_string(allowed) + " tokens fit");
}
BENCHMARK(BM_JsonMode_mask)->DenseRange(0, 6)->Unit(benchmark::kMicrosecond);

// Writes `text` a character a token: the tokenizer would begin it with a space a pattern or
// grammar may refuse.
void advance_by_characters(GuidedDecoding& mode, const GuidedVocabulary& vocabulary,
                           const std::string& text) {
  for (char c : text)
    for (int32_t token : vocabulary.sorted_tokens())
      if (vocabulary.text(token) == std::string(1, c)) {
        mode.advance(token);
        break;
      }
}

// The same mask for guided_choice and guided_regex (a TextPattern: one table lookup a byte), in
// states that fit few tokens and one that fits nearly all.
void BM_PatternMode_mask(benchmark::State& state) {
  StageBench* b = bench(state);
  if (!b) return;
  struct Written {
    const char* label;
    const char* regex;  // null: guided_choice of kChoices
    const char* text;
  };
  static const Written kWritten[] = {
      {"choice of 3: at the start", nullptr, ""},
      {"regex [0-9]{3}-[a-z]{2,5}: at the start", "[0-9]{3}-[a-z]{2,5}", ""},
      {"regex [0-9]{3}-[a-z]{2,5}: after 123-", "[0-9]{3}-[a-z]{2,5}", "123-"},
      {"regex .*: anywhere", ".*", "Once"},
  };
  static const std::vector<std::string> kChoices = {"positive", "negative", "neutral"};
  const Written& written = kWritten[state.range(0)];
  GuidedDecoding mode(b->guided_vocabulary, written.regex ? TextPattern::from_regex(written.regex)
                                                          : TextPattern::from_choices(kChoices));
  advance_by_characters(mode, b->guided_vocabulary, written.text);
  std::vector<float> logits(size_t(kVocab), 0.0f);
  size_t allowed = 0;
  for (auto _ : state) allowed = mode.mask(logits);
  state.SetLabel(std::string(written.label) + ": " + std::to_string(allowed) + " tokens fit");
}
BENCHMARK(BM_PatternMode_mask)->DenseRange(0, 3)->Unit(benchmark::kMicrosecond);

// The same mask for guided_grammar (a Grammar, followed a parse stack at a time): a JSON grammar
// in the states BM_JsonMode_mask's json_object ones stand in (range 0-3), and a list's (4-5).
void BM_GrammarMode_mask(benchmark::State& state) {
  StageBench* b = bench(state);
  if (!b) return;
  static const char* kJson = R"(root ::= object
value ::= object | array | string | number | ("true" | "false" | "null") ws
object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}" ws
array ::= "[" ws ( value ("," ws value)* )? "]" ws
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}) )* "\"" ws
number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9]{1,15})? ws
ws ::= | " " | "\n" [ \t]{0,20}
)";
  static const char* kList = "root ::= (\"- \" item \"\\n\")+\nitem ::= [^\\n]+";
  struct Written {
    const char* label;
    const char* grammar;
    const char* text;
  };
  static const Written kWritten[] = {
      {"json: after {", kJson, "{"},
      {"json: after a key's colon", kJson, R"({"name":)"},
      {"json: in a number", kJson, R"({"n":12)"},
      {"json: in a string", kJson, R"({"name":"Li)"},
      {"list: at the start", kList, ""},
      {"list: in an item", kList, "- eggs\n- Li"},
  };
  const Written& written = kWritten[state.range(0)];
  GuidedDecoding mode(b->guided_vocabulary, Grammar::from_gbnf(written.grammar));
  advance_by_characters(mode, b->guided_vocabulary, written.text);
  std::vector<float> logits(size_t(kVocab), 0.0f);
  size_t allowed = 0;
  for (auto _ : state) allowed = mode.mask(logits);
  state.SetLabel(std::string(written.label) + ": " + std::to_string(allowed) + " tokens fit");
}
BENCHMARK(BM_GrammarMode_mask)->DenseRange(0, 5)->Unit(benchmark::kMicrosecond);

// detokenize: a step's sampled tokens for range(0) sequences → their text deltas (incremental
// UTF-8 decoding, the stop string matched across tokens). The tokens are prose's, in order.
void BM_Stage_detokenize(benchmark::State& state) {
  StageBench* b = bench(state);
  if (!b) return;
  const int seqs = int(state.range(0));
  const std::vector<SequencePtr> work = b->tokenized_requests(seqs, greedy());
  const std::vector<int32_t> text = b->tokenizer.encode(prose(4096), /*add_bos=*/false);
  auto stage = b->make("detokenize");
  int index = 0;
  for (auto _ : state) {
    StepResult result;
    for (int i = 0; i < seqs; ++i) {
      SampledToken sampled;
      sampled.token = text[size_t(index + i) % text.size()];
      result.outputs.push_back({work[size_t(i)], index, std::move(sampled), std::nullopt, {}, {}});
    }
    ++index;
    (*stage)(std::move(result), [](Message m) { benchmark::DoNotOptimize(m); });
  }
  for (const auto& seq : work)
    if (seq->text->completion_tokens != index)
      state.SkipWithError("detokenize did not take every token in order");
  state.SetItemsProcessed(state.iterations() * seqs);
}
BENCHMARK(BM_Stage_detokenize)->Arg(1)->Arg(16)->Arg(64)->Unit(benchmark::kMicrosecond);

// emit: a step's text deltas for range(0) sequences → each request's sink, in order.
void BM_Stage_emit(benchmark::State& state) {
  StageBench* b = bench(state);
  if (!b) return;
  const int seqs = int(state.range(0));
  const std::vector<SequencePtr> work = b->tokenized_requests(seqs, greedy());
  auto stage = b->make("emit");
  uint64_t index = 0;
  for (auto _ : state) {
    StreamEvents events;
    for (const auto& seq : work)
      events.events.push_back({seq, index, Delta{" word", {}, {}, true, {}}});
    ++index;
    (*stage)(std::move(events), [](Message) {});
  }
  for (const auto& seq : work)
    if (static_cast<CountingSink&>(*seq->request->sink).deltas != index)
      state.SkipWithError("emit did not deliver every delta to its sink");
  state.SetItemsProcessed(state.iterations() * seqs);
}
BENCHMARK(BM_Stage_emit)->Arg(1)->Arg(16)->Arg(64)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace pipeline

BENCHMARK_MAIN();
