#include "server/peer_connection.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include <charconv>
#include <filesystem>
#include <system_error>

namespace pipeline {
namespace {

// One end of a socket as httplib names a peer: the numeric host, and the port.
bool endpoint_of(const sockaddr_storage& address, socklen_t length, std::string& host, int& port) {
  char host_text[NI_MAXHOST], port_text[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&address), length, host_text, sizeof host_text,
                  port_text, sizeof port_text, NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return false;
  host = host_text;
  port = std::atoi(port_text);
  return true;
}

// The peer's end of a connected socket; false when fd is not one.
bool peer_end(int fd, std::string& host, int& port) {
  sockaddr_storage address{};
  socklen_t length = sizeof address;
  return getpeername(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0 &&
         endpoint_of(address, length, host, port);
}

bool own_port_is(int fd, int local_port) {
  sockaddr_storage address{};
  socklen_t length = sizeof address;
  std::string host;
  int port = 0;
  return getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0 &&
         endpoint_of(address, length, host, port) && port == local_port;
}

bool connects(int fd, const std::string& remote_addr, int remote_port, int local_port) {
  std::string host;
  int port = 0;
  return peer_end(fd, host, port) && port == remote_port && host == remote_addr &&
         own_port_is(fd, local_port);
}

// Calls visit(fd) for the process's open descriptors until it returns true. Descriptors open
// and close meanwhile on other threads: a failed step ends the walk.
template <typename Visit>
void for_each_descriptor(Visit visit) {
  std::error_code error;
  for (std::filesystem::directory_iterator it("/proc/self/fd", error), end; !error && it != end;
       it.increment(error)) {
    const std::string name = it->path().filename().string();
    int fd = -1;
    if (std::from_chars(name.data(), name.data() + name.size(), fd).ec != std::errc()) continue;
    if (visit(fd)) return;
  }
}

enum class Reading { kUnknown, kQuiet, kTakenAsItComes, kWaiting };

// Whether no bytes wait to be read and none arrived for `quiet` (the kernel counts from the
// connection's start when none ever did); or none wait, yet some arrived since (a thread reads
// them as they come); or some wait (no thread reads the connection, or not yet).
Reading reading_state(int fd, std::chrono::milliseconds quiet) {
  int unread = 0;
  tcp_info info{};
  socklen_t length = sizeof info;
  if (ioctl(fd, FIONREAD, &unread) != 0 ||
      getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &length) != 0)
    return Reading::kUnknown;
  if (unread != 0) return Reading::kWaiting;
  return std::chrono::milliseconds(info.tcpi_last_data_recv) >= quiet ? Reading::kQuiet
                                                                      : Reading::kTakenAsItComes;
}

}  // namespace

void stop_reading_idle_connections(
    int local_port, std::chrono::milliseconds quiet,
    const std::function<bool(const std::string& host, int port)>& answering, SlowSenders* slow) {
  const auto now = std::chrono::steady_clock::now();
  SlowSenders::Clients sending, waiting;
  for_each_descriptor([&](int fd) {
    std::pair<std::string, int> client;
    if (!peer_end(fd, client.first, client.second) || !own_port_is(fd, local_port) ||
        answering(client.first, client.second))
      return false;
    const Reading state = reading_state(fd, quiet);
    bool waited_lately = false;
    if (slow != nullptr) {
      if (state == Reading::kWaiting) {
        waiting.emplace(client, now);
      } else if (const auto seen = slow->waiting.find(client);
                 seen != slow->waiting.end() && now - seen->second < quiet) {
        waiting.emplace(client, seen->second);
        waited_lately = true;
      }
    }
    if (state == Reading::kQuiet) {
      if (!waited_lately) ::shutdown(fd, SHUT_RD);
    } else if (slow != nullptr && state == Reading::kTakenAsItComes) {
      // Bytes that wait unread mean no thread reads the connection: one queued for a thread,
      // whose first scan may have come before its request did (and found it just as a sender
      // whose bytes a thread takes), holds none, and starts no time.
      const auto seen = slow->since.find(client);
      const auto since = seen != slow->since.end() ? seen->second : now;
      sending.emplace(client, since);
      if (now - since >= slow->limit) ::shutdown(fd, SHUT_RD);
    }
    return false;
  });
  if (slow != nullptr) {
    slow->since = std::move(sending);
    slow->waiting = std::move(waiting);
  }
}

void end_every_connection(int local_port) {
  for_each_descriptor([&](int fd) {
    std::string host;
    int port = 0;
    if (peer_end(fd, host, port) && own_port_is(fd, local_port)) ::shutdown(fd, SHUT_RDWR);
    return false;
  });
}

PeerConnection::PeerConnection(const std::string& remote_addr, int remote_port, int local_port) {
  for_each_descriptor([&](int fd) {
    if (!connects(fd, remote_addr, remote_port, local_port)) return false;
    fd_ = fd;
    return true;
  });
}

bool PeerConnection::closed() const {
  if (fd_ < 0) return false;
  // The peer's FIN shows as POLLRDHUP, a reset as POLLERR/POLLHUP; bytes of a next request
  // (POLLIN alone) are not an end.
  pollfd poll_fd{fd_, POLLRDHUP, 0};
  return ::poll(&poll_fd, 1, 0) > 0 &&
         (poll_fd.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

void PeerConnection::end() const {
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
}

}  // namespace pipeline
