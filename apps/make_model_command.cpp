// `pipeline make-model`: writes a checkpoint of a known LLaMA shape with random weights, in
// Hugging Face layout, so anyone can run and benchmark real shapes without downloading weights.
// Its tokenizer.model is trained on the spot from the small text the project ships.
#include <tbb/parallel_for.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <string>
#include <system_error>

#include "apps/commands.h"
#include "apps/options.h"
#include "io/safetensors.h"
#include "io/tokenizer_trainer.h"

namespace pipeline {

namespace {

struct ModelShape {
  const char* name;
  int hidden, intermediate, layers, heads, kv_heads, vocab, max_positions;
  bool tied;
  float rope_theta, rms_norm_eps;
};

// The tokenizer trained for a shape has at most this many pieces; a larger embedding is padded,
// as real checkpoints pad theirs.
constexpr int kMaxTokenizerVocab = 4096;

constexpr ModelShape kShapes[] = {
    // The built-in demo model: small enough to answer instantly on any CPU.
    {"tiny", 128, 344, 4, 4, 2, 512, 1024, true, 10000.0f, 1e-5f},
    {"llama2-110m", 768, 2048, 12, 12, 12, 32000, 1024, true, 10000.0f, 1e-5f},
    {"tinyllama-1.1b", 2048, 5632, 22, 32, 4, 32000, 2048, false, 10000.0f, 1e-5f},
    {"llama2-7b", 4096, 11008, 32, 32, 32, 32000, 4096, false, 10000.0f, 1e-5f},
};

const ModelShape& find_shape(const std::string& name) {
  for (const auto& shape : kShapes)
    if (name == shape.name) return shape;
  std::string known;
  for (const auto& shape : kShapes) known += std::string(known.empty() ? "" : ", ") + shape.name;
  throw UsageError("--shape: unknown shape '" + name + "' (known: " + known + ")");
}

std::vector<TensorSpec> tensor_specs(const ModelShape& s, DType dtype) {
  const int64_t head_dim = s.hidden / s.heads, kv_dim = int64_t(s.kv_heads) * head_dim;
  std::vector<TensorSpec> specs{{"model.embed_tokens.weight", dtype, {s.vocab, s.hidden}}};
  for (int l = 0; l < s.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    specs.push_back({p + "input_layernorm.weight", dtype, {s.hidden}});
    specs.push_back({p + "self_attn.q_proj.weight", dtype, {s.hidden, s.hidden}});
    specs.push_back({p + "self_attn.k_proj.weight", dtype, {kv_dim, s.hidden}});
    specs.push_back({p + "self_attn.v_proj.weight", dtype, {kv_dim, s.hidden}});
    specs.push_back({p + "self_attn.o_proj.weight", dtype, {s.hidden, s.hidden}});
    specs.push_back({p + "post_attention_layernorm.weight", dtype, {s.hidden}});
    specs.push_back({p + "mlp.gate_proj.weight", dtype, {s.intermediate, s.hidden}});
    specs.push_back({p + "mlp.up_proj.weight", dtype, {s.intermediate, s.hidden}});
    specs.push_back({p + "mlp.down_proj.weight", dtype, {s.hidden, s.intermediate}});
  }
  specs.push_back({"model.norm.weight", dtype, {s.hidden}});
  if (!s.tied) specs.push_back({"lm_head.weight", dtype, {s.vocab, s.hidden}});
  return specs;
}

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

void store(std::span<std::byte> bytes, DType dtype, size_t i, float value) {
  switch (dtype) {
    case DType::F32:
      reinterpret_cast<float*>(bytes.data())[i] = value;
      break;
    case DType::BF16:
      reinterpret_cast<uint16_t*>(bytes.data())[i] = f32_to_bf16(value);
      break;
    case DType::F16:
      reinterpret_cast<uint16_t*>(bytes.data())[i] = f32_to_f16(value);
      break;
  }
}

// Norm weights are 1, as at initialisation; projections are uniform with standard deviation
// 0.02 (the usual LLaMA initialiser's scale). Each chunk has its own seed, so the result does
// not depend on the number of threads.
void fill_tensor(const TensorSpec& spec, size_t index, uint64_t seed, std::span<std::byte> bytes) {
  const size_t n = bytes.size() / dtype_size(spec.dtype);
  const bool is_norm = spec.shape.size() == 1;
  const float half_width = 0.02f * std::sqrt(3.0f);
  constexpr size_t kChunk = 1 << 16;
  tbb::parallel_for(size_t(0), (n + kChunk - 1) / kChunk, [&](size_t chunk) {
    uint64_t state = seed * 1000003u + index * 7919u + chunk;
    const size_t end = std::min(n, (chunk + 1) * kChunk);
    for (size_t i = chunk * kChunk; i < end; ++i) {
      const float u = float(splitmix64(state) >> 40) * (1.0f / float(1 << 24));  // [0, 1)
      store(bytes, spec.dtype, i, is_norm ? 1.0f : (2.0f * u - 1.0f) * half_width);
    }
  });
}

// Closed before it is checked: a write the full disk refuses may fail only as the file closes.
void write_text(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  out.close();
  if (!out) throw std::runtime_error(path.string() + ": write failed");
}

void write_json(const std::filesystem::path& path, const nlohmann::json& j) {
  write_text(path, j.dump(2) + "\n");
}

void write_config(const std::filesystem::path& dir, const ModelShape& s, DType dtype,
                  uint64_t seed) {
  const char* dtype_names[] = {"float32", "float16", "bfloat16"};
  write_json(dir / "config.json",
             {{"architectures", {"LlamaForCausalLM"}},
              {"model_type", "llama"},
              {"hidden_size", s.hidden},
              {"intermediate_size", s.intermediate},
              {"num_hidden_layers", s.layers},
              {"num_attention_heads", s.heads},
              {"num_key_value_heads", s.kv_heads},
              {"vocab_size", s.vocab},
              {"max_position_embeddings", s.max_positions},
              {"hidden_act", "silu"},
              {"rms_norm_eps", s.rms_norm_eps},
              {"rope_theta", s.rope_theta},
              {"rope_scaling", nullptr},
              {"tie_word_embeddings", s.tied},
              {"bos_token_id", 1},
              {"eos_token_id", 2},
              {"torch_dtype", dtype_names[int(dtype)]},
              {"llm_pipeline_random_weights", "RANDOM WEIGHTS (shape " + std::string(s.name) +
                                                  ", seed " + std::to_string(seed) +
                                                  "): this model produces meaningless text"}});
  write_json(dir / "generation_config.json", {{"bos_token_id", 1}, {"eos_token_id", 2}});
  write_json(dir / "tokenizer_config.json", {{"tokenizer_class", "LlamaTokenizer"},
                                             {"bos_token", "<s>"},
                                             {"eos_token", "</s>"},
                                             {"unk_token", "<unk>"},
                                             {"add_bos_token", true}});
}

void write_readme(const std::filesystem::path& dir, const ModelShape& s, DType dtype, uint64_t seed,
                  const std::filesystem::path& corpus, int tokenizer_vocab) {
  std::ostringstream out;
  out << "# " << s.name << " — RANDOM WEIGHTS\n\n"
      << "Written by `pipeline make-model --shape " << s.name << " --dtype " << dtype_name(dtype)
      << " --seed " << seed << "`. The weights are random: the model has the shape, size and\n"
      << "speed of a real " << s.name << " checkpoint but writes meaningless text. Use it to run\n"
      << "and benchmark the server, never to judge answers.\n\n"
      << "hidden " << s.hidden << ", FFN " << s.intermediate << ", " << s.layers << " layers, "
      << s.heads << " heads (" << s.kv_heads << " key/value), vocab " << s.vocab << ", context "
      << s.max_positions << (s.tied ? ", tied embeddings" : ", untied lm_head")
      << ".\n\n`tokenizer.model` is a " << tokenizer_vocab
      << "-piece sentencepiece BPE model trained on " << corpus.filename().string()
      << ";\nembedding rows beyond it are padding.\n";
  write_text(dir / "README.md", out.str());
}

// Lies in the output folder while make-model writes it: a run killed part-way (Ctrl-C, the OOM
// killer) leaves it behind, so the next run knows the files there are a broken checkpoint of its
// own making, and writes over them instead of refusing the folder as not empty.
constexpr const char* kIncompleteMarker = ".make-model-incomplete";

// Every file a run writes, so that an interrupted run's are all that is cleared.
constexpr const char* kWrittenFiles[] = {
    "tokenizer.model",       "config.json", "generation_config.json",
    "tokenizer_config.json", "README.md",   "model.safetensors"};

// What an interrupted run left in `out`, removed, so that the folder is as that run found it.
void clear_interrupted_run(const std::filesystem::path& out) {
  if (!std::filesystem::exists(out / kIncompleteMarker)) return;
  std::fprintf(stderr, "make-model: %s holds an interrupted run's files; writing over them\n",
               out.c_str());
  for (const char* name : kWrittenFiles) std::filesystem::remove(out / name);
  std::filesystem::remove(out / kIncompleteMarker);
}

// A checkpoint written over another would mix with its files (its shards and their index stay)
// into one that does not load, so make-model writes only into a new or an empty folder (or over
// the files an interrupted run of its own left there).
void require_new_or_empty_folder(const std::filesystem::path& out) {
  if (!std::filesystem::exists(out)) return;
  if (!std::filesystem::is_directory(out))
    throw UsageError("--out " + out.string() + ": not a folder");
  clear_interrupted_run(out);
  if (!std::filesystem::is_empty(out))
    throw UsageError("--out " + out.string() +
                     ": the folder is not empty; give a new or an empty one (a checkpoint written "
                     "among another's files would not load)");
}

// What make-model writes, removed again if it fails: the folder if it made it, else everything
// in the (empty) folder it was given. A run killed before keep() leaves the marker.
class OutputFolder {
 public:
  explicit OutputFolder(std::filesystem::path path)
      : path_(std::move(path)), created_(std::filesystem::create_directories(path_)) {
    write_text(path_ / kIncompleteMarker, "make-model is writing this folder\n");
  }
  ~OutputFolder() {
    if (complete_) return;
    std::error_code ignored;  // the command already fails with the error that matters
    if (created_) {
      std::filesystem::remove_all(path_, ignored);
      return;
    }
    for (const auto& entry : std::filesystem::directory_iterator(path_, ignored))
      std::filesystem::remove_all(entry.path(), ignored);
  }
  OutputFolder(const OutputFolder&) = delete;
  OutputFolder& operator=(const OutputFolder&) = delete;

  // Everything is written: the marker goes, and the folder stays.
  void keep() {
    std::filesystem::remove(path_ / kIncompleteMarker);
    complete_ = true;
  }

 private:
  std::filesystem::path path_;
  bool created_;
  bool complete_ = false;
};

}  // namespace

int make_model_command(int argc, char** argv) {
  Options options(
      argc, argv,
      "usage: pipeline make-model --shape NAME --out DIR [--seed S] "
      "[--dtype bf16|f16|f32] [--corpus FILE]\n"
      "Writes a random-weight checkpoint of a real shape in Hugging Face layout.\n"
      "  --shape NAME    tiny (the demo model), llama2-110m, tinyllama-1.1b, llama2-7b\n"
      "  --out DIR       a new or an empty folder, or one a killed run left\n"
      "  --seed S        the weights' seed (0); the same seed writes the same files\n"
      "  --dtype T       the weights' element type: bf16 (the default), f16 or f32\n"
      "  --corpus FILE   text the tokenizer is trained on (the project's\n"
      "                  data/tokenizer_corpus.txt)");
  if (options.help()) return 0;
  // A copy: GCC 13 takes a reference bound to find_shape's temporary argument for a dangling one.
  const ModelShape shape = find_shape(options.required("--shape"));
  const std::filesystem::path out = options.required("--out");
  if (out.empty()) throw UsageError("--out must name a folder");
  const uint64_t seed = options.integer("--seed", 0, 0);
  const auto dtype = parse_dtype(options.get("--dtype", "bf16"));
  if (!dtype) throw UsageError("--dtype: expected bf16, f16 or f32");
  const std::filesystem::path corpus =
      options.get("--corpus", PIPELINE_SOURCE_DIR "/data/tokenizer_corpus.txt");
  options.finish();

  require_new_or_empty_folder(out);
  OutputFolder folder(out);
  const int tokenizer_vocab =
      train_tokenizer(corpus, std::min(shape.vocab, kMaxTokenizerVocab), out / "tokenizer.model");
  write_config(out, shape, *dtype, seed);
  write_readme(out, shape, *dtype, seed, corpus, tokenizer_vocab);
  const auto specs = tensor_specs(shape, *dtype);
  write_safetensors(
      out / "model.safetensors", specs,
      [&](size_t i, std::span<std::byte> bytes) { fill_tensor(specs[i], i, seed, bytes); },
      {{"format", "pt"}});
  folder.keep();
  std::fprintf(stderr, "wrote %s: shape %s, %s, random weights (seed %llu)\n", out.c_str(),
               shape.name, dtype_name(*dtype), static_cast<unsigned long long>(seed));
  return 0;
}

}  // namespace pipeline
