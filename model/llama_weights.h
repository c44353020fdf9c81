// The tensors of a LLaMA checkpoint, named by role and checked against the config.
#pragma once

#include <filesystem>
#include <memory>
#include <vector>

#include "io/model_config.h"
#include "io/safetensors.h"

namespace pipeline {

// Hugging Face layout: every projection is [out_features, in_features], row-major.
struct LayerWeights {
  TensorView attn_norm;  // [hidden]
  TensorView wq;         // [num_heads * head_dim, hidden]
  TensorView wk;         // [num_kv_heads * head_dim, hidden]
  TensorView wv;         // [num_kv_heads * head_dim, hidden]
  TensorView wo;         // [hidden, num_heads * head_dim]
  TensorView mlp_norm;   // [hidden]
  TensorView w_gate;     // [intermediate, hidden]
  TensorView w_up;       // [intermediate, hidden]
  TensorView w_down;     // [hidden, intermediate]
};

struct LlamaWeights {
  LlamaConfig config;
  TensorView embed;  // [vocab, hidden]
  std::vector<LayerWeights> layers;
  TensorView final_norm;  // [hidden]
  TensorView lm_head;     // [vocab, hidden]; the embedding itself when tied

  // Loads config and tensors from a Hugging Face model folder. Throws CheckpointError naming
  // the file and the tensor on a missing tensor or a shape that disagrees with the config.
  static LlamaWeights load(const std::filesystem::path& model_dir);

  // Keeps the mappings alive; the views above point into them.
  std::shared_ptr<const Checkpoint> checkpoint;
};

}  // namespace pipeline
