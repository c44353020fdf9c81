// The HTTP front end end to end: the real `pipeline run` on stories260K (CPU), spoken to by
// HTTP clients and raw sockets. Bodies without a clear length, cut short, compressed or badly
// chunked; bad inputs, each with its status and error body; clients that hang up, keep their
// connections, trickle their requests or stop reading; the API key, CORS, a full queue, startup
// on a port or host it cannot take, and shutdown. The server keeps serving through all of it.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "tests/support/command.h"
#include "tests/support/server_calls.h"
#include "tests/support/server_process.h"
#include "tests/support/shared_data.h"

namespace pipeline {
namespace {

using namespace testing;  // pipeline::testing: the server and its calls

// A raw connection to the server on which `bytes` were sent (a request, or the start of one);
// the caller closes it. A receive_buffer (bytes) shrinks the socket's buffer, for a client
// that stops reading to fill it soon.
int send_raw(int port, const std::string& bytes, int receive_buffer = 0) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error("socket() failed");
  if (receive_buffer > 0)
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &receive_buffer, sizeof receive_buffer);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(uint16_t(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
      write(fd, bytes.data(), bytes.size()) != ssize_t(bytes.size())) {
    close(fd);
    throw std::runtime_error("cannot send a request to port " + std::to_string(port));
  }
  return fd;
}

// A raw connection on which a POST of `body` to `path` was sent; the caller closes it.
int send_raw_post(int port, const std::string& path, const json& body, int receive_buffer = 0) {
  const std::string payload = body.dump();
  return send_raw(port,
                  "POST " + path +
                      " HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                      "Content-Type: application/json\r\nContent-Length: " +
                      std::to_string(payload.size()) + "\r\n\r\n" + payload,
                  receive_buffer);
}

// A raw connection on which a completion request was sent; the caller closes it.
int send_raw_completion(int port, const json& body, int receive_buffer = 0) {
  return send_raw_post(port, "/v1/completions", body, receive_buffer);
}

// What the server sent on a raw connection until the end of an answer's JSON error body ("}}")
// or of the connection.
std::string read_error_answer(int fd) {
  std::string received;
  char buffer[4096];
  for (ssize_t n;
       received.find("}}") == std::string::npos && (n = read(fd, buffer, sizeof buffer)) > 0;)
    received.append(buffer, size_t(n));
  return received;
}

// Everything the server sent on a raw connection until it closed it.
std::string read_to_end(int fd) {
  std::string received;
  char buffer[4096];
  for (ssize_t n; (n = read(fd, buffer, sizeof buffer)) > 0;) received.append(buffer, size_t(n));
  return received;
}

// Opens a streaming request on a raw socket, reads until the first bytes of the body arrived,
// and hangs up.
void stream_then_hang_up(int port, const json& body) {
  const int fd = send_raw_completion(port, body);
  std::string received;
  char buffer[1024];
  while (received.find("data: ") == std::string::npos) {
    const ssize_t n = read(fd, buffer, sizeof buffer);
    ASSERT_GT(n, 0) << "the server closed before streaming";
    received.append(buffer, size_t(n));
  }
  ASSERT_NE(received.find("200 OK"), std::string::npos) << received;
  close(fd);
}

// A POST without a body (no Content-Length nor Transfer-Encoding: curl -X POST without -d) is
// refused at once, not once httplib's 5 s read timeout ends, with an OpenAI error body that
// says what is wrong: what the body lacks on a POST route, the method on a GET route.
TEST_F(ServerE2E, APostWithoutABodyIsToldWhatIsMissing) {
  const auto start = Clock::now();
  const auto answer_to_bodyless_post = [&](const std::string& path) {
    const int fd = send_raw(port(), "POST " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
    const std::string received = read_error_answer(fd);
    close(fd);
    return received;
  };
  auto health_answer = std::async(std::launch::async, answer_to_bodyless_post, "/health");
  const std::string completions = answer_to_bodyless_post("/v1/completions");
  health_answer.wait();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(4)) << "the read timeout was waited out";
  EXPECT_NE(completions.find("HTTP/1.1 400"), std::string::npos) << completions;
  EXPECT_NE(completions.find("needs a body with a Content-Length header"), std::string::npos)
      << completions;
  const std::string health = health_answer.get();
  EXPECT_NE(health.find("HTTP/1.1 405"), std::string::npos) << health;
  EXPECT_NE(health.find("POST is not allowed on /health; use GET."), std::string::npos) << health;
  EXPECT_EQ(post(port(), "/v1/completions", completion_body("Hi", 4)).status, 200);
}

// httplib's own refusals say which limit was passed: a header line of 8 KiB, a URL of 8 KiB, a
// body of 16 MiB (read, so that the connection stays in step, then refused).
TEST_F(ServerE2E, RequestsPastTheProtocolLimitsAreToldWhichLimit) {
  const auto answer_to = [&](const std::string& request) {
    const int fd = send_raw(port(), request);
    const std::string received = read_error_answer(fd);
    close(fd);
    return received;
  };
  const std::string long_header = answer_to(
      "GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(20000, 'a') + "\r\n\r\n");
  EXPECT_TRUE(long_header.starts_with("HTTP/1.1 400")) << long_header.substr(0, 100);
  EXPECT_NE(long_header.find("longer than the 8 KiB a header line may hold"), std::string::npos)
      << long_header;
  const std::string long_url =
      answer_to("GET /" + std::string(9000, 'a') + " HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_TRUE(long_url.starts_with("HTTP/1.1 414")) << long_url.substr(0, 100);
  EXPECT_NE(long_url.find("URL is longer than the 8 KiB"), std::string::npos) << long_url;
  const size_t too_big = (size_t(16) << 20) + 1;
  const std::string big_body = answer_to(
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(too_big) +
      "\r\n\r\n" + std::string(too_big, 'a'));
  EXPECT_TRUE(big_body.starts_with("HTTP/1.1 413")) << big_body.substr(0, 100);
  EXPECT_NE(big_body.find("larger than the 16 MiB a request may hold"), std::string::npos)
      << big_body;
}

// Sends `request`, and 200 ms later a GET /health down the same connection, as a client (or a
// proxy in front) sends its next request; returns everything the server wrote until it closed.
std::string answers_with_a_request_behind(int port, const std::string& request) {
  const int fd = send_raw(port, request);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const std::string next = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
  (void)::send(fd, next.data(), next.size(), MSG_NOSIGNAL);
  const std::string received = read_to_end(fd);
  close(fd);
  return received;
}

// A body whose length is unclear (two Content-Lengths that differ, one that is not a number, or
// one beside Transfer-Encoding) is refused, and its connection ends after the answer, which says
// so (Connection: close): bytes sent after it are never read as a next request, as a proxy in
// front might have read them (request smuggling). httplib took the first length, or waited 5 s
// on a length of -1 for a 413.
TEST_F(ServerE2E, ABodyOfUnclearLengthIsRefusedAndItsConnectionEnds) {
  const std::string head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\n";
  for (const std::string& lengths :
       {std::string("Content-Length: 30\r\nContent-Length: 5\r\n"),
        std::string("Content-Length: -1\r\n"),
        std::string("Content-Length: 5\r\nTransfer-Encoding: chunked\r\n")}) {
    SCOPED_TRACE(lengths);
    const auto start = Clock::now();
    const std::string received = answers_with_a_request_behind(port(), head + lengths + "\r\n");
    EXPECT_TRUE(received.starts_with("HTTP/1.1 400")) << received;
    EXPECT_NE(received.find("body length is unclear"), std::string::npos) << received;
    EXPECT_NE(received.find("\r\nConnection: close\r\n"), std::string::npos) << received;
    EXPECT_EQ(received.find("\"status\""), std::string::npos)
        << "the smuggled /health was answered";
    EXPECT_LT(Clock::now() - start, std::chrono::seconds(3));
  }
}

// A body that stops arriving part-way is given up after httplib's 5 s read timeout with a 408
// that says how much came (it was a generic 400), and its connection ends: the rest of the body,
// sent late, is never read as a next request, and the answer says the connection closes.
TEST_F(ServerE2E, ABodyThatStopsArrivingIsA408AndItsConnectionEnds) {
  const int fd = send_raw(port(),
                          "POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                          "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
                          "{\"prompt\":");
  const std::string answer = read_error_answer(fd);
  EXPECT_TRUE(answer.starts_with("HTTP/1.1 408")) << answer;
  EXPECT_NE(answer.find("stopped arriving: 10 of its 100 bytes came before"), std::string::npos)
      << answer;
  EXPECT_NE(answer.find("\r\nConnection: close\r\n"), std::string::npos) << answer;
  const std::string late = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
  (void)::send(fd, late.data(), late.size(), MSG_NOSIGNAL);
  EXPECT_EQ(read_to_end(fd).find("\"status\""), std::string::npos) << "the late bytes were read";
  close(fd);
}

// A chunked body httplib cannot read (a chunk size that is not a hex number) is refused, and
// its connection ends: the bytes after the bad chunk are never read as a next request.
TEST_F(ServerE2E, AMalformedChunkedBodyIsRefusedAndItsConnectionEnds) {
  for (const std::string& chunks : {std::string("zz\r\n"), std::string("-1\r\n{}\r\n")}) {
    SCOPED_TRACE(chunks);
    const auto start = Clock::now();
    const std::string received = answers_with_a_request_behind(
        port(),
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks);
    EXPECT_TRUE(received.starts_with("HTTP/1.1 400")) << received;
    EXPECT_NE(received.find("\r\nConnection: close\r\n"), std::string::npos) << received;
    EXPECT_EQ(received.find("\"status\""), std::string::npos)
        << "the smuggled /health was answered";
    EXPECT_LT(Clock::now() - start, std::chrono::seconds(3));
  }
}

// A request target in absolute form, as some proxies send it on, routes by its path.
TEST_F(ServerE2E, ARequestTargetInAbsoluteFormIsServed) {
  const std::string body = completion_body("Hi", 2).dump();
  const int fd = send_raw(port(), "POST http://127.0.0.1:" + std::to_string(port()) +
                                      "/v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                      "Connection: close\r\nContent-Length: " +
                                      std::to_string(body.size()) + "\r\n\r\n" + body);
  const std::string received = read_to_end(fd);
  close(fd);
  EXPECT_TRUE(received.starts_with("HTTP/1.1 200")) << received;
  EXPECT_NE(received.find("\"object\":\"text_completion\""), std::string::npos) << received;
}

// A compressed body is refused with 415, not inflated: httplib would inflate it with no bound
// on its size. The body is read as sent, so the connection serves its next request.
TEST_F(ServerE2E, ACompressedBodyIsRefusedWithoutBeingInflated) {
  httplib::Client client("127.0.0.1", port());
  client.set_read_timeout(60);
  client.set_keep_alive(true);
  client.set_compress(true);  // gzip
  const std::string body = completion_body("Hi", 4).dump();
  httplib::Result refused = client.Post("/v1/completions", body, "application/json");
  ASSERT_TRUE(refused) << httplib::to_string(refused.error());
  EXPECT_EQ(refused->status, 415) << refused->body;
  const json error = json::parse(refused->body)["error"];
  EXPECT_EQ(error["code"], "unsupported_content_encoding");
  EXPECT_NE(error["message"].get<std::string>().find("Content-Encoding 'gzip'"), std::string::npos)
      << error;
  client.set_compress(false);
  httplib::Result answered = client.Post("/v1/completions", body, "application/json");
  ASSERT_TRUE(answered) << httplib::to_string(answered.error());
  EXPECT_EQ(answered->status, 200) << answered->body;
  // Every coding of every Content-Encoding header counts; "identity" in any case is none.
  const httplib::Headers identity_then_gzip = {{"Content-Encoding", "identity"},
                                               {"Content-Encoding", "gzip"}};
  EXPECT_EQ(send(port(), "POST", "/v1/completions", body, identity_then_gzip).status, 415);
  EXPECT_EQ(
      send(port(), "POST", "/v1/completions", body, {{"Content-Encoding", "IDENTITY"}}).status,
      200);
}

// HTTP/1.0 knows no chunked encoding (nginx proxies with it by default, and refuses a chunked
// answer): a stream is the body until the server closes the connection.
TEST_F(ServerE2E, AnHttp10StreamIsNotChunkedAndEndsWithTheConnection) {
  const std::string payload = with(completion_body("Once upon a time", 8), "stream", true).dump();
  const int fd = send_raw(port(),
                          "POST /v1/completions HTTP/1.0\r\nContent-Type: "
                          "application/json\r\nContent-Length: " +
                              std::to_string(payload.size()) + "\r\n\r\n" + payload);
  const std::string received = read_to_end(fd);
  close(fd);
  const size_t body = received.find("\r\n\r\n");
  ASSERT_NE(body, std::string::npos) << received;
  const std::string headers = received.substr(0, body);
  EXPECT_NE(headers.find(" 200 "), std::string::npos) << headers;
  EXPECT_EQ(headers.find("Transfer-Encoding"), std::string::npos) << headers;
  EXPECT_TRUE(received.substr(body + 4).starts_with("data: {")) << received;
  EXPECT_TRUE(received.ends_with("data: [DONE]\n\n")) << received;
}

TEST_F(ServerE2E, AClientThatHangsUpMidStreamFreesItsBlocks) {
  for (int choices : {1, 3}) {
    SCOPED_TRACE("n = " + std::to_string(choices));
    const double failed_before = metric(port(), "pipeline_requests_failed_total");
    const double cancelled_before = metric(port(), "pipeline_requests_cancelled_total");
    const double generated_before = metric(port(), "pipeline_generation_tokens_total");
    json body = completion_body("Once upon a time", 480);
    body["ignore_eos"] = true;
    body["stream"] = true;
    body["n"] = choices;
    stream_then_hang_up(port(), body);

    EXPECT_EQ(kv_blocks_used_when_settled(port()), 0);
    // Every choice was cut short (cancelled), not run to its end.
    EXPECT_EQ(metric(port(), "pipeline_requests_failed_total") - failed_before, choices);
    EXPECT_EQ(metric(port(), "pipeline_requests_cancelled_total") - cancelled_before, choices);
    EXPECT_LT(metric(port(), "pipeline_generation_tokens_total") - generated_before, 480 * choices);
  }
  // And the server goes on serving.
  EXPECT_EQ(post(port(), "/v1/completions", completion_body("Hi", 4)).status, 200);
}

// A whole (not streamed) answer whose client hangs up while its tokens keep coming, each a few
// milliseconds after the last: the socket is asked on a timer, not only when no token came.
TEST_F(ServerE2E, AClientThatHangsUpBeforeAWholeAnswerEndsCancelsIt) {
  const double failed_before = metric(port(), "pipeline_requests_failed_total");
  const double generated_before = metric(port(), "pipeline_generation_tokens_total");
  const int choices = 32;  // 480 tokens each: about 1.5 s on two cores
  json body = completion_body("Once upon a time", 480);
  body["ignore_eos"] = true;
  body["n"] = choices;
  const int fd = send_raw_completion(port(), body);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  close(fd);

  EXPECT_EQ(kv_blocks_used_when_settled(port()), 0);
  EXPECT_EQ(metric(port(), "pipeline_requests_failed_total") - failed_before, choices);
  EXPECT_LT(metric(port(), "pipeline_generation_tokens_total") - generated_before, 480 * choices);
  EXPECT_EQ(post(port(), "/v1/completions", completion_body("Hi", 4)).status, 200);
}

// A client that leaves while its request waits in the batch window, streaming or not: the
// request is cancelled and never prefilled, rather than computed for nobody.
TEST(ServerE2EClientLeaves, ARequestWhoseClientLeftBeforeItsAnswerIsNeverRun) {
  ServerProcess server(stories_config("scheduler:\n  window_ms: 1500\n  max_batch: 16\n"));
  for (const bool stream : {false, true}) {
    SCOPED_TRACE(stream ? "streaming" : "whole answer");
    const double failed_before = metric(server.port(), "pipeline_requests_failed_total");
    const double prefills_before = metric(server.port(), "pipeline_prefill_batches_total");
    json body = completion_body("Once upon a time", 64);
    body["stream"] = stream;
    const int fd = send_raw_completion(server.port(), body);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    close(fd);
    // The window closes 1.5 s after the arrival; the scheduler drops the request then.
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    while (metric(server.port(), "pipeline_requests_failed_total") == failed_before &&
           Clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_EQ(metric(server.port(), "pipeline_requests_failed_total") - failed_before, 1);
    EXPECT_EQ(metric(server.port(), "pipeline_prefill_batches_total"), prefills_before);
  }
  EXPECT_EQ(post(server.port(), "/v1/completions", completion_body("Hi", 4)).status, 200);
}

// A stream still waiting for its first token after server.sse_keepalive_s sends its 200
// headers then, and an SSE comment after each interval of silence, so that a proxy that ends
// silent connections (nginx: 60 s) keeps it; the answer then streams as usual. A refusal, which
// comes sooner, keeps its own status. Here the batch window holds the first token for 3.5 s.
TEST(ServerE2EKeepAlive, AStreamWaitingForItsFirstTokenStartsAndSaysItIsAlive) {
  ServerProcess server(stories_config("  sse_keepalive_s: 1\nscheduler:\n  window_ms: 3500\n"));
  for (const bool chat : {false, true}) {
    SCOPED_TRACE(chat ? "chat" : "completion");
    json body = chat ? chat_body("Hi", 8) : completion_body("Once upon a time", 8);
    body["stream"] = true;
    const auto start = Clock::now();
    const int fd =
        send_raw_post(server.port(), chat ? "/v1/chat/completions" : "/v1/completions", body);
    std::string received;
    std::optional<Clock::duration> headers_after, comment_after, data_after;
    char buffer[4096];
    for (ssize_t n; received.find("data: [DONE]") == std::string::npos &&
                    (n = read(fd, buffer, sizeof buffer)) > 0;) {
      received.append(buffer, size_t(n));
      const auto now = Clock::now() - start;
      if (!headers_after && received.find("\r\n\r\n") != std::string::npos) headers_after = now;
      if (!comment_after && received.find("\n: keep-alive\n\n") != std::string::npos)
        comment_after = now;
      if (!data_after && received.find("data: {") != std::string::npos) data_after = now;
    }
    close(fd);
    EXPECT_TRUE(received.starts_with("HTTP/1.1 200")) << received;
    ASSERT_TRUE(headers_after && comment_after && data_after) << received;
    EXPECT_LT(*headers_after, std::chrono::milliseconds(2500)) << "the headers waited for a token";
    EXPECT_LT(*comment_after, *data_after) << received;
    EXPECT_GT(*data_after, std::chrono::seconds(3)) << "the window did not hold the first token";
    EXPECT_NE(received.find("data: [DONE]"), std::string::npos) << received;
  }
  // Comments and all, a client reads the stream as before; a refusal keeps its 400.
  const Stream stream =
      post_stream(server.port(), "/v1/completions", completion_body("Once upon a time", 8));
  EXPECT_EQ(stream.status, 200);
  EXPECT_TRUE(stream.done);
  EXPECT_EQ(stream.finish_reason, "length");
  std::string too_long;
  for (int i = 0; i < 300; ++i) too_long += "Once upon a time ";
  EXPECT_EQ(post_stream(server.port(), "/v1/completions", completion_body(too_long, 8)).status,
            400);
}

struct BadCall {
  std::string method;
  std::string path;
  std::string body;
  int status;
  std::string param;  // the error body's param; empty: null
  std::string code;   // the error body's code; empty: null
  std::string message_part;
};

TEST_F(ServerE2E, EachBadInputGetsItsStatusAndBodyAndTheServerKeepsServing) {
  const std::string too_long = [] {
    std::string text;
    for (int i = 0; i < 300; ++i) text += "Once upon a time ";
    return text;
  }();
  const json good = chat_body("Hello", 8);
  const std::vector<BadCall> calls = {
      {"POST", "/v1/chat/completions", "{\"model\": ", 400, "", "", "JSON"},
      {"POST", "/v1/chat/completions", "[1, 2]", 400, "", "", "JSON object"},
      {"POST", "/v1/chat/completions",
       json{{"model", "gpt-4"}, {"messages", good["messages"]}}.dump(), 404, "model",
       "model_not_found", "gpt-4"},
      {"POST", "/v1/chat/completions", with(good, "n", 1000).dump(), 400, "n", "",
       "'n' must be between 1 and"},
      {"POST", "/v1/chat/completions", with(good, "temperature", 5).dump(), 400, "temperature", "",
       "temperature"},
      {"POST", "/v1/chat/completions", with(good, "messages", "hi").dump(), 400, "messages", "",
       "array"},
      {"POST", "/v1/chat/completions", with(good, "echo", true).dump(), 400, "echo", "", "echo"},
      {"POST", "/v1/completions", completion_body("x", 600).dump(), 400, "max_tokens", "",
       "maximum context length is 512 tokens"},
      {"POST", "/v1/completions", completion_body(too_long, 4).dump(), 400, "prompt", "", "512"},
      {"POST", "/v1/completions", with(completion_body(too_long, 4), "stream", true).dump(), 400,
       "prompt", "", "512"},
      {"POST", "/v1/chat/completions",
       with(good, "messages", {{{"role", "assistant"}, {"content", "x"}}}).dump(), 400,
       "messages[0].role", "", "alternate"},
      {"GET", "/v1/chat/completions", "", 405, "", "method_not_allowed", "POST"},
      {"POST", "/v1/models", "{}", 405, "", "method_not_allowed", "GET"},
      {"GET", "/v1/nothing-here", "", 404, "", "unknown_url", "/v1/nothing-here"},
      {"GET", "/v1/models/gpt-4", "", 404, "", "model_not_found", "gpt-4"},
      {"GET", "/v1/models/", "", 404, "", "unknown_url", "/v1/models/"},
      {"POST", "/v1/chat/completions", with(good, "logit_bias", {{"600", 5}}).dump(), 400,
       "logit_bias", "", "vocabulary has 512 tokens"},
      {"POST", "/v1/chat/completions", with(good, "stop_token_ids", {600}).dump(), 400,
       "stop_token_ids", "", "stop_token_ids names token 600 but the vocabulary has 512 tokens"},
      {"POST", "/tokenize", "[1, 2]", 400, "", "", "JSON object"},
      {"POST", "/tokenize", json{{"model", "gpt-4"}, {"prompt", "Hi"}}.dump(), 404, "model",
       "model_not_found", "gpt-4"},
      {"POST", "/tokenize",
       json{{"model", kModel}, {"prompt", "Hi"}, {"messages", good["messages"]}}.dump(), 400,
       "prompt", "", "not both"},
      {"POST", "/tokenize",
       json{{"model", kModel}, {"messages", {{{"role", "tool"}, {"content", "x"}}}}}.dump(), 400,
       "messages[0].role", "", "tool"},
      {"POST", "/detokenize", json{{"model", kModel}, {"tokens", {1, 512}}}.dump(), 400, "tokens",
       "", "outside the vocabulary of 512"},
      {"POST", "/detokenize", json{{"model", kModel}, {"tokens", {1, -3}}}.dump(), 400, "tokens",
       "", "token id -3"},
      {"POST", "/detokenize", json{{"model", kModel}, {"tokens", {1, 2.5}}}.dump(), 400, "tokens",
       "", "array of token ids"},
      {"GET", "/tokenize", "", 405, "", "method_not_allowed", "POST"},
      {"GET", "/detokenize", "", 405, "", "method_not_allowed", "POST"},
  };
  for (const BadCall& call : calls) {
    SCOPED_TRACE(call.method + " " + call.path + " " + call.body.substr(0, 200));
    const Reply reply = send(port(), call.method, call.path, call.body);
    EXPECT_EQ(reply.status, call.status) << reply.raw;
    ASSERT_TRUE(reply.body.is_object()) << reply.raw;
    const json& error = reply.body["error"];
    ASSERT_TRUE(error.is_object()) << reply.raw;
    EXPECT_TRUE(error["message"].is_string());
    EXPECT_TRUE(error["type"].is_string());
    EXPECT_EQ(error["param"], call.param.empty() ? json() : json(call.param));
    EXPECT_EQ(error["code"], call.code.empty() ? json() : json(call.code));
    EXPECT_NE(error["message"].get<std::string>().find(call.message_part), std::string::npos)
        << error["message"];
    if (call.status == 405) {
      const auto allow = reply.headers.find("Allow");
      ASSERT_NE(allow, reply.headers.end()) << reply.raw;
      EXPECT_EQ(allow->second, call.message_part);
    }
    const Reply after = post(port(), "/v1/chat/completions", good);
    EXPECT_EQ(after.status, 200) << after.raw;
  }
}

bool can_listen_on_ipv6_loopback() {
  const int fd = socket(AF_INET6, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in6 address{};
  address.sin6_family = AF_INET6;
  address.sin6_addr = in6addr_loopback;
  const bool bound = bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0;
  close(fd);
  return bound;
}

// The address printed is one a client can use: an IPv6 host in brackets (it was http://::1:PORT).
TEST(ServerE2EHost, AnIpv6HostIsPrintedInBracketsAndServes) {
  if (!can_listen_on_ipv6_loopback()) GTEST_SKIP() << "no IPv6 loopback on this machine";
  ServerProcess server(stories_config(), {"--host", "::1"});
  EXPECT_NE(server.stderr_text().find("listening on http://[::1]:" + std::to_string(server.port())),
            std::string::npos)
      << server.stderr_text();
  httplib::Client client("::1", server.port());
  const auto health = client.Get("/health");
  ASSERT_TRUE(health) << httplib::to_string(health.error());
  EXPECT_EQ(health->status, 200);
}

// As vLLM's --api-key: the /v1 routes need it; /health, /metrics and the token routes do not.
TEST(ServerE2EApiKey, EveryV1RouteNeedsTheKey) {
  ServerProcess server(stories_config("  api_key: sesame\n"));
  const httplib::Headers right = {{"Authorization", "Bearer sesame"}};
  const httplib::Headers wrong = {{"Authorization", "Bearer nope"}};
  const std::string body = chat_body("Hi", 4).dump();
  for (const auto& headers : {httplib::Headers{}, wrong}) {
    for (const auto& [method, path] :
         std::vector<std::pair<std::string, std::string>>{{"POST", "/v1/chat/completions"},
                                                          {"POST", "/v1/completions"},
                                                          {"GET", "/v1/models"},
                                                          {"GET", "/v1/models/stories260K"},
                                                          {"GET", "/v1/nowhere"}}) {
      const Reply reply = send(server.port(), method, path, body, headers);
      EXPECT_EQ(reply.status, 401) << method << " " << path;
      EXPECT_EQ(reply.body["error"]["code"], "invalid_api_key");
    }
  }
  EXPECT_EQ(send(server.port(), "GET", "/health", "").status, 200);
  EXPECT_EQ(send(server.port(), "GET", "/metrics", "").status, 200);
  const std::string text = json{{"model", kModel}, {"prompt", "Hi"}}.dump();
  EXPECT_EQ(send(server.port(), "POST", "/tokenize", text).status, 200);
  EXPECT_EQ(send(server.port(), "POST", "/v1/chat/completions", body, right).status, 200);
  EXPECT_EQ(send(server.port(), "GET", "/v1/models", "", right).status, 200);
  // The scheme's case does not matter (RFC 7235); the key's does.
  EXPECT_EQ(
      send(server.port(), "GET", "/v1/models", "", {{"Authorization", "bearer sesame"}}).status,
      200);
  EXPECT_EQ(
      send(server.port(), "GET", "/v1/models", "", {{"Authorization", "Bearer SESAME"}}).status,
      401);
  const std::string tokens = json{{"model", kModel}, {"tokens", {1, 2}}}.dump();
  EXPECT_EQ(send(server.port(), "POST", "/detokenize", tokens, right).status, 200);
}

// A refused request's body is read before the refusal is answered: left unread, its bytes were
// taken for the next requests on the connection, so a body could carry a request of its own
// past the key (here /health requests, whose answers would come before the models list).
TEST(ServerE2EApiKey, ARefusedBodyIsReadNotTakenForTheNextRequest) {
  ServerProcess server(stories_config("  api_key: sesame\n"));
  std::string smuggled = "ZZZZZZ";
  while (smuggled.size() < 20000) smuggled += "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
  const int fd = send_raw(server.port(),
                          "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                          "application/json\r\nContent-Length: " +
                              std::to_string(smuggled.size()) + "\r\n\r\n" + smuggled);
  const std::string refused = read_error_answer(fd);
  EXPECT_NE(refused.find("HTTP/1.1 401"), std::string::npos) << refused;
  const std::string next =
      "GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sesame\r\n"
      "Connection: close\r\n\r\n";
  ASSERT_EQ(write(fd, next.data(), next.size()), ssize_t(next.size()));
  const std::string received = read_to_end(fd);
  close(fd);
  EXPECT_TRUE(received.starts_with("HTTP/1.1 200")) << received.substr(0, 300);
  EXPECT_NE(received.find("\"object\":\"list\""), std::string::npos) << received.substr(0, 300);
  EXPECT_EQ(received.find("\"status\":\"ok\""), std::string::npos) << received.substr(0, 300);
}

// A header of an answer, "" when it has none.
std::string header_of(const Reply& reply, const std::string& name) {
  const auto it = reply.headers.find(name);
  return it == reply.headers.end() ? "" : it->second;
}

// CORS, as vLLM answers it: a browser's preflight (OPTIONS naming the origin and method) from
// a listed origin is answered without the API key, which it never carries, and every answer to
// that origin names it, errors too, so that the page can read them. Other origins get no CORS
// header, and their preflight a 400.
TEST(ServerE2ECors, ListedOriginsMayCallFromABrowserAndOthersMayNot) {
  ServerProcess server(stories_config(
      "  api_key: sesame\n  allowed_origins: [https://chat.example.com, https://b.example]\n"));
  httplib::Client client("127.0.0.1", server.port());
  const std::string page = "https://chat.example.com";
  const auto preflight = [&](const std::string& origin) {
    return client.Options("/v1/chat/completions",
                          {{"Origin", origin},
                           {"Access-Control-Request-Method", "POST"},
                           {"Access-Control-Request-Headers", "authorization, content-type"}});
  };
  const httplib::Result allowed = preflight(page);
  ASSERT_TRUE(allowed) << httplib::to_string(allowed.error());
  EXPECT_EQ(allowed->status, 204) << allowed->body;
  EXPECT_EQ(allowed->get_header_value("Access-Control-Allow-Origin"), page);
  EXPECT_EQ(allowed->get_header_value("Vary"), "Origin");
  EXPECT_EQ(allowed->get_header_value("Access-Control-Allow-Methods"), "GET, POST, OPTIONS");
  EXPECT_EQ(allowed->get_header_value("Access-Control-Allow-Headers"),
            "authorization, content-type");

  const httplib::Result refused = preflight("https://evil.example");
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 400);
  EXPECT_EQ(json::parse(refused->body)["error"]["code"], "cors_origin_not_allowed");
  EXPECT_FALSE(refused->has_header("Access-Control-Allow-Origin"));

  const std::string body = completion_body("Hi", 2).dump();
  const Reply answered = send(server.port(), "POST", "/v1/completions", body,
                              {{"Origin", page}, {"Authorization", "Bearer sesame"}});
  EXPECT_EQ(answered.status, 200) << answered.raw;
  EXPECT_EQ(header_of(answered, "Access-Control-Allow-Origin"), page);
  const Reply no_key = send(server.port(), "POST", "/v1/completions", body, {{"Origin", page}});
  EXPECT_EQ(no_key.status, 401);
  EXPECT_EQ(header_of(no_key, "Access-Control-Allow-Origin"), page);
  const Reply other =
      send(server.port(), "GET", "/health", "", {{"Origin", "https://evil.example"}});
  EXPECT_EQ(other.status, 200);
  EXPECT_EQ(header_of(other, "Access-Control-Allow-Origin"), "");
}

// By default any origin may call ("*"); with server.allowed_origins [] no answer has a CORS
// header and a preflight is an OPTIONS like any other (405).
TEST(ServerE2ECors, AnyOriginByDefaultNoneWhenTheListIsEmpty) {
  const httplib::Headers preflight{{"Origin", "https://a.example"},
                                   {"Access-Control-Request-Method", "POST"}};
  {
    ServerProcess server(stories_config());
    const Reply models =
        send(server.port(), "GET", "/v1/models", "", {{"Origin", "https://a.example"}});
    EXPECT_EQ(header_of(models, "Access-Control-Allow-Origin"), "*");
    const httplib::Result answer =
        httplib::Client("127.0.0.1", server.port()).Options("/v1/completions", preflight);
    ASSERT_TRUE(answer);
    EXPECT_EQ(answer->status, 204);
    EXPECT_EQ(answer->get_header_value("Access-Control-Allow-Origin"), "*");
  }
  ServerProcess server(stories_config("  allowed_origins: []\n"));
  const httplib::Result answer =
      httplib::Client("127.0.0.1", server.port()).Options("/v1/completions", preflight);
  ASSERT_TRUE(answer);
  EXPECT_EQ(answer->status, 405);
  EXPECT_FALSE(answer->has_header("Access-Control-Allow-Origin"));
}

// More requests at once than any fixed pool of connection threads would serve: every one the
// queue can hold reaches the engine at once (a window holds them all), none waits unseen for
// a thread, and all complete.
TEST(ServerE2EQueueFull, EveryRequestTheQueueCanHoldReachesTheEngine) {
  ServerProcess server(
      stories_config("  max_queue: 120\nscheduler:\n  window_ms: 3000\n  max_batch: 128\n"));
  constexpr int kRequests = 100;
  std::vector<std::future<Reply>> replies;
  for (int i = 0; i < kRequests; ++i)
    replies.push_back(std::async(std::launch::async, [&, i] {
      return post(server.port(), "/v1/completions", completion_body(story_prompt(i), 4));
    }));
  const auto deadline = Clock::now() + std::chrono::milliseconds(2500);
  while (metric(server.port(), "pipeline_requests_added_total") < kRequests &&
         Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(metric(server.port(), "pipeline_requests_added_total"), kRequests);
  EXPECT_EQ(metric(server.port(), "pipeline_prefill_batches_total"), 0) << "the window closed";
  for (auto& future : replies) EXPECT_EQ(future.get().status, 200);
}

TEST(ServerE2EQueueFull, RequestsBeyondTheQueueGet503AndTheOthersComplete) {
  // The batch window holds the first two in the waiting queue while the rest arrive.
  ServerProcess server(stories_config("  max_queue: 2\nscheduler:\n  window_ms: 1000\n"));
  constexpr int kRequests = 6;
  std::vector<std::future<Reply>> replies;
  for (int i = 0; i < kRequests; ++i)
    replies.push_back(std::async(std::launch::async, [&, i] {
      return post(server.port(), "/v1/completions", completion_body(story_prompt(i), 4));
    }));
  int accepted = 0;
  for (auto& future : replies) {
    const Reply reply = future.get();
    if (reply.status == 200) {
      ++accepted;
      continue;
    }
    EXPECT_EQ(reply.status, 503) << reply.raw;
    EXPECT_EQ(reply.body["error"]["code"], "queue_full") << reply.raw;
    const auto retry_after = reply.headers.find("Retry-After");
    ASSERT_NE(retry_after, reply.headers.end()) << "no Retry-After";
    EXPECT_EQ(retry_after->second, "1");
  }
  EXPECT_EQ(accepted, 2);
  EXPECT_EQ(post(server.port(), "/v1/completions", completion_body("Hi", 4)).status, 200);
}

// With the queue full, a request that can never run (its max_tokens, or its prompt's token
// ids, past the context) is still told so with its 400, not a 503 that invites a retry.
TEST(ServerE2EQueueFull, ARequestThatCanNeverFitGets400EvenWithTheQueueFull) {
  ServerProcess server(stories_config("  max_queue: 1\nscheduler:\n  window_ms: 3000\n"));
  auto waiting = std::async(std::launch::async, [&] {
    return post(server.port(), "/v1/completions", completion_body("Once upon a time", 4));
  });
  for (const auto until = Clock::now() + std::chrono::seconds(5);
       metric(server.port(), "pipeline_waiting_sequences") < 1 && Clock::now() < until;)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const Reply full = post(server.port(), "/v1/completions", completion_body("Hi", 4));
  EXPECT_EQ(full.status, 503) << full.raw;
  const Reply too_many = post(server.port(), "/v1/completions", completion_body("Hi", 5000));
  EXPECT_EQ(too_many.status, 400) << too_many.raw;
  EXPECT_EQ(too_many.body["error"]["param"], "max_tokens") << too_many.raw;
  EXPECT_NE(too_many.raw.find("maximum context length is 512 tokens. However, you requested at "
                              "least 5002 tokens (at least 2 in the prompt"),
            std::string::npos)
      << too_many.raw;
  const Reply long_ids = post(server.port(), "/v1/completions",
                              with(completion_body("", 4), "prompt", std::vector<int>(600, 300)));
  EXPECT_EQ(long_ids.status, 400) << long_ids.raw;
  EXPECT_EQ(long_ids.body["error"]["param"], "prompt") << long_ids.raw;
  EXPECT_EQ(waiting.get().status, 200);
}

// A client may keep its connection for as many requests as it likes, as with vLLM's uvicorn;
// httplib's default closed it after 5.
TEST_F(ServerE2E, AKeptAliveConnectionServesRequestAfterRequest) {
  const std::string health = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
  const int fd = send_raw(port(), health);
  for (int i = 1; i <= 12; ++i) {
    SCOPED_TRACE("request " + std::to_string(i));
    std::string answer;
    char buffer[1024];
    for (ssize_t n; answer.find("{\"status\":\"ok\"}") == std::string::npos &&
                    (n = read(fd, buffer, sizeof buffer)) > 0;)
      answer.append(buffer, size_t(n));
    ASSERT_TRUE(answer.starts_with("HTTP/1.1 200")) << answer;
    ASSERT_NE(answer.find("{\"status\":\"ok\"}"), std::string::npos) << answer;
    EXPECT_EQ(answer.find("Connection: close"), std::string::npos) << answer;
    if (i < 12) {
      ASSERT_EQ(write(fd, health.data(), health.size()), ssize_t(health.size()));
    }
  }
  close(fd);
}

// The server has a connection thread for each request the engine may hold and 16 more (here
// 2 + 4 + 16). Clients that hold them all without a request to answer (sending a request a
// header line every `period`, or keeping a connection open between requests, as client pools
// do) must not shut a new client out: its /health is answered while they hold on, within
// `within`.
void expect_health_answered_beside_slow_clients(std::chrono::milliseconds period,
                                                std::chrono::seconds within) {
  ServerProcess server(stories_config("  max_queue: 4\nscheduler:\n  max_num_seqs: 2\n"));
  constexpr int kThreads = 2 + 4 + 16;
  std::vector<int> slow;
  for (int i = 0; i < kThreads; ++i)
    slow.push_back(send_raw(server.port(), "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n"));
  std::atomic<bool> answered{false};
  std::thread trickle([&] {
    const std::string line = "X-Slow: 1\r\n";
    const auto end = Clock::now() + 2 * within;
    while (!answered && Clock::now() < end) {
      for (auto next = Clock::now() + period; !answered && Clock::now() < next;)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      // MSG_NOSIGNAL: the server may have closed the connection.
      for (int fd : slow) ::send(fd, line.data(), line.size(), MSG_NOSIGNAL);
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // each holds a thread by now
  const auto start = Clock::now();
  std::string answer, failed;  // errors are caught, so that the trickling thread is joined
  try {
    // Connected first and its request sent later, as a client may: the server's scans for
    // slow clients meet the connection before its bytes, while it waits for a thread.
    const int fd = send_raw(server.port(), "");
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    const std::string request =
        "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    if (write(fd, request.data(), request.size()) != ssize_t(request.size()))
      failed = "the request could not be sent";
    answer = read_to_end(fd);
    close(fd);
  } catch (const std::exception& e) {
    failed = e.what();
  }
  const auto waited = Clock::now() - start;
  answered = true;
  trickle.join();
  for (int fd : slow) close(fd);
  EXPECT_EQ(failed, "");
  EXPECT_TRUE(answer.starts_with("HTTP/1.1 200")) << "the /health connection was cut: " << answer;
  EXPECT_LT(waited, within) << "the slow clients kept every thread";
}

// A header line a second: each connection is quiet for longer than a request's bytes take.
TEST(ServerE2EConnections, ClientsHoldingEveryThreadWithoutARequestDoNotShutOthersOut) {
  expect_health_answered_beside_slow_clients(std::chrono::milliseconds(1000),
                                             std::chrono::seconds(5));
}

// A header line every 100 ms: never quiet, but sending one request for longer than the server
// lets a connection hold a thread while others wait (5 s).
TEST(ServerE2EConnections, ClientsTricklingRequestsIntoEveryThreadDoNotShutOthersOut) {
  expect_health_answered_beside_slow_clients(std::chrono::milliseconds(100),
                                             std::chrono::seconds(10));
}

// A stream of 400 tokens, and SIGTERM once the server's `metric_name` reaches `at_least`; the
// server must exit 0.
Stream stream_through_sigterm(ServerProcess& server, const std::string& metric_name,
                              double at_least) {
  json body = completion_body("Once upon a time", 400);
  body["ignore_eos"] = true;
  auto in_flight = std::async(std::launch::async,
                              [&] { return post_stream(server.port(), "/v1/completions", body); });
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  while (metric(server.port(), metric_name) < at_least && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(server.terminate(std::chrono::seconds(30)), 0) << server.stderr_text();
  return in_flight.get();
}

// A second server on a port already served fails at once, before it loads the model: loading
// first, a large model's second copy could take the memory the running server needs.
TEST(ServerE2EStartup, ASecondServerOnAPortInUseStopsBeforeLoadingTheModel) {
  ServerProcess first(stories_config());
  const auto dir = testing::make_temp_dir("second-server");
  std::ofstream(dir / "serve.yaml") << stories_config();
  const testing::CommandResult second =
      testing::run_pipeline({"run", (dir / "serve.yaml").string(), "--port",
                             std::to_string(first.port()), "--device", "cpu"});
  std::filesystem::remove_all(dir);
  EXPECT_EQ(second.exit_code, 1);
  EXPECT_NE(second.err.find("cannot listen on 127.0.0.1:" + std::to_string(first.port()) +
                            ": Address already in use"),
            std::string::npos)
      << second.err;
  EXPECT_EQ(second.err.find("engine: model"), std::string::npos) << "it loaded the model first";
  httplib::Client client("127.0.0.1", first.port());
  const auto health = client.Get("/health");
  ASSERT_TRUE(health) << httplib::to_string(health.error());
  EXPECT_EQ(health->status, 200);
}

// A host that is no address of this machine's, or no address at all, is refused before the
// model loads, saying which, with a fixed port or with any free one (--port 0).
TEST(ServerE2EStartup, AHostItCannotListenOnStopsBeforeLoadingTheModel) {
  const auto dir = testing::make_temp_dir("bad-host");
  std::ofstream(dir / "serve.yaml") << stories_config();
  const std::pair<std::string, std::string> hosts[] = {
      {"no such host!", "the host does not resolve to an address"},
      {"192.0.2.1", "Cannot assign requested address"}};  // TEST-NET-1: nobody's
  for (const std::string port : {"0", "18231"}) {
    for (const auto& [host, why] : hosts) {
      const testing::CommandResult result = testing::run_pipeline(
          {"run", (dir / "serve.yaml").string(), "--host", host, "--port", port});
      EXPECT_EQ(result.exit_code, 1);
      EXPECT_NE(result.err.find("cannot listen on " + host + ":" + port + ": " + why),
                std::string::npos)
          << result.err;
      EXPECT_EQ(result.err.find("engine: model"), std::string::npos) << "it loaded the model";
    }
  }
  std::filesystem::remove_all(dir);
}

TEST(ServerE2EShutdown, SigtermFinishesTheStreamInFlightAndExitsZero) {
  ServerProcess server(stories_config("scheduler:\n  window_ms: 0\n"));
  const Stream stream = stream_through_sigterm(server, "pipeline_running_sequences", 1);
  EXPECT_EQ(stream.status, 200);
  EXPECT_TRUE(stream.done) << stream.raw.substr(stream.raw.size() > 500 ? stream.raw.size() - 500
                                                                        : 0);
  EXPECT_EQ(stream.finish_reason, "length");
}

// With no grace, a stream already under way ends with an error event (503, shutting down)
// followed by [DONE], as a stream that finishes ends with its finish chunk and [DONE].
TEST(ServerE2EShutdown, AStreamCutOffByTheShutdownEndsWithItsErrorAndDone) {
  ServerProcess server(stories_config("  shutdown_grace_s: 0\nscheduler:\n  window_ms: 0\n"));
  const Stream stream = stream_through_sigterm(server, "pipeline_generation_tokens_total", 20);
  ASSERT_EQ(stream.status, 200) << stream.raw;
  ASSERT_FALSE(stream.events.empty());
  EXPECT_EQ(stream.finish_reason, "") << "the stream finished before the shutdown";
  const json& last = stream.events.back();
  ASSERT_TRUE(last.contains("error")) << last.dump();
  EXPECT_EQ(last["error"]["message"], "server shutting down");
  EXPECT_EQ(last["error"]["code"], "shutting_down");
  EXPECT_TRUE(stream.done) << stream.raw.substr(stream.raw.size() > 500 ? stream.raw.size() - 500
                                                                        : 0);
}

// A client that keeps its connection open between requests (as HTTP client libraries' pools
// do) does not hold the exit back for the keep-alive timeout (5 s).
TEST(ServerE2EShutdown, AnIdleKeepAliveConnectionDoesNotDelayTheExit) {
  ServerProcess server(stories_config(""));
  httplib::Client client("127.0.0.1", server.port());
  client.set_keep_alive(true);
  const httplib::Result health = client.Get("/health");
  ASSERT_TRUE(health && health->status == 200);
  const auto start = Clock::now();
  EXPECT_EQ(server.terminate(std::chrono::seconds(20)), 0) << server.stderr_text();
  EXPECT_LT(Clock::now() - start, std::chrono::milliseconds(3500)) << server.stderr_text();
}

// A client still sending its request's body (a byte a second) when the server is told to stop
// does not hold the exit back: its request would only be refused, and it is cut off.
TEST(ServerE2EShutdown, AClientStillSendingItsBodyDoesNotHoldTheExit) {
  ServerProcess server(stories_config("  shutdown_grace_s: 1\n"));
  const int fd = send_raw(server.port(),
                          "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                          "Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
                          "{\"prompt\": \"");
  std::atomic<bool> done{false};
  std::thread trickle([&] {
    while (!done.load() && send(fd, "a", 1, MSG_NOSIGNAL) == 1)
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto start = Clock::now();
  EXPECT_EQ(server.terminate(std::chrono::seconds(30)), 0) << server.stderr_text();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(8)) << server.stderr_text();
  done.store(true);
  trickle.join();
  close(fd);
}

// Streams whose clients stopped reading (their socket buffers full) do not hold the exit long
// past the grace: once the engine ended every request, their last chunks get a second, then
// their connections are cut. Each write to them would otherwise wait out httplib's 5 s timeout.
TEST(ServerE2EShutdown, StreamsWhoseClientsStoppedReadingDoNotHoldTheExitPastTheGrace) {
  ServerProcess server(
      stories_config("  shutdown_grace_s: 1\nscheduler:\n  window_ms: 50\n  max_batch: 16\n  "
                     "max_num_seqs: 16\n"));
  json body = completion_body("Once upon a time", 480);
  body["ignore_eos"] = true;
  body["stream"] = true;
  body["n"] = 16;
  body["temperature"] = 1.0;
  std::vector<int> clients;
  for (int i = 0; i < 4; ++i)
    clients.push_back(send_raw_completion(server.port(), body, /*receive_buffer=*/2048));
  // Long enough for their answers to fill the sockets' buffers.
  std::this_thread::sleep_for(std::chrono::seconds(2));
  const auto start = Clock::now();
  EXPECT_EQ(server.terminate(std::chrono::seconds(30)), 0) << server.stderr_text();
  EXPECT_LT(Clock::now() - start, std::chrono::milliseconds(4500)) << server.stderr_text();
  for (const int fd : clients) close(fd);
}

// A second SIGTERM ends the grace at once: a request still in flight (here 128 choices of 400
// tokens, one at a time, seconds of work) fails with a 503 and the server exits 0 without
// waiting the grace out.
TEST(ServerE2EShutdown, ASecondSigtermFailsWhatIsStillInFlightAtOnce) {
  ServerProcess server(stories_config(
      "  shutdown_grace_s: 60\nscheduler:\n  window_ms: 30000\n  max_num_seqs: 1\n"));
  json body = completion_body("Once upon a time", 400);
  body["n"] = 128;
  body["ignore_eos"] = true;
  auto waiting =
      std::async(std::launch::async, [&] { return post(server.port(), "/v1/completions", body); });
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  while (metric(server.port(), "pipeline_waiting_sequences") < 1 && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  server.signal(SIGTERM);
  ASSERT_TRUE(server.stderr_shows("SIGTERM received", std::chrono::seconds(10)))
      << server.stderr_text();
  const auto second = Clock::now();
  EXPECT_EQ(server.terminate(std::chrono::seconds(20)), 0) << server.stderr_text();
  EXPECT_LT(Clock::now() - second, std::chrono::seconds(10));
  const Reply reply = waiting.get();
  EXPECT_EQ(reply.status, 503) << reply.raw;
  EXPECT_EQ(reply.body["error"]["message"], "server shutting down") << reply.raw;
  EXPECT_TRUE(server.stderr_text().find("second SIGTERM") != std::string::npos)
      << server.stderr_text();
}

}  // namespace
}  // namespace pipeline
