#include "io/json_schema.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

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
    if (is_alias(schema)) return compile_alias(schema, pointer, nesting);
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

  // An alias is the node of the subschema its chain of aliases ends at, compiled there, so that
  // a reference back to any link of it, from inside what it ends at, finds that node. Every
  // link is recorded as that node, and a chain stops at a link recorded before: references to
  // many links of one long chain follow each link once.
  int compile_alias(const Json& schema, const std::string& pointer, int nesting) {
    std::vector<std::string> links{pointer};
    std::unordered_set<std::string> in_chain{pointer};
    const Json* at = &schema;
    std::string at_pointer = pointer;
    int index = -1;
    while (index < 0) {
      std::tie(at, at_pointer) = next_link(*at, at_pointer);
      if (const auto known = compiled_.find(at_pointer); known != compiled_.end()) {
        index = known->second;
      } else if (!at->is_object() || !is_alias(*at)) {
        index = compile(*at, at_pointer, nesting + 1);  // which checks what the chain ends at
      } else {
        if (!in_chain.insert(at_pointer).second) fail(at_pointer, "$ref leads back to itself");
        check_keywords(*at, at_pointer);
        links.push_back(at_pointer);
      }
    }
    for (const std::string& link : links) compiled_[link] = index;
    return index;
  }

  // The subschema an alias stands for, and its place.
  std::pair<const Json*, std::string> next_link(const Json& alias, const std::string& pointer) {
    if (const auto all = alias.find("allOf"); all != alias.end()) {
      if (!all->is_array() || all->size() != 1)
        fail(pointer, "allOf is supported with one schema only");
      return {&(*all)[0], child_pointer(pointer, "allOf") + "/0"};
    }
    const Json& ref = alias.at("$ref");
    if (!ref.is_string() || ref.get_ref<const std::string&>().rfind('#', 0) != 0)
      fail(pointer, "$ref must be a place in this schema, '#' or '#/...'");
    std::string target = ref.get_ref<const std::string&>().substr(1);
    const Json* at = referred(target);
    if (!at) fail(pointer, "$ref '#" + target + "' names nothing in this schema");
    return {at, std::move(target)};
  }

  // The subschema at a JSON pointer into the document (RFC 6901), or nullptr. Walked here, not
  // by nlohmann's json_pointer, which finds an object's member by a linear search: a schema of
  // many $refs into one large object would cost their product.
  const Json* referred(const std::string& pointer) {
    if (!pointer.empty() && pointer[0] != '/') return nullptr;
    const Json* at = &document_;
    for (size_t slash = 0; slash < pointer.size() && at;) {
      const size_t next = std::min(pointer.find('/', slash + 1), pointer.size());
      const std::optional<std::string> token =
          unescape(pointer.substr(slash + 1, next - slash - 1));
      at = token ? member(*at, *token) : nullptr;
      slash = next;
    }
    return at;
  }

  // A pointer's token as the key it names: "~1" is "/" and "~0" is "~"; any other "~" is an
  // error.
  static std::optional<std::string> unescape(const std::string& token) {
    std::string key;
    for (size_t i = 0; i < token.size(); ++i) {
      if (token[i] != '~') {
        key += token[i];
        continue;
      }
      if (i + 1 == token.size() || (token[i + 1] != '0' && token[i + 1] != '1'))
        return std::nullopt;
      key += token[++i] == '0' ? '~' : '/';
    }
    return key;
  }

  // An object's member by its key (through an index of the object's members, built at its
  // first lookup), or an array's item by its index, written without leading zeros.
  const Json* member(const Json& container, const std::string& token) {
    if (container.is_array()) {
      const bool index =
          !token.empty() && token.size() < 19 && (token == "0" || token[0] != '0') &&
          std::all_of(token.begin(), token.end(), [](char c) { return c >= '0' && c <= '9'; });
      if (!index || std::stoull(token) >= container.size()) return nullptr;
      return &container[std::stoull(token)];
    }
    if (!container.is_object()) return nullptr;
    auto [members, added] = members_.try_emplace(&container);
    if (added)
      for (const auto& [key, value] : container.items()) members->second.emplace(key, &value);
    const auto found = members->second.find(token);
    return found == members->second.end() ? nullptr : found->second;
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
      std::unordered_map<std::string_view, size_t> by_key;  // a property's place, by its key
      for (size_t i = 0; i < properties.size(); ++i) by_key.emplace(properties[i].key, i);
      for (const Json& name : *required) {
        const auto property = name.is_string() ? by_key.find(Json(name).dump()) : by_key.end();
        if (property == by_key.end())
          fail(child_pointer(pointer, "required"),
               "required lists " + describe(name) + ", which is not among its properties");
        properties[property->second].required = true;
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

  // The least nesting a node's values need: any value, an object, an array.
  static constexpr int kInfinite = std::numeric_limits<int>::max();
  struct Depths {
    int any = kInfinite, object = kInfinite, array = kInfinite;
    bool below(const Depths& other) const {
      return any < other.any || object < other.object || array < other.array;
    }
  };

  // A node's depths from those of the nodes it is made of.
  Depths depths_of(const JsonSchema::Node& n, const std::vector<Depths>& depths) const {
    const auto deeper = [](int depth) { return depth == kInfinite ? kInfinite : depth + 1; };
    Depths d;
    if (!n.branches.empty()) {
      for (int leaf : n.branches) {
        d.object = std::min(d.object, depths[size_t(leaf)].object);
        d.array = std::min(d.array, depths[size_t(leaf)].array);
        d.any = std::min(d.any, depths[size_t(leaf)].any);
      }
      return d;
    }
    if (!n.texts.empty()) {  // compile_texts measured them
      const auto unstored = [](uint8_t depth) {
        return depth == JsonSchema::Node::kNever ? kInfinite : int(depth);
      };
      return {unstored(n.min_depth), unstored(n.object_depth), unstored(n.array_depth)};
    }
    if (n.kinds & kObjectKind) {
      int deepest = 0;  // of the required properties
      for (const auto& property : n.properties)
        if (property.required) deepest = std::max(deepest, depths[size_t(property.node)].any);
      d.object = deeper(deepest);
    }
    if (n.kinds & kArrayKind) d.array = n.min_items == 0 ? 1 : deeper(depths[size_t(n.items)].any);
    d.any = n.kinds & ~(kObjectKind | kArrayKind) ? 0 : std::min(d.object, d.array);
    return d;
  }

  // The nodes a node's depths are made of: what depths_of reads.
  static std::vector<int> parts_of(const JsonSchema::Node& n) {
    if (!n.branches.empty()) return n.branches;
    std::vector<int> parts;
    if (!n.texts.empty()) return parts;
    if (n.kinds & kObjectKind)
      for (const auto& property : n.properties)
        if (property.required) parts.push_back(property.node);
    if ((n.kinds & kArrayKind) && n.min_items > 0) parts.push_back(n.items);
    return parts;
  }

  // Every node after the nodes it is made of, except where they make a cycle: a depth-first
  // search's post-order.
  static std::vector<int> parts_first(const std::vector<std::vector<int>>& parts) {
    std::vector<int> order;
    std::vector<bool> seen(parts.size(), false);
    std::vector<std::pair<int, size_t>> path;  // a node, and the next of its parts to visit
    for (size_t first = 0; first < parts.size(); ++first) {
      if (seen[first]) continue;
      seen[first] = true;
      path.push_back({int(first), 0});
      while (!path.empty()) {
        auto& [at, next] = path.back();
        if (next == parts[size_t(at)].size()) {
          order.push_back(at);
          path.pop_back();
          continue;
        }
        const int part = parts[size_t(at)][next++];
        if (seen[size_t(part)]) continue;
        seen[size_t(part)] = true;
        path.push_back({part, 0});
      }
    }
    return order;
  }

  // The least nesting each node's values need: a least fixpoint, since a schema may refer to
  // itself. A worklist finds it: nodes are taken after their parts, and again only when a part
  // came down, so a schema without recursion evaluates each node once (iterating over every
  // node until nothing changed took one pass per link of a chain of $refs). Every kind of value
  // a node admits must have a finite one (a model may begin any of them: recursion must pass
  // through something it can leave out, or an alternative that ends it), and the root's must
  // fit in JsonPrefix's nesting.
  void compute_depths() {
    const size_t count = nodes_->size();
    std::vector<std::vector<int>> parts(count), wholes(count);
    for (size_t index = 0; index < count; ++index) {
      parts[index] = parts_of(node(int(index)));
      for (int part : parts[index]) wholes[size_t(part)].push_back(int(index));
    }
    const std::vector<int> order = parts_first(parts);
    std::deque<int> work(order.begin(), order.end());
    std::vector<bool> queued(count, true);
    std::vector<Depths> depths(count);
    while (!work.empty()) {
      const size_t index = size_t(work.front());
      work.pop_front();
      queued[index] = false;
      const Depths now = depths_of(node(int(index)), depths);
      if (!now.below(depths[index])) continue;
      depths[index] = now;
      for (int whole : wholes[index])
        if (!queued[size_t(whole)]) {
          queued[size_t(whole)] = true;
          work.push_back(whole);
        }
    }
    const auto stored = [](int depth) {
      return depth == kInfinite ? JsonSchema::Node::kNever
                                : uint8_t(std::min(depth, JsonSchema::Node::kNever - 1));
    };
    for (size_t index = 0; index < count; ++index) {
      JsonSchema::Node& n = node(int(index));
      if (n.branches.empty() && n.texts.empty()) {
        if ((n.kinds & kObjectKind) && depths[index].object == kInfinite)
          fail(n.pointer, "no object of it is finite: it requires itself");
        if ((n.kinds & kArrayKind) && depths[index].array == kInfinite)
          fail(n.pointer, "no array of it is finite: it requires itself");
      }
      n.min_depth = stored(depths[index].any);
      n.object_depth = stored(depths[index].object);
      n.array_depth = stored(depths[index].array);
    }
    if (node(root_).min_depth > JsonPrefix::kMaxDepth)
      fail(node(root_).pointer, "its values need more than " +
                                    std::to_string(JsonPrefix::kMaxDepth) + " levels of nesting");
  }

  const Json& document_;
  std::vector<JsonSchema::Node>* nodes_ = nullptr;
  std::map<std::string, int> compiled_;  // pointer -> node
  // The members of each object a $ref has looked into, by key.
  std::unordered_map<const Json*, std::unordered_map<std::string, const Json*>> members_;
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
