#include "io/chat_template.h"

#include <algorithm>
#include <stdexcept>

#include "io/utf8.h"

namespace pipeline {
namespace {

// Meta's llama/generation.py markers.
constexpr std::string_view kBeginInst = "[INST]";
constexpr std::string_view kEndInst = "[/INST]";
constexpr std::string_view kBeginSys = "<<SYS>>\n";
constexpr std::string_view kEndSys = "\n<</SYS>>\n\n";

// Python's str.isspace() code points, so that strip() below trims what Meta's .strip() trims.
bool is_python_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

// The length of the UTF-8 character a lead byte starts (1 for a byte that starts none).
size_t utf8_length(char lead) {
  const auto b = static_cast<unsigned char>(lead);
  return b < 0xC0 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
}

// The code point of `bytes` when they are exactly one well-formed UTF-8 character, else
// U+FFFD (which is not whitespace, so malformed bytes are never stripped).
char32_t code_point(std::string_view bytes) {
  constexpr char32_t kInvalid = 0xFFFD;
  constexpr char32_t kLeadMask[] = {0, 0x7F, 0x1F, 0x0F, 0x07};
  constexpr char32_t kSmallest[] = {0, 0, 0x80, 0x800, 0x10000};
  const size_t length = bytes.size();
  if (length == 0 || length > 4 || utf8_length(bytes[0]) != length) return kInvalid;
  if (length == 1) return static_cast<unsigned char>(bytes[0]) < 0x80 ? bytes[0] : kInvalid;
  char32_t c = static_cast<unsigned char>(bytes[0]) & kLeadMask[length];
  for (size_t i = 1; i < length; ++i) {
    if (!is_continuation_byte(bytes[i])) return kInvalid;
    c = c << 6 | (static_cast<unsigned char>(bytes[i]) & 0x3F);
  }
  return c < kSmallest[length] ? kInvalid : c;
}

// Python's str.strip(): leading and trailing Unicode whitespace removed.
std::string_view strip(std::string_view text) {
  while (!text.empty()) {
    const size_t length = std::min(utf8_length(text.front()), text.size());
    if (!is_python_space(code_point(text.substr(0, length)))) break;
    text.remove_prefix(length);
  }
  while (!text.empty()) {
    size_t start = text.size() - 1;
    while (start > 0 && text.size() - start < 4 && is_continuation_byte(text[start])) --start;
    if (!is_python_space(code_point(text.substr(start)))) break;
    text.remove_suffix(text.size() - start);
  }
  return text;
}

bool is_system(std::string_view role) {
  return role == "system" || role == "developer";
}

std::string role_param(size_t i) {
  return "messages[" + std::to_string(i) + "].role";
}

void check_roles(const std::vector<ChatMessage>& messages, PromptEnd end) {
  if (messages.empty()) throw ChatTemplateError("messages", "messages must not be empty");
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& role = messages[i].role;
    if (!is_chat_role(role))
      throw ChatTemplateError(role_param(i), "messages[" + std::to_string(i) + "]: unknown role '" +
                                                 role +
                                                 "' (expected system, developer, user or "
                                                 "assistant)");
  }
  if (end == PromptEnd::ContinueFinalMessage && messages.back().role != "assistant")
    throw ChatTemplateError(
        role_param(messages.size() - 1),
        "messages: continue_final_message needs the last message to have role 'assistant'");
}

// Meta's chat_completion(): an optional system message folded into the first user turn,
// then user/assistant pairs, each "<s>[INST] {user} [/INST] {assistant} </s>", then the last
// user turn "<s>[INST] {user} [/INST]". A final assistant message to continue ends the prompt
// as "<s>[INST] {user} [/INST] {assistant}", its pair cut before the space and EOS that close it
// (what Hugging Face's continue_final_message cuts from the rendered template).
PromptText llama2_prompt(const std::vector<ChatMessage>& messages, PromptEnd end) {
  size_t first = 0;
  std::string system_prefix;
  if (is_system(messages.front().role)) {
    system_prefix = std::string(kBeginSys) + messages.front().content + std::string(kEndSys);
    first = 1;
  }
  if (first == messages.size())
    throw ChatTemplateError("messages",
                            "messages: a system message must be followed by a user message");
  for (size_t i = first; i < messages.size(); ++i) {
    const char* expected = (i - first) % 2 == 0 ? "user" : "assistant";
    if (messages[i].role != expected)
      throw ChatTemplateError(role_param(i), "messages[" + std::to_string(i) + "] has role '" +
                                                 messages[i].role + "' where '" + expected +
                                                 "' was expected: after an optional system "
                                                 "message, roles must alternate user/assistant");
  }
  if (end == PromptEnd::NewAnswer && messages.back().role != "user")
    throw ChatTemplateError(role_param(messages.size() - 1),
                            "messages: the last message must have role 'user' (or 'assistant' "
                            "with continue_final_message)");

  const auto user_content = [&](size_t i) {
    return i == first ? system_prefix + messages[i].content : messages[i].content;
  };
  const auto inst = [&](size_t i) {
    return std::string(kBeginInst) + " " + std::string(strip(user_content(i))) + " " +
           std::string(kEndInst);
  };
  const size_t last_user = end == PromptEnd::NewAnswer ? messages.size() - 1 : messages.size() - 2;
  PromptText prompt;
  for (size_t i = first; i < last_user; i += 2) {
    const std::string turn = inst(i) + " " + std::string(strip(messages[i + 1].content)) + " ";
    prompt.push_back({turn, /*bos_before=*/true, /*eos_after=*/true});
  }
  std::string last_turn = inst(last_user);
  if (end == PromptEnd::ContinueFinalMessage) {
    const std::string_view open_answer = strip(messages.back().content);
    if (!open_answer.empty()) {  // an empty one adds nothing, not even its space
      last_turn += ' ';
      last_turn += open_answer;
    }
  }
  prompt.push_back({std::move(last_turn), /*bos_before=*/true, /*eos_after=*/false});
  return prompt;
}

PromptText raw_prompt(const std::vector<ChatMessage>& messages) {
  std::string text;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (i > 0) text += '\n';
    text += messages[i].content;
  }
  return {{std::move(text), /*bos_before=*/true, /*eos_after=*/false}};
}

}  // namespace

bool is_chat_role(std::string_view role) {
  return is_system(role) || role == "user" || role == "assistant";
}

std::optional<ChatTemplate> parse_chat_template(std::string_view name) {
  if (name == "llama2") return ChatTemplate::Llama2;
  if (name == "raw") return ChatTemplate::Raw;
  return std::nullopt;
}

PromptText chat_prompt(ChatTemplate chat_template, const std::vector<ChatMessage>& messages,
                       PromptEnd end) {
  check_roles(messages, end);
  switch (chat_template) {
    case ChatTemplate::Llama2:
      return llama2_prompt(messages, end);
    case ChatTemplate::Raw:
      return raw_prompt(messages);
  }
  throw ChatTemplateError("", "unknown chat template");
}

std::vector<int32_t> apply_chat_template(const Tokenizer& tokenizer, ChatTemplate chat_template,
                                         const std::vector<ChatMessage>& messages, PromptEnd end) {
  return encode_prompt(tokenizer, chat_prompt(chat_template, messages, end));
}

}  // namespace pipeline
