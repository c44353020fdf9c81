// Training a LLaMA-style tokenizer on the shipped corpus (data/tokenizer_corpus.txt), as
// `pipeline make-model` does for synthetic checkpoints.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <iterator>

#include "io/tokenizer.h"
#include "io/tokenizer_trainer.h"
#include "tests/support/shared_data.h"

namespace pipeline {
namespace {

std::filesystem::path corpus() {
  return testing::source_dir() / "data" / "tokenizer_corpus.txt";
}

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

class TokenizerTrainer : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::make_temp_dir("tokenizer-trainer"); }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
};

TEST_F(TokenizerTrainer, Vocab512LoadsAndRoundTrips) {
  const auto model = dir_ / "tokenizer.model";
  const int vocab = train_tokenizer(corpus(), 512, model);
  EXPECT_EQ(vocab, 512);

  const Tokenizer tokenizer(model);
  EXPECT_EQ(tokenizer.vocab_size(), vocab);
  EXPECT_EQ(tokenizer.unk_id(), 0);
  EXPECT_EQ(tokenizer.bos_id(), 1);
  EXPECT_EQ(tokenizer.eos_id(), 2);
  for (int byte = 0; byte < 256; ++byte) EXPECT_EQ(tokenizer.byte_value(3 + byte), byte);

  const std::vector<std::string> texts = {
      "Once upon a time, a little cat found a red ball.",
      "Numbers: 2026 and 3.14159!",
      "Unseen text: 🦙 日本語, café, tabs\tand\nnewlines.",
      "  two  spaces  kept  ",
  };
  for (const auto& text : texts) {
    const auto ids = tokenizer.encode(text, /*add_bos=*/true);
    EXPECT_EQ(tokenizer.decode(ids), text);
    for (size_t i = 1; i < ids.size(); ++i) EXPECT_NE(ids[i], tokenizer.unk_id()) << text;
  }
  // Common words of the corpus become single pieces.
  EXPECT_LT(tokenizer.encode("the little", false).size(), 5u);
}

TEST_F(TokenizerTrainer, DigitsAreSplit) {
  const auto model = dir_ / "tokenizer.model";
  train_tokenizer(corpus(), 512, model);
  const Tokenizer tokenizer(model);
  const auto ids = tokenizer.encode("year 1234567890", false);
  int digit_pieces = 0;
  for (const int32_t id : ids) {
    const std::string piece = tokenizer.piece(id);
    const auto digits = std::count_if(piece.begin(), piece.end(), ::isdigit);
    EXPECT_LE(digits, 1) << "piece '" << piece << "' holds several digits";
    digit_pieces += digits > 0;
  }
  EXPECT_EQ(digit_pieces, 10);
  EXPECT_EQ(tokenizer.decode(ids), "year 1234567890");
}

TEST_F(TokenizerTrainer, SameCorpusGivesTheSameFile) {
  train_tokenizer(corpus(), 512, dir_ / "a.model");
  train_tokenizer(corpus(), 512, dir_ / "b.model");
  const std::string a = read_file(dir_ / "a.model");
  EXPECT_FALSE(a.empty());
  EXPECT_EQ(a, read_file(dir_ / "b.model"));
}

TEST_F(TokenizerTrainer, Vocab4096Trains) {
  const auto model = dir_ / "tokenizer.model";
  const int vocab = train_tokenizer(corpus(), 4096, model);
  EXPECT_GT(vocab, 512);
  EXPECT_LE(vocab, 4096);
  EXPECT_EQ(Tokenizer(model).vocab_size(), vocab);
}

TEST_F(TokenizerTrainer, SmallCorpusGivesFewerPiecesInsteadOfFailing) {
  const auto small = dir_ / "small.txt";
  std::ofstream(small) << "the cat sat on the mat\nthe dog ran to the cat\n";
  const int vocab = train_tokenizer(small, 4096, dir_ / "small.model");
  EXPECT_GT(vocab, 259);  // 3 specials + 256 bytes + the corpus' characters
  EXPECT_LT(vocab, 4096);
  EXPECT_EQ(Tokenizer(dir_ / "small.model").vocab_size(), vocab);
}

TEST_F(TokenizerTrainer, BadArgumentsThrow) {
  EXPECT_THROW(train_tokenizer(corpus(), 0, dir_ / "x.model"), std::invalid_argument);
  try {
    train_tokenizer(dir_ / "missing.txt", 512, dir_ / "x.model");
    FAIL() << "no exception";
  } catch (const std::runtime_error& error) {
    EXPECT_NE(std::string(error.what()).find("missing.txt"), std::string::npos) << error.what();
  }
  // Fewer pieces than the 256 bytes of byte fallback need.
  EXPECT_THROW(train_tokenizer(corpus(), 100, dir_ / "x.model"), std::runtime_error);
  EXPECT_THROW(train_tokenizer(corpus(), 512, dir_ / "no-such-dir" / "x.model"),
               std::runtime_error);
}

}  // namespace
}  // namespace pipeline
