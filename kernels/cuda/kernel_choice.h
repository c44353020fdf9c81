// Kernels that compute the same thing in different ways (the decode attention's, SkinnyGemm's)
// are chosen by timing them; an environment variable may name one instead, to run tests,
// sanitizers or a benchmark on it. These find a kernel by its name.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>

namespace pipeline::cuda {

// The kernel of `kernels` that name_of() calls `name`; for any other name, std::invalid_argument
// naming the choices: "no <what> is named 'X' (direct or pipelined)".
template <typename Kernel, size_t N>
Kernel kernel_named(const Kernel (&kernels)[N], const char* (*name_of)(Kernel), const char* what,
                    const std::string& name) {
  std::string choices;
  for (size_t i = 0; i < N; ++i) {
    if (name == name_of(kernels[i])) return kernels[i];
    choices += (i == 0 ? "" : i + 1 == N ? " or " : ", ") + std::string(name_of(kernels[i]));
  }
  throw std::invalid_argument("no " + std::string(what) + " is named '" + name + "' (" + choices +
                              ")");
}

// The kernel the environment variable names, or none where it is unset or empty; a name that is
// no kernel's is refused as kernel_named() refuses it, after the variable's name.
template <typename Kernel, size_t N>
std::optional<Kernel> kernel_from_environment(const char* variable, const Kernel (&kernels)[N],
                                              const char* (*name_of)(Kernel), const char* what) {
  const char* setting = std::getenv(variable);
  if (!setting || !*setting) return std::nullopt;
  try {
    return kernel_named(kernels, name_of, what, setting);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(std::string(variable) + ": " + e.what());
  }
}

}  // namespace pipeline::cuda
