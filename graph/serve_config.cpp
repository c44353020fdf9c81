// ServeConfig from YAML: every field defaulted, every unknown key an error, every message
// naming the file, the line and the field ("serve.yaml:7: field 'scheduler.window_ms': ...").
#include "graph/serve_config.h"

#include <yaml-cpp/eventhandler.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <sstream>
#include <system_error>
#include <vector>

#include "graph/config_fields.h"
#include "graph/runner_factory.h"
#include "io/chat_template.h"
#include "io/utf8.h"

namespace pipeline {
namespace {

// The fields of each section, and the sections of the top level (""): what check_section_keys
// takes, and where it looks for a field written in the wrong section.
const std::map<std::string, std::set<std::string>>& section_fields() {
  static const std::map<std::string, std::set<std::string>> fields = {
      {"", {"model", "device", "threads", "server", "scheduler", "sampling", "graph"}},
      {"model", {"path", "chat_template", "name", "matmul_activations"}},
      {"server",
       {"host", "port", "api_key", "max_queue", "shutdown_grace_s", "sse_keepalive_s",
        "log_requests", "allowed_origins"}},
      {"scheduler",
       {"window_ms", "max_batch", "max_num_seqs", "max_prefill_tokens", "policy",
        "enable_prefix_caching", "kv_block_size", "kv_cache_fraction", "kv_cache_blocks",
        "kv_cache_dtype", "log_passes"}},
      {"sampling",
       {"temperature", "top_k", "top_p", "min_p", "repetition_penalty", "repeat_last_n",
        "presence_penalty", "frequency_penalty", "seed", "max_tokens"}},
      {"graph", {"nodes", "edges"}},
  };
  return fields;
}

// " (it is a field of 'scheduler': scheduler.window_ms)" where `key`, unknown in `section`, is
// another section's field; empty where it is none's.
std::string other_section_hint(const std::string& key, const std::string& section) {
  for (const auto& [other, fields] : section_fields())
    if (other != section && fields.contains(key))
      return other.empty()
                 ? "; '" + key + "' is a section of its own, at the top level"
                 : "; '" + key + "' is a field of '" + other + "' (" + other + "." + key + ")";
  return "";
}

// The graph used when a config has no `graph` section: the six stages, one node each, with the
// extra tokenize->emit edge that carries requests refused at tokenization to their sinks.
constexpr const char* kDefaultGraph = R"(
nodes:
  - { name: tokenize, stage: tokenize, concurrency: 2 }
  - { name: batch, stage: batch_window }
  - { name: prefill, stage: prefill }
  - { name: decode, stage: decode_step }
  - { name: detok, stage: detokenize, concurrency: unlimited }
  - { name: emit, stage: emit }
edges: [tokenize->batch, tokenize->emit, batch->prefill, batch->decode, prefill->batch,
        decode->batch, prefill->detok, decode->detok, detok->emit]
)";

// The most requests waiting (server.max_queue), and the most running (scheduler.max_num_seqs).
constexpr int kMaxRequests = 4096;

// A section's keys, one of section_fields(); an unknown one that is another section's field says
// so.
void check_section_keys(const FieldReader& r, const YAML::Node& node, const std::string& section) {
  r.check_keys(node, section, section_fields().at(section),
               [&](const std::string& key) { return other_section_hint(key, section); });
}

void read_model(const FieldReader& r, const YAML::Node& node, const std::filesystem::path& base,
                bool path_overridden, ModelSection& model) {
  r.require_map(node, "model");
  check_section_keys(r, node, "model");
  if (!node["path"]) r.fail(node, "model.path", "is required (a Hugging Face model folder)");
  model.path = r.string(node["path"], "model.path");
  if (model.path.empty()) r.fail(node["path"], "model.path", "must not be empty");
  // A path in the file is relative to the file's folder; one from the command line, to the
  // working directory.
  if (model.path.is_relative())
    model.path = path_overridden ? std::filesystem::absolute(model.path) : base / model.path;
  model.path = model.path.lexically_normal();
  model.path_given_at = r.where(node["path"], "model.path");
  if (node["chat_template"]) {
    model.chat_template = r.one_of(node["chat_template"], "model.chat_template", {"llama2", "raw"});
  }
  if (node["name"]) {
    model.name = r.string(node["name"], "model.name");
    // The id clients send back in every request's `model`, and that /v1/models lists.
    const bool printable = std::ranges::none_of(
        model.name, [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7F; });
    if (model.name.empty() || !printable || replacing_invalid_utf8(model.name) != model.name)
      r.fail(node["name"], "model.name",
             "must be a non-empty UTF-8 string without control characters (the id clients "
             "send as `model`); leave it out for the model folder's name");
  }
  if (node["matmul_activations"]) {
    model.matmul_activations =
        parse_dtype(
            r.one_of(node["matmul_activations"], "model.matmul_activations",
                     {std::begin(kMatmulActivationNames), std::end(kMatmulActivationNames)}))
            .value();
  }
}

// server.allowed_origins: "*", or origins as a browser's Origin header writes them
// (scheme://host[:port], no path).
std::vector<std::string> read_origins(const FieldReader& r, const YAML::Node& node) {
  const std::string field = "server.allowed_origins";
  if (!node.IsSequence()) r.fail(node, field, "expected a list, such as [\"*\"] or []");
  std::vector<std::string> origins;
  for (const YAML::Node& item : node) {
    const std::string origin = r.string(item, field);
    const size_t host = origin.find("://");
    const bool whole =
        origin == "*" || (host != std::string::npos && host > 0 && origin.size() > host + 3 &&
                          origin.find('/', host + 3) == std::string::npos);
    if (!whole)
      r.fail(item, field,
             "'" + origin + "' is not \"*\" nor an origin such as https://chat.example.com");
    origins.push_back(origin);
  }
  return origins;
}

void read_server(const FieldReader& r, const YAML::Node& node, ServerSection& server) {
  r.require_map(node, "server");
  check_section_keys(r, node, "server");
  if (node["host"]) server.host = r.string(node["host"], "server.host");
  // An empty host binds wherever cpp-httplib's lookup of "" lands (IPv6 loopback, here).
  if (server.host.empty())
    r.fail(node["host"], "server.host", "must not be empty (" + std::string(kHostChoices) + ")");
  if (node["port"]) server.port = r.integer(node["port"], "server.port", 0, 65535);
  if (node["api_key"] && !node["api_key"].IsNull()) {
    server.api_key = r.string(node["api_key"], "server.api_key");
    // An empty key would read as none: the API open to anyone, which a key was set to prevent.
    if (server.api_key.empty())
      r.fail(node["api_key"], "server.api_key",
             "must not be empty (null, or leaving it out, serves without a key)");
  }
  // Each waiting or running request holds an HTTP connection thread (server/http_server.cpp).
  if (node["max_queue"])
    server.max_queue = r.integer(node["max_queue"], "server.max_queue", 1, kMaxRequests,
                                 "each waiting request holds a connection thread");
  if (node["shutdown_grace_s"])
    server.shutdown_grace_s = r.integer(node["shutdown_grace_s"], "server.shutdown_grace_s", 0);
  if (node["sse_keepalive_s"])
    server.sse_keepalive_s = r.integer(node["sse_keepalive_s"], "server.sse_keepalive_s", 0);
  if (node["log_requests"])
    server.log_requests = r.boolean(node["log_requests"], "server.log_requests");
  if (node["allowed_origins"]) server.allowed_origins = read_origins(r, node["allowed_origins"]);
}

void read_scheduler(const FieldReader& r, const YAML::Node& node, SchedulerSection& s) {
  r.require_map(node, "scheduler");
  check_section_keys(r, node, "scheduler");
  if (node["window_ms"]) s.window_ms = r.integer(node["window_ms"], "scheduler.window_ms", 0);
  if (node["max_batch"]) s.max_batch = r.integer(node["max_batch"], "scheduler.max_batch", 1);
  if (node["max_num_seqs"])
    s.max_num_seqs = r.integer(node["max_num_seqs"], "scheduler.max_num_seqs", 1, kMaxRequests,
                               "each running request holds a connection thread");
  if (node["max_prefill_tokens"])
    s.max_prefill_tokens = r.integer(node["max_prefill_tokens"], "scheduler.max_prefill_tokens", 1);
  if (node["policy"])
    s.priority_policy =
        r.one_of(node["policy"], "scheduler.policy", {"fcfs", "priority"}) == "priority";
  if (node["enable_prefix_caching"])
    s.enable_prefix_caching =
        r.boolean(node["enable_prefix_caching"], "scheduler.enable_prefix_caching");
  if (node["log_passes"]) s.log_passes = r.boolean(node["log_passes"], "scheduler.log_passes");
  if (node["kv_block_size"])
    s.kv_block_size = r.integer(node["kv_block_size"], "scheduler.kv_block_size", 1, 1024);
  if (node["kv_cache_fraction"]) {
    s.kv_cache_fraction = r.number(node["kv_cache_fraction"], "scheduler.kv_cache_fraction");
    if (!(s.kv_cache_fraction > 0.0 && s.kv_cache_fraction <= 1.0))
      r.fail(node["kv_cache_fraction"], "scheduler.kv_cache_fraction", "must be in (0, 1]");
  }
  if (node["kv_cache_blocks"])
    s.kv_cache_blocks = r.integer(node["kv_cache_blocks"], "scheduler.kv_cache_blocks", 0);
  if (node["kv_cache_dtype"]) {
    const std::string dtype =
        r.one_of(node["kv_cache_dtype"], "scheduler.kv_cache_dtype",
                 {std::begin(kKvCacheDtypeNames), std::end(kKvCacheDtypeNames)});
    s.kv_cache_dtype = dtype == "auto" ? std::nullopt : parse_dtype(dtype);
  }
}

void read_sampling(const FieldReader& r, const YAML::Node& node, SamplingDefaults& sampling) {
  r.require_map(node, "sampling");
  check_section_keys(r, node, "sampling");
  auto& p = sampling.params;
  auto real = [&](const char* key, float& out) {
    if (node[key]) out = float(r.number(node[key], std::string("sampling.") + key));
  };
  real("temperature", p.temperature);
  real("top_p", p.top_p);
  real("min_p", p.min_p);
  real("repetition_penalty", p.repetition_penalty);
  real("presence_penalty", p.presence_penalty);
  real("frequency_penalty", p.frequency_penalty);
  if (node["top_k"]) p.top_k = r.integer(node["top_k"], "sampling.top_k", -1);
  if (node["repeat_last_n"])
    p.repeat_last_n = r.integer(node["repeat_last_n"], "sampling.repeat_last_n", -1);
  if (node["seed"] && !node["seed"].IsNull())
    p.seed = r.scalar<uint64_t>(node["seed"], "sampling.seed", "a non-negative integer");
  if (node["max_tokens"])
    sampling.max_tokens = r.integer(node["max_tokens"], "sampling.max_tokens", 1);
  // The sampler's message starts with the parameter's name, which is the field's.
  if (const auto problem = validate(p); !problem.empty()) {
    const std::string key = problem.substr(0, problem.find(' '));
    r.fail(node[key] ? node[key] : node, "sampling." + key, problem);
  }
}

// Letters, digits, '_', '.' and '-': a node's name goes bare into edges ("from->to"), Graphviz
// DOT and metrics, where a quote, "->" or nothing at all would break them.
bool is_node_name(const std::string& name) {
  return !name.empty() && std::all_of(name.begin(), name.end(), [](unsigned char c) {
    return std::isalnum(c) || c == '_' || c == '.' || c == '-';
  });
}

// "unlimited" (0), "serial" (1) or a positive count.
int read_concurrency(const FieldReader& r, const YAML::Node& node, const std::string& field) {
  if (node.IsScalar() && node.Scalar() == "unlimited") return 0;
  if (node.IsScalar() && node.Scalar() == "serial") return 1;
  if (!node.IsScalar()) r.fail(node, field, "expected a positive integer, 'serial' or 'unlimited'");
  try {
    const int n = yaml_integer<int>(node);
    if (n >= 1) return n;
  } catch (const YAML::Exception&) {
  }
  r.fail(node, field,
         "expected a positive integer, 'serial' or 'unlimited', got '" + node.Scalar() + "'");
}

GraphEdgeSpec read_edge(const FieldReader& r, const YAML::Node& node, const std::string& field) {
  GraphEdgeSpec edge;
  edge.at = r.where(node, field);
  if (node.IsMap()) {
    r.check_keys(node, field, {"from", "to"});
    if (!node["from"] || !node["to"]) r.fail(node, field, "an edge needs 'from' and 'to'");
    edge.from = r.string(node["from"], field + ".from");
    edge.to = r.string(node["to"], field + ".to");
    return edge;
  }
  const auto text = r.string(node, field);
  const auto arrow = text.find("->");
  if (arrow == std::string::npos) r.fail(node, field, "expected 'from->to', got '" + text + "'");
  auto trim = [](std::string s) {
    const auto first = s.find_first_not_of(" \t");
    const auto last = s.find_last_not_of(" \t");
    return first == std::string::npos ? std::string() : s.substr(first, last - first + 1);
  };
  edge.from = trim(text.substr(0, arrow));
  edge.to = trim(text.substr(arrow + 2));
  if (edge.from.empty() || edge.to.empty())
    r.fail(node, field, "expected 'from->to', got '" + text + "'");
  return edge;
}

// A graph's `nodes` list, read by `r`.
std::vector<GraphNodeSpec> read_nodes(const FieldReader& r, const YAML::Node& list) {
  std::vector<GraphNodeSpec> nodes;
  for (size_t i = 0; i < list.size(); ++i) {
    const auto& n = list[i];
    const auto field = "graph.nodes[" + std::to_string(i) + "]";
    r.require_map(n, field);
    r.check_unique_keys(n, field);  // which keys a stage takes, graph_plan checks
    GraphNodeSpec out;
    out.at = r.where(n, field);
    out.in_file = r.in_file(n, field);
    if (!n["name"]) r.fail(n, field + ".name", "is required");
    out.name = r.string(n["name"], field + ".name");
    if (!is_node_name(out.name))
      r.fail(n["name"], field + ".name",
             "'" + out.name + "' is not a node name: letters, digits, '_', '.' and '-'");
    out.stage = n["stage"] ? r.string(n["stage"], field + ".stage") : out.name;
    if (n["concurrency"])
      out.concurrency = read_concurrency(r, n["concurrency"], field + ".concurrency");
    out.params = n;  // the stage checks its own parameters (graph_plan)
    nodes.push_back(std::move(out));
  }
  return nodes;
}

// The config's graph: its `graph` section, which names both `nodes` and `edges`. A config without
// one has the default graph, and an override of its `graph.nodes` or `graph.edges` replaces that
// half of the default (the other is the default's, its errors named "<default graph>").
GraphSpec read_graph(const FieldReader& r, const YAML::Node& node, bool in_file) {
  const FieldReader builtin("<default graph>", {});
  const YAML::Node defaults = YAML::Load(kDefaultGraph);
  if (node) {
    r.require_map(node, "graph");
    check_section_keys(r, node, "graph");
  }
  const auto half = [&](const char* key) -> std::pair<const FieldReader*, YAML::Node> {
    if (!in_file && !(node && node[key])) return {&builtin, defaults[key]};
    return {&r, node[key]};
  };
  const auto [nodes_reader, nodes] = half("nodes");
  const auto [edges_reader, edges] = half("edges");
  // A file's graph section gives both halves; only an override may give one.
  constexpr const char* kBothHalves =
      "is missing: a graph section lists both nodes and edges (a --set override may give one "
      "half, the other then the default graph's)";
  if (!nodes) r.fail(node, "graph.nodes", kBothHalves);
  if (!nodes.IsSequence() || nodes.size() == 0)
    r.fail(nodes, "graph.nodes", "expected a list of at least one node");
  if (!edges) r.fail(node, "graph.edges", kBothHalves);
  if (!edges.IsSequence()) r.fail(edges, "graph.edges", "expected a list of edges");
  GraphSpec spec;
  spec.nodes = read_nodes(*nodes_reader, nodes);
  for (size_t i = 0; i < edges.size(); ++i)
    spec.edges.push_back(
        read_edge(*edges_reader, edges[i], "graph.edges[" + std::to_string(i) + "]"));
  return spec;
}

// "section.key=value" → the value set into the document, parsed as a YAML scalar.
void apply_override(YAML::Node& root, const std::string& text, const std::string& file,
                    std::map<std::string, std::string>& applied) {
  const auto eq = text.find('=');
  const auto dot = text.find('.');
  const std::string field = text.substr(0, eq);
  if (eq == std::string::npos || field.empty())
    throw ConfigError(file + ": override '" + text + "': expected section.key=value");
  const std::string value = text.substr(eq + 1);
  YAML::Node parsed;
  try {
    parsed = YAML::Load(value);
  } catch (const YAML::Exception& e) {
    throw ConfigError(file + ": override '" + text +
                      "': value is not valid YAML: " + yaml_problem(e));
  }
  if (dot == std::string::npos || dot > eq) {
    root[field] = parsed;  // a top-level scalar such as device=cpu
  } else {
    const auto section = field.substr(0, dot);
    const auto key = field.substr(dot + 1);
    if (section.empty() || key.empty() || key.find('.') != std::string::npos)
      throw ConfigError(file + ": override '" + text + "': expected section.key=value");
    if (root[section] && !root[section].IsMap())
      throw ConfigError(file + ": override '" + text + "': '" + section + "' is not a section");
    root[section][key] = parsed;
  }
  applied[field] = value;
}

// Notes where each YAML document begins, and nothing else.
class DocumentStarts final : public YAML::EventHandler {
 public:
  std::vector<YAML::Mark> marks;

  void OnDocumentStart(const YAML::Mark& mark) override { marks.push_back(mark); }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}
};

// The one YAML document of `text` (empty: null). yaml-cpp 0.7's LoadAll never returns on some
// malformed texts, a stray ',' or '%' where a document begins: its parser reports document
// after document at that place, reading nothing, and LoadAll keeps them all until memory runs
// out. So the documents are counted first, at most three: one that begins where the one before
// it did is that place. Throws YAML::ParserException for YAML it refuses.
YAML::Node parse_one_document(const std::string& name, const std::string& text) {
  std::istringstream in(text);
  YAML::Parser parser(in);
  DocumentStarts starts;
  for (int document = 0; document < 3 && parser.HandleNextDocument(starts); ++document) {
  }
  const std::vector<YAML::Mark>& at = starts.marks;
  const auto line_of = [&](const YAML::Mark& mark) {
    return name + ":" + std::to_string(mark.line + 1);
  };
  for (size_t i = 1; i < at.size(); ++i)
    if (at[i].pos == at[i - 1].pos)
      throw ConfigError(line_of(at[i]) + ": '" + text.substr(size_t(at[i].pos), 1) +
                        "' cannot begin a YAML value here");
  // A second document would be dropped without a word: one config, one document.
  if (at.size() > 1)
    throw ConfigError(line_of(at[1]) +
                      ": a second YAML document (\"---\"); a config file holds one");
  return YAML::Load(text);
}

// Whether line `line` (0-based) of `text` is indented with a tab, which YAML forbids: yaml-cpp
// then says only "illegal map value" or the like.
bool indented_with_tab(const std::string& text, int line) {
  size_t begin = 0;
  for (int i = 0; i < line && begin != std::string::npos; ++i) {
    begin = text.find('\n', begin);
    if (begin != std::string::npos) ++begin;
  }
  if (begin == std::string::npos) return false;
  const size_t indent_end = text.find_first_not_of(" \t", begin);
  const size_t tab = text.find('\t', begin);
  return tab != std::string::npos && (indent_end == std::string::npos || tab < indent_end);
}

// The config file's one YAML document (empty: null), its errors named by file and line.
YAML::Node read_one_document(const std::string& name) {
  std::ifstream file(name, std::ios::binary);
  if (!file) throw ConfigError(name + ": cannot read the config file");
  const std::string text{std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>()};
  if (file.bad()) throw ConfigError(name + ": cannot read the config file");
  try {
    return parse_one_document(name, text);
  } catch (const YAML::ParserException& e) {
    const std::string at = name + ":" + std::to_string(e.mark.line + 1) + ": ";
    if (indented_with_tab(text, e.mark.line))
      throw ConfigError(at + "indented with a tab; YAML indents with spaces only");
    throw ConfigError(at + yaml_problem(e));
  }
}

}  // namespace

void check_model_folder(const ModelSection& model) {
  std::error_code error;  // a folder that cannot be looked at is not there to load
  const auto status = std::filesystem::status(model.path, error);
  if (std::filesystem::is_directory(status)) return;
  throw ConfigError(model.path_given_at + ": field 'model.path': " +
                    (std::filesystem::exists(status) ? "not a folder: " : "no such folder: ") +
                    model.path.string());
}

ServeConfig load_serve_config(const std::filesystem::path& file,
                              const std::vector<std::string>& overrides) {
  const std::string name = file.string();
  if (std::filesystem::is_directory(file))
    throw ConfigError(name + ": is a folder, not a config file");
  YAML::Node root = read_one_document(name);
  if (root.IsNull()) root = YAML::Node(YAML::NodeType::Map);
  if (!root.IsMap()) throw ConfigError(name + ": expected a mapping of sections");

  std::map<std::string, std::string> applied;
  const bool graph_in_file = bool(root["graph"]);
  for (const auto& text : overrides) apply_override(root, text, name, applied);
  const FieldReader r(name, applied);
  check_section_keys(r, root, "");

  ServeConfig config;
  config.file = file;
  const auto base = std::filesystem::absolute(file).parent_path();
  if (!root["model"]) throw ConfigError(name + ": section 'model' is required (model.path)");
  read_model(r, root["model"], base, applied.contains("model.path"), config.model);
  if (root["device"])
    config.device =
        r.one_of(root["device"], "device", {std::begin(kDeviceNames), std::end(kDeviceNames)});
  if (root["threads"])
    config.threads = r.integer(root["threads"], "threads", 0, kMaxThreads,
                               "more threads than a machine's cores only cost memory");
  if (root["server"]) read_server(r, root["server"], config.server);
  if (root["scheduler"]) read_scheduler(r, root["scheduler"], config.scheduler);
  if (root["sampling"]) read_sampling(r, root["sampling"], config.sampling);
  config.graph = read_graph(r, root["graph"], graph_in_file);
  return config;
}

}  // namespace pipeline
