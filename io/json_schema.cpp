#include "io/json_schema.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <set>

#include <nlohmann/json.hpp>

#include "io/json_integer.h"
#include "io/json_prefix.h"

namespace pipeline {

using Json = nlohmann::ordered_json;

namespace {

// Keywords that describe a value without constraining it.
const std::set<std::string, std::less<>> kAnnotations = {
    "title",    "description", "default",  "examples",  "$schema", "$id",
    "$comment", "deprecated",  "readOnly", "writeOnly", "$defs",   "definitions",
};
// Keywords that constrain a value, by the kind they apply to.
const std::set<std::string, std::less<>> kValueKeywords = {
    "type",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "minItems",
    "maxItems",
    "minLength",
    "maxLength",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
};

constexpr size_t kMaxNodes = 65535;  // SchemaPrefix keeps a node's index in 16 bits
constexpr int kMaxNesting = 128;     // subschemas within subschemas

std::string child_pointer(const std::string& pointer, const std::string& key) {
  std::string escaped;
  for (char c : key) {
    if (c == '~') {
      escaped += "~0";
    } else if (c == '/') {
      escaped += "~1";
    } else {
      escaped += c;
    }
  }
  return pointer + "/" + escaped;
}

uint8_t kind_of(const Json& value) {
  switch (value.type()) {
    case Json::value_t::object:
      return kObjectKind;
    case Json::value_t::array:
      return kArrayKind;
    case Json::value_t::string:
      return kStringKind;
    case Json::value_t::boolean:
      return kBooleanKind;
    case Json::value_t::null:
      return kNullKind;
    case Json::value_t::number_float:
      return kNumberKind;
    default:
      return kIntegerKind;
  }
}

// A short account of a value for an error message: the value itself if it is a scalar (a
// container could be deep, and dump() recurses).
std::string describe(const Json& value) {
  if (value.is_object()) return "an object";
  if (value.is_array()) return "an array";
  return value.dump();
}

// How deep a value's containers nest, counted no further than limit + 1. It walks without
// recursing: nlohmann's copies and dump() recurse, so a value is measured before them.
int nesting_of(const Json& value, int limit) {
  int deepest = 0;
  std::vector<std::pair<const Json*, int>> pending = {{&value, 0}};
  while (!pending.empty()) {
    const auto [at, depth] = pending.back();
    pending.pop_back();
    if (!at->is_structured()) continue;
    deepest = std::max(deepest, depth + 1);
    if (deepest > limit) break;
    for (const Json& member : *at) pending.push_back({&member, depth + 1});
  }
  return deepest;
}

// The kinds a value's first byte tells apart: an integer begins as any number does.
uint8_t first_byte_classes(uint8_t kinds) {
  return kinds & kIntegerKind ? uint8_t((kinds & ~kIntegerKind) | kNumberKind) : kinds;
}

std::string class_name(uint8_t classes) {
  static const std::pair<uint8_t, const char*> kNames[] = {
      {kObjectKind, "objects"}, {kArrayKind, "arrays"},     {kStringKind, "strings"},
      {kNumberKind, "numbers"}, {kBooleanKind, "booleans"}, {kNullKind, "null"},
  };
  for (const auto& [kind, name] : kNames)
    if (classes & kind) return name;
  return "values";
}

}  // namespace

class JsonSchemaCompiler {
 public:
  explicit JsonSchemaCompiler(const Json& document) : document_(document) {}

  std::shared_ptr<const JsonSchema> run() {
    auto schema = std::make_shared<JsonSchema>();
    nodes_ = &schema->nodes_;
    // Node 0: any value. As an object it takes any keys, each with any value (node 0 again),
    // as a schema of no keywords compiles to; the defaults would take no key at all.
    JsonSchema::Node& any = node(add_node(""));
    any.other_keys = 0;
    any.next_required = {0};
    root_ = compile(document_, "", 0);
    schema->root_ = root_;
    flatten_branches();
    compute_depths();
    return schema;
  }

 private:
  [[noreturn]] static void fail(const std::string& pointer, const std::string& why) {
    throw JsonSchemaError("at #" + pointer + ": " + why);
  }

  int add_node(const std::string& pointer) {
    if (nodes_->size() == kMaxNodes)
      fail(pointer, "more than " + std::to_string(kMaxNodes) + " subschemas");
    nodes_->push_back(JsonSchema::Node{});
    nodes_->back().pointer = pointer;
    return int(nodes_->size() - 1);
  }
  JsonSchema::Node& node(int index) { return (*nodes_)[size_t(index)]; }

  // The node of the subschema at `pointer`, compiled once however often it is referred to.
  int compile(const Json& schema, const std::string& pointer, int nesting) {
    if (const auto known = compiled_.find(pointer); known != compiled_.end()) return known->second;
    if (nesting > kMaxNesting)
      fail(pointer, "subschemas nest deeper than " + std::to_string(kMaxNesting));
    if (schema.is_boolean()) {
      if (!schema.get<bool>()) fail(pointer, "false admits no value");
      return 0;
    }
    if (!schema.is_object()) fail(pointer, "a schema is an object or a boolean");
    check_keywords(schema, pointer);
    if (is_alias(schema)) {
      // Compiled where the chain of aliases ends, so that a reference back to any link of it,
      // from inside what it ends at, finds that node.
      const auto [target, target_pointer] = follow_aliases(schema, pointer);
      const int index = compile(*target, target_pointer, nesting + 1);
      compiled_[pointer] = index;
      return index;
    }
    const int index = add_node(pointer);
    compiled_[pointer] = index;  // before its subschemas, which may refer back to it
    if (schema.contains("enum") || schema.contains("const")) {
      compile_texts(schema, pointer, index);
    } else if (schema.contains("anyOf") || schema.contains("oneOf")) {
      compile_branches(schema, pointer, index, nesting);
    } else {
      node(index).kinds = read_type(schema, pointer);
      compile_object(schema, pointer, index, nesting);
      compile_array(schema, pointer, index, nesting);
      node(index).min_length = read_count(schema, "minLength", pointer, 0);
      node(index).max_length = read_count(schema, "maxLength", pointer, JsonSchema::kUnlimited);
      if (node(index).min_length > node(index).max_length)
        fail(pointer, "minLength is above maxLength");
      read_bounds(schema, pointer, node(index));
    }
    return index;
  }

  // Every keyword is known, and the combining ones ($ref, enum, const, anyOf, oneOf, allOf)
  // stand beside nothing but annotations and, for enum and const, type.
  static void check_keywords(const Json& schema, const std::string& pointer) {
    std::string combining;
    bool typed = false;
    bool constrains = false;
    for (const auto& [key, value] : schema.items()) {
      if (kAnnotations.count(key)) continue;
      if (key == "$ref" || key == "enum" || key == "const" || key == "anyOf" || key == "oneOf" ||
          key == "allOf") {
        if (!combining.empty()) fail(pointer, combining + " beside " + key + " is not supported");
        combining = key;
      } else if (kValueKeywords.count(key)) {
        typed = typed || key == "type";
        constrains = constrains || key != "type";
      } else {
        fail(pointer, key + " is not supported");
      }
    }
    const bool takes_type = combining == "enum" || combining == "const";
    if (!combining.empty() && (constrains || (typed && !takes_type)))
      fail(pointer, combining + " beside other constraints is not supported");
  }

  // $ref and a one-schema allOf stand for another subschema: its node, not a new one.
  static bool is_alias(const Json& schema) {
    return schema.contains("$ref") || schema.contains("allOf");
  }

  // The subschema a chain of aliases ends at (one that is not an alias), and its place.
  std::pair<const Json*, std::string> follow_aliases(const Json& schema, std::string pointer) {
    std::set<std::string> seen;
    const Json* at = &schema;
    while (is_alias(*at)) {
      if (!seen.insert(pointer).second) fail(pointer, "$ref leads back to itself");
      if (const auto all = at->find("allOf"); all != at->end()) {
        if (!all->is_array() || all->size() != 1)
          fail(pointer, "allOf is supported with one schema only");
        at = &(*all)[0];
        pointer = child_pointer(pointer, "allOf") + "/0";
      } else {
        const Json& ref = at->at("$ref");
        if (!ref.is_string() || ref.get_ref<const std::string&>().rfind('#', 0) != 0)
          fail(pointer, "$ref must be a place in this schema, '#' or '#/...'");
        const std::string target = ref.get_ref<const std::string&>().substr(1);
        at = referred(target);
        if (!at) fail(pointer, "$ref '#" + target + "' names nothing in this schema");
        pointer = target;
      }
      // The next link is checked here; what the chain ends at, by compile().
      if (!at->is_object() || !is_alias(*at)) break;
      check_keywords(*at, pointer);
    }
    return {at, pointer};
  }

  // The subschema at a JSON pointer into the document, or nullptr.
  const Json* referred(const std::string& pointer) const {
    try {
      const Json::json_pointer at(pointer);
      if (document_.contains(at)) return &document_.at(at);
    } catch (const nlohmann::json::exception&) {
    }
    return nullptr;
  }

  static uint8_t read_type(const Json& schema, const std::string& pointer) {
    const auto type = schema.find("type");
    if (type == schema.end()) return kAnyKind;
    static const std::map<std::string, uint8_t, std::less<>> kTypes = {
        {"object", kObjectKind},
        {"array", kArrayKind},
        {"string", kStringKind},
        {"integer", kIntegerKind},
        {"number", kNumberKind | kIntegerKind},
        {"boolean", kBooleanKind},
        {"null", kNullKind},
    };
    uint8_t kinds = 0;
    const auto add = [&](const Json& name) {
      const auto known =
          name.is_string() ? kTypes.find(name.get_ref<const std::string&>()) : kTypes.end();
      if (known == kTypes.end())
        fail(child_pointer(pointer, "type"),
             "type is one of object, array, string, integer, number, boolean and null, or a "
             "list of them, not " +
                 describe(name));
      kinds |= known->second;
    };
    if (type->is_array()) {
      for (const Json& name : *type) add(name);
    } else {
      add(*type);
    }
    if (kinds == 0) fail(child_pointer(pointer, "type"), "type lists no type");
    return kinds;
  }

  static uint32_t read_count(const Json& schema, const char* keyword, const std::string& pointer,
                             uint32_t fallback) {
    const auto value = schema.find(keyword);
    if (value == schema.end()) return fallback;
    // An integer, written as one or not (2.0, -0).
    const double count = value->is_number() ? value->get<double>() : -1;
    if (!(count >= 0 && count < JsonSchema::kUnlimited && std::trunc(count) == count))
      fail(child_pointer(pointer, keyword),
           std::string(keyword) + " must be a non-negative integer below 2^32 - 1");
    return uint32_t(count);
  }

  // minimum, maximum and their exclusive forms, as the integers they leave: of integers only (a
  // number's fraction would need them digit by digit), within 64 bits.
  static void read_bounds(const Json& schema, const std::string& pointer, JsonSchema::Node& n) {
    struct Bound {
      const char* keyword;
      bool lower, exclusive;
    };
    static constexpr Bound kBounds[] = {{"minimum", true, false},
                                        {"exclusiveMinimum", true, true},
                                        {"maximum", false, false},
                                        {"exclusiveMaximum", false, true}};
    for (const Bound& b : kBounds) {
      const auto value = schema.find(b.keyword);
      if (value == schema.end()) continue;
      const std::string at = child_pointer(pointer, b.keyword);
      if (!value->is_number()) fail(at, std::string(b.keyword) + " must be a number");
      if (n.kinds & kNumberKind)
        fail(at, std::string(b.keyword) + " is supported on integers only (type \"integer\")");
      const std::optional<int64_t> edge = integer_edge(*value, b.lower, b.exclusive);
      if (!edge) fail(at, std::string(b.keyword) + " must leave a 64-bit integer");
      if (b.lower) {
        n.minimum = n.has_minimum ? std::max(n.minimum, *edge) : *edge;
        n.has_minimum = true;
      } else {
        n.maximum = n.has_maximum ? std::min(n.maximum, *edge) : *edge;
        n.has_maximum = true;
      }
    }
    if (n.has_minimum && n.has_maximum && n.minimum > n.maximum)
      fail(pointer, "no integer lies within its minimum and maximum");
  }

  // The first integer a lower bound leaves (or the last an upper one does), exactly for an
  // integer bound; nullopt beyond 64 bits.
  static std::optional<int64_t> integer_edge(const Json& bound, bool lower, bool exclusive) {
    const int step = exclusive ? (lower ? 1 : -1) : 0;
    if (bound.is_number_integer()) {
      const std::optional<int64_t> value = json_int64(bound);
      if (!value) return std::nullopt;  // above 2^63 - 1
      if ((step == 1 && *value == INT64_MAX) || (step == -1 && *value == INT64_MIN))
        return std::nullopt;
      return *value + step;
    }
    const double value = bound.get<double>();
    const double edge = lower ? (exclusive ? std::floor(value) + 1 : std::ceil(value))
                              : (exclusive ? std::ceil(value) - 1 : std::floor(value));
    constexpr double kTwoTo63 = 9223372036854775808.0;
    if (!(edge >= -kTwoTo63 && edge < kTwoTo63)) return std::nullopt;
    return int64_t(edge);
  }

  // enum and const: the values it may be, as compact JSON texts, those of another type left out.
  void compile_texts(const Json& schema, const std::string& pointer, int index) {
    const uint8_t kinds = read_type(schema, pointer);
    const bool is_enum = schema.contains("enum");
    std::vector<const Json*> values;
    if (is_enum) {
      const Json& listed = schema.at("enum");
      if (!listed.is_array() || listed.empty())
        fail(child_pointer(pointer, "enum"), "enum must be a list of at least one value");
      for (const Json& value : listed) values.push_back(&value);
    } else {
      values.push_back(&schema.at("const"));
    }
    JsonSchema::Node& texts_node = node(index);
    texts_node.kinds = 0;
    texts_node.min_depth = JsonSchema::Node::kNever;  // its least nesting, as its texts have it
    for (const Json* listed : values) {
      const Json& value = *listed;
      const int nesting = nesting_of(value, JsonPrefix::kMaxDepth);
      if (nesting > JsonPrefix::kMaxDepth)
        fail(pointer, std::string(is_enum ? "an enum" : "the const") + " value nests deeper than " +
                          std::to_string(JsonPrefix::kMaxDepth) + " levels");
      uint8_t kind = kind_of(value);
      if (kind == kNumberKind && (kinds & kIntegerKind) &&
          std::trunc(value.get<double>()) == value.get<double>())
        kind = kIntegerKind;  // 1.0 is an integer
      if (!(kinds & kind)) continue;
      texts_node.kinds |= kind;
      const uint8_t depth = uint8_t(nesting);
      texts_node.min_depth = std::min(texts_node.min_depth, depth);
      if (kind == kObjectKind) texts_node.object_depth = std::min(texts_node.object_depth, depth);
      if (kind == kArrayKind) texts_node.array_depth = std::min(texts_node.array_depth, depth);
      try {
        texts_node.texts.push_back(value.dump());
      } catch (const nlohmann::json::exception&) {
        fail(pointer, "an enum value is not valid UTF-8");
      }
    }
    if (texts_node.texts.empty())
      fail(pointer, std::string(is_enum ? "enum" : "const") + " has no value of its type");
    std::sort(texts_node.texts.begin(), texts_node.texts.end());
    texts_node.texts.erase(std::unique(texts_node.texts.begin(), texts_node.texts.end()),
                           texts_node.texts.end());
  }

  void compile_branches(const Json& schema, const std::string& pointer, int index, int nesting) {
    const char* keyword = schema.contains("anyOf") ? "anyOf" : "oneOf";
    const Json& list = schema.at(keyword);
    if (!list.is_array() || list.empty())
      fail(child_pointer(pointer, keyword),
           std::string(keyword) + " must be a list of at least one schema");
    for (size_t i = 0; i < list.size(); ++i) {
      const int branch =
          compile(list[i], child_pointer(pointer, keyword) + "/" + std::to_string(i), nesting + 1);
      node(index).branches.push_back(branch);
    }
  }

  void compile_object(const Json& schema, const std::string& pointer, int index, int nesting) {
    std::vector<JsonSchema::Property> properties;
    if (const auto listed = schema.find("properties"); listed != schema.end()) {
      if (!listed->is_object())
        fail(child_pointer(pointer, "properties"), "properties is an object");
      const std::string at = child_pointer(pointer, "properties");
      for (const auto& [key, subschema] : listed->items())
        properties.push_back(
            {Json(key).dump(), compile(subschema, child_pointer(at, key), nesting + 1), false});
    }
    if (const auto required = schema.find("required"); required != schema.end()) {
      if (!required->is_array()) fail(child_pointer(pointer, "required"), "required is a list");
      for (const Json& name : *required) {
        const std::string key = name.is_string() ? Json(name).dump() : "";
        const auto property = std::find_if(properties.begin(), properties.end(),
                                           [&](const auto& p) { return p.key == key; });
        if (property == properties.end())
          fail(child_pointer(pointer, "required"),
               "required lists " + describe(name) + ", which is not among its properties");
        property->required = true;
      }
    }
    const int other_keys = compile_other_keys(schema, pointer, !properties.empty(), nesting);
    JsonSchema::Node& object = node(index);
    object.other_keys = other_keys;
    object.properties = std::move(properties);
    const size_t count = object.properties.size();
    std::vector<uint32_t> order(count);
    std::iota(order.begin(), order.end(), 0u);
    std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
      return object.properties[a].key < object.properties[b].key;
    });
    for (uint32_t i : order) object.key_texts.push_back(object.properties[i].key);
    object.key_properties = std::move(order);
    object.next_required.assign(count + 1, uint32_t(count));
    for (size_t i = count; i-- > 0;)
      object.next_required[i] =
          object.properties[i].required ? uint32_t(i) : object.next_required[i + 1];
  }

  // additionalProperties: with properties, only false (or nothing: keys come in their order);
  // without, any key, its value as the subschema says.
  int compile_other_keys(const Json& schema, const std::string& pointer, bool has_properties,
                         int nesting) {
    const auto other = schema.find("additionalProperties");
    if (other == schema.end()) return has_properties ? -1 : 0;
    if (other->is_boolean() && !other->get<bool>()) return -1;
    if (has_properties)
      fail(child_pointer(pointer, "additionalProperties"),
           "additionalProperties beside properties is supported as false only");
    return compile(*other, child_pointer(pointer, "additionalProperties"), nesting + 1);
  }

  void compile_array(const Json& schema, const std::string& pointer, int index, int nesting) {
    int items = 0;
    if (const auto listed = schema.find("items"); listed != schema.end()) {
      if (listed->is_array())
        fail(child_pointer(pointer, "items"), "items as a list (a tuple) is not supported");
      items = compile(*listed, child_pointer(pointer, "items"), nesting + 1);
    }
    JsonSchema::Node& array = node(index);
    array.items = items;
    array.min_items = read_count(schema, "minItems", pointer, 0);
    array.max_items = read_count(schema, "maxItems", pointer, JsonSchema::kUnlimited);
    if (array.min_items > array.max_items) fail(pointer, "minItems is above maxItems");
  }

  // anyOf within anyOf is one list of alternatives that are not themselves lists; the first
  // byte of a value must tell which it is.
  void flatten_branches() {
    for (size_t index = 0; index < nodes_->size(); ++index) {
      if (node(int(index)).branches.empty()) continue;
      std::vector<int> leaves;
      std::set<int> visiting;
      collect_leaves(int(index), visiting, leaves);
      uint8_t classes = 0;
      node(int(index)).kinds = 0;
      for (size_t i = 0; i < leaves.size(); ++i) {
        const uint8_t leaf_classes = first_byte_classes(node(leaves[i]).kinds);
        if (classes & leaf_classes) {
          const int other = *std::find_if(leaves.begin(), leaves.begin() + long(i), [&](int l) {
            return first_byte_classes(node(l).kinds) & leaf_classes;
          });
          fail(node(int(index)).pointer,
               "alternatives #" + node(other).pointer + " and #" + node(leaves[i]).pointer +
                   " both admit " + class_name(classes & leaf_classes) +
                   ": a value's first byte must tell the alternatives apart");
        }
        classes |= leaf_classes;
        node(int(index)).kinds |= node(leaves[i]).kinds;
      }
      node(int(index)).branches = std::move(leaves);
    }
  }

  void collect_leaves(int index, std::set<int>& visiting, std::vector<int>& leaves) {
    const JsonSchema::Node& branching = node(index);
    if (branching.branches.empty()) {
      if (std::find(leaves.begin(), leaves.end(), index) == leaves.end()) leaves.push_back(index);
      return;
    }
    if (!visiting.insert(index).second)
      fail(branching.pointer, "its alternatives lead back to it before any value begins");
    for (int branch : std::vector<int>(branching.branches))
      collect_leaves(branch, visiting, leaves);
    visiting.erase(index);
  }

  // The least nesting each node's values need: a least fixpoint, since a schema may refer to
  // itself. Every kind of value a node admits must have a finite one (a model may begin any of
  // them: recursion must pass through something it can leave out, or an alternative that ends
  // it), and the root's must fit in JsonPrefix's nesting.
  void compute_depths() {
    constexpr int kInfinite = std::numeric_limits<int>::max();
    const size_t count = nodes_->size();
    std::vector<int> any(count, kInfinite), object(count, kInfinite), array(count, kInfinite);
    const auto deeper = [](int depth) { return depth == kInfinite ? kInfinite : depth + 1; };
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t index = count; index-- > 0;) {  // subschemas come after what holds them
        const JsonSchema::Node& n = node(int(index));
        int o = kInfinite, a = kInfinite, m = kInfinite;
        if (!n.branches.empty()) {
          for (int leaf : n.branches) {
            o = std::min(o, object[size_t(leaf)]);
            a = std::min(a, array[size_t(leaf)]);
            m = std::min(m, any[size_t(leaf)]);
          }
        } else if (!n.texts.empty()) {  // compile_texts measured them
          const auto unstored = [](uint8_t depth) {
            return depth == JsonSchema::Node::kNever ? kInfinite : int(depth);
          };
          o = unstored(n.object_depth);
          a = unstored(n.array_depth);
          m = unstored(n.min_depth);
        } else {
          if (n.kinds & kObjectKind) {
            int deepest = 0;  // of the required properties
            for (const auto& property : n.properties)
              if (property.required) deepest = std::max(deepest, any[size_t(property.node)]);
            o = deeper(deepest);
          }
          if (n.kinds & kArrayKind) a = n.min_items == 0 ? 1 : deeper(any[size_t(n.items)]);
          m = n.kinds & ~(kObjectKind | kArrayKind) ? 0 : std::min(o, a);
        }
        if (o < object[index] || a < array[index] || m < any[index]) {
          object[index] = o;
          array[index] = a;
          any[index] = m;
          changed = true;
        }
      }
    }
    const auto stored = [](int depth) {
      return depth == kInfinite ? JsonSchema::Node::kNever
                                : uint8_t(std::min(depth, JsonSchema::Node::kNever - 1));
    };
    for (size_t index = 0; index < count; ++index) {
      JsonSchema::Node& n = node(int(index));
      if (n.branches.empty() && n.texts.empty()) {
        if ((n.kinds & kObjectKind) && object[index] == kInfinite)
          fail(n.pointer, "no object of it is finite: it requires itself");
        if ((n.kinds & kArrayKind) && array[index] == kInfinite)
          fail(n.pointer, "no array of it is finite: it requires itself");
      }
      n.min_depth = stored(any[index]);
      n.object_depth = stored(object[index]);
      n.array_depth = stored(array[index]);
    }
    if (node(root_).min_depth > JsonPrefix::kMaxDepth)
      fail(node(root_).pointer, "its values need more than " +
                                    std::to_string(JsonPrefix::kMaxDepth) + " levels of nesting");
  }

  const Json& document_;
  std::vector<JsonSchema::Node>* nodes_ = nullptr;
  std::map<std::string, int> compiled_;  // pointer -> node
  int root_ = 0;
};

std::shared_ptr<const JsonSchema> JsonSchema::compile(const nlohmann::ordered_json& schema) {
  return JsonSchemaCompiler(schema).run();
}

std::shared_ptr<const JsonSchema> JsonSchema::any_object() {
  static const std::shared_ptr<const JsonSchema> schema = compile({{"type", "object"}});
  return schema;
}

}  // namespace pipeline
