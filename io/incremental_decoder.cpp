#include "io/incremental_decoder.h"

#include "io/utf8.h"

namespace pipeline {

IncrementalDecoder::IncrementalDecoder(const Tokenizer& tokenizer, std::span<const int32_t> prompt)
    : tokenizer_(tokenizer), text_started_(!prompt.empty() && !tokenizer.decode(prompt).empty()) {
  // A prompt of no text may still have spent sentencepiece's leading-space strip (a lone "▁"):
  // the first pieces are decoded after it.
  if (!text_started_) leading_ids_.assign(prompt.begin(), prompt.end());
}

std::string IncrementalDecoder::push(int32_t token) {
  // Checkpoints may pad their embedding beyond the tokenizer's pieces; padding ids, which a
  // sampler can still draw, carry no text, and end a run of byte pieces as any other does: all
  // they add is what flush() decides.
  if (token >= tokenizer_.vocab_size()) return flush();
  std::string text;
  if (const int byte = tokenizer_.byte_value(token); byte >= 0) {
    pending_bytes_ += static_cast<char>(byte);
    take_characters(text, /*run_ended=*/false);
  } else {
    // Like sentencepiece, a run of byte pieces ends at the next other piece.
    take_characters(text, /*run_ended=*/true);
    text_started_ = text_started_ || !text.empty();
    text += piece_text(token);
  }
  text_started_ = text_started_ || !text.empty();
  return text;
}

std::string IncrementalDecoder::flush() {
  std::string text;
  take_characters(text, /*run_ended=*/true);
  text_started_ = text_started_ || !text.empty();
  return text;
}

std::string IncrementalDecoder::piece_text(int32_t token) {
  if (!text_started_) {
    // Which leading "▁" sentencepiece drops depends on the model's normalizer settings, so
    // sentencepiece decodes the start itself. Until text appears, leading_ids_ holds only
    // textless ids (controls and stripped "▁"), so this is the text the token adds.
    leading_ids_.push_back(token);
    std::string text = tokenizer_.decode(leading_ids_);
    if (!text.empty()) leading_ids_.clear();
    return text;
  }
  return tokenizer_.token_text(token);
}

void IncrementalDecoder::take_characters(std::string& out, bool run_ended) {
  std::string_view bytes = pending_bytes_;
  while (!bytes.empty()) {
    size_t length = 0;
    const Utf8Status status = leading_character(bytes, length);
    if (status == Utf8Status::Complete) {
      out += bytes.substr(0, length);
      bytes.remove_prefix(length);
    } else if (status == Utf8Status::Invalid || run_ended) {
      // Sentencepiece replaces the first byte and resumes at the next one.
      out += kReplacementCharacter;
      bytes.remove_prefix(1);
    } else {
      break;  // an unfinished character: wait for more bytes
    }
  }
  pending_bytes_ = std::string(bytes);
}

}  // namespace pipeline
