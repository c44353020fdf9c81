// response_format json_schema: a JSON Schema compiled into the few things SchemaPrefix checks as
// a model writes a value a byte at a time: which kinds of value may start where, which keys an
// object takes and in what order, array and string lengths, and the values an enum lists.
//
// Supported (anything else that constrains a value is refused, naming where it is, rather than
// ignored): type (one or a list), properties, required, additionalProperties, items, minItems,
// maxItems, minLength, maxLength, minimum, maximum, exclusiveMinimum and exclusiveMaximum (of
// integers), enum, const, anyOf and oneOf (alternatives a value's first byte tells apart), allOf
// of one schema, and $ref to a place in the same document ($defs, definitions; recursion
// allowed). Annotations (title, description, default, examples, ...) are ignored.
//
// As OpenAI's structured outputs write them: an object's keys come in the order its properties
// are written, each at most once, the optional ones skippable; an object with properties takes
// no other key unless additionalProperties says so; an integer has no fraction or exponent; an
// enum's (or const's) value is written as its compact JSON text.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace pipeline {

// The kinds of JSON value, as bits of a set. A number without fraction or exponent is an
// integer; kNumber admits the others.
enum JsonKind : uint8_t {
  kObjectKind = 1,
  kArrayKind = 2,
  kStringKind = 4,
  kIntegerKind = 8,
  kNumberKind = 16,
  kBooleanKind = 32,
  kNullKind = 64,
  kAnyKind = 127,
};

// What a schema the compiler does not take gets: the place (a JSON pointer into the schema) and
// why.
class JsonSchemaError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

class JsonSchema {
 public:
  static constexpr uint32_t kUnlimited = std::numeric_limits<uint32_t>::max();

  struct Property {
    std::string key;  // as JSON text, quotes included: what the model writes
    int node = 0;
    bool required = false;
  };

  // One subschema. Node 0 is any value at all.
  struct Node {
    std::string pointer;             // where it is in the schema, for errors
    uint8_t kinds = kAnyKind;        // the kinds of value it admits
    std::vector<int> branches;       // anyOf/oneOf: the value is one of these (none nest further)
    std::vector<std::string> texts;  // enum/const: the values it may be, sorted (empty: any)

    // Objects: the properties in the order they are written, and their keys sorted (the
    // property of key_texts[i] is key_properties[i]). next_required[i] is the first required
    // property at or after i (properties.size() if none).
    std::vector<Property> properties;
    std::vector<std::string> key_texts;
    std::vector<uint32_t> key_properties;
    std::vector<uint32_t> next_required;
    int other_keys = -1;  // the node of keys beyond properties' values; -1: no other key

    int items = 0;  // arrays
    uint32_t min_items = 0, max_items = kUnlimited;
    uint32_t min_length = 0, max_length = kUnlimited;  // strings, in characters
    // The least nesting (containers within containers, its own included) that a whole value of
    // it needs: any value, one that begins as an object, one that begins as an array. kNever
    // where it admits no such value, or none is finite. SchemaPrefix lets a value, key or item
    // begin only where its least nesting still fits under JsonPrefix::kMaxDepth.
    static constexpr uint8_t kNever = 255;
    uint8_t min_depth = 0, object_depth = kNever, array_depth = kNever;

    // Integers' bounds, inclusive.
    bool has_minimum = false, has_maximum = false;
    int64_t minimum = 0, maximum = 0;

    // An object, an array or a string with any members at all: nothing to check inside.
    bool free_object() const { return properties.empty() && other_keys == 0; }
    bool free_array() const { return items == 0 && min_items == 0 && max_items == kUnlimited; }
    bool free_string() const { return min_length == 0 && max_length == kUnlimited; }
    bool bounded() const { return has_minimum || has_maximum; }
  };

  // Throws JsonSchemaError for a schema it cannot hold a model to.
  static std::shared_ptr<const JsonSchema> compile(const nlohmann::ordered_json& schema);
  // {"type": "object"}: response_format json_object.
  static std::shared_ptr<const JsonSchema> any_object();

  int root() const { return root_; }
  const Node& node(int index) const { return nodes_[size_t(index)]; }

 private:
  friend class JsonSchemaCompiler;
  std::vector<Node> nodes_;
  int root_ = 0;
};

}  // namespace pipeline
