#include "server/openai_response.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <variant>

namespace pipeline {

using json = ResponseJson;

const char* answer_object(bool chat) {
  return chat ? "chat.completion" : "text_completion";
}

json error_body(const RequestError& error) {
  auto or_null = [](const std::string& s) { return s.empty() ? json() : json(s); };
  return {{"error",
           {{"message", error.message},
            {"type", error.type},
            {"param", or_null(error.param)},
            {"code", or_null(error.code)}}}};
}

std::string to_json_text(const json& value) {
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string sse_event(const json& payload) {
  return "data: " + to_json_text(payload) + "\n\n";
}

namespace {

// What the usage of a call's choices adds up to: each prompt once (its cached tokens the least
// any of its choices found: what the cache held before the call), every choice's tokens.
Completion total_usage(std::span<const Completion> choices, int per_prompt) {
  Completion total;
  for (size_t i = 0; i < choices.size(); ++i) {
    if (i % size_t(per_prompt) == 0) {
      total.prompt_tokens += choices[i].prompt_tokens;
      // What the cache held before the call: the least any of the prompt's choices found (the
      // others may have found what the first to run had just computed).
      int cached = choices[i].cached_tokens;
      for (size_t j = i; j < std::min(choices.size(), i + size_t(per_prompt)); ++j)
        cached = std::min(cached, choices[j].cached_tokens);
      total.cached_tokens += cached;
    }
    total.completion_tokens += choices[i].completion_tokens;
  }
  return total;
}

}  // namespace

namespace {

// OpenAI reports an impossible probability as -9999 rather than a non-JSON -infinity.
double json_logprob(float logprob) {
  return std::isfinite(logprob) ? logprob : -9999.0;
}

// The characters of well-formed UTF-8 text (a prompt), as OpenAI's text_offset counts them
// (Python's len): every byte but a continuation byte.
size_t characters(std::string_view text) {
  return size_t(
      std::count_if(text.begin(), text.end(), [](char c) { return !is_continuation_byte(c); }));
}

json utf8_bytes(const std::string& text) {
  json bytes = json::array();
  for (unsigned char c : text) bytes.push_back(int(c));
  return bytes;
}

// Choice i's prompt (a completions call's; the request's own when it lists none).
const std::string& prompt_of(const ParsedRequest& parsed, int choice) {
  if (parsed.prompts.empty()) return parsed.request->prompt;
  return parsed.prompts.at(size_t(choice / parsed.per_prompt));
}

// vLLM's stop_reason: the stop string or stop token id that ended the choice, else null.
json stop_reason_json(const StopReason& reason) {
  if (const auto* stop = std::get_if<std::string>(&reason)) return *stop;
  if (const auto* token = std::get_if<int32_t>(&reason)) return *token;
  return nullptr;
}

}  // namespace

ResponseBuilder::ResponseBuilder(const ParsedRequest& parsed, std::string model,
                                 TokenTextFn token_text)
    : id_(parsed.request->id),
      chat_(parsed.request->chat),
      logprobs_(parsed.request->sampling.logprobs),
      include_usage_(parsed.options.include_usage),
      continuous_usage_(parsed.options.continuous_usage),
      prompt_only_(parsed.request->prompt_only),
      created_(std::chrono::duration_cast<std::chrono::seconds>(
                   std::chrono::system_clock::now().time_since_epoch())
                   .count()),
      model_(std::move(model)),
      token_text_(std::move(token_text)),
      per_prompt_(parsed.per_prompt),
      prompt_counts_(size_t(parsed.choices() / parsed.per_prompt)) {
  // Completions logprobs count text offsets in the prompt followed by the answer; an echoed
  // prompt's own tokens start at 0.
  for (int i = 0; i < parsed.choices(); ++i) {
    ChoiceText choice;
    if (!chat_) {
      choice.answer_offsets = CharacterOffsets(characters(prompt_of(parsed, i)));
      // Only an echo needs the text (n choices of a long prompt would otherwise copy it n times).
      if (parsed.options.echo) choice.prompt = prompt_of(parsed, i);
      choice.echo_due = parsed.options.echo;
    }
    choices_.push_back(std::move(choice));
  }
}

json ResponseBuilder::chunk_envelope() const {
  return {{"id", id_},
          {"object", chat_ ? "chat.completion.chunk" : "text_completion"},
          {"created", created_},
          {"model", model_},
          {"choices", json::array()}};
}

json ResponseBuilder::choice_chunk(json entry, int choice) const {
  json chunk = chunk_envelope();
  chunk["choices"].push_back(std::move(entry));
  // With include_usage a choice's chunk carries "usage": null, or with continuous usage the
  // choice's so far (the stream's last chunk, usage_chunk(), the call's).
  if (continuous_usage_)
    chunk["usage"] = usage_so_far(choice);
  else if (include_usage_)
    chunk["usage"] = nullptr;
  return chunk;
}

json ResponseBuilder::role_chunk(int choice) const {
  return choice_chunk({{"index", choice},
                       {"delta", {{"role", "assistant"}, {"content", ""}}},
                       {"logprobs", nullptr},
                       {"finish_reason", nullptr}},
                      choice);
}

void ResponseBuilder::count_prompt(const TokenCounts& counts, int choice) {
  PromptCounts& prompt = prompt_counts_.at(size_t(choice / per_prompt_));
  prompt.tokens = counts.prompt_tokens;
  // The last chunk counts what the cache held before the call: the least any choice found.
  prompt.cached = std::min(prompt.cached.value_or(counts.cached_tokens), counts.cached_tokens);
}

void ResponseBuilder::count(const TokenCounts& counts, int choice) {
  count_prompt(counts, choice);
  choices_.at(size_t(choice)).completion_tokens = counts.completion_tokens;
}

json ResponseBuilder::usage_so_far(int choice) const {
  const PromptCounts& prompt = prompt_counts_.at(size_t(choice / per_prompt_));
  return usage_json(
      {prompt.tokens, choices_.at(size_t(choice)).completion_tokens, prompt.cached.value_or(0)});
}

bool ResponseBuilder::shows(const Delta& delta, int choice) const {
  if (choices_.at(size_t(choice)).echo_due || !delta.prompt.empty()) return true;
  return !prompt_only_ && (delta.new_token || !delta.text.empty() || !delta.tokens.empty());
}

json ResponseBuilder::delta_chunk(const Delta& delta, int choice) {
  count(delta.counts, choice);
  ChoiceText& state = choices_.at(size_t(choice));
  json entry = {{"index", choice}};
  if (chat_)
    entry["delta"] = {{"content", delta.text}};
  else
    entry["text"] = take_text(delta, state);
  entry["logprobs"] = logprobs(delta, state);
  entry["finish_reason"] = nullptr;
  // vLLM's completion chunks carry stop_reason throughout, its chat chunks at the end.
  if (!chat_) entry["stop_reason"] = nullptr;
  return choice_chunk(std::move(entry), choice);
}

json ResponseBuilder::finish_chunk(const Completion& completion, int choice) {
  count(completion.counts(), choice);
  json entry = {{"index", choice}};
  if (chat_)
    entry["delta"] = json::object();
  else  // an echo no delta carried (an answer with no text) comes here
    entry["text"] = take_text(Delta{}, choices_.at(size_t(choice)));
  entry["logprobs"] = nullptr;
  entry["finish_reason"] = finish_reason_name(shown_reason(completion.reason));
  entry["stop_reason"] = shown_stop_reason(completion);
  return choice_chunk(std::move(entry), choice);
}

json ResponseBuilder::usage_chunk(std::span<const Completion> choices) const {
  json chunk = chunk_envelope();
  chunk["usage"] = usage(choices);
  return chunk;
}

void ResponseBuilder::append(const Delta& delta, int choice) {
  ChoiceText& state = choices_.at(size_t(choice));
  json part = logprobs(delta, state);
  state.text += take_text(delta, state);
  if (part.is_null()) return;
  if (state.logprobs.is_null()) {
    state.logprobs = std::move(part);
    return;
  }
  // Both formats are objects of parallel arrays: extend each.
  for (auto& [key, values] : part.items())
    if (values.is_array())
      for (auto& v : values) state.logprobs[key].push_back(std::move(v));
}

json ResponseBuilder::whole_response(std::span<const Completion> choices) const {
  json entries = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const ChoiceText& state = choices_.at(i);
    json entry = {{"index", i}};
    if (chat_)
      entry["message"] = {{"role", "assistant"}, {"content", state.text}, {"refusal", nullptr}};
    else  // an echo no delta carried: the prompt is the whole text
      entry["text"] = state.echo_due ? state.prompt + state.text : state.text;
    entry["logprobs"] = state.logprobs;
    entry["finish_reason"] = finish_reason_name(shown_reason(choices[i].reason));
    entry["stop_reason"] = shown_stop_reason(choices[i]);
    entries.push_back(std::move(entry));
  }
  return {{"id", id_},       {"object", answer_object(chat_)}, {"created", created_},
          {"model", model_}, {"choices", std::move(entries)},  {"usage", usage(choices)}};
}

json ResponseBuilder::usage(std::span<const Completion> choices) const {
  return usage_json(total_usage(choices, per_prompt_).counts());
}

json ResponseBuilder::usage_json(TokenCounts counts) const {
  return {{"prompt_tokens", counts.prompt_tokens},
          {"completion_tokens", counts.completion_tokens},
          {"total_tokens", counts.prompt_tokens + counts.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", counts.cached_tokens}}}};
}

// A prompt_only answer ends at its length limit of 0, whatever ended the token it dropped.
FinishReason ResponseBuilder::shown_reason(FinishReason reason) const {
  return prompt_only_ ? FinishReason::Length : reason;
}

json ResponseBuilder::shown_stop_reason(const Completion& completion) const {
  return prompt_only_ ? json(nullptr) : stop_reason_json(completion.stop_reason);
}

std::string ResponseBuilder::take_text(const Delta& delta, ChoiceText& choice) const {
  std::string text;
  if (choice.echo_due) {
    text = choice.prompt;
    choice.echo_due = false;
  }
  if (!prompt_only_) text += delta.text;
  return text;
}

json ResponseBuilder::logprobs(const Delta& delta, ChoiceText& choice) const {
  if (!logprobs_) return nullptr;
  return chat_ ? chat_logprobs(delta.tokens) : completion_logprobs(delta, choice);
}

// {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}],
//  "refusal": null}
json ResponseBuilder::chat_logprobs(const std::vector<TokenOutput>& tokens) const {
  json content = json::array();
  for (const TokenOutput& token : tokens) {
    json top = json::array();
    for (const TokenLogprob& alternative : token.top) {
      const std::string text = token_text_(alternative.token);
      top.push_back({{"token", text},
                     {"logprob", json_logprob(alternative.logprob)},
                     {"bytes", utf8_bytes(text)}});
    }
    content.push_back({{"token", token.text},
                       {"logprob", json_logprob(token.logprob.value_or(0.0f))},
                       {"bytes", utf8_bytes(token.text)},
                       {"top_logprobs", std::move(top)}});
  }
  return {{"content", std::move(content)}, {"refusal", nullptr}};
}

namespace {

// One token of completions logprobs; a prompt's first token has null for its logprob and its
// alternatives. The alternatives hold the token itself too, as OpenAI's and vLLM's do ("up to
// logprobs + 1 elements"), under its text in "tokens", so that a client finds it there (and
// tells a greedy token by its being the likeliest).
void add_completion_logprob(json& result, const TokenOutput& token, size_t text_offset,
                            const TokenTextFn& token_text) {
  json top = nullptr;
  if (token.logprob) {
    top = json::object();
    for (const TokenLogprob& alternative : token.top)
      top[alternative.token == token.token ? token.text : token_text(alternative.token)] =
          json_logprob(alternative.logprob);
    if (!top.contains(token.text)) top[token.text] = json_logprob(*token.logprob);
  }
  result["tokens"].push_back(token.text);
  result["token_logprobs"].push_back(token.logprob ? json(json_logprob(*token.logprob)) : json());
  result["top_logprobs"].push_back(std::move(top));
  result["text_offset"].push_back(text_offset);
}

// Where a prompt token that starts at `offset` of the prompt's text ends. A token's text is
// normally the prompt's next bytes; SentencePiece's word-start space, though, may stand for no
// space (the prompt's first word) or for a run of them (it collapses whitespace), so a token
// that starts with one is matched past whatever whitespace the prompt has there. A token of
// spaces alone (the word-start mark before a prompt that opens with a newline or a tab, whose
// own tokens follow) takes the spaces there, if any, and nothing else.
size_t after_token(const std::string& prompt, size_t offset, const std::string& text) {
  if (offset > prompt.size()) return offset + text.size();
  if (prompt.compare(offset, text.size(), text) == 0) return offset + text.size();
  // A prompt of token ids decodes each byte outside a well-formed character as a U+FFFD.
  if (const std::string shown = replacing_invalid_utf8(text);
      prompt.compare(offset, shown.size(), shown) == 0)
    return offset + shown.size();
  if (text.empty() || text[0] != ' ') return offset + text.size();
  const std::string_view word =
      std::string_view(text).substr(std::min(text.find_first_not_of(' '), text.size()));
  size_t at = offset;
  if (word.empty()) {
    while (at < prompt.size() && prompt[at] == ' ') ++at;
    return at;
  }
  while (at < prompt.size() && std::isspace(static_cast<unsigned char>(prompt[at]))) ++at;
  if (prompt.compare(at, word.size(), word) == 0) return at + word.size();
  return offset + text.size();  // the tokenizer changed more than whitespace: count its bytes
}

}  // namespace

// {"text_offset", "token_logprobs", "tokens", "top_logprobs": [{text: logprob}]} (vLLM's order):
// an echoed prompt's tokens, then the delta's own (none for prompt_only).
json ResponseBuilder::completion_logprobs(const Delta& delta, ChoiceText& choice) const {
  json result = {{"text_offset", json::array()},
                 {"token_logprobs", json::array()},
                 {"tokens", json::array()},
                 {"top_logprobs", json::array()}};
  // A prompt token's place in bytes (where after_token matches it), and in characters before it.
  size_t offset = 0, counted = 0, characters_before = 0;
  for (const TokenOutput& token : delta.prompt) {
    const size_t at = std::min(offset, choice.prompt.size());
    characters_before += characters(std::string_view(choice.prompt).substr(counted, at - counted));
    counted = at;
    add_completion_logprob(result, token, characters_before, token_text_);
    offset = after_token(choice.prompt, offset, token.text);
  }
  if (prompt_only_) return result;
  for (const TokenOutput& token : delta.tokens)
    add_completion_logprob(result, token, choice.answer_offsets.add(token.text), token_text_);
  return result;
}

}  // namespace pipeline