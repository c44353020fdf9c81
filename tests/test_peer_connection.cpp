// PeerConnection finds a server-side socket by its two ends and tells when the client left;
// stop_reading_idle_connections ends the reads of a server port's idle connections.
#include "server/peer_connection.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <stdexcept>
#include <thread>

#include <gtest/gtest.h>

namespace pipeline {
namespace {

using namespace std::chrono_literals;

int port_of(int fd, bool peer) {
  sockaddr_in address{};
  socklen_t length = sizeof address;
  const int got = peer ? getpeername(fd, reinterpret_cast<sockaddr*>(&address), &length)
                       : getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  if (got != 0) throw std::runtime_error("getsockname/getpeername failed");
  return ntohs(address.sin_port);
}

// A listening socket on 127.0.0.1, a client connected to it and the server's end of that
// connection, as a server's connection thread has it.
struct Connection {
  Connection() {
    listener = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (listener < 0 || bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof address) ||
        listen(listener, 1))
      throw std::runtime_error("cannot listen on 127.0.0.1");
    server_port = port_of(listener, false);
    address.sin_port = htons(uint16_t(server_port));
    client = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(client, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0)
      throw std::runtime_error("cannot connect");
    accepted = accept(listener, nullptr, nullptr);
    client_port = port_of(client, false);
  }
  ~Connection() {
    for (int fd : {listener, client, accepted})
      if (fd >= 0) close(fd);
  }
  int listener = -1, client = -1, accepted = -1;
  int server_port = 0, client_port = 0;
};

bool closed_within(const PeerConnection& peer, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!peer.closed()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

TEST(PeerConnection, SeesTheClientLeave) {
  Connection connection;
  const PeerConnection peer("127.0.0.1", connection.client_port, connection.server_port);
  ASSERT_TRUE(peer.found());
  EXPECT_FALSE(peer.closed());
  // The bytes of a next request are not an end.
  ASSERT_EQ(write(connection.client, "GET / HTTP/1.1\r\n", 16), 16);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(peer.closed());
  // The client's end stays open (its descriptor valid), so only the server's end can see this.
  ASSERT_EQ(shutdown(connection.client, SHUT_WR), 0);
  EXPECT_TRUE(closed_within(peer, std::chrono::seconds(2)));
}

TEST(PeerConnection, SeesAClosedClient) {
  Connection connection;
  const PeerConnection peer("127.0.0.1", connection.client_port, connection.server_port);
  ASSERT_TRUE(peer.found());
  close(connection.client);
  connection.client = -1;
  EXPECT_TRUE(closed_within(peer, std::chrono::seconds(2)));
}

TEST(PeerConnection, MatchesBothEnds) {
  Connection connection;
  EXPECT_FALSE(PeerConnection("127.0.0.1", connection.client_port, connection.client_port).found());
  EXPECT_FALSE(PeerConnection("10.1.2.3", connection.client_port, connection.server_port).found());
}

TEST(PeerConnection, WithoutASocketNeverReportsAnEnd) {
  const PeerConnection nobody("127.0.0.1", 1, 2);
  EXPECT_FALSE(nobody.found());
  EXPECT_FALSE(nobody.closed());
}

// What a non-blocking read of fd gives: a byte count, 0 at the end, -1 when nothing is there.
ssize_t read_now(int fd, char* buffer, size_t size) {
  return recv(fd, buffer, size, MSG_DONTWAIT);
}

TEST(StopReadingIdleConnections, EndsTheReadsOfThePortsIdleConnectionsOnly) {
  Connection idle, answering, other;
  stop_reading_idle_connections(idle.server_port, 0ms, [&](const std::string& host, int port) {
    return host == "127.0.0.1" && port == answering.client_port;
  });
  stop_reading_idle_connections(answering.server_port, 0ms, [&](const std::string& host, int port) {
    return host == "127.0.0.1" && port == answering.client_port;
  });
  char buffer[8];
  EXPECT_EQ(read_now(idle.accepted, buffer, sizeof buffer), 0) << "no end of input";
  EXPECT_EQ(read_now(answering.accepted, buffer, sizeof buffer), -1) << "a connection answering";
  EXPECT_EQ(read_now(other.accepted, buffer, sizeof buffer), -1) << "another port's connection";
  EXPECT_EQ(read_now(idle.client, buffer, sizeof buffer), -1) << "the client's end";
}

TEST(StopReadingIdleConnections, LeavesAConnectionWithARequestWaitingToBeRead) {
  Connection arriving;
  ASSERT_EQ(write(arriving.client, "GET", 3), 3);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // on loopback: there by now
  stop_reading_idle_connections(arriving.server_port, 0ms,
                                [](const std::string&, int) { return false; });
  char buffer[8];
  EXPECT_EQ(read_now(arriving.accepted, buffer, sizeof buffer), 3);
  EXPECT_EQ(read_now(arriving.accepted, buffer, sizeof buffer), -1) << "its reads were ended";
}

// httplib reads a request into its own buffer before routing it: no bytes wait in the kernel
// then, but the connection received some a moment ago.
TEST(StopReadingIdleConnections, LeavesAConnectionThatReceivedBytesLately) {
  Connection reading;
  ASSERT_EQ(write(reading.client, "GET", 3), 3);
  char buffer[8];
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  ssize_t got = -1;
  while ((got = read_now(reading.accepted, buffer, sizeof buffer)) < 0 &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_EQ(got, 3);
  const auto nobody = [](const std::string&, int) { return false; };
  stop_reading_idle_connections(reading.server_port, 60s, nobody);
  EXPECT_EQ(read_now(reading.accepted, buffer, sizeof buffer), -1) << "its reads were ended";
  stop_reading_idle_connections(reading.server_port, 0ms, nobody);
  EXPECT_EQ(read_now(reading.accepted, buffer, sizeof buffer), 0) << "quiet long enough";
}

// A connection queued for a thread keeps its request's bytes in the kernel past `quiet`; once a
// thread has read them, the relieving scan that had seen them waiting leaves the connection
// for `quiet` more (httplib may not have routed the request yet), then ends its reads.
TEST(StopReadingIdleConnections, LeavesAConnectionWhoseWaitingBytesWereJustRead) {
  Connection queued;
  ASSERT_EQ(write(queued.client, "GET", 3), 3);
  std::this_thread::sleep_for(std::chrono::milliseconds(150));  // received 150 ms ago
  const auto nobody = [](const std::string&, int) { return false; };
  SlowSenders relieving{5s, {}, {}};
  stop_reading_idle_connections(queued.server_port, 100ms, nobody, &relieving);
  char buffer[8];
  ASSERT_EQ(read_now(queued.accepted, buffer, sizeof buffer), 3) << "a thread takes the request";
  stop_reading_idle_connections(queued.server_port, 100ms, nobody, &relieving);
  EXPECT_EQ(read_now(queued.accepted, buffer, sizeof buffer), -1) << "its reads were ended";
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  stop_reading_idle_connections(queued.server_port, 100ms, nobody, &relieving);
  EXPECT_EQ(read_now(queued.accepted, buffer, sizeof buffer), 0) << "quiet long enough";
}

}  // namespace
}  // namespace pipeline
