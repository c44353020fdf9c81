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
  SchemaPrefix& operator=(const SchemaPrefix& other);

  // Whether `byte` continues a prefix of a value the schema admits; on false this state is no
  // longer meaningful (try bytes on a copy).
  bool feed(uint8_t byte);
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
    Integer,  // no fraction or exponent
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

  bool start_value(int node, uint8_t byte);
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
  const JsonSchema::Node& node_of(const Frame& frame) const { return schema_->node(frame.node); }

  const JsonSchema* schema_;
  JsonPrefix syntax_;
  bool done_ = false;  // the value has ended
  uint8_t used_ = 0;   // frames in use
  // The top frame's progress through what it matches: a key or an enum's texts, [lo_, hi_)
  // being those that begin with the matched_ bytes written; a string's characters (matched_).
  uint32_t lo_ = 0, hi_ = 0, matched_ = 0;
  std::array<Frame, kMaxFrames> frames_;
};

}  // namespace pipeline
