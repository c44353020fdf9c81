// Incremental detokenization: token by token, the text must add up to what sentencepiece
// decodes from the whole id list, and no push may end inside a UTF-8 character.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "io/incremental_decoder.h"
#include "io/utf8.h"
#include "tests/support/shared_data.h"

namespace pipeline {
namespace {

using testing::shared_path;

Tokenizer llama2_tokenizer() {
  return Tokenizer(shared_path("models/llama2-tokenizer/tokenizer.model"));
}
Tokenizer stories_tokenizer() {
  return Tokenizer(shared_path("models/stories260K/tokenizer.model"));
}

// The id of a piece, found by scanning the vocabulary.
int32_t piece_id(const Tokenizer& tokenizer, const std::string& piece) {
  for (int32_t id = 0; id < tokenizer.vocab_size(); ++id)
    if (tokenizer.piece(id) == piece) return id;
  throw std::runtime_error("no piece " + piece);
}

bool is_continuation_byte(char c) {
  return (static_cast<unsigned char>(c) & 0xC0) == 0x80;
}

// Pushes every id, then flushes; checks that no chunk starts inside a character (so the one
// before it did not end inside one) and returns the chunks.
std::vector<std::string> decode_incrementally(const Tokenizer& tokenizer,
                                              const std::vector<int32_t>& ids) {
  IncrementalDecoder decoder(tokenizer);
  std::vector<std::string> chunks;
  for (const int32_t id : ids) chunks.push_back(decoder.push(id));
  chunks.push_back(decoder.flush());
  for (const std::string& chunk : chunks)
    EXPECT_TRUE(chunk.empty() || !is_continuation_byte(chunk.front()))
        << "a chunk starts inside a UTF-8 character";
  return chunks;
}

std::string joined(const std::vector<std::string>& chunks) {
  std::string text;
  for (const auto& chunk : chunks) text += chunk;
  return text;
}

void expect_same_as_whole_decode(const Tokenizer& tokenizer, const std::vector<int32_t>& ids) {
  SCOPED_TRACE(::testing::PrintToString(ids));
  EXPECT_EQ(joined(decode_incrementally(tokenizer, ids)), tokenizer.decode(ids));
}

TEST(IncrementalDecoder, Llama2GoldenStringsTokenByToken) {
  std::ifstream in(shared_path("golden/llama2_tokenizer.json"));
  const auto golden = nlohmann::json::parse(in);
  const Tokenizer tokenizer(shared_path(golden["tokenizer"].get<std::string>()));
  for (const auto& c : golden["cases"]) {
    SCOPED_TRACE(c["text"].get<std::string>());
    auto ids = c["ids"].get<std::vector<int32_t>>();
    const auto decoded = c["decoded"].get<std::string>();
    EXPECT_EQ(joined(decode_incrementally(tokenizer, ids)), decoded);
    // As a model emits them: after BOS, ending with EOS.
    ids.insert(ids.begin(), tokenizer.bos_id());
    ids.push_back(tokenizer.eos_id());
    EXPECT_EQ(joined(decode_incrementally(tokenizer, ids)), decoded);
  }
}

TEST(IncrementalDecoder, BytePiecesWaitForAWholeCharacter) {
  const Tokenizer tokenizer = llama2_tokenizer();
  // "▁em" "o" "ji" "▁" then 🦙 as four byte pieces, then 🚀, then "▁end".
  const std::vector<int32_t> ids = {953, 29877, 2397, 29871, 243, 162, 169,
                                    156, 243,   162,  157,   131, 1095};
  const auto chunks = decode_incrementally(tokenizer, ids);
  const std::vector<std::string> expected = {"em",   "o", "ji", " ", "",  "",     "",
                                             "🦙", "",  "",   "",  "🚀", " end", ""};
  EXPECT_EQ(chunks, expected);
}

TEST(IncrementalDecoder, LeadingSpaceOfTheFirstPieceOnly) {
  const Tokenizer tokenizer = llama2_tokenizer();
  // "▁Hello" "▁world": the first "▁" is dropped, the second is a space.
  EXPECT_EQ(decode_incrementally(tokenizer, {15043, 3186}),
            (std::vector<std::string>{"Hello", " world", ""}));
  // "▁" "▁leading": sentencepiece drops only the first "▁".
  EXPECT_EQ(joined(decode_incrementally(tokenizer, {29871, 8236})), " leading");
  expect_same_as_whole_decode(tokenizer, {1, 1, 29871, 29871, 8236});
  expect_same_as_whole_decode(tokenizer, {2, 15043, 1, 15043});
}

// After a prompt with text the first piece keeps its space: the pushes are what the ids add to
// the prompt's text, so prompt + completion reads as the whole sequence decoded. After a BOS
// alone, the first piece starts the text.
TEST(IncrementalDecoder, AfterAPromptTheFirstSpaceStays) {
  for (const Tokenizer& tokenizer : {llama2_tokenizer(), stories_tokenizer()}) {
    for (const auto& [prompt, continuation] :
         std::vector<std::pair<std::string, std::string>>{{"Lily wanted to", " go on a trip."},
                                                          {"Once upon a time", ", there was"},
                                                          {"The cat", " said: \"héllo 🙂\""},
                                                          {"", "Once upon a time"}}) {
      const std::vector<int32_t> prompt_ids = tokenizer.encode(prompt, true);
      const std::vector<int32_t> all = tokenizer.encode(prompt + continuation, true);
      ASSERT_EQ(std::vector<int32_t>(all.begin(), all.begin() + prompt_ids.size()), prompt_ids)
          << prompt;
      IncrementalDecoder decoder(tokenizer, prompt_ids);
      std::string text;
      for (size_t i = prompt_ids.size(); i < all.size(); ++i) text += decoder.push(all[i]);
      text += decoder.flush();
      EXPECT_EQ(text, continuation);
      EXPECT_EQ(tokenizer.decode(prompt_ids) + text, tokenizer.decode(all));
    }
  }
}

// A prompt of no text may still end in a lone "▁", whose strip sentencepiece has spent: the
// answer's first piece keeps its space, as the whole sequence decodes it.
TEST(IncrementalDecoder, AfterAPromptOfNoTextTheAnswerIsWhatTheWholeDecodeAdds) {
  const Tokenizer tokenizer = llama2_tokenizer();
  const int32_t the = piece_id(tokenizer, "\u2581the");
  for (const std::vector<int32_t>& prompt :
       {std::vector<int32_t>{29871}, {1, 29871}, {1}, {1, 1}, {29871, 29871}}) {
    SCOPED_TRACE(::testing::PrintToString(prompt));
    IncrementalDecoder decoder(tokenizer, prompt);
    std::string text = decoder.push(the);
    text += decoder.push(the);
    text += decoder.flush();
    std::vector<int32_t> all = prompt;
    all.insert(all.end(), {the, the});
    EXPECT_EQ(tokenizer.decode(prompt) + text, tokenizer.decode(all));
  }
  IncrementalDecoder after_space(tokenizer, std::vector<int32_t>{29871});
  EXPECT_EQ(after_space.push(the), " the");
}

TEST(IncrementalDecoder, InvalidBytesBecomeReplacementCharactersAsInSentencepiece) {
  const Tokenizer tokenizer = llama2_tokenizer();
  const auto byte = [](int value) { return int32_t(3 + value); };
  const std::vector<std::vector<int32_t>> cases = {
      {byte(0xF0), 1095},                                // truncated before a piece
      {byte(0xF0), byte(0x9F)},                          // truncated at the end (flush)
      {byte(0xC0), byte(0xAF)},                          // overlong
      {byte(0xE0), byte(0x80), byte(0x80)},              // overlong
      {byte(0xED), byte(0xA0), byte(0x80)},              // surrogate
      {byte(0xF4), byte(0x90), byte(0x80), byte(0x80)},  // above U+10FFFF
      {byte(0xEF), byte(0xBF), byte(0xBD)},              // a real U+FFFD
      {byte(0x80), byte(0x41), byte(0xFF)},              // stray continuation, 'A', invalid
      {byte(0xE6), byte(0x97), 15043, byte(0xA5)},       // a character cut by a piece
      {byte(0x41), 29871, 8236},                         // text before the first "▁" piece
  };
  for (const auto& ids : cases) expect_same_as_whole_decode(tokenizer, ids);
  EXPECT_EQ(joined(decode_incrementally(tokenizer, {byte(0xF0), byte(0x9F)})), "\uFFFD\uFFFD");
}

TEST(IncrementalDecoder, FlushReturnsAnUnfinishedCharacterAsReplacement) {
  const Tokenizer tokenizer = llama2_tokenizer();
  IncrementalDecoder decoder(tokenizer);
  EXPECT_EQ(decoder.push(15043), "Hello");
  EXPECT_EQ(decoder.push(3 + 0xE6), "");
  EXPECT_EQ(decoder.flush(), "\uFFFD");
  EXPECT_EQ(decoder.flush(), "");
}

TEST(IncrementalDecoder, UnknownTokenDecodesAsSentencepieceSpellsIt) {
  const Tokenizer tokenizer = llama2_tokenizer();
  expect_same_as_whole_decode(tokenizer, {0, 15043});
  expect_same_as_whole_decode(tokenizer, {15043, 0, 3186});
}

TEST(IncrementalDecoder, Stories260KTextRoundTrip) {
  const Tokenizer tokenizer = stories_tokenizer();
  const std::string text =
      "Once upon a time, Tom saw a big 🦙 in the park.\nHe said: \"日本!\" and ran café-ward.";
  expect_same_as_whole_decode(tokenizer, tokenizer.encode(text, /*add_bos=*/true));
  // Its normalizer drops every leading "▁" (remove_extra_whitespaces), not only the first.
  const int32_t space = piece_id(tokenizer, "\u2581");
  const int32_t t = piece_id(tokenizer, "\u2581t");
  EXPECT_EQ(joined(decode_incrementally(tokenizer, {space, space, t})), "t");
  expect_same_as_whole_decode(tokenizer, {space, space, t});
  expect_same_as_whole_decode(tokenizer, {1, space, 1, space, t, space});
}

// Random id sequences mixing byte pieces (often forming broken UTF-8), control tokens,
// <unk>, "▁" and ordinary pieces, compared with sentencepiece's whole-sequence decode.
void fuzz_against_whole_decode(const Tokenizer& tokenizer, int sequences) {
  std::mt19937 rng(1234);
  const int32_t space = piece_id(tokenizer, "\u2581");
  std::uniform_int_distribution<int> kind(0, 9), length(1, 12), byte(0, 255);
  std::uniform_int_distribution<int32_t> any_piece(259, tokenizer.vocab_size() - 1);
  const int utf8_leads[] = {0xC3, 0xE6, 0xF0, 0xED, 0xF4};
  for (int s = 0; s < sequences; ++s) {
    std::vector<int32_t> ids;
    const int n = length(rng);
    for (int i = 0; i < n; ++i) {
      switch (kind(rng)) {
        case 0:
          ids.push_back(int32_t(kind(rng) % 3));
          break;  // <unk>, <s>, </s>
        case 1:
          ids.push_back(space);
          break;
        case 2:
          ids.push_back(3 + utf8_leads[byte(rng) % 5]);
          break;
        case 3:
        case 4:
          ids.push_back(3 + 0x80 + byte(rng) % 64);
          break;  // continuation bytes
        case 5:
          ids.push_back(3 + byte(rng));
          break;
        default:
          ids.push_back(any_piece(rng));
          break;
      }
    }
    expect_same_as_whole_decode(tokenizer, ids);
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(IncrementalDecoder, RandomSequencesMatchWholeDecodeStories260K) {
  fuzz_against_whole_decode(stories_tokenizer(), 3000);
}

TEST(IncrementalDecoder, RandomSequencesMatchWholeDecodeLlama2) {
  fuzz_against_whole_decode(llama2_tokenizer(), 3000);
}

TEST(IncrementalDecoder, PaddingIdsBeyondTheTokenizerAddNoText) {
  const Tokenizer tokenizer = stories_tokenizer();
  IncrementalDecoder decoder(tokenizer);
  const std::vector<int32_t> ids = tokenizer.encode("Once upon a time", false);
  std::string text;
  for (int32_t id : ids) {
    text += decoder.push(id);
    text += decoder.push(512);  // a padded embedding row
  }
  text += decoder.flush();
  EXPECT_EQ(text, tokenizer.decode(ids));
}

// A padding id inside a run of byte pieces ends it, as a control token does: the bytes on
// either side of it never form one character.
TEST(IncrementalDecoder, APaddingIdEndsARunOfBytePieces) {
  const Tokenizer tokenizer = llama2_tokenizer();
  const auto byte = [](int value) { return int32_t(3 + value); };
  const std::string replacement(kReplacementCharacter);
  for (const int32_t between : {2, 32000}) {  // </s>, then a padded embedding row
    IncrementalDecoder decoder(tokenizer);
    std::string text = decoder.push(byte(0xE6));
    text += decoder.push(byte(0x97));
    text += decoder.push(between);
    text += decoder.push(byte(0xA5));
    text += decoder.flush();
    EXPECT_EQ(text, replacement + replacement + replacement) << between;
  }
}

// text_offset: each piece starts where the decoded text has come to, in characters. A piece of
// no text ends an unfinished character, so bytes after it start characters of their own.
TEST(CharacterOffsets, APieceOfNoTextEndsAnUnfinishedCharacter) {
  CharacterOffsets offsets;
  std::vector<size_t> starts;
  for (std::string_view piece : {"Hi", "\xE6", "\x97", "", "\xA5", " x"})
    starts.push_back(offsets.add(piece));
  // "Hi", then U+FFFD three times (E6 and 97 cut off by the empty piece, A5 alone), then " x".
  EXPECT_EQ(starts, (std::vector<size_t>{0, 2, 3, 4, 4, 5}));
  // Whole characters across pieces count where they start.
  CharacterOffsets whole(10);
  std::vector<size_t> whole_starts;
  for (std::string_view piece : {"\xE6", "\x97", "\xA5", "a"})
    whole_starts.push_back(whole.add(piece));
  EXPECT_EQ(whole_starts, (std::vector<size_t>{10, 11, 11, 11}));
}

TEST(IncrementalDecoder, NegativeIdThrows) {
  const Tokenizer tokenizer = stories_tokenizer();
  IncrementalDecoder decoder(tokenizer);
  EXPECT_THROW(decoder.push(-1), std::out_of_range);
}

}  // namespace
}  // namespace pipeline
