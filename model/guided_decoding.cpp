#include "model/guided_decoding.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace pipeline {

GuidedVocabulary::GuidedVocabulary(const Tokenizer& tokenizer, const LlamaConfig& model)
    : texts_(size_t(model.vocab_size)) {
  for (int32_t token = 0; token < model.vocab_size; ++token) {
    if (model.is_eos(token)) {
      eos_tokens_.push_back(token);
      continue;
    }
    std::string& text = texts_[size_t(token)];
    if (token < tokenizer.vocab_size() && !tokenizer.is_unknown(token))
      text = tokenizer.token_text(token);
    if (text.empty()) {
      textless_tokens_.push_back(token);
    } else {
      sorted_tokens_.push_back(token);
      longest_text_ = std::max(longest_text_, text.size());
    }
  }
  std::sort(sorted_tokens_.begin(), sorted_tokens_.end(),
            [&](int32_t a, int32_t b) { return texts_[size_t(a)] < texts_[size_t(b)]; });
  shared_bytes_.resize(sorted_tokens_.size());
  for (size_t i = 1; i < sorted_tokens_.size(); ++i) {
    const std::string& before = texts_[size_t(sorted_tokens_[i - 1])];
    const std::string& text = texts_[size_t(sorted_tokens_[i])];
    const auto differs = std::mismatch(text.begin(), text.end(), before.begin(), before.end());
    shared_bytes_[i] = uint32_t(differs.first - text.begin());
  }
}

bool GuidedVocabulary::is_eos(int32_t token) const {
  return std::find(eos_tokens_.begin(), eos_tokens_.end(), token) != eos_tokens_.end();
}

GuidedDecoding::GuidedDecoding(const GuidedVocabulary& vocabulary,
                               std::shared_ptr<const JsonSchema> schema)
    : vocabulary_(&vocabulary), held_(JsonHeld{schema, SchemaPrefix(*schema), {}}) {}

GuidedDecoding::GuidedDecoding(const GuidedVocabulary& vocabulary,
                               std::shared_ptr<const TextPattern> pattern)
    : vocabulary_(&vocabulary), held_(PatternHeld{pattern, PatternPrefix(*pattern), {}}) {}

GuidedDecoding::GuidedDecoding(const GuidedVocabulary& vocabulary,
                               std::shared_ptr<const Grammar> grammar)
    : vocabulary_(&vocabulary), held_(GrammarHeld{grammar, GrammarPrefix(*grammar), {}}) {}

bool GuidedDecoding::allows(int32_t token) const {
  return std::visit([&](const auto& held) { return allows(held.written, token); }, held_);
}

size_t GuidedDecoding::mask(std::span<float> logits) {
  if (logits.size() != size_t(vocabulary_->size()))
    throw std::invalid_argument("GuidedDecoding::mask: " + std::to_string(logits.size()) +
                                " logits for a vocabulary of " +
                                std::to_string(vocabulary_->size()));
  return std::visit([&](auto& held) { return mask(held.written, held.after, logits); }, held_);
}

void GuidedDecoding::advance(int32_t token) {
  if (!allows(token))
    throw std::invalid_argument("GuidedDecoding::advance: token " + std::to_string(token) +
                                " does not continue the answer it is held to");
  if (vocabulary_->is_eos(token)) return;
  std::visit([&](auto& held) { held.written.feed(vocabulary_->text(token)); }, held_);
}

std::string GuidedDecoding::held_to() const {
  if (std::holds_alternative<JsonHeld>(held_))
    return "the JSON value response_format (or guided_json) asks for";
  if (std::holds_alternative<PatternHeld>(held_))
    return "the text guided_regex (or guided_choice) allows";
  return "the text guided_grammar (or grammar) allows";
}

template <class Prefix>
bool GuidedDecoding::allows(const Prefix& written, int32_t token) const {
  if (token < 0 || token >= vocabulary_->size()) return false;
  if (vocabulary_->is_eos(token)) return written.complete();
  const std::string& text = vocabulary_->text(token);
  Prefix trial = written;
  return !text.empty() && trial.feed(text);
}

// A walk over the sorted vocabulary, as over a trie: the states after each of the previous
// token's accepted bytes are kept, so a token feeds only the bytes it does not share with the
// token before it, and a token that shares the byte the previous one was refused at is refused
// without a test. A state that refuses most bytes (between JSON values, most of the time) thus
// costs little more than a look at each token.
template <class Prefix>
size_t GuidedDecoding::mask(const Prefix& written, std::vector<Prefix>& after,
                            std::span<float> logits) const {
  const std::vector<int32_t>& tokens = vocabulary_->sorted_tokens();
  const std::vector<uint32_t>& shared = vocabulary_->shared_bytes();
  after.resize(vocabulary_->longest_text() + 1, written);
  after[0] = written;
  size_t allowed = 0;
  size_t fed = 0;        // bytes of the previous token accepted
  bool refused = false;  // whether the previous token's byte `fed` was refused
  for (size_t i = 0; i < tokens.size(); ++i) {
    const std::string& text = vocabulary_->text(tokens[i]);
    if (!(refused && fed < shared[i])) {
      refused = false;
      for (fed = std::min(fed, size_t(shared[i])); fed < text.size(); ++fed) {
        after[fed + 1] = after[fed];
        if (!after[fed + 1].feed(uint8_t(text[fed]))) {
          refused = true;
          break;
        }
      }
    }
    if (refused) {
      logits[size_t(tokens[i])] = -INFINITY;
    } else {
      ++allowed;
    }
  }
  for (int32_t token : vocabulary_->textless_tokens()) logits[size_t(token)] = -INFINITY;
  for (int32_t token : vocabulary_->eos_tokens()) {
    if (written.complete()) {
      ++allowed;
    } else {
      logits[size_t(token)] = -INFINITY;
    }
  }
  return allowed;
}

}  // namespace pipeline
