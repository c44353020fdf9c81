// `pipeline`: one command, one subcommand per use.
#include <cstdio>
#include <cstring>
#include <exception>
#include <string_view>

#include "apps/commands.h"
#include "apps/options.h"

namespace {

struct Subcommand {
  const char* name;
  int (*run)(int, char**);
  const char* summary;
};

constexpr Subcommand kSubcommands[] = {
    {"run", pipeline::run_command, "serve a model over an OpenAI-compatible HTTP API"},
    {"batch", pipeline::batch_command, "run an OpenAI batch file (JSONL) offline, resumably"},
    {"generate", pipeline::generate_command, "complete one prompt and print the text"},
    {"graph", pipeline::graph_command, "print a config's flow graph (text or --dot)"},
    {"make-model", pipeline::make_model_command,
     "write a random-weight checkpoint of a known shape"},
    {"bench-serve", pipeline::bench_serve_command,
     "measure a running server's throughput and latency"},
};

// To stdout when asked for (as every command's --help), to stderr after a mistake.
void print_usage(std::FILE* out) {
  std::fprintf(out, "usage: pipeline <command> [options]\n\ncommands:\n");
  for (const auto& sub : kSubcommands) std::fprintf(out, "  %-11s %s\n", sub.name, sub.summary);
  std::fprintf(out, "\n'pipeline <command> --help' describes a command's options.\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    print_usage(stderr);
    return 2;
  }
  if (std::string_view(argv[1]) == "--help" || std::string_view(argv[1]) == "-h" ||
      std::string_view(argv[1]) == "help") {
    print_usage(stdout);
    return 0;
  }
  for (const auto& sub : kSubcommands) {
    if (std::strcmp(argv[1], sub.name) != 0) continue;
    try {
      return sub.run(argc - 1, argv + 1);
    } catch (const pipeline::UsageError& e) {
      std::fprintf(stderr, "pipeline %s: %s\n", sub.name, e.what());
      return 2;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "pipeline %s: %s\n", sub.name, e.what());
      return 1;
    }
  }
  std::fprintf(stderr, "pipeline: unknown command '%s'\n\n", argv[1]);
  print_usage(stderr);
  return 2;
}
