#include "io/model_config.h"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <ios>
#include <limits>
#include <nlohmann/json.hpp>

#include "io/json_integer.h"
#include "io/safetensors.h"

namespace pipeline {

namespace {

using nlohmann::json;

[[noreturn]] void fail(const std::filesystem::path& file, const std::string& field,
                       const std::string& what) {
  throw CheckpointError(file.string() + ": field '" + field + "' " + what);
}

json read_json(const std::filesystem::path& path) {
  // A folder opens, and fails only as it is read, with the stream's words alone.
  if (!std::filesystem::is_regular_file(path))
    throw CheckpointError(path.string() + ": not a regular file");
  std::ifstream in(path);
  if (!in) throw CheckpointError(path.string() + ": cannot open: " + std::strerror(errno));
  try {
    return json::parse(in);
  } catch (const json::exception& e) {  // a syntax error, or a number past a double (1e400)
    throw CheckpointError(path.string() + ": bad JSON: " + e.what());
  } catch (const std::ios_base::failure& e) {
    throw CheckpointError(path.string() + ": read error: " + e.what());
  }
}

// The largest dimension and context this code takes: far past any LLaMA-family model, and
// small enough that sizes and positions computed in int never overflow.
constexpr int64_t kMaxDimension = int64_t(1) << 20;

// Reads an integer field in [1, kMaxDimension]; `fallback` < 0 makes it required.
int positive_int(const std::filesystem::path& file, const json& j, const char* field,
                 int fallback = -1) {
  if (!j.contains(field) || j[field].is_null()) {
    if (fallback < 0) fail(file, field, "is missing");
    return fallback;
  }
  const json& value = j[field];
  const int64_t number = json_int64(value).value_or(0);
  if (number < 1 || number > kMaxDimension)
    fail(file, field,
         "must be an integer from 1 to " + std::to_string(kMaxDimension) + ", got " + value.dump());
  return int(number);
}

float positive_float(const std::filesystem::path& file, const json& j, const char* field,
                     float fallback) {
  if (!j.contains(field) || j[field].is_null()) return fallback;
  // Past float's range it would become an infinity (and the model's every answer garbage).
  if (!j[field].is_number() || j[field].get<double>() <= 0 ||
      j[field].get<double>() > std::numeric_limits<float>::max())
    fail(file, field, "must be a positive number within float's range, got " + j[field].dump());
  return j[field].get<float>();
}

std::vector<int32_t> token_ids(const std::filesystem::path& file, const json& value,
                               const char* field) {
  std::vector<int32_t> ids;
  const auto add = [&](const json& v) {
    const int64_t id = json_int64(v).value_or(-1);
    if (id < 0 || id > INT32_MAX)
      fail(file, field, "must be a token id or a list of them, got " + value.dump());
    ids.push_back(int32_t(id));
  };
  if (value.is_array()) {
    if (value.empty()) fail(file, field, "must be a token id or a list of them, got []");
    for (const auto& v : value) add(v);
  } else {
    add(value);
  }
  return ids;
}

void check_architecture(const std::filesystem::path& file, const json& j) {
  if (j.contains("model_type") && j["model_type"] != "llama")
    fail(file, "model_type", "is " + j["model_type"].dump() + "; only \"llama\" is supported");
  if (j.contains("hidden_act") && j["hidden_act"] != "silu")
    fail(file, "hidden_act", "is " + j["hidden_act"].dump() + "; LLaMA uses \"silu\"");
  if (j.contains("rope_scaling") && !j["rope_scaling"].is_null())
    fail(file, "rope_scaling", "is set; RoPE scaling is not supported");
  for (const char* bias : {"attention_bias", "mlp_bias"})
    if (j.contains(bias) && j[bias] == true) fail(file, bias, "is true; biases are not supported");
}

}  // namespace

bool LlamaConfig::is_eos(int32_t token) const {
  return std::find(eos_token_ids.begin(), eos_token_ids.end(), token) != eos_token_ids.end();
}

LlamaConfig load_llama_config(const std::filesystem::path& model_dir) {
  // A file given as the folder (its config.json, say) was reported as "config.json/config.json:
  // no such file".
  std::error_code error;
  const auto status = std::filesystem::status(model_dir, error);
  if (!std::filesystem::is_directory(status))
    throw CheckpointError(model_dir.string() + (std::filesystem::exists(status)
                                                    ? ": not a folder (a model folder holds "
                                                      "config.json, *.safetensors and "
                                                      "tokenizer.model)"
                                                    : ": no such folder"));
  const auto file = model_dir / "config.json";
  if (!std::filesystem::exists(file)) throw CheckpointError(file.string() + ": no such file");
  const json j = read_json(file);
  if (!j.is_object()) throw CheckpointError(file.string() + ": not a JSON object");
  check_architecture(file, j);

  LlamaConfig c;
  c.hidden_size = positive_int(file, j, "hidden_size");
  c.intermediate_size = positive_int(file, j, "intermediate_size");
  c.num_layers = positive_int(file, j, "num_hidden_layers");
  c.num_heads = positive_int(file, j, "num_attention_heads");
  c.num_kv_heads = positive_int(file, j, "num_key_value_heads", c.num_heads);
  c.vocab_size = positive_int(file, j, "vocab_size");
  c.max_position_embeddings = positive_int(file, j, "max_position_embeddings", 2048);
  if (c.hidden_size % c.num_heads != 0 && !j.contains("head_dim"))
    fail(file, "num_attention_heads", "does not divide hidden_size");
  c.head_dim = positive_int(file, j, "head_dim", c.hidden_size / c.num_heads);
  if (c.head_dim % 2 != 0) fail(file, "head_dim", "must be even for rotary embeddings");
  if (c.num_heads % c.num_kv_heads != 0)
    fail(file, "num_key_value_heads", "must divide num_attention_heads");
  c.rms_norm_eps = positive_float(file, j, "rms_norm_eps", 1e-6f);
  c.rope_theta = positive_float(file, j, "rope_theta", 10000.0f);
  if (j.contains("tie_word_embeddings")) {
    if (!j["tie_word_embeddings"].is_boolean())
      fail(file, "tie_word_embeddings", "must be a boolean");
    c.tie_word_embeddings = j["tie_word_embeddings"].get<bool>();
  }
  if (j.contains("bos_token_id") && !j["bos_token_id"].is_null())
    c.bos_token_id = token_ids(file, j["bos_token_id"], "bos_token_id").at(0);
  if (j.contains("eos_token_id") && !j["eos_token_id"].is_null())
    c.eos_token_ids = token_ids(file, j["eos_token_id"], "eos_token_id");
  if (j.contains("torch_dtype") && j["torch_dtype"].is_string())
    c.torch_dtype = j["torch_dtype"].get<std::string>();

  // generation_config.json, when present, says where generation ends (possibly several ids).
  auto eos_file = file;  // the file the end ids came from, for the message below
  const auto gen_file = model_dir / "generation_config.json";
  if (std::filesystem::exists(gen_file)) {
    const json g = read_json(gen_file);
    if (!g.is_object()) throw CheckpointError(gen_file.string() + ": not a JSON object");
    if (g.contains("eos_token_id") && !g["eos_token_id"].is_null()) {
      c.eos_token_ids = token_ids(gen_file, g["eos_token_id"], "eos_token_id");
      eos_file = gen_file;
    }
    if (g.contains("bos_token_id") && !g["bos_token_id"].is_null())
      c.bos_token_id = token_ids(gen_file, g["bos_token_id"], "bos_token_id").at(0);
  }
  for (int32_t id : c.eos_token_ids)
    if (id >= c.vocab_size)
      fail(
          eos_file, "eos_token_id",
          "holds id " + std::to_string(id) + ", beyond vocab_size " + std::to_string(c.vocab_size));
  return c;
}

}  // namespace pipeline
