// The `pipeline` command as a user runs it: make-model writes a loadable, clearly labelled
// random checkpoint; generate honours end-of-sequence ids exactly where the golden file stops;
// usage mistakes name the option and exit 2.
#include <sys/resource.h>

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "io/tokenizer.h"
#include "model/llama_weights.h"
#include "tests/support/command.h"
#include "tests/support/shared_data.h"

namespace pipeline {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::run_pipeline;
using testing::run_shell;
using testing::shared_path;

class MakeModelTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::make_temp_dir("make-model-test"); }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(MakeModelTest, TinyShapeLoadsGeneratesAndSaysItIsRandom) {
  const auto made = run_pipeline({"make-model", "--shape", "tiny", "--out", (dir_ / "m").string()});
  ASSERT_EQ(made.exit_code, 0) << made.err;

  const auto weights = LlamaWeights::load(dir_ / "m");
  EXPECT_EQ(weights.config.hidden_size, 128);
  EXPECT_EQ(weights.config.num_kv_heads, 2);
  EXPECT_EQ(weights.embed.dtype, DType::BF16);
  const Tokenizer tokenizer(dir_ / "m" / "tokenizer.model");
  EXPECT_EQ(tokenizer.vocab_size(), weights.config.vocab_size);

  const json config = json::parse(std::ifstream(dir_ / "m" / "config.json"));
  EXPECT_NE(config.at("llm_pipeline_random_weights").get<std::string>().find("RANDOM WEIGHTS"),
            std::string::npos);
  std::stringstream readme;
  readme << std::ifstream(dir_ / "m" / "README.md").rdbuf();
  EXPECT_NE(readme.str().find("RANDOM WEIGHTS"), std::string::npos);

  const auto generated = run_pipeline({"generate", "--model", (dir_ / "m").string(), "--prompt",
                                       "Hello", "--max-tokens", "12", "--ignore-eos", "--json"});
  ASSERT_EQ(generated.exit_code, 0) << generated.err;
  const json out = json::parse(generated.out);
  EXPECT_EQ(out["generated_ids"].size(), 12u);
  EXPECT_EQ(out["finish_reason"], "length");
}

TEST_F(MakeModelTest, SameSeedSameBytesOtherSeedOtherWeights) {
  for (const char* name : {"a", "b"})
    ASSERT_EQ(run_pipeline({"make-model", "--shape", "tiny", "--dtype", "f32", "--seed", "7",
                            "--out", (dir_ / name).string()})
                  .exit_code,
              0);
  ASSERT_EQ(run_pipeline({"make-model", "--shape", "tiny", "--dtype", "f32", "--seed", "8", "--out",
                          (dir_ / "c").string()})
                .exit_code,
            0);
  const auto bytes = [&](const char* name) {
    std::stringstream s;
    s << std::ifstream(dir_ / name / "model.safetensors", std::ios::binary).rdbuf();
    return s.str();
  };
  EXPECT_EQ(bytes("a"), bytes("b"));
  EXPECT_NE(bytes("a"), bytes("c"));
  EXPECT_EQ(LlamaWeights::load(dir_ / "a").embed.dtype, DType::F32);
}

// A checkpoint written over another mixed with its files (its shards and their index stayed)
// into one that did not load: only a new or an empty folder is written into.
TEST_F(MakeModelTest, AFolderWithFilesInItIsRefusedAndAnEmptyOneFilled) {
  const auto out = dir_ / "m";
  fs::create_directories(out);
  std::ofstream(out / "model.safetensors.index.json") << "{}";
  auto result = run_pipeline({"make-model", "--shape", "tiny", "--out", out.string()});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_NE(result.err.find("--out " + out.string() + ": the folder is not empty"),
            std::string::npos)
      << result.err;
  EXPECT_FALSE(fs::exists(out / "model.safetensors"));

  fs::remove(out / "model.safetensors.index.json");
  result = run_pipeline({"make-model", "--shape", "tiny", "--out", out.string()});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(LlamaWeights::load(out).config.hidden_size, 128);

  result = run_pipeline({"make-model", "--shape", "tiny", "--out", (out / "config.json").string()});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_NE(result.err.find("config.json: not a folder"), std::string::npos) << result.err;
}

TEST_F(MakeModelTest, UnknownShapeAndDtypeAreUsageErrors) {
  auto result = run_pipeline({"make-model", "--shape", "llama9", "--out", dir_.string()});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_NE(result.err.find("--shape: unknown shape 'llama9'"), std::string::npos) << result.err;
  result =
      run_pipeline({"make-model", "--shape", "tiny", "--dtype", "int8", "--out", dir_.string()});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_NE(result.err.find("--dtype"), std::string::npos) << result.err;
  result = run_pipeline({"make-model", "--out", dir_.string()});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_NE(result.err.find("--shape is required"), std::string::npos) << result.err;
}

// With end-of-sequence honoured, greedy generation stops exactly where the independent
// implementation stopped (stories260K ends a story with BOS, which generation_config.json
// lists beside EOS), or runs to the end of the 512-position context where it never stops.
TEST(GenerateCommand, StopsWhereTheGoldenFileStops) {
  const auto golden = json::parse(std::ifstream(shared_path("golden/stories260K_greedy.json")));
  const auto model = shared_path("models/stories260K");
  const Tokenizer tokenizer(model / "tokenizer.model");
  for (const auto& c : golden["cases"]) {
    const auto prompt = c["prompt"].get<std::string>();
    const auto result = run_pipeline({"generate", "--model", model.string(), "--prompt", prompt,
                                      "--temperature", "0", "--max-tokens", "0", "--json"});
    ASSERT_EQ(result.exit_code, 0) << result.err;
    const json out = json::parse(result.out);
    EXPECT_EQ(out["prompt_ids"], c["prompt_ids_sentencepiece"]) << prompt;
    const auto ids = out["generated_ids"].get<std::vector<int32_t>>();
    if (c["until_first_stop"].is_null()) {
      EXPECT_EQ(out["finish_reason"], "length") << prompt;
      EXPECT_EQ(c["prompt_ids_sentencepiece"].size() + ids.size(), 512u) << prompt;
    } else {
      EXPECT_EQ(out["finish_reason"], "stop") << prompt;
      EXPECT_EQ(out["generated_ids"], c["until_first_stop"]["generated_ids_including_stop"])
          << prompt;
    }
    // The text continues the prompt: with the first token's space, which decoding the
    // generated ids alone would drop.
    std::vector<int32_t> all = out["prompt_ids"].get<std::vector<int32_t>>();
    const std::string prompt_text = tokenizer.decode(all);
    all.insert(all.end(), ids.begin(), ids.end());
    EXPECT_EQ(prompt_text + out["text"].get<std::string>(), tokenizer.decode(all)) << prompt;
  }
}

// The server's model.matmul_activations and scheduler.kv_cache_dtype, on the command line: a
// bf16 checkpoint run all in float32 answers as it does with the defaults (the tiny model's
// greedy story is far from any tie for its first tokens).
TEST(GenerateCommand, TakesTheKvCacheTypeAndTheMatmulActivations) {
  const auto model = shared_path("models/stories260K-bf16");
  std::vector<json> answers;
  for (const std::vector<std::string>& types :
       {std::vector<std::string>{},
        {"--kv-cache-dtype", "f32", "--matmul-activations", "f32"},
        {"--kv-cache-dtype", "bf16", "--matmul-activations", "bf16"}}) {
    std::vector<std::string> args = {
        "generate",      "--model", model.string(), "--prompt", "Once upon a time",
        "--temperature", "0",       "--max-tokens", "8",        "--json"};
    args.insert(args.end(), types.begin(), types.end());
    const auto result = run_pipeline(args);
    ASSERT_EQ(result.exit_code, 0) << result.err;
    answers.push_back(json::parse(result.out)["generated_ids"]);
  }
  EXPECT_EQ(answers[1], answers[0]);
  EXPECT_EQ(answers[2], answers[0]);
}

TEST(GenerateCommand, UsageErrorsNameTheOption) {
  auto result = run_pipeline({"generate", "--prompt", "x"});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_NE(result.err.find("--model is required"), std::string::npos) << result.err;
  result = run_pipeline({"generate", "--model", "m", "--prompt", "x", "--top-k", "many"});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_NE(result.err.find("--top-k: expected an integer"), std::string::npos) << result.err;
  result = run_pipeline({"generate", "--model", "m", "--prompt", "x", "--temprature", "1"});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_NE(result.err.find("unknown option --temprature"), std::string::npos) << result.err;
  result = run_pipeline({"generate", "--model", "/nonexistent", "--prompt", "x"});
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_NE(result.err.find("/nonexistent: no such folder"), std::string::npos) << result.err;
  // A model's file for its folder was "config.json/config.json: no such file".
  const auto config = testing::shared_path("models/stories260K/config.json").string();
  result = run_pipeline({"generate", "--model", config, "--prompt", "x"});
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_NE(result.err.find(config + ": not a folder"), std::string::npos) << result.err;
}

// What a mistyped command line gets: each mistake named, exit 2, nothing run.
TEST(Commands, MistakesOnTheCommandLineAreNamed) {
  const struct {
    std::vector<std::string> args;
    std::string message;
  } cases[] = {
      {{"generate", "--model", "m", "--prompt", "x", "--bogus"}, "unknown option --bogus"},
      {{"generate", "--model", "m", "--prompt", "x", "--device", "gpu"},
       "--device must be one of auto, cpu, cuda, got 'gpu'"},
      {{"generate", "--model", "m", "--prompt", "x", "--max-tokens"}, "--max-tokens needs a value"},
      {{"generate", "--model", "m", "--prompt", "x", "extra"}, "unexpected argument 'extra'"},
      {{"generate", "--model", "m", "--prompt", "x", "--seed", "-3"},
       "--seed: expected an integer of at least 0, got -3"},
      // An integer, only too large: it was "expected an integer".
      {{"generate", "--model", "m", "--prompt", "x", "--seed", "18446744073709551615"},
       "--seed: 18446744073709551615 is out of range (a 64-bit signed integer)"},
      {{"make-model", "--shape", "tiny", "--out", ""}, "--out must name a folder"},
      {{"generate", "--model", "m", "--prompt", "x", "--threads", "-1"},
       "--threads: expected an integer of at least 0, got -1"},
      // A thread count no machine has only exhausts memory (1073741824 crashed).
      {{"generate", "--model", "m", "--prompt", "x", "--threads", "1073741824"},
       "--threads: expected an integer of at most 1024, got 1073741824"},
      // run and batch take --threads too, as a shorthand for --set threads=N.
      {{"run", "c.yaml", "--threads", "2000"},
       "--threads: expected an integer of at most 1024, got 2000"},
      {{"batch", "c.yaml", "--input", "i", "--output", "o", "--threads", "-2"},
       "--threads: expected an integer of at least 0, got -2"},
      // An int option past 32 bits is refused, not cut to its low bits (4294967297 was 1).
      {{"generate", "--model", "m", "--prompt", "x", "--max-tokens", "4294967297"},
       "--max-tokens: expected an integer of at most 2147483647, got 4294967297"},
      {{"generate", "--model", "m", "--prompt", "x", "--max-tokens", "-1"},
       "--max-tokens: expected an integer of at least 0, got -1"},
      {{"generate", "--model", "m", "--prompt", "x", "--top-k", "4294967336"},
       "--top-k: expected an integer of at most 2147483647, got 4294967336"},
      {{"generate", "--model", "m", "--prompt", "x", "--repeat-last-n", "-4294967296"},
       "--repeat-last-n: expected an integer of at least -2147483648, got -4294967296"},
      {{"bench-serve", "--url", "http://h:1", "--requests", "4294967297"},
       "--requests: expected an integer of at most 2147483647, got 4294967297"},
      {{"bench-serve", "--url", "http://h:1", "--n", "0"},
       "--n: expected an integer of at least 1, got 0"},
      // std::stod reads nan and inf: bench-serve sent them as a JSON null temperature.
      {{"bench-serve", "--url", "http://h:1", "--temperature", "nan"},
       "--temperature: expected a number, got 'nan'"},
      {{"bench-serve", "--url", "http://h:1", "--temperature", "inf"},
       "--temperature: expected a number, got 'inf'"},
      {{"generate", "--model", "m", "--prompt", "x", "--presence-penalty", "-infinity"},
       "--presence-penalty: expected a number, got '-infinity'"},
      {{"generate", "--model", "m", "--prompt", "x", "--kv-cache-dtype", "f16"},
       "--kv-cache-dtype must be one of auto, bf16, f32, got 'f16'"},
      {{"generate", "--model", "m", "--prompt", "x", "--matmul-activations", "auto"},
       "--matmul-activations must be one of bf16, f32, got 'auto'"},
      {{"make-model", "--shape", "tiny", "--out", "d", "extra"}, "unexpected argument 'extra'"},
      {{"batch", "--input", "f", "--output", "o"}, "expected 1 argument, got 0"},
      {{"graph", "c.yaml", "k=v"}, "expected 1 argument, got 2"},
      // A repeatable option needs its value as much as any other.
      {{"batch", "c.yaml", "--input", "i", "--output", "o", "--set"}, "--set needs a value"},
      {{"run", "c.yaml", "--set"}, "--set needs a value"},
      {{"graph", "c.yaml", "--set"}, "--set needs a value"},
      // An empty host bound the IPv6 loopback and was printed as http://:PORT.
      {{"run", "c.yaml", "--host", ""}, "--host must not be empty (0.0.0.0 listens on every"},
      // An unknown option is named, whatever follows it: it takes no option as its value, and
      // is reported before the count of arguments that a value it took would spoil.
      {{"batch", "c.yaml", "--input", "i", "--verbose", "--output", "o"},
       "unknown option --verbose"},
      {{"generate", "--model", "m", "--prompt", "x", "--verbose", "--max-tokens", "3"},
       "unknown option --verbose"},
      {{"graph", "--verbose", "c.yaml"}, "unknown option --verbose"},
      {{"generate", "--model", "m", "--prompt", "--max-tokens", "3"},
       "--prompt needs a value, not the option --max-tokens (a value that starts with -- is given "
       "as --prompt=VALUE)"},
  };
  for (const auto& c : cases) {
    const auto result = run_pipeline(c.args);
    EXPECT_EQ(result.exit_code, 2) << c.args[0] << ": " << result.err;
    EXPECT_NE(result.err.find(c.message), std::string::npos) << result.err;
  }
  // -h is --help for every command, and help goes to stdout.
  for (const char* command : {"run", "generate", "batch", "graph", "make-model", "bench-serve"}) {
    const auto result = run_pipeline({command, "-h"});
    EXPECT_EQ(result.exit_code, 0) << command << ": " << result.err;
    EXPECT_NE(result.out.find("usage: pipeline"), std::string::npos) << command;
  }
  const auto top = run_pipeline({"--help"});
  EXPECT_EQ(top.exit_code, 0);
  EXPECT_NE(top.out.find("usage: pipeline <command>"), std::string::npos) << top.out;
}

TEST(MakeModelCommand, ABadCorpusIsNamedAndLeavesNoFolder) {
  const auto dir = testing::make_temp_dir("make-model-corpus");
  const auto out = dir / "model";
  const auto result = run_pipeline(
      {"make-model", "--shape", "tiny", "--out", out.string(), "--corpus", dir.string()});
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_NE(result.err.find("not a text file with content"), std::string::npos) << result.err;
  EXPECT_FALSE(std::filesystem::exists(out));

  // A corpus of one's own is the one the model's README names.
  const auto corpus = dir / "my_corpus.txt";
  std::ofstream(corpus) << std::ifstream(testing::source_dir() / "README.md").rdbuf();
  const auto made = run_pipeline(
      {"make-model", "--shape", "tiny", "--out", out.string(), "--corpus", corpus.string()});
  ASSERT_EQ(made.exit_code, 0) << made.err;
  std::stringstream readme;
  readme << std::ifstream(out / "README.md").rdbuf();
  EXPECT_NE(readme.str().find("trained on my_corpus.txt"), std::string::npos) << readme.str();
  std::filesystem::remove_all(dir);
}

// A write that fails once the folder is there (here the file-size limit, as a full disk would)
// takes what was written with it: a half-written checkpoint stayed, which did not load.
TEST_F(MakeModelTest, AFailedWriteLeavesNothingBehind) {
  const auto made = dir_ / "made", given = dir_ / "given";
  fs::create_directories(given);
  for (const auto& out : {made, given}) {
    const auto result = run_shell("ulimit -f 390; trap '' XFSZ; " +
                                  testing::shell_quoted(testing::pipeline_binary().string()) +
                                  " make-model --shape tiny --out " +
                                  testing::shell_quoted(out.string()) + " 2>&1; echo \"exit $?\"");
    EXPECT_NE(result.out.find("model.safetensors: write failed"), std::string::npos) << result.out;
    EXPECT_NE(result.out.find("exit 1\n"), std::string::npos) << result.out;
  }
  EXPECT_FALSE(fs::exists(made));
  EXPECT_TRUE(fs::is_empty(given));
}

// A run killed part-way (here by SIGXFSZ at the file-size limit, as Ctrl-C or the OOM killer
// would) cannot clean up: it leaves a marker, and the next run writes over what it left rather
// than refusing the folder as not empty. Files that are not make-model's still refuse it.
TEST_F(MakeModelTest, ARunKilledPartWayIsWrittenOverByTheNext) {
  const auto made = dir_ / "made", given = dir_ / "given";
  fs::create_directories(given);
  for (const auto& out : {made, given}) {
    const std::string command = testing::shell_quoted(testing::pipeline_binary().string()) +
                                " make-model --shape tiny --out " +
                                testing::shell_quoted(out.string());
    const auto killed = run_shell("ulimit -f 390; " + command + "; echo \"exit $?\"");
    EXPECT_NE(killed.out.find("exit 153\n"), std::string::npos) << killed.out;  // 128 + SIGXFSZ
    EXPECT_TRUE(fs::exists(out / ".make-model-incomplete"));
    EXPECT_TRUE(fs::exists(out / "model.safetensors"));

    const auto rerun = run_pipeline({"make-model", "--shape", "tiny", "--out", out.string()});
    ASSERT_EQ(rerun.exit_code, 0) << rerun.err;
    EXPECT_NE(rerun.err.find(out.string() + " holds an interrupted run's files"), std::string::npos)
        << rerun.err;
    EXPECT_FALSE(fs::exists(out / ".make-model-incomplete"));
    EXPECT_EQ(LlamaWeights::load(out).config.hidden_size, 128);
  }

  std::ofstream(given / ".make-model-incomplete") << "left by a killed run\n";
  std::ofstream(given / "notes.txt") << "the user's own\n";
  const auto refused = run_pipeline({"make-model", "--shape", "tiny", "--out", given.string()});
  EXPECT_EQ(refused.exit_code, 2);
  EXPECT_NE(refused.err.find("the folder is not empty"), std::string::npos) << refused.err;
  EXPECT_TRUE(fs::exists(given / "notes.txt"));
}

// `pipeline run` raises its soft limit on open files to the hard one, and warns before loading
// the model when even that is below the connections it may serve (the demo config's 288). A
// model folder that does not exist ends the run just after, without serving.
TEST(RunCommand, AnOpenFileLimitBelowItsConnectionsIsWarnedOf) {
  rlimit limit{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &limit), 0);
  ASSERT_GE(limit.rlim_max, rlim_t(352)) << "this test needs a hard limit on open files of 352";
  const std::string run =
      testing::shell_quoted(testing::pipeline_binary().string()) + " run " +
      testing::shell_quoted((testing::source_dir() / "configs/demo.yaml").string()) +
      " --model /nonexistent-model-folder --port 0";
  const auto hard = run_shell("ulimit -n 100 && " + run);
  EXPECT_EQ(hard.exit_code, 1) << hard.out;
  EXPECT_NE(hard.out.find("warning: this process may open 100 files (ulimit -n), fewer than the "
                          "288 connections"),
            std::string::npos)
      << hard.out;
  const auto soft = run_shell("ulimit -Sn 100 && " + run);  // raised to the hard limit
  EXPECT_EQ(soft.exit_code, 1) << soft.out;
  EXPECT_EQ(soft.out.find("warning"), std::string::npos) << soft.out;
  EXPECT_NE(soft.out.find("no such folder"), std::string::npos) << soft.out;
}

TEST(GraphCommand, TakesTheSameOverridesAsRun) {
  const auto result = run_pipeline(
      {"graph", (testing::source_dir() / "configs/demo.yaml").string(), "--set", "graph.nodes=[]"});
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_NE(result.err.find("override 'graph.nodes=[]'"), std::string::npos) << result.err;
}

// YAML reads '#...' at a value's start or after a space as a comment: an api_key of '#s3cret'
// (null) turned authentication off, a seed of '#1' left answers unseeded, and 'abc #def' was
// read as 'abc'. A value with a comment in it must be quoted.
TEST(GraphCommand, ASetValueWithACommentInItMustBeQuoted) {
  const auto config = (testing::source_dir() / "configs/demo.yaml").string();
  for (const std::string assignment :
       {"server.api_key=#s3cret", "sampling.seed=#1", "server.api_key=abc #def"}) {
    const auto result = run_pipeline({"graph", config, "--set", assignment});
    EXPECT_EQ(result.exit_code, 2) << assignment;
    EXPECT_NE(result.err.find("--set " + assignment + ": YAML reads '"), std::string::npos)
        << result.err;
  }
  const auto quoted = run_pipeline({"graph", config, "--set", "server.api_key=#s3cret"});
  EXPECT_NE(quoted.err.find("--set \"server.api_key='#s3cret'\""), std::string::npos) << quoted.err;
  for (const std::string value :
       {"", "~", "null", "Null", "NULL", "'#s3cret'", "\"a #b\"", "a#b"}) {
    const auto result = run_pipeline({"graph", config, "--set", "server.api_key=" + value});
    EXPECT_EQ(result.exit_code, 0) << value << ": " << result.err;
  }
}

}  // namespace
}  // namespace pipeline
