#include "server/port_claim.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <stdexcept>

namespace pipeline {

namespace {

// A socket listening on one of host's addresses (the first that takes it), or -1.
int listen_on(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* addresses = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &addresses) != 0) return -1;
  int sock = -1;
  for (const addrinfo* a = addresses; a && sock < 0; a = a->ai_next) {
    sock = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (sock < 0) continue;
    const int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    if (::bind(sock, a->ai_addr, a->ai_addrlen) != 0 || ::listen(sock, 1) != 0) {
      ::close(sock);
      sock = -1;
    }
  }
  freeaddrinfo(addresses);
  return sock;
}

}  // namespace

PortClaim::PortClaim(const std::string& host, int port) {
  if (port == 0) return;
  socket_ = listen_on(host, port);
  if (socket_ < 0)
    throw std::runtime_error("cannot listen on " + host + ":" + std::to_string(port) +
                             " (address in use or not available)");
}

PortClaim::~PortClaim() {
  release();
}

void PortClaim::release() {
  if (socket_ >= 0) ::close(socket_);
  socket_ = -1;
}

}  // namespace pipeline
