// Argument-check messages for the op entry points, built as one std::string from strings and integers:
// streaming sizes(), ScalarType or raw integers into TORCH_CHECK from nvcc-compiled host code crashed the
// process on torch 2.11, so every message is formatted here first.
#pragma once

#include <ATen/ATen.h>

#include <string>

namespace perception_msg {

inline std::string shape(at::IntArrayRef s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

inline std::string dtype(const at::Tensor& t) { return c10::toString(t.scalar_type()); }

inline std::string num(int64_t v) { return std::to_string(v); }

}  // namespace perception_msg
