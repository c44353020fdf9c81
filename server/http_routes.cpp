#include "server/http_routes.h"

#include <map>
#include <string_view>

namespace pipeline {
namespace {

// The routes and their one method, for telling 405 from 404.
const std::map<std::string, std::string>& route_methods() {
  static const std::map<std::string, std::string> routes = {
      {"/v1/chat/completions", "POST"},
      {"/v1/completions", "POST"},
      {"/tokenize", "POST"},
      {"/detokenize", "POST"},
      {"/v1/models", "GET"},
      {"/health", "GET"},
      {"/metrics", "GET"},
  };
  return routes;
}

constexpr std::string_view kModelPrefix = "/v1/models/";

}  // namespace

std::string allowed_method(const std::string& path) {
  if (auto route = route_methods().find(path); route != route_methods().end()) return route->second;
  if (path.size() > kModelPrefix.size() && path.starts_with(kModelPrefix)) return "GET";
  return "";
}

std::string route_label(const std::string& path) {
  if (route_methods().contains(path)) return path;
  if (path.size() > kModelPrefix.size() && path.starts_with(kModelPrefix)) return "/v1/models/{id}";
  return "other";
}

}  // namespace pipeline
