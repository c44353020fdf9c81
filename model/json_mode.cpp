#include "model/json_mode.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace pipeline {

JsonVocabulary::JsonVocabulary(const Tokenizer& tokenizer, const LlamaConfig& model)
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

bool JsonVocabulary::is_eos(int32_t token) const {
  return std::find(eos_tokens_.begin(), eos_tokens_.end(), token) != eos_tokens_.end();
}

bool JsonMode::allows(int32_t token) const {
  if (token < 0 || token >= vocabulary_->size()) return false;
  if (vocabulary_->is_eos(token)) return written_.complete();
  const std::string& text = vocabulary_->text(token);
  SchemaPrefix trial = written_;
  return !text.empty() && trial.feed(text);
}

// A walk over the sorted vocabulary, as over a trie: the states after each of the previous
// token's accepted bytes are kept, so a token feeds only the bytes it does not share with the
// token before it, and a token that shares the byte the previous one was refused at is refused
// without a test. A state that refuses most bytes (between values, most of the time) thus costs
// little more than a look at each token.
size_t JsonMode::mask(std::span<float> logits) {
  if (logits.size() != size_t(vocabulary_->size()))
    throw std::invalid_argument("JsonMode::mask: " + std::to_string(logits.size()) +
                                " logits for a vocabulary of " +
                                std::to_string(vocabulary_->size()));
  const std::vector<int32_t>& tokens = vocabulary_->sorted_tokens();
  const std::vector<uint32_t>& shared = vocabulary_->shared_bytes();
  after_.resize(vocabulary_->longest_text() + 1, written_);
  after_[0] = written_;
  size_t allowed = 0;
  size_t fed = 0;        // bytes of the previous token accepted
  bool refused = false;  // whether the previous token's byte `fed` was refused
  for (size_t i = 0; i < tokens.size(); ++i) {
    const std::string& text = vocabulary_->text(tokens[i]);
    if (!(refused && fed < shared[i])) {
      refused = false;
      for (fed = std::min(fed, size_t(shared[i])); fed < text.size(); ++fed) {
        after_[fed + 1] = after_[fed];
        if (!after_[fed + 1].feed(uint8_t(text[fed]))) {
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
    if (written_.complete()) {
      ++allowed;
    } else {
      logits[size_t(token)] = -INFINITY;
    }
  }
  return allowed;
}

void JsonMode::advance(int32_t token) {
  if (!allows(token))
    throw std::invalid_argument("JsonMode::advance: token " + std::to_string(token) +
                                " does not continue the JSON value");
  if (!vocabulary_->is_eos(token)) written_.feed(vocabulary_->text(token));
}

}  // namespace pipeline
