// Token ids to text one token at a time, as sentencepiece would decode the whole sequence:
// "▁" becomes a space (none before the first piece of a text), byte-fallback pieces <0xNN> are
// joined into whole UTF-8 characters, and no partial character is ever returned. The
// concatenation of every push() and the final flush() is what the ids add to the prompt's text:
// Tokenizer::decode(prompt + ids) less Tokenizer::decode(prompt). So after a prompt with text
// the first piece keeps its space ("to" + " go", as OpenAI's and vLLM's completions give it),
// and after none (or only a BOS) it is the start of the text.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "io/tokenizer.h"

namespace pipeline {

class IncrementalDecoder {
 public:
  // `prompt`: the ids the decoded text continues.
  explicit IncrementalDecoder(const Tokenizer& tokenizer, std::span<const int32_t> prompt = {});

  // Appends a token; returns the text it completes (possibly empty). Ids beyond the
  // tokenizer's vocabulary (embedding padding) add no text of their own, and end a run of byte
  // pieces as a control token does; a negative id throws std::out_of_range.
  std::string push(int32_t token);
  // At the end of the stream: bytes of an unfinished character, as U+FFFD.
  std::string flush();
  // No text yet (after a prompt of none): the next piece's word-start space will be dropped.
  bool at_text_start() const { return !text_started_; }

 private:
  // The text of a piece that is not a byte piece.
  std::string piece_text(int32_t token);
  // Moves every decided character at the front of pending_bytes_ to `out`; with
  // `run_ended`, an unfinished character is decided too (as U+FFFD per byte).
  void take_characters(std::string& out, bool run_ended);

  const Tokenizer& tokenizer_;
  std::string pending_bytes_;  // byte-piece values not yet forming a whole character
  // Until the first text appears, sentencepiece strips the "▁" of leading pieces; these are
  // the (textless) ids seen so far, the prompt's included, decoded together with the next one
  // by sentencepiece itself.
  std::vector<int32_t> leading_ids_;
  bool text_started_ = false;
};

}  // namespace pipeline
