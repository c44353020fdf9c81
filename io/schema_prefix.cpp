#include "io/schema_prefix.h"

#include <algorithm>

namespace pipeline {

namespace {

// The kinds a value may be, from its first byte.
uint8_t kinds_from_first_byte(uint8_t byte) {
  switch (byte) {
    case '{':
      return kObjectKind;
    case '[':
      return kArrayKind;
    case '"':
      return kStringKind;
    case 't':
    case 'f':
      return kBooleanKind;
    case 'n':
      return kNullKind;
    default:
      return kIntegerKind | kNumberKind;  // '-' or a digit: JsonPrefix took nothing else
  }
}

}  // namespace

SchemaPrefix& SchemaPrefix::operator=(const SchemaPrefix& other) {
  schema_ = other.schema_;
  syntax_ = other.syntax_;
  done_ = other.done_;
  used_ = other.used_;
  lo_ = other.lo_;
  hi_ = other.hi_;
  matched_ = other.matched_;
  std::copy_n(other.frames_.begin(), used_, frames_.begin());
  return *this;
}

bool SchemaPrefix::feed(uint8_t byte) {
  const bool was_string = syntax_.in_string();
  const bool was_key = syntax_.in_key();
  const bool was_number = syntax_.in_number();
  const bool was_literal = syntax_.in_literal();
  const bool was_between_characters = syntax_.between_characters();
  const int was_depth = syntax_.depth();
  if (!syntax_.feed(byte)) return false;
  if (used_ == 0) {
    const bool whitespace = byte == ' ' || byte == '\n' || byte == '\t';
    return whitespace || start_value(schema_->root(), byte);
  }
  Frame& top = frames_[used_ - 1];
  const int depth = used_ - 1;  // where the top frame's value began
  // A number ends at the byte after it, which belongs to the container around it.
  const bool number_ended = was_number && !syntax_.in_number() && was_depth == depth;
  // Any other value ends at its last byte: a string's quote, a literal's last letter, a
  // container's bracket.
  const bool ended =
      syntax_.depth() == depth && (was_depth == depth + 1 || (was_string && !syntax_.in_string()) ||
                                   (was_literal && !syntax_.in_literal()));
  const JsonSchema::Node& node = node_of(top);
  switch (top.follow) {
    case Follow::Any:
      if (number_ended) return end_value() && container_byte(byte);
      return !ended || end_value();
    case Follow::Integer:
      if (number_ended) return end_value() && container_byte(byte);
      return byte != '.' && byte != 'e' && byte != 'E';
    case Follow::String:
      if (!syntax_.in_string()) return matched_ >= node.min_length && end_value();
      if (was_between_characters) {  // a character begins
        if (matched_ == node.max_length) return false;
        ++matched_;
      }
      return true;
    case Follow::Texts:
      if (number_ended) return text_matched(node.texts) && end_value() && container_byte(byte);
      if (!match(node.texts, byte)) return false;
      return !ended || (text_matched(node.texts) && end_value());
    default:  // Object, Array
      return was_key ? key_byte(byte) : container_byte(byte);
  }
}

bool SchemaPrefix::complete() const {
  if (!syntax_.complete()) return false;
  if (done_) return true;
  // A number that is the whole text, which ends with the text.
  return used_ == 1 &&
         (frames_[0].follow != Follow::Texts || text_matched(node_of(frames_[0]).texts));
}

bool SchemaPrefix::start_value(int node_index, uint8_t byte) {
  const uint8_t kinds = kinds_from_first_byte(byte);
  const JsonSchema::Node* node = &schema_->node(node_index);
  if (!node->branches.empty()) {
    const auto branch = std::find_if(node->branches.begin(), node->branches.end(),
                                     [&](int b) { return schema_->node(b).kinds & kinds; });
    if (branch == node->branches.end()) return false;
    node_index = *branch;
    node = &schema_->node(node_index);
  }
  if (!(node->kinds & kinds) || used_ == kMaxFrames) return false;
  Frame& frame = frames_[used_++];
  frame = Frame{uint16_t(node_index), Follow::Any, 0};
  if (!node->texts.empty()) {
    frame.follow = Follow::Texts;
    lo_ = 0;
    hi_ = uint32_t(node->texts.size());
    matched_ = 0;
    return match(node->texts, byte);
  }
  if (kinds == kObjectKind && !node->free_object()) frame.follow = Follow::Object;
  if (kinds == kArrayKind && !node->free_array()) frame.follow = Follow::Array;
  if (kinds == kStringKind && !node->free_string()) {
    frame.follow = Follow::String;
    matched_ = 0;
  }
  if (kinds == (kIntegerKind | kNumberKind) && !(node->kinds & kNumberKind))
    frame.follow = Follow::Integer;
  return true;
}

bool SchemaPrefix::container_byte(uint8_t byte) {
  Frame& top = frames_[used_ - 1];
  const JsonSchema::Node& node = node_of(top);
  switch (byte) {
    case ' ':
    case '\n':
    case '\t':
    case ':':
      return true;
    case ',':
      if (top.follow == Follow::Array) return top.count < node.max_items;
      return node.properties.empty() ? node.other_keys >= 0 : top.count < node.properties.size();
    case '}':
    case ']':
      return close_container();
    default:
      if (!syntax_.in_key()) return next_value(byte);
      if (node.properties.empty()) return node.other_keys >= 0;
      lo_ = 0;
      hi_ = uint32_t(node.key_texts.size());
      matched_ = 0;
      return key_byte(byte);
  }
}

// A byte of a key, its quotes included: it must lead to a property that may come next (one not
// before the last written, nor after a required one not yet written).
bool SchemaPrefix::key_byte(uint8_t byte) {
  Frame& top = frames_[used_ - 1];
  const JsonSchema::Node& node = node_of(top);
  if (node.properties.empty()) return true;  // any key
  if (!match(node.key_texts, byte) || !eligible_key_in_range()) return false;
  if (syntax_.in_key()) return true;
  if (!text_matched(node.key_texts)) return false;
  top.count = node.key_properties[lo_] + 1;
  return true;
}

bool SchemaPrefix::eligible_key_in_range() const {
  const Frame& top = frames_[used_ - 1];
  const JsonSchema::Node& node = node_of(top);
  if (top.count >= node.properties.size()) return false;
  const uint32_t last = node.next_required[top.count];
  for (uint32_t i = lo_; i < hi_; ++i) {
    const uint32_t property = node.key_properties[i];
    if (property >= top.count && property <= last) return true;
  }
  return false;
}

bool SchemaPrefix::next_value(uint8_t byte) {
  Frame& top = frames_[used_ - 1];
  const JsonSchema::Node& node = node_of(top);
  if (top.follow == Follow::Array) {
    if (top.count == node.max_items) return false;
    ++top.count;
    return start_value(node.items, byte);
  }
  return start_value(
      node.properties.empty() ? node.other_keys : node.properties[top.count - 1].node, byte);
}

bool SchemaPrefix::close_container() {
  const Frame& top = frames_[used_ - 1];
  const JsonSchema::Node& node = node_of(top);
  const bool finished = top.follow == Follow::Array
                            ? top.count >= node.min_items
                            : node.next_required[top.count] == node.properties.size();
  return finished && end_value();
}

bool SchemaPrefix::end_value() {
  if (--used_ == 0) done_ = true;
  return true;
}

// texts[lo_, hi_) share their first matched_ bytes and are sorted, so those whose next byte is
// `byte` lie side by side (the ones that end there first).
bool SchemaPrefix::match(const std::vector<std::string>& texts, uint8_t byte) {
  const auto next = [&](const std::string& text) {
    return text.size() > matched_ ? int(uint8_t(text[matched_])) : -1;
  };
  const auto begin = texts.begin();
  const auto first = std::partition_point(begin + lo_, begin + hi_,
                                          [&](const std::string& t) { return next(t) < byte; });
  const auto last = std::partition_point(first, begin + hi_,
                                         [&](const std::string& t) { return next(t) == byte; });
  lo_ = uint32_t(first - begin);
  hi_ = uint32_t(last - begin);
  ++matched_;
  return lo_ < hi_;
}

}  // namespace pipeline
