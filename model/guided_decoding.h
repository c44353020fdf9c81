// Guided decoding: the sampler may draw only tokens that keep the answer the beginning of a text
// the request allows, and an end-of-sequence token only once that text is whole. JSON mode
// (response_format json_object or json_schema, guided_json) holds the answer to a JSON value a
// schema admits; guided_regex and guided_choice hold it to a TextPattern; guided_grammar (and
// llama.cpp's grammar) to a Grammar.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "io/grammar.h"
#include "io/grammar_prefix.h"
#include "io/json_schema.h"
#include "io/model_config.h"
#include "io/schema_prefix.h"
#include "io/text_pattern.h"
#include "io/tokenizer.h"

namespace pipeline {

// The vocabulary as guided decoding reads it: each token's bytes (Tokenizer::token_text), and
// the tokens that write something sorted by their bytes, so that tokens sharing a beginning lie
// side by side and a state that refuses a beginning refuses them all at one test. Built once per
// model; read-only after, so shared by every sequence.
class GuidedVocabulary {
 public:
  // Sized to the model's vocabulary (its logits' width), which may exceed the tokenizer's.
  GuidedVocabulary(const Tokenizer& tokenizer, const LlamaConfig& model);

  int size() const { return int(texts_.size()); }
  // Empty for a token that writes nothing: controls, <unk> (whose text is a stand-in, not what
  // the model meant), and the model's rows beyond the tokenizer.
  const std::string& text(int32_t token) const { return texts_[size_t(token)]; }
  // The tokens that write something, by their bytes; shared_bytes()[i] is how many leading bytes
  // sorted_tokens()[i] has in common with the token before it (0 for the first).
  const std::vector<int32_t>& sorted_tokens() const { return sorted_tokens_; }
  const std::vector<uint32_t>& shared_bytes() const { return shared_bytes_; }
  size_t longest_text() const { return longest_text_; }
  // The model's end-of-sequence tokens within its vocabulary.
  const std::vector<int32_t>& eos_tokens() const { return eos_tokens_; }
  bool is_eos(int32_t token) const;
  // The other tokens that write nothing. Each token is in exactly one of sorted_tokens(),
  // eos_tokens() and these.
  const std::vector<int32_t>& textless_tokens() const { return textless_tokens_; }

 private:
  std::vector<std::string> texts_;
  std::vector<int32_t> sorted_tokens_;
  std::vector<uint32_t> shared_bytes_;
  size_t longest_text_ = 0;
  std::vector<int32_t> eos_tokens_;
  std::vector<int32_t> textless_tokens_;
};

// One sequence's guided decoding: what it has written so far, and which tokens may come next.
class GuidedDecoding {
 public:
  // JSON mode: a value `schema` admits.
  GuidedDecoding(const GuidedVocabulary& vocabulary, std::shared_ptr<const JsonSchema> schema);
  // guided_regex, guided_choice: a text `pattern` accepts.
  GuidedDecoding(const GuidedVocabulary& vocabulary, std::shared_ptr<const TextPattern> pattern);
  // guided_grammar, structured_outputs grammar, grammar: a text `grammar` derives.
  GuidedDecoding(const GuidedVocabulary& vocabulary, std::shared_ptr<const Grammar> grammar);

  bool allows(int32_t token) const;
  // Sets the logit of every token it does not allow to -inf; returns how many it allows.
  // Throws std::invalid_argument unless there is one logit per token of the vocabulary, and
  // GrammarError where a grammar passes GrammarPrefix's limits (allows() and advance() too).
  size_t mask(std::span<float> logits);
  // Takes a token it allows into the answer. Throws std::invalid_argument on one it does not.
  void advance(int32_t token);
  // What the answer is held to, for errors: "the JSON value response_format asks for", ...
  std::string held_to() const;

 private:
  // What the answer is held to, what it has written, and mask()'s walk: after[k] is the state
  // after the current token's first k bytes.
  template <class Guide, class Prefix>
  struct Held {
    std::shared_ptr<const Guide> guide;  // what written follows
    Prefix written;
    std::vector<Prefix> after;
  };
  using JsonHeld = Held<JsonSchema, SchemaPrefix>;
  using PatternHeld = Held<TextPattern, PatternPrefix>;
  using GrammarHeld = Held<Grammar, GrammarPrefix>;

  template <class Prefix>
  bool allows(const Prefix& written, int32_t token) const;
  template <class Prefix>
  size_t mask(const Prefix& written, std::vector<Prefix>& after, std::span<float> logits) const;

  const GuidedVocabulary* vocabulary_;
  std::variant<JsonHeld, PatternHeld, GrammarHeld> held_;
};

}  // namespace pipeline
