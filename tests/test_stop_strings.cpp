// Stop strings across pushes: nothing of a stop string is ever sent, text that cannot start
// one is sent at once, and the result does not depend on how the text was split.
#include <gtest/gtest.h>

#include <random>

#include "io/stop_strings.h"

namespace pipeline {
namespace {

using Result = StopStringMatcher::Result;

struct Sent {
  std::vector<std::string> chunks;
  bool stopped = false;
};

Sent push_all(StopStringMatcher& matcher, const std::vector<std::string>& pieces) {
  Sent sent;
  for (const auto& piece : pieces) {
    const Result result = matcher.push(piece);
    sent.chunks.push_back(result.text);
    sent.stopped = result.stopped;
  }
  return sent;
}

TEST(StopStrings, NoStopsPassesTextStraightThrough) {
  StopStringMatcher matcher({});
  const Sent sent = push_all(matcher, {"Hello", " wor", "ld"});
  EXPECT_EQ(sent.chunks, (std::vector<std::string>{"Hello", " wor", "ld"}));
  EXPECT_FALSE(sent.stopped);
  EXPECT_EQ(matcher.flush(), "");
}

TEST(StopStrings, StopInsideOnePush) {
  StopStringMatcher matcher({"STOP"});
  const Result result = matcher.push("Hello STOP world");
  EXPECT_EQ(result.text, "Hello ");
  EXPECT_TRUE(result.stopped);
  EXPECT_EQ(result.stop, "STOP");
}

TEST(StopStrings, StopSpanningManyPushesIsNeverSentInPart) {
  StopStringMatcher matcher({"STOP"});
  const Sent sent = push_all(matcher, {"Hel", "lo S", "T", "O", "P more"});
  EXPECT_EQ(sent.chunks, (std::vector<std::string>{"Hel", "lo ", "", "", ""}));
  EXPECT_TRUE(sent.stopped);
}

TEST(StopStrings, HeldTextIsReleasedWhenItStopsLookingLikeAStop) {
  StopStringMatcher matcher({"STOP"});
  const Sent sent = push_all(matcher, {"a S", "T", "AR"});
  EXPECT_EQ(sent.chunks, (std::vector<std::string>{"a ", "", "STAR"}));
  EXPECT_FALSE(sent.stopped);
}

TEST(StopStrings, FlushReturnsTheHeldText) {
  StopStringMatcher matcher({"</s>"});
  EXPECT_EQ(matcher.push("the end</").text, "the end");
  EXPECT_EQ(matcher.flush(), "</");
  EXPECT_EQ(matcher.flush(), "");
}

TEST(StopStrings, EarliestOfSeveralStopsWins) {
  StopStringMatcher matcher({"World", "lo"});
  const Result result = matcher.push("Hello World");
  EXPECT_EQ(result.text, "Hel");
  EXPECT_TRUE(result.stopped);
  EXPECT_EQ(result.stop, "lo");
}

TEST(StopStrings, OverlappingPrefixes) {
  // "abc" could still become "abcd", but "bc" inside it is already a stop.
  StopStringMatcher matcher({"abcd", "bc"});
  EXPECT_EQ(matcher.push("ab").text, "");
  const Result result = matcher.push("c");
  EXPECT_EQ(result.text, "a");
  EXPECT_TRUE(result.stopped);
  EXPECT_EQ(result.stop, "bc");

  // A stop that overlaps itself: "aaab" holds back only the last "aa".
  StopStringMatcher repeated({"aab"});
  const Sent sent = push_all(repeated, {"a", "a", "a", "b"});
  EXPECT_EQ(sent.chunks, (std::vector<std::string>{"", "", "a", ""}));
  EXPECT_TRUE(sent.stopped);
}

TEST(StopStrings, NothingIsSentAfterAStop) {
  StopStringMatcher matcher({"\n\n"});
  EXPECT_EQ(matcher.push("Answer.\n\nQuestion").text, "Answer.");
  const Result later = matcher.push("more text");
  EXPECT_EQ(later.text, "");
  EXPECT_TRUE(later.stopped);
  EXPECT_EQ(later.stop, "");  // named once, by the push that matched it
  EXPECT_EQ(matcher.flush(), "");
}

TEST(StopStrings, MultiByteCharactersAreNeverSplit) {
  StopStringMatcher matcher({"é!"});
  EXPECT_EQ(matcher.push("café").text, "caf");  // "é" may begin "é!"
  EXPECT_EQ(matcher.push("?").text, "é?");

  // A stop string that starts inside a character ("\xA9" is the second byte of "é") cuts
  // before the whole character.
  StopStringMatcher odd({"\xA9"});
  const Result result = odd.push("café au lait");
  EXPECT_EQ(result.text, "caf");
  EXPECT_TRUE(result.stopped);
  StopStringMatcher odd_prefix({"\xA9x"});
  EXPECT_EQ(odd_prefix.push("café").text, "caf");
  EXPECT_EQ(odd_prefix.flush(), "é");
}

// min_tokens' text: no stop string ends in it, but one that begins there ends in a later push,
// and its beginning is held back all the same.
TEST(StopStrings, UnmatchedTextEndsNoStopButMayBeginOne) {
  StopStringMatcher straddled({"STOP"});
  EXPECT_EQ(straddled.push_unmatched("a STOP b ST"), "a STOP b ");
  const Result result = straddled.push("OP c");
  EXPECT_EQ(result.text, "");
  EXPECT_TRUE(result.stopped);

  // "ab" lies wholly in the unmatched text, so only "xabc", which ends past it, can stop.
  StopStringMatcher nested({"ab", "xabc"});
  EXPECT_EQ(nested.push_unmatched("1 xab"), "1 ");
  const Result longer = nested.push("c 2");
  EXPECT_TRUE(longer.stopped);
  EXPECT_EQ(longer.text, "");
  StopStringMatcher missed({"ab", "xabc"});
  EXPECT_EQ(missed.push_unmatched("1 xab"), "1 ");
  const Result after = missed.push("d ab");
  EXPECT_TRUE(after.stopped);
  EXPECT_EQ(after.text, "xabd ");

  StopStringMatcher released({"STOP"});
  EXPECT_EQ(released.push_unmatched("ST"), "");
  EXPECT_EQ(released.push("x").text, "STx");
  EXPECT_EQ(released.flush(), "");
}

// include_stop_str_in_output: the text ends with the stop string, however it was split; of two
// stops that begin at the same place, the shorter (it is whole first in any split) counts.
TEST(StopStrings, KeptStopEndsTheText) {
  StopStringMatcher whole({"STOP"}, /*keep_stop=*/true);
  const Result result = whole.push("Hello STOP world");
  EXPECT_EQ(result.text, "Hello STOP");
  EXPECT_TRUE(result.stopped);
  StopStringMatcher split({"STOP"}, true);
  const Sent sent = push_all(split, {"Hel", "lo S", "T", "O", "P more"});
  EXPECT_EQ(sent.chunks, (std::vector<std::string>{"Hel", "lo ", "", "", "STOP"}));
  StopStringMatcher nested({"abc", "ab"}, true);
  const Result shorter = nested.push("x abc");
  EXPECT_EQ(shorter.text, "x ab");
  EXPECT_EQ(shorter.stop, "ab");
}

TEST(StopStrings, EmptyStopStringIsRejected) {
  EXPECT_THROW(StopStringMatcher({"ok", ""}), std::invalid_argument);
}

// However a text is cut into pushes, what is sent is the text up to the first stop (or all
// of it), everything sent along the way is a prefix of that, and the stop named is the same.
TEST(StopStrings, SplitDoesNotChangeTheResult) {
  const std::vector<std::string> stops = {"User:", "\n\n", "ab"};
  const std::vector<std::string> texts = {"Sure! Here you go.\n\nUser: next",
                                          "no stop here at all",
                                          "Us User U:ser:",
                                          "a a b ab",
                                          "日本語\n日本\n\n語",
                                          "UseUser:"};
  std::mt19937 rng(7);
  for (const std::string& text : texts) {
    size_t first = std::string::npos;
    std::string first_stop;
    for (const auto& stop : stops) {
      const size_t at = text.find(stop);
      if (at < first || (at == first && stop.size() < first_stop.size())) {
        first = at;
        first_stop = stop;
      }
    }
    const std::string expected = text.substr(0, first);
    for (int trial = 0; trial < 200; ++trial) {
      StopStringMatcher matcher(stops);
      std::string sent, stop;
      bool stopped = false;
      for (size_t at = 0; at < text.size() && !stopped;) {
        const size_t length = std::uniform_int_distribution<size_t>(1, 4)(rng);
        const Result result = matcher.push(text.substr(at, length));
        sent += result.text;
        stopped = result.stopped;
        stop = result.stop;
        at += length;
        EXPECT_EQ(expected.compare(0, sent.size(), sent), 0) << "sent text that is not a prefix";
      }
      if (!stopped) sent += matcher.flush();
      EXPECT_EQ(sent, expected) << text;
      EXPECT_EQ(stopped, first != std::string::npos) << text;
      EXPECT_EQ(stop, first_stop) << text;
    }
  }
}

}  // namespace
}  // namespace pipeline
