#include "io/tokenizer.h"

#include <sentencepiece_processor.h>

#include <algorithm>
#include <charconv>
#include <stdexcept>

#include "io/safetensors.h"
#include "io/utf8.h"

namespace pipeline {
namespace {

constexpr std::string_view kSpaceSymbol = "\xE2\x96\x81";  // "▁", a space within a piece

// The most encode_last() encodes, whole text or end, beyond the end its tokens need: a fraction of
// a second of sentencepiece.
constexpr size_t kMaxEncodedBytes = size_t(256) << 10;

size_t characters(std::string_view text) {
  size_t count = 0;
  for (const char c : text) count += !is_continuation_byte(c);
  return count;
}

// Whether the piece holds a "▁" right after another character, spanning the start of a word.
bool spans_a_word_start(std::string_view piece) {
  for (size_t at = piece.find(kSpaceSymbol, 1); at != std::string_view::npos;
       at = piece.find(kSpaceSymbol, at + 1)) {
    if (at < kSpaceSymbol.size() ||
        piece.substr(at - kSpaceSymbol.size(), kSpaceSymbol.size()) != kSpaceSymbol)
      return true;
  }
  return false;
}

}  // namespace

Tokenizer::Tokenizer(const std::filesystem::path& model_file)
    : model_file_(model_file), sp_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {
  if (!std::filesystem::is_regular_file(model_file))
    throw CheckpointError(
        "tokenizer model " + model_file.string() +
        (std::filesystem::exists(model_file) ? ": not a regular file" : ": no such file"));
  const auto status = sp_->Load(model_file.string());
  if (!status.ok())
    throw CheckpointError("tokenizer model " + model_file.string() +
                          ": not a sentencepiece model (" + status.ToString() + ")");
  probe_normalizer();
}

// The bounds of min_tokens() and encode_last() hold for the normalizers LLaMA models are
// trained with: identity rules, a space written "▁", runs of spaces kept (LLaMA-2) or collapsed,
// and a dummy "▁" before the text. Each other built-in normalizer changes one of the probe
// texts (NFKC folds "ﬁ", composes "e" + U+0301 and turns U+3000 into a space; nmt drops control
// characters), and without byte pieces unknown characters merge into one <unk>.
void Tokenizer::probe_normalizer() {
  int byte_pieces = 0;
  bool any_piece_spans_a_word_start = false;
  for (int32_t id = 0; id < vocab_size(); ++id) {
    if (sp_->IsByte(id)) ++byte_pieces;
    if (sp_->IsByte(id) || sp_->IsControl(id) || sp_->IsUnknown(id)) continue;
    const std::string& text = sp_->IdToPiece(id);
    longest_piece_ = std::max(longest_piece_, characters(text));
    any_piece_spans_a_word_start |= spans_a_word_start(text);
  }
  const auto comes_back = [this](std::string_view text) {
    return decode(encode(text, /*add_bos=*/false)) == text;
  };
  keeps_characters_ = byte_pieces == 256 && comes_back("a\x01z") && comes_back("\xEF\xAC\x81") &&
                      comes_back("e\xCC\x81") && comes_back("\xE3\x80\x80x") &&
                      comes_back("x\ty\nz");
  keeps_spaces_ = keeps_characters_ && comes_back("a  z ");
  const std::vector<int32_t> a = encode("a", /*add_bos=*/false);
  const bool dummy_prefix = !a.empty() && sp_->IdToPiece(a.front()).starts_with(kSpaceSymbol);
  splits_after_words_ = keeps_characters_ && dummy_prefix && !any_piece_spans_a_word_start;
}

Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_bos) const {
  // No encode extra options are set, so sentencepiece adds no BOS/EOS and maps the text
  // "<s>" to ordinary pieces: control pieces cannot be reached from text.
  std::vector<int> ids;
  const auto status = sp_->Encode(text, &ids);
  if (!status.ok())
    throw std::runtime_error("tokenizer " + model_file_.string() +
                             ": encode failed: " + status.ToString());
  std::vector<int32_t> result;
  result.reserve(ids.size() + 1);
  if (add_bos) {
    if (bos_id() < 0)
      throw std::runtime_error("tokenizer " + model_file_.string() + " has no BOS piece");
    result.push_back(bos_id());
  }
  result.insert(result.end(), ids.begin(), ids.end());
  return result;
}

// Every token covers at most longest_piece_ characters of the normalized text, which holds every
// character of the text (but runs of spaces, where they collapse) and a "▁" for each space.
size_t Tokenizer::min_tokens(std::string_view text) const {
  if (!keeps_characters_) return 0;
  size_t counted = 0;
  for (size_t at = 0; at < text.size(); ++at) counted += counts(text, at);
  return (counted + longest_piece_ - 1) / longest_piece_;
}

// Whether the byte at `at` starts a character that surely reaches the normalized text: any
// character but a space, which a normalizer that collapses runs may drop, as it does a "▁" the
// text spells out (to sentencepiece, a space).
bool Tokenizer::counts(std::string_view text, size_t at) const {
  if (is_continuation_byte(text[at])) return false;
  if (keeps_spaces_) return true;
  return text[at] != ' ' && text.substr(at, kSpaceSymbol.size()) != kSpaceSymbol;
}

size_t Tokenizer::start_of_last(std::string_view text, size_t keep) const {
  if (!splits_after_words_ || keep == 0) return std::string_view::npos;
  // Back from the end until the text after `at` must hold `keep` tokens...
  const size_t needed = keep * longest_piece_;
  size_t counted = 0;
  size_t at = text.size();
  while (at > 0 && counted < needed) counted += counts(text, --at);
  if (counted < needed) return std::string_view::npos;
  // ...then on to a space after a word: the "▁" it becomes starts a piece, and encoding the text
  // after it alone writes that "▁" as the dummy prefix. Not far on: a text whose only space is
  // megabytes back would be encoded nearly whole.
  const size_t farthest = at > kMaxEncodedBytes ? at - kMaxEncodedBytes : 0;
  for (; at > farthest; --at) {
    if (text[at] != ' ' || text[at - 1] == ' ') continue;
    if (at >= kSpaceSymbol.size() &&
        text.substr(at - kSpaceSymbol.size(), kSpaceSymbol.size()) == kSpaceSymbol)
      continue;  // a "▁" the text spells out is a space to sentencepiece
    return at + 1;
  }
  return std::string_view::npos;
}

std::vector<int32_t> Tokenizer::encode_last(std::string_view text, bool add_bos,
                                            size_t keep) const {
  std::vector<int32_t> ids;
  if (const size_t start = start_of_last(text, keep); start != std::string_view::npos) {
    ids = encode(text.substr(start), /*add_bos=*/false);
  } else if (text.size() <= kMaxEncodedBytes) {
    ids = encode(text, add_bos);
  } else {
    throw std::invalid_argument(
        "the prompt is " + std::to_string(text.size()) + " bytes with no space after a word " +
        "within " + std::to_string(kMaxEncodedBytes >> 10) +
        " KiB before the end its last tokens come from, where it could be truncated; a longer "
        "text must have one");
  }
  if (ids.size() > keep) ids.erase(ids.begin(), ids.end() - ptrdiff_t(keep));
  return ids;
}

std::string Tokenizer::decode(std::span<const int32_t> ids) const {
  for (const int32_t id : ids) check_id(id);
  std::string text;
  const auto status = sp_->Decode(std::vector<int>(ids.begin(), ids.end()), &text);
  if (!status.ok())
    throw std::runtime_error("tokenizer " + model_file_.string() +
                             ": decode failed: " + status.ToString());
  return text;
}

int Tokenizer::vocab_size() const {
  return sp_->GetPieceSize();
}
void Tokenizer::check_fits(int model_vocab_size) const {
  if (vocab_size() > model_vocab_size)
    throw CheckpointError("tokenizer model " + model_file_.string() + " has " +
                          std::to_string(vocab_size()) + " pieces but the model's vocab_size is " +
                          std::to_string(model_vocab_size) +
                          ": the tokenizer belongs to another model");
}

int32_t Tokenizer::bos_id() const {
  return sp_->bos_id();
}
int32_t Tokenizer::eos_id() const {
  return sp_->eos_id();
}
int32_t Tokenizer::unk_id() const {
  return sp_->unk_id();
}

std::string Tokenizer::token_text(int32_t id) const {
  if (id >= vocab_size()) return "";
  if (const int byte = byte_value(id); byte >= 0) return std::string(1, char(byte));
  if (is_control(id)) return "";
  if (is_unknown(id)) return decode(std::span(&id, 1));
  const std::string piece_text = piece(id);
  std::string text;
  for (size_t i = 0; i < piece_text.size();) {
    if (piece_text.compare(i, kSpaceSymbol.size(), kSpaceSymbol) == 0) {
      text += ' ';
      i += kSpaceSymbol.size();
    } else {
      text += piece_text[i++];
    }
  }
  return text;
}

std::string Tokenizer::piece(int32_t id) const {
  check_id(id);
  return sp_->IdToPiece(id);
}

int Tokenizer::byte_value(int32_t id) const {
  check_id(id);
  if (!sp_->IsByte(id)) return -1;
  // Byte pieces are spelled "<0xNN>" with two hex digits.
  const std::string& text = sp_->IdToPiece(id);
  unsigned value = 0;
  const bool well_formed =
      text.size() == 6 && text.starts_with("<0x") && text[5] == '>' &&
      std::from_chars(text.data() + 3, text.data() + 5, value, 16).ptr == text.data() + 5;
  if (!well_formed)
    throw std::runtime_error("tokenizer " + model_file_.string() + ": byte piece " +
                             std::to_string(id) + " is spelled '" + text + "', not <0xNN>");
  return int(value);
}

bool Tokenizer::is_control(int32_t id) const {
  check_id(id);
  return sp_->IsControl(id);
}

bool Tokenizer::is_unknown(int32_t id) const {
  check_id(id);
  return sp_->IsUnknown(id);
}

void Tokenizer::check_id(int32_t id) const {
  if (id < 0 || id >= vocab_size())
    throw std::out_of_range("token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                            std::to_string(vocab_size()) + ") of " + model_file_.string());
}

}  // namespace pipeline
