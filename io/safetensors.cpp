#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

namespace pipeline {

namespace {

using nlohmann::json;

[[noreturn]] void fail(const std::filesystem::path& file, const std::string& what) {
  throw CheckpointError(file.string() + ": " + what);
}

[[noreturn]] void fail_tensor(const std::filesystem::path& file, const std::string& tensor,
                              const std::string& what) {
  fail(file, "tensor '" + tensor + "': " + what);
}

// The header is at most this large; a bigger length means a corrupt or foreign file.
constexpr uint64_t kMaxHeaderBytes = 100u << 20;

std::vector<int64_t> parse_shape(const std::filesystem::path& file, const std::string& name,
                                 const json& entry) {
  if (!entry.contains("shape") || !entry["shape"].is_array())
    fail_tensor(file, name, "header entry has no 'shape' list");
  std::vector<int64_t> shape;
  int64_t elements = 1;
  for (const auto& dim : entry["shape"]) {
    if (!dim.is_number_integer() || dim.get<int64_t>() < 0)
      fail_tensor(file, name, "shape " + entry["shape"].dump() + " is not a list of sizes");
    shape.push_back(dim.get<int64_t>());
    // At most 2^60 elements, so that their bytes (4 at most each) are a number in 64 bits and
    // the check against data_offsets cannot be passed by a size that wrapped around.
    if (__builtin_mul_overflow(elements, shape.back(), &elements) || elements > (int64_t(1) << 60))
      fail_tensor(file, name,
                  "shape " + entry["shape"].dump() + " holds more elements than a file can");
  }
  return shape;
}

TensorView parse_entry(const std::filesystem::path& file, const std::string& name,
                       const json& entry, const std::byte* data, uint64_t data_bytes) {
  if (!entry.is_object()) fail_tensor(file, name, "header entry is not an object");
  TensorView view;
  view.name = name;
  if (!entry.contains("dtype") || !entry["dtype"].is_string())
    fail_tensor(file, name, "header entry has no 'dtype'");
  const auto dtype = entry["dtype"].get<std::string>();
  const auto parsed =
      dtype == "F32" || dtype == "F16" || dtype == "BF16" ? parse_dtype(dtype) : std::nullopt;
  if (!parsed) fail_tensor(file, name, "unsupported dtype '" + dtype + "' (F32, F16 or BF16)");
  view.dtype = *parsed;
  view.shape = parse_shape(file, name, entry);

  const auto& offsets = entry.contains("data_offsets") ? entry["data_offsets"] : json();
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
      !offsets[1].is_number_unsigned())
    fail_tensor(file, name, "header entry has no 'data_offsets' [begin, end]");
  const uint64_t begin = offsets[0].get<uint64_t>(), end = offsets[1].get<uint64_t>();
  if (begin > end || end > data_bytes)
    fail_tensor(file, name,
                "data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                    "] lie outside the file's " + std::to_string(data_bytes) +
                    " data bytes (truncated file?)");
  if (end - begin != view.nbytes())
    fail_tensor(file, name,
                "shape " + view.shape_string() + " of " + dtype + " needs " +
                    std::to_string(view.nbytes()) + " bytes but data_offsets span " +
                    std::to_string(end - begin));
  view.data = data + begin;
  return view;
}

json read_json_file(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) fail(path, "cannot open");
  try {
    return json::parse(in);
  } catch (const json::exception& e) {  // a syntax error, or a number past a double (1e400)
    fail(path, std::string("bad JSON: ") + e.what());
  }
}

}  // namespace

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string TensorView::shape_string() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

MappedFile::MappedFile(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    fail(path, std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(path, "not a regular file");
  }
  size_ = size_t(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      fail(path, std::string("mmap failed: ") + std::strerror(err));
    }
    data_ = static_cast<const std::byte*>(p);
  }
  ::close(fd);
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<std::byte*>(data_), size_);
}

SafetensorsFile::SafetensorsFile(const std::filesystem::path& path) : path_(path) {
  if (!std::filesystem::exists(path)) fail(path, "no such file");
  file_ = std::make_unique<MappedFile>(path);
  if (file_->size() < 8) fail(path, "truncated: shorter than the 8-byte header length");
  uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, file_->data(), 8);  // little-endian, as is every supported host
  if (header_bytes > kMaxHeaderBytes || header_bytes > file_->size() - 8)
    fail(path, "header length " + std::to_string(header_bytes) + " exceeds the file size " +
                   std::to_string(file_->size()) + " (truncated or not a safetensors file)");
  const char* header_begin = reinterpret_cast<const char*>(file_->data() + 8);
  json header;
  try {
    header = json::parse(header_begin, header_begin + header_bytes);
  } catch (const json::exception& e) {  // a syntax error, or a number past a double (1e400)
    fail(path, std::string("bad header JSON: ") + e.what());
  }
  if (!header.is_object()) fail(path, "bad header JSON: not an object");
  const std::byte* data = file_->data() + 8 + header_bytes;
  const uint64_t data_bytes = file_->size() - 8 - header_bytes;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    tensors_.emplace(name, parse_entry(path, name, entry, data, data_bytes));
  }
}

Checkpoint::Checkpoint(const std::filesystem::path& dir) : dir_(dir) {
  if (!std::filesystem::is_directory(dir)) fail(dir, "model folder does not exist");
  const auto index_path = dir / "model.safetensors.index.json";
  std::vector<std::string> file_names;
  if (std::filesystem::exists(index_path)) {
    const json index = read_json_file(index_path);
    if (!index.contains("weight_map") || !index["weight_map"].is_object())
      fail(index_path, "no 'weight_map' object");
    std::set<std::string> unique;
    for (const auto& [tensor, file] : index["weight_map"].items()) {
      if (!file.is_string()) fail(index_path, "weight_map['" + tensor + "'] is not a file name");
      unique.insert(file.get<std::string>());
    }
    file_names.assign(unique.begin(), unique.end());
  } else if (std::filesystem::exists(dir / "model.safetensors")) {
    file_names.push_back("model.safetensors");
  } else {
    fail(dir, "no model.safetensors or model.safetensors.index.json");
  }
  for (const auto& name : file_names) {
    files_.push_back(std::make_unique<SafetensorsFile>(dir / name));
    for (const auto& [tensor, view] : files_.back()->tensors()) {
      if (index_.count(tensor))
        fail(files_.back()->path(),
             "tensor '" + tensor + "' also appears in " + file_of(tensor).filename().string());
      index_[tensor] = {&view, files_.size() - 1};
    }
  }
}

const TensorView* Checkpoint::find(const std::string& name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : it->second.first;
}

const TensorView& Checkpoint::get(const std::string& name) const {
  if (const TensorView* view = find(name)) return *view;
  fail(dir_, "missing tensor '" + name + "'");
}

std::filesystem::path Checkpoint::file_of(const std::string& name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? dir_ : files_[it->second.second]->path();
}

void write_safetensors(const std::filesystem::path& path, const std::vector<TensorSpec>& specs,
                       const TensorFiller& fill,
                       const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  size_t largest = 0;
  for (const auto& spec : specs) {
    const size_t bytes = spec.nbytes();
    header[spec.name] = {{"dtype", dtype_name(spec.dtype)},
                         {"shape", spec.shape},
                         {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    largest = std::max(largest, bytes);
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // keeps tensor data 8-byte aligned
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) fail(path, "cannot create");
  const uint64_t header_bytes = text.size();
  out.write(reinterpret_cast<const char*>(&header_bytes), 8);
  out.write(text.data(), std::streamsize(text.size()));
  std::vector<std::byte> buffer(largest);
  for (size_t i = 0; i < specs.size(); ++i) {
    const auto bytes = std::span(buffer).first(specs[i].nbytes());
    fill(i, bytes);
    out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  }
  out.close();  // what is still buffered may fail to go out only here
  if (!out) fail(path, "write failed");
}

void write_safetensors(const std::filesystem::path& path, const std::vector<TensorData>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<TensorSpec> specs;
  for (const auto& t : tensors) specs.push_back({t.name, t.dtype, t.shape});
  write_safetensors(
      path, specs,
      [&](size_t i, std::span<std::byte> bytes) {
        if (bytes.size() != tensors[i].bytes.size())
          fail(path, "tensor '" + tensors[i].name + "': " +
                         std::to_string(tensors[i].bytes.size()) + " bytes do not fill its shape");
        std::copy(tensors[i].bytes.begin(), tensors[i].bytes.end(), bytes.begin());
      },
      metadata);
}

}  // namespace pipeline
