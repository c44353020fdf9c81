// guided_grammar's GBNF: the syntax (each construct by the texts it lets through, each refusal
// by the place or rule it names), the recognizer (against TextPattern for grammars that are
// regular and against hand-written checks for ones that are not, on every short text over a
// small alphabet), UTF-8, the limits, and GuidedDecoding holding tokens to a grammar.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "io/grammar.h"
#include "io/grammar_prefix.h"
#include "io/model_config.h"
#include "io/text_pattern.h"
#include "io/tokenizer.h"
#include "model/guided_decoding.h"
#include "model/sampling.h"
#include "tests/support/guided_walk.h"
#include "tests/support/llama2_vocabulary.h"
#include "tests/support/stories_tokenizer.h"

namespace pipeline {
namespace {

using testing::config_for;
using testing::GuidedWalk;
using testing::stories_tokenizer;
using testing::walk_with_random_logits;

bool derives(const Grammar& grammar, std::string_view text) {
  GrammarPrefix prefix(grammar);
  return prefix.feed(text) && prefix.complete();
}

bool continues(const Grammar& grammar, std::string_view text) {
  return GrammarPrefix(grammar).feed(text);
}

std::shared_ptr<const Grammar> gbnf(std::string_view text) {
  return Grammar::from_gbnf(text);
}

// Every text over `alphabet`'s characters (UTF-8) up to `longest` characters long.
std::vector<std::string> texts_over(const std::string& alphabet, size_t longest) {
  std::vector<std::string> characters;
  for (const char byte : alphabet) {
    if ((byte & 0xC0) != 0x80) characters.emplace_back();  // not a continuation: a new one
    characters.back() += byte;
  }
  std::vector<std::string> texts{""};
  std::vector<size_t> lengths{0};
  for (size_t from = 0; from < texts.size(); ++from) {
    if (lengths[from] == longest) continue;
    for (const std::string& character : characters) {
      texts.push_back(texts[from] + character);
      lengths.push_back(lengths[from] + 1);
    }
  }
  return texts;
}

// The grammar and `is_prefix`/`is_whole` agree on every text over `alphabet` up to `longest`.
void expect_same_language(const Grammar& grammar, const std::string& alphabet, size_t longest,
                          const std::function<bool(const std::string&)>& is_prefix,
                          const std::function<bool(const std::string&)>& is_whole) {
  for (const std::string& text : texts_over(alphabet, longest)) {
    ASSERT_EQ(continues(grammar, text), is_prefix(text)) << "'" << text << "'";
    ASSERT_EQ(derives(grammar, text), is_whole(text)) << "'" << text << "'";
  }
}

void expect_same_as_regex(const std::string& grammar_text, const std::string& regex,
                          const std::string& alphabet, size_t longest) {
  SCOPED_TRACE(grammar_text);
  const auto grammar = gbnf(grammar_text);
  const auto pattern = TextPattern::from_regex(regex);
  expect_same_language(
      *grammar, alphabet, longest,
      [&](const std::string& text) { return PatternPrefix(*pattern).feed(text); },
      [&](const std::string& text) {
        PatternPrefix prefix(*pattern);
        return prefix.feed(text) && prefix.complete();
      });
}

// r1, r2, ...: rules a test writes by the dozen.
std::string rule_name(int number) {
  std::string name = "r";
  name += std::to_string(number);
  return name;
}

std::string error_of(std::string_view text) {
  try {
    Grammar::from_gbnf(text);
  } catch (const GrammarError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Grammar, EachConstructAcceptsWhatTheSameRegexDoes) {
  // Literals, classes, negation, `.`, groups, alternation and every quantifier, over an alphabet
  // that takes each both ways; every prefix the regex can finish, and no other, is accepted.
  expect_same_as_regex("root ::= \"ab\" | \"b\"", "ab|b", "abc", 4);
  expect_same_as_regex("root ::= [a-b] [^a]", "[a-b][^a]", "abc", 4);
  expect_same_as_regex("root ::= . \"c\"", "[^\\n]c|\\nc", "abc\n", 4);
  expect_same_as_regex("root ::= (\"a\" | \"bc\")* \"c\"", "(a|bc)*c", "abc", 6);
  expect_same_as_regex("root ::= \"a\"+ \"b\"?", "a+b?", "abc", 5);
  expect_same_as_regex("root ::= \"a\"{2} \"b\"{1,3} \"c\"{2,}", "a{2}b{1,3}c{2,}", "abc", 8);
  expect_same_as_regex("root ::= ( \"a\" \"b\"? ){ 0 , 2 }", "(ab?){0,2}", "abc", 6);
  // Repetitions of repetitions, of the empty text, and of what can be empty.
  expect_same_as_regex("root ::= (\"a\"?)* \"b\"", "(a?)*b", "ab", 5);
  expect_same_as_regex("root ::= \"a\"*+ \"b\"", "(a*)+b", "ab", 5);
  expect_same_as_regex("root ::= \"\"* \"a\" ()", "a", "ab", 3);
  // Rules calling rules, last and not.
  expect_same_as_regex("root ::= x \"c\" x\nx ::= \"a\" y\ny ::= \"b\" | \"\"", "ab?cab?", "abc",
                       6);
}

// A character of several bytes narrows the parses to those its first bytes can continue, before
// it is whole. Each parse it keeps must move whole: parses dropped before it must not put the
// ones after it out of step (that read past the parses, and refused "é" after "x"?).
TEST(Grammar, CharactersOfSeveralBytesKeepEveryParseTheyContinue) {
  expect_same_as_regex("root ::= .*.*", ".*.*", "aé€😀", 3);
  expect_same_as_regex("root ::= \"x\"? ( \"é\" | \"ü\" )*", "x?(é|ü)*", "xéüa", 4);
  expect_same_as_regex("root ::= [a-z]* | [é]", "[a-z]*|é", "aéü", 3);
  expect_same_as_regex("root ::= ( \"é\" | \"a\" \"é\"? )* \"€\"?", "(é|aé?)*€?", "aé€", 4);
}

TEST(Grammar, RecursiveGrammarsAcceptExactlyTheirPrefixes) {
  const auto depth_after = [](const std::string& text) {
    int depth = 0;
    for (char c : text) {
      depth += c == '(' ? 1 : -1;
      if (depth < 0) return -1;
    }
    return depth;
  };
  expect_same_language(
      *gbnf("root ::= \"(\" root \")\" root | \"\""), "()", 10,
      [&](const std::string& text) { return depth_after(text) >= 0; },
      [&](const std::string& text) { return depth_after(text) == 0; });
  // a^n b^n, n >= 1: not regular, and the b's must wait for every a.
  const auto split = [](const std::string& text) {
    const size_t as = text.find_first_not_of('a');
    return as == std::string::npos ? std::pair{text.size(), size_t(0)}
                                   : std::pair{as, text.size() - as};
  };
  expect_same_language(
      *gbnf("root ::= \"a\" root \"b\" | \"ab\""), "ab", 10,
      [&](const std::string& text) {
        const auto [as, rest] = split(text);
        return text.find_first_not_of('b', as) == std::string::npos && rest <= as;
      },
      [&](const std::string& text) {
        const auto [as, rest] = split(text);
        return as > 0 && rest == as && text.find_first_not_of('b', as) == std::string::npos;
      });
}

TEST(Grammar, LayoutCommentsAndEscapesAreReadAsLlamaCppReadsThem) {
  const auto grammar = gbnf(
      "# a comment before any rule\n"
      "root ::= greeting # a comment after a rule\n"
      "\n"
      "greeting ::= \"hi\" (\n"
      "    \" there\" |\n"
      "    \"\\n\\t\\\\\\\"\\[\\]\"\n"
      "  ) |\n"
      "  [\\x41\\u00e9\\U0001F600-\\U0001F601]\r\n"
      "unused-rule-2 ::= \"x\"");
  EXPECT_TRUE(derives(*grammar, "hi there"));
  EXPECT_TRUE(derives(*grammar, "hi\n\t\\\"[]"));
  EXPECT_TRUE(derives(*grammar, "A"));
  EXPECT_TRUE(derives(*grammar, "\xC3\xA9"));             // é
  EXPECT_TRUE(derives(*grammar, "\xF0\x9F\x98\x81"));     // 😁
  EXPECT_FALSE(continues(*grammar, "\xF0\x9F\x98\x82"));  // 😂, one past the range
  EXPECT_FALSE(derives(*grammar, "hi"));
  EXPECT_FALSE(continues(*grammar, "x"));
  // Literal UTF-8 in the grammar, and a class whose range edges are literal characters.
  const auto accents = gbnf("root ::= \"caf\xC3\xA9 \" [\xC3\xA0-\xC3\xBF]+");
  EXPECT_TRUE(derives(*accents, "caf\xC3\xA9 \xC3\xA0\xC3\xBF"));
  EXPECT_FALSE(continues(*accents, "caf\xC3\xA9 a"));
  // A '-' at a class's end is itself; ']' and '^' after the first place are too, escaped.
  const auto dashes = gbnf("root ::= [a-] [\\]^]");
  EXPECT_TRUE(derives(*dashes, "-^"));
  EXPECT_TRUE(derives(*dashes, "a]"));
}

TEST(Grammar, AnswersAreValidUtf8Only) {
  const auto any = gbnf("root ::= .*");
  EXPECT_TRUE(derives(*any, "a\n\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80"));
  EXPECT_FALSE(continues(*any, "\x80"));      // a continuation first
  EXPECT_FALSE(continues(*any, "\xC0\x80"));  // overlong
  EXPECT_FALSE(continues(*any, "\xE0\x80"));  // overlong, found at its second byte
  EXPECT_FALSE(continues(*any, "\xED\xA0"));  // a surrogate
  EXPECT_FALSE(continues(*any, "\xF4\x90"));  // past U+10FFFF
  EXPECT_FALSE(continues(*any, "\xF8"));      // no such lead
  EXPECT_FALSE(continues(*any, "\xC3\x41"));  // a character cut short
  EXPECT_TRUE(continues(*any, "\xE2\x82"));   // begun, not whole:
  GrammarPrefix begun(*any);
  ASSERT_TRUE(begun.feed("\xE2\x82"));
  EXPECT_FALSE(begun.complete());  // ...so not an end
  // A negated class holds every code point but its own, and never a surrogate.
  const auto not_a = gbnf("root ::= [^a]");
  EXPECT_TRUE(derives(*not_a, "\xF4\x8F\xBF\xBF"));  // U+10FFFF
  EXPECT_TRUE(derives(*not_a, "\xEE\x80\x80"));      // U+E000
  EXPECT_FALSE(continues(*not_a, "a"));
  // A character's first bytes are refused as soon as no character in the set begins so.
  const auto cjk = gbnf("root ::= [\\u4E00-\\u4E01]");
  EXPECT_TRUE(continues(*cjk, "\xE4\xB8"));
  EXPECT_FALSE(continues(*cjk, "\xE4\xB9"));
  EXPECT_FALSE(continues(*cjk, "\xE5"));
}

TEST(Grammar, RefusesSyntaxErrorsNamingLineAndColumn) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"root ::= \"a\"\n  | \"b\"", "expecting a rule name, not '|' at line 2, column 3"},
      {"root = \"a\"", "expecting ::= after rule root, not '=' at line 1, column 6"},
      {"root ::= \"a\" )", "a ')' closes no group at line 1, column 14"},
      {"root ::= \"a\" ::= \"b\"",
       "expecting a newline or the end of the grammar after rule "
       "root, not ':' at line 1, column 14"},
      {"root ::= <think>", "token references (<...>) are not held"},
      {"root ::= \"abc", "the string opened here is not closed at line 1, column 10"},
      {"root ::= [abc", "the class opened here is not closed at line 1, column 10"},
      {"root ::= (\"a\"\n", "the group opened here is not closed at line 1, column 10"},
      {"root ::= (\"a\" ]", "expecting ')' or more of the group, not ']' at line 1, column 15"},
      {"root ::= []", "an empty class matches no character at line 1, column 10"},
      {"root ::= [^\\x00-\\U0010FFFF]", "the class matches no character at line 1, column 10"},
      {"root ::= [z-a]", "the range runs backwards at line 1, column 11"},
      {"root ::= *", "nothing before '*' to repeat at line 1, column 10"},
      {"root ::= \"a\"{,3}", "expecting a count, not ',' at line 1, column 14"},
      {"root ::= \"a\"{3",
       "expecting ',' or '}' in the repetition, not the end of the grammar "
       "at line 1, column 15"},
      {"root ::= \"a\"{3,2}", "the repetition's most is below its least at line 1, column 13"},
      {"root ::= \"a\"{1001}", "a repetition count may be at most 1000 at line 1, column 14"},
      {"root ::= \"\\q\"", "unknown escape: a backslash before 'q' at line 1, column 11"},
      {"root ::= \"\\x4\"", "\\x needs 2 hexadecimal digits at line 1, column 11"},
      {"root ::= \"\\uD800\"", "the escape names no character at line 1, column 11"},
      {"root ::= \"\\U00110000\"", "the escape names no character at line 1, column 11"},
      {"root ::= \"\xC3\xA9\xFF\"", "the grammar is not valid UTF-8 at line 1, column 12"},
      {"root ::= \"a\"\nroot ::= \"b\"",
       "rule root is defined twice (first at line 1, column 1) at line 2, column 1"},
      {"root ::= \"a\" b\n# b is not here\n",
       "rule b is used but never defined at line 1, "
       "column 14"},
      {"main ::= \"a\"", "the grammar defines no rule root"},
      {"", "the grammar defines no rule root"},
  };
  for (const auto& [text, message] : cases) {
    SCOPED_TRACE(text);
    EXPECT_NE(error_of(text).find(message), std::string::npos) << error_of(text);
  }
  // Nesting: groups or stacked quantifiers past kMaxGrammarNesting.
  EXPECT_NE(error_of("root ::= " + std::string(kMaxGrammarNesting + 1, '(') + "\"a\"" +
                     std::string(kMaxGrammarNesting + 1, ')'))
                .find("may nest at most 200 deep"),
            std::string::npos);
  EXPECT_NE(error_of("root ::= \"a\"" + std::string(kMaxGrammarNesting + 1, '*'))
                .find("may nest at most 200 deep"),
            std::string::npos);
  EXPECT_NO_THROW(gbnf("root ::= \"a\"" + std::string(kMaxGrammarNesting - 2, '*')));
}

TEST(Grammar, RefusesLeftRecursionAndRulesWithoutAnEnd) {
  EXPECT_EQ(error_of("root ::= root \"a\" | \"b\""),
            "rule root is left-recursive: it can come back to itself before writing a character "
            "(root -> root), which would never end");
  // Indirect, and through a rule that can be empty.
  EXPECT_EQ(error_of("root ::= \"x\" expr\nexpr ::= ws term\nterm ::= expr \"+\" | \"1\"\n"
                     "ws ::= \" \"*"),
            "rule expr is left-recursive: it can come back to itself before writing a character "
            "(expr -> term -> expr), which would never end");
  // Recursion after a character is fine; so is one in a rule root never uses... unless it is.
  EXPECT_NO_THROW(gbnf("root ::= \"a\" root | \"\"\nloop ::= loop \"x\""));
  EXPECT_EQ(error_of("root ::= a\na ::= \"x\" a"),
            "rules root, a derive no finite text: each of their ways goes on forever");
  EXPECT_EQ(error_of("root ::= \"x\" | a \"y\"\na ::= \"(\" a \")\""),
            "rule a derives no finite text: each of their ways goes on forever");
  EXPECT_NO_THROW(gbnf("root ::= \"x\"\nunused ::= \"y\" unused"));
  // A grammar whose one text is empty is held: only the end may come.
  const auto empty = gbnf("root ::= \"\"");
  EXPECT_TRUE(derives(*empty, ""));
  EXPECT_FALSE(continues(*empty, "a"));
}

// kMaxTextBytes, kMaxNodes, kMaxDepth, kMaxParses and kMaxSteps, each just past and just within.
TEST(Grammar, LimitsRefuseWhatWouldCostTooMuch) {
  std::string long_text = "root ::= \"" + std::string(Grammar::kMaxTextBytes - 11, 'a') + "\"";
  EXPECT_NO_THROW(gbnf(long_text));
  long_text += " ";
  EXPECT_EQ(error_of(long_text), "the grammar is 65537 bytes; at most 65536 are held");

  EXPECT_NE(error_of("root ::= ((\"ab\"){1000}){100}").find("more than 200000 nodes"),
            std::string::npos);
  EXPECT_NO_THROW(gbnf("root ::= ((\"ab\"){1000}){90}"));

  // Each level of x calls x before its own end, so it keeps a frame: the nesting may go 63 deep
  // (root's frame is the 64th), and a byte that would go deeper is refused, not a dead end.
  const auto nested = gbnf("root ::= x\nx ::= \"[\" x \"]\" | \".\"");
  std::string open(Grammar::kMaxDepth - 1, '[');
  EXPECT_TRUE(continues(*nested, open));
  EXPECT_FALSE(continues(*nested, open + "["));
  EXPECT_TRUE(derives(*nested, open + "." + std::string(open.size(), ']')));
  // A grammar whose shortest text needs more than kMaxDepth calls open is refused.
  std::string chain = "root ::= r1 \"x\"\n";
  for (int i = 1; i <= int(Grammar::kMaxDepth); ++i) {
    chain += rule_name(i);
    chain += " ::= ";
    chain += rule_name(i + 1);
    chain += " \"x\"\n";
  }
  chain += rule_name(int(Grammar::kMaxDepth) + 1);
  chain += " ::= \"y\"\n";
  EXPECT_EQ(error_of(chain), "root's shortest text needs more than 64 rule calls open at once");

  // Each "a" doubles the ways the b's and c's to come can end: past 64 parses feed() refuses
  // with an error rather than keep them all.
  const auto ambiguous = gbnf("root ::= s\ns ::= \"a\" (s \"b\" | s \"c\") | \"d\"");
  EXPECT_TRUE(continues(*ambiguous, "aaaaa"));  // 32 stacks of frames, each at "a" or "d"
  EXPECT_THROW(continues(*ambiguous, "aaaaaa"), GrammarError);
  try {
    continues(*ambiguous, "aaaaaa");
  } catch (const GrammarError& e) {
    EXPECT_EQ(std::string(e.what()),
              "the grammar is too ambiguous to follow: the text so far has more than 64 parses "
              "that go on apart");
  }

  // Rules nesting ways to write nothing: following "x" walks every way to "y", each call a
  // frame of its own; 8^6 of them pass kMaxSteps, 8^3 do not.
  const auto nothing_in_ways = [](int levels) {
    std::string text = "root ::= \"x\" r1 \"y\"\n";
    for (int level = 1; level < levels; ++level) {
      text += rule_name(level);
      text += " ::=";
      for (int i = 0; i < 8; ++i) {
        text += ' ';
        text += rule_name(level + 1);
      }
      text += "\n";
    }
    text += rule_name(levels);
    text += " ::= \"\"\n";
    return gbnf(text);
  };
  EXPECT_TRUE(derives(*nothing_in_ways(4), "xy"));
  try {
    continues(*nothing_in_ways(7), "x");
    ADD_FAILURE() << "no error";
  } catch (const GrammarError& e) {
    EXPECT_EQ(std::string(e.what()),
              "the grammar is too complex to follow: one character takes more than 100000 steps");
  }
  // A step that threw leaves nothing behind for the next one on the thread, of any grammar.
  const auto list = gbnf("root ::= ([a-z ] | [a-z ] [a-z ])* \".\"");
  for (int again = 0; again < 3; ++again) {
    EXPECT_THROW(continues(*nothing_in_ways(7), "x"), GrammarError);
    EXPECT_TRUE(derives(*list, "once upon a time."));
    EXPECT_FALSE(continues(*list, "once. upon"));
  }
}

// A JSON-like grammar (objects, arrays, strings, numbers) on texts JSON mode would write.
// Ways that part and meet again, r0 ::= (r1 | r1) "z"? nested 20 deep: each call of r1 returns
// to the same place, so r1 is followed once per character, not once per way (2^20 ways passed
// kMaxSteps, and 2^11 took 40 ms a token to mask).
TEST(Grammar, WaysThatPartAndMeetAgainAreFollowedOnce) {
  constexpr int kLevels = 20;
  std::string text = "root ::= r0 r0\n";
  for (int level = 0; level < kLevels; ++level)
    text += rule_name(level) + " ::= (" + rule_name(level + 1) + " | " + rule_name(level + 1) +
            ") \"z\"?\n";
  text += rule_name(kLevels) + " ::= [a-y]\n";
  const auto grammar = gbnf(text);
  EXPECT_TRUE(derives(*grammar, "ab"));
  EXPECT_TRUE(continues(*grammar, "az"));  // a "z" of any of the 20 levels
  EXPECT_FALSE(continues(*grammar, "abc"));
  EXPECT_FALSE(derives(*grammar, "a"));
}

TEST(Grammar, AJsonGrammarFollowsJsonTexts) {
  const auto json = gbnf(R"(root ::= object
value ::= object | array | string | number | ("true" | "false" | "null") ws
object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}" ws
array ::= "[" ws ( value ("," ws value)* )? "]" ws
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}) )* "\"" ws
number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9]{1,15})? ws
ws ::= | " " | "\n" [ \t]{0,20}
)");
  EXPECT_TRUE(derives(*json, "{}"));
  EXPECT_TRUE(derives(*json, R"({"a": [1, -2.5e3, "x\"\u00e9", {"b": null}], "c": true} )"));
  EXPECT_TRUE(derives(*json, "{\n  \"deep\": [[[[[[[[[[1]]]]]]]]]]}"));
  EXPECT_FALSE(continues(*json, "{\"a\" 1"));
  EXPECT_FALSE(continues(*json, "[1]"));
  EXPECT_FALSE(continues(*json, "{\"a\": 01"));
  EXPECT_FALSE(continues(*json, "{\"a\":\x01"));
  EXPECT_TRUE(continues(*json, "{\"a\": [1, {\"b\": \"\xE2\x82"));
}

// Along random walks over stories260K's vocabulary, the mask keeps exactly the tokens allows()
// takes, each written text stays a prefix, and an ended answer is one the grammar derives.
TEST(Grammar, GuidedDecodingMasksExactlyTheTokensThatContinueTheGrammar) {
  const Tokenizer& tokenizer = stories_tokenizer();
  const LlamaConfig config = config_for(tokenizer);
  const GuidedVocabulary vocabulary(tokenizer, config);
  const std::vector<std::shared_ptr<const Grammar>> grammars = {
      gbnf("root ::= item (\", \" item)* \".\"\nitem ::= [a-z]+ | \"(\" item \")\""),
      gbnf("root ::= \"Once upon a \" (\"time\" | \"tree\") [.!]"),
      gbnf("root ::= (\"Lily\" | \"Tom\") \" \" verb \" \" [0-9]{1,2}\n"
           "verb ::= \"saw\" | \"had\" | \"was\""),
  };
  size_t states = 0;
  for (const auto& grammar : grammars) {
    for (uint32_t seed = 1; seed <= 6; ++seed) {
      std::mt19937 rng(seed);
      GuidedDecoding guide(vocabulary, grammar);
      std::string written;
      for (int step = 0; step < 40; ++step) {
        SCOPED_TRACE("seed " + std::to_string(seed) + " after '" + written + "'");
        std::vector<float> logits(size_t(config.vocab_size), 0.0f);
        const size_t allowed = guide.mask(logits);
        std::vector<int32_t> choices;
        for (int32_t token = 0; token < config.vocab_size; ++token) {
          ASSERT_EQ(std::isinf(logits[size_t(token)]), !guide.allows(token)) << token;
          if (!guide.allows(token)) continue;
          choices.push_back(token);
          if (token != tokenizer.eos_id()) {
            ASSERT_TRUE(continues(*grammar, written + vocabulary.text(token))) << token;
          }
        }
        ASSERT_EQ(allowed, choices.size());
        ASSERT_FALSE(choices.empty());
        ++states;
        const int32_t token = choices[rng() % choices.size()];
        if (token == tokenizer.eos_id()) {
          EXPECT_TRUE(derives(*grammar, written));
          break;
        }
        guide.advance(token);
        written += vocabulary.text(token);
      }
      EXPECT_TRUE(continues(*grammar, written));
    }
  }
  EXPECT_GT(states, 100u);
  EXPECT_EQ(GuidedDecoding(vocabulary, grammars[0]).held_to(),
            "the text guided_grammar (or grammar) allows");
}

// Whatever the logits, a sampler held to a grammar writes only its prefixes and, given room,
// ends with a text it derives.
TEST(Grammar, ASamplerHeldToAGrammarEndsOnlyWithAText) {
  const Tokenizer& tokenizer = stories_tokenizer();
  const GuidedVocabulary vocabulary(tokenizer, config_for(tokenizer));
  const auto grammar = gbnf("root ::= [0-9]{3} \"-\" word\nword ::= [a-z]{2,5}");
  std::mt19937 rng(7);
  for (int run = 0; run < 8; ++run) {
    const GuidedWalk walk =
        walk_with_random_logits(vocabulary, GuidedDecoding(vocabulary, grammar), run, rng, 20,
                                [&](const std::string& text) { return continues(*grammar, text); });
    EXPECT_TRUE(walk.ended) << walk.written;
    EXPECT_TRUE(derives(*grammar, walk.written)) << walk.written;
  }
}

}  // namespace
}  // namespace pipeline
