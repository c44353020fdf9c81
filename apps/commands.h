// The subcommands of `pipeline`. Each takes its own arguments (argv[0] is the subcommand
// name) and returns the process exit code; usage errors print a message and return 2.
#pragma once

namespace pipeline {

int run_command(int argc, char** argv);  // pipeline run CONFIG [...]: serve over HTTP
// pipeline batch CONFIG --input FILE --output FILE: offline generation over an OpenAI batch file
int batch_command(int argc, char** argv);
int generate_command(int argc, char** argv);    // pipeline generate --model DIR --prompt TEXT
int graph_command(int argc, char** argv);       // pipeline graph CONFIG [--dot]
int make_model_command(int argc, char** argv);  // pipeline make-model --shape NAME --out DIR
// pipeline bench-serve --url URL [...]: measure a running server
int bench_serve_command(int argc, char** argv);

}  // namespace pipeline
