// OpenAI's requests without a network (server/openai_request.h, server/guide_fields.h): every
// parameter reaches the Request, null is "not given", and every bad input is a 400 that names
// its parameter, whatever the body holds.
#include "server/openai_request.h"

#include <gtest/gtest.h>

#include <limits>
#include <map>
#include <random>

#include "io/grammar_prefix.h"
#include "io/schema_prefix.h"
#include "io/text_pattern.h"
#include "tests/support/openai_bodies.h"
#include "tests/support/random_bodies.h"
#include "tests/support/shared_data.h"
#include "tests/support/stories_tokenizer.h"

namespace pipeline {
namespace {

using namespace testing;  // pipeline::testing: the bodies and their parsing

TEST(ParseRequest, ChatTakesMessagesAndServerDefaults) {
  json body = chat_body();
  body["messages"] = {{{"role", "system"}, {"content", "Be brief."}},
                      {{"role", "user"}, {"content", "Hi"}}};
  const ParsedRequest parsed = parse_chat(body);
  const Request& request = *parsed.request;
  EXPECT_TRUE(request.chat);
  EXPECT_EQ(request.id.rfind("chatcmpl-", 0), 0u) << request.id;
  EXPECT_GT(request.id.size(), std::string("chatcmpl-").size());
  ASSERT_EQ(request.messages.size(), 2u);
  EXPECT_EQ(request.messages[0].role, "system");
  EXPECT_EQ(request.messages[0].content, "Be brief.");
  EXPECT_EQ(request.messages[1].role, "user");
  EXPECT_EQ(request.max_tokens, 77);
  EXPECT_FLOAT_EQ(request.sampling.temperature, 0.7f);
  EXPECT_FLOAT_EQ(request.sampling.top_p, 0.9f);
  EXPECT_FLOAT_EQ(request.sampling.repetition_penalty, 1.1f);
  EXPECT_FALSE(request.sampling.seed.has_value());
  EXPECT_FALSE(request.sampling.logprobs);
  EXPECT_FALSE(request.ignore_eos);
  EXPECT_TRUE(request.stop.empty());
  EXPECT_EQ(request.sink, nullptr);
  EXPECT_FALSE(parsed.options.stream);
  EXPECT_FALSE(parsed.options.include_usage);
  EXPECT_FALSE(parsed.options.continuous_usage);
}

// As in vLLM, usage on every chunk takes include_usage too; alone it changes nothing.
TEST(ParseRequest, ContinuousUsageStatsTakeIncludeUsage) {
  json body = with(completion_body(), "stream", true);
  body["stream_options"] = {{"include_usage", true}, {"continuous_usage_stats", true}};
  const ResponseOptions both = parse_completion(body).options;
  EXPECT_TRUE(both.include_usage);
  EXPECT_TRUE(both.continuous_usage);
  body["stream_options"] = {{"continuous_usage_stats", true}};
  const ResponseOptions alone = parse_completion(body).options;
  EXPECT_FALSE(alone.include_usage);
  EXPECT_FALSE(alone.continuous_usage);
}

TEST(ParseRequest, IdsAreUnique) {
  EXPECT_NE(parse_chat(chat_body()).request->id, parse_chat(chat_body()).request->id);
}

TEST(ParseRequest, ADeveloperMessageIsKeptForTheTemplate) {
  json body = chat_body();
  const json developer = {{"role", "developer"}, {"content", "Be brief."}};
  body["messages"].insert(body["messages"].begin(), developer);
  const ParsedRequest parsed = parse_chat(body);
  const auto& messages = parsed.request->messages;
  ASSERT_EQ(messages.size(), 2u);
  EXPECT_EQ(messages[0].role, "developer");
  EXPECT_EQ(messages[0].content, "Be brief.");
}

// OpenAI answers a refusal with null content and the refusal's text; a client that sends the
// dialog back gives the model that text as the assistant's turn.
TEST(ParseRequest, AnAssistantsRefusalIsItsText) {
  json body = chat_body();
  body["messages"] = {{{"role", "user"}, {"content", "a"}},
                      {{"role", "assistant"}, {"content", nullptr}, {"refusal", "I cannot."}},
                      {{"role", "user"}, {"content", "b"}}};
  EXPECT_EQ(parse_chat(body).request->messages[1].content, "I cannot.");
  body["messages"][1]["content"] = "Sure.";  // content, where there is some, is the turn
  EXPECT_EQ(parse_chat(body).request->messages[1].content, "Sure.");
  EXPECT_EQ(parse_chat(with(chat_body(), "chat_template_kwargs", json::object()))
                .request->messages[0]
                .content,
            "Hi");
}

TEST(ParseRequest, ChatContentMayBeTextParts) {
  json body = chat_body();
  body["messages"][0]["content"] = {{{"type", "text"}, {"text", "Hello "}},
                                    {{"type", "text"}, {"text", "there"}}};
  EXPECT_EQ(parse_chat(body).request->messages[0].content, "Hello \nthere");  // as vLLM joins
}

TEST(ParseRequest, ContinueFinalMessageEndsThePromptInsideTheLastMessage) {
  EXPECT_EQ(parse_chat(chat_body()).request->prompt_end, PromptEnd::NewAnswer);
  json body = with(chat_body(), "continue_final_message", true);
  body["add_generation_prompt"] = false;
  EXPECT_EQ(parse_chat(body).request->prompt_end, PromptEnd::ContinueFinalMessage);
  EXPECT_EQ(parse_chat(with(body, "continue_final_message", false)).request->prompt_end,
            PromptEnd::NewAnswer);
}

TEST(ParseRequest, TruncatePromptTokensReachesTheRequest) {
  EXPECT_EQ(parse_chat(chat_body()).request->truncate_prompt_tokens, 0);
  EXPECT_EQ(
      parse_chat(with(chat_body(), "truncate_prompt_tokens", 64)).request->truncate_prompt_tokens,
      64);
}

TEST(ParseRequest, CompletionTakesAStringOrAListOfOne) {
  const ParsedRequest parsed = parse_completion(completion_body());
  EXPECT_FALSE(parsed.request->chat);
  EXPECT_EQ(parsed.request->id.rfind("cmpl-", 0), 0u) << parsed.request->id;
  EXPECT_EQ(parsed.request->prompt, "Once upon a time");
  EXPECT_EQ(parse_completion(with(completion_body(), "prompt", {"One"})).request->prompt, "One");
}

TEST(ParseRequest, EveryParameterReachesTheRequest) {
  json body = chat_body();
  body.update({{"max_tokens", 12},
               {"temperature", 0},
               {"top_p", 0.5},
               {"top_k", 40},
               {"min_p", 0.05},
               {"repetition_penalty", 1.3},
               {"presence_penalty", -0.5},
               {"frequency_penalty", 1.5},
               {"repeat_last_n", 32},
               {"seed", 1234},
               {"stop", {"\n", "The end"}},
               {"ignore_eos", true},
               {"logprobs", true},
               {"top_logprobs", 3},
               {"n", 1},
               {"user", "someone"},
               {"some_future_field", {{"x", 1}}},
               {"stream", true},
               {"stream_options", {{"include_usage", true}}}});
  const ParsedRequest parsed = parse_chat(body);
  const Request& request = *parsed.request;
  EXPECT_EQ(request.max_tokens, 12);
  EXPECT_FLOAT_EQ(request.sampling.temperature, 0.0f);
  EXPECT_FLOAT_EQ(request.sampling.top_p, 0.5f);
  EXPECT_EQ(request.sampling.top_k, 40);
  EXPECT_FLOAT_EQ(request.sampling.min_p, 0.05f);
  EXPECT_FLOAT_EQ(request.sampling.repetition_penalty, 1.3f);
  EXPECT_FLOAT_EQ(request.sampling.presence_penalty, -0.5f);
  EXPECT_FLOAT_EQ(request.sampling.frequency_penalty, 1.5f);
  EXPECT_EQ(request.sampling.repeat_last_n, 32);
  EXPECT_EQ(request.sampling.seed, 1234u);
  EXPECT_EQ(request.stop, (std::vector<std::string>{"\n", "The end"}));
  EXPECT_TRUE(request.ignore_eos);
  EXPECT_TRUE(request.sampling.logprobs);
  EXPECT_EQ(request.sampling.top_logprobs, 3);
  EXPECT_TRUE(parsed.options.stream);
  EXPECT_TRUE(parsed.options.include_usage);
}

TEST(ParseRequest, MaxCompletionTokensWinsOverMaxTokens) {
  json body = chat_body();
  body["max_tokens"] = 5;
  body["max_completion_tokens"] = 9;
  EXPECT_EQ(parse_chat(body).request->max_tokens, 9);
}

TEST(ParseRequest, NullMeansNotGiven) {
  json body = chat_body();
  body.update({{"temperature", nullptr},
               {"max_tokens", nullptr},
               {"stop", nullptr},
               {"seed", nullptr},
               {"stream_options", nullptr}});
  const ParsedRequest parsed = parse_chat(body);
  EXPECT_FLOAT_EQ(parsed.request->sampling.temperature, 0.7f);
  EXPECT_EQ(parsed.request->max_tokens, 77);
}

TEST(ParseRequest, SingleStopStringAndNegativeSeed) {
  json body = with(completion_body(), "stop", "\n\n");
  body["seed"] = -1;
  const ParsedRequest parsed = parse_completion(body);
  EXPECT_EQ(parsed.request->stop, std::vector<std::string>{"\n\n"});
  EXPECT_EQ(parsed.request->sampling.seed, ~uint64_t{0});
}

TEST(ParseRequest, CompletionLogprobsIsTheNumberOfAlternatives) {
  const ParsedRequest parsed = parse_completion(with(completion_body(), "logprobs", 2));
  EXPECT_TRUE(parsed.request->sampling.logprobs);
  EXPECT_EQ(parsed.request->sampling.top_logprobs, 2);
  const ParsedRequest zero = parse_completion(with(completion_body(), "logprobs", 0));
  EXPECT_TRUE(zero.request->sampling.logprobs);
  EXPECT_EQ(zero.request->sampling.top_logprobs, 0);
}

TEST(ParseRequest, AnotherModelIsNotFound) {
  const RequestError error =
      rejection(Endpoint::ChatCompletions, with(chat_body(), "model", "gpt-4"));
  EXPECT_EQ(error.http_status, 404);
  EXPECT_EQ(error.code, "model_not_found");
  EXPECT_EQ(error.param, "model");
  EXPECT_NE(error.message.find("gpt-4"), std::string::npos);
}

TEST(ParseRequest, NChoicesAreRequestsOfTheirOwnWithTheirOwnSeeds) {
  const ParsedRequest one = parse_chat(chat_body());
  EXPECT_EQ(one.choices(), 1);
  EXPECT_EQ(choice_requests(one), (std::vector{one.request}));

  const ParsedRequest three = parse_completion(with(with(completion_body(), "n", 3), "seed", 40));
  const auto requests = choice_requests(three);
  ASSERT_EQ(requests.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(requests[i]->id, three.request->id + "-" + std::to_string(i));
    EXPECT_EQ(requests[i]->sampling.seed, 40u + i);
    EXPECT_EQ(requests[i]->prompt, "Once upon a time");
    EXPECT_NE(requests[i], three.request);
  }
  // Unseeded choices draw from the engine's per-sequence seeds.
  for (const auto& request : choice_requests(parse_chat(with(chat_body(), "n", 2))))
    EXPECT_FALSE(request->sampling.seed.has_value());

  // n copies of the prompt fit in what one request may hold.
  const std::string big(kMaxRequestBytes / 4, 'a');
  EXPECT_EQ(parse_completion(with(with(completion_body(), "prompt", big), "n", 4)).choices(), 4);
  const RequestError too_big =
      rejection(Endpoint::Completions, with(with(completion_body(), "prompt", big), "n", 5));
  EXPECT_EQ(too_big.param, "n");
  EXPECT_NE(too_big.message.find("exceeds the 16 MiB a request may hold"), std::string::npos)
      << too_big.message;

  // A list of prompts: prompt p's choice j is choice p * n + j, each seed series from the seed.
  const ParsedRequest listed = parse_completion(
      with(with(with(completion_body(), "prompt", {"A", "B"}), "n", 2), "seed", 7));
  EXPECT_EQ(listed.choices(), 4);
  const auto four = choice_requests(listed);
  ASSERT_EQ(four.size(), 4u);
  const std::vector<std::string> prompts = {"A", "A", "B", "B"};
  const std::vector<uint64_t> seeds = {7, 8, 7, 8};
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(four[i]->prompt, prompts[i]) << i;
    EXPECT_EQ(four[i]->sampling.seed, seeds[i]) << i;
    EXPECT_EQ(four[i]->prompt_index, int(i / 2)) << i;  // so that a refusal names its prompt
  }
  // One prompt, even with n choices, is not a list's prompt.
  for (const auto& request : choice_requests(three)) EXPECT_EQ(request->prompt_index, -1);

  // Prompts of token ids, alone or in a list with text: used as they are, their text decoded.
  const std::vector<int32_t> ids = stories_tokenizer().encode("Once upon a time", true);
  const ParsedRequest by_ids = parse_completion(with(completion_body(), "prompt", ids));
  EXPECT_EQ(by_ids.request->prompt_ids, ids);
  EXPECT_EQ(by_ids.request->prompt, "Once upon a time");
  const ParsedRequest mixed =
      parse_completion(with(completion_body(), "prompt", {json(ids), json("The dog")}));
  const auto two = choice_requests(mixed);
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(two[0]->prompt_ids, ids);
  EXPECT_TRUE(two[1]->prompt_ids.empty());
  EXPECT_EQ(two[1]->prompt, "The dog");
  ServedModel without = served_model();
  without.tokenizer = nullptr;
  EXPECT_THROW(
      parse_openai_request(Endpoint::Completions, with(completion_body(), "prompt", ids), without),
      ApiError);

  // At most what the server's queue holds.
  ServedModel small = served_model();
  small.max_choices = 4;
  const json five = with(chat_body(), "n", 5);
  try {
    parse_openai_request(Endpoint::ChatCompletions, five, small);
    FAIL() << "n beyond max_choices was accepted";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.error().param, "n");
    EXPECT_EQ(e.error().message, "'n' must be between 1 and 4, got 5.");
  }
}

TEST(ParseRequest, MalformedJsonIsRefused) {
  for (const char* text :
       {"{\"model\": ", "not json", "[1, 2]", "\"text\"", "", "{\"a\": 1e400}"}) {
    try {
      parse_json_body(text);
      ADD_FAILURE() << "accepted: " << text;
    } catch (const ApiError& e) {
      EXPECT_EQ(e.error().http_status, 400) << text;
      EXPECT_EQ(e.error().type, "invalid_request_error");
    }
  }
  EXPECT_EQ(parse_json_body(R"({"a": 1})")["a"], 1);
}

// Bodies are read with their objects' members in the order written (a repeated key's last value
// kept, in its first place), as nlohmann's ordered parser reads them.
TEST(ParseRequest, BodiesKeepTheirObjectsOrder) {
  const JsonBody body = parse_json_body(R"({"z": 1, "a": {"y": [1, {"c": 2, "b": 3}], "x": null},
                                            "m": "s", "z": 4})");
  EXPECT_EQ(body.dump(), R"({"z":4,"a":{"y":[1,{"c":2,"b":3}],"x":null},"m":"s"})");
  std::mt19937 rng(3);
  const testing::RandomJsonShape shape{.keys = {"q", "b", "a", "zz", "b"}};
  for (int i = 0; i < 500; ++i) {
    const std::string text =
        testing::random_json(rng, 4, shape).dump(-1, ' ', false, json::error_handler_t::replace);
    EXPECT_EQ(read_json_body(text), JsonBody::parse(text)) << text;
  }
}

// Arrays and objects nest at most 1,000 deep: deeper values cannot be copied or printed without
// overflowing the stack.
TEST(ParseRequest, BodiesNestAtMostAThousandDeep) {
  const auto nested = [](int depth) {
    return "{\"a\": " + std::string(size_t(depth - 1), '[') + std::string(size_t(depth - 1), ']') +
           "}";
  };
  EXPECT_EQ(read_json_body(nested(1000)).dump().size(), nested(1000).size() - 1);
  EXPECT_THROW(read_json_body(nested(1001)), nlohmann::json::other_error);
  EXPECT_THROW(read_json_body(nested(100000)), nlohmann::json::other_error);
  // The 400 says why: the body is JSON, only too deep.
  try {
    parse_json_body(nested(1001));
    ADD_FAILURE() << "a body 1,001 deep was read";
  } catch (const ApiError& e) {
    EXPECT_EQ(std::string(e.what()),
              "The JSON body of your request nests arrays and objects deeper than 1000 levels.");
  }
}

// nlohmann's lexer takes a NUL byte outside a string for the end of the text: a body with one
// after its object was read as that object. A NUL byte is refused wherever it is, and named.
TEST(ParseRequest, ANulByteIsRefusedWhereverItIs) {
  using namespace std::string_literals;
  const auto message_of = [](const std::string& text) {
    try {
      read_json_body(text);
    } catch (const nlohmann::json::parse_error& e) {
      return std::string(e.what());
    }
    return std::string("read");
  };
  const std::string nul = "syntax error while parsing value - unexpected NUL byte";
  EXPECT_NE(message_of("{\"a\": 1}\0{\"b\": 2}"s).find("line 1, column 9: " + nul),
            std::string::npos);
  EXPECT_NE(message_of("{\n\"a\": \0 1}"s).find("line 2, column 6: " + nul), std::string::npos);
  EXPECT_NE(message_of("\0"s).find("column 1: " + nul), std::string::npos);
  // Inside a string nlohmann names it itself.
  EXPECT_NE(message_of("{\"a\": \"x\0\"}"s).find("U+0000 (NUL) must be escaped"),
            std::string::npos);
  EXPECT_THROW(parse_json_body("{\"prompt\": \"x\"}\0junk"s), ApiError);
}

// One bad input per row: the parameter the 400 must name and a word its message must hold.
struct BadInput {
  Endpoint endpoint;
  json body;
  std::string param;
  std::string message_part;
};

std::vector<BadInput> bad_inputs() {
  const auto chat = Endpoint::ChatCompletions;
  const auto completion = Endpoint::Completions;
  json no_messages = chat_body();
  no_messages.erase("messages");
  json no_prompt = completion_body();
  no_prompt.erase("prompt");
  json no_role = chat_body();
  no_role["messages"][0].erase("role");
  json no_content = chat_body();
  no_content["messages"][0].erase("content");
  json image_part = chat_body();
  image_part["messages"][0]["content"] = {{{"type", "image_url"}, {"image_url", "x"}}};
  const json call = {
      {"id", "1"}, {"type", "function"}, {"function", {{"name", "f"}, {"arguments", "{}"}}}};
  json tool_calls = chat_body();
  tool_calls["messages"] = {{{"role", "user"}, {"content", "a"}},
                            {{"role", "assistant"}, {"content", "ok"}, {"tool_calls", {call}}},
                            {{"role", "user"}, {"content", "b"}}};
  json function_call = tool_calls;
  function_call["messages"][1].erase("tool_calls");
  function_call["messages"][1]["function_call"] = call["function"];
  json refusal_not_text = tool_calls;
  refusal_not_text["messages"][1] = {{"role", "assistant"}, {"content", nullptr}, {"refusal", 1}};
  json usage_without_stream = with(chat_body(), "stream_options", {{"include_usage", true}});
  json usage_not_bool = with(chat_body(), "stream", true);
  usage_not_bool["stream_options"] = {{"include_usage", "yes"}};
  json usage_per_chunk_not_bool = with(chat_body(), "stream", true);
  usage_per_chunk_not_bool["stream_options"] = {{"include_usage", true},
                                                {"continuous_usage_stats", 1}};
  return {
      {chat, with(chat_body(), "model", 7), "model", "string"},
      {chat, no_messages, "messages", "messages"},
      {chat, with(chat_body(), "messages", json::array()), "messages", "at least one"},
      {chat, with(chat_body(), "messages", "Hi"), "messages", "array"},
      {chat, with(chat_body(), "messages", {"Hi"}), "messages[0]", "object"},
      {chat, no_role, "messages[0].role", "role"},
      {chat, with(chat_body(), "messages", {{{"role", "tool"}, {"content", "x"}}}),
       "messages[0].role", "tool"},
      {chat, no_content, "messages[0].content", "missing"},
      {chat, with(chat_body(), "messages", {{{"role", "user"}, {"content", 5}}}),
       "messages[0].content", "string"},
      {chat, image_part, "messages[0].content[0]", "text"},
      {chat, tool_calls, "messages[1].tool_calls", "function calling"},
      {chat, function_call, "messages[1].function_call", "function calling"},
      {chat, refusal_not_text, "messages[1].refusal", "string"},
      {completion, no_prompt, "prompt", "prompt"},
      {completion, with(completion_body(), "prompt", json::array()), "prompt",
       "the list of prompts is empty"},
      {completion, with(completion_body(), "prompt", {"a", 7}), "prompt", "list of strings"},
      {completion, with(with(completion_body(), "prompt", {"a", "b", "c"}), "n", 50), "n",
       "n (50) times the 3 prompts makes more than 128 choices"},
      {completion, with(completion_body(), "prompt", {1, 2, 512}), "prompt",
       "token id 512 is outside the vocabulary of 512 tokens"},
      {completion, with(completion_body(), "prompt", {1, -2}), "prompt", "token id -2"},
      {completion, with(completion_body(), "prompt", {1, 2.5}), "prompt", "list of token ids"},
      {completion, with(completion_body(), "prompt", {{1, 2}, json::array()}), "prompt",
       "prompt[1]: a prompt of token ids is empty"},
      {completion, with(completion_body(), "prompt", {"a", {1, 512}}), "prompt",
       "prompt[1]: token id 512 is outside the vocabulary"},
      {completion, with(completion_body(), "prompt", {{1, 2}, 7}), "prompt",
       "prompt[1]: Invalid type for 'prompt'"},
      {completion, with(completion_body(), "prompt", 42), "prompt", "string"},
      {completion, with(completion_body(), "prompt", {nullptr}), "prompt", "but got null instead"},
      {chat, with(chat_body(), "echo", true), "echo", "not supported on chat completions"},
      {completion, with(completion_body(), "echo", "yes"), "echo", "boolean"},
      {completion, with(completion_body(), "max_tokens", 0), "max_tokens", "0 scores the prompt"},
      {completion, with(with(completion_body(), "echo", true), "max_tokens", -1), "max_tokens",
       "between 0"},
      {completion, with(completion_body(), "best_of", 3), "best_of",
       "best_of > n is not supported"},
      {completion, with(with(completion_body(), "n", 2), "best_of", 1), "best_of",
       "best_of must be at least n (2), got 1"},
      {chat, with(chat_body(), "n", 0), "n", "between 1"},
      {chat, with(chat_body(), "n", "1"), "n", "integer"},
      {chat, with(chat_body(), "stream", "true"), "stream", "boolean"},
      {chat, usage_without_stream, "stream_options", "stream is true"},
      {chat, usage_not_bool, "include_usage", "boolean"},
      {chat, usage_per_chunk_not_bool, "continuous_usage_stats", "boolean"},
      {chat, with(chat_body(), "max_tokens", 0), "max_tokens", "between 1"},
      {chat, with(chat_body(), "max_tokens", -3), "max_tokens", "between 1"},
      {chat, with(chat_body(), "max_tokens", 2.5), "max_tokens", "integer"},
      {chat, with(chat_body(), "max_completion_tokens", 0), "max_completion_tokens", "between 1"},
      {chat, with(chat_body(), "max_tokens", 1e12), "max_tokens", "integer"},
      {chat, with(chat_body(), "max_tokens", 10000000000), "max_tokens", "between 1"},
      {chat, with(chat_body(), "temperature", "hot"), "temperature", "number"},
      {chat, with(chat_body(), "temperature", true), "temperature", "number"},
      {chat, with(chat_body(), "temperature", 2.5), "temperature", "between 0 and 2"},
      {chat, with(chat_body(), "temperature", -0.1), "temperature", "between 0 and 2"},
      {chat, with(chat_body(), "top_p", 0), "top_p", "greater than 0"},
      {chat, with(chat_body(), "top_p", 1.5), "top_p", "at most 1"},
      {chat, with(chat_body(), "top_k", -2), "top_k", "between -1"},
      {chat, with(chat_body(), "top_k", 1000000000000), "top_k", "between -1"},
      {chat, with(chat_body(), "top_k", 1.5), "top_k", "integer"},
      {chat, with(chat_body(), "min_p", 2), "min_p", "between 0 and 1"},
      {chat, with(chat_body(), "repetition_penalty", 0), "repetition_penalty", "greater than 0"},
      {chat, with(chat_body(), "presence_penalty", 2.5), "presence_penalty", "between -2 and 2"},
      {chat, with(chat_body(), "frequency_penalty", -3), "frequency_penalty", "between -2 and 2"},
      {chat, with(chat_body(), "repeat_last_n", -2), "repeat_last_n", "-1"},
      {chat, with(chat_body(), "seed", 1.5), "seed", "integer"},
      {chat, with(chat_body(), "seed", "42"), "seed", "integer"},
      {chat, with(chat_body(), "stop", 5), "stop", "string"},
      {chat, with(chat_body(), "stop", {"a", 1}), "stop", "string"},
      {chat, with(chat_body(), "stop", {"a", "b", "c", "d", "e"}), "stop", "at most 4"},
      {chat, with(chat_body(), "stop", ""), "stop", "empty"},
      {chat, with(chat_body(), "continue_final_message", true), "continue_final_message",
       "cannot both be true"},
      {chat, with(chat_body(), "continue_final_message", 1), "continue_final_message", "boolean"},
      {chat, with(chat_body(), "chat_template", "{{ messages }}"), "chat_template",
       "configured chat template"},
      {chat, with(chat_body(), "chat_template_kwargs", 5), "chat_template_kwargs", "object"},
      {chat, with(chat_body(), "truncate_prompt_tokens", 0), "truncate_prompt_tokens", "between 1"},
      {chat, with(chat_body(), "truncate_prompt_tokens", "9"), "truncate_prompt_tokens", "integer"},
      {completion, with(with(completion_body(), "truncate_prompt_tokens", 9), "echo", true),
       "truncate_prompt_tokens", "echo"},
      {chat, with(chat_body(), "add_generation_prompt", "no"), "add_generation_prompt", "boolean"},
      {chat, with(chat_body(), "stop_token_ids", 2), "stop_token_ids", "an array of token ids"},
      {chat, with(chat_body(), "include_stop_str_in_output", 1), "include_stop_str_in_output",
       "a boolean"},
      {chat, with(chat_body(), "stop_token_ids", {2, "x"}), "stop_token_ids", "token ids"},
      {chat, with(chat_body(), "stop_token_ids", {-1}), "stop_token_ids", "not a token id"},
      {completion, with(completion_body(), "min_tokens", -1), "min_tokens", "between 0 and"},
      {completion, with(with(completion_body(), "max_tokens", 4), "min_tokens", 5), "min_tokens",
       "min_tokens (5) must be at most max_tokens (4)"},
      {chat, with(with(chat_body(), "response_format", {{"type", "json_object"}}), "min_tokens", 2),
       "min_tokens", "json_object"},
      {chat,
       with(with(chat_body(), "response_format", {{"type", "json_object"}}), "ignore_eos", true),
       "ignore_eos", "json_object"},
      {chat, with(chat_body(), "ignore_eos", 1), "ignore_eos", "boolean"},
      {chat, with(chat_body(), "logprobs", 3), "logprobs", "boolean"},
      {chat, with(chat_body(), "top_logprobs", 2), "top_logprobs", "requires logprobs"},
      {chat, with(chat_body(), "seed", json::parse("18446744073709551616")), "seed",
       "expected an integer, but got a number beyond 64-bit integers"},
      {completion, with(completion_body(), "max_tokens", 2.5), "max_tokens",
       "expected an integer, but got a number instead"},
      {chat, with(with(chat_body(), "logprobs", true), "top_logprobs", 21), "top_logprobs",
       "between 0 and 20"},
      {completion, with(completion_body(), "logprobs", 21), "logprobs", "between 0 and 20"},
      {completion, with(completion_body(), "logprobs", true), "logprobs", "integer"},
      {chat, with(chat_body(), "logit_bias", "x"), "logit_bias", "an object mapping token ids"},
      {chat, with(chat_body(), "logit_bias", {{"abc", 1}}), "logit_bias", "Invalid key"},
      {chat, with(chat_body(), "logit_bias", {{"-3", 1}}), "logit_bias", "Invalid key"},
      {chat, with(chat_body(), "logit_bias", {{"-0", 1}}), "logit_bias", "Invalid key"},
      {chat, with(chat_body(), "logit_bias", {{"12x", 1}}), "logit_bias", "Invalid key"},
      {chat, with(chat_body(), "logit_bias", {{"99999999999", 1}}), "logit_bias", "Invalid key"},
      {chat, with(chat_body(), "logit_bias", {{"13", "up"}}), "logit_bias", "numbers as biases"},
      {chat, with(chat_body(), "logit_bias", {{"5", 1}, {"05", 2}}), "logit_bias",
       "names token 5 more than once"},
      {completion, with(completion_body(), "logit_bias", {{"13", 101}}), "logit_bias",
       "between -100 and 100"},
      {completion, with(completion_body(), "logit_bias", {{"13", 1e39}}), "logit_bias",
       "between -100 and 100, got inf"},
      {chat, with(chat_body(), "temperature", 1e39), "temperature", "got inf"},
      {completion, with(completion_body(), "suffix", "The end."), "suffix", "not supported"},
      {chat, with(chat_body(), "tools", {{{"type", "function"}}}), "tools", "function calling"},
      {chat, with(chat_body(), "tool_choice", "required"), "tool_choice", "function calling"},
      {chat, with(chat_body(), "functions", {{{"name", "f"}}}), "functions", "function calling"},
      {chat, with(chat_body(), "modalities", {"text", "audio"}), "modalities", "no audio output"},
      {chat, with(chat_body(), "modalities", "text"), "modalities", "no audio output"},
      {chat, with(chat_body(), "audio", {{"voice", "alloy"}, {"format", "wav"}}), "audio",
       "no audio output"},
      {chat, with(chat_body(), "response_format", "json_object"), "response_format",
       "expected an object"},
      {chat, with(chat_body(), "response_format", json::object()), "response_format.type",
       "needs a type"},
      {chat, with(chat_body(), "response_format", {{"type", 1}}), "response_format.type",
       "expected a string"},
      {completion, with(completion_body(), "response_format", {{"type", "json_schema"}}),
       "response_format.json_schema", "needs json_schema"},
      {chat, with(chat_body(), "response_format", {{"type", "json_schema"}, {"json_schema", 1}}),
       "response_format.json_schema", "expected an object"},
      {chat,
       with(chat_body(), "response_format",
            {{"type", "json_schema"}, {"json_schema", {{"name", "answer"}}}}),
       "response_format.json_schema.schema", "needs its schema"},
      {chat,
       with(chat_body(), "response_format",
            {{"type", "json_schema"}, {"json_schema", {{"name", 3}, {"schema", json::object()}}}}),
       "response_format.json_schema.name", "expected a string"},
      {chat,
       with(chat_body(), "response_format",
            {{"type", "json_schema"}, {"json_schema", {{"schema", json::object()}}}}),
       "response_format.json_schema.name", "needs a name"},
      {chat,
       with(chat_body(), "response_format",
            {{"type", "json_schema"},
             {"json_schema", {{"name", "my schema"}, {"schema", json::object()}}}}),
       "response_format.json_schema.name", "1 to 64 characters of a-z"},
      {chat,
       with(chat_body(), "response_format",
            {{"type", "json_schema"},
             {"json_schema", {{"name", std::string(65, 'a')}, {"schema", json::object()}}}}),
       "response_format.json_schema.name", "1 to 64 characters of a-z"},
      {chat,
       with(chat_body(), "response_format",
            {{"type", "json_schema"},
             {"json_schema", {{"name", "x"}, {"strict", "yes"}, {"schema", json::object()}}}}),
       "response_format.json_schema.strict", "expected a boolean"},
      // A misspelt or misplaced member would drop its constraint without a word.
      {chat,
       with(chat_body(), "response_format",
            {{"type", "json_schema"},
             {"json_schema", {{"name", "x"}, {"strcit", true}, {"schema", json::object()}}}}),
       "response_format.json_schema.strcit",
       "response_format.json_schema.strcit is not a field of response_format.json_schema"},
      {chat,
       with(chat_body(), "response_format",
            {{"type", "json_object"}, {"shema", {{"type", "integer"}}}}),
       "response_format.shema", "response_format.shema is not a field of response_format"},
      {completion,
       with(completion_body(), "response_format",
            {{"type", "text"}, {"schema", {{"type", "integer"}}}}),
       "response_format.schema", "response_format.schema is not a field of response_format"},
      {chat,
       with(chat_body(), "response_format",
            {{"type", "json_schema"},
             {"schema", json::object()},
             {"json_schema", {{"name", "x"}, {"schema", json::object()}}}}),
       "response_format.schema", "response_format.schema is not a field of response_format"},
      {completion,
       with(completion_body(), "response_format",
            {{"type", "json_schema"},
             {"json_schema",
              {{"name", "event"},
               {"schema",
                {{"type", "object"},
                 {"properties", {{"when", {{"type", "string"}, {"format", "date"}}}}}}}}}}),
       "response_format.json_schema.schema",
       "the schema in response_format.json_schema.schema at #/properties/when: format is not "
       "supported"},
      {chat,
       with(chat_body(), "response_format",
            {{"type", "json_object"}, {"schema", {{"type", "string"}, {"pattern", "x"}}}}),
       "response_format.schema", "the schema in response_format.schema at #: pattern"},
      {chat, with(chat_body(), "guided_json", 5), "guided_json", "expected a JSON schema"},
      {chat, with(chat_body(), "guided_json", "{\"type\": "), "guided_json", "is not JSON"},
      {chat, with(chat_body(), "guided_json", {{"type", "object"}, {"minProperties", 1}}),
       "guided_json", "the schema in guided_json at #: minProperties is not supported"},
      {chat,
       with(with(chat_body(), "guided_json", {{"type", "object"}}), "response_format",
            {{"type", "json_object"}}),
       "guided_json", "guided_json cannot be combined with response_format: give one guide"},
      {chat, with(with(chat_body(), "guided_json", {{"type", "object"}}), "min_tokens", 1),
       "min_tokens", "guided_json"},
      {chat, with(chat_body(), "guided_choice", json::array()), "guided_choice",
       "guided_choice must hold at least one text"},
      {chat, with(chat_body(), "guided_choice", {"yes", 1}), "guided_choice",
       "expected a non-empty array of strings"},
      {chat, with(chat_body(), "guided_choice", "yes"), "guided_choice",
       "expected a non-empty array of strings"},
      {completion, with(completion_body(), "guided_regex", 5), "guided_regex", "expected a string"},
      {completion, with(completion_body(), "guided_regex", "[0-9]{2,1}"), "guided_regex",
       "guided_regex: a repetition's minimum exceeds its maximum at position 5"},
      {completion, with(completion_body(), "guided_regex", "(?<=a)b"), "guided_regex",
       "lookarounds"},
      {completion, with(with(completion_body(), "guided_regex", "a+"), "guided_choice", {"a"}),
       "guided_choice", "cannot be combined with guided_regex"},
      {chat, with(with(chat_body(), "guided_regex", "a+"), "guided_json", {{"type", "object"}}),
       "guided_regex", "give one guide"},
      {chat,
       with(with(chat_body(), "guided_choice", {"a"}), "response_format",
            {{"type", "json_object"}}),
       "guided_choice", "give one guide"},
      {completion, with(with(completion_body(), "guided_choice", {"a"}), "ignore_eos", true),
       "ignore_eos", "guided_choice"},
      {completion, with(with(completion_body(), "guided_regex", "a+"), "min_tokens", 2),
       "min_tokens", "guided_regex"},
      {chat, with(chat_body(), "structured_outputs", "json"), "structured_outputs",
       "expected an object"},
      {chat, with(chat_body(), "structured_outputs", {{"regex", "a"}, {"bogus", 1}}),
       "structured_outputs.bogus", "structured_outputs.bogus is not a field of structured_outputs"},
      {chat, with(chat_body(), "structured_outputs", {{"json_object", "yes"}}),
       "structured_outputs.json_object", "expected a boolean"},
      {chat, with(chat_body(), "guided_whitespace_pattern", " "), "guided_whitespace_pattern",
       "not supported"},
      {completion, with(completion_body(), "bad_words", "dragon"), "bad_words",
       "expected an array of strings"},
      {chat, with(chat_body(), "bad_words", {"dragon", 3}), "bad_words",
       "expected an array of strings"},
      {chat, with(chat_body(), "bad_words", {"dragon", ""}), "bad_words",
       "bad_words may not hold an empty word, or one of whitespace alone"},
      {completion, with(completion_body(), "bad_words", {" \t\u3000"}), "bad_words",
       "may not hold an empty word"},
      {completion, with(completion_body(), "bad_words", std::vector<std::string>(129, "x")),
       "bad_words", "bad_words holds at most 128 words"},
      {chat, with(chat_body(), "bad_words", {std::string(20000, 'x'), std::string(12769, 'y')}),
       "bad_words", "bad_words holds 32769 bytes, more than 32768"},
      // A second guide is told before the first is compiled, however costly that would be.
      {completion,
       with(with(completion_body(), "guided_regex", "(.?){1000}"), "guided_choice", {"a"}),
       "guided_choice", "guided_choice cannot be combined with guided_regex: give one guide"},
      {completion, with(with(completion_body(), "guided_regex", "(.?){1000}"), "ignore_eos", true),
       "ignore_eos", "ignore_eos cannot be combined with guided_regex"},
      {completion, with(completion_body(), "allowed_token_ids", json::array()), "allowed_token_ids",
       "may not be empty"},
      {completion, with(completion_body(), "allowed_token_ids", 5), "allowed_token_ids",
       "expected an array of token ids"},
      {chat, with(chat_body(), "allowed_token_ids", {1, "2"}), "allowed_token_ids",
       "expected an array of token ids"},
      {chat, with(chat_body(), "allowed_token_ids", {-3}), "allowed_token_ids",
       "token id -3 is not a token id"},
      {chat,
       with(chat_body(), "structured_outputs", {{"grammar", "root ::= \"a\" |"}, {"regex", "a"}}),
       "structured_outputs.grammar", "cannot be combined with structured_outputs.regex"},
      {chat, with(chat_body(), "structured_outputs", {{"grammar", 3}}),
       "structured_outputs.grammar",
       "Invalid type for 'structured_outputs.grammar': expected a string, but got an integer "
       "instead."},
      {chat, with(chat_body(), "structured_outputs", {{"grammar", "root ::= (\"a\""}}),
       "structured_outputs.grammar",
       "structured_outputs.grammar: the group opened here is not closed at line 1, column 10"},
      {chat, with(chat_body(), "structured_outputs", {{"structural_tag", "{}"}}),
       "structured_outputs.structural_tag", "not supported"},
      {chat, with(chat_body(), "structured_outputs", {{"whitespace_pattern", " "}}),
       "structured_outputs.whitespace_pattern", "not supported"},
      {chat, with(chat_body(), "structured_outputs", {{"disable_any_whitespace", true}}),
       "structured_outputs.disable_any_whitespace", "not supported"},
      {chat, with(chat_body(), "structured_outputs", {{"regex", "a("}}), "structured_outputs.regex",
       "structured_outputs.regex: the group opened here"},
      {chat, with(chat_body(), "structured_outputs", {{"json", "{"}}), "structured_outputs.json",
       "structured_outputs.json's text is not JSON"},
      {chat, with(chat_body(), "structured_outputs", {{"choice", {"a"}}, {"regex", "a"}}),
       "structured_outputs.choice", "cannot be combined with structured_outputs.regex"},
      {completion,
       with(with(completion_body(), "guided_choice", {"a"}), "structured_outputs",
            {{"json_object", true}}),
       "structured_outputs.json_object", "cannot be combined with guided_choice"},
      {completion,
       with(with(completion_body(), "structured_outputs", {{"choice", {"a"}}}), "ignore_eos", true),
       "ignore_eos", "structured_outputs"},
      {completion, with(completion_body(), "guided_grammar", ""), "guided_grammar",
       "guided_grammar is empty: it must define a rule root"},
      {chat, with(chat_body(), "grammar", {{"root", "a"}}), "grammar",
       "Invalid type for 'grammar': expected a string, but got an object instead."},
      {completion, with(completion_body(), "grammar", "root ::= x\nx ::= x \"a\""), "grammar",
       "grammar: rule x is left-recursive"},
      {chat, with(chat_body(), "guided_grammar", "root ::= \"a\"\nroot ::= \"b\""),
       "guided_grammar",
       "guided_grammar: rule root is defined twice (first at line 1, column 1) "
       "at line 2, column 1"},
      // A grammar is a guide like any other: one per request, and not with ignore_eos.
      {completion,
       with(with(completion_body(), "guided_grammar", "root ::= \"a\""), "grammar",
            "root ::= \"b\""),
       "grammar", "grammar cannot be combined with guided_grammar: give one guide"},
      {chat,
       with(with(chat_body(), "guided_regex", "a"), "structured_outputs",
            {{"grammar", "root ::= \"b\""}}),
       "structured_outputs.grammar", "cannot be combined with guided_regex"},
      {chat, with(with(chat_body(), "grammar", "root ::= \"a\""), "ignore_eos", true), "ignore_eos",
       "ignore_eos cannot be combined with grammar"},
      {completion,
       with(with(completion_body(), "structured_outputs", {{"grammar", "root ::= \"a\""}}),
            "min_tokens", 1),
       "min_tokens", "structured_outputs.grammar"},
      {chat, with(chat_body(), "response_format", {{"type", "yaml"}}), "response_format.type",
       "unknown response_format type 'yaml'"},
      {completion, with(completion_body(), "top_logprobs", 2), "top_logprobs", "logprobs"},
      // Other servers' fields, which would change the answer, are refused, not ignored.
      {completion, with(completion_body(), "n_predict", 8), "n_predict", "send max_tokens"},
      {chat, with(chat_body(), "repeat_penalty", 1.3), "repeat_penalty", "send repetition_penalty"},
      {completion, with(completion_body(), "n_probs", 3), "n_probs", "send logprobs"},
      {chat, with(chat_body(), "typical_p", 0.5), "typical_p", "typical sampling"},
      {completion, with(completion_body(), "mirostat", 2), "mirostat", "mirostat"},
      {chat, with(chat_body(), "dry_multiplier", 0.8), "dry_multiplier", "DRY"},
      {chat, with(chat_body(), "xtc_probability", "0.5"), "xtc_probability", "XTC"},
      {chat, with(chat_body(), "top_n_sigma", 1), "top_n_sigma", "not supported"},
      {chat, with(chat_body(), "samplers", {"top_k"}), "samplers", "order is fixed"},
      {chat, with(chat_body(), "lora", {{{"id", 0}, {"scale", 1}}}), "lora", "LoRA"},
      {completion, with(completion_body(), "use_beam_search", true), "use_beam_search",
       "beam search"},
      {chat, with(with(chat_body(), "penalize_nl", false), "presence_penalty", 1.0), "penalize_nl",
       "a newline as any other token"},
      {completion, with(completion_body(), "prompt_logprobs", 1), "prompt_logprobs", "echo"},
      {chat, with(chat_body(), "return_tokens_as_token_ids", true), "return_tokens_as_token_ids",
       "by text"},
      {chat, with(chat_body(), "logits_processors", {"x"}), "logits_processors", "processors"},
      {chat, with(chat_body(), "min_keep", 2), "min_keep", "at least one token"},
      {chat, with(chat_body(), "priority", 3), "priority", "scheduler.policy fcfs"},
      {chat, with(chat_body(), "add_special_tokens", true), "add_special_tokens", "places BOS"},
      {completion, with(completion_body(), "priority", -1), "priority", "must be 0"},
      {chat, with(chat_body(), "priority", 1.5), "priority", "integer"},
  };
}

// As a request's text arrives: a non-negative number parses as unsigned, which the range checks
// must see as the number it is.
TEST(ParseRequest, RangesHoldForNumbersParsedFromText) {
  for (const char* field : {"max_tokens", "n"}) {
    const json body = parse_json_body(R"({"model": "stories260K", "prompt": "a", ")" +
                                      std::string(field) + R"(": 0})");
    const RequestError error = rejection(Endpoint::Completions, body);
    EXPECT_EQ(error.http_status, 400) << field;
    EXPECT_EQ(error.param, field);
  }
  const json huge = parse_json_body(
      R"({"model": "stories260K", "prompt": "a", "max_tokens": 18446744073709551615})");
  EXPECT_EQ(rejection(Endpoint::Completions, huge).param, "max_tokens");
  const json ok = parse_json_body(R"({"model": "stories260K", "prompt": "a", "max_tokens": 3})");
  EXPECT_EQ(parse_completion(ok).request->max_tokens, 3);
}

// As in vLLM, a request that names no model asks for the one served.
TEST(ParseRequest, AbsentModelIsTheServedOne) {
  json chat = chat_body();
  chat.erase("model");
  EXPECT_NO_THROW(parse_chat(chat));
  EXPECT_NO_THROW(parse_completion(with(completion_body(), "model", nullptr)));
}

// vLLM's add_special_tokens: BOS before a text prompt unless false; false (its default) for chat.
TEST(ParseRequest, AddSpecialTokensSaysWhetherATextPromptGetsBos) {
  EXPECT_TRUE(parse_completion(completion_body()).request->add_bos);
  EXPECT_FALSE(
      parse_completion(with(completion_body(), "add_special_tokens", false)).request->add_bos);
  EXPECT_FALSE(parse_chat(with(chat_body(), "add_special_tokens", false)).request->add_bos);
  EXPECT_FALSE(parse_chat(chat_body()).request->add_bos);
}

// vLLM's priority: 0 (or absent) on any server, any integer on one scheduling by priority.
TEST(ParseRequest, PriorityIsReadWhereTheServerSchedulesByIt) {
  EXPECT_EQ(parse_chat(with(chat_body(), "priority", 0)).request->priority, 0);
  ServedModel by_priority = served_model();
  by_priority.priority_policy = true;
  for (int priority : {-7, 0, 12}) {
    const auto parsed = parse_openai_request(
        Endpoint::Completions, with(completion_body(), "priority", priority), by_priority);
    EXPECT_EQ(parsed.request->priority, priority);
  }
  EXPECT_EQ(
      parse_openai_request(Endpoint::ChatCompletions, chat_body(), by_priority).request->priority,
      0);
}

TEST(ParseRequest, LogitBiasMapsTokenIdsToBiases) {
  const auto request =
      parse_completion(with(completion_body(), "logit_bias", {{"13", -100}, {"7", 2.5}})).request;
  std::map<int32_t, float> biases;
  for (const LogitBias& b : request->sampling.logit_bias) biases[b.token] = b.bias;
  EXPECT_EQ(biases, (std::map<int32_t, float>{{7, 2.5f}, {13, -100.0f}}));
  EXPECT_TRUE(
      parse_chat(with(chat_body(), "logit_bias", nullptr)).request->sampling.logit_bias.empty());
  EXPECT_TRUE(parse_chat(with(chat_body(), "logit_bias", json::array()))
                  .request->sampling.logit_bias.empty());
  // best_of equal to n is n alone.
  EXPECT_EQ(parse_completion(with(with(completion_body(), "n", 2), "best_of", 2)).choices(), 2);
}

// The OpenAI fields this server does not implement pass at their neutral values, and -1 turns
// top_k off as vLLM spells it.
TEST(ParseRequest, UnsupportedFieldsPassAtTheirNeutralValues) {
  json body = chat_body();
  body.update({{"logit_bias", json::object()},
               {"tools", json::array()},
               {"tool_choice", "none"},
               {"modalities", {"text"}},
               {"response_format", {{"type", "text"}}},
               {"top_k", -1}});
  EXPECT_EQ(parse_chat(body).request->sampling.top_k, -1);
  EXPECT_NO_THROW(parse_completion(with(completion_body(), "suffix", "")));
  for (const json& neutral : {json(""), json::object(), json::array()})
    EXPECT_NO_THROW(parse_chat(with(chat_body(), "chat_template", neutral))) << neutral;
  // So do other servers' sampling fields at their "off" values, and what tunes them while off.
  json foreign = completion_body();
  foreign.update({{"typical_p", 1.0},
                  {"mirostat", 0},
                  {"mirostat_tau", 5.0},
                  {"repeat_penalty", 1.0},
                  {"n_probs", 0},
                  {"dry_multiplier", 0.0},
                  {"dry_base", 1.75},
                  {"xtc_probability", 0},
                  {"top_n_sigma", -1},
                  {"penalize_nl", false},  // no penalty: the served model's 1.1 is set aside
                  {"repetition_penalty", 1.0},
                  {"tfs_z", 2.0},
                  {"dynatemp_range", -0.5},
                  {"min_keep", 1},
                  {"n_indent", 0},
                  {"return_tokens", false},
                  {"return_tokens_as_token_ids", false},
                  {"lora", json::array()},
                  {"use_beam_search", false},
                  {"length_penalty", 1.0},
                  {"cache_prompt", true}});
  EXPECT_NO_THROW(parse_completion(foreign));
  // A newline weighed as any other token is llama.cpp's penalize_nl true, whatever the penalties.
  foreign.update({{"penalize_nl", true}, {"top_n_sigma", 0}, {"repetition_penalty", 1.3}});
  EXPECT_NO_THROW(parse_completion(foreign));
}

// vLLM's allowed_token_ids: read as given; null or absent allows every token.
TEST(ParseRequest, AllowedTokenIdsAreRead) {
  EXPECT_EQ(parse_completion(with(completion_body(), "allowed_token_ids", {7, 3, 7}))
                .request->sampling.allowed_tokens,
            (std::vector<int32_t>{7, 3, 7}));
  EXPECT_TRUE(parse_chat(with(chat_body(), "allowed_token_ids", nullptr))
                  .request->sampling.allowed_tokens.empty());
  EXPECT_TRUE(parse_chat(chat_body()).request->sampling.allowed_tokens.empty());
}

// vLLM's bad_words: read as written (the tokenize stage strips and encodes them); null, an
// empty array or absent bans nothing; 128 words of 32 KiB together pass.
TEST(ParseRequest, BadWordsAreRead) {
  EXPECT_EQ(parse_completion(with(completion_body(), "bad_words", {"dragon", " the cat"}))
                .request->bad_words,
            (std::vector<std::string>{"dragon", " the cat"}));
  EXPECT_TRUE(parse_chat(with(chat_body(), "bad_words", nullptr)).request->bad_words.empty());
  EXPECT_TRUE(parse_chat(with(chat_body(), "bad_words", json::array())).request->bad_words.empty());
  EXPECT_TRUE(parse_chat(chat_body()).request->bad_words.empty());
  const std::vector<std::string> most(128, std::string(256, 'w'));
  EXPECT_EQ(parse_chat(with(chat_body(), "bad_words", most)).request->bad_words, most);
}

// vLLM's stop_token_ids and min_tokens.
TEST(ParseRequest, StopTokenIdsAndMinTokensAreRead) {
  json body = with(with(completion_body(), "stop_token_ids", {13, 2}), "min_tokens", 3);
  body["max_tokens"] = 3;
  const auto request = parse_completion(body).request;
  EXPECT_EQ(request->stop_token_ids, (std::vector<int32_t>{13, 2}));
  EXPECT_FALSE(request->include_stop_str_in_output);
  EXPECT_TRUE(parse_chat(with(chat_body(), "include_stop_str_in_output", true))
                  .request->include_stop_str_in_output);
  EXPECT_EQ(request->sampling.min_tokens, 3);
  EXPECT_EQ(parse_chat(chat_body()).request->sampling.min_tokens, 0);
  EXPECT_TRUE(parse_chat(chat_body()).request->stop_token_ids.empty());
}

// response_format json_object and json_schema turn JSON mode on, for both endpoints; text
// leaves it off.
TEST(ParseRequest, ResponseFormatJsonObjectAsksForJsonMode) {
  EXPECT_EQ(parse_chat(with(chat_body(), "response_format", {{"type", "json_object"}}))
                .request->json_schema,
            JsonSchema::any_object());
  EXPECT_EQ(parse_completion(with(completion_body(), "response_format", {{"type", "json_object"}}))
                .request->json_schema,
            JsonSchema::any_object());
  EXPECT_FALSE(
      parse_chat(with(chat_body(), "response_format", {{"type", "text"}})).request->json_schema);
  EXPECT_FALSE(parse_chat(chat_body()).request->json_schema);
}

// llama.cpp's response_format {"type": "json_object", "schema": ...} and vLLM's guided_json (a
// schema, or its text) hold the answer to their schema too.
TEST(ParseRequest, LlamaCppsSchemaAndVllmsGuidedJsonAskForTheirSchema) {
  const json schema = {{"type", "array"}, {"items", {{"type", "integer"}}}};
  const std::vector<json> bodies = {
      with(chat_body(), "response_format", {{"type", "json_object"}, {"schema", schema}}),
      with(chat_body(), "guided_json", schema),
      with(completion_body(), "guided_json", schema.dump()),
      with(completion_body(), "json_schema", schema),  // llama.cpp's own field
  };
  for (const json& body : bodies) {
    SCOPED_TRACE(body.dump());
    const auto parsed = body.contains("messages") ? parse_chat(body) : parse_completion(body);
    ASSERT_TRUE(parsed.request->json_schema);
    EXPECT_TRUE(SchemaPrefix(*parsed.request->json_schema).feed("[1,2]"));
    EXPECT_FALSE(SchemaPrefix(*parsed.request->json_schema).feed("{"));
  }
}

// vLLM's guided_regex and guided_choice hold the answer to their texts, on both endpoints; null
// is not given.
TEST(ParseRequest, GuidedRegexAndGuidedChoiceAskForTheirTexts) {
  const auto regex =
      parse_completion(with(completion_body(), "guided_regex", "\\d{3}-[a-z]+")).request;
  ASSERT_TRUE(regex->text_pattern);
  EXPECT_FALSE(regex->json_schema);
  EXPECT_TRUE(PatternPrefix(*regex->text_pattern).feed("123-abc"));
  EXPECT_FALSE(PatternPrefix(*regex->text_pattern).feed("12a"));
  const auto choice = parse_chat(with(chat_body(), "guided_choice", {"cat", "dog"})).request;
  ASSERT_TRUE(choice->text_pattern);
  PatternPrefix dog(*choice->text_pattern);
  EXPECT_TRUE(dog.feed("dog") && dog.complete());
  EXPECT_FALSE(PatternPrefix(*choice->text_pattern).feed("cow"));
  EXPECT_FALSE(parse_chat(with(chat_body(), "guided_regex", nullptr)).request->text_pattern);
  EXPECT_FALSE(parse_chat(chat_body()).request->text_pattern);
}

// vLLM's guided_grammar and structured_outputs.grammar and llama.cpp's grammar hold the answer
// to a GBNF grammar's texts, on both endpoints; null is not given.
TEST(ParseRequest, GrammarFieldsAskForTheirGrammar) {
  const std::string grammar = "root ::= item (\", \" item)*\nitem ::= [a-z]+";
  const std::vector<json> bodies = {
      with(completion_body(), "guided_grammar", grammar),
      with(chat_body(), "guided_grammar", grammar),
      with(completion_body(), "grammar", grammar),
      with(chat_body(), "grammar", grammar),
      with(completion_body(), "structured_outputs", {{"grammar", grammar}}),
      with(chat_body(), "structured_outputs", {{"grammar", grammar}, {"regex", nullptr}}),
  };
  for (const json& body : bodies) {
    SCOPED_TRACE(body.dump());
    const auto parsed = body.contains("messages") ? parse_chat(body) : parse_completion(body);
    ASSERT_TRUE(parsed.request->grammar);
    EXPECT_FALSE(parsed.request->text_pattern);
    EXPECT_FALSE(parsed.request->json_schema);
    GrammarPrefix list(*parsed.request->grammar);
    EXPECT_TRUE(list.feed("eggs, ham") && list.complete());
    EXPECT_FALSE(GrammarPrefix(*parsed.request->grammar).feed("eggs,ham"));
  }
  EXPECT_FALSE(parse_chat(with(chat_body(), "grammar", nullptr)).request->grammar);
  // llama.cpp reads an empty grammar as none.
  EXPECT_FALSE(parse_chat(with(chat_body(), "grammar", "")).request->grammar);
  EXPECT_FALSE(parse_chat(chat_body()).request->grammar);
}

// vLLM's structured_outputs asks for the same guides: json (a schema or its text), json_object,
// regex and choice; disable_fallback and the false options change nothing.
TEST(ParseRequest, StructuredOutputsAskForTheirGuides) {
  const json schema = {{"type", "array"}, {"items", {{"type", "integer"}}}};
  for (const json& value : {json(schema), json(schema.dump())}) {
    const auto request =
        parse_chat(with(chat_body(), "structured_outputs", {{"json", value}})).request;
    ASSERT_TRUE(request->json_schema);
    EXPECT_TRUE(SchemaPrefix(*request->json_schema).feed("[1,2]"));
    EXPECT_FALSE(request->text_pattern);
  }
  EXPECT_EQ(parse_completion(with(completion_body(), "structured_outputs",
                                  {{"json_object", true}, {"disable_fallback", true}}))
                .request->json_schema,
            JsonSchema::any_object());
  const auto regex =
      parse_completion(
          with(completion_body(), "structured_outputs",
               {{"regex", "[0-9]+"}, {"disable_any_whitespace", false}, {"json_object", false}}))
          .request;
  ASSERT_TRUE(regex->text_pattern);
  EXPECT_FALSE(regex->json_schema);
  EXPECT_TRUE(PatternPrefix(*regex->text_pattern).feed("42"));
  const auto choice =
      parse_chat(with(chat_body(), "structured_outputs", {{"choice", {"left", "right"}}})).request;
  ASSERT_TRUE(choice->text_pattern);
  EXPECT_FALSE(PatternPrefix(*choice->text_pattern).feed("up"));
  EXPECT_FALSE(
      parse_chat(with(chat_body(), "structured_outputs", json::object())).request->text_pattern);
}

// A json_schema's properties are written in the order the request body lists them, not sorted:
// the body is read keeping its objects' order.
TEST(ParseRequest, ResponseFormatJsonSchemaKeepsThePropertiesInTheBodysOrder) {
  const JsonBody body = parse_json_body(R"({
      "model": "stories260K", "messages": [{"role": "user", "content": "Hi"}],
      "response_format": {"type": "json_schema", "json_schema": {"name": "pair", "strict": true,
          "schema": {"type": "object", "properties": {"b": {"type": "integer"},
                                                      "a": {"type": "integer"}},
                     "required": ["b", "a"]}}}})");
  for (const Endpoint endpoint : {Endpoint::ChatCompletions, Endpoint::Completions}) {
    JsonBody request_body = body;
    if (endpoint == Endpoint::Completions) {
      request_body.erase("messages");
      request_body["prompt"] = "Hi";
    }
    const auto schema =
        parse_openai_request(endpoint, request_body, served_model()).request->json_schema;
    ASSERT_TRUE(schema);
    EXPECT_TRUE(SchemaPrefix(*schema).feed(R"({"b":1,"a":2})"));
    EXPECT_FALSE(SchemaPrefix(*schema).feed(R"({"a")"));
  }
}

// A JSON value of a random kind, nested up to `depth`, with the keys of request fields.
json random_value(std::mt19937& rng, int depth) {
  static const testing::RandomJsonShape shape{
      .keys = {"role", "content", "type", "text", "include_usage", "continuous_usage_stats"}};
  return testing::random_json(rng, depth, shape);
}

// Whatever the fields hold, a body is accepted or refused with an ApiError: never another
// exception (which the server could only answer with a 500).
TEST(ParseRequest, RandomFieldValuesAreAcceptedOrRefusedWithAnApiError) {
  const std::vector<std::string> fields = {"model",
                                           "messages",
                                           "prompt",
                                           "max_tokens",
                                           "max_completion_tokens",
                                           "temperature",
                                           "top_p",
                                           "top_k",
                                           "min_p",
                                           "repetition_penalty",
                                           "repeat_last_n",
                                           "presence_penalty",
                                           "frequency_penalty",
                                           "seed",
                                           "stop",
                                           "stream",
                                           "stream_options",
                                           "logprobs",
                                           "top_logprobs",
                                           "n",
                                           "best_of",
                                           "echo",
                                           "ignore_eos",
                                           "logit_bias",
                                           "suffix",
                                           "tools",
                                           "tool_choice",
                                           "functions",
                                           "function_call",
                                           "response_format",
                                           "stop_token_ids",
                                           "min_tokens",
                                           "include_stop_str_in_output",
                                           "user"};
  std::mt19937 rng(2024);
  for (int i = 0; i < 20000; ++i) {
    const bool chat = i % 2 == 0;
    json body = chat ? chat_body() : completion_body();
    for (int changes = 1 + int(rng() % 3); changes > 0; --changes) {
      const std::string& field = fields[rng() % fields.size()];
      body[field] = random_value(rng, 2);
    }
    if (chat && rng() % 4 == 0) body["messages"] = json::array({random_value(rng, 2)});
    testing::expect_answer_or_api_error(body, [&] {
      parse_openai_request(chat ? Endpoint::ChatCompletions : Endpoint::Completions, body,
                           served_model());
    });
  }
}

TEST(ParseRequest, EachBadInputIsA400NamingItsParameter) {
  for (const BadInput& bad : bad_inputs()) {
    SCOPED_TRACE(bad.body.dump());
    const RequestError error = rejection(bad.endpoint, bad.body);
    EXPECT_EQ(error.http_status, 400);
    EXPECT_EQ(error.type, "invalid_request_error");
    EXPECT_EQ(error.param, bad.param);
    EXPECT_NE(error.message.find(bad.message_part), std::string::npos) << error.message;
  }
}

// A max_tokens the client names is held to (tokenize refuses a prompt that leaves it no room);
// the server's default is capped to the room left.
TEST(ParseRequest, MaxTokensIsGivenOnlyWhenTheClientNamesIt) {
  EXPECT_EQ(parse_completion(completion_body()).request->max_tokens_param, "");
  EXPECT_EQ(
      parse_completion(with(completion_body(), "max_tokens", nullptr)).request->max_tokens_param,
      "");
  EXPECT_EQ(parse_completion(with(completion_body(), "max_tokens", 8)).request->max_tokens_param,
            "max_tokens");
  EXPECT_EQ(parse_chat(with(chat_body(), "max_completion_tokens", 8)).request->max_tokens_param,
            "max_completion_tokens");
  EXPECT_EQ(parse_chat(chat_body()).request->max_tokens_param, "");
}

TEST(ParseRequest, EchoScoresThePromptOnlyWithLogprobsAndAllowsNoNewTokens) {
  const ParsedRequest plain = parse_completion(with(completion_body(), "echo", true));
  EXPECT_TRUE(plain.options.echo);
  EXPECT_FALSE(plain.request->prompt_logprobs);
  EXPECT_FALSE(plain.request->prompt_only);
  const ParsedRequest scored =
      parse_completion(with(with(completion_body(), "echo", true), "logprobs", 1));
  EXPECT_TRUE(scored.request->prompt_logprobs);
  const ParsedRequest prompt_only =
      parse_completion(with(with(completion_body(), "echo", true), "max_tokens", 0));
  EXPECT_TRUE(prompt_only.request->prompt_only);
  EXPECT_EQ(prompt_only.request->max_tokens, 1);  // one token is generated, and not shown
  EXPECT_FALSE(parse_completion(completion_body()).options.echo);
}

}  // namespace
}  // namespace pipeline
