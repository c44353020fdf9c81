#include "server/json_body.h"

#include <algorithm>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace pipeline {

namespace {

// A SAX handler (nlohmann's json_sax interface) that builds a JsonBody.
class JsonBodyBuilder {
 public:
  JsonBodyBuilder(JsonBody& root, int max_depth) : root_(root), max_depth_(size_t(max_depth)) {}

  bool null() { return place(nullptr); }
  bool boolean(bool value) { return place(value); }
  bool number_integer(JsonBody::number_integer_t value) { return place(value); }
  bool number_unsigned(JsonBody::number_unsigned_t value) { return place(value); }
  bool number_float(JsonBody::number_float_t value, const std::string&) { return place(value); }
  bool string(std::string& value) { return place(std::move(value)); }
  bool binary(JsonBody::binary_t& value) { return place(JsonBody::binary(std::move(value))); }
  bool start_object(std::size_t) { return open(JsonBody::object()); }
  bool key(std::string& name) {
    key_ = std::move(name);
    return true;
  }
  bool end_object() { return close(); }
  bool start_array(std::size_t) { return open(JsonBody::array()); }
  bool end_array() { return close(); }
  template <class Exception>
  bool parse_error(std::size_t, const std::string&, const Exception& error) {
    throw error;
  }

 private:
  struct Open {
    JsonBody* value;
    std::unordered_map<std::string, size_t> members;  // an object's keys, by their place
  };

  bool place(JsonBody value) {
    slot() = std::move(value);
    return true;
  }
  bool open(JsonBody container) {
    if (open_.size() == max_depth_)
      throw JsonBody::other_error::create(
          501, "arrays and objects nest deeper than " + std::to_string(max_depth_) + " levels",
          nullptr);
    JsonBody& value = slot();
    value = std::move(container);
    open_.push_back({&value, {}});
    return true;
  }
  bool close() {
    open_.pop_back();
    return true;
  }

  // Where the next value goes: the root, the end of the open array, or the open object's member
  // of the last key (a new one at its end, or the earlier one of that key, replaced).
  JsonBody& slot() {
    if (open_.empty()) return root_;
    Open& container = open_.back();
    if (container.value->is_array()) {
      JsonBody::array_t& items = container.value->get_ref<JsonBody::array_t&>();
      items.emplace_back();
      return items.back();
    }
    JsonBody::object_t& members = container.value->get_ref<JsonBody::object_t&>();
    const auto [known, added] = container.members.emplace(key_, members.size());
    if (!added) return (members.begin() + long(known->second))->second;
    // ordered_map is a vector underneath: appending skips its linear search for the key.
    members.emplace_back(std::move(key_), nullptr);
    return members.back().second;
  }

  JsonBody& root_;
  size_t max_depth_;
  std::vector<Open> open_;
  std::string key_;
};

// The parse error of a NUL byte at `at`, where JSON allows none outside a string.
JsonBody::parse_error nul_byte_error(std::string_view text, size_t at) {
  nlohmann::detail::position_t position;
  position.chars_read_total = at + 1;
  const size_t line_start = text.rfind('\n', at) == text.npos ? 0 : text.rfind('\n', at) + 1;
  position.chars_read_current_line = at - line_start + 1;
  position.lines_read = size_t(std::count(text.begin(), text.begin() + long(at), '\n'));
  return JsonBody::parse_error::create(101, position,
                                       "syntax error while parsing value - unexpected NUL byte",
                                       static_cast<const JsonBody*>(nullptr));
}

}  // namespace

JsonBody read_json_body(std::string_view text, int max_depth) {
  JsonBody root;
  JsonBodyBuilder builder(root, max_depth);
  // nlohmann's lexer takes a NUL byte outside a string for the text's end, so `{"a": 1}`, a NUL
  // and anything after it would read as `{"a": 1}`. (One inside a string it refuses itself.)
  const size_t nul = text.find('\0');
  try {
    JsonBody::sax_parse(text, &builder);
  } catch (const JsonBody::parse_error& e) {
    const bool in_a_string = std::string_view(e.what()).find("U+0000") != std::string_view::npos;
    if (nul != text.npos && e.byte == nul + 1 && !in_a_string) throw nul_byte_error(text, nul);
    throw;
  }
  if (nul != text.npos) throw nul_byte_error(text, nul);
  return root;
}

}  // namespace pipeline
