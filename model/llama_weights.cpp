#include "model/llama_weights.h"

#include <string>

namespace pipeline {

namespace {

// Finds `name` and checks its shape against what the config implies.
TensorView expect(const Checkpoint& ckpt, const std::string& name,
                  std::vector<int64_t> expected_shape) {
  const TensorView& view = ckpt.get(name);
  if (view.shape != expected_shape) {
    TensorView expected;
    expected.shape = expected_shape;
    throw CheckpointError(ckpt.file_of(name).string() + ": tensor '" + name + "' has shape " +
                          view.shape_string() + " but config.json implies " +
                          expected.shape_string());
  }
  return view;
}

LayerWeights load_layer(const Checkpoint& ckpt, const LlamaConfig& c, int layer) {
  const std::string p = "model.layers." + std::to_string(layer) + ".";
  const int64_t hidden = c.hidden_size, ffn = c.intermediate_size;
  LayerWeights w;
  w.attn_norm = expect(ckpt, p + "input_layernorm.weight", {hidden});
  w.wq = expect(ckpt, p + "self_attn.q_proj.weight", {c.q_dim(), hidden});
  w.wk = expect(ckpt, p + "self_attn.k_proj.weight", {c.kv_dim(), hidden});
  w.wv = expect(ckpt, p + "self_attn.v_proj.weight", {c.kv_dim(), hidden});
  w.wo = expect(ckpt, p + "self_attn.o_proj.weight", {hidden, c.q_dim()});
  w.mlp_norm = expect(ckpt, p + "post_attention_layernorm.weight", {hidden});
  w.w_gate = expect(ckpt, p + "mlp.gate_proj.weight", {ffn, hidden});
  w.w_up = expect(ckpt, p + "mlp.up_proj.weight", {ffn, hidden});
  w.w_down = expect(ckpt, p + "mlp.down_proj.weight", {hidden, ffn});
  return w;
}

}  // namespace

LlamaWeights LlamaWeights::load(const std::filesystem::path& model_dir) {
  LlamaWeights w;
  w.config = load_llama_config(model_dir);
  w.checkpoint = std::make_shared<const Checkpoint>(model_dir);
  const Checkpoint& ckpt = *w.checkpoint;
  const LlamaConfig& c = w.config;

  w.embed = expect(ckpt, "model.embed_tokens.weight", {c.vocab_size, c.hidden_size});
  w.layers.reserve(size_t(c.num_layers));
  for (int layer = 0; layer < c.num_layers; ++layer) w.layers.push_back(load_layer(ckpt, c, layer));
  // A config that counts fewer layers than the checkpoint holds would run a model cut short,
  // and answer wrongly without a word.
  const std::string next_layer = "model.layers." + std::to_string(c.num_layers) + ".";
  for (const char* tensor : {"input_layernorm.weight", "self_attn.q_proj.weight"}) {
    if (ckpt.find(next_layer + tensor))
      throw CheckpointError((model_dir / "config.json").string() +
                            ": field 'num_hidden_layers' is " + std::to_string(c.num_layers) +
                            " but " + ckpt.file_of(next_layer + tensor).string() +
                            " holds tensor '" + next_layer + tensor + "'");
  }
  w.final_norm = expect(ckpt, "model.norm.weight", {c.hidden_size});
  // Tied checkpoints use the embedding as the output projection, as Hugging Face does.
  if (c.tie_word_embeddings)
    w.lm_head = w.embed;
  else
    w.lm_head = expect(ckpt, "lm_head.weight", {c.vocab_size, c.hidden_size});
  return w;
}

}  // namespace pipeline
