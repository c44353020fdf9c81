// guided_regex and guided_choice: the regex syntax, the automaton TextPattern compiles it to
// (against std::regex on every short text over a small alphabet, and against every Unicode code
// point for its classes), and GuidedDecoding holding a sampler's tokens to it.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "io/model_config.h"
#include "io/text_pattern.h"
#include "io/tokenizer.h"
#include "model/guided_decoding.h"
#include "model/sampling.h"
#include "tests/support/guided_walk.h"
#include "tests/support/llama2_vocabulary.h"

namespace pipeline {
namespace {

using testing::config_for;
using testing::GuidedWalk;
using testing::llama2_tokenizer;
using testing::walk_with_random_logits;

bool matches(const TextPattern& pattern, std::string_view text) {
  PatternPrefix prefix(pattern);
  return prefix.feed(text) && prefix.complete();
}

bool continues(const TextPattern& pattern, std::string_view text) {
  return PatternPrefix(pattern).feed(text);
}

// Every state the automaton keeps can still reach an accepted text: a model held to it never
// writes itself into a corner.
void expect_every_state_can_finish(const TextPattern& pattern) {
  const int states = pattern.states();
  std::vector<std::vector<int32_t>> sources(static_cast<size_t>(states));
  for (int32_t state = 0; state < states; ++state)
    for (int byte = 0; byte < 256; ++byte)
      if (const int32_t to = pattern.next(state, uint8_t(byte)); to != TextPattern::kNoState)
        sources[size_t(to)].push_back(state);
  std::vector<bool> finishes(static_cast<size_t>(states));
  std::vector<int32_t> stack;
  for (int32_t state = 0; state < states; ++state)
    if (pattern.accepts(state)) {
      finishes[size_t(state)] = true;
      stack.push_back(state);
    }
  while (!stack.empty()) {
    const int32_t state = stack.back();
    stack.pop_back();
    for (int32_t from : sources[size_t(state)])
      if (!finishes[size_t(from)]) {
        finishes[size_t(from)] = true;
        stack.push_back(from);
      }
  }
  for (int32_t state = 0; state < states; ++state)
    EXPECT_TRUE(finishes[size_t(state)]) << "state " << state << " of " << states;
}

// Every text of up to `length` characters from `alphabet`.
std::vector<std::string> all_texts(const std::string& alphabet, int length) {
  std::vector<std::string> texts{""};
  for (size_t begin = 0; begin < texts.size(); ++begin) {
    if (int(texts[begin].size()) == length) continue;
    for (char c : alphabet) texts.push_back(texts[begin] + c);
  }
  return texts;
}

// Patterns whose meaning std::regex (ECMAScript) shares with Python's re on these texts: the
// automaton accepts exactly the texts std::regex matches whole, and refuses a prefix only when
// no text continues it into a match.
TEST(TextPattern, AcceptsWhatStdRegexMatchesWhole) {
  const std::vector<std::string> texts = all_texts("ab1-_ \n", 5);
  for (const char* source :
       {"a",        "a|b",     "(ab)*c?",    "[a-c]{2,3}",    "a{0,2}b+", "[^ab]",
        "\\d-\\w+", ".*",      "a.b",        "(a|ab)(1|b1-)", "[a-]+",    "(?:a|)b?",
        "(a)(b)*",  "\\s*\\S", "a{2}|b{1,}", "[-\\w]{1,3}",   "(a*)*b",   "[^\\d\\s]*1",
        "a+?b*?",   "^a*$",    "\\-\\."}) {
    SCOPED_TRACE(source);
    const auto pattern = TextPattern::from_regex(source);
    expect_every_state_can_finish(*pattern);
    const std::regex reference(source, std::regex::ECMAScript);
    for (const std::string& text : texts) {
      const bool expected = std::regex_match(text, reference);
      ASSERT_EQ(matches(*pattern, text), expected) << "text '" << text << "'";
      if (!expected) continue;
      for (size_t cut = 0; cut <= text.size(); ++cut)
        ASSERT_TRUE(continues(*pattern, text.substr(0, cut))) << "'" << text << "' cut " << cut;
    }
  }
}

// A UTF-8 encoding, for the tests' own code points.
std::string utf8(uint32_t code) {
  std::string out;
  if (code < 0x80) {
    out += char(code);
  } else if (code < 0x800) {
    out += char(0xC0 | (code >> 6));
    out += char(0x80 | (code & 0x3F));
  } else if (code < 0x10000) {
    out += char(0xE0 | (code >> 12));
    out += char(0x80 | ((code >> 6) & 0x3F));
    out += char(0x80 | (code & 0x3F));
  } else {
    out += char(0xF0 | (code >> 18));
    out += char(0x80 | ((code >> 12) & 0x3F));
    out += char(0x80 | ((code >> 6) & 0x3F));
    out += char(0x80 | (code & 0x3F));
  }
  return out;
}

// Classes hold code points, whatever their encoding's length: checked for every code point.
TEST(TextPattern, ClassesHoldEveryCodePointInTheirRangesAndNoOther) {
  struct Case {
    const char* source;
    bool (*holds)(uint32_t);
  };
  const Case cases[] = {
      {".", [](uint32_t c) { return c != '\n'; }},
      {"[^a\\n]", [](uint32_t c) { return c != 'a' && c != '\n'; }},
      {"[\\u00e9-\\u4e00\\U0001F600-\\U0001F64Fz]",
       [](uint32_t c) {
         return (c >= 0xE9 && c <= 0x4E00) || (c >= 0x1F600 && c <= 0x1F64F) || c == 'z';
       }},
      {"[\\x7f-\\u0800\\uffff-\\U00010000\\U0010ffff]",
       [](uint32_t c) {
         return (c >= 0x7F && c <= 0x800) || (c >= 0xFFFF && c <= 0x10000) || c == 0x10FFFF;
       }},
      {"\\W", [](uint32_t c) { return c >= 0x80 || (!std::isalnum(int(c)) && c != '_'); }},
  };
  for (const Case& test : cases) {
    SCOPED_TRACE(test.source);
    const auto pattern = TextPattern::from_regex(test.source);
    expect_every_state_can_finish(*pattern);
    for (uint32_t code = 0; code <= 0x10FFFF; ++code) {
      if (code >= 0xD800 && code <= 0xDFFF) continue;
      ASSERT_EQ(matches(*pattern, utf8(code)), test.holds(code)) << "U+" << std::hex << code;
    }
  }
}

// A pattern's automaton is over bytes but admits only UTF-8: no surrogate, overlong or
// out-of-range encoding, no stray continuation byte; a character cut short is a prefix only.
TEST(TextPattern, AnyCharacterMeansValidUtf8Only) {
  const auto any = TextPattern::from_regex(".*");
  for (const char* bad : {"\xED\xA0\x80", "\xC0\xAF", "\xE0\x80\x80", "\xF4\x90\x80\x80", "\x80",
                          "\xF8\x88\x80\x80\x80", "\xFF"})
    EXPECT_FALSE(continues(*any, bad)) << bad;
  EXPECT_TRUE(continues(*any, "caf\xC3"));
  EXPECT_FALSE(matches(*any, "caf\xC3"));
  EXPECT_TRUE(matches(*any, "caf\xC3\xA9 \xF0\x9F\x98\x80"));
  EXPECT_TRUE(matches(*TextPattern::from_regex("caf\\é"), "caf\xC3\xA9"));
}

// Python's quirks: a brace that begins no quantifier is a literal, {,m} is one, a leading ^ and
// a trailing $ say nothing (the whole answer is matched), a ] first in a class is a member.
TEST(TextPattern, BracesAnchorsAndClassEdgesAreReadAsPythonReadsThem) {
  EXPECT_TRUE(matches(*TextPattern::from_regex("a{"), "a{"));
  EXPECT_TRUE(matches(*TextPattern::from_regex("{x}"), "{x}"));
  const auto up_to_two = TextPattern::from_regex("x{,2}");
  EXPECT_TRUE(matches(*up_to_two, ""));
  EXPECT_TRUE(matches(*up_to_two, "xx"));
  EXPECT_FALSE(continues(*up_to_two, "xxx"));
  EXPECT_TRUE(matches(*TextPattern::from_regex("^ab$"), "ab"));
  EXPECT_TRUE(matches(*TextPattern::from_regex("[]]"), "]"));
  EXPECT_TRUE(matches(*TextPattern::from_regex("[^]]"), "a"));
  EXPECT_TRUE(matches(*TextPattern::from_regex("[a-]"), "-"));
  EXPECT_TRUE(matches(*TextPattern::from_regex("(?P<x>a)(?<y>b)*"), "abb"));
  EXPECT_TRUE(matches(*TextPattern::from_regex("(?P<é_1>a)"), "a"));
  // {,} is *; a brace pair with nothing in it is text.
  const auto any_x = TextPattern::from_regex("x{,}");
  EXPECT_TRUE(matches(*any_x, ""));
  EXPECT_TRUE(matches(*any_x, "xxx"));
  EXPECT_FALSE(continues(*any_x, "x{"));
  EXPECT_TRUE(matches(*TextPattern::from_regex("x{}"), "x{}"));
  // Octal escapes: \0 and up to two more digits, three octal digits, any octal digit in a class.
  EXPECT_TRUE(matches(*TextPattern::from_regex("\\07"), "\a"));
  EXPECT_TRUE(matches(*TextPattern::from_regex("\\0"), std::string(1, '\0')));
  EXPECT_TRUE(matches(*TextPattern::from_regex("\\x41\\101"), "AA"));
  EXPECT_TRUE(matches(*TextPattern::from_regex("[\\1-\\3]"), "\x02"));
  EXPECT_TRUE(matches(*TextPattern::from_regex("[\\d-]"), "-"));
  EXPECT_TRUE(
      matches(*TextPattern::from_regex("\\x41\\u00e9\\t\\0"), std::string("A\xC3\xA9\t\0", 5)));
}

// What no automaton holds, and what is not a pattern, is refused naming the offset.
TEST(TextPattern, RefusesWhatItCannotHoldNamingWhere) {
  const struct {
    std::string source;
    const char* message;
  } cases[] = {
      {"(ab", "the group opened here is not closed at position 0"},
      {"ab)", "a ')' closes no group at position 2"},
      {"*a", "nothing to repeat at position 0"},
      {"a|+", "nothing to repeat at position 2"},
      {"a**", "multiple repeat (possessive quantifiers are not supported) at position 2"},
      {"(a)\\1", "backreferences are not supported at position 3"},
      {"a(?=b)", "lookarounds"},
      {"(?i)a", "inline flags"},
      {"a{3,2}", "minimum exceeds its maximum at position 1"},
      {"[b-a]", "runs backwards at position 1"},
      {"[a", "the class opened here is not closed at position 0"},
      {"\\q", "unknown escape \\q at position 0"},
      {"a\\b", "the anchor \\b is not supported"},
      {"a^b", "'^' is held only at the start"},
      {"a$b", "'$' is held only at the end"},
      {"a{1001}", "at most 1000 at position 2"},
      {"\\x4", "\\x needs 2 hexadecimal digits at position 0"},
      {"\\ud800", "names no character"},
      {"[^\\s\\S]", "matches no text"},
      {"(a|b)*a(a|b){16}", "more than 20000 automaton states"},
      {"((a{1000}){1000})", "more than 200000 automaton states"},
      {"(.?){1000}", "too complex: building its automaton takes more than 10 million steps"},
      {"\xC3(", "not valid UTF-8 at position 0"},
      {"中中(a", "the group opened here is not closed at position 2"},
      {"(?P<1>a)", "a group name must be an identifier"},
      {"(?P<n>a)(?P<n>b)", "redefinition of group name 'n' at position 8"},
      {"[\\d-z]", "a class range must begin at one character at position 1"},
      {"a{2}+", "possessive quantifiers are not supported"},
      {"\\18", "backreferences are not supported at position 0"},
      {"\\477", "an octal escape must be at most \\377"},
      {"[\\8]", "unknown escape \\8 at position 1"},
      {std::string(65537, 'a'), "the pattern is 65537 bytes; at most 65536 are held"},
      {std::string(201, '(') + "a" + std::string(201, ')'),
       "groups may nest at most 200 deep at position 200"},
  };
  for (const auto& test : cases) {
    SCOPED_TRACE(test.source);
    try {
      TextPattern::from_regex(test.source);
      ADD_FAILURE() << "accepted";
    } catch (const TextPatternError& e) {
      EXPECT_NE(std::string(e.what()).find(test.message), std::string::npos) << e.what();
    }
  }
}

// guided_choice: exactly one of the texts, a choice that begins another may end or go on, and
// the empty text is a choice like any other.
TEST(TextPattern, ChoicesAreExactlyTheirTexts) {
  const std::vector<std::string> texts = {"yes", "no", "not sure", "", "caf\xC3\xA9"};
  const auto pattern = TextPattern::from_choices(texts);
  expect_every_state_can_finish(*pattern);
  for (const std::string& text : texts) EXPECT_TRUE(matches(*pattern, text)) << text;
  EXPECT_TRUE(matches(*pattern, "no"));
  EXPECT_TRUE(continues(*pattern, "not"));
  EXPECT_FALSE(matches(*pattern, "not"));
  EXPECT_FALSE(continues(*pattern, "yess"));
  EXPECT_FALSE(continues(*pattern, "Yes"));
  EXPECT_FALSE(continues(*pattern, "caf\xC3\xA8"));
  // Regex syntax in a choice is text.
  EXPECT_TRUE(matches(*TextPattern::from_choices(std::vector<std::string>{"a.*"}), "a.*"));
  EXPECT_FALSE(continues(*TextPattern::from_choices(std::vector<std::string>{"a.*"}), "ab"));
  EXPECT_THROW(TextPattern::from_choices({}), TextPatternError);
  EXPECT_THROW(TextPattern::from_choices(std::vector<std::string>(2, std::string(32769, 'a'))),
               TextPatternError);
  EXPECT_THROW(TextPattern::from_choices(std::vector<std::string>{"ok", "\xE0\x80"}),
               TextPatternError);
}

// Along random walks over the real LLaMA-2 vocabulary, the mask keeps exactly the tokens
// allows() takes, and an answer that is whole and can go no further allows only the end.
TEST(TextPattern, GuidedDecodingMasksExactlyTheTokensThatContinueThePattern) {
  const Tokenizer& tokenizer = llama2_tokenizer();
  const LlamaConfig config = config_for(tokenizer);
  const GuidedVocabulary vocabulary(tokenizer, config);
  const std::vector<std::shared_ptr<const TextPattern>> patterns = {
      TextPattern::from_regex("\\d{1,3}(\\.\\d+)? [a-zé]+( [A-Z][a-z]*){0,3}\\n?"),
      TextPattern::from_regex("(Once|Lily) upon a (time|tree)[.!]"),
      TextPattern::from_choices(std::vector<std::string>{"positive", "negative", "neutral"}),
  };
  size_t states = 0;
  for (const auto& pattern : patterns) {
    for (uint32_t seed = 1; seed <= 6; ++seed) {
      std::mt19937 rng(seed);
      GuidedDecoding guide(vocabulary, pattern);
      std::string written;
      for (int step = 0; step < 40; ++step) {
        SCOPED_TRACE("seed " + std::to_string(seed) + " after '" + written + "'");
        std::vector<float> logits(size_t(config.vocab_size), 0.0f);
        const size_t allowed = guide.mask(logits);
        std::vector<int32_t> choices;
        for (int32_t token = 0; token < config.vocab_size; ++token) {
          ASSERT_EQ(std::isinf(logits[size_t(token)]), !guide.allows(token)) << token;
          if (guide.allows(token)) choices.push_back(token);
        }
        ASSERT_EQ(allowed, choices.size());
        ASSERT_FALSE(choices.empty());
        ++states;
        const int32_t token = choices[rng() % choices.size()];
        if (token == tokenizer.eos_id()) {
          EXPECT_TRUE(matches(*pattern, written));
          break;
        }
        guide.advance(token);
        written += vocabulary.text(token);
      }
      EXPECT_TRUE(continues(*pattern, written));
    }
  }
  EXPECT_GT(states, 100u);
  // "neutral", written a token at a time (each the longest that fits), leaves only the end.
  GuidedDecoding chosen(vocabulary, patterns[2]);
  for (std::string left = "neutral"; !left.empty();) {
    int32_t longest = -1;
    for (int32_t token : vocabulary.sorted_tokens()) {
      const std::string& text = vocabulary.text(token);
      if (left.starts_with(text) && (longest < 0 || text.size() > vocabulary.text(longest).size()))
        longest = token;
    }
    ASSERT_GE(longest, 0) << left;
    chosen.advance(longest);
    left.erase(0, vocabulary.text(longest).size());
  }
  std::vector<float> logits(size_t(config.vocab_size), 0.0f);
  EXPECT_EQ(chosen.mask(logits), 1u);
  EXPECT_TRUE(std::isfinite(logits[size_t(tokenizer.eos_id())]));
}

// Whatever the logits, a sampler held to a pattern writes only its prefixes and ends with a
// text it accepts.
TEST(TextPattern, ASamplerHeldToAPatternEndsOnlyWithAMatch) {
  const Tokenizer& tokenizer = llama2_tokenizer();
  const GuidedVocabulary vocabulary(tokenizer, config_for(tokenizer));
  const auto pattern = TextPattern::from_regex("[0-9]{3}-[a-z]{2,5}");
  std::mt19937 rng(7);
  for (int run = 0; run < 8; ++run) {
    const GuidedWalk walk =
        walk_with_random_logits(vocabulary, GuidedDecoding(vocabulary, pattern), run, rng, 20,
                                [&](const std::string& text) { return continues(*pattern, text); });
    EXPECT_TRUE(walk.ended) << walk.written;
    EXPECT_TRUE(std::regex_match(walk.written, std::regex("[0-9]{3}-[a-z]{2,5}"))) << walk.written;
  }
}

// A guide may refuse the argmax and then masks the row, so a guided draw needs the whole row even
// when it is greedy (the runner is not asked for the argmax alone).
TEST(TextPattern, AGuidedGreedyDrawNeedsTheWholeRow) {
  const Tokenizer& tokenizer = llama2_tokenizer();
  const GuidedVocabulary vocabulary(tokenizer, config_for(tokenizer));
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  EXPECT_TRUE(Sampler(greedy, 0).draws_argmax());
  EXPECT_FALSE(Sampler(greedy, 0, GuidedDecoding(vocabulary, TextPattern::from_regex("[0-9]+")))
                   .draws_argmax());
}

}  // namespace
}  // namespace pipeline
