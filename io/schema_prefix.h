// Recognises, a byte at a time, the beginnings of one JSON value that a JsonSchema admits: what
// response_format json_schema (and json_object, a schema of any object) lets a model write.
// JsonPrefix follows the syntax; this follows the values in it, one frame per value being
// written that the schema constrains. Like JsonPrefix it holds no heap memory, and a copy takes
// only the frames in use, so JSON mode can try every token's bytes on copies.
//
// Every prefix it accepts can be finished into a value the schema admits (the compiler refuses
// schemas where it could not), so a model held to it never runs out of tokens to write.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

#include "io/json_prefix.h"
#include "io/json_schema.h"

namespace pipeline {

class SchemaPrefix {
 public:
  explicit SchemaPrefix(const JsonSchema& schema) : schema_(&schema) {}
  SchemaPrefix(const SchemaPrefix& other) { *this = other; }
  // Copies only the frames in use (inline: JSON mode's mask copies a state per byte it tries).
  SchemaPrefix& operator=(const SchemaPrefix& other) {
    schema_ = other.schema_;
    syntax_ = other.syntax_;
    used_ = other.used_;
    lo_ = other.lo_;
    hi_ = other.hi_;
    matched_ = other.matched_;
    magnitude_ = other.magnitude_;
    negative_ = other.negative_;
    for (int i = 0; i < used_; ++i) frames_[size_t(i)] = other.frames_[size_t(i)];
    return *this;
  }

  // Whether `byte` continues a prefix of a value the schema admits; on false this state is no
  // longer meaningful (try bytes on a copy).
  bool feed(uint8_t byte) {
    // Inside a string the schema does not look into, short of its closing quote, the syntax
    // alone decides (inline: the commonest case in JSON mode's mask).
    if (used_ != 0 && frames_[used_ - 1].follow == Follow::Any && byte != '"' &&
        syntax_.in_string())
      return syntax_.feed(byte);
    return feed_value(byte);
  }
  bool feed(std::string_view bytes) {
    for (char c : bytes)
      if (!feed(uint8_t(c))) return false;
    return true;
  }
  // The text is a whole value the schema admits.
  bool complete() const;

 private:
  // How a frame follows its value.
  enum class Follow : uint8_t {
    Any,      // nothing to check inside: wait for its end
    Object,   // keys, their order and their values
    Array,    // items and their count
    String,   // its length
    Integer,  // no fraction or exponent, and its bounds
    Texts,    // byte by byte against an enum's texts
  };
  // The value that began at syntax depth d is frames_[d] (a frame's index is its depth). JsonPrefix
  // holds the syntax in order, so a frame needs to know little of where it is.
  struct Frame {
    uint16_t node;
    Follow follow;
    uint32_t count;  // objects: the first property that may come next; arrays: items begun
  };
  static constexpr int kMaxFrames = JsonPrefix::kMaxDepth + 1;
  static constexpr uint32_t kMaxDigits = 19;  // an integer's magnitude_ holds this many

  bool feed_value(uint8_t byte);
  bool start_value(int node, uint8_t byte);
  bool string_byte(uint8_t byte);
  bool container_byte(uint8_t byte);  // between an object's or array's members
  bool key_byte(uint8_t byte);
  bool next_value(uint8_t byte);
  bool close_container();
  bool end_value();  // the top frame's value has ended: its container goes on
  bool match(const std::vector<std::string>& texts, uint8_t byte);
  bool text_matched(const std::vector<std::string>& texts) const {
    return texts[lo_].size() == matched_;
  }
  bool eligible_key_in_range() const;
  bool may_come_next(uint32_t property) const;
  bool a_property_fits() const;
  // Whether a value of `node` could be whole within the nesting left to the top container's
  // members.
  bool fits(int node) const {
    return used_ + schema_->node(node).min_depth <= JsonPrefix::kMaxDepth;
  }
  bool integer_byte(const JsonSchema::Node& node, uint8_t byte);
  bool integer_reachable(const JsonSchema::Node& node) const;
  bool integer_fits(const JsonSchema::Node& node) const;
  const JsonSchema::Node& node_of(const Frame& frame) const { return schema_->node(frame.node); }

  const JsonSchema* schema_;
  JsonPrefix syntax_;
  // Frames in use: none before the value begins (JsonPrefix still at its start) and none once it
  // has ended (JsonPrefix complete).
  uint8_t used_ = 0;
  // The top frame's progress through what it matches: a key or an enum's texts, [lo_, hi_)
  // being those that begin with the matched_ bytes written; a string's characters (matched_);
  // a bounded integer's digits (matched_), their value (while it fits 19 digits) and sign.
  uint32_t lo_ = 0, hi_ = 0, matched_ = 0;
  uint64_t magnitude_ = 0;
  bool negative_ = false;
  std::array<Frame, kMaxFrames> frames_;
};

}  // namespace pipeline
