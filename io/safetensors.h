// Memory-mapped safetensors checkpoints: single files and sharded ones
// (model.safetensors.index.json). Tensors stay in their file dtype; a TensorView
// points straight into the mapping.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "io/dtype.h"

namespace pipeline {

// Any problem with a checkpoint on disk. The message names the file, the tensor where
// there is one, and what is wrong.
class CheckpointError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct TensorView {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const std::byte* data = nullptr;

  int64_t numel() const;
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype); }
  std::string shape_string() const;  // "[64, 512]"
};

// A read-only memory mapping of a whole file.
class MappedFile {
 public:
  explicit MappedFile(const std::filesystem::path& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::byte* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  const std::byte* data_ = nullptr;
  size_t size_ = 0;
};

// One .safetensors file, validated on open: header JSON, dtypes, offsets inside the file
// and consistent with each shape.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::filesystem::path& path);

  const std::filesystem::path& path() const { return path_; }
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }

 private:
  std::filesystem::path path_;
  std::unique_ptr<MappedFile> file_;
  std::map<std::string, TensorView> tensors_;
};

// All tensors of a checkpoint folder: model.safetensors, or the shards that
// model.safetensors.index.json names.
class Checkpoint {
 public:
  explicit Checkpoint(const std::filesystem::path& dir);

  // nullptr when absent.
  const TensorView* find(const std::string& name) const;
  // Throws CheckpointError naming the folder and the tensor when absent.
  const TensorView& get(const std::string& name) const;
  // Which file holds a tensor, for error messages.
  std::filesystem::path file_of(const std::string& name) const;

 private:
  std::filesystem::path dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, std::pair<const TensorView*, size_t>> index_;  // name -> (view, file)
};

// A tensor to write, without its bytes.
struct TensorSpec {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;

  size_t nbytes() const { return TensorView{name, dtype, shape, nullptr}.nbytes(); }
};

// Writes a safetensors file tensor by tensor: `fill(i, bytes)` puts tensor i's bytes (in its
// dtype) into `bytes`, so a checkpoint larger than memory can be written.
using TensorFiller = std::function<void(size_t index, std::span<std::byte> bytes)>;
void write_safetensors(const std::filesystem::path& path, const std::vector<TensorSpec>& specs,
                       const TensorFiller& fill,
                       const std::map<std::string, std::string>& metadata = {});

// A tensor to write whose bytes are already in `dtype`.
struct TensorData {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  std::vector<std::byte> bytes;
};

void write_safetensors(const std::filesystem::path& path, const std::vector<TensorData>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace pipeline
