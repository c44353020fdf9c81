// The sentencepiece tokenizer of a LLaMA checkpoint (tokenizer.model).
// All methods are const and safe to call from several threads at once.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace pipeline {

class Tokenizer {
 public:
  // Throws CheckpointError naming the file when it is missing or unreadable.
  explicit Tokenizer(const std::filesystem::path& model_file);
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  // Plain text to ids; BOS and EOS are never produced from text ("<s>" is plain text).
  std::vector<int32_t> encode(std::string_view text, bool add_bos) const;
  // Ids to text exactly as sentencepiece decodes them. Throws std::out_of_range on an id
  // outside [0, vocab_size).
  std::string decode(std::span<const int32_t> ids) const;

  int vocab_size() const;
  // Throws CheckpointError when the tokenizer has more pieces than the model has embeddings
  // (`model_vocab_size`): text would become ids the model cannot take. Fewer is fine (a
  // checkpoint may pad its vocabulary).
  void check_fits(int model_vocab_size) const;
  int32_t bos_id() const;  // -1 when the model has none
  int32_t eos_id() const;  // -1 when the model has none
  int32_t unk_id() const;
  // The piece's text: "▁the", "<0x0A>", "<s>". Throws std::out_of_range on a bad id.
  std::string piece(int32_t id) const;
  // -1 unless the piece is a byte-fallback piece <0xNN>.
  int byte_value(int32_t id) const;
  bool is_control(int32_t id) const;  // <s>, </s>, ...
  bool is_unknown(int32_t id) const;  // <unk>
  // A token's own text away from the start of a text, as logprobs show it: "▁" as a space, a
  // byte piece as its one byte, controls as nothing, <unk> as sentencepiece spells it. Ids
  // beyond the vocabulary (padding rows of a larger embedding) have no text.
  std::string token_text(int32_t id) const;

 private:
  void check_id(int32_t id) const;

  std::filesystem::path model_file_;
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
};

}  // namespace pipeline
