#include "io/schema_prefix.h"

#include <algorithm>
#include <limits>

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

bool SchemaPrefix::feed_value(uint8_t byte) {
  if (used_ != 0 && frames_[used_ - 1].follow == Follow::String) return string_byte(byte);
  const JsonPrefix was = syntax_;
  if (!syntax_.feed(byte)) return false;
  if (used_ == 0) {
    const bool whitespace = byte == ' ' || byte == '\n' || byte == '\t';
    return whitespace || start_value(schema_->root(), byte);
  }
  Frame& top = frames_[used_ - 1];
  const int depth = used_ - 1;  // where the top frame's value began
  // A number ends at the byte after it, which belongs to the container around it.
  const bool number_ended = was.in_number() && !syntax_.in_number() && was.depth() == depth;
  // Any other value ends at its last byte: a string's quote, a literal's last letter, a
  // container's bracket.
  const bool ended = syntax_.depth() == depth &&
                     (was.depth() == depth + 1 || (was.in_string() && !syntax_.in_string()) ||
                      (was.in_literal() && !syntax_.in_literal()));
  const JsonSchema::Node& node = node_of(top);
  switch (top.follow) {
    case Follow::Any:
      if (number_ended) return end_value() && container_byte(byte);
      return !ended || end_value();
    case Follow::Integer:
      if (number_ended) return integer_fits(node) && end_value() && container_byte(byte);
      return integer_byte(node, byte);
    case Follow::Texts:
      if (number_ended) return text_matched(node.texts) && end_value() && container_byte(byte);
      if (!match(node.texts, byte)) return false;
      return !ended || (text_matched(node.texts) && end_value());
    default:  // Object, Array
      return was.in_key() ? key_byte(byte) : container_byte(byte);
  }
}

// A byte after a string's opening quote, for a string of limited length.
bool SchemaPrefix::string_byte(uint8_t byte) {
  const JsonSchema::Node& node = node_of(frames_[used_ - 1]);
  const bool begins_a_character = syntax_.between_characters() && byte != '"';
  if (!syntax_.feed(byte)) return false;
  if (!syntax_.in_string()) return matched_ >= node.min_length && end_value();
  if (begins_a_character) {
    if (matched_ == node.max_length) return false;
    ++matched_;
  }
  return true;
}

bool SchemaPrefix::complete() const {
  if (!syntax_.complete()) return false;
  if (used_ == 0) return true;  // the value has ended
  // A number that is the whole text, which ends with the text.
  if (used_ != 1) return false;
  const JsonSchema::Node& node = node_of(frames_[0]);
  switch (frames_[0].follow) {
    case Follow::Texts:
      return text_matched(node.texts);
    case Follow::Integer:
      return integer_fits(node);
    default:
      return true;
  }
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
  // A container must fit its least nesting under the syntax's limit, so that it can be finished.
  const int nesting = kinds == kObjectKind  ? node->object_depth
                      : kinds == kArrayKind ? node->array_depth
                                            : 0;
  if (!(node->kinds & kinds) || used_ + nesting > JsonPrefix::kMaxDepth) return false;
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
  if (kinds == (kIntegerKind | kNumberKind) && !(node->kinds & kNumberKind)) {
    frame.follow = Follow::Integer;
    matched_ = 0;
    magnitude_ = 0;
    negative_ = false;
    return integer_byte(*node, byte);
  }
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
      if (top.follow == Follow::Array) return top.count < node.max_items && fits(node.items);
      return node.properties.empty() ? node.other_keys >= 0 && fits(node.other_keys)
                                     : a_property_fits();
    case '}':
    case ']':
      return close_container();
    default:
      if (!syntax_.in_key()) return next_value(byte);
      if (node.properties.empty()) return node.other_keys >= 0 && fits(node.other_keys);
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
  for (uint32_t i = lo_; i < hi_; ++i)
    if (may_come_next(node_of(frames_[used_ - 1]).key_properties[i])) return true;
  return false;
}

// Whether the top object's `property` may come next: not before the last one written, nor after
// a required one not yet written, and with room for its value's nesting.
bool SchemaPrefix::may_come_next(uint32_t property) const {
  const Frame& top = frames_[used_ - 1];
  const JsonSchema::Node& node = node_of(top);
  if (property < top.count || property >= node.properties.size()) return false;
  return property <= node.next_required[top.count] && fits(node.properties[property].node);
}

// After a comma in the top object: whether some property may come next.
bool SchemaPrefix::a_property_fits() const {
  const JsonSchema::Node& node = node_of(frames_[used_ - 1]);
  for (uint32_t property = frames_[used_ - 1].count; property < node.properties.size(); ++property)
    if (may_come_next(property)) return true;
  return false;
}

// A byte of an integer (its sign or a digit: JsonPrefix holds the syntax).
bool SchemaPrefix::integer_byte(const JsonSchema::Node& node, uint8_t byte) {
  if (byte == '.' || byte == 'e' || byte == 'E') return false;
  if (!node.bounded()) return true;
  if (byte == '-') {
    negative_ = true;
  } else if (++matched_ <= kMaxDigits) {
    magnitude_ = magnitude_ * 10 + uint64_t(byte - '0');
  }
  return integer_reachable(node);
}

// Whether the integer begun can still end within its bounds: with k more digits, its magnitude m
// becomes one of [m * 10^k, (m + 1) * 10^k - 1], ranges that move away from zero as k grows.
bool SchemaPrefix::integer_reachable(const JsonSchema::Node& node) const {
  // The bounds, a side without one as far beyond 64 bits as the arithmetic below allows.
  constexpr __int128 kBeyond = __int128(1) << 126;
  const __int128 lo = node.has_minimum ? node.minimum : -kBeyond;
  const __int128 hi = node.has_maximum ? node.maximum : kBeyond;
  if (matched_ == 0) return lo <= 0;                     // "-": -0, or any negative
  if (magnitude_ == 0) return lo <= 0 && 0 <= hi;        // "0" or "-0": nothing may follow
  if (matched_ > kMaxDigits) return integer_fits(node);  // beyond 64 bits: only unbounded
  // A bounded side is within 64 bits, so this ends by scale 10^19, m * scale within 2^127.
  const __int128 m = magnitude_;
  for (__int128 scale = 1;; scale *= 10) {
    const __int128 low = m * scale, high = (m + 1) * scale - 1;
    if (negative_ ? -low < lo : low > hi) return false;  // more digits only go further
    if (negative_ ? -high <= hi : high >= lo) return true;
  }
}

bool SchemaPrefix::integer_fits(const JsonSchema::Node& node) const {
  if (matched_ > kMaxDigits) return negative_ ? !node.has_minimum : !node.has_maximum;
  const __int128 value = negative_ ? -__int128(magnitude_) : __int128(magnitude_);
  return (!node.has_minimum || value >= node.minimum) &&
         (!node.has_maximum || value <= node.maximum);
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
  --used_;
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
