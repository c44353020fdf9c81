// Loading Hugging Face checkpoints: config, single and sharded safetensors, and the clear error
// each kind of broken checkpoint gets.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "io/model_config.h"
#include "io/safetensors.h"
#include "io/tokenizer.h"
#include "model/llama_weights.h"
#include "tests/support/shared_data.h"

namespace pipeline {
namespace {

namespace fs = std::filesystem;
using testing::make_temp_dir;
using testing::shared_path;

// A writable copy of stories260K whose tensors a test can alter before writing them back.
class BrokenCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    source_ = shared_path("models/stories260K");
    dir_ = make_temp_dir("checkpoint-test");
    for (const char* f : {"config.json", "generation_config.json", "tokenizer.model"})
      fs::copy_file(source_ / f, dir_ / f);
    const Checkpoint ckpt(source_);
    for (const auto& name : tensor_names(source_)) {
      const TensorView& v = ckpt.get(name);
      TensorData t{name, v.dtype, v.shape, {}};
      t.bytes.assign(v.data, v.data + v.nbytes());
      tensors_.push_back(std::move(t));
    }
  }
  void TearDown() override { fs::remove_all(dir_); }

  static std::vector<std::string> tensor_names(const fs::path& dir) {
    std::vector<std::string> names;
    const SafetensorsFile file(dir / "model.safetensors");
    for (const auto& [name, view] : file.tensors()) names.push_back(name);
    return names;
  }

  TensorData& tensor(const std::string& name) {
    for (auto& t : tensors_)
      if (t.name == name) return t;
    throw std::runtime_error("no tensor " + name);
  }

  void write() { write_safetensors(dir_ / "model.safetensors", tensors_); }

  // Writes the checkpoint with its header as `edit` leaves it; the data stays as it was.
  void write_with_header(
      const std::function<void(nlohmann::json& header, uint64_t data_bytes)>& edit) {
    write();
    const auto path = dir_ / "model.safetensors";
    std::ifstream in(path, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), {});
    uint64_t n;
    std::memcpy(&n, bytes.data(), 8);
    auto header = nlohmann::json::parse(bytes.substr(8, n));
    edit(header, bytes.size() - 8 - n);
    const std::string text = header.dump();
    const uint64_t m = text.size();
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(&m), 8);
    out << text << bytes.substr(8 + n);
  }

  // Loads the checkpoint and returns the error message (empty when it loads).
  std::string load_error() {
    try {
      LlamaWeights::load(dir_);
    } catch (const CheckpointError& e) {
      return e.what();
    }
    return "";
  }

  fs::path source_, dir_;
  std::vector<TensorData> tensors_;
};

TEST(Checkpoint, LoadsStoriesConfigAndWeights) {
  const auto w = LlamaWeights::load(shared_path("models/stories260K"));
  const LlamaConfig& c = w.config;
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.intermediate_size, 172);
  EXPECT_EQ(c.num_layers, 5);
  EXPECT_EQ(c.num_heads, 8);
  EXPECT_EQ(c.num_kv_heads, 4);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.max_position_embeddings, 512);
  EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-5f);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int32_t>{2, 1}));  // from generation_config.json
  EXPECT_TRUE(c.is_eos(1));
  EXPECT_FALSE(c.is_eos(3));
  ASSERT_EQ(w.layers.size(), 5u);
  EXPECT_EQ(w.lm_head.data, w.embed.data);  // tied
  EXPECT_EQ(w.layers[4].wk.shape, (std::vector<int64_t>{32, 64}));
  EXPECT_EQ(w.embed.dtype, DType::F32);
}

TEST(Checkpoint, KeepsBf16WeightsInTheirFileDtype) {
  const auto w = LlamaWeights::load(shared_path("models/stories260K-bf16"));
  EXPECT_EQ(w.embed.dtype, DType::BF16);
  const auto f = LlamaWeights::load(shared_path("models/stories260K"));
  // bf16 is f32 rounded to nearest even.
  const float* ref = reinterpret_cast<const float*>(f.layers[0].wq.data);
  const uint16_t* half = reinterpret_cast<const uint16_t*>(w.layers[0].wq.data);
  for (int i = 0; i < 64; ++i) EXPECT_EQ(half[i], f32_to_bf16(ref[i]));
}

TEST(Checkpoint, UntiedLmHeadAndHeadDim128) {
  const auto w = LlamaWeights::load(shared_path("models/random-h128-bf16"));
  EXPECT_EQ(w.config.head_dim, 128);
  EXPECT_FALSE(w.config.tie_word_embeddings);
  EXPECT_NE(w.lm_head.data, w.embed.data);
  EXPECT_FLOAT_EQ(w.config.rope_theta, 500000.0f);
  EXPECT_FLOAT_EQ(w.config.rms_norm_eps, 1e-6f);
}

TEST_F(BrokenCheckpointTest, RewrittenCopyLoads) {
  write();
  EXPECT_EQ(load_error(), "");
}

TEST_F(BrokenCheckpointTest, ShardedCheckpointLoadsEveryTensor) {
  std::vector<TensorData> first(tensors_.begin(), tensors_.begin() + 10);
  std::vector<TensorData> second(tensors_.begin() + 10, tensors_.end());
  write_safetensors(dir_ / "model-00001-of-00002.safetensors", first);
  write_safetensors(dir_ / "model-00002-of-00002.safetensors", second);
  nlohmann::json index;
  for (const auto& t : first) index["weight_map"][t.name] = "model-00001-of-00002.safetensors";
  for (const auto& t : second) index["weight_map"][t.name] = "model-00002-of-00002.safetensors";
  std::ofstream(dir_ / "model.safetensors.index.json") << index.dump();

  const auto sharded = LlamaWeights::load(dir_);
  const auto single = LlamaWeights::load(source_);
  ASSERT_EQ(sharded.layers.size(), single.layers.size());
  for (size_t l = 0; l < single.layers.size(); ++l)
    EXPECT_EQ(std::memcmp(sharded.layers[l].w_down.data, single.layers[l].w_down.data,
                          single.layers[l].w_down.nbytes()),
              0);
  EXPECT_EQ(sharded.checkpoint->file_of("model.norm.weight").filename(),
            "model-00002-of-00002.safetensors");
}

TEST_F(BrokenCheckpointTest, MissingShardNamesTheFile) {
  nlohmann::json index;
  index["weight_map"]["model.norm.weight"] = "model-00009-of-00009.safetensors";
  std::ofstream(dir_ / "model.safetensors.index.json") << index.dump();
  const auto error = load_error();
  EXPECT_NE(error.find("model-00009-of-00009.safetensors"), std::string::npos) << error;
  EXPECT_NE(error.find("no such file"), std::string::npos) << error;
}

TEST_F(BrokenCheckpointTest, MissingFolderAndMissingFile) {
  EXPECT_THROW(
      {
        try {
          LlamaWeights::load(dir_ / "nowhere");
        } catch (const CheckpointError& e) {
          EXPECT_NE(std::string(e.what()).find("nowhere"), std::string::npos);
          throw;
        }
      },
      CheckpointError);
  const auto error = load_error();  // nothing written yet
  EXPECT_NE(error.find("no model.safetensors"), std::string::npos) << error;
}

// A folder where a file should be opens, and then fails as it is read with the standard
// library's words alone ("Is a directory", "No such device"): each is named as what it is.
TEST_F(BrokenCheckpointTest, AFolderWhereAFileShouldBeIsNamed) {
  write();
  const auto folder_instead = [&](const char* name) {
    fs::rename(dir_ / name, dir_ / (std::string(name) + ".moved"));
    fs::create_directory(dir_ / name);
    const std::string error = load_error();
    fs::remove(dir_ / name);
    fs::rename(dir_ / (std::string(name) + ".moved"), dir_ / name);
    return error;
  };
  for (const char* name : {"config.json", "generation_config.json", "model.safetensors"}) {
    const std::string error = folder_instead(name);
    EXPECT_NE(error.find((dir_ / name).string() + ": not a regular file"), std::string::npos)
        << error;
  }
  EXPECT_EQ(load_error(), "");
  fs::remove(dir_ / "tokenizer.model");
  fs::create_directory(dir_ / "tokenizer.model");
  try {
    Tokenizer tokenizer(dir_ / "tokenizer.model");
    FAIL() << "a folder was loaded as a tokenizer";
  } catch (const CheckpointError& e) {
    EXPECT_EQ(std::string(e.what()),
              "tokenizer model " + (dir_ / "tokenizer.model").string() + ": not a regular file");
  }
}

TEST_F(BrokenCheckpointTest, TruncatedFile) {
  write();
  const auto path = dir_ / "model.safetensors";
  fs::resize_file(path, fs::file_size(path) - 1000);
  const auto error = load_error();
  EXPECT_NE(error.find("model.safetensors"), std::string::npos) << error;
  EXPECT_NE(error.find("outside the file"), std::string::npos) << error;
}

TEST_F(BrokenCheckpointTest, TruncatedHeader) {
  write();
  fs::resize_file(dir_ / "model.safetensors", 100);
  const auto error = load_error();
  EXPECT_NE(error.find("exceeds the file size"), std::string::npos) << error;
}

TEST_F(BrokenCheckpointTest, BadHeaderJson) {
  // Not JSON, and JSON nlohmann cannot read (a number past a double): either way the file is
  // named.
  for (const std::string header : {"{\"a\": [1, 2", "{\"__metadata__\": {\"x\": 1e400}}"}) {
    SCOPED_TRACE(header);
    const uint64_t n = header.size();
    std::ofstream out(dir_ / "model.safetensors", std::ios::binary);
    out.write(reinterpret_cast<const char*>(&n), 8);
    out << header;
    out.close();
    const auto error = load_error();
    EXPECT_NE(error.find("model.safetensors: bad header JSON"), std::string::npos) << error;
  }
  EXPECT_NE(load_error().find("number overflow"), std::string::npos);
}

TEST_F(BrokenCheckpointTest, OffsetsOutsideTheFile) {
  // One tensor's end offset points past the data.
  write_with_header([](nlohmann::json& header, uint64_t data_bytes) {
    header["model.norm.weight"]["data_offsets"] = {data_bytes - 4, data_bytes + 252};
  });
  const auto error = load_error();
  EXPECT_NE(error.find("'model.norm.weight'"), std::string::npos) << error;
  EXPECT_NE(error.find("outside the file"), std::string::npos) << error;
}

// A shape whose size in bytes wraps around 64 bits once passed as a tensor of 0 bytes (2^61
// elements of 4 bytes each), or overflowed int64_t in its element count.
TEST_F(BrokenCheckpointTest, AShapeNoFileCouldHoldIsRefused) {
  for (const nlohmann::json& shape :
       {nlohmann::json{2305843009213693952ll, 2}, nlohmann::json{4611686018427387904ll, 4}}) {
    SCOPED_TRACE(shape.dump());
    write_with_header([&](nlohmann::json& header, uint64_t) {
      header["model.norm.weight"]["shape"] = shape;
      header["model.norm.weight"]["data_offsets"] = {0, 0};
    });
    const auto error = load_error();
    EXPECT_NE(error.find("'model.norm.weight'"), std::string::npos) << error;
    EXPECT_NE(error.find("holds more elements than a file can"), std::string::npos) << error;
  }
}

TEST_F(BrokenCheckpointTest, UnknownDtype) {
  auto& t = tensor("model.norm.weight");
  write();
  auto path = dir_ / "model.safetensors";
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  const auto pos = bytes.find("\"F32\"", bytes.find("\"" + t.name + "\""));
  bytes.replace(pos, 5, "\"I32\"");  // same length: offsets stay valid
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  const auto error = load_error();
  EXPECT_NE(error.find("'model.norm.weight'"), std::string::npos) << error;
  EXPECT_NE(error.find("unsupported dtype 'I32'"), std::string::npos) << error;
}

TEST_F(BrokenCheckpointTest, MissingTensor) {
  std::erase_if(tensors_,
                [](const TensorData& t) { return t.name == "model.layers.3.mlp.up_proj.weight"; });
  write();
  const auto error = load_error();
  EXPECT_NE(error.find("missing tensor 'model.layers.3.mlp.up_proj.weight'"), std::string::npos)
      << error;
}

TEST_F(BrokenCheckpointTest, WrongShapeForTheConfig) {
  auto& t = tensor("model.layers.2.self_attn.k_proj.weight");
  t.shape = {64, 32};  // same bytes, transposed shape
  write();
  const auto error = load_error();
  EXPECT_NE(error.find("'model.layers.2.self_attn.k_proj.weight' has shape [64, 32]"),
            std::string::npos)
      << error;
  EXPECT_NE(error.find("implies [32, 64]"), std::string::npos) << error;
}

TEST_F(BrokenCheckpointTest, ConfigErrorsNameTheField) {
  write();
  auto config = nlohmann::json::parse(std::ifstream(dir_ / "config.json"));
  // Fewer layers than the checkpoint holds would run a model cut short.
  const nlohmann::json layers = config["num_hidden_layers"];
  config["num_hidden_layers"] = layers.get<int>() - 1;
  std::ofstream(dir_ / "config.json") << config.dump();
  auto error = load_error();
  EXPECT_NE(error.find("config.json: field 'num_hidden_layers' is " +
                       std::to_string(layers.get<int>() - 1) + " but "),
            std::string::npos)
      << error;
  EXPECT_NE(error.find("holds tensor 'model.layers." + std::to_string(layers.get<int>() - 1) +
                       ".input_layernorm.weight'"),
            std::string::npos)
      << error;
  config["num_hidden_layers"] = layers;

  config["num_key_value_heads"] = 3;
  std::ofstream(dir_ / "config.json") << config.dump();
  error = load_error();
  EXPECT_NE(error.find("config.json: field 'num_key_value_heads'"), std::string::npos) << error;

  // Sizes past int (which once wrapped modulo 2^32) and absurd contexts are refused by name.
  config["num_key_value_heads"] = 4;
  for (const char* text : {"4294967297", "100000000000", "18446744073709551615", "0", "-8"}) {
    const std::string body = config.dump();
    const std::string with_huge =
        body.substr(0, body.size() - 1) + R"(,"max_position_embeddings":)" + text + "}";
    std::ofstream(dir_ / "config.json") << with_huge;
    error = load_error();
    EXPECT_NE(error.find("field 'max_position_embeddings' must be an integer from 1 to 1048576"),
              std::string::npos)
        << text << ": " << error;
  }
  const nlohmann::json hidden_size = config["hidden_size"];
  config["hidden_size"] = 4294967360ull;
  std::ofstream(dir_ / "config.json") << config.dump();
  EXPECT_NE(load_error().find("field 'hidden_size' must be an integer"), std::string::npos);
  config["hidden_size"] = hidden_size;
  std::ofstream(dir_ / "config.json") << config.dump();

  // A float field past float's range would be an infinity.
  const nlohmann::json valid = config;
  for (const char* field : {"rms_norm_eps", "rope_theta"}) {
    config[field] = 1e39;
    std::ofstream(dir_ / "config.json") << config.dump();
    error = load_error();
    EXPECT_NE(error.find("config.json: field '" + std::string(field) +
                         "' must be a positive number within float's range, got 1e+39"),
              std::string::npos)
        << error;
    config = valid;
  }
  std::ofstream(dir_ / "config.json") << config.dump();

  // An end id out of the vocabulary is reported against the file it came from.
  std::ofstream(dir_ / "generation_config.json") << R"({"eos_token_id": [2, 100000]})";
  error = load_error();
  EXPECT_NE(error.find("generation_config.json: field 'eos_token_id' holds id 100000"),
            std::string::npos)
      << error;
  // An empty list names no id (it was read at its first element, beyond its end).
  std::ofstream(dir_ / "generation_config.json") << R"({"bos_token_id": []})";
  error = load_error();
  EXPECT_NE(error.find("generation_config.json: field 'bos_token_id' must be a token id or a list "
                       "of them, got []"),
            std::string::npos)
      << error;
  // Not an object: refused, as config.json is, rather than read as naming nothing.
  std::ofstream(dir_ / "generation_config.json") << "[]";
  error = load_error();
  EXPECT_NE(error.find("generation_config.json: not a JSON object"), std::string::npos) << error;
  fs::remove(dir_ / "generation_config.json");

  config.erase("num_key_value_heads");
  config.erase("hidden_size");
  std::ofstream(dir_ / "config.json") << config.dump();
  error = load_error();
  EXPECT_NE(error.find("field 'hidden_size' is missing"), std::string::npos) << error;

  std::ofstream(dir_ / "config.json") << "{ not json";
  error = load_error();
  EXPECT_NE(error.find("config.json: bad JSON"), std::string::npos) << error;
  std::ofstream(dir_ / "config.json") << R"({"rope_theta": 1e400})";
  error = load_error();
  EXPECT_NE(error.find("config.json: bad JSON"), std::string::npos) << error;
  EXPECT_NE(error.find("number overflow"), std::string::npos) << error;

  fs::remove(dir_ / "config.json");
  error = load_error();
  EXPECT_NE(error.find("config.json: no such file"), std::string::npos) << error;
}

}  // namespace
}  // namespace pipeline
