#include "io/tokenizer.h"

#include <sentencepiece_processor.h>

#include <charconv>
#include <stdexcept>

#include "io/safetensors.h"

namespace pipeline {

Tokenizer::Tokenizer(const std::filesystem::path& model_file)
    : model_file_(model_file), sp_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {
  if (!std::filesystem::is_regular_file(model_file))
    throw CheckpointError("tokenizer model " + model_file.string() + ": no such file");
  const auto status = sp_->Load(model_file.string());
  if (!status.ok())
    throw CheckpointError("tokenizer model " + model_file.string() +
                          ": not a sentencepiece model (" + status.ToString() + ")");
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
  static constexpr std::string_view kSpaceSymbol = "\xE2\x96\x81";  // "▁"
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
