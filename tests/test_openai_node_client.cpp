// The official openai npm client (tests/node) against the real `pipeline run`: if the clients
// people use can talk to the server, the wire format is right. Needs node and npm (and the npm
// registry for `npm install`); fails, never skips, without them.
#include <string>

#include <gtest/gtest.h>

#include "tests/support/command.h"
#include "tests/support/server_process.h"
#include "tests/support/shared_data.h"

namespace pipeline {
namespace {

using pipeline::testing::CommandResult;
using pipeline::testing::run_shell;

TEST(OpenAINodeClient, ChatAndCompletionsStreamedAndWholeWithAnApiKey) {
  const CommandResult tools = run_shell("node --version && npm --version");
  ASSERT_EQ(tools.exit_code, 0) << "node and npm are needed for this test (apt-get install nodejs "
                                   "npm):\n"
                                << tools.out;
  const std::string node_dir = (pipeline::testing::source_dir() / "tests" / "node").string();
  const CommandResult install = run_shell("cd '" + node_dir +
                                          "' && timeout 300 npm install --no-audit --no-fund "
                                          "--loglevel=error");
  ASSERT_EQ(install.exit_code, 0) << "npm install in " << node_dir << " failed:\n" << install.out;

  pipeline::testing::ServerProcess server(
      pipeline::testing::stories_config("  api_key: node-test-key\n"));
  const CommandResult client =
      run_shell("cd '" + node_dir + "' && PIPELINE_BASE_URL=" + server.base_url() +
                "/v1 PIPELINE_MODEL=stories260K PIPELINE_API_KEY=node-test-key timeout 120 node "
                "openai_client.mjs");
  EXPECT_EQ(client.exit_code, 0) << client.out << "\nserver stderr:\n" << server.stderr_text();
  EXPECT_NE(client.out.find("checks passed"), std::string::npos) << client.out;
  EXPECT_EQ(server.terminate(std::chrono::seconds(20)), 0) << server.stderr_text();
}

}  // namespace
}  // namespace pipeline
