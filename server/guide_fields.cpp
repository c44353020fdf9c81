#include "server/guide_fields.h"

#include <algorithm>
#include <initializer_list>
#include <memory>
#include <string_view>

#include "server/openai_request.h"

namespace pipeline {
namespace {

// A JSON schema given at `param`, compiled; a 400 naming `param` and the place in the schema
// when it cannot hold an answer to it.
std::shared_ptr<const JsonSchema> compile_schema(const JsonBody& schema, const std::string& param) {
  try {
    return JsonSchema::compile(schema);
  } catch (const JsonSchemaError& e) {
    throw invalid(param, "the schema in " + param + " " + e.what());
  }
}

// A member of the object at `param` other than `known` (null ones aside) is refused: a typo in
// a constraint's field would otherwise drop the constraint without a word.
void refuse_unknown_members(const JsonBody& object, const std::string& param,
                            std::initializer_list<std::string_view> known) {
  for (const auto& [name, value] : object.items()) {
    if (value.is_null() || std::ranges::find(known, name) != known.end()) continue;
    const std::string member = param + "." + name;
    throw invalid(member, member + " is not a field of " + param);
  }
}

// json_schema.name, which OpenAI and vLLM require: up to 64 of a-z, A-Z, 0-9, '_' and '-'.
// Nothing else reads it; a name OpenAI would refuse is refused here too, so that a request
// works against either server or neither.
void read_schema_name(const JsonBody& spec) {
  constexpr const char* kParam = "response_format.json_schema.name";
  const JsonBody* name = find_field(spec, "name");
  if (!name) throw invalid(kParam, "response_format json_schema needs a name");
  if (!name->is_string()) throw wrong_type(kParam, "a string", *name);
  const std::string& text = name->get_ref<const std::string&>();
  const bool allowed = std::ranges::all_of(text, [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-';
  });
  if (text.empty() || text.size() > 64 || !allowed)
    throw invalid(kParam, kParam + std::string(" must be 1 to 64 characters of a-z, A-Z, 0-9, "
                                               "'_' and '-'"));
}

// The schema in response_format json_schema: {"name", "schema", "strict", "description"}, as
// OpenAI's structured outputs take it. The answer is always held to the schema (strict or not).
std::shared_ptr<const JsonSchema> read_json_schema(const JsonBody& format) {
  const JsonBody* spec = find_field(format, "json_schema");
  if (!spec)
    throw invalid("response_format.json_schema",
                  "response_format json_schema needs json_schema: {\"name\", \"schema\"}");
  if (!spec->is_object()) throw wrong_type("response_format.json_schema", "an object", *spec);
  refuse_unknown_members(*spec, "response_format.json_schema",
                         {"name", "schema", "strict", "description"});
  read_schema_name(*spec);
  // strict: the answer is held to the schema either way; read so that a value that is not a
  // boolean is refused.
  if (const JsonBody* strict = find_field(*spec, "strict"); strict && !strict->is_boolean())
    throw wrong_type("response_format.json_schema.strict", "a boolean", *strict);
  const JsonBody* schema = find_field(*spec, "schema");
  if (!schema)
    throw invalid("response_format.json_schema.schema",
                  "response_format json_schema needs its schema");
  return compile_schema(*schema, "response_format.json_schema.schema");
}

// response_format: {"type": "text"} (the default: null), {"type": "json_object"} (any JSON
// object; llama.cpp's {"type": "json_object", "schema": {...}} holds it to that schema) or
// {"type": "json_schema", "json_schema": {...}}: JSON mode, held to the schema.
std::shared_ptr<const JsonSchema> read_response_format(const JsonBody& body) {
  const JsonBody* value = find_field(body, "response_format");
  if (!value) return nullptr;
  if (!value->is_object()) throw wrong_type("response_format", "an object", *value);
  const JsonBody* type = find_field(*value, "type");
  constexpr const char* kTypes = "\"text\", \"json_object\" or \"json_schema\"";
  if (!type)
    throw invalid("response_format.type", std::string("response_format needs a type: ") + kTypes);
  if (!type->is_string()) throw wrong_type("response_format.type", "a string", *type);
  const auto& name = type->get_ref<const std::string&>();
  if (name == "text") return nullptr;
  if (name == "json_object") {
    refuse_unknown_members(*value, "response_format", {"type", "schema"});
    const JsonBody* schema = find_field(*value, "schema");
    return schema ? compile_schema(*schema, "response_format.schema") : JsonSchema::any_object();
  }
  if (name == "json_schema") {
    refuse_unknown_members(*value, "response_format", {"type", "json_schema"});
    return read_json_schema(*value);
  }
  throw invalid("response_format.type", "unknown response_format type '" + name + "': " + kTypes);
}

// A schema given as a schema (an object or a boolean) or as its JSON text, at `param`: vLLM's
// guided_json and structured_outputs.json.
std::shared_ptr<const JsonSchema> read_schema_or_text(const JsonBody& value,
                                                      const std::string& param) {
  if (!value.is_string()) {
    if (!value.is_object() && !value.is_boolean())
      throw wrong_type(param, "a JSON schema (an object, or its text)", value);
    return compile_schema(value, param);
  }
  JsonBody schema;
  try {
    schema = read_json_body(value.get_ref<const std::string&>());
  } catch (const nlohmann::json::other_error&) {
    throw invalid(param, param + "'s text nests arrays and objects deeper than " +
                             std::to_string(kMaxJsonDepth) + " levels");
  } catch (const nlohmann::json::exception&) {
    throw invalid(param, param + "'s text is not JSON");
  }
  return compile_schema(schema, param);
}

std::shared_ptr<const TextPattern> compile_pattern(const std::string& param, const auto& compile) {
  try {
    return compile();
  } catch (const TextPatternError& e) {
    throw invalid(param, param + ": " + e.what());
  }
}

// A regex the answer must match whole (io/regex_syntax.h), at `param`.
std::shared_ptr<const TextPattern> read_regex(const JsonBody& value, const std::string& param) {
  if (!value.is_string()) throw wrong_type(param, "a string", value);
  return compile_pattern(
      param, [&] { return TextPattern::from_regex(value.get_ref<const std::string&>()); });
}

// Texts the answer must be one of, at `param`.
std::shared_ptr<const TextPattern> read_choice(const JsonBody& value, const std::string& param) {
  if (!value.is_array()) throw wrong_type(param, "a non-empty array of strings", value);
  if (value.empty()) throw invalid(param, param + " must hold at least one text");
  std::vector<std::string> texts;
  for (const JsonBody& text : value) {
    if (!text.is_string()) throw wrong_type(param, "a non-empty array of strings", text);
    texts.push_back(text.get<std::string>());
  }
  return compile_pattern(param, [&] { return TextPattern::from_choices(texts); });
}

// A GBNF grammar the answer must be a text of (io/grammar_syntax.h), at `param`: vLLM's
// guided_grammar and structured_outputs.grammar, llama.cpp's grammar.
std::shared_ptr<const Grammar> read_grammar(const JsonBody& value, const std::string& param) {
  if (!value.is_string()) throw wrong_type(param, "a string", value);
  const std::string& text = value.get_ref<const std::string&>();
  if (text.empty()) throw invalid(param, param + " is empty: it must define a rule root");
  try {
    return Grammar::from_gbnf(text);
  } catch (const GrammarError& e) {
    throw invalid(param, param + ": " + e.what());
  }
}

// vLLM's structured_outputs (what replaced its guided_* fields): one of json (a schema or its
// text), json_object (true: any object), regex, choice and grammar. What would change the answer
// in a way not held here is refused rather than ignored: structural_tag, a whitespace_pattern, and
// disable_any_whitespace or disable_additional_properties true; so is a field vLLM does not know.
// disable_fallback concerns vLLM's choice among its backends, of which there is one here. Null: not
// given.
const JsonBody* read_structured_outputs(const JsonBody& body) {
  const JsonBody* outputs = find_field(body, "structured_outputs");
  if (!outputs) return nullptr;
  if (!outputs->is_object()) throw wrong_type("structured_outputs", "an object", *outputs);
  static const std::set<std::string> kGuides = {"json", "json_object", "regex", "choice",
                                                "grammar"};
  for (const auto& [name, value] : outputs->items()) {
    const std::string param = "structured_outputs." + name;
    if (value.is_null() || kGuides.count(name)) continue;
    if (name == "structural_tag" || name == "whitespace_pattern")
      throw invalid(param, param +
                               " is not supported: structured_outputs json, json_object, regex, "
                               "choice and grammar are");
    if (name != "disable_any_whitespace" && name != "disable_additional_properties" &&
        name != "disable_fallback")
      throw invalid(param, param + " is not a field of structured_outputs");
    if (!value.is_boolean()) throw wrong_type(param, "a boolean", value);
    if (value.get<bool>() && name != "disable_fallback")
      throw invalid(param,
                    param +
                        " is not supported: JSON mode writes one space, or a newline and an "
                        "indent, between tokens, and an object with properties takes no other key "
                        "unless its schema's additionalProperties says so");
  }
  if (const JsonBody* json_object = find_field(*outputs, "json_object");
      json_object && !json_object->is_boolean())
    throw wrong_type("structured_outputs.json_object", "a boolean", *json_object);
  return outputs;
}

}  // namespace

std::vector<std::string> guides_asked(const JsonBody& body) {
  if (find_field(body, "guided_whitespace_pattern"))
    throw invalid("guided_whitespace_pattern",
                  "guided_whitespace_pattern is not supported: response_format json_schema, "
                  "guided_json, guided_regex, guided_choice, guided_grammar, grammar and "
                  "structured_outputs are");
  std::vector<std::string> asked;
  // Any response_format but {"type": "text"} is read as a guide (a malformed one fails there).
  if (const JsonBody* format = find_field(body, "response_format")) {
    const JsonBody* type = format->is_object() ? find_field(*format, "type") : nullptr;
    if (type && type->is_string() && *type == "text")
      refuse_unknown_members(*format, "response_format", {"type"});  // a schema beside it, say
    else
      asked.push_back("response_format");
  }
  for (const char* name : {"guided_json", "guided_regex", "guided_choice", "guided_grammar"})
    if (find_field(body, name)) asked.push_back(name);
  // llama.cpp's own: a schema, and a grammar, which it reads as none when empty.
  if (find_field(body, "json_schema")) asked.push_back("json_schema");
  if (const JsonBody* grammar = find_field(body, "grammar"); grammar && *grammar != "")
    asked.push_back("grammar");
  if (const JsonBody* outputs = read_structured_outputs(body)) {
    for (const char* name : {"json", "json_object", "regex", "choice", "grammar"}) {
      const JsonBody* value = find_field(*outputs, name);
      if (value && !(value->is_boolean() && !value->get<bool>()))
        asked.push_back(std::string("structured_outputs.") + name);
    }
  }
  if (asked.size() > 1)
    throw invalid(asked[1], asked[1] + " cannot be combined with " + asked[0] + ": give one guide");
  return asked;
}

void read_guide(const JsonBody& body, const std::string& param, Request& request) {
  request.guide_param = param;
  if (param == "response_format") {
    request.json_schema = read_response_format(body);
    return;
  }
  // structured_outputs.X is field X of that object; guided_X, json_schema and grammar the
  // body's own.
  const std::string prefix = "structured_outputs.";
  const std::string guided = "guided_";
  const bool structured = param.starts_with(prefix);
  const JsonBody& holder = structured ? *find_field(body, "structured_outputs") : body;
  const std::string field = structured ? param.substr(prefix.size()) : param;
  const std::string name = field.starts_with(guided) ? field.substr(guided.size()) : field;
  const JsonBody& value = *find_field(holder, field.c_str());
  if (name == "json" || name == "json_schema") {
    request.json_schema = read_schema_or_text(value, param);
  } else if (name == "json_object") {
    request.json_schema = JsonSchema::any_object();
  } else if (name == "regex") {
    request.text_pattern = read_regex(value, param);
  } else if (name == "grammar") {
    request.grammar = read_grammar(value, param);
  } else {
    request.text_pattern = read_choice(value, param);
  }
}

}  // namespace pipeline
