// The HTTP server's routes as its answers and metrics name them, apart from the handlers that
// answer them (server/http_server.cpp): which method a path takes, and its metrics label.
#pragma once

#include <string>

namespace pipeline {

// The one method a known path takes; empty for an unknown path.
std::string allowed_method(const std::string& path);

// A route's name for metrics labels: unknown paths share one label so they cannot grow the
// label set without bound.
std::string route_label(const std::string& path);

}  // namespace pipeline
