// JSON mode for response_format json_object: JsonPrefix held to any object by SchemaPrefix
// (bytes), GuidedDecoding (tokens) and the Sampler drawing under it. test_json_schema.cpp has
// schemas.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <stdexcept>
#include <string>
#include <vector>

#include "io/json_prefix.h"
#include "io/json_schema.h"
#include "io/model_config.h"
#include "io/schema_prefix.h"
#include "io/tokenizer.h"
#include "model/guided_decoding.h"
#include "model/sampling.h"
#include "tests/support/llama2_vocabulary.h"
#include "tests/support/schema_prefix_checks.h"
#include "tests/support/stories_tokenizer.h"

namespace pipeline {
namespace {

using testing::config_for;
using testing::llama2_tokenizer;

using nlohmann::json;

// What response_format json_object follows: any JSON object.
SchemaPrefix object_prefix() {
  return SchemaPrefix(*JsonSchema::any_object());
}
GuidedDecoding object_mode(const GuidedVocabulary& vocabulary) {
  return GuidedDecoding(vocabulary, JsonSchema::any_object());
}

using testing::Fed;

// How many leading bytes of `text` JSON-object mode accepts, and whether it is then complete.
Fed feed_all(const std::string& text) {
  return testing::feed_all(*JsonSchema::any_object(), text);
}

// nlohmann refuses a number beyond a double's range (1E9938), which RFC 8259 allows and JSON
// mode may write: exponents are cut to their first two digits (in strings too, which stay
// strings: a unicode escape's four hex digits are never cut).
bool strict_parser_reads_an_object(const std::string& text) {
  static const std::regex kLongExponent("([0-9][eE][+-]?[0-9]{2})[0-9]+");
  const std::string capped = std::regex_replace(text, kLongExponent, "$1");
  const json value = json::parse(capped, nullptr, /*allow_exceptions=*/false);
  return value.is_object();
}

// Finishes an accepted prefix into an object. Every state takes one of these bytes (a quote, a
// closing bracket, a digit, a literal's letters, the escapes' and UTF-8's continuations), and
// they lead out of every string and container.
std::string finish(const std::string& prefix_text) {
  static const std::string kTries = std::string("\"}]:0ruelsaDC\\u") + "\x80\x90\xA0{";
  return testing::finish(*JsonSchema::any_object(), prefix_text, kTries);
}

const std::vector<std::string> kObjects = {
    "{}",
    "{\"a\":1}",
    "{\"a\": [1, -2.5e+3, 0.0, 0, -0, 1E9, 3e-2, true, false, null, \"\"], \"b\": {\"c\": {}}}",
    "{\n  \"name\": \"Lily\",\n  \"age\": 3,\n  \"pets\": [\n    {\"kind\": \"dog\"}\n  ]\n}",
    "{\"escapes\": \"\\\" \\\\ \\/ \\b \\f \\n \\r \\t \\u00e9 \\uD83D\\uDE00 \\ud7ff \\ue000\"}",
    "{\"utf8\": \"é 中 😀 \x7F\", \"empty\": [], \"nested\": [[[]], {}]}",
};

TEST(JsonObjectMode, AcceptsEveryPrefixOfAnObjectAndIsCompleteOnlyAtItsEnd) {
  for (const std::string& object : kObjects) {
    SCOPED_TRACE(object);
    ASSERT_TRUE(strict_parser_reads_an_object(object));
    SchemaPrefix prefix = object_prefix();
    for (size_t i = 0; i < object.size(); ++i) {
      EXPECT_FALSE(prefix.complete()) << "complete after " << i << " bytes";
      ASSERT_TRUE(prefix.feed(uint8_t(object[i]))) << "refused byte " << i;
    }
    EXPECT_TRUE(prefix.complete());
    EXPECT_FALSE(SchemaPrefix(prefix).feed(uint8_t(' '))) << "nothing may follow the object";
    EXPECT_FALSE(SchemaPrefix(prefix).feed(uint8_t('{')));
  }
}

// Each prefix is accepted, and the text after it is refused at its first byte.
TEST(JsonObjectMode, RefusesTheFirstByteNoObjectCanContinueWith) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "["},            // an object, not any value
      {"", "\"a\""},        //
      {"", "1"},            //
      {"", " {"},           // the value comes first: no whitespace before it
      {"", "\n{"},          //
      {"{}", " "},          // nor after it
      {"{", ","},           //
      {"{", "1"},           // keys are strings
      {"{\"a\"", "}"},      // a key needs its value
      {"{\"a\" ", "1"},     //
      {"{\"a\":", "}"},     //
      {"{\"a\":1", "\""},   //
      {"{\"a\":1,", "}"},   // no trailing comma
      {"{\"a\":[1,", "]"},  //
      {"{\"a\":[1", "}"},   // brackets close in order
      {"{\"a\":{\"b\":1", "]"},
      {"{\"a\":0", "1"},        // no leading zeros
      {"{\"a\":-", "a"},        //
      {"{\"a\":1.", "e"},       // digits after the point
      {"{\"a\":1e", "}"},       //
      {"{\"a\":1e+", "+"},      //
      {"{\"a\":", "+1"},        //
      {"{\"a\":", ".5"},        //
      {"{\"a\":tr", "i"},       //
      {"{\"a\":nul", "k"},      //
      {"{\"a\":\"", "\n"},      // no raw controls in strings
      {"{\"a\":\"", "\t"},      //
      {"{\"a\":\"\\", "x"},     // no unknown escapes
      {"{\"a\":\"\\u12", "g"},  //
  };
  for (const auto& [prefix_text, rest] : cases) {
    SCOPED_TRACE(json(prefix_text + " | " + rest).dump());
    const std::string whole = prefix_text + rest;
    EXPECT_EQ(feed_all(whole).accepted, prefix_text.size());
  }
}

TEST(JsonObjectMode, RefusesIllFormedUtf8AndUnpairedSurrogates) {
  const std::string open = "{\"a\":\"";
  const std::vector<std::pair<std::string, size_t>> cases = {
      {"\x80", 0},              // a continuation byte first
      {"\xC0\x80", 0},          // overlong lead bytes
      {"\xC1\xBF", 0},          //
      {"\xE0\x9F\xBF", 1},      // overlong three-byte form
      {"\xED\xA0\x80", 1},      // an encoded surrogate
      {"\xF0\x8F\xBF\xBF", 1},  // overlong four-byte form
      {"\xF4\x90\x80\x80", 1},  // beyond U+10FFFF
      {"\xF5\x80", 0},          //
      {"\xC3"
       "A",
       1},                    // a character cut short
      {"\\uDC00", 3},         // a low surrogate alone
      {"\\uD800x", 6},        // a high surrogate with no low one
      {"\\uD800\\u0041", 8},  // ... or something else after it
      {"\\uDBFF\\uDBFF", 9},  //
  };
  for (const auto& [bytes, good] : cases) {
    SCOPED_TRACE(json::binary(std::vector<uint8_t>(bytes.begin(), bytes.end())).dump());
    EXPECT_EQ(feed_all(open + bytes).accepted, open.size() + good);
  }
  EXPECT_TRUE(feed_all("{\"a\":\"\\uDBFF\\uDFFF\"}").complete);
}

TEST(JsonObjectMode, LimitsNestingAndWhitespaceRuns) {
  std::string deep = "{\"a\":";
  for (int depth = 1; depth < JsonPrefix::kMaxDepth; ++depth) deep += "[";
  EXPECT_EQ(feed_all(deep).accepted, deep.size());
  EXPECT_EQ(feed_all(deep + "[").accepted, deep.size());
  EXPECT_EQ(feed_all(deep + "{").accepted, deep.size());
  EXPECT_EQ(feed_all(deep + "1").accepted, deep.size() + 1);

  const std::string indent = "\n" + std::string(JsonPrefix::kMaxIndent, ' ');
  EXPECT_TRUE(feed_all("{" + indent + "\"a\" :" + indent + "1\n}").complete);
  EXPECT_EQ(feed_all("{" + indent + " ").accepted, indent.size() + 1);
  EXPECT_TRUE(feed_all("{\n\t\t}").complete);
  EXPECT_EQ(feed_all("{  ").accepted, 2u);  // one space, or a newline and an indent
  EXPECT_EQ(feed_all("{ \n").accepted, 2u);
  EXPECT_EQ(feed_all("{\n\n").accepted, 2u);
  EXPECT_EQ(feed_all("{\t").accepted, 1u);
  EXPECT_EQ(feed_all("{\r\n").accepted, 1u);
}

// Whether each run of whitespace in `text` (strings' included) is one JSON mode may write.
bool whitespace_runs_fit(const std::string& text) {
  static const std::regex kRun("[ \t\n\r]+");
  static const std::regex kAllowed(" |\n[ \t]{0," + std::to_string(JsonPrefix::kMaxIndent) + "}");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), kRun); it != std::sregex_iterator();
       ++it)
    if (!std::regex_match(it->str(), kAllowed)) return false;
  return true;
}

// A byte-level fuzz against a strict parser. Objects are mutated a byte at a time (replaced,
// inserted or deleted); for each mutant, the longest prefix object mode accepts must be finishable
// into an object the parser reads, and (whitespace aside) a mutant object mode accepts whole and
// complete must be one the parser reads, and the other way round.
TEST(JsonObjectMode, AgreesWithAStrictParserOnMutatedObjects) {
  const std::string kBytes = std::string("{}[]\":,.-+eE0129tfnulrsa \n\\/bu dDcC8A") +
                             "\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x98\x80\x80\xED\xA0\x01";
  std::mt19937 rng(7);
  int agreed_objects = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string text = kObjects[rng() % kObjects.size()];
    for (int edits = 1 + int(rng() % 3); edits > 0; --edits) {
      const size_t at = rng() % (text.size() + 1);
      const char byte = kBytes[rng() % kBytes.size()];
      switch (rng() % 3) {
        case 0:
          if (at < text.size()) text[at] = byte;
          break;
        case 1:
          text.insert(text.begin() + long(at), byte);
          break;
        default:
          if (at < text.size()) text.erase(at, 1);
      }
    }
    SCOPED_TRACE(json(text).dump(-1, ' ', false, json::error_handler_t::replace));
    const Fed fed = feed_all(text);
    const std::string accepted = text.substr(0, fed.accepted);
    const std::string finished = finish(accepted);
    ASSERT_TRUE(strict_parser_reads_an_object(finished)) << json(finished).dump();
    // The parser takes any whitespace, and whitespace around the object, which JSON mode does
    // not write.
    const bool outer_space = !text.empty() && (std::isspace(uint8_t(text.front())) ||
                                               std::isspace(uint8_t(text.back())));
    if (outer_space || !whitespace_runs_fit(text)) continue;
    const bool whole = fed.accepted == text.size() && fed.complete;
    ASSERT_EQ(whole, strict_parser_reads_an_object(text));
    agreed_objects += whole;
  }
  EXPECT_GT(agreed_objects, 1000);  // the mutants were not all broken
}

// ---- Tokens

// The token whose own text is the one byte `byte`.
int32_t token_of_byte(const Tokenizer& tokenizer, char byte) {
  for (int32_t token = 0; token < tokenizer.vocab_size(); ++token)
    if (tokenizer.token_text(token) == std::string(1, byte)) return token;
  throw std::invalid_argument("no token writes " + std::string(1, byte));
}

// `text` as a model may write it in JSON mode: sentencepiece encodes it with a space before it,
// in its first piece, which JSON mode refuses; here that piece's other bytes come a token each.
std::vector<int32_t> answer_tokens(const Tokenizer& tokenizer, const std::string& text) {
  std::vector<int32_t> ids = tokenizer.encode(text, false);
  const std::string first = tokenizer.token_text(ids.front());
  if (first.empty() || first.front() != ' ') throw std::logic_error("no leading space: " + first);
  std::vector<int32_t> answer;
  for (char byte : first.substr(1)) answer.push_back(token_of_byte(tokenizer, byte));
  answer.insert(answer.end(), ids.begin() + 1, ids.end());
  return answer;
}

// The mask keeps exactly the tokens allows() takes, one by one, in states along an object.
TEST(JsonMode, TheMaskKeepsExactlyTheTokensAllowed) {
  const Tokenizer& tokenizer = llama2_tokenizer();
  const LlamaConfig config = config_for(tokenizer);
  const GuidedVocabulary vocabulary(tokenizer, config);
  const std::string object = "{\"name\": \"Lily é\", \"age\": 3.5, \"tags\": [true, null]}";
  GuidedDecoding mode = object_mode(vocabulary);
  // The answer begins with its value: the first piece sentencepiece makes of the object, with
  // its leading space, is refused.
  EXPECT_FALSE(mode.allows(tokenizer.encode(object, false).front()));
  const std::vector<int32_t> ids = answer_tokens(tokenizer, object);
  std::string written;
  for (size_t step = 0; step <= ids.size(); ++step) {
    SCOPED_TRACE("after " + json(written).dump());
    std::vector<float> logits(size_t(config.vocab_size), 0.0f);
    const size_t allowed = mode.mask(logits);
    size_t expected = 0;
    for (int32_t token = 0; token < config.vocab_size; ++token) {
      const bool allows = mode.allows(token);
      expected += allows;
      ASSERT_EQ(std::isinf(logits[size_t(token)]), !allows) << "token " << token;
    }
    EXPECT_EQ(allowed, expected);
    EXPECT_GT(allowed, 0u);
    EXPECT_EQ(mode.allows(tokenizer.eos_id()), step == ids.size());
    if (step == ids.size()) break;
    const int32_t token = ids[step];
    ASSERT_TRUE(mode.allows(token)) << "token " << token << " " << tokenizer.token_text(token);
    mode.advance(token);
    written += tokenizer.token_text(token);
  }
  EXPECT_TRUE(strict_parser_reads_an_object(written));
  EXPECT_THROW(mode.advance(ids.front()), std::invalid_argument);
  EXPECT_FALSE(mode.allows(tokenizer.bos_id()));
  EXPECT_FALSE(mode.allows(tokenizer.unk_id()));
}

// The same along random walks that stop at every kind of boundary (half the steps take a
// one-byte token: byte pieces split UTF-8 characters, escapes and \u digits), on a model whose
// vocabulary has padding rows beyond the tokenizer's: for any object, and for a schema whose
// keys, enum and string length limit which tokens fit.
TEST(JsonMode, TheMaskAgreesWithAllowsAlongRandomWalks) {
  const Tokenizer& tokenizer = llama2_tokenizer();
  LlamaConfig config = config_for(tokenizer);
  config.vocab_size += 8;
  const GuidedVocabulary vocabulary(tokenizer, config);
  const auto person = JsonSchema::compile(nlohmann::ordered_json::parse(R"({
      "type": "object",
      "properties": {"name": {"type": "string", "maxLength": 6},
                     "mood": {"enum": ["happy", "hungry", "sad", 42]},
                     "friends": {"type": "array", "items": {"$ref": "#"}, "maxItems": 2}},
      "required": ["name", "mood"]})"));
  size_t states = 0;
  for (const auto& schema : {JsonSchema::any_object(), person}) {
    for (uint32_t seed = 1; seed <= 12; ++seed) {
      std::mt19937 rng(seed);
      GuidedDecoding mode(vocabulary, schema);
      std::string written;
      for (int step = 0; step < 60; ++step) {
        SCOPED_TRACE("seed " + std::to_string(seed) + " after " +
                     json(written).dump(-1, ' ', false, json::error_handler_t::replace));
        std::vector<float> logits(static_cast<size_t>(config.vocab_size), 0.0f);
        const size_t allowed = mode.mask(logits);
        std::vector<int32_t> choices, short_choices;
        for (int32_t token = 0; token < config.vocab_size; ++token) {
          const bool allows = mode.allows(token);
          ASSERT_EQ(std::isinf(logits[size_t(token)]), !allows) << "token " << token;
          if (!allows) continue;
          choices.push_back(token);
          if (vocabulary.text(token).size() == 1) short_choices.push_back(token);
        }
        ASSERT_EQ(allowed, choices.size());
        ASSERT_FALSE(choices.empty());
        ++states;
        const auto& pool = !short_choices.empty() && rng() % 2 ? short_choices : choices;
        const int32_t token = pool[rng() % pool.size()];
        if (token == tokenizer.eos_id()) break;
        mode.advance(token);
        written += vocabulary.text(token);
      }
      EXPECT_TRUE(SchemaPrefix(*schema).feed(written));
    }
  }
  EXPECT_GT(states, 600u);
}

// Logits the size of the model's vocabulary, random: far more likely to pick a token JSON mode
// refuses than one it allows.
std::vector<float> random_logits(std::mt19937& rng, int vocab) {
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> logits(static_cast<size_t>(vocab));
  for (float& x : logits) x = normal(rng);
  return logits;
}

// Whatever the logits, a sampler in JSON mode writes an object's prefix, ends only when the
// object is complete, and reports the model's own logprobs.
TEST(JsonMode, ASamplerDrawsOnlyTokensThatContinueTheObject) {
  const Tokenizer& tokenizer = llama2_tokenizer();
  const LlamaConfig config = config_for(tokenizer);
  const GuidedVocabulary vocabulary(tokenizer, config);
  std::mt19937 rng(3);
  int completed = 0;
  for (int run = 0; run < 12; ++run) {
    SamplingParams params;
    params.temperature = run % 3 == 0 ? 0.0f : 1.0f;
    params.top_p = run % 3 == 2 ? 0.9f : 1.0f;
    params.logprobs = true;
    Sampler sampler(params, uint64_t(run), object_mode(vocabulary));
    std::string written;
    std::vector<int32_t> history = {tokenizer.bos_id()};
    std::vector<float> logits = random_logits(rng, config.vocab_size);
    for (int step = 0; step < 400; ++step) {
      // The end-of-sequence token is the likeliest, so an object ends as soon as it may.
      logits[size_t(tokenizer.eos_id())] = 1e3f;
      // A few quotes and closing brackets likely too, so objects close now and then.
      for (const char* piece : {"\"", "}", "]", ":", ","})
        logits[size_t(tokenizer.encode(piece, false).back())] += 12.0f;
      const SampledToken sampled = sampler.sample(logits, history);
      history.push_back(sampled.token);
      if (sampled.token == tokenizer.eos_id()) {
        EXPECT_TRUE(strict_parser_reads_an_object(written)) << written;
        ++completed;
        break;
      }
      written += tokenizer.token_text(sampled.token);
      const Fed fed = feed_all(written);
      ASSERT_EQ(fed.accepted, written.size()) << json(written).dump();
      // The logprob is the model's, not the masked distribution's.
      ASSERT_NEAR(sampled.logprob, score_token(logits, sampled.token, 0).logprob, 1e-4);
      logits = random_logits(rng, config.vocab_size);
    }
  }
  EXPECT_GE(completed, 6);
}

// Greedy in JSON mode takes the likeliest token that JSON mode allows.
TEST(JsonMode, GreedyTakesTheLikeliestAllowedToken) {
  const Tokenizer& tokenizer = testing::stories_tokenizer();
  const LlamaConfig config = config_for(tokenizer);
  const GuidedVocabulary vocabulary(tokenizer, config);
  std::mt19937 rng(5);
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  Sampler sampler(greedy, 1, object_mode(vocabulary));
  GuidedDecoding shadow = object_mode(vocabulary);
  std::vector<int32_t> history;
  for (int step = 0; step < 100; ++step) {
    const std::vector<float> logits = random_logits(rng, config.vocab_size);
    int32_t best = -1;
    for (int32_t token = 0; token < config.vocab_size; ++token)
      if (shadow.allows(token) && (best < 0 || logits[size_t(token)] > logits[size_t(best)]))
        best = token;
    ASSERT_GE(best, 0);
    const int32_t token = sampler.sample(logits, history).token;
    ASSERT_EQ(token, best) << "step " << step;
    if (tokenizer.eos_id() == token) break;
    shadow.advance(token);
    history.push_back(token);
  }
}

// A plain draw (no top-k, top-p or min-p) in JSON mode follows the softmax of the allowed
// tokens alone, both when the first, unmasked draw is allowed and when it is drawn again.
TEST(JsonMode, APlainDrawFollowsTheMaskedDistribution) {
  const Tokenizer& tokenizer = testing::stories_tokenizer();
  const LlamaConfig config = config_for(tokenizer);
  const GuidedVocabulary vocabulary(tokenizer, config);
  GuidedDecoding after_colon =
      object_mode(vocabulary);  // a value comes next: a minority of tokens fits
  for (int32_t token : answer_tokens(tokenizer, "{\"a\":")) after_colon.advance(token);
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.5f);
  std::vector<float> logits(static_cast<size_t>(config.vocab_size));
  for (float& x : logits) x = normal(rng);
  std::vector<float> masked = logits;
  GuidedDecoding(after_colon).mask(masked);
  // The allowed tokens made likelier, so that a fair share of first draws is kept.
  for (size_t t = 0; t < masked.size(); ++t)
    if (!std::isinf(masked[t])) masked[t] = logits[t] += 2.0f;
  std::vector<double> expected(masked.size());
  double total = 0.0, allowed_mass = 0.0, all_mass = 0.0;
  for (size_t t = 0; t < masked.size(); ++t) {
    expected[t] = std::exp(double(masked[t]));
    total += expected[t];
    all_mass += std::exp(double(logits[t]));
  }
  for (double& p : expected) p /= total;
  allowed_mass = total / all_mass;
  // Both paths matter: a fair share of first draws is kept, and a fair share drawn again.
  ASSERT_GT(allowed_mass, 0.2);
  ASSERT_LT(allowed_mass, 0.8);

  constexpr int kDraws = 20000;
  std::vector<int> counts(masked.size(), 0);
  for (int i = 0; i < kDraws; ++i) {
    SamplingParams params;
    params.seed = uint64_t(i);
    Sampler sampler(params, 0, after_colon);
    ++counts[size_t(sampler.sample(logits, {}).token)];
  }
  for (size_t t = 0; t < masked.size(); ++t) {
    if (std::isinf(masked[t])) {
      ASSERT_EQ(counts[t], 0) << "refused token " << t << " drawn";
    } else {
      EXPECT_NEAR(counts[t] / double(kDraws), expected[t], 0.01) << "token " << t;
    }
  }
}

// A draw where every token JSON mode allows has a logit of -inf fails with a clear error.
TEST(JsonMode, NothingAllowedToDrawIsAnError) {
  const Tokenizer& tokenizer = testing::stories_tokenizer();
  LlamaConfig config = config_for(tokenizer);
  const GuidedVocabulary vocabulary(tokenizer, config);
  Sampler sampler(SamplingParams{}, 1, object_mode(vocabulary));
  std::vector<float> logits(size_t(config.vocab_size), 0.0f);
  GuidedDecoding fresh = object_mode(vocabulary);
  for (int32_t token = 0; token < config.vocab_size; ++token)
    if (fresh.allows(token)) logits[size_t(token)] = -INFINITY;
  try {
    sampler.sample(logits, {});
    FAIL() << "expected an error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("response_format"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace pipeline
