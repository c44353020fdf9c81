// vLLM's /tokenize and /detokenize without a network: what each answers, and how each refuses.
#include "server/token_endpoints.h"

#include <gtest/gtest.h>

#include <limits>
#include <random>

#include "tests/support/random_bodies.h"
#include "tests/support/shared_data.h"
#include "tests/support/stories_tokenizer.h"

namespace pipeline {
namespace {

using nlohmann::json;

using testing::stories_tokenizer;

ServedModel served_model() {
  ServedModel model;
  model.name = "stories260K";
  model.tokenizer = &stories_tokenizer();
  return model;
}

// A context unlike any default, so that the answer's max_model_len is seen to come from here.
constexpr int kContext = 333;

TokenizeSettings settings(ChatTemplate chat_template = ChatTemplate::Llama2) {
  return {chat_template, kContext};
}

json tokenize(const json& body, ChatTemplate chat_template = ChatTemplate::Llama2) {
  return tokenize_response(body, served_model(), settings(chat_template));
}

json detokenize(const json& body) {
  return detokenize_response(body, served_model());
}

json with(json body, const std::string& key, json value) {
  body[key] = std::move(value);
  return body;
}

json prompt_body(const std::string& prompt) {
  return {{"model", "stories260K"}, {"prompt", prompt}};
}

const std::vector<ChatMessage> kDialog = {{"system", "Be brief."},
                                          {"user", "Tell me a story."},
                                          {"assistant", "Once there was a cat."},
                                          {"user", "And then?"}};

json messages_body() {
  json messages = json::array();
  for (const ChatMessage& m : kDialog)
    messages.push_back({{"role", m.role}, {"content", m.content}});
  return {{"model", "stories260K"}, {"messages", messages}};
}

// A dialog whose last message is the assistant's.
json assistant_last_body() {
  return with(
      messages_body(), "messages",
      {{{"role", "user"}, {"content", "Hi"}}, {{"role", "assistant"}, {"content", "Hello"}}});
}

json ids_body(json tokens) {
  return {{"model", "stories260K"}, {"tokens", std::move(tokens)}};
}

TEST(Tokenize, APromptIsEncodedAsCompletionsEncodeItWithBosFirst) {
  const std::string text = "Once upon a time, a little dog";
  const json answer = tokenize(prompt_body(text));
  const std::vector<int32_t> expected = stories_tokenizer().encode(text, /*add_bos=*/true);
  ASSERT_EQ(expected.front(), stories_tokenizer().bos_id());
  EXPECT_EQ(answer["tokens"], json(expected));
  EXPECT_EQ(answer["count"], expected.size());
  EXPECT_EQ(answer["max_model_len"], kContext);
  EXPECT_FALSE(answer.contains("token_strs")) << answer.dump();
}

TEST(Tokenize, AddSpecialTokensFalseLeavesBosOut) {
  const std::string text = "Once upon a time";
  const json answer = tokenize(with(prompt_body(text), "add_special_tokens", false));
  EXPECT_EQ(answer["tokens"], json(stories_tokenizer().encode(text, /*add_bos=*/false)));
  EXPECT_EQ(answer["count"], answer["tokens"].size());
  EXPECT_EQ(tokenize(with(prompt_body(""), "add_special_tokens", false))["count"], 0);
}

TEST(Tokenize, MessagesGoThroughTheEnginesChatTemplate) {
  const json answer = tokenize(messages_body());
  EXPECT_EQ(answer["tokens"],
            json(apply_chat_template(stories_tokenizer(), ChatTemplate::Llama2, kDialog)));
  EXPECT_EQ(answer["count"], answer["tokens"].size());
  EXPECT_EQ(answer["max_model_len"], kContext);
  // The template is the one the settings name, not always LLaMA-2's.
  EXPECT_EQ(tokenize(messages_body(), ChatTemplate::Raw)["tokens"],
            json(apply_chat_template(stories_tokenizer(), ChatTemplate::Raw, kDialog)));
}

TEST(Tokenize, AddGenerationPromptChangesNothingForOurTemplates) {
  for (const ChatTemplate chat_template : {ChatTemplate::Llama2, ChatTemplate::Raw}) {
    const json tokens = tokenize(messages_body(), chat_template)["tokens"];
    for (const bool add : {true, false})
      EXPECT_EQ(
          tokenize(with(messages_body(), "add_generation_prompt", add), chat_template)["tokens"],
          tokens);
  }
}

// vLLM's continue_final_message: the tokens end inside the assistant's last message.
TEST(Tokenize, ContinueFinalMessageEndsInsideTheAssistantsMessage) {
  json body = with(with(assistant_last_body(), "continue_final_message", true),
                   "add_generation_prompt", false);
  const std::vector<ChatMessage> dialog = {{"user", "Hi"}, {"assistant", "Hello"}};
  for (const ChatTemplate chat_template : {ChatTemplate::Llama2, ChatTemplate::Raw})
    EXPECT_EQ(tokenize(body, chat_template)["tokens"],
              json(apply_chat_template(stories_tokenizer(), chat_template, dialog,
                                       PromptEnd::ContinueFinalMessage)));
}

// As vLLM gives them: each token's piece ("▁the", "<0x0A>", "<s>"), not its text.
TEST(Tokenize, TokenStrsAreEachTokensPieceWhenAskedFor) {
  for (const json& body : {prompt_body("Once upon a time\n"), messages_body()}) {
    const json answer = tokenize(with(body, "return_token_strs", true));
    ASSERT_EQ(answer["token_strs"].size(), answer["tokens"].size()) << answer.dump();
    for (size_t i = 0; i < answer["tokens"].size(); ++i)
      EXPECT_EQ(answer["token_strs"][i],
                stories_tokenizer().piece(answer["tokens"][i].get<int32_t>()))
          << "token " << i;
    EXPECT_EQ(answer["token_strs"][0], "<s>");
    EXPECT_FALSE(tokenize(with(body, "return_token_strs", false)).contains("token_strs"));
  }
}

TEST(Detokenize, IdsAreDecodedByTheTokenizer) {
  const std::string text = "Once upon a time, a little dog ran.";
  const std::vector<int32_t> ids = stories_tokenizer().encode(text, /*add_bos=*/true);
  EXPECT_EQ(detokenize(ids_body(ids)), json({{"prompt", text}}));
  EXPECT_EQ(detokenize(ids_body(json::array()))["prompt"], "");
  // Every id of the vocabulary is taken, the last included.
  const std::vector<int32_t> last = {stories_tokenizer().vocab_size() - 1};
  EXPECT_EQ(detokenize(ids_body(last))["prompt"], stories_tokenizer().decode(last));
}

// A request each endpoint refuses, with the parameter its 400 names.
struct BadInput {
  bool tokenize;  // else detokenize
  json body;
  std::string param;
  std::string message_part;
};

std::vector<BadInput> bad_inputs() {
  json both = messages_body();
  both["prompt"] = "Hi";
  const json neither = {{"model", "stories260K"}};
  const json assistant_last = assistant_last_body();
  const json user = {{"role", "user"}, {"content", "a"}};
  const json system = {{"role", "system"}, {"content", "s"}};
  return {
      {true, json::array({1, 2}), "", "JSON object"},
      {false, "text", "", "JSON object"},
      {true, with(prompt_body("Hi"), "model", 7), "model", "string"},
      {true, with(prompt_body("Hi"), "prompt", 42), "prompt", "string"},
      {true, with(prompt_body("Hi"), "prompt", {"Hi", "there"}), "prompt", "string"},
      {true, both, "prompt", "not both"},
      {true, neither, "prompt", "prompt or a messages"},
      {true, with(prompt_body("Hi"), "add_special_tokens", "yes"), "add_special_tokens", "boolean"},
      {true, with(prompt_body("Hi"), "return_token_strs", 1), "return_token_strs", "boolean"},
      {true, with(messages_body(), "add_special_tokens", true), "add_special_tokens", "BOS"},
      {true, with(messages_body(), "add_generation_prompt", "yes"), "add_generation_prompt",
       "boolean"},
      {true, with(messages_body(), "continue_final_message", true), "continue_final_message",
       "cannot both be true"},
      {true,
       with(with(messages_body(), "continue_final_message", true), "add_generation_prompt", false),
       "messages[3].role",
       "continue_final_message needs the last message to have role 'assistant'"},
      {true, with(messages_body(), "continue_final_message", "yes"), "continue_final_message",
       "boolean"},
      {true, with(messages_body(), "messages", json::array()), "messages", "at least one"},
      {true, with(messages_body(), "messages", "Hi"), "messages", "array"},
      {true, with(messages_body(), "messages", {{{"role", "tool"}, {"content", "x"}}}),
       "messages[0].role", "tool"},
      {true, with(messages_body(), "messages", {{{"role", "user"}, {"content", 5}}}),
       "messages[0].content", "string"},
      {true, assistant_last, "messages[1].role", "last message must have role 'user'"},
      {true, with(messages_body(), "messages", {user, user}), "messages[1].role", "alternate"},
      {true, with(messages_body(), "messages", {system, user, system, user}), "messages[2].role",
       "alternate"},
      {true, with(messages_body(), "messages", {system}), "messages", "followed by a user"},
      {true, with(messages_body(), "chat_template", "{{ messages }}"), "chat_template",
       "configured chat template"},
      {true, with(messages_body(), "chat_template_kwargs", "x"), "chat_template_kwargs", "object"},
      {false, {{"model", "stories260K"}}, "tokens", "you must provide a tokens parameter"},
      {false, ids_body("1 2 3"), "tokens", "array of token ids"},
      {false, ids_body({1, 512}), "tokens", "token id 512 is outside the vocabulary of 512"},
      {false, ids_body({1, -1}), "tokens", "token id -1 is outside the vocabulary"},
      {false, ids_body({1, 2.5}), "tokens", "array of token ids"},
      {false, ids_body({1, "2"}), "tokens", "array of token ids"},
      {false, ids_body({1, {2}}), "tokens", "array of token ids"},
      {false, ids_body({std::numeric_limits<uint64_t>::max()}), "tokens", "array of token ids"},
  };
}

TEST(TokenEndpoints, EachBadInputIsA400NamingItsParameter) {
  for (const BadInput& bad : bad_inputs()) {
    SCOPED_TRACE((bad.tokenize ? "tokenize " : "detokenize ") + bad.body.dump());
    try {
      if (bad.tokenize)
        tokenize(bad.body);
      else
        detokenize(bad.body);
      ADD_FAILURE() << "accepted";
    } catch (const ApiError& e) {
      EXPECT_EQ(e.error().http_status, 400);
      EXPECT_EQ(e.error().type, "invalid_request_error");
      EXPECT_EQ(e.error().param, bad.param);
      EXPECT_NE(e.error().message.find(bad.message_part), std::string::npos) << e.error().message;
    }
  }
}

// As in vLLM, a body that names no model asks for the one served.
TEST(TokenEndpoints, AnAbsentModelIsTheServedOne) {
  json body = prompt_body("Hi");
  body.erase("model");
  EXPECT_EQ(tokenize(body), tokenize(prompt_body("Hi")));
}

TEST(TokenEndpoints, AnotherModelIsA404ModelNotFound) {
  for (const bool tokenizing : {true, false}) {
    try {
      if (tokenizing)
        tokenize(with(prompt_body("Hi"), "model", "gpt-4"));
      else
        detokenize(with(ids_body({1}), "model", "gpt-4"));
      ADD_FAILURE() << "accepted";
    } catch (const ApiError& e) {
      EXPECT_EQ(e.error().http_status, 404);
      EXPECT_EQ(e.error().code, "model_not_found");
      EXPECT_EQ(e.error().param, "model");
    }
  }
}

// A JSON value of a random kind, nested up to `depth`: ids within the vocabulary, beyond it and
// negative among its integers.
json random_value(std::mt19937& rng, int depth) {
  static const testing::RandomJsonShape shape{.min_int = -50,
                                              .max_int = 1049,
                                              .real_span = 1e3,
                                              .max_array = 3,
                                              .keys = {"role", "content", "type", "text"}};
  return testing::random_json(rng, depth, shape);
}

// Whatever the fields hold, a body is answered or refused with an ApiError: never another
// exception (which the server could only answer with a 500).
TEST(TokenEndpoints, RandomFieldValuesAreAnsweredOrRefusedWithAnApiError) {
  const std::vector<std::string> fields = {"model",
                                           "prompt",
                                           "messages",
                                           "tokens",
                                           "add_special_tokens",
                                           "add_generation_prompt",
                                           "continue_final_message",
                                           "return_token_strs"};
  std::mt19937 rng(2025);
  for (int i = 0; i < 20000; ++i) {
    const bool tokenizing = i % 2 == 0;
    json body = tokenizing ? (i % 4 == 0 ? prompt_body("Hi") : messages_body()) : ids_body({1, 2});
    for (int changes = 1 + int(rng() % 3); changes > 0; --changes)
      body[fields[rng() % fields.size()]] = random_value(rng, 2);
    testing::expect_answer_or_api_error(body, [&] {
      if (tokenizing)
        tokenize(body);
      else
        detokenize(body);
    });
  }
}

}  // namespace
}  // namespace pipeline
