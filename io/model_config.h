// The architecture of a LlamaForCausalLM checkpoint, from config.json and
// generation_config.json.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace pipeline {

struct LlamaConfig {
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_layers = 0;
  int num_heads = 0;
  int num_kv_heads = 0;  // grouped-query attention when below num_heads
  int head_dim = 0;      // hidden_size / num_heads unless config.json says otherwise
  int vocab_size = 0;
  int max_position_embeddings = 0;
  float rms_norm_eps = 1e-6f;
  float rope_theta = 10000.0f;
  bool tie_word_embeddings = false;
  int32_t bos_token_id = 1;
  // Generation ends at any of these: generation_config.json's eos_token_id (an id or a list),
  // else config.json's.
  std::vector<int32_t> eos_token_ids{2};
  std::string torch_dtype;  // as written, informational

  int q_dim() const { return num_heads * head_dim; }
  int kv_dim() const { return num_kv_heads * head_dim; }
  bool is_eos(int32_t token) const;
};

// Reads DIR/config.json (required) and DIR/generation_config.json (optional).
// Throws CheckpointError naming the file and the field on a missing or wrong field.
LlamaConfig load_llama_config(const std::filesystem::path& model_dir);

}  // namespace pipeline
