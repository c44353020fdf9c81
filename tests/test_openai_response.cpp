// OpenAI's responses without a network (server/openai_response.h): chunks and whole answers in
// OpenAI's shape and member order, usage, logprobs and their text offsets, echo.
#include "server/openai_response.h"

#include <gtest/gtest.h>

#include <limits>
#include <map>

#include "tests/support/openai_bodies.h"

namespace pipeline {
namespace {

using namespace testing;  // pipeline::testing: the bodies and their parsing

// Names alternatives as "<id>". Built with append: GCC 12 warns falsely on "<" + std::string.
std::string token_text(int32_t token) {
  std::string text = "<";
  text.append(std::to_string(token)).append(">");
  return text;
}

ParsedRequest parsed_from(Endpoint endpoint, const json& body) {
  return parse_openai_request(endpoint, body, served_model());
}

// The endings of a call with one choice.
// A usage object: prompt and completion tokens, their total, and the prompt's cached ones.
json usage_json(int prompt, int completion, int cached = 0) {
  return {{"prompt_tokens", prompt},
          {"completion_tokens", completion},
          {"total_tokens", prompt + completion},
          {"prompt_tokens_details", {{"cached_tokens", cached}}}};
}

std::vector<Completion> one(Completion completion) {
  return {completion};
}

Delta delta(std::string text, std::vector<TokenOutput> tokens = {}) {
  return Delta{std::move(text), std::move(tokens), {}, true, {}};
}

TEST(Responses, ChatStreamChunksHaveOpenAIsShape) {
  const ParsedRequest parsed =
      parsed_from(Endpoint::ChatCompletions, with(chat_body(), "stream", true));
  const auto& request = parsed.request;
  ResponseBuilder builder(parsed, "stories260K", token_text);

  const json role = builder.role_chunk();
  EXPECT_EQ(role["id"], request->id);
  EXPECT_EQ(role["object"], "chat.completion.chunk");
  EXPECT_TRUE(role["created"].is_number_integer());
  EXPECT_GT(role["created"].get<int64_t>(), 1700000000);
  EXPECT_EQ(role["model"], "stories260K");
  EXPECT_FALSE(role.contains("usage"));
  ASSERT_EQ(role["choices"].size(), 1u);
  EXPECT_EQ(role["choices"][0]["index"], 0);
  EXPECT_EQ(role["choices"][0]["delta"], json({{"role", "assistant"}, {"content", ""}}));
  EXPECT_TRUE(role["choices"][0]["finish_reason"].is_null());

  const json chunk = builder.delta_chunk(delta("Once"));
  EXPECT_EQ(chunk["id"], request->id);
  EXPECT_EQ(chunk["choices"][0]["delta"], json({{"content", "Once"}}));
  EXPECT_TRUE(chunk["choices"][0]["logprobs"].is_null());
  EXPECT_TRUE(chunk["choices"][0]["finish_reason"].is_null());
  EXPECT_FALSE(chunk["choices"][0].contains("stop_reason"));  // vLLM's: in the last chunk only

  const json last = builder.finish_chunk({FinishReason::Length});
  EXPECT_EQ(last["choices"][0]["delta"], json::object());
  EXPECT_EQ(last["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(last["choices"][0].at("stop_reason").is_null());
  Completion stopped{FinishReason::Stop};
  stopped.stop_reason = std::string("The end");
  EXPECT_EQ(builder.finish_chunk(stopped)["choices"][0]["stop_reason"], "The end");
}

TEST(Responses, IncludeUsageAddsAFinalChunkWithEmptyChoices) {
  json body = with(chat_body(), "stream", true);
  body["stream_options"] = {{"include_usage", true}};
  const ParsedRequest parsed = parsed_from(Endpoint::ChatCompletions, body);
  ResponseBuilder builder(parsed, "stories260K", token_text);
  EXPECT_TRUE(builder.delta_chunk(delta("x")).at("usage").is_null());
  EXPECT_TRUE(builder.finish_chunk({FinishReason::Stop}).at("usage").is_null());
  const json usage = builder.usage_chunk(one({FinishReason::Stop, 10, 4}));
  EXPECT_EQ(usage["object"], "chat.completion.chunk");
  EXPECT_EQ(usage["choices"], json::array());
  EXPECT_EQ(usage["usage"], usage_json(10, 4));
}

std::vector<std::string> keys(const json& object) {
  std::vector<std::string> names;
  for (const auto& [name, value] : object.items()) names.push_back(name);
  return names;
}

// A delta that carries its sequence's counts so far.
Delta counted(std::string text, TokenCounts counts) {
  Delta made = delta(std::move(text));
  made.counts = counts;
  return made;
}

json streamed_with_usage_per_chunk(json body) {
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}, {"continuous_usage_stats", true}};
  return body;
}

// vLLM's continuous_usage_stats: every chunk of a choice has that choice's usage so far (not the
// call's sum), the role chunks none of its tokens yet; the last chunk still the call's usage.
TEST(Responses, ContinuousUsageGivesEveryChunkItsChoicesUsageSoFar) {
  const ParsedRequest parsed = parsed_from(
      Endpoint::ChatCompletions, streamed_with_usage_per_chunk(with(chat_body(), "n", 2)));
  ResponseBuilder builder(parsed, "stories260K", token_text);
  builder.count_prompt({9, 1, 4}, 1);
  EXPECT_EQ(builder.role_chunk(0)["usage"], usage_json(9, 0, 4));
  EXPECT_EQ(builder.role_chunk(1)["usage"], usage_json(9, 0, 4));
  EXPECT_EQ(builder.delta_chunk(counted("Once", {9, 1, 4}), 1)["usage"], usage_json(9, 1, 4));
  EXPECT_EQ(builder.delta_chunk(counted("", {9, 2, 4}), 1)["usage"], usage_json(9, 2, 4));
  // Choice 0 found less of the prompt in the cache: from now on the prompt counts that, as the
  // last chunk will.
  EXPECT_EQ(builder.delta_chunk(counted("Tim", {9, 1, 0}), 0)["usage"], usage_json(9, 1, 0));
  const Completion first{FinishReason::Length, 9, 3, 4};
  EXPECT_EQ(builder.finish_chunk(first, 1)["usage"], usage_json(9, 3, 0));
  const Completion second{FinishReason::Stop, 9, 2, 0};
  const json last_of_0 = builder.finish_chunk(second, 0);
  EXPECT_EQ(last_of_0["usage"], usage_json(9, 2, 0));
  using Names = std::vector<std::string>;
  EXPECT_EQ(keys(last_of_0), Names({"id", "object", "created", "model", "choices", "usage"}));
  EXPECT_EQ(builder.usage_chunk(std::vector<Completion>{second, first})["usage"],
            usage_json(9, 5, 0));
}

// A chunk counts its own prompt's tokens, as vLLM's do, not the list's.
TEST(Responses, ContinuousUsageCountsEachPromptOfAList) {
  const ParsedRequest parsed =
      parsed_from(Endpoint::Completions,
                  streamed_with_usage_per_chunk(with(completion_body(), "prompt", {"ab", "cdef"})));
  ResponseBuilder builder(parsed, "stories260K", token_text);
  EXPECT_EQ(builder.delta_chunk(counted(" a", {3, 1, 0}), 0)["usage"], usage_json(3, 1));
  EXPECT_EQ(builder.delta_chunk(counted(" b", {5, 1, 0}), 1)["usage"], usage_json(5, 1));
  EXPECT_EQ(builder.finish_chunk({FinishReason::Stop, 3, 2, 0}, 0)["usage"], usage_json(3, 2));
}

// A prompt_only answer's chunk and last chunk carry the usage detokenize counts for it (no
// completion tokens: the one it generated is dropped).
TEST(Responses, ContinuousUsageOfAnEchoAloneCountsNoCompletionTokens) {
  json body = with(with(completion_body(), "echo", true), "max_tokens", 0);
  const ParsedRequest parsed =
      parsed_from(Endpoint::Completions, streamed_with_usage_per_chunk(body));
  ResponseBuilder builder(parsed, "stories260K", token_text);
  EXPECT_EQ(builder.delta_chunk(counted(" there", {5, 0, 0}))["usage"], usage_json(5, 0));
  EXPECT_EQ(builder.finish_chunk({FinishReason::Stop, 5, 0})["usage"], usage_json(5, 0));
}

// Without include_usage, as in vLLM, continuous_usage_stats gives no usage at all.
TEST(Responses, ContinuousUsageWithoutIncludeUsageGivesNone) {
  json body = with(chat_body(), "stream", true);
  body["stream_options"] = {{"continuous_usage_stats", true}};
  const ParsedRequest parsed = parsed_from(Endpoint::ChatCompletions, body);
  ResponseBuilder builder(parsed, "stories260K", token_text);
  EXPECT_FALSE(builder.role_chunk().contains("usage"));
  EXPECT_FALSE(builder.delta_chunk(counted("x", {4, 1, 0})).contains("usage"));
  EXPECT_FALSE(builder.finish_chunk({FinishReason::Stop, 4, 1}).contains("usage"));
}

TEST(Responses, CompletionChunksAreTextCompletions) {
  const ParsedRequest parsed = parsed_from(Endpoint::Completions, completion_body());
  ResponseBuilder builder(parsed, "stories260K", token_text);
  const json chunk = builder.delta_chunk(delta(" there"));
  EXPECT_EQ(chunk["object"], "text_completion");
  EXPECT_EQ(chunk["choices"][0]["text"], " there");
  EXPECT_FALSE(chunk["choices"][0].contains("delta"));
  EXPECT_TRUE(chunk["choices"][0].at("stop_reason").is_null());
  Completion stopped{FinishReason::Stop};
  stopped.stop_reason = int32_t(13);
  const json last = builder.finish_chunk(stopped);
  EXPECT_EQ(last["object"], "text_completion");
  EXPECT_EQ(last["choices"][0]["text"], "");
  EXPECT_EQ(last["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(last["choices"][0]["stop_reason"], 13);
}

TEST(Responses, WholeChatCompletion) {
  const ParsedRequest parsed = parsed_from(Endpoint::ChatCompletions, chat_body());
  const auto& request = parsed.request;
  ResponseBuilder builder(parsed, "stories260K", token_text);
  builder.append(delta("Once"));
  builder.append(delta(" upon"));
  const json response = builder.whole_response(one({FinishReason::Stop, 7, 2}));
  EXPECT_EQ(response["id"], request->id);
  EXPECT_EQ(response["object"], "chat.completion");
  EXPECT_EQ(response["model"], "stories260K");
  ASSERT_EQ(response["choices"].size(), 1u);
  const json& choice = response["choices"][0];
  EXPECT_EQ(choice["index"], 0);
  EXPECT_EQ(choice["message"]["role"], "assistant");
  EXPECT_EQ(choice["message"]["content"], "Once upon");
  EXPECT_TRUE(choice["logprobs"].is_null());
  EXPECT_EQ(choice["finish_reason"], "stop");
  EXPECT_TRUE(choice.at("stop_reason").is_null());  // an end of sequence
  EXPECT_EQ(response["usage"], usage_json(7, 2));
}

// Members come in the order OpenAI writes them, so that a response reads as OpenAI's does.
TEST(Responses, MembersComeInOpenAIsOrder) {
  const ParsedRequest parsed = parsed_from(Endpoint::ChatCompletions, chat_body());
  ResponseBuilder builder(parsed, "stories260K", token_text);
  builder.append(delta("Once"));
  const json response = builder.whole_response(one({FinishReason::Stop, 7, 1}));
  using Names = std::vector<std::string>;
  EXPECT_EQ(keys(response), Names({"id", "object", "created", "model", "choices", "usage"}));
  EXPECT_EQ(keys(response["choices"][0]),
            Names({"index", "message", "logprobs", "finish_reason", "stop_reason"}));
  EXPECT_EQ(keys(response["usage"]),
            Names({"prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details"}));
  EXPECT_EQ(keys(error_body(RequestError{})["error"]), Names({"message", "type", "param", "code"}));
}

TEST(Responses, WholeTextCompletion) {
  const ParsedRequest parsed = parsed_from(Endpoint::Completions, completion_body());
  ResponseBuilder builder(parsed, "stories260K", token_text);
  builder.append(delta(" there was"));
  const json response = builder.whole_response(one({FinishReason::Length, 5, 3}));
  EXPECT_EQ(response["object"], "text_completion");
  EXPECT_EQ(response["choices"][0]["text"], " there was");
  EXPECT_EQ(response["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(response["choices"][0].at("stop_reason").is_null());
  EXPECT_EQ(response["usage"]["total_tokens"], 8);
  EXPECT_EQ(
      builder.whole_response(one({FinishReason::Stop, 5, 3, 0, "\n"}))["choices"][0]["stop_reason"],
      "\n");
}

std::vector<TokenOutput> two_tokens() {
  return {TokenOutput{10, " the", -0.5f, {{10, -0.5f}, {11, -1.5f}}},
          TokenOutput{12, " cat", -std::numeric_limits<float>::infinity(), {}}};
}

TEST(Responses, ChatLogprobsFormat) {
  json body = with(chat_body(), "logprobs", true);
  body["top_logprobs"] = 2;
  const ParsedRequest parsed = parsed_from(Endpoint::ChatCompletions, body);
  ResponseBuilder builder(parsed, "stories260K", token_text);
  const json logprobs =
      builder.delta_chunk(delta(" the cat", two_tokens()))["choices"][0]["logprobs"];
  EXPECT_TRUE(logprobs["refusal"].is_null());
  ASSERT_EQ(logprobs["content"].size(), 2u);
  const json& first = logprobs["content"][0];
  EXPECT_EQ(first["token"], " the");
  EXPECT_FLOAT_EQ(first["logprob"].get<float>(), -0.5f);
  EXPECT_EQ(first["bytes"], json({32, 116, 104, 101}));
  ASSERT_EQ(first["top_logprobs"].size(), 2u);
  EXPECT_EQ(first["top_logprobs"][1]["token"], "<11>");
  EXPECT_FLOAT_EQ(first["top_logprobs"][1]["logprob"].get<float>(), -1.5f);
  EXPECT_EQ(first["top_logprobs"][1]["bytes"], json({60, 49, 49, 62}));
  EXPECT_EQ(logprobs["content"][1]["logprob"], -9999.0);  // -inf is not JSON

  builder.append(delta(" the cat", two_tokens()));
  builder.append(delta(" sat", {TokenOutput{13, " sat", -0.25f, {}}}));
  const json whole = builder.whole_response(one({}))["choices"][0]["logprobs"];
  ASSERT_EQ(whole["content"].size(), 3u);
  EXPECT_EQ(whole["content"][2]["token"], " sat");
}

TEST(Responses, CompletionLogprobsFormatWithOffsetsAfterThePrompt) {
  const ParsedRequest parsed =
      parsed_from(Endpoint::Completions, with(completion_body(), "logprobs", 2));
  const auto& request = parsed.request;
  const size_t prompt_length = request->prompt.size();
  ResponseBuilder builder(parsed, "stories260K", token_text);
  const json first = builder.delta_chunk(delta(" the cat", two_tokens()))["choices"][0]["logprobs"];
  EXPECT_EQ(first["tokens"], json({" the", " cat"}));
  EXPECT_EQ(first["token_logprobs"], json({-0.5, -9999.0}));
  // The token itself is among its alternatives, under its own text.
  EXPECT_EQ(first["top_logprobs"][0], json({{" the", -0.5}, {"<11>", -1.5}}));
  EXPECT_EQ(first["top_logprobs"][1], json({{" cat", -9999.0}}));
  EXPECT_EQ(first["text_offset"], json({prompt_length, prompt_length + 4}));
  const json next = builder.delta_chunk(
      delta(" sat", {TokenOutput{13, " sat", -0.25f, {}}}))["choices"][0]["logprobs"];
  EXPECT_EQ(next["text_offset"], json({prompt_length + 8}));
}

TEST(Responses, ChoicesAreNumberedAndTheirUsageAddsUp) {
  json body = with(with(chat_body(), "n", 2), "stream", true);
  body["stream_options"] = {{"include_usage", true}};
  const ParsedRequest parsed = parsed_from(Endpoint::ChatCompletions, body);
  ResponseBuilder builder(parsed, "stories260K", token_text);
  EXPECT_EQ(builder.role_chunk(1)["choices"][0]["index"], 1);
  EXPECT_EQ(builder.delta_chunk(delta("b"), 1)["choices"][0]["index"], 1);
  EXPECT_EQ(builder.finish_chunk({FinishReason::Stop}, 1)["choices"][0]["index"], 1);
  const std::vector<Completion> ends = {{FinishReason::Length, 6, 3}, {FinishReason::Stop, 6, 2}};
  EXPECT_EQ(builder.usage_chunk(ends)["usage"], usage_json(6, 5));

  ResponseBuilder whole(parsed, "stories260K", token_text);
  whole.append(delta("Once"), 0);
  whole.append(delta("Tim"), 1);
  whole.append(delta(" upon"), 0);
  const json response = whole.whole_response(ends);
  ASSERT_EQ(response["choices"].size(), 2u);
  EXPECT_EQ(response["choices"][0]["index"], 0);
  EXPECT_EQ(response["choices"][0]["message"]["content"], "Once upon");
  EXPECT_EQ(response["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(response["choices"][1]["index"], 1);
  EXPECT_EQ(response["choices"][1]["message"]["content"], "Tim");
  EXPECT_EQ(response["choices"][1]["finish_reason"], "stop");
  EXPECT_EQ(response["usage"]["completion_tokens"], 5);
}

TEST(Responses, CompletionLogprobOffsetsAreEachChoicesOwn) {
  const ParsedRequest parsed =
      parsed_from(Endpoint::Completions, with(with(completion_body(), "logprobs", 0), "n", 2));
  const auto& request = parsed.request;
  const size_t prompt_length = request->prompt.size();
  ResponseBuilder builder(parsed, "stories260K", token_text);
  builder.delta_chunk(delta(" the cat", two_tokens()), 0);
  const json other = builder.delta_chunk(delta(" sat", {TokenOutput{13, " sat", -0.25f, {}}}),
                                         1)["choices"][0]["logprobs"];
  EXPECT_EQ(other["text_offset"], json({prompt_length}));
}

TEST(Responses, EachPromptOfAListCountsOnceAndOffsetsItsOwnText) {
  const ParsedRequest parsed = parsed_from(
      Endpoint::Completions,
      with(with(with(completion_body(), "prompt", {"ab", "cdef"}), "n", 2), "logprobs", 0));
  ResponseBuilder builder(parsed, "stories260K", token_text);
  const std::vector<TokenOutput> token = {TokenOutput{13, " sat", -0.25f, {}}};
  EXPECT_EQ(builder.delta_chunk(delta(" sat", token), 1)["choices"][0]["logprobs"]["text_offset"],
            json({2}));
  EXPECT_EQ(builder.delta_chunk(delta(" sat", token), 3)["choices"][0]["logprobs"]["text_offset"],
            json({4}));
  // Each prompt's cached tokens the least any of its choices found: the first prompt's choice 0
  // found the blocks its choice 1 had just computed.
  const std::vector<Completion> ends = {{FinishReason::Stop, 3, 1, 2},
                                        {FinishReason::Stop, 3, 2, 0},
                                        {FinishReason::Stop, 5, 3, 4},
                                        {FinishReason::Stop, 5, 4, 4}};
  EXPECT_EQ(builder.whole_response(ends)["usage"], usage_json(8, 10, 4));
  EXPECT_EQ(builder.whole_response(ends)["choices"].size(), 4u);
}

// "Once upon a time" as the pipeline scores it: BOS (nothing predicts it), then each word.
std::vector<TokenOutput> scored_prompt() {
  return {TokenOutput{1, "", std::nullopt, {}}, TokenOutput{10, " Once", -1.0f, {{10, -1.0f}}},
          TokenOutput{11, " upon", -2.0f, {{12, -0.5f}}},
          TokenOutput{13, " a", -0.25f, {{13, -0.25f}}},
          TokenOutput{14, " time", -0.75f, {{14, -0.75f}}}};
}

Delta echo_delta(std::string text, std::vector<TokenOutput> tokens) {
  Delta d = delta(std::move(text), std::move(tokens));
  d.prompt = scored_prompt();
  return d;
}

TEST(Responses, EchoPutsThePromptAndItsScoresFirst) {
  const ParsedRequest parsed = parsed_from(
      Endpoint::Completions, with(with(completion_body(), "echo", true), "logprobs", 1));
  const size_t prompt_length = std::string("Once upon a time").size();
  ResponseBuilder builder(parsed, "stories260K", token_text);
  const std::vector<TokenOutput> answer = {TokenOutput{15, " there", -0.5f, {{15, -0.5f}}}};
  ASSERT_TRUE(builder.shows(echo_delta(" there", answer)));
  const json choice = builder.delta_chunk(echo_delta(" there", answer))["choices"][0];
  EXPECT_EQ(choice["text"], "Once upon a time there");
  const json& logprobs = choice["logprobs"];
  EXPECT_EQ(logprobs["tokens"], json({"", " Once", " upon", " a", " time", " there"}));
  EXPECT_EQ(logprobs["token_logprobs"], json({nullptr, -1.0, -2.0, -0.25, -0.75, -0.5}));
  EXPECT_TRUE(logprobs["top_logprobs"][0].is_null());
  EXPECT_EQ(logprobs["top_logprobs"][2], json({{"<12>", -0.5}, {" upon", -2.0}}));
  // The first word's SentencePiece space is not in the prompt; the answer starts after it.
  EXPECT_EQ(logprobs["text_offset"], json({0, 0, 4, 9, 11, prompt_length}));
  // Later deltas are the answer's alone.
  const json next = builder.delta_chunk(delta(" was", {TokenOutput{16, " was", -0.1f, {}}}));
  EXPECT_EQ(next["choices"][0]["text"], " was");
  EXPECT_EQ(next["choices"][0]["logprobs"]["text_offset"], json({prompt_length + 6}));

  ResponseBuilder whole(parsed, "stories260K", token_text);
  whole.append(echo_delta(" there", answer));
  whole.append(delta(" was", {TokenOutput{16, " was", -0.1f, {}}}));
  const json response = whole.whole_response(one({FinishReason::Length, 5, 2}))["choices"][0];
  EXPECT_EQ(response["text"], "Once upon a time there was");
  EXPECT_EQ(response["logprobs"]["tokens"].size(), 7u);
  EXPECT_EQ(response["logprobs"]["text_offset"].back(), prompt_length + 6);
}

// The text_offsets of an echoed completions call of `prompt`, its tokens' texts `pieces` (the
// first "": BOS), followed by the answer's tokens of texts `answer`, in one delta.
json echoed_offsets(const std::string& prompt, std::initializer_list<const char*> pieces,
                    std::initializer_list<const char*> answer) {
  const ParsedRequest parsed = parsed_from(
      Endpoint::Completions,
      with(with(with(completion_body(), "prompt", prompt), "echo", true), "logprobs", 0));
  ResponseBuilder builder(parsed, "stories260K", token_text);
  Delta d;
  for (const char* piece : pieces) d.prompt.push_back(TokenOutput{0, piece, -1.0f, {}});
  for (const char* piece : answer) d.tokens.push_back(TokenOutput{5, piece, -1.0f, {}});
  return builder.delta_chunk(d)["choices"][0]["logprobs"]["text_offset"];
}

// OpenAI's text_offset counts characters, as Python's len does, not UTF-8 bytes.
TEST(Responses, TextOffsetsCountCharactersNotBytes) {
  EXPECT_EQ(
      echoed_offsets("Le caf\u00e9 est", {"", " Le", " caf", "\u00e9", " est"}, {" \u00f1u", " x"}),
      json({0, 0, 2, 6, 7, 11, 14}));
}

// A byte outside a well-formed character is a U+FFFD of the text, one character (a lone
// continuation byte counted as none, so offsets stood still); a character split across tokens
// counts in the token of its first byte, and one never finished is a U+FFFD per byte.
TEST(Responses, TextOffsetsCountEachInvalidByteAsTheReplacementTheTextShows) {
  EXPECT_EQ(echoed_offsets("Hi", {"", " Hi"}, {"\x80", "\x80", "\xe2\x82", "\xac", "\xe2", "a"}),
            json({0, 0, 2, 3, 4, 5, 5, 6}));
  EXPECT_EQ(echoed_offsets("Hi", {"", " Hi"}, {"\xe2", "\x82", "a", "b"}),
            json({0, 0, 2, 3, 4, 5}));
  // A prompt of token ids [BOS, 0x80, 0x80, 0xE2] reads "\ufffd\ufffd\ufffd".
  EXPECT_EQ(echoed_offsets("\ufffd\ufffd\ufffd", {"", "\x80", "\x80", "\xe2"}, {" a", " time"}),
            json({0, 0, 1, 2, 3, 5}));
}

// SentencePiece collapses a run of spaces into its word-start mark: offsets still point at each
// token's bytes in the prompt as given (the mark's at the run's start).
TEST(Responses, EchoedOffsetsFollowThePromptThroughCollapsedWhitespace) {
  EXPECT_EQ(echoed_offsets("two  spaces", {"", " t", "w", "o", " s", "p", "a", "ce", "s"}, {" x"}),
            json({0, 0, 1, 2, 3, 6, 7, 8, 10, 11}));
}

// A prompt that opens with a newline gets the word-start mark as a token of its own, a space
// the prompt does not have: it takes no room, and the newline's token starts at 0.
TEST(Responses, EchoedOffsetsOfAPromptOpeningWithANewline) {
  EXPECT_EQ(echoed_offsets("\n\tOnce upon", {"", " ", "\n", "\t", "O", "n", "ce", " upon"}, {","}),
            json({0, 0, 0, 1, 2, 3, 4, 6, 11}));
}

TEST(Responses, AnEchoNoDeltaCarriedComesWithTheEnd) {
  const ParsedRequest parsed =
      parsed_from(Endpoint::Completions, with(completion_body(), "echo", true));
  ResponseBuilder stream(parsed, "stories260K", token_text);
  EXPECT_EQ(stream.finish_chunk({FinishReason::Stop})["choices"][0]["text"], "Once upon a time");
  ResponseBuilder whole(parsed, "stories260K", token_text);
  EXPECT_EQ(whole.whole_response(one({FinishReason::Stop, 5, 1}))["choices"][0]["text"],
            "Once upon a time");
}

TEST(Responses, EchoWithNoNewTokensShowsThePromptAlone) {
  const ParsedRequest parsed = parsed_from(
      Endpoint::Completions,
      with(with(with(completion_body(), "echo", true), "logprobs", 0), "max_tokens", 0));
  ResponseBuilder builder(parsed, "stories260K", token_text);
  const std::vector<TokenOutput> dropped = {TokenOutput{2, "", -0.5f, {}}};
  const json choice = builder.delta_chunk(echo_delta(" there", dropped))["choices"][0];
  EXPECT_EQ(choice["text"], "Once upon a time");
  EXPECT_EQ(choice["logprobs"]["tokens"].size(), 5u);
  EXPECT_FALSE(builder.shows(delta(" more", dropped)));
  // Whatever ended the dropped token, the answer ends at its length of 0.
  EXPECT_EQ(builder.finish_chunk({FinishReason::Stop})["choices"][0]["finish_reason"], "length");
  const json response = builder.whole_response(one({FinishReason::Stop, 5, 0, 0, int32_t(2)}));
  EXPECT_EQ(response["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(response["choices"][0].at("stop_reason").is_null());
  EXPECT_EQ(response["usage"], usage_json(5, 0));
}

TEST(Responses, InvalidUtf8BecomesReplacementCharacters) {
  const ParsedRequest parsed = parsed_from(Endpoint::ChatCompletions, chat_body());
  ResponseBuilder builder(parsed, "stories260K", token_text);
  const std::string text = to_json_text(builder.delta_chunk(delta("\xE2\x96")));
  EXPECT_NE(text.find("\xEF\xBF\xBD"), std::string::npos) << text;
  EXPECT_NO_THROW(json::parse(text));
}

TEST(Responses, ServerSentEvents) {
  EXPECT_EQ(sse_event(json({{"a", 1}})), "data: {\"a\":1}\n\n");
  EXPECT_EQ(kSseDone, "data: [DONE]\n\n");
}

TEST(Responses, ErrorBodyHasNullsForEmptyFields) {
  RequestError error;
  error.message = "bad";
  EXPECT_EQ(error_body(error), json::parse(R"({"error": {"message": "bad",
            "type": "invalid_request_error", "param": null, "code": null}})"));
  error.param = "temperature";
  error.code = "some_code";
  EXPECT_EQ(error_body(error)["error"]["param"], "temperature");
  EXPECT_EQ(error_body(error)["error"]["code"], "some_code");
}

}  // namespace
}  // namespace pipeline
