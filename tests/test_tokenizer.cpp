// The sentencepiece wrapper against Meta's LLaMA-2 tokenizer (golden ids from the reference
// implementation) and llama2.c's 512-piece stories260K tokenizer.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <stdexcept>

#include "io/safetensors.h"
#include "io/tokenizer.h"
#include "tests/support/shared_data.h"

namespace pipeline {
namespace {

using testing::shared_path;

nlohmann::json read_json(const std::filesystem::path& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

Tokenizer llama2_tokenizer() {
  return Tokenizer(shared_path("models/llama2-tokenizer/tokenizer.model"));
}
Tokenizer stories_tokenizer() {
  return Tokenizer(shared_path("models/stories260K/tokenizer.model"));
}

TEST(Tokenizer, Llama2GoldenEncodeDecodeAndPieces) {
  const auto golden = read_json(shared_path("golden/llama2_tokenizer.json"));
  const Tokenizer tokenizer(shared_path(golden["tokenizer"].get<std::string>()));
  ASSERT_FALSE(golden["cases"].empty());
  for (const auto& c : golden["cases"]) {
    const auto text = c["text"].get<std::string>();
    SCOPED_TRACE(text);
    const auto expected_ids = c["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(tokenizer.encode(text, /*add_bos=*/false), expected_ids);
    EXPECT_EQ(tokenizer.decode(expected_ids), c["decoded"].get<std::string>());
    std::vector<std::string> pieces;
    for (const int32_t id : expected_ids) pieces.push_back(tokenizer.piece(id));
    EXPECT_EQ(pieces, c["pieces"].get<std::vector<std::string>>());
  }
}

TEST(Tokenizer, Llama2SpecialIds) {
  const auto golden = read_json(shared_path("golden/llama2_tokenizer.json"));
  const Tokenizer tokenizer = llama2_tokenizer();
  EXPECT_EQ(tokenizer.vocab_size(), golden["vocab_size"].get<int>());
  EXPECT_EQ(tokenizer.bos_id(), golden["bos_id"].get<int>());
  EXPECT_EQ(tokenizer.eos_id(), golden["eos_id"].get<int>());
  EXPECT_EQ(tokenizer.unk_id(), golden["unk_id"].get<int>());
  EXPECT_EQ(tokenizer.piece(1), "<s>");
  EXPECT_EQ(tokenizer.piece(2), "</s>");
  EXPECT_TRUE(tokenizer.is_control(1));
  EXPECT_TRUE(tokenizer.is_control(2));
  EXPECT_FALSE(tokenizer.is_control(0));
  EXPECT_TRUE(tokenizer.is_unknown(0));
  EXPECT_FALSE(tokenizer.is_control(15043));  // "▁Hello"
}

// A tokenizer with more pieces than the model has embeddings (LLaMA-2's beside stories260K's
// vocabulary of 512) is refused: its ids past the model's would fail every batch they joined.
TEST(Tokenizer, ATokenizerLargerThanTheModelsVocabularyIsRefused) {
  const Tokenizer tokenizer = llama2_tokenizer();
  try {
    tokenizer.check_fits(512);
    FAIL() << "a tokenizer of 32000 pieces was taken for a model of 512";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("has 32000 pieces but the model's vocab_size is 512"),
              std::string::npos)
        << e.what();
  }
  EXPECT_NO_THROW(tokenizer.check_fits(32000));
  EXPECT_NO_THROW(tokenizer.check_fits(32064));  // a padded vocabulary
}

TEST(Tokenizer, AddBosPrependsTheBosId) {
  const Tokenizer tokenizer = llama2_tokenizer();
  EXPECT_EQ(tokenizer.encode("Hello world", /*add_bos=*/true),
            (std::vector<int32_t>{1, 15043, 3186}));
  EXPECT_EQ(tokenizer.encode("", /*add_bos=*/true), std::vector<int32_t>{1});
}

TEST(Tokenizer, TextCannotProduceControlTokens) {
  const Tokenizer tokenizer = llama2_tokenizer();
  for (const int32_t id : tokenizer.encode("<s></s><unk>[INST]<s>", /*add_bos=*/false))
    EXPECT_FALSE(tokenizer.is_control(id) || tokenizer.is_unknown(id)) << "id " << id;
}

TEST(Tokenizer, ByteValueOfBytePieces) {
  const Tokenizer tokenizer = llama2_tokenizer();
  EXPECT_EQ(tokenizer.byte_value(3), 0x00);    // <0x00>
  EXPECT_EQ(tokenizer.byte_value(13), 0x0A);   // <0x0A>
  EXPECT_EQ(tokenizer.byte_value(243), 0xF0);  // <0xF0>
  EXPECT_EQ(tokenizer.byte_value(258), 0xFF);  // <0xFF>
  EXPECT_EQ(tokenizer.byte_value(1), -1);      // <s>
  EXPECT_EQ(tokenizer.byte_value(0), -1);      // <unk>
  EXPECT_EQ(tokenizer.byte_value(15043), -1);  // ▁Hello
  for (int byte = 0; byte < 256; ++byte) EXPECT_EQ(tokenizer.byte_value(3 + byte), byte);
}

TEST(Tokenizer, DecodeSkipsControlTokens) {
  const Tokenizer tokenizer = llama2_tokenizer();
  const std::vector<int32_t> ids = {1, 15043, 3186, 2};
  EXPECT_EQ(tokenizer.decode(ids), "Hello world");
}

TEST(Tokenizer, IdsOutsideTheVocabularyThrow) {
  const Tokenizer tokenizer = llama2_tokenizer();
  const std::vector<int32_t> bad = {15043, 32000};
  EXPECT_THROW(tokenizer.decode(bad), std::out_of_range);
  EXPECT_THROW(tokenizer.piece(-1), std::out_of_range);
  EXPECT_THROW(tokenizer.byte_value(32000), std::out_of_range);
  EXPECT_THROW(tokenizer.is_control(99999), std::out_of_range);
}

TEST(Tokenizer, TokenTextAsLogprobsShowIt) {
  const Tokenizer tokenizer = llama2_tokenizer();
  const auto ids = tokenizer.encode("Hello world", false);  // "▁Hello", "▁world"
  ASSERT_EQ(ids.size(), 2u);
  EXPECT_EQ(tokenizer.token_text(ids[0]), " Hello");
  EXPECT_EQ(tokenizer.token_text(ids[1]), " world");
  EXPECT_EQ(tokenizer.token_text(13), "\n");  // the byte piece <0x0A>
  EXPECT_EQ(tokenizer.token_text(tokenizer.bos_id()), "");
  EXPECT_EQ(tokenizer.token_text(tokenizer.eos_id()), "");
  EXPECT_EQ(tokenizer.token_text(32000), "");  // a padding row beyond the vocabulary
  EXPECT_THROW(tokenizer.token_text(-1), std::out_of_range);
}

TEST(Tokenizer, Stories260KBasics) {
  const Tokenizer tokenizer = stories_tokenizer();
  EXPECT_EQ(tokenizer.vocab_size(), 512);
  EXPECT_EQ(tokenizer.bos_id(), 1);
  EXPECT_EQ(tokenizer.eos_id(), 2);
  EXPECT_EQ(tokenizer.byte_value(3 + 0x41), 0x41);

  const std::string story = "Once upon a time, there was a little girl named Lily.";
  const auto ids = tokenizer.encode(story, /*add_bos=*/true);
  EXPECT_EQ(ids.front(), 1);
  for (size_t i = 1; i < ids.size(); ++i) EXPECT_FALSE(tokenizer.is_control(ids[i]));
  EXPECT_EQ(tokenizer.decode(ids), story);

  // No piece holds the llama, so its four UTF-8 bytes fall back to byte pieces.
  const auto llama = tokenizer.encode("🦙", /*add_bos=*/false);
  std::vector<int> bytes;
  for (const int32_t id : llama)
    if (tokenizer.byte_value(id) >= 0) bytes.push_back(tokenizer.byte_value(id));
  EXPECT_EQ(bytes, (std::vector<int>{0xF0, 0x9F, 0xA6, 0x99}));
  EXPECT_EQ(tokenizer.decode(llama), "🦙");

  // This model's normalizer collapses runs of spaces and trims the ends.
  EXPECT_EQ(tokenizer.decode(tokenizer.encode("  a   big  dog ", false)), "a big dog");
}

// Texts that stress what a bound on the tokens may get wrong: runs of spaces, a "▁" spelled out,
// tabs and newlines, control characters, characters only byte pieces spell, long pieces.
std::string random_text(std::mt19937& rng, size_t words) {
  static const std::vector<std::string> kWords = {"the",
                                                  "cat",
                                                  "Once",
                                                  "upon",
                                                  "a",
                                                  "time",
                                                  "straightforward",
                                                  "----------------",
                                                  "🦙",
                                                  "日本",
                                                  "café",
                                                  "\u2581",
                                                  "\t",
                                                  "\n",
                                                  "\x01",
                                                  "1234567",
                                                  "ﬁsh",
                                                  "e\u0301",
                                                  " ",
                                                  "   ",
                                                  ".",
                                                  "Lily",
                                                  "addEventListener"};
  std::uniform_int_distribution<size_t> pick(0, kWords.size() - 1);
  std::bernoulli_distribution space(0.7);
  std::string text;
  for (size_t i = 0; i < words; ++i) {
    text += kWords[pick(rng)];
    if (space(rng)) text += ' ';
  }
  return text;
}

// Both tokenizers pass the normalizer probes (LLaMA-2's keeps runs of spaces, stories260K's
// collapses them), so both have a bound, and it never exceeds the tokens.
TEST(Tokenizer, MinTokensIsALowerBoundOnTheTokensOfAText) {
  for (const Tokenizer& tokenizer : {llama2_tokenizer(), stories_tokenizer()}) {
    std::mt19937 rng(7);
    for (int i = 0; i < 300; ++i) {
      const std::string text = random_text(rng, 1 + i % 40);
      const size_t tokens = tokenizer.encode(text, /*add_bos=*/false).size();
      EXPECT_LE(tokenizer.min_tokens(text), tokens) << text;
    }
    const std::string prose(4000, 'x');
    EXPECT_GE(tokenizer.min_tokens(prose), 4000u / 16) << "the bound is in force";
  }
}

// The end encoded alone, from a space after a word, is the end of the whole text's tokens.
TEST(Tokenizer, EncodeLastIsTheEndOfTheWholeEncoding) {
  for (const Tokenizer& tokenizer : {llama2_tokenizer(), stories_tokenizer()}) {
    std::mt19937 rng(11);
    for (int i = 0; i < 60; ++i) {
      const std::string text = random_text(rng, 50 + 20 * i);
      for (const bool bos : {false, true}) {
        const std::vector<int32_t> whole = tokenizer.encode(text, bos);
        for (const size_t keep : {size_t(1), size_t(7), size_t(60), whole.size() + 3}) {
          const std::vector<int32_t> expected(whole.end() - std::min(keep, whole.size()),
                                              whole.end());
          EXPECT_EQ(tokenizer.encode_last(text, bos, keep), expected) << text << " keep " << keep;
        }
      }
    }
  }
}

// A 2 MiB text is never encoded whole: encode_last() answers one it can start near its end from
// there, and refuses one whose last space after a word is far back (or that has none), as it
// does any text past 256 KiB it could only encode whole.
TEST(Tokenizer, EncodeLastOfAHugeTextEncodesOnlyItsEnd) {
  const Tokenizer tokenizer = llama2_tokenizer();
  const std::string words = [] {
    std::string text;
    while (text.size() < (size_t(2) << 20)) text += "Once upon a time there was a cat. ";
    return text + "The end";
  }();
  const std::vector<int32_t> last = tokenizer.encode_last(words, /*add_bos=*/true, 100);
  ASSERT_EQ(last.size(), 100u);
  const std::string tail = words.substr(words.size() - 1000);
  const std::vector<int32_t> tail_tokens = tokenizer.encode(tail.substr(tail.find(' ') + 1), false);
  EXPECT_EQ(last, std::vector<int32_t>(tail_tokens.end() - 100, tail_tokens.end()));

  const std::string one_word(size_t(2) << 20, 'a');
  for (const std::string& text : {one_word, "hello " + one_word, one_word.substr(0, 300000)}) {
    try {
      tokenizer.encode_last(text, /*add_bos=*/true, 100);
      FAIL() << "no exception for " << text.size() << " bytes";
    } catch (const std::invalid_argument& error) {
      EXPECT_NE(std::string(error.what()).find("no space after a word within 256 KiB"),
                std::string::npos)
          << error.what();
    }
  }
  const std::string small = one_word.substr(0, 200000);
  EXPECT_EQ(tokenizer.encode_last(small, /*add_bos=*/true, 100).size(), 100u) << "encoded whole";
}

TEST(Tokenizer, MovedTokenizerStillWorks) {
  Tokenizer first = stories_tokenizer();
  const Tokenizer second(std::move(first));
  EXPECT_EQ(second.decode(second.encode("the cat", false)), "the cat");
}

TEST(Tokenizer, MissingFileThrowsCheckpointErrorNamingIt) {
  const std::string missing = "/nonexistent/dir/tokenizer.model";
  try {
    Tokenizer tokenizer(missing);
    FAIL() << "no exception";
  } catch (const CheckpointError& error) {
    EXPECT_NE(std::string(error.what()).find(missing), std::string::npos) << error.what();
  }
}

TEST(Tokenizer, NonModelFileThrowsCheckpointErrorNamingIt) {
  const auto not_a_model = shared_path("models/stories260K/config.json");
  try {
    Tokenizer tokenizer(not_a_model);
    FAIL() << "no exception";
  } catch (const CheckpointError& error) {
    EXPECT_NE(std::string(error.what()).find(not_a_model.string()), std::string::npos)
        << error.what();
  }
}

}  // namespace
}  // namespace pipeline
