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
  // Sentencepiece takes 1.5-3 µs a byte of English (LLaMA-2's model), so a request's 16 MiB
  // would hold a thread for most of a minute: a prompt is measured with min_tokens() first.
  std::vector<int32_t> encode(std::string_view text, bool add_bos) const;
  // A lower bound on encode(text, false).size(), in one pass over the text's bytes: no piece
  // spans more than the longest piece's characters. 0 (no bound) for a tokenizer whose
  // normalizer may drop or fold characters (NFKC, for one) or that has no byte pieces (its
  // unknown characters merge into one <unk>).
  size_t min_tokens(std::string_view text) const;
  // The last `keep` tokens of encode(text, add_bos), or all of them when there are fewer.
  // Where the vocabulary allows, only the text's end is encoded: no piece spans a space that
  // follows a word, so the text after such a space encodes as it does within the whole.
  std::vector<int32_t> encode_last(std::string_view text, bool add_bos, size_t keep) const;
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
  void probe_normalizer();
  // Whether the character that starts at byte `at` is one min_tokens() counts.
  bool counts(std::string_view text, size_t at) const;
  // Where encode_last() may start encoding: just after the latest space that follows a word
  // and leaves at least `keep` tokens of text after it. npos where there is none.
  size_t start_of_last(std::string_view text, size_t keep) const;

  std::filesystem::path model_file_;
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  // What the model's normalizer and vocabulary allow, probed at load (probe_normalizer()).
  size_t longest_piece_ = 1;         // in characters, a space ("▁") counting as one
  bool keeps_characters_ = false;    // every character but a space reaches some token
  bool keeps_spaces_ = false;        // spaces too: runs of them are not collapsed
  bool splits_after_words_ = false;  // no piece holds a "▁" after another character
};

}  // namespace pipeline
