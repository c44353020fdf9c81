#include "server/port_claim.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>

namespace pipeline {

namespace {

// A socket listening on one of host's addresses (the first that takes it); -1 with `why` set
// when none does.
int listen_on(const std::string& host, int port, std::string& why) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* addresses = nullptr;
  if (const int error =
          getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &addresses)) {
    why = std::string("the host does not resolve to an address (") + gai_strerror(error) + ")";
    return -1;
  }
  int sock = -1;
  for (const addrinfo* a = addresses; a && sock < 0; a = a->ai_next) {
    sock = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (sock < 0) {
      why = std::strerror(errno);
      continue;
    }
    const int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    if (::bind(sock, a->ai_addr, a->ai_addrlen) != 0 || ::listen(sock, 1) != 0) {
      why = std::strerror(errno);
      ::close(sock);
      sock = -1;
    }
  }
  freeaddrinfo(addresses);
  return sock;
}

}  // namespace

PortClaim::PortClaim(const std::string& host, int port) {
  std::string why;
  socket_ = listen_on(host, port, why);
  if (socket_ < 0)
    throw std::runtime_error("cannot listen on " + host + ":" + std::to_string(port) + ": " + why);
  // Any free port will do later: the host is known to take one, and none need be held.
  if (port == 0) release();
}

PortClaim::~PortClaim() {
  release();
}

void PortClaim::release() {
  if (socket_ >= 0) ::close(socket_);
  socket_ = -1;
}

}  // namespace pipeline
