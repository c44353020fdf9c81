#include "server/json_body.h"

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

}  // namespace

JsonBody read_json_body(std::string_view text, int max_depth) {
  JsonBody root;
  JsonBodyBuilder builder(root, max_depth);
  JsonBody::sax_parse(text, &builder);
  return root;
}

}  // namespace pipeline
