// End to end: the real `pipeline run` on the tiny real model stories260K (CPU), spoken to over
// HTTP. Greedy answers must be the same however they are asked for: streamed or whole, alone
// or among many, with a roomy or a tight KV pool, and equal to `pipeline generate`; every
// request parameter shapes the answer as it says. (test_server_http.cpp: the HTTP front end's
// own behaviour.)
#include <algorithm>
#include <chrono>
#include <future>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "io/chat_template.h"
#include "io/grammar.h"
#include "io/grammar_prefix.h"
#include "io/json_schema.h"
#include "io/schema_prefix.h"
#include "io/tokenizer.h"
#include "tests/support/command.h"
#include "tests/support/server_calls.h"
#include "tests/support/server_process.h"
#include "tests/support/shared_data.h"
#include "tests/support/stories_tokenizer.h"

namespace pipeline {
namespace {

using namespace testing;  // pipeline::testing: the server and its calls

std::string chat_text(const Reply& reply) {
  return reply.body["choices"][0]["message"]["content"].get<std::string>();
}

// ---- `pipeline generate`, the reference for greedy text

json generate_reference(const std::string& prompt, int max_tokens) {
  const auto result = pipeline::testing::run_pipeline(
      {"generate", "--model", pipeline::testing::shared_path("models/stories260K").string(),
       "--device", "cpu", "--temperature", "0", "--json", "--max-tokens",
       std::to_string(max_tokens), "--prompt", prompt});
  if (result.exit_code != 0) throw std::runtime_error("pipeline generate failed: " + result.err);
  return json::parse(result.out);
}

TEST_F(ServerE2E, GreedyCompletionEqualsPipelineGenerate) {
  const std::string prompt = "Once upon a time";
  const json reference = generate_reference(prompt, 40);
  const Reply whole = post(port(), "/v1/completions", completion_body(prompt, 40));
  ASSERT_EQ(whole.status, 200) << whole.raw;
  EXPECT_EQ(whole.body["object"], "text_completion");
  EXPECT_EQ(whole.body["model"], kModel);
  EXPECT_EQ(whole.body["id"].get<std::string>().rfind("cmpl-", 0), 0u);
  EXPECT_EQ(whole.body["choices"][0]["text"], reference["text"]);
  EXPECT_EQ(whole.body["choices"][0]["finish_reason"], reference["finish_reason"]);
  EXPECT_EQ(whole.body["usage"]["prompt_tokens"], reference["prompt_ids"].size());
  EXPECT_EQ(whole.body["usage"]["completion_tokens"], reference["generated_ids"].size());

  const Stream stream = post_stream(port(), "/v1/completions", completion_body(prompt, 40));
  ASSERT_EQ(stream.status, 200) << stream.raw;
  EXPECT_EQ(stream.content_type, "text/event-stream");
  EXPECT_TRUE(stream.done);
  EXPECT_EQ(stream.text, reference["text"]);
  EXPECT_EQ(stream.finish_reason, reference["finish_reason"]);
  for (const json& event : stream.events) EXPECT_EQ(event["object"], "text_completion");
}

TEST_F(ServerE2E, ChatStreamingAndWholeAnswersAreIdentical) {
  const json body = chat_body("Tell me a story about a cat.", 48);
  const Reply whole = post(port(), "/v1/chat/completions", body);
  ASSERT_EQ(whole.status, 200) << whole.raw;
  EXPECT_EQ(whole.body["object"], "chat.completion");
  EXPECT_EQ(whole.body["choices"][0]["message"]["role"], "assistant");
  EXPECT_FALSE(chat_text(whole).empty());
  const int completion_tokens = whole.body["usage"]["completion_tokens"];
  EXPECT_GT(completion_tokens, 0);
  EXPECT_LE(completion_tokens, 48);

  json streamed_body = body;
  streamed_body["stream_options"] = {{"include_usage", true}};
  const Stream stream = post_stream(port(), "/v1/chat/completions", streamed_body);
  ASSERT_EQ(stream.status, 200) << stream.raw;
  EXPECT_TRUE(stream.done);
  EXPECT_EQ(stream.text, chat_text(whole));
  EXPECT_EQ(stream.finish_reason, whole.body["choices"][0]["finish_reason"]);
  ASSERT_GE(stream.events.size(), 3u);
  EXPECT_EQ(stream.events.front()["choices"][0]["delta"]["role"], "assistant");
  const json& usage_chunk = stream.events.back();
  EXPECT_EQ(usage_chunk["choices"], json::array());
  for (const char* key : {"prompt_tokens", "completion_tokens", "total_tokens"})
    EXPECT_EQ(usage_chunk["usage"][key], whole.body["usage"][key]) << key;
  // The whole answer's request left the prompt in the prefix cache (if an earlier test had not):
  // every full block before its last token came from there.
  const int prompt_tokens = whole.body["usage"]["prompt_tokens"];
  const int cached = usage_chunk["usage"]["prompt_tokens_details"]["cached_tokens"];
  EXPECT_EQ(cached, (prompt_tokens - 1) / 16 * 16);
  EXPECT_LE(whole.body["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), cached);
  for (const json& event : stream.events) {
    EXPECT_EQ(event["object"], "chat.completion.chunk");
    EXPECT_EQ(event["id"], stream.events.front()["id"]);
  }
}

// vLLM's continuous_usage_stats: each chunk carries its choice's usage so far, the role chunks
// none of its tokens, each token's chunk one more, the finishing chunk the choice's count (with
// an end of sequence that has no chunk); the last chunk is the call's usage, as without it.
TEST_F(ServerE2E, ContinuousUsageStatsCountEachChoicesTokensChunkByChunk) {
  const json body = with(chat_body("Tell me a story.", 12), "n", 2);
  const Reply whole = post(port(), "/v1/chat/completions", body);
  ASSERT_EQ(whole.status, 200) << whole.raw;
  json streamed = body;
  streamed["stream_options"] = {{"include_usage", true}, {"continuous_usage_stats", true}};
  const Stream stream = post_stream(port(), "/v1/chat/completions", streamed);
  ASSERT_EQ(stream.status, 200) << stream.raw;
  ASSERT_TRUE(stream.done);
  ASSERT_GE(stream.events.size(), 5u);
  const json& last = stream.events.back();
  EXPECT_EQ(last["choices"], json::array());
  EXPECT_EQ(last["usage"]["prompt_tokens"], whole.body["usage"]["prompt_tokens"]);
  EXPECT_EQ(last["usage"]["completion_tokens"], whole.body["usage"]["completion_tokens"]);
  const int prompt_tokens = last["usage"]["prompt_tokens"];
  std::map<int, int> shown;  // by choice, its token chunks so far
  int finished_tokens = 0;
  for (size_t i = 0; i + 1 < stream.events.size(); ++i) {
    SCOPED_TRACE(stream.events[i].dump());
    const json& choice = stream.events[i]["choices"].at(0);
    const json& usage = stream.events[i].at("usage");
    const int completion_tokens = usage["completion_tokens"];
    EXPECT_EQ(usage["prompt_tokens"], prompt_tokens);
    EXPECT_EQ(usage["total_tokens"], prompt_tokens + completion_tokens);
    int& so_far = shown[choice["index"].get<int>()];
    if (choice["delta"].contains("role")) {
      EXPECT_EQ(completion_tokens, 0);
    } else if (choice["finish_reason"].is_null()) {
      EXPECT_EQ(completion_tokens, ++so_far);
    } else {
      EXPECT_GE(completion_tokens, so_far);
      EXPECT_LE(completion_tokens, so_far + 1);
      finished_tokens += completion_tokens;
    }
  }
  EXPECT_EQ(finished_tokens, last["usage"]["completion_tokens"]);
  // Once every choice has counted the prompt, its cached tokens are the last chunk's.
  EXPECT_EQ(stream.events[stream.events.size() - 2]["usage"]["prompt_tokens_details"],
            last["usage"]["prompt_tokens_details"]);
}

// Choice i of a seeded call with n choices draws with seed + i: a one-choice call with that seed
// is its reference, whole or streamed.
TEST_F(ServerE2E, NChoicesAreSampledApartAndEachStreamsUnderItsIndex) {
  json body = with(with(completion_body("Once upon a time", 24), "temperature", 1.0), "seed", 11);
  const Reply three = post(port(), "/v1/completions", with(body, "n", 3));
  ASSERT_EQ(three.status, 200) << three.raw;
  ASSERT_EQ(three.body["choices"].size(), 3u);
  int completion_tokens = 0;
  std::set<std::string> texts;
  std::vector<Reply> alone;
  for (int i = 0; i < 3; ++i) {
    alone.push_back(post(port(), "/v1/completions", with(body, "seed", 11 + i)));
    const json& choice = three.body["choices"][i];
    EXPECT_EQ(choice["index"], i);
    EXPECT_EQ(choice["text"], alone[i].body["choices"][0]["text"]) << "choice " << i;
    EXPECT_EQ(choice["finish_reason"], alone[i].body["choices"][0]["finish_reason"]);
    completion_tokens += alone[i].body["usage"]["completion_tokens"].get<int>();
    texts.insert(choice["text"].get<std::string>());
  }
  EXPECT_EQ(texts.size(), 3u) << "the choices should differ";
  EXPECT_EQ(three.body["usage"]["prompt_tokens"], alone[0].body["usage"]["prompt_tokens"]);
  EXPECT_EQ(three.body["usage"]["completion_tokens"], completion_tokens);

  json streamed = with(body, "n", 3);
  streamed["stream_options"] = {{"include_usage", true}};
  const Stream stream = post_stream(port(), "/v1/completions", streamed);
  ASSERT_EQ(stream.status, 200) << stream.raw;
  EXPECT_TRUE(stream.done);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(stream.choice_texts.at(i), three.body["choices"][i]["text"]) << "choice " << i;
    EXPECT_EQ(stream.choice_finish_reasons.at(i), three.body["choices"][i]["finish_reason"]);
  }
  EXPECT_EQ(stream.events.back()["usage"], three.body["usage"]);

  // A chat stream opens with the assistant's role for every choice.
  const Stream chat =
      post_stream(port(), "/v1/chat/completions", with(chat_body("Tell me a story.", 8), "n", 2));
  ASSERT_EQ(chat.status, 200) << chat.raw;
  ASSERT_GE(chat.events.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(chat.events[size_t(i)]["choices"][0]["index"], i);
    EXPECT_EQ(chat.events[size_t(i)]["choices"][0]["delta"]["role"], "assistant");
  }
  EXPECT_EQ(chat.choice_texts.at(0), chat.choice_texts.at(1)) << "greedy choices are alike";
}

TEST_F(ServerE2E, AListOfPromptsIsAnsweredPromptByPrompt) {
  const std::vector<std::string> prompts = {"Once upon a time", "The little dog"};
  json body = completion_body(prompts[0], 16);
  body["prompt"] = prompts;
  body["n"] = 2;
  const Reply all = post(port(), "/v1/completions", body);
  ASSERT_EQ(all.status, 200) << all.raw;
  ASSERT_EQ(all.body["choices"].size(), 4u);
  int prompt_tokens = 0;
  for (size_t p = 0; p < 2; ++p) {
    const Reply alone = post(port(), "/v1/completions", completion_body(prompts[p], 16));
    prompt_tokens += alone.body["usage"]["prompt_tokens"].get<int>();
    for (size_t j = 0; j < 2; ++j) {
      const json& choice = all.body["choices"][p * 2 + j];
      EXPECT_EQ(choice["index"], p * 2 + j);
      EXPECT_EQ(choice["text"], alone.body["choices"][0]["text"]) << "prompt " << p;
    }
  }
  EXPECT_EQ(all.body["usage"]["prompt_tokens"], prompt_tokens);

  const Stream stream = post_stream(port(), "/v1/completions", body);
  ASSERT_EQ(stream.status, 200) << stream.raw;
  for (int i = 0; i < 4; ++i)
    EXPECT_EQ(stream.choice_texts.at(i), all.body["choices"][i]["text"]) << "choice " << i;

  // One prompt of the list too long for the context: the call's error names which. The other
  // prompt's choices end with that error too: failed, not counted as cancelled by a client.
  std::string too_long;
  for (int i = 0; i < 300; ++i) too_long += "Once upon a time ";
  body["prompt"] = {prompts[0], too_long};
  body["max_tokens"] = 400;
  body["ignore_eos"] = true;
  const double cancelled = metric(port(), "pipeline_requests_cancelled_total");
  const double failed = metric(port(), "pipeline_requests_failed_total");
  const Reply refused = post(port(), "/v1/completions", body);
  ASSERT_EQ(refused.status, 400) << refused.raw;
  EXPECT_EQ(refused.body["error"]["param"], "prompt");
  EXPECT_EQ(
      refused.body["error"]["message"].get<std::string>().rfind("prompt[1]: the prompt is ", 0), 0u)
      << refused.raw;
  EXPECT_EQ(metric(port(), "pipeline_requests_failed_total") - failed, 4);
  EXPECT_EQ(metric(port(), "pipeline_requests_cancelled_total"), cancelled);
}

TEST_F(ServerE2E, APromptOfTokenIdsIsAnsweredAsItsText) {
  const pipeline::Tokenizer tokenizer(
      pipeline::testing::shared_path("models/stories260K/tokenizer.model"));
  const std::vector<std::string> prompts = {"Once upon a time", "The little dog"};
  json body = completion_body(prompts[0], 16);
  body["prompt"] = tokenizer.encode(prompts[0], true);
  const Reply by_ids = post(port(), "/v1/completions", body);
  ASSERT_EQ(by_ids.status, 200) << by_ids.raw;
  const Reply by_text = post(port(), "/v1/completions", completion_body(prompts[0], 16));
  EXPECT_EQ(by_ids.body["choices"][0]["text"], by_text.body["choices"][0]["text"]);
  EXPECT_EQ(by_ids.body["usage"]["prompt_tokens"], by_text.body["usage"]["prompt_tokens"]);

  body["prompt"] = {tokenizer.encode(prompts[0], true), tokenizer.encode(prompts[1], true)};
  const Reply both = post(port(), "/v1/completions", body);
  ASSERT_EQ(both.status, 200) << both.raw;
  ASSERT_EQ(both.body["choices"].size(), 2u);
  const Reply second = post(port(), "/v1/completions", completion_body(prompts[1], 16));
  EXPECT_EQ(both.body["choices"][1]["text"], second.body["choices"][0]["text"]);

  // vLLM's add_special_tokens false: the text's own tokens, without BOS, as /tokenize gives them.
  json bare = completion_body(prompts[0], 16);
  bare["add_special_tokens"] = false;
  const Reply without_bos = post(port(), "/v1/completions", bare);
  ASSERT_EQ(without_bos.status, 200) << without_bos.raw;
  body["prompt"] = tokenizer.encode(prompts[0], false);
  const Reply by_bare_ids = post(port(), "/v1/completions", body);
  EXPECT_EQ(without_bos.body["choices"][0]["text"], by_bare_ids.body["choices"][0]["text"]);
  EXPECT_EQ(without_bos.body["usage"]["prompt_tokens"],
            by_ids.body["usage"]["prompt_tokens"].get<int>() - 1);
  bare["prompt"] = "";
  const Reply nothing = post(port(), "/v1/completions", bare);
  EXPECT_EQ(nothing.status, 400) << nothing.raw;
  EXPECT_EQ(nothing.body["error"]["param"], "prompt");
}

// /tokenize gives the tokens the completion endpoints feed the model (their usage counts them),
// and /detokenize spells them back.
TEST_F(ServerE2E, TokenizeGivesThePromptTokensOfTheCompletionEndpoints) {
  const pipeline::Tokenizer tokenizer(
      pipeline::testing::shared_path("models/stories260K/tokenizer.model"));
  const std::string prompt = "Once upon a time";
  const Reply tokenized = post(
      port(), "/tokenize", {{"model", kModel}, {"prompt", prompt}, {"return_token_strs", true}});
  ASSERT_EQ(tokenized.status, 200) << tokenized.raw;
  EXPECT_EQ(tokenized.body["tokens"], json(tokenizer.encode(prompt, /*add_bos=*/true)));
  EXPECT_EQ(tokenized.body["max_model_len"], 512);  // stories260K's context
  EXPECT_EQ(tokenized.body["token_strs"].size(), tokenized.body["tokens"].size());
  const Reply completion = post(port(), "/v1/completions", completion_body(prompt, 2));
  ASSERT_EQ(completion.status, 200) << completion.raw;
  EXPECT_EQ(tokenized.body["count"], completion.body["usage"]["prompt_tokens"]);

  const json chat = chat_body("Tell me a story about a cat.", 2);
  const Reply chat_tokens =
      post(port(), "/tokenize", {{"model", kModel}, {"messages", chat["messages"]}});
  ASSERT_EQ(chat_tokens.status, 200) << chat_tokens.raw;
  EXPECT_EQ(chat_tokens.body["tokens"],
            json(apply_chat_template(tokenizer, ChatTemplate::Llama2,
                                     {{"user", "Tell me a story about a cat."}})));
  const Reply chat_answer = post(port(), "/v1/chat/completions", chat);
  ASSERT_EQ(chat_answer.status, 200) << chat_answer.raw;
  EXPECT_EQ(chat_tokens.body["count"], chat_answer.body["usage"]["prompt_tokens"]);

  const Reply detokenized =
      post(port(), "/detokenize", {{"model", kModel}, {"tokens", tokenized.body["tokens"]}});
  ASSERT_EQ(detokenized.status, 200) << detokenized.raw;
  EXPECT_EQ(detokenized.body, json({{"prompt", prompt}}));

  // Counted in /metrics under their own routes, like every other answer.
  const std::string metrics = send(port(), "GET", "/metrics", "").raw;
  for (const char* route : {"/tokenize", "/detokenize"})
    EXPECT_NE(metrics.find("pipeline_http_requests_total{route=\"" + std::string(route) +
                           "\",status=\"200\"}"),
              std::string::npos)
        << metrics;
}

// vLLM's continue_final_message: the answer continues the assistant's last message, as a
// completion of the same tokens does; streamed or not.
TEST_F(ServerE2E, AChatAnswerContinuesTheFinalAssistantMessageWhenAsked) {
  json chat = chat_body("Tell me a story.", 12);
  chat["messages"].push_back({{"role", "assistant"}, {"content", "Once upon a time, a little"}});
  chat["continue_final_message"] = true;
  chat["add_generation_prompt"] = false;
  const Reply tokens = post(port(), "/tokenize",
                            {{"model", kModel},
                             {"messages", chat["messages"]},
                             {"continue_final_message", true},
                             {"add_generation_prompt", false}});
  ASSERT_EQ(tokens.status, 200) << tokens.raw;
  const Reply same = post(port(), "/v1/completions",
                          with(completion_body("", 12), "prompt", tokens.body["tokens"]));
  ASSERT_EQ(same.status, 200) << same.raw;
  const std::string expected = same.body["choices"][0]["text"];
  ASSERT_FALSE(expected.empty());
  const Reply whole = post(port(), "/v1/chat/completions", chat);
  ASSERT_EQ(whole.status, 200) << whole.raw;
  EXPECT_EQ(chat_text(whole), expected);
  EXPECT_EQ(whole.body["usage"]["prompt_tokens"], tokens.body["count"]);
  EXPECT_EQ(post_stream(port(), "/v1/chat/completions", chat).text, expected);

  // Without it, a dialog may not end with the assistant; and both ends at once are refused.
  chat.erase("continue_final_message");
  EXPECT_EQ(post(port(), "/v1/chat/completions", chat).status, 400);
  chat["continue_final_message"] = true;
  chat["add_generation_prompt"] = true;
  const Reply both = post(port(), "/v1/chat/completions", chat);
  EXPECT_EQ(both.status, 400);
  EXPECT_EQ(both.body["error"]["param"], "continue_final_message") << both.raw;
}

// vLLM's truncate_prompt_tokens: a prompt beyond the context is answered from its last tokens.
TEST_F(ServerE2E, TruncatePromptTokensAnswersAPromptBeyondTheContext) {
  std::string prompt;
  for (int i = 0; i < 300; ++i) prompt += "the cat ";
  const json body = completion_body(prompt, 4);
  EXPECT_EQ(post(port(), "/v1/completions", body).status, 400);
  for (const char* path : {"/v1/completions", "/v1/chat/completions"}) {
    json truncated = std::string(path) == "/v1/completions" ? body : chat_body(prompt, 4);
    truncated["truncate_prompt_tokens"] = 200;
    const Reply reply = post(port(), path, truncated);
    ASSERT_EQ(reply.status, 200) << path << ": " << reply.raw;
    EXPECT_EQ(reply.body["usage"]["prompt_tokens"], 200) << path;
  }
}

// lm-eval's loglikelihood requests: prompts of token ids, echo, logprobs 1, one new token. Each
// choice's logprobs list its prompt's tokens (the first with null: nothing predicts it) and the
// new token, which is the one a plain request generates, with the same logprob.
TEST_F(ServerE2E, EchoScoresThePromptAsLoglikelihoodEvaluationsAskIt) {
  const pipeline::Tokenizer tokenizer(
      pipeline::testing::shared_path("models/stories260K/tokenizer.model"));
  const std::vector<std::string> prompts = {"Once upon a time", "The little dog"};
  json body = with(with(completion_body(prompts[0], 1), "echo", true), "logprobs", 1);
  body["prompt"] = {tokenizer.encode(prompts[0], true), tokenizer.encode(prompts[1], true)};
  const Reply scored = post(port(), "/v1/completions", body);
  ASSERT_EQ(scored.status, 200) << scored.raw;
  ASSERT_EQ(scored.body["choices"].size(), 2u);
  for (size_t i = 0; i < prompts.size(); ++i) {
    SCOPED_TRACE(prompts[i]);
    const Reply plain =
        post(port(), "/v1/completions", with(completion_body(prompts[i], 1), "logprobs", 1));
    ASSERT_EQ(plain.status, 200) << plain.raw;
    const json& choice = scored.body["choices"][i];
    EXPECT_EQ(choice["text"], prompts[i] + plain.body["choices"][0]["text"].get<std::string>());
    const json& logprobs = choice["logprobs"];
    const size_t prompt_tokens = tokenizer.encode(prompts[i], true).size();
    ASSERT_EQ(logprobs["tokens"].size(), prompt_tokens + 1);
    EXPECT_TRUE(logprobs["token_logprobs"][0].is_null());
    EXPECT_TRUE(logprobs["top_logprobs"][0].is_null());
    for (size_t t = 1; t < prompt_tokens; ++t) {
      const double logprob = logprobs["token_logprobs"][t];
      EXPECT_LT(logprob, 0.0);
      // The likeliest token and the prompt's own (one entry when they are the same), as
      // lm-eval reads them to tell whether the prompt is the greedy continuation.
      const json& top = logprobs["top_logprobs"][t];
      ASSERT_TRUE(top.size() == 1 || top.size() == 2) << top.dump();
      ASSERT_TRUE(top.contains(logprobs["tokens"][t].get<std::string>())) << top.dump();
      EXPECT_NEAR(top[logprobs["tokens"][t].get<std::string>()].get<double>(), logprob, 1e-6);
      for (const auto& [text, alternative] : top.items())
        EXPECT_GE(alternative.get<double>(), logprob);
      EXPECT_LE(logprobs["text_offset"][t - 1], logprobs["text_offset"][t]);
    }
    const json& answer = plain.body["choices"][0]["logprobs"];
    EXPECT_EQ(logprobs["tokens"].back(), answer["tokens"][0]);
    EXPECT_NEAR(logprobs["token_logprobs"].back().get<double>(),
                answer["token_logprobs"][0].get<double>(), 1e-4);
    EXPECT_EQ(logprobs["text_offset"].back(), prompts[i].size());
  }
  EXPECT_EQ(scored.body["usage"]["prompt_tokens"],
            tokenizer.encode(prompts[0], true).size() + tokenizer.encode(prompts[1], true).size());
}

// OpenAI's presence and frequency penalties weigh the answer's tokens, not the prompt's: the
// first token is the same with them as without ("." ends the prompt's sentences too).
TEST_F(ServerE2E, PresenceAndFrequencyPenaltiesLeaveThePromptsTokensAlone) {
  const std::string prompt =
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
      "park. One day, she saw a big, red ball";
  const json plain = completion_body(prompt, 1);
  const Reply reference = post(port(), "/v1/completions", plain);
  ASSERT_EQ(reference.status, 200) << reference.raw;
  for (const char* penalty : {"presence_penalty", "frequency_penalty"}) {
    const Reply penalised = post(port(), "/v1/completions", with(plain, penalty, 2.0));
    ASSERT_EQ(penalised.status, 200) << penalised.raw;
    EXPECT_EQ(penalised.body["choices"][0]["text"], reference.body["choices"][0]["text"])
        << penalty;
  }
}

TEST_F(ServerE2E, EchoWithNoNewTokensAnswersThePromptAloneWholeOrStreamed) {
  const json body = with(with(completion_body("Once upon a time", 0), "echo", true), "logprobs", 0);
  const double generated_before = metric(port(), "pipeline_generation_tokens_total");
  const Reply whole = post(port(), "/v1/completions", body);
  ASSERT_EQ(whole.status, 200) << whole.raw;
  const json& choice = whole.body["choices"][0];
  EXPECT_EQ(choice["text"], "Once upon a time");
  EXPECT_EQ(choice["finish_reason"], "length");
  EXPECT_EQ(choice["logprobs"]["tokens"].size(), whole.body["usage"]["prompt_tokens"]);
  EXPECT_EQ(whole.body["usage"]["completion_tokens"], 0);

  const Stream stream = post_stream(port(), "/v1/completions", body);
  ASSERT_EQ(stream.status, 200) << stream.raw;
  EXPECT_EQ(stream.text, "Once upon a time");
  EXPECT_EQ(stream.finish_reason, "length");
  // The token each drew and dropped is not counted as generated either.
  EXPECT_EQ(metric(port(), "pipeline_generation_tokens_total"), generated_before);

  // Echo with new tokens, streamed: the prompt, then the answer a plain request gets.
  const Reply plain = post(port(), "/v1/completions", completion_body("Once upon a time", 8));
  const Stream echoed = post_stream(port(), "/v1/completions",
                                    with(completion_body("Once upon a time", 8), "echo", true));
  EXPECT_EQ(echoed.text, "Once upon a time" + plain.body["choices"][0]["text"].get<std::string>());
}

// A prompt-only answer computes no position past its prompt, so the prompt may fill the whole
// context (512 tokens here), as lm-eval's loglikelihood windows of max_length tokens do; one
// more token, or an answer asked for, does not fit.
TEST_F(ServerE2E, APromptOnlyEchoMayFillTheWholeContext) {
  const pipeline::Tokenizer tokenizer(
      pipeline::testing::shared_path("models/stories260K/tokenizer.model"));
  std::vector<int32_t> window;
  while (window.size() < 513) {
    const auto story =
        tokenizer.encode("Once upon a time, there was a little dog named Max. ", window.empty());
    window.insert(window.end(), story.begin(), story.end());
  }
  window.resize(512);
  const auto scored = [&](const std::vector<int32_t>& prompt, int max_tokens) {
    json body = with(with(completion_body("", max_tokens), "echo", true), "logprobs", 0);
    body["prompt"] = prompt;
    return post(port(), "/v1/completions", body);
  };
  const Reply whole = scored(window, 0);
  ASSERT_EQ(whole.status, 200) << whole.raw;
  const json& logprobs = whole.body["choices"][0]["logprobs"];
  ASSERT_EQ(logprobs["token_logprobs"].size(), 512u);
  // Causal: the window's first 100 scores are those of its first 100 tokens alone.
  const Reply start = scored({window.begin(), window.begin() + 100}, 0);
  ASSERT_EQ(start.status, 200) << start.raw;
  for (size_t t = 1; t < 100; ++t)
    EXPECT_NEAR(logprobs["token_logprobs"][t].get<double>(),
                start.body["choices"][0]["logprobs"]["token_logprobs"][t].get<double>(), 1e-4)
        << t;

  std::vector<int32_t> longer = window;
  longer.push_back(window[1]);
  EXPECT_EQ(scored(longer, 0).status, 400);
  EXPECT_EQ(scored(window, 1).status, 400);
}

TEST_F(ServerE2E, AStopStringEndsTheAnswerBeforeIt) {
  const std::string full = post(port(), "/v1/completions", completion_body("Once upon a time", 40))
                               .body["choices"][0]["text"];
  const std::string stop = " little";  // stories260K's greedy story has a little girl in it
  ASSERT_NE(full.find(stop), std::string::npos) << full;
  for (bool stream : {false, true}) {
    SCOPED_TRACE(stream ? "streamed" : "whole");
    json body = with(completion_body("Once upon a time", 40), "stop", {stop, "unused"});
    std::string text, finish_reason;
    json stop_reason;
    if (stream) {
      const Stream answer = post_stream(port(), "/v1/completions", body);
      text = answer.text;
      finish_reason = answer.finish_reason;
      stop_reason = answer.stop_reason;
    } else {
      const Reply answer = post(port(), "/v1/completions", body);
      text = answer.body["choices"][0]["text"];
      finish_reason = answer.body["choices"][0]["finish_reason"];
      stop_reason = answer.body["choices"][0]["stop_reason"];
    }
    EXPECT_EQ(text, full.substr(0, full.find(stop)));
    EXPECT_EQ(finish_reason, "stop");
    EXPECT_EQ(stop_reason, stop);  // vLLM's stop_reason: which stop string matched
    // vLLM's include_stop_str_in_output: the answer ends with the stop string instead.
    body["include_stop_str_in_output"] = true;
    const std::string with_stop =
        stream
            ? post_stream(port(), "/v1/completions", body).text
            : post(port(), "/v1/completions", body).body["choices"][0]["text"].get<std::string>();
    EXPECT_EQ(with_stop, full.substr(0, full.find(stop) + stop.size()));
  }
}

// As in vLLM, a stream sends a chunk for every generated token, of empty text when the token's
// text is held back; here a stop string that matches the story from its " little" on for
// several tokens, then not, holds them back. Clients (and bench-serve) count and time tokens by
// chunks.
TEST_F(ServerE2E, EveryGeneratedTokenStreamsAChunkEvenWhileItsTextIsHeldBack) {
  const std::string full = post(port(), "/v1/completions", completion_body("Once upon a time", 40))
                               .body["choices"][0]["text"];
  const size_t start = full.find(" little");
  ASSERT_NE(start, std::string::npos) << full;
  const std::string never_matched = full.substr(start, 20) + "#";
  json body = with(completion_body("Once upon a time", 40), "stop", {never_matched});
  body["stream_options"] = {{"include_usage", true}};
  const Stream answer = post_stream(port(), "/v1/completions", body);
  ASSERT_EQ(answer.status, 200) << answer.raw;
  EXPECT_EQ(answer.text, full);
  int token_chunks = 0, empty_chunks = 0;
  for (const json& chunk : answer.events)
    for (const json& choice : chunk["choices"])
      if (choice["finish_reason"].is_null()) {
        ++token_chunks;
        empty_chunks += choice["text"] == "";
      }
  EXPECT_EQ(token_chunks, 40);
  EXPECT_EQ(answer.events.back()["usage"]["completion_tokens"], 40);
  EXPECT_GT(empty_chunks, 1);  // " little" and the words after it, held back
}

TEST_F(ServerE2E, LogprobTokensSpellTheAnswer) {
  json chat = with(chat_body("Tell me a story.", 12), "logprobs", true);
  chat["top_logprobs"] = 3;
  const Reply reply = post(port(), "/v1/chat/completions", chat);
  ASSERT_EQ(reply.status, 200) << reply.raw;
  std::string spelled;
  for (const json& entry : reply.body["choices"][0]["logprobs"]["content"]) {
    spelled += entry["token"].get<std::string>();
    EXPECT_LE(entry["logprob"].get<double>(), 0.0);
    ASSERT_EQ(entry["top_logprobs"].size(), 3u);
    // Greedy: the chosen token is the most likely one.
    EXPECT_EQ(entry["top_logprobs"][0]["logprob"], entry["logprob"]);
  }
  EXPECT_EQ(spelled, chat_text(reply));

  const Reply completion =
      post(port(), "/v1/completions", with(completion_body("Once upon a time", 12), "logprobs", 2));
  ASSERT_EQ(completion.status, 200) << completion.raw;
  const json& logprobs = completion.body["choices"][0]["logprobs"];
  ASSERT_EQ(logprobs["tokens"].size(), 12u);
  EXPECT_EQ(logprobs["token_logprobs"].size(), 12u);
  EXPECT_EQ(logprobs["top_logprobs"][0].size(), 2u);
  EXPECT_EQ(logprobs["text_offset"][0], std::string("Once upon a time").size());

  // A prompt of no text: the answer's first word has no leading space, nor has its token.
  for (const json& prompt : {json(""), json::array({1})}) {
    const Reply start = post(port(), "/v1/completions",
                             with(with(completion_body("", 8), "prompt", prompt), "logprobs", 0));
    ASSERT_EQ(start.status, 200) << start.raw;
    const std::string text = start.body["choices"][0]["text"];
    const json& start_logprobs = start.body["choices"][0]["logprobs"];
    std::string tokens;
    for (size_t i = 0; i < start_logprobs["tokens"].size(); ++i) {
      EXPECT_EQ(start_logprobs["text_offset"][i], tokens.size()) << prompt;
      tokens += start_logprobs["tokens"][i].get<std::string>();
    }
    EXPECT_EQ(tokens, text) << prompt;
    ASSERT_FALSE(text.empty()) << prompt;
    EXPECT_NE(text.front(), ' ') << prompt;
  }
}

// vLLM's stop_token_ids end the answer at the token, its text kept; min_tokens holds back every
// ending (end of sequence, stop token ids, stop strings) for its first tokens.
TEST_F(ServerE2E, StopTokenIdsEndTheAnswerAndMinTokensHoldsEveryEndingBack) {
  const std::string prompt = "Once upon a time";
  const json reference = generate_reference(prompt, 30);
  const std::vector<int32_t> ids = reference["generated_ids"];
  const std::string reference_text = reference["text"];
  ASSERT_EQ(ids.size(), 30u);
  const Tokenizer& tokenizer = testing::stories_tokenizer();

  const int32_t stop_id = ids[5];
  const size_t first = size_t(std::find(ids.begin(), ids.end(), stop_id) - ids.begin());
  const Reply stopped = post(port(), "/v1/completions",
                             with(completion_body(prompt, 30), "stop_token_ids", {stop_id}));
  ASSERT_EQ(stopped.status, 200) << stopped.raw;
  const std::string stopped_text = stopped.body["choices"][0]["text"];
  EXPECT_EQ(stopped.body["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(stopped.body["choices"][0]["stop_reason"], stop_id);
  EXPECT_EQ(stopped.body["usage"]["completion_tokens"], first + 1);
  // The text of the tokens before the stop token, without the stop token's own (as in vLLM).
  ASSERT_EQ(reference_text.rfind(stopped_text, 0), 0u) << stopped_text;
  const std::string stop_text = tokenizer.token_text(stop_id);
  EXPECT_EQ(reference_text.compare(stopped_text.size(), stop_text.size(), stop_text), 0)
      << stopped_text << " | " << stop_text;
  // ... and with it, asked for with include_stop_str_in_output.
  const Reply included = post(port(), "/v1/completions",
                              with(with(completion_body(prompt, 30), "stop_token_ids", {stop_id}),
                                   "include_stop_str_in_output", true));
  ASSERT_EQ(included.status, 200) << included.raw;
  EXPECT_EQ(included.body["choices"][0]["text"], stopped_text + stop_text);
  // Streamed, the finishing chunk names it; ignore_eos leaves stop token ids at work.
  const Stream streamed = post_stream(
      port(), "/v1/completions",
      with(with(completion_body(prompt, 30), "stop_token_ids", {stop_id}), "ignore_eos", true));
  ASSERT_EQ(streamed.status, 200) << streamed.raw;
  EXPECT_EQ(streamed.text, stopped_text);
  EXPECT_EQ(streamed.finish_reason, "stop");
  EXPECT_EQ(streamed.stop_reason, stop_id);

  // The end of sequence all but forced: the answer is empty, unless min_tokens holds it back.
  json eager =
      with(completion_body(prompt, 30), "logit_bias", {{std::to_string(tokenizer.eos_id()), 100}});
  const Reply empty = post(port(), "/v1/completions", eager);
  ASSERT_EQ(empty.status, 200) << empty.raw;
  EXPECT_EQ(empty.body["choices"][0]["text"], "");
  EXPECT_EQ(empty.body["usage"]["completion_tokens"], 1);
  // An end of sequence is no stop the client named, even one listed in stop_token_ids.
  EXPECT_TRUE(empty.body["choices"][0].at("stop_reason").is_null());
  const Reply listed =
      post(port(), "/v1/completions", with(eager, "stop_token_ids", {tokenizer.eos_id()}));
  EXPECT_TRUE(listed.body["choices"][0].at("stop_reason").is_null()) << listed.raw;
  eager["min_tokens"] = 5;
  for (const json& stop : {json(), json(" ")}) {
    // A stop string in the first five tokens' text does not count either.
    const Reply five = post(port(), "/v1/completions", with(eager, "stop", stop));
    ASSERT_EQ(five.status, 200) << five.raw;
    const std::string text = five.body["choices"][0]["text"];
    EXPECT_EQ(five.body["usage"]["completion_tokens"], 6);  // five, then the end of sequence
    EXPECT_EQ(five.body["choices"][0]["finish_reason"], "stop");
    EXPECT_EQ(reference_text.rfind(text, 0), 0u) << text;
    EXPECT_NE(text.find(' ', 1), std::string::npos) << text;
  }

  // A stop token id is held back as well: the greedy first token cannot end the answer.
  const Reply held =
      post(port(), "/v1/completions",
           with(with(completion_body(prompt, 30), "stop_token_ids", {ids[0]}), "min_tokens", 3));
  ASSERT_EQ(held.status, 200) << held.raw;
  EXPECT_GE(held.body["usage"]["completion_tokens"].get<int>(), 4);
  EXPECT_EQ(
      post(port(), "/v1/completions", with(completion_body(prompt, 30), "stop_token_ids", {100000}))
          .status,
      400);
}

// vLLM's allowed_token_ids: one allowed token is drawn at every step; the end of sequence alone
// ends the answer at once; an id outside the vocabulary, or ending tokens only where min_tokens
// bans them, is a 400 naming the parameter.
TEST_F(ServerE2E, AllowedTokenIdsAreTheOnlyTokensDrawn) {
  const Tokenizer& tokenizer = testing::stories_tokenizer();
  const std::vector<int32_t> ids = tokenizer.encode("cat", false);
  ASSERT_FALSE(ids.empty());
  const int32_t only = ids.back();
  const std::string piece = tokenizer.token_text(only);
  const Reply repeated =
      post(port(), "/v1/completions",
           with(with(completion_body("Once upon a time", 5), "allowed_token_ids", {only}),
                "temperature", 1.0));
  ASSERT_EQ(repeated.status, 200) << repeated.raw;
  std::string expected;
  for (int i = 0; i < 5; ++i) expected += piece;
  EXPECT_EQ(repeated.body["choices"][0]["text"], expected);
  EXPECT_EQ(repeated.body["choices"][0]["finish_reason"], "length");

  const Reply ended = post(port(), "/v1/chat/completions",
                           with(chat_body("Hello", 5), "allowed_token_ids", {tokenizer.eos_id()}));
  ASSERT_EQ(ended.status, 200) << ended.raw;
  EXPECT_EQ(ended.body["choices"][0]["message"]["content"], "");
  EXPECT_EQ(ended.body["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(ended.body["usage"]["completion_tokens"], 1);

  for (const json& body :
       {with(completion_body("Once", 5), "allowed_token_ids", {100000}),
        with(with(completion_body("Once", 5), "allowed_token_ids", {tokenizer.eos_id()}),
             "min_tokens", 2)}) {
    const Reply refused = post(port(), "/v1/completions", body);
    ASSERT_EQ(refused.status, 400) << refused.raw;
    EXPECT_EQ(refused.body["error"]["param"], "allowed_token_ids") << refused.raw;
  }
}

// vLLM's bad_words: "girl" is ▁g ir l to stories260K, and the greedy story has it by its eighth
// token; banned, the story is the same up to its "l", which the model replaces, and never holds
// the three again. Bans that leave the first draw nothing are a 400 naming bad_words; a later
// draw left nothing fails its answer with a 400 too (the request's own bans conflict) rather
// than drawing a banned token.
TEST_F(ServerE2E, BadWordsNeverAppearInTheAnswer) {
  const Tokenizer& tokenizer = testing::stories_tokenizer();
  const std::string prompt = "Once upon a time";
  const json reference = generate_reference(prompt, 30);
  const std::vector<int32_t> ids = reference["generated_ids"];
  const std::vector<int32_t> girl = tokenizer.encode("girl", false);
  ASSERT_EQ(girl.size(), 3u);
  const auto at = std::search(ids.begin(), ids.end(), girl.begin(), girl.end());
  ASSERT_NE(at, ids.end()) << reference["text"];
  const std::vector<int32_t> before(ids.begin(), at + ptrdiff_t(girl.size()) - 1);  // "▁g ir"

  const Reply banned =
      post(port(), "/v1/completions",
           with(with(completion_body(prompt, 30), "bad_words", {"girl"}), "logprobs", 0));
  ASSERT_EQ(banned.status, 200) << banned.raw;
  const std::string text = banned.body["choices"][0]["text"];
  const std::string kept = tokenizer.decode(before);
  EXPECT_EQ(text.rfind(kept, 0), 0u) << text;
  const std::vector<std::string> tokens = banned.body["choices"][0]["logprobs"]["tokens"];
  ASSERT_EQ(tokens.size(), 30u);
  for (size_t i = 0; i < before.size(); ++i) EXPECT_EQ(tokens[i], tokenizer.token_text(before[i]));
  EXPECT_NE(tokens[before.size()], tokenizer.token_text(girl.back()));
  std::vector<std::string> girl_texts;
  for (int32_t token : girl) girl_texts.push_back(tokenizer.token_text(token));
  EXPECT_EQ(std::search(tokens.begin(), tokens.end(), girl_texts.begin(), girl_texts.end()),
            tokens.end())
      << text;

  // "little" is one token: with it the only one allowed, nothing is left to draw first.
  const std::vector<int32_t> little = tokenizer.encode("little", false);
  ASSERT_EQ(little.size(), 1u);
  const Reply refused = post(
      port(), "/v1/completions",
      with(with(completion_body(prompt, 5), "allowed_token_ids", little), "bad_words", {"little"}));
  ASSERT_EQ(refused.status, 400) << refused.raw;
  EXPECT_EQ(refused.body["error"]["param"], "bad_words") << refused.raw;
  // Unless nothing is drawn: the prompt scored alone (echo, max_tokens 0).
  const Reply scored =
      post(port(), "/v1/completions",
           with(with(with(with(completion_body(prompt, 0), "echo", true), "logprobs", 1),
                     "allowed_token_ids", little),
                "bad_words", {"little"}));
  EXPECT_EQ(scored.status, 200) << scored.raw;
  // "little little": the first draw takes it, the second has nothing left.
  const Reply failed = post(port(), "/v1/completions",
                            with(with(completion_body(prompt, 5), "allowed_token_ids", little),
                                 "bad_words", {"little little"}));
  ASSERT_EQ(failed.status, 400) << failed.raw;
  EXPECT_EQ(failed.body["error"]["type"], "invalid_request_error") << failed.raw;
  EXPECT_NE(failed.raw.find("no token can be drawn"), std::string::npos) << failed.raw;
  EXPECT_EQ(post(port(), "/v1/completions", completion_body(prompt, 2)).status, 200);
}

// response_format json_object: every choice is the beginning of a JSON object, whole where it
// ended on its own, streamed or not. The model writes stories, not JSON, so a logit_bias toward
// quotes and closing braces gives its objects a chance to close.
TEST_F(ServerE2E, JsonModeAnswersAreObjectsOrTheirBeginnings) {
  const std::vector<int32_t> ids = testing::stories_tokenizer().encode("a\"}", false);
  ASSERT_EQ(ids.size(), 3u);
  json body = with(chat_body("Tell me about a cat as JSON.", 48), "temperature", 1.0);
  body.update({{"n", 4},
               {"seed", 5},
               {"response_format", {{"type", "json_object"}}},
               {"logit_bias", {{std::to_string(ids[1]), 10}, {std::to_string(ids[2]), 10}}}});
  const Reply whole = post(port(), "/v1/chat/completions", body);
  ASSERT_EQ(whole.status, 200) << whole.raw;
  const Stream stream = post_stream(port(), "/v1/chat/completions", body);
  ASSERT_EQ(stream.status, 200) << stream.raw;
  int closed = 0;
  for (const json& choice : whole.body["choices"]) {
    const std::string text = choice["message"]["content"];
    SCOPED_TRACE(text);
    SchemaPrefix prefix(*JsonSchema::any_object());
    EXPECT_TRUE(prefix.feed(text));
    const std::string finish_reason = choice["finish_reason"];
    if (finish_reason == "stop") {
      EXPECT_TRUE(prefix.complete());
      EXPECT_TRUE(json::parse(text).is_object());
      ++closed;
    }
    const int index = choice["index"];
    EXPECT_EQ(stream.choice_texts.at(index), text);
    EXPECT_EQ(stream.choice_finish_reasons.at(index), finish_reason);
  }
  EXPECT_GE(closed, 1);
}

// response_format json_schema: every choice is a value the schema admits or its beginning, its
// keys in the order the request lists them (not sorted), streamed or not; a schema the server
// cannot hold answers to is a 400 naming the place in it.
TEST_F(ServerE2E, JsonSchemaAnswersFollowTheSchemaInItsOrder) {
  const nlohmann::ordered_json schema = nlohmann::ordered_json::parse(R"({
      "type": "object",
      "properties": {"name": {"type": "string", "maxLength": 8},
                     "mood": {"enum": ["happy", "sad", "sleepy"]},
                     "legs": {"enum": [2, 4]}},
      "required": ["name", "mood", "legs"]})");
  nlohmann::ordered_json body =
      with(chat_body("Tell me about a cat as JSON.", 64), "temperature", 1.0);
  body["n"] = 4;
  body["seed"] = 9;
  body["response_format"] = {{"type", "json_schema"},
                             {"json_schema", {{"name", "cat"}, {"schema", schema}}}};
  const Reply whole = post(port(), "/v1/chat/completions", body);
  ASSERT_EQ(whole.status, 200) << whole.raw;
  const Stream stream = post_stream(port(), "/v1/chat/completions", body);
  ASSERT_EQ(stream.status, 200) << stream.raw;
  const auto compiled = JsonSchema::compile(schema);
  int whole_values = 0;
  for (const json& choice : whole.body["choices"]) {
    const std::string text = choice["message"]["content"];
    SCOPED_TRACE(text);
    SchemaPrefix prefix(*compiled);
    EXPECT_TRUE(prefix.feed(text));
    const std::string finish_reason = choice["finish_reason"];
    if (finish_reason == "stop") {
      EXPECT_TRUE(prefix.complete());
      const auto value = nlohmann::ordered_json::parse(text);
      std::vector<std::string> keys;
      for (const auto& [key, member] : value.items()) keys.push_back(key);
      EXPECT_EQ(keys, (std::vector<std::string>{"name", "mood", "legs"}));
      EXPECT_LE(value["name"].get<std::string>().size(), 8u);
      EXPECT_TRUE(value["legs"] == 2 || value["legs"] == 4);
      ++whole_values;
    }
    const int index = choice["index"];
    EXPECT_EQ(stream.choice_texts.at(index), text);
    EXPECT_EQ(stream.choice_finish_reasons.at(index), finish_reason);
  }
  EXPECT_GE(whole_values, 1);

  body["response_format"]["json_schema"]["schema"]["properties"]["name"]["pattern"] = "^[A-Z]";
  const Reply refused = post(port(), "/v1/chat/completions", body);
  ASSERT_EQ(refused.status, 400) << refused.raw;
  EXPECT_EQ(refused.body["error"]["param"], "response_format.json_schema.schema");
  EXPECT_NE(refused.body["error"]["message"].get<std::string>().find(
                "at #/properties/name: pattern is not supported"),
            std::string::npos)
      << refused.raw;
}

// vLLM's guided_choice and guided_regex (and structured_outputs.choice): every choice is one of
// the texts, or matches the pattern whole, and ends there, streamed or not, on both endpoints; a
// pattern no automaton holds is a 400 naming guided_regex and the place.
TEST_F(ServerE2E, GuidedChoiceAndRegexAnswersAreTheirTextsWhole) {
  const std::vector<std::string> moods = {"happy", "sad", "sleepy"};
  json chat = with(chat_body("How does the cat feel?", 16), "temperature", 1.0);
  chat.update({{"n", 4}, {"seed", 3}, {"guided_choice", moods}});
  json completion = with(completion_body("Tim had a number:", 16), "temperature", 1.0);
  completion.update({{"n", 4}, {"seed", 4}, {"guided_regex", "[0-9]{3}-[a-z]{2,5}"}});
  // Today's vLLM spells guided_choice as structured_outputs.choice.
  json structured = chat;
  structured.erase("guided_choice");
  structured["structured_outputs"] = {{"choice", moods}};
  const std::regex code("[0-9]{3}-[a-z]{2,5}");
  for (const auto& [path, body] :
       {std::pair{"/v1/chat/completions", chat}, std::pair{"/v1/completions", completion},
        std::pair{"/v1/chat/completions", structured}}) {
    SCOPED_TRACE(path);
    const Reply whole = post(port(), path, body);
    ASSERT_EQ(whole.status, 200) << whole.raw;
    const Stream stream = post_stream(port(), path, body);
    ASSERT_EQ(stream.status, 200) << stream.raw;
    ASSERT_EQ(whole.body["choices"].size(), 4u);
    for (const json& choice : whole.body["choices"]) {
      const bool chat_choice = choice.contains("message");
      const std::string text = chat_choice ? choice["message"]["content"] : choice["text"];
      SCOPED_TRACE(text);
      if (chat_choice) {
        EXPECT_NE(std::find(moods.begin(), moods.end(), text), moods.end());
      } else {
        EXPECT_TRUE(std::regex_match(text, code));
      }
      EXPECT_EQ(choice["finish_reason"], "stop");
      const int index = choice["index"];
      EXPECT_EQ(stream.choice_texts.at(index), text);
      EXPECT_EQ(stream.choice_finish_reasons.at(index), "stop");
    }
  }

  completion["guided_regex"] = "[0-9]{3}(?=-)";
  const Reply refused = post(port(), "/v1/completions", completion);
  ASSERT_EQ(refused.status, 400) << refused.raw;
  EXPECT_EQ(refused.body["error"]["param"], "guided_regex");
  EXPECT_NE(refused.body["error"]["message"].get<std::string>().find("at position 8"),
            std::string::npos)
      << refused.raw;
}

// guided_grammar, llama.cpp's grammar and structured_outputs.grammar: greedy and seeded sampled
// answers are texts the grammar derives, whole, streamed or not, on both endpoints; a grammar
// that cannot be held is a 400 naming its parameter and the place.
TEST_F(ServerE2E, GrammarAnswersAreTextsTheGrammarDerives) {
  const std::string grammar =
      "root ::= name \" \" verb \" \" [0-9]{1,2} \".\"\n"
      "name ::= \"Lily\" | \"Tom\" | \"Ben\"\n"
      "verb ::= \"ran\" | \"sat\" | \"ate\"  # one of three\n";
  const auto held = Grammar::from_gbnf(grammar);
  json greedy = with(chat_body("Who went out?", 32), "guided_grammar", grammar);
  json sampled = with(completion_body("Once upon a time", 32), "temperature", 1.0);
  sampled.update({{"n", 3}, {"seed", 5}, {"grammar", grammar}});
  json structured = with(chat_body("Tell me a story.", 32), "temperature", 1.0);
  structured.update({{"n", 2}, {"seed", 6}, {"structured_outputs", {{"grammar", grammar}}}});
  for (const auto& [path, body] :
       {std::pair{"/v1/chat/completions", greedy}, std::pair{"/v1/completions", sampled},
        std::pair{"/v1/chat/completions", structured}}) {
    SCOPED_TRACE(body.dump());
    const Reply whole = post(port(), path, body);
    ASSERT_EQ(whole.status, 200) << whole.raw;
    const Stream stream = post_stream(port(), path, body);
    ASSERT_EQ(stream.status, 200) << stream.raw;
    ASSERT_EQ(whole.body["choices"].size(), size_t(body.value("n", 1)));
    for (const json& choice : whole.body["choices"]) {
      const std::string text =
          choice.contains("message") ? choice["message"]["content"] : choice["text"];
      SCOPED_TRACE(text);
      GrammarPrefix written(*held);
      EXPECT_TRUE(written.feed(text) && written.complete());
      EXPECT_EQ(choice["finish_reason"], "stop");
      const int index = choice["index"];
      EXPECT_EQ(stream.choice_texts.at(index), text);
      EXPECT_EQ(stream.choice_finish_reasons.at(index), "stop");
    }
  }

  sampled["grammar"] = "root ::= \"a\"\nroot ::= [b-";
  const Reply refused = post(port(), "/v1/completions", sampled);
  ASSERT_EQ(refused.status, 400) << refused.raw;
  EXPECT_EQ(refused.body["error"]["param"], "grammar");
  EXPECT_NE(refused.body["error"]["message"].get<std::string>().find("at line 2, column 10"),
            std::string::npos)
      << refused.raw;

  // A grammar that grows past what can be followed once the answer has begun (its second
  // character takes more than the step limit) fails that answer with a 400 naming it, and the
  // next grammar answered on the same threads is followed as if it had never been.
  json too_complex = completion_body("Once upon a time", 20);
  too_complex["guided_grammar"] = "root ::= [a-z ] x{200} \"b\"\nx ::= e{200}\ne ::= \"\" | \"\"";
  for (int again = 0; again < 2; ++again) {
    const Reply failed = post(port(), "/v1/completions", too_complex);
    ASSERT_EQ(failed.status, 400) << failed.raw;
    EXPECT_EQ(failed.body["error"]["param"], "guided_grammar") << failed.raw;
    EXPECT_NE(failed.raw.find("too complex to follow"), std::string::npos) << failed.raw;
  }
  json list = completion_body("Once upon a time", 60);
  list["guided_grammar"] = "root ::= ([a-z ] | [a-z ] [a-z ])* \".\"";
  const Reply after = post(port(), "/v1/completions", list);
  ASSERT_EQ(after.status, 200) << after.raw;
  const std::string text = after.body["choices"][0]["text"];
  if (after.body["choices"][0]["finish_reason"] == "stop")
    EXPECT_TRUE(text.find('.') == text.size() - 1) << text;
  else
    EXPECT_EQ(text.find('.'), std::string::npos) << text;
}

// The streams go to a server of their own whose window closes only when all sixteen wait
// (max_batch), so that however slowly they arrive (a loaded machine, a sanitizer build), one
// prefill takes them all; the solo answers come from the shared server, one at a time.
TEST_F(ServerE2E, SixteenConcurrentStreamsArePrefilledTogetherAndMatchTheirSoloAnswers) {
  constexpr int kRequests = 16;
  std::vector<std::string> solo;
  for (int i = 0; i < kRequests; ++i) {
    const Reply reply = post(port(), "/v1/chat/completions", chat_body(story_prompt(i), 24));
    ASSERT_EQ(reply.status, 200) << reply.raw;
    solo.push_back(chat_text(reply));
  }
  ServerProcess batched(stories_config("scheduler:\n  window_ms: 60000\n  max_batch: 16\n"));
  std::vector<std::future<Stream>> streams;
  for (int i = 0; i < kRequests; ++i)
    streams.push_back(std::async(std::launch::async, [&batched, i] {
      return post_stream(batched.port(), "/v1/chat/completions", chat_body(story_prompt(i), 24));
    }));
  for (int i = 0; i < kRequests; ++i) {
    const Stream stream = streams[i].get();
    ASSERT_EQ(stream.status, 200) << stream.raw;
    EXPECT_TRUE(stream.done);
    EXPECT_EQ(stream.text, solo[i]) << "request " << i;
  }
  EXPECT_EQ(metric(batched.port(), "pipeline_prefill_batches_total"), 1);
  EXPECT_EQ(metric(batched.port(), "pipeline_prefill_batch_size_sum"), kRequests);
}

TEST_F(ServerE2E, ModelsHealthAndMetrics) {
  const Reply models = send(port(), "GET", "/v1/models", "");
  ASSERT_EQ(models.status, 200);
  EXPECT_EQ(models.body["object"], "list");
  ASSERT_EQ(models.body["data"].size(), 1u);
  EXPECT_EQ(models.body["data"][0]["id"], kModel);
  EXPECT_EQ(models.body["data"][0]["object"], "model");
  EXPECT_EQ(models.body["data"][0]["max_model_len"], 512);  // vLLM's: the model's context
  EXPECT_EQ(send(port(), "GET", std::string("/v1/models/") + kModel, "").body["id"], kModel);
  const Reply health = send(port(), "GET", "/health", "");
  EXPECT_EQ(health.status, 200);
  EXPECT_EQ(health.body["status"], "ok");
  EXPECT_EQ(send(port(), "GET", "/no/such/route", "").status, 404);
  // Each answer is counted before it is written, so this read finds both.
  const std::string metrics = send(port(), "GET", "/metrics", "").raw;
  EXPECT_NE(metrics.find("pipeline_kv_blocks_used"), std::string::npos);
  EXPECT_NE(metrics.find("pipeline_http_requests_total{route=\"/health\",status=\"200\"}"),
            std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("pipeline_http_requests_total{route=\"other\",status=\"404\"}"),
            std::string::npos)
      << metrics;
}

// ---- Servers of their own

TEST(ServerE2EContinuousBatching, ANewcomerGetsItsFirstTokenWhileOthersAreStillDecoding) {
  // A short batch window, so that the newcomer's wait is short beside the others' decoding.
  ServerProcess server(stories_config("scheduler:\n  window_ms: 10\n"));
  const int port = server.port();
  // Long runs: ignore_eos keeps them going for max_tokens.
  constexpr int kLong = 4;
  auto long_body = [](int i) {
    json body = completion_body(story_prompt(i), 480);
    body["ignore_eos"] = true;
    return body;
  };
  const std::string newcomer_solo =
      post(port, "/v1/completions", completion_body("The cat sat", 8)).body["choices"][0]["text"];
  std::vector<std::string> long_solo;
  for (int i = 0; i < kLong; ++i)
    long_solo.push_back(post(port, "/v1/completions", long_body(i)).body["choices"][0]["text"]);

  std::vector<std::future<Stream>> running;
  for (int i = 0; i < kLong; ++i)
    running.push_back(std::async(
        std::launch::async, [&, i] { return post_stream(port, "/v1/completions", long_body(i)); }));
  // Once they decode (some tokens are out), the newcomer arrives.
  const auto decoding_deadline = Clock::now() + std::chrono::seconds(20);
  while (metric(port, "pipeline_running_sequences") < kLong && Clock::now() < decoding_deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  const Stream newcomer = post_stream(port, "/v1/completions", completion_body("The cat sat", 8));
  ASSERT_EQ(newcomer.status, 200) << newcomer.raw;
  EXPECT_EQ(newcomer.text, newcomer_solo);

  Clock::time_point first_long_end = Clock::time_point::max();
  for (int i = 0; i < kLong; ++i) {
    const Stream stream = running[i].get();
    ASSERT_EQ(stream.status, 200) << stream.raw;
    EXPECT_EQ(stream.text, long_solo[i]) << "long request " << i;
    first_long_end = std::min(first_long_end, stream.event_times.back());
  }
  EXPECT_LT(newcomer.first_content_time, first_long_end)
      << "the newcomer waited for the running requests to finish";
}

TEST(ServerE2ESmallKvPool, EveryRequestCompletesAsItWouldAlone) {
  // 24 blocks of 16 tokens: one request fits, eight at once do not (preemption and recompute).
  ServerProcess server(stories_config("scheduler:\n  window_ms: 50\n  kv_cache_blocks: 24\n"));
  constexpr int kRequests = 8;
  auto body = [](int i) {
    json b = completion_body(story_prompt(i), 120);
    b["ignore_eos"] = true;
    return b;
  };
  std::vector<std::string> solo;
  for (int i = 0; i < kRequests; ++i) {
    const Reply reply = post(server.port(), "/v1/completions", body(i));
    ASSERT_EQ(reply.status, 200) << reply.raw;
    solo.push_back(reply.body["choices"][0]["text"]);
  }
  std::vector<std::future<Stream>> streams;
  for (int i = 0; i < kRequests; ++i)
    streams.push_back(std::async(std::launch::async, [&, i] {
      return post_stream(server.port(), "/v1/completions", body(i));
    }));
  for (int i = 0; i < kRequests; ++i) {
    const Stream stream = streams[i].get();
    ASSERT_EQ(stream.status, 200) << stream.raw;
    EXPECT_TRUE(stream.done);
    EXPECT_EQ(stream.finish_reason, "length");
    EXPECT_EQ(stream.text, solo[i]) << "request " << i;
  }
  EXPECT_GT(metric(server.port(), "pipeline_preemptions_total"), 0) << "the pool was not tight";
  // 24 blocks of 16 hold 384 tokens, fewer than stories260K's 512: said at the start.
  EXPECT_NE(server.stderr_text().find("warning: the KV cache holds 384 tokens, fewer than the "
                                      "model's context of 512"),
            std::string::npos)
      << server.stderr_text();
  EXPECT_EQ(kv_blocks_used_when_settled(server.port()), 0);
  EXPECT_EQ(server.terminate(std::chrono::seconds(20)), 0) << server.stderr_text();
}

}  // namespace
}  // namespace pipeline
