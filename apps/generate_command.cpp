// `pipeline generate`: completes one raw prompt (BOS + its tokens, no chat template) and streams
// the text to stdout, or prints one JSON object with --json.
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <span>
#include <string_view>

#include "apps/commands.h"
#include "apps/options.h"
#include "graph/runner_factory.h"
#include "graph/serve_config.h"
#include "io/dtype.h"
#include "io/incremental_decoder.h"
#include "io/tokenizer.h"
#include "model/generation.h"
#include "model/llama_weights.h"

namespace pipeline {

namespace {

constexpr const char* kUsage =
    "usage: pipeline generate --model DIR --prompt TEXT [options]\n"
    "  --max-tokens N          tokens to generate, at most to the context's end (default 256;\n"
    "                          0: up to the context end)\n"
    "  --temperature T         0 = greedy (default 1.0)\n"
    "  --top-k K --top-p P --min-p P\n"
    "  --repetition-penalty R --repeat-last-n N --presence-penalty X --frequency-penalty X\n"
    "  --seed S                makes a sampled answer reproducible\n"
    "  --ignore-eos            generate past end-of-sequence tokens\n"
    "  --device auto|cpu|cuda  (default auto)\n"
    "  --threads N             CPU threads (default all cores; at most 1024)\n"
    "  --kv-cache-dtype auto|bf16|f32       the KV cache's elements (default auto: f32 for a\n"
    "                          float32 checkpoint, else bf16), as scheduler.kv_cache_dtype\n"
    "  --matmul-activations bf16|f32        what a bf16 checkpoint's matmuls round their inputs\n"
    "                          to (default bf16), as model.matmul_activations\n"
    "  --json                  print one JSON object instead of streaming text";

SamplingParams sampling_from(Options& options) {
  SamplingParams p;
  p.temperature = float(options.number("--temperature", p.temperature));
  p.top_k = options.int_value("--top-k", p.top_k);
  p.top_p = float(options.number("--top-p", p.top_p));
  p.min_p = float(options.number("--min-p", p.min_p));
  p.repetition_penalty = float(options.number("--repetition-penalty", p.repetition_penalty));
  p.repeat_last_n = options.int_value("--repeat-last-n", p.repeat_last_n);
  p.presence_penalty = float(options.number("--presence-penalty", p.presence_penalty));
  p.frequency_penalty = float(options.number("--frequency-penalty", p.frequency_penalty));
  if (const auto seed = options.find("--seed")) p.seed = options.integer("--seed", 0, 0);
  if (const auto error = validate(p); !error.empty()) throw UsageError(error);
  return p;
}

// The element type `name` names, one of `choices` ("auto" stands for none), or `fallback`.
std::optional<DType> dtype_option(Options& options, const std::string& name,
                                  std::span<const std::string_view> choices,
                                  std::optional<DType> fallback) {
  const std::optional<std::string> value = options.one_of(name, choices);
  if (!value) return fallback;
  return *value == "auto" ? std::nullopt : parse_dtype(*value);
}

}  // namespace

int generate_command(int argc, char** argv) {
  Options options(argc, argv, kUsage, {"--ignore-eos", "--json"});
  if (options.help()) return 0;
  const std::filesystem::path model_dir = options.required("--model");
  const std::string prompt = options.required("--prompt");
  GenerationRequest request;
  request.max_tokens = options.int_value("--max-tokens", 256, 0);
  request.sampling = sampling_from(options);
  request.ignore_eos = options.flag("--ignore-eos");
  const bool json_output = options.flag("--json");
  const std::string device = options.one_of("--device", kDeviceNames).value_or("auto");
  RunnerOptions runner_options;
  runner_options.threads = options.int_value("--threads", 0, 0, kMaxThreads);
  runner_options.max_num_seqs = 1;
  runner_options.kv_cache_dtype =
      dtype_option(options, "--kv-cache-dtype", kKvCacheDtypeNames, std::nullopt);
  runner_options.matmul_activations =
      *dtype_option(options, "--matmul-activations", kMatmulActivationNames, DType::BF16);
  options.finish();

  auto weights = std::make_shared<const LlamaWeights>(LlamaWeights::load(model_dir));
  const Tokenizer tokenizer(model_dir / "tokenizer.model");
  tokenizer.check_fits(weights->config.vocab_size);
  auto runner = make_runner(device, weights, runner_options);
  request.prompt = tokenizer.encode(prompt, /*add_bos=*/true);

  IncrementalDecoder decoder(tokenizer, request.prompt);
  std::string text;
  Generator generator(*runner, /*fallback_seed=*/std::random_device{}());
  const auto results =
      generator.run(std::span(&request, 1), [&](size_t, const SampledToken& token) {
        const std::string piece = decoder.push(token.token);
        text += piece;
        if (!json_output) {
          std::fwrite(piece.data(), 1, piece.size(), stdout);
          std::fflush(stdout);
        }
      });
  const std::string tail = decoder.flush();
  text += tail;
  const GenerationResult& result = results.front();
  const size_t generated = result.tokens.size();
  const double decode_rate = result.decode_seconds > 0
                                 ? double(generated > 0 ? generated - 1 : 0) / result.decode_seconds
                                 : 0.0;
  if (json_output) {
    const nlohmann::json out = {{"prompt_ids", request.prompt},
                                {"generated_ids", result.tokens},
                                {"text", text},
                                {"finish_reason", finish_reason_name(result.finish)},
                                {"prompt_tokens", request.prompt.size()},
                                {"completion_tokens", generated},
                                {"device", runner->device_name()},
                                {"timing",
                                 {{"prefill_seconds", result.prefill_seconds},
                                  {"decode_seconds", result.decode_seconds},
                                  {"decode_tokens_per_second", decode_rate}}}};
    std::cout << out.dump() << std::endl;
  } else {
    std::printf("%s\n", tail.c_str());
    std::fflush(stdout);  // the text, then the statistics, even where both go to one pipe
    std::fprintf(stderr,
                 "[%zu prompt tokens prefilled in %.3f s; %zu tokens generated, decode %.1f tok/s "
                 "on %s; finish: %s]\n",
                 request.prompt.size(), result.prefill_seconds, generated, decode_rate,
                 runner->device_name().c_str(), finish_reason_name(result.finish));
  }
  return 0;
}

}  // namespace pipeline
