// response_format json_schema: the schema compiler (JsonSchema) and the recogniser that holds
// bytes to it (SchemaPrefix). An independent validator of the same keywords checks what the
// recogniser lets through.
#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "io/json_schema.h"
#include "io/schema_prefix.h"
#include "tests/support/schema_prefix_checks.h"

namespace pipeline {
namespace {

using Json = nlohmann::ordered_json;

std::shared_ptr<const JsonSchema> compile(const std::string& schema) {
  return JsonSchema::compile(Json::parse(schema));
}

using testing::Fed;
using testing::feed_all;

// ---- An independent validator of the supported keywords, as JSON Schema reads them, plus the
// order of keys that structured outputs promise.

size_t code_points(const std::string& text) {
  size_t count = 0;
  for (char c : text) count += (uint8_t(c) & 0xC0) != 0x80;
  return count;
}

// A number with no fraction; nlohmann reads one beyond 64 bits as a double.
bool is_integer(const Json& value) {
  return value.is_number_integer() ||
         (value.is_number_float() && std::trunc(value.get<double>()) == value.get<double>());
}

bool validates(const Json& schema, const Json& value, const Json& root) {
  if (schema.is_boolean()) return schema.get<bool>();
  if (schema.contains("$ref"))
    return validates(root.at(Json::json_pointer(schema["$ref"].get<std::string>().substr(1))),
                     value, root);
  if (schema.contains("allOf")) return validates(schema["allOf"][0], value, root);
  for (const char* any : {"anyOf", "oneOf"})
    if (schema.contains(any)) {
      for (const Json& branch : schema[any])
        if (validates(branch, value, root)) return true;
      return false;
    }
  if (schema.contains("const") && value != schema["const"]) return false;
  if (schema.contains("enum") &&
      std::find(schema["enum"].begin(), schema["enum"].end(), value) == schema["enum"].end())
    return false;
  if (schema.contains("type")) {
    const Json types = schema["type"].is_array() ? schema["type"] : Json::array({schema["type"]});
    bool fits = false;
    for (const Json& type : types) {
      const std::string name = type;
      fits = fits || (name == "object" && value.is_object()) ||
             (name == "array" && value.is_array()) || (name == "string" && value.is_string()) ||
             (name == "integer" && is_integer(value)) || (name == "number" && value.is_number()) ||
             (name == "boolean" && value.is_boolean()) || (name == "null" && value.is_null());
    }
    if (!fits) return false;
  }
  if (value.is_object()) {
    const Json properties = schema.value("properties", Json::object());
    const Json others = schema.value("additionalProperties", Json(properties.empty()));
    size_t next = 0;  // keys come in the order of properties
    for (const auto& [key, member] : value.items()) {
      size_t at = 0;  // the property's place among properties
      for (const auto& [name, subschema] : properties.items()) {
        if (name == key) break;
        ++at;
      }
      if (at < properties.size()) {
        if (at < next || !validates(properties[key], member, root)) return false;
        next = at + 1;
      } else if (!validates(others, member, root)) {
        return false;
      }
    }
    for (const Json& name : schema.value("required", Json::array()))
      if (!value.contains(name.get<std::string>())) return false;
  }
  if (value.is_array()) {
    if (value.size() < schema.value("minItems", size_t(0)) ||
        value.size() > schema.value("maxItems", SIZE_MAX))
      return false;
    for (const Json& item : value)
      if (!validates(schema.value("items", Json(true)), item, root)) return false;
  }
  if (value.is_number()) {
    const double number = value.get<double>();
    if ((schema.contains("minimum") && number < schema["minimum"].get<double>()) ||
        (schema.contains("maximum") && number > schema["maximum"].get<double>()) ||
        (schema.contains("exclusiveMinimum") &&
         number <= schema["exclusiveMinimum"].get<double>()) ||
        (schema.contains("exclusiveMaximum") && number >= schema["exclusiveMaximum"].get<double>()))
      return false;
  }
  if (value.is_string()) {
    const size_t length = code_points(value.get<std::string>());
    if (length < schema.value("minLength", size_t(0)) ||
        length > schema.value("maxLength", SIZE_MAX))
      return false;
  }
  return true;
}

// Schemas of every supported kind, each with values it admits and prefixes it refuses.
const char* const kPerson = R"({
  "type": "object",
  "properties": {
    "name": {"type": "string", "minLength": 1, "maxLength": 5},
    "age": {"type": "integer"},
    "tags": {"type": "array", "items": {"enum": ["a", "bc"]}, "maxItems": 2},
    "nick": {"type": ["string", "null"]}
  },
  "required": ["name", "age"]
})";
const char* const kTree = R"({
  "$defs": {"node": {"type": "object",
                     "properties": {"v": {"type": "integer"},
                                    "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
                     "required": ["v"]}},
  "$ref": "#/$defs/node"
})";
const char* const kOwner = R"({
  "$defs": {"Pet": {"properties": {"kind": {"enum": ["cat", "dog"], "title": "Kind",
                                            "type": "string"}},
                    "required": ["kind"], "title": "Pet", "type": "object"}},
  "properties": {"name": {"title": "Name", "type": "string"},
                 "pet": {"anyOf": [{"$ref": "#/$defs/Pet"}, {"type": "null"}], "default": null}},
  "required": ["name"], "title": "Owner", "type": "object"
})";
const char* const kList = R"({
  "$defs": {"L": {"type": "object",
                  "properties": {"v": {"type": "integer"},
                                 "next": {"anyOf": [{"$ref": "#/$defs/L"}, {"type": "null"}]}},
                  "required": ["v", "next"]}},
  "$ref": "#/$defs/L"
})";
const char* const kBinaryTree = R"({
  "anyOf": [{"type": "object", "properties": {"l": {"$ref": "#"}, "r": {"$ref": "#"}},
             "required": ["l", "r"]},
            {"type": "integer"}]
})";
const char* const kScalars = R"({
  "anyOf": [{"type": "string", "maxLength": 1}, {"type": "integer"}, {"type": "null"}]
})";
const char* const kEnum = R"({"enum": ["red", "green", 1, [1, 2], {"a": null}, 2.5]})";
const char* const kCounts = R"({"type": "object", "additionalProperties": {"type": "integer"}})";
const char* const kMatrix = R"({
  "type": "array", "minItems": 1, "maxItems": 3,
  "items": {"type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": 2}
})";

// Objects nested `levels` deep, each requiring the next.
std::string deeply_nested(int levels) {
  std::string schema = R"({"type": "integer"})";
  for (int i = 0; i < levels; ++i)
    schema = R"({"type": "object", "properties": {"a": )" + schema + R"(}, "required": ["a"]})";
  return schema;
}

struct Case {
  const char* schema;
  std::vector<std::string> admitted;
  // Each prefix is accepted, and the text after it is refused at its first byte.
  std::vector<std::pair<std::string, std::string>> refused;
};

const std::vector<Case>& cases() {
  static const std::vector<Case> all = {
      {kPerson,
       {R"({"name":"Li","age":3})", R"({"name":"Lé","age":-12,"tags":["bc","a"],"nick":null})",
        "{\n  \"name\": \"x\",\n  \"age\": 0\n}", R"({"name":"\u00e9","age":1,"nick":"z"})"},
       {{"", "["},                           // an object
        {"{\"", "a"},                        // name comes first: it is required
        {"{\"name\":\"", "\""},              // minLength 1
        {"{\"name\":\"abcde", "f"},          // maxLength 5
        {"{\"name\":\"a\",\"age\":1", "."},  // an integer
        {"{\"name\":\"a\",\"age\":1", "e"},  //
        {"{\"name\":\"a\"", "}"},            // age is required
        {"{\"name\":\"a\",\"age\":1,\"tags\":[\"a\",\"a\"", ","},  // maxItems 2
        {"{\"name\":\"a\",\"age\":1,\"tags\":[\"b", "\""},         // "bc" or "a"
        {"{\"name\":\"a\",\"age\":1,\"nick\":null", ","},  // nothing after the last property
        {"{\"name\":\"a\",\"age\":1,\"n", "a"},            // name again: keys come in order
        {"{\"name\":\"a\",\"age\":1,\"", "x"},             // no other key
        {"{\"name\":\"a\",\"age\":1,\"tags\":", "{"},      //
        {"{\"name\":\"a\",\"age\":1,\"nick\":", "1"}}},
      {kTree,
       {R"({"v":1,"kids":[{"v":2},{"v":3,"kids":[]}]})", R"({"v":0})"},
       {{"{\"v\":1,\"kids\":[{\"", "k"}, {"{\"v\":1,\"kids\":[", "1"}}},
      {kOwner,
       {R"({"name":"Ann","pet":{"kind":"dog"}})", R"({"name":"Ann","pet":null})",
        R"({"name":"Ann"})"},
       {{"{\"name\":\"Ann\",\"pet\":", "\""}, {"{\"name\":\"Ann\",\"pet\":{\"kind\":\"c", "o"}}},
      {kList,
       {R"({"v":1,"next":{"v":2,"next":null}})", R"({"v":0,"next":null})"},
       {{"{\"v\":1,\"next\":", "\""}, {"{\"v\":1,\"next\":null", ","}, {"{\"v\":1", "}"}}},
      {kBinaryTree, {R"({"l":1,"r":{"l":2,"r":3}})", "7"}, {{"{\"l\":1", "}"}, {"{\"l\":", "n"}}},
      {kScalars,
       {R"("a")", "5", "-40", "null", R"("")"},
       {{"\"a", "b"}, {"5", "."}, {"", "t"}, {"5", " "}}},
      {kEnum,
       {R"("red")", R"("green")", "1", "[1,2]", R"({"a":null})", "2.5"},
       {{"\"re", "\""}, {"[1,", " "}, {"1", "2"}, {"", "3"}, {"2.", "4"}}},
      {kCounts, {R"({"x":1,"y":-2})", "{}", R"({"":0})"}, {{"{\"x\":", "\""}, {"{\"x\":1", "."}}},
      {kMatrix,
       {"[[1,2.5]]", "[[1,2],[3e2,-4],[0,0]]"},
       {{"", "{"}, {"[", "]"}, {"[[1", "]"}, {"[[1,2", ","}, {"[[1,2],[3,4],[5,6]", ","}}},
      {R"({"type": "integer"})", {"42", "-0", "7"}, {{"4", "."}, {"42", " "}, {"", "\""}}},
      {R"({"type": "integer", "minimum": -5, "maximum": 120})",
       {"0", "-5", "120", "7", "-0", "-1", "99"},
       {{"-", "6"}, {"12", "1"}, {"120", "0"}, {"-5", "0"}, {"30", "0"}}},
      {R"({"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 10})",
       {"1", "9"},
       {{"", "0"}, {"1", "0"}, {"", "-"}}},
      {R"({"type": "integer", "minimum": -9223372036854775808, "maximum": 9223372036854775807})",
       {"0", "9223372036854775807", "-9223372036854775808"},
       {{"922337203685477580", "8"}, {"-922337203685477580", "9"}}},
      {R"({"$ref": "#/$defs/n", "$defs": {"n": {"type": "array", "items": {"$ref": "#"}}}})",
       {"[[],[[]]]", "[]"},
       {{"[", "{"}}},
      {R"({"type": "string", "minLength": 1.0, "maxLength": 2.0})", {R"("ab")"}, {{"\"ab", "c"}}},
      {R"({"type": "integer", "minimum": 10.5})",
       {"11", "99999999999999999999999"},
       {{"", "-"}, {"", "0"}}},
      {R"({"type": ["integer", "null"], "maximum": -3})",
       {"-3", "-40", "null"},
       {{"", "0"}, {"", "1"}, {"-", "0"}}},
      {R"({"type": "string", "maxLength": 2})",
       {R"("ab")", R"("\uD83D\uDE00a")", R"("é€")"},
       {{"\"ab", "c"}, {"\"\\uD83D\\uDE00a", "b"}}},
      {R"({"type": "object", "additionalProperties": false})", {"{}"}, {{"{", "\""}}},
      {R"({"const": {"k": [true]}})", {R"({"k":[true]})"}, {{"{\"k\":[true", ","}}},
      // $ref's pointers: "~1" for "/", "~0" for "~", array indices, "#/" for the key "".
      {R"({"$defs": {"a/b~": {"type": "integer"}, "l": [{"type": "null"}, {"type": "boolean"}],
                     "": {"type": "string"}},
          "type": "array", "items": {"anyOf": [{"$ref": "#/$defs/a~1b~0"}, {"$ref": "#/$defs/l/1"},
                                               {"$ref": "#/$defs/"}]}})",
       {R"([1,true,"x"])"},
       {{"[", "n"}, {"[1,", "{"}}},
      // true, any value at all, as the whole schema and inside containers the schema follows.
      {"true", {R"({"a":1})", "[{}]", R"({"a":{"b":[1]}})", "null"}, {{"{\"a\":1", "]"}}},
      {R"({"properties": {"a": true}})",
       {R"({"a":{"b":1}})", R"({"a":[{"c":null}]})"},
       {{"{\"a\":{\"b\":1", "]"}}},
      {R"({"type": "array", "items": true, "minItems": 1})", {R"([{"k":2}])"}, {{"[", "]"}}},
  };
  return all;
}

TEST(SchemaPrefix, AcceptsWhatTheSchemaAdmitsAndRefusesTheRestAtTheFirstByte) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.schema);
    const auto schema = compile(c.schema);
    const Json document = Json::parse(c.schema);
    for (const std::string& text : c.admitted) {
      SCOPED_TRACE(text);
      ASSERT_TRUE(validates(document, Json::parse(text), document)) << "a bad test case";
      const Fed fed = feed_all(*schema, text);
      EXPECT_EQ(fed.accepted, text.size());
      EXPECT_TRUE(fed.complete);
      for (size_t end = 0; end < text.size(); ++end) {
        // A prefix is whole only where the value is (a number's digits may go on).
        const std::string prefix = text.substr(0, end);
        if (feed_all(*schema, prefix).complete) {
          EXPECT_TRUE(validates(document, Json::parse(prefix), document)) << prefix;
        }
      }
    }
    for (const auto& [prefix, rest] : c.refused) {
      SCOPED_TRACE(prefix + " | " + rest);
      EXPECT_EQ(feed_all(*schema, prefix + rest).accepted, prefix.size());
    }
  }
}

// Finishes an accepted prefix: closing bytes first, then every printable byte (keys and enum
// texts are spelled out), then UTF-8 continuations.
std::string finish(const JsonSchema& schema, const std::string& prefix_text) {
  static const std::string kTries = [] {
    std::string tries = "\"}],0:";
    for (int c = 0x20; c < 0x7F; ++c)
      if (tries.find(char(c)) == std::string::npos) tries += char(c);
    for (int c = 0x80; c < 0xC0; c += 0x10) tries += char(c);
    return tries;
  }();
  return testing::finish(schema, prefix_text, kTries);
}

// JSON's numbers have no bound, nlohmann's doubles do: a walk may write 1e999, which
// Json::parse refuses. Exponents past 200 (outside strings) are brought down to 200, in as many
// digits, so that even a walk's 60 digits before one stay within a double. No number's kind
// changes: only a number that may have a fraction takes an exponent.
std::string within_double_range(std::string text) {
  bool in_string = false;
  for (size_t at = 0; at < text.size(); ++at) {
    if (in_string) {
      if (text[at] == '\\')
        ++at;  // an escaped character
      else if (text[at] == '"')
        in_string = false;
      continue;
    }
    in_string = text[at] == '"';
    if (text[at] != 'e' && text[at] != 'E') continue;
    size_t digits = at + 1;
    if (digits < text.size() && (text[digits] == '+' || text[digits] == '-')) ++digits;
    size_t end = digits;
    while (end < text.size() && std::isdigit(uint8_t(text[end]))) ++end;
    const size_t width = end - digits;
    if (width >= 3 && std::stod(text.substr(digits, width)) > 200)
      text.replace(digits, width, std::string(width - 3, '0') + "200");
    at = end - 1;
  }
  return text;
}

// Random walks: a byte at a time, any the recogniser accepts, then finished. Every prefix must
// finish into a value the validator passes.
TEST(SchemaPrefix, EveryAcceptedPrefixFinishesIntoAValueTheSchemaAdmits) {
  const std::string kBytes =
      std::string("{}[]\":,. \n-0123456789eE+truefalsnabcdghikmvxyzAKN\\u/") + "\xC3\xA9\x80";
  int walks = 0;
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.schema);
    const auto schema = compile(c.schema);
    const Json document = Json::parse(c.schema);
    std::mt19937 rng(11);
    for (int walk = 0; walk < 150; ++walk) {
      SchemaPrefix prefix(*schema);
      std::string text;
      const int length = int(rng() % 60);
      for (int tries = 0; int(text.size()) < length && tries < 2000; ++tries) {
        const char byte = kBytes[rng() % kBytes.size()];
        SchemaPrefix trial = prefix;
        if (!trial.feed(uint8_t(byte))) continue;
        prefix = trial;
        text += byte;
      }
      const std::string finished = finish(*schema, text);
      SCOPED_TRACE(finished);
      ASSERT_TRUE(validates(document, Json::parse(within_double_range(finished)), document));
      ++walks;
    }
  }
  EXPECT_EQ(walks, int(cases().size()) * 150);
}

// A model that nests as deep as it can, in schemas that recur, can still finish: where a value
// would need more nesting than the syntax has left, the key or item that begins it is refused,
// so the recursion's way out (an optional member, null, an integer) is taken.
TEST(SchemaPrefix, RecursionAsDeepAsTheSyntaxAllowsCanStillFinish) {
  struct Dive {
    std::string schema;
    std::string opening, step;  // written once, then again and again while accepted
  };
  const char* const kForest = R"({
      "type": "array", "items": {"$ref": "#/$defs/t"},
      "$defs": {"t": {"type": "object",
                      "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/t"}}}}}})";
  const std::vector<Dive> dives = {
      {kTree, "", R"({"v":1,"kids":[)"},
      {kList, "", R"({"v":1,"next":)"},
      {kBinaryTree, "", R"({"l":)"},
      {R"({"type": "array", "items": {"$ref": "#"}})", "", "["},
      {kForest, "", R"([{"kids":)"},
      {kForest, "[", R"({"kids":[)"},  // an object at the deepest level: "kids" cannot begin
      {deeply_nested(64), "", R"({"a":)"},
  };
  for (const Dive& dive : dives) {
    SCOPED_TRACE(dive.schema + "\n" + dive.opening + dive.step);
    const auto schema = compile(dive.schema);
    const Json document = Json::parse(dive.schema);
    SchemaPrefix prefix(*schema);
    ASSERT_TRUE(prefix.feed(dive.opening));
    std::string text = dive.opening;
    int depth = int(dive.opening.size());
    for (bool going = true; going;) {
      for (char c : dive.step) {
        SchemaPrefix trial = prefix;
        if (!trial.feed(uint8_t(c))) {
          going = false;
          break;
        }
        prefix = trial;
        text += c;
        depth += c == '{' || c == '[';
      }
    }
    EXPECT_GE(depth, JsonPrefix::kMaxDepth - 2);
    const std::string finished = finish(*schema, text);
    ASSERT_TRUE(validates(document, Json::parse(finished), document)) << finished;
  }
}

// Mutants of admitted values: whatever the recogniser takes whole is valid.
TEST(SchemaPrefix, WhatItTakesWholeIsValidUnderMutation) {
  const std::string kBytes = "{}[]\":,.-0129eatrunlbcdgxy \n\\";
  std::mt19937 rng(5);
  int taken = 0;
  for (const Case& c : cases()) {
    const auto schema = compile(c.schema);
    const Json document = Json::parse(c.schema);
    for (int i = 0; i < 2000; ++i) {
      std::string text = c.admitted[rng() % c.admitted.size()];
      for (int edits = 1 + int(rng() % 2); edits > 0; --edits) {
        const size_t at = rng() % (text.size() + 1);
        const char byte = kBytes[rng() % kBytes.size()];
        if (rng() % 2) {
          text.insert(text.begin() + long(at), byte);
        } else if (at < text.size()) {
          text[at] = byte;
        }
      }
      const Fed fed = feed_all(*schema, text);
      if (fed.accepted != text.size() || !fed.complete) continue;
      SCOPED_TRACE(std::string(c.schema) + "\n" + text);
      const Json value = Json::parse(text, nullptr, /*allow_exceptions=*/false);
      ASSERT_FALSE(value.is_discarded());
      ASSERT_TRUE(validates(document, value, document));
      ++taken;
    }
  }
  EXPECT_GT(taken, 1000);  // the mutants were not all refused
}

TEST(JsonSchema, RefusesWhatItCannotHoldAnAnswerToNamingThePlace) {
  const std::vector<std::pair<std::string, std::string>> refused = {
      {R"({"type": "string", "pattern": "a+"})", "at #: pattern is not supported"},
      {R"({"properties": {"age": {"type": "integer", "multipleOf": 5}}})",
       "at #/properties/age: multipleOf is not supported"},
      {R"({"properties": {"a/b": {"format": "email"}}})",
       "at #/properties/a~1b: format is not supported"},
      {R"({"type": "strin"})", "at #/type: type is one of"},
      {R"({"type": []})", "at #/type: type lists no type"},
      {R"({"anyOf": [{"type": "object"}, {"properties": {}}]})",
       "alternatives #/anyOf/0 and #/anyOf/1 both admit objects"},
      {R"({"anyOf": [{"type": "integer"}, {"type": "number"}]})", "both admit numbers"},
      {R"({"properties": {"a": {}}, "required": ["b"]})",
       "at #/required: required lists \"b\", which is not among its properties"},
      {R"({"$ref": "#/$defs/missing"})", "at #: $ref '#/$defs/missing' names nothing"},
      {R"({"$ref": "http://example.com/s.json"})", "must be a place in this schema"},
      // A pointer's array index has no leading zero, and "~" escapes only 0 and 1 (RFC 6901).
      {R"({"$defs": {"x": [{}]}, "$ref": "#/$defs/x/00"})", "'#/$defs/x/00' names nothing"},
      {R"({"$defs": {"x": [{}]}, "$ref": "#/$defs/x/1"})", "'#/$defs/x/1' names nothing"},
      {R"({"$defs": {"a~b": {}}, "$ref": "#/$defs/a~b"})", "'#/$defs/a~b' names nothing"},
      {R"({"$ref": "#$defs"})", "'#$defs' names nothing"},
      {R"({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"})",
       "leads back to itself"},
      {R"({"$defs": {"n": {"type": "object", "properties": {"next": {"$ref": "#/$defs/n"}},
                           "required": ["next"]}}, "$ref": "#/$defs/n"})",
       "at #/$defs/n: no object of it is finite: it requires itself"},
      {R"({"type": "array", "items": {"$ref": "#"}, "minItems": 1})",
       "at #: no array of it is finite"},
      {R"({"anyOf": [{"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]},
                     {"type": "array", "items": {"$ref": "#"}, "minItems": 1}]})",
       "at #/anyOf/0: no object of it is finite"},
      {deeply_nested(65), "at #: its values need more than 64 levels of nesting"},
      {R"({"anyOf": [{"$ref": "#"}, {"type": "null"}]})", "lead back to it"},
      {R"({"type": "array", "items": [{}]})", "at #/items: items as a list"},
      {R"({"type": "array", "minItems": 3, "maxItems": 2})", "minItems is above maxItems"},
      {R"({"type": "string", "minLength": 3, "maxLength": 2})", "minLength is above maxLength"},
      {R"({"type": "string", "minLength": -1})", "at #/minLength: minLength must be"},
      {R"({"type": "string", "maxLength": 1.5})", "maxLength must be"},
      {R"({"enum": [1, 2], "type": "string"})", "enum has no value of its type"},
      {R"({"type": "number", "minimum": 0})",
       "at #/minimum: minimum is supported on integers only"},
      {R"({"maximum": 3})", "maximum is supported on integers only"},
      {R"({"type": "integer", "minimum": 5, "maximum": 4.5})", "no integer lies within"},
      {R"({"type": "integer", "exclusiveMinimum": 1, "exclusiveMaximum": 2})",
       "no integer lies within"},
      {R"({"type": "integer", "exclusiveMinimum": true})", "exclusiveMinimum must be a number"},
      {R"({"type": "integer", "maximum": 1e30})", "maximum must leave a 64-bit integer"},
      {R"({"type": "integer", "minimum": 9223372036854775808})",
       "minimum must leave a 64-bit integer"},
      {R"({"type": "integer", "exclusiveMaximum": -9223372036854775808})",
       "exclusiveMaximum must leave a 64-bit integer"},
      {R"({"enum": [)" + std::string(70, '[') + std::string(70, ']') + "]}",
       "at #: an enum value nests deeper than 64 levels"},
      {R"({"const": )" + std::string(100000, '[') + std::string(100000, ']') + "}",
       "at #: the const value nests deeper than 64 levels"},
      {R"({"type": )" + std::string(100000, '[') + std::string(100000, ']') + "}",
       "type is one of object, array, string, integer, number, boolean and null, or a list of "
       "them, not an array"},
      {R"({"enum": []})", "enum must be a list of at least one value"},
      {R"({"enum": ["a"], "minLength": 2})", "enum beside other constraints"},
      {R"({"anyOf": [{}], "type": "object"})", "anyOf beside other constraints"},
      {R"({"anyOf": [{}], "$ref": "#"})", "beside"},
      {R"({"properties": {"a": {}}, "additionalProperties": true})",
       "additionalProperties beside properties is supported as false only"},
      {R"({"allOf": [{}, {}]})", "allOf is supported with one schema only"},
      {"false", "at #: false admits no value"},
      {"[1]", "at #: a schema is an object or a boolean"},
      {R"({"properties": []})", "properties is an object"},
  };
  for (const auto& [schema, message] : refused) {
    SCOPED_TRACE(schema);
    try {
      compile(schema);
      ADD_FAILURE() << "compiled";
    } catch (const JsonSchemaError& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
  }
}

// Integer bounds are held exactly, beyond the integers a double holds.
TEST(JsonSchema, HoldsIntegerBoundsExactly) {
  const auto above = compile(R"({"type": "integer", "minimum": 9007199254740993})");
  EXPECT_FALSE(feed_all(*above, "9007199254740992").complete);
  EXPECT_TRUE(feed_all(*above, "9007199254740993").complete);
  const auto below = compile(R"({"type": "integer", "exclusiveMaximum": 9007199254740993})");
  EXPECT_TRUE(feed_all(*below, "9007199254740992").complete);
  EXPECT_FALSE(feed_all(*below, "9007199254740993").complete);
}

// Keys in the order properties are written (a JSON object's own order), optional ones skipped;
// annotations, allOf of one schema and true are taken as what they mean.
TEST(JsonSchema, KeepsThePropertiesInTheOrderWritten) {
  const auto schema = compile(R"({
    "title": "Answer", "description": "d", "$schema": "https://json-schema.org/draft/2020-12/schema",
    "properties": {"zeta": {"type": "string"}, "alpha": {"allOf": [{"type": "boolean"}]},
                   "mid": true},
    "required": ["alpha"]})");
  EXPECT_TRUE(feed_all(*schema, R"({"zeta":"z","alpha":true,"mid":[{}]})").complete);
  EXPECT_TRUE(feed_all(*schema, R"({"alpha":false})").complete);
  EXPECT_EQ(feed_all(*schema, R"({"alpha":false,"zeta")").accepted, 16u);
  EXPECT_EQ(feed_all(*schema, R"({"mid")").accepted, 2u);  // alpha, required, comes before it
}

}  // namespace
}  // namespace pipeline
