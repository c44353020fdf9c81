#include "server/token_endpoints.h"

#include <stdexcept>
#include <string>
#include <vector>

namespace pipeline {

using json = ResponseJson;

namespace {

constexpr const char* kTokenList = "an array of token ids";

void check_object(const JsonBody& body) {
  if (!body.is_object()) throw invalid("", "The request body must be a JSON object.");
}

// A prompt's tokens as /v1/completions encodes a text prompt: BOS first, unless the client asks
// for the text's own tokens alone.
std::vector<int32_t> prompt_tokens(const JsonBody& body, const Tokenizer& tokenizer) {
  const JsonBody& prompt = *find_field(body, "prompt");
  if (!prompt.is_string()) throw wrong_type("prompt", "a string", prompt);
  return tokenizer.encode(prompt.get_ref<const std::string&>(),
                          read_add_special_tokens(body, /*chat=*/false));
}

// A chat's tokens as /v1/chat/completions builds them (the tokenize stage calls the same
// template).
std::vector<int32_t> chat_tokens(const JsonBody& body, const Tokenizer& tokenizer,
                                 ChatTemplate chat_template) {
  read_add_special_tokens(body, /*chat=*/true);
  refuse_other_chat_templates(body);
  const std::vector<ChatMessage> messages = read_messages(body);
  const PromptEnd end = read_prompt_end(body);
  try {
    return apply_chat_template(tokenizer, chat_template, messages, end);
  } catch (const ChatTemplateError& e) {  // a dialog the template cannot express
    throw invalid(e.param(), e.what());
  }
}

// The tokens of the one input a /tokenize body gives.
std::vector<int32_t> input_tokens(const JsonBody& body, const Tokenizer& tokenizer,
                                  ChatTemplate chat_template) {
  const bool has_prompt = find_field(body, "prompt") != nullptr;
  const bool has_messages = find_field(body, "messages") != nullptr;
  if (has_prompt && has_messages)
    throw invalid("prompt", "give either a prompt or messages, not both");
  if (has_prompt) return prompt_tokens(body, tokenizer);
  if (has_messages) return chat_tokens(body, tokenizer, chat_template);
  throw invalid("prompt", "you must provide a prompt or a messages parameter");
}

// Each token's piece as the vocabulary spells it ("▁the", "<0xE6>", "<s>"), as vLLM's
// token_strs give them (convert_ids_to_tokens): a byte piece's text alone would be a broken
// character, and a control token's none.
json token_pieces(const std::vector<int32_t>& tokens, const Tokenizer& tokenizer) {
  json pieces = json::array();
  for (const int32_t token : tokens) pieces.push_back(tokenizer.piece(token));
  return pieces;
}

}  // namespace

json tokenize_response(const JsonBody& body, const ServedModel& model,
                       const TokenizeSettings& settings) {
  check_object(body);
  check_model(body, model);
  const bool with_pieces = read_bool(body, "return_token_strs", false);
  const std::vector<int32_t> tokens = input_tokens(body, *model.tokenizer, settings.chat_template);
  json response = {
      {"count", tokens.size()}, {"max_model_len", settings.max_model_len}, {"tokens", tokens}};
  if (with_pieces) response["token_strs"] = token_pieces(tokens, *model.tokenizer);
  return response;
}

json detokenize_response(const JsonBody& body, const ServedModel& model) {
  check_object(body);
  check_model(body, model);
  const JsonBody* ids = find_field(body, "tokens");
  if (!ids) throw invalid("tokens", "you must provide a tokens parameter");
  if (!ids->is_array()) throw wrong_type("tokens", kTokenList, *ids);
  const std::vector<int32_t> tokens = read_token_ids(*ids, *model.tokenizer, "tokens", kTokenList);
  return {{"prompt", model.tokenizer->decode(tokens)}};
}

}  // namespace pipeline
