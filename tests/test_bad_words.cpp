// vLLM's bad_words on the real LLaMA-2 tokenizer: the token sequences its words are banned as
// (model/bad_words.h), and a sampler held to a guide drawing among the tokens they leave.
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "io/model_config.h"
#include "io/text_pattern.h"
#include "model/bad_words.h"
#include "model/guided_decoding.h"
#include "model/sampling.h"
#include "tests/support/llama2_vocabulary.h"

namespace pipeline {
namespace {

using testing::config_for;
using testing::llama2_tokenizer;
using Sequences = std::vector<std::vector<int32_t>>;

Sequences sequences_of(const std::vector<std::string>& words) {
  return bad_word_sequences(llama2_tokenizer(), words);
}

std::vector<std::string> pieces(const std::vector<int32_t>& sequence) {
  std::vector<std::string> out;
  for (int32_t token : sequence) out.push_back(llama2_tokenizer().piece(token));
  return out;
}

// Python's str.lstrip(): ASCII's whitespace and Unicode's, nothing else.
TEST(BadWords, LeadingWhitespaceIsStrippedAsPythonStripsIt) {
  EXPECT_EQ(strip_leading_whitespace(" \t\n\v\f\rdragon "), "dragon ");
  EXPECT_EQ(strip_leading_whitespace("\x1f\u00a0\u2003\u3000dragon"), "dragon");
  EXPECT_EQ(strip_leading_whitespace("\u200bdragon"), "\u200bdragon");  // not a space to Python
  EXPECT_EQ(strip_leading_whitespace("\u2029 \u0085"), "");
  EXPECT_EQ(strip_leading_whitespace("dragon"), "dragon");
}

// Encoded without BOS, LLaMA-2 starts a word with "▁" as Hugging Face's tokenizer does, so a
// space before it only adds a token: "dragon" is banned as ▁drag on alone, whether written
// after a space or at the start. A word whose first piece "▁" cannot join (a digit) keeps its
// spaced spelling too: "▁▁" begins it in place of "▁", and it is as long.
TEST(BadWords, SequencesAreTheWordsSpellingsVllmKeeps) {
  const Sequences dragon = sequences_of({"dragon"});
  ASSERT_EQ(dragon, (Sequences{{8338, 265}}));
  EXPECT_EQ(pieces(dragon[0]), (std::vector<std::string>{"▁drag", "on"}));
  EXPECT_EQ(llama2_tokenizer().encode(" dragon", false), (std::vector<int32_t>{29871, 8338, 265}));
  EXPECT_EQ(sequences_of({"\t dragon"}), dragon);
  EXPECT_EQ(pieces(sequences_of({"the dragon"})[0]),
            (std::vector<std::string>{"▁the", "▁drag", "on"}));

  const Sequences year = sequences_of({"2023"});
  ASSERT_EQ(year.size(), 2u);
  EXPECT_EQ(pieces(year[0]), (std::vector<std::string>{"▁", "2", "0", "2", "3"}));
  EXPECT_EQ(pieces(year[1]), (std::vector<std::string>{"▁▁", "2", "0", "2", "3"}));
  // In the words' order.
  EXPECT_EQ(sequences_of({"dragon", "2023"}), (Sequences{dragon[0], year[0], year[1]}));
}

// 1024 tokens in all pass, one more is refused with a message for the client; a word with no
// tokens is refused too (the API refuses a blank word before it gets here).
TEST(BadWords, TheirTokensAreCappedAndEachWordHasSome) {
  // n digits: ▁ and the n digits, and ▁▁ and the n digits.
  EXPECT_EQ(sequences_of({std::string(511, '7')}).size(), 2u);
  try {
    sequences_of({std::string(511, '7'), "x"});  // ▁x alone: " x" is ▁ ▁x
    FAIL() << "1025 tokens were taken";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "bad_words come to 1025 tokens, more than the 1024 a request may ban");
  }
  EXPECT_THROW(sequences_of({"dragon", " "}), std::invalid_argument);
}

// With a guide, the bans hold too: the guide chooses among the tokens they leave, and where they
// leave it none, the draw fails with the guide's error rather than taking a banned token.
TEST(BadWords, AGuidedDrawTakesOnlyWhatTheyLeave) {
  const Tokenizer& tokenizer = llama2_tokenizer();
  const LlamaConfig config = config_for(tokenizer);
  const GuidedVocabulary vocabulary(tokenizer, config);
  const auto pets = TextPattern::from_choices(std::vector<std::string>{" cat", " dog"});
  const int32_t cat = tokenizer.encode("cat", false).at(0);
  const int32_t dog = tokenizer.encode("dog", false).at(0);
  std::vector<float> logits(size_t(config.vocab_size), 0.0f);
  logits[size_t(cat)] = 10.0f;
  logits[size_t(dog)] = 5.0f;
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  EXPECT_EQ(Sampler(greedy, 0, GuidedDecoding(vocabulary, pets)).sample(logits, {}).token, cat);
  greedy.bad_word_sequences = bad_word_sequences(tokenizer, std::vector<std::string>{"cat"});
  EXPECT_EQ(Sampler(greedy, 0, GuidedDecoding(vocabulary, pets)).sample(logits, {}).token, dog);

  const auto digit = TextPattern::from_regex("[0-9]");
  GuidedDecoding fresh(vocabulary, digit);
  SamplingParams banned;
  for (int32_t token = 0; token < config.vocab_size; ++token)
    if (fresh.allows(token)) banned.bad_word_sequences.push_back({token});
  ASSERT_FALSE(banned.bad_word_sequences.empty());
  Sampler sampler(banned, 0, GuidedDecoding(vocabulary, digit));
  try {
    sampler.sample(logits, {});
    FAIL() << "a banned token was drawn";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("no token the model can draw continues"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find(" among the tokens bad_words leaves"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace pipeline
