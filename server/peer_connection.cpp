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

// No bytes wait to be read, and none arrived for `quiet` (the kernel counts from the connection's
// start when none ever did).
bool quiet_for(int fd, std::chrono::milliseconds quiet) {
  int unread = 0;
  tcp_info info{};
  socklen_t length = sizeof info;
  return ioctl(fd, FIONREAD, &unread) == 0 && unread == 0 &&
         getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &length) == 0 &&
         std::chrono::milliseconds(info.tcpi_last_data_recv) >= quiet;
}

}  // namespace

void stop_reading_idle_connections(
    int local_port, std::chrono::milliseconds quiet,
    const std::function<bool(const std::string& host, int port)>& answering) {
  for_each_descriptor([&](int fd) {
    std::string host;
    int port = 0;
    if (peer_end(fd, host, port) && own_port_is(fd, local_port) && !answering(host, port) &&
        quiet_for(fd, quiet))
      ::shutdown(fd, SHUT_RD);
    return false;
  });
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
