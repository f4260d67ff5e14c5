// Libra snapshot extension: pack tensors into contiguous byte buckets and unpack them. The byte layout (which
// bucket, which offset) is computed in Python and passed in, so every path writes identical bytes: tensor bytes at
// their offsets, zeros everywhere else. Copies run in parallel over chunks of at most kChunk bytes
// (at::parallel_for). Checksums are not computed here: libra/elastic/pack.py uses the xxhash library (XXH3-64).

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#ifdef LIBRA_WITH_CUDA
#include "pack_cuda.h"
#include <cuda_runtime.h>
#endif

namespace {

constexpr int64_t kChunk = int64_t(1) << 20;  // 1 MiB: small enough to spread over cores, big enough to amortise

// Error messages are built here from strings and std::to_string, and TORCH_CHECK gets one std::string, which it
// passes on as it is. Given several arguments, TORCH_CHECK formats them through a std::ostringstream compiled into
// this extension, and on one lent GPU machine's image (GCC 13.3, Python 3.12, torch 2.11) inserting an integer
// there crashed the process (SIGSEGV inside libstdc++'s locale code): a rejected layout must raise, not crash.
std::string piece(const char* s) { return s; }
std::string piece(const c10::Device& d) { return d.str(); }
template <typename T, typename = std::enable_if_t<std::is_integral_v<T>>>
std::string piece(T v) {
  return std::to_string(v);
}
template <typename... Args>
std::string msg(const Args&... args) {
  std::string out;
  (out += ... += piece(args));
  return out;
}

struct Copy {
  uint8_t* dst;
  const uint8_t* src;
  int64_t n;
};

void run_copies(const std::vector<Copy>& copies) {
  at::parallel_for(0, static_cast<int64_t>(copies.size()), 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) std::memcpy(copies[i].dst, copies[i].src, copies[i].n);
  });
}

void add_chunked(std::vector<Copy>& copies, uint8_t* dst, const uint8_t* src, int64_t n) {
  for (int64_t off = 0; off < n; off += kChunk) copies.push_back({dst + off, src + off, std::min(kChunk, n - off)});
}

void check_layout(size_t num_tensors, const std::vector<int64_t>& slot_bucket, const std::vector<int64_t>& slot_offset) {
  TORCH_CHECK(slot_bucket.size() == num_tensors && slot_offset.size() == num_tensors,
              msg("layout has ", slot_bucket.size(), " bucket ids and ", slot_offset.size(), " offsets for ",
                  num_tensors, " tensors"));
}

int64_t nbytes_of(const at::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }

// Whether [off, off + n) lies inside [0, size), written so that no sum can overflow (an offset near 2**63 must be
// refused, not wrapped round to a small one that passes).
bool slot_fits(int64_t off, int64_t n, int64_t size) { return off >= 0 && n >= 0 && n <= size && off <= size - n; }

// A conjugate or negative view's memory holds the values before the conjugation or negation, so its raw bytes are
// not its values: the Python path refuses it (torch's `view(torch.uint8)`), and so does this one.
void check_plain(const at::Tensor& t, const char* where, size_t i) {
  TORCH_CHECK(!t.is_conj() && !t.is_neg(), msg(where, ": tensor ", i,
                                               " is a conjugate or negative view; resolve_conj()/resolve_neg() it"));
}

}  // namespace

// Pack CPU tensors into new uint8 buckets of the given sizes; bytes outside every slot are zero.
std::vector<at::Tensor> pack(const std::vector<at::Tensor>& tensors, const std::vector<int64_t>& bucket_sizes,
                             const std::vector<int64_t>& slot_bucket, const std::vector<int64_t>& slot_offset) {
  check_layout(tensors.size(), slot_bucket, slot_offset);
  std::vector<at::Tensor> buckets;
  buckets.reserve(bucket_sizes.size());
  for (int64_t size : bucket_sizes) buckets.push_back(at::empty({size}, at::TensorOptions().dtype(at::kByte)));
  // Zero only the gaps (padding and tails) so that every byte is defined without a full extra pass.
  std::vector<std::vector<std::pair<int64_t, int64_t>>> used(bucket_sizes.size());
  std::vector<at::Tensor> keep;  // contiguous copies must outlive the parallel copy
  std::vector<Copy> copies;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& t = tensors[i];
    TORCH_CHECK(t.device().is_cpu(), msg("pack: tensor ", i, " is on ", t.device(), "; use the CUDA path"));
    check_plain(t, "pack", i);
    const int64_t b = slot_bucket[i], off = slot_offset[i], n = nbytes_of(t);
    if (n == 0) continue;  // (an empty slot writes nothing and is not looked up, as in the Python path)
    TORCH_CHECK(b >= 0 && b < (int64_t)buckets.size() && slot_fits(off, n, bucket_sizes[b]),
                msg("pack: tensor ", i, " (", n, " bytes) does not fit bucket ", b, " at offset ", off));
    at::Tensor c = t.contiguous();
    keep.push_back(c);
    used[b].push_back({off, off + n});
    add_chunked(copies, buckets[b].data_ptr<uint8_t>() + off, static_cast<const uint8_t*>(c.data_ptr()), n);
  }
  for (size_t b = 0; b < buckets.size(); ++b) {
    std::sort(used[b].begin(), used[b].end());
    uint8_t* base = buckets[b].data_ptr<uint8_t>();
    int64_t cursor = 0;
    for (auto& r : used[b]) {
      // overlapping slots would be copied in parallel in no set order: refused, as the Python wrapper refuses them
      TORCH_CHECK(r.first >= cursor, msg("pack: a slot at offset ", r.first, " of bucket ", b,
                                         " overlaps the slot before it (which ends at ", cursor, ")"));
      if (r.first > cursor) std::memset(base + cursor, 0, r.first - cursor);
      cursor = r.second;
    }
    if (bucket_sizes[b] > cursor) std::memset(base + cursor, 0, bucket_sizes[b] - cursor);
  }
  run_copies(copies);
  return buckets;
}

// Copy slot bytes from buckets back into existing contiguous CPU tensors (in place).
void unpack(const std::vector<at::Tensor>& buckets, const std::vector<at::Tensor>& tensors,
            const std::vector<int64_t>& slot_bucket, const std::vector<int64_t>& slot_offset) {
  check_layout(tensors.size(), slot_bucket, slot_offset);
  std::vector<Copy> copies;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& t = tensors[i];
    TORCH_CHECK(t.device().is_cpu() && t.is_contiguous(),
                msg("unpack: tensor ", i, " must be a contiguous CPU tensor"));
    check_plain(t, "unpack", i);
    const int64_t b = slot_bucket[i], off = slot_offset[i], n = nbytes_of(t);
    if (n == 0) continue;  // (as in the Python path)
    TORCH_CHECK(b >= 0 && b < (int64_t)buckets.size(), msg("unpack: bucket id ", b, " out of range"));
    const at::Tensor& bucket = buckets[b];
    TORCH_CHECK(bucket.device().is_cpu() && bucket.scalar_type() == at::kByte && bucket.is_contiguous() &&
                    slot_fits(off, n, bucket.numel()),
                msg("unpack: bucket ", b, " is not a contiguous uint8 CPU tensor holding ", n, " bytes at offset ",
                    off));
    add_chunked(copies, static_cast<uint8_t*>(t.data_ptr()), bucket.data_ptr<uint8_t>() + off, n);
  }
  run_copies(copies);
}

#ifdef LIBRA_WITH_CUDA
namespace {
std::vector<libra_copy_op> cuda_ops(const std::vector<at::Tensor>& tensors, const std::vector<int64_t>& slot_offset,
                                    const at::Tensor& device_bucket, const at::Tensor* host) {
  TORCH_CHECK(tensors.size() == slot_offset.size(),
              msg("cuda: ", tensors.size(), " tensors but ", slot_offset.size(), " offsets"));
  TORCH_CHECK(device_bucket.is_cuda() && device_bucket.scalar_type() == at::kByte && device_bucket.is_contiguous(),
              "cuda: device bucket must be a contiguous CUDA uint8 tensor");
  TORCH_CHECK(host == nullptr || (host->is_pinned() && host->numel() == device_bucket.numel() &&
                                  host->scalar_type() == at::kByte),
              "cuda: host bucket must be pinned uint8 memory of the device bucket's size");
  std::vector<libra_copy_op> ops;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& t = tensors[i];
    TORCH_CHECK(t.is_cuda() && t.is_contiguous() && t.device() == device_bucket.device(),
                msg("cuda: tensor ", i, " must be contiguous on ", device_bucket.device()));
    check_plain(t, "cuda", i);
    TORCH_CHECK(slot_fits(slot_offset[i], nbytes_of(t), device_bucket.numel()),
                msg("cuda: tensor ", i, " overflows the bucket"));
    ops.push_back({reinterpret_cast<const uint8_t*>(t.data_ptr()), slot_offset[i], nbytes_of(t)});
  }
  return ops;
}
}  // namespace

// GPU path, one bucket: zero `device_bucket` and gather the CUDA tensors into their slots, on `stream` (a
// cudaStream_t as an integer, e.g. torch.cuda.current_stream().cuda_stream). Asynchronous; the caller copies the
// bucket to the host.
void gather_cuda_into(const std::vector<at::Tensor>& tensors, const std::vector<int64_t>& slot_offset,
                      at::Tensor device_bucket, int64_t stream) {
  auto ops = cuda_ops(tensors, slot_offset, device_bucket, nullptr);
  cudaError_t err = libra_gather_async(ops.data(), static_cast<int>(ops.size()), device_bucket.data_ptr<uint8_t>(),
                                       device_bucket.numel(), reinterpret_cast<cudaStream_t>(stream));
  TORCH_CHECK(err == cudaSuccess, msg("gather_cuda_into: ", cudaGetErrorString(err)));
}

// GPU path, one bucket: copy the pinned `host` bucket to `device_bucket` and scatter its slots into the CUDA
// tensors (in place), on `stream`.
void unpack_cuda_from(at::Tensor host, at::Tensor device_bucket, const std::vector<at::Tensor>& tensors,
                      const std::vector<int64_t>& slot_offset, int64_t stream) {
  auto ops = cuda_ops(tensors, slot_offset, device_bucket, &host);
  cudaError_t err = libra_unpack_from_host_async(ops.data(), static_cast<int>(ops.size()),
                                                 device_bucket.data_ptr<uint8_t>(), host.data_ptr<uint8_t>(),
                                                 device_bucket.numel(), reinterpret_cast<cudaStream_t>(stream));
  TORCH_CHECK(err == cudaSuccess, msg("unpack_cuda_from: ", cudaGetErrorString(err)));
}
#endif

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "Libra snapshot buckets: pack/unpack tensors into contiguous byte buckets";
  m.def("pack", &pack, "pack CPU tensors into uint8 buckets (layout given)");
  m.def("unpack", &unpack, "unpack uint8 buckets into existing CPU tensors (in place)");
#ifdef LIBRA_WITH_CUDA
  m.def("gather_cuda_into", &gather_cuda_into, "zero a device bucket and gather CUDA tensors into it (async)");
  m.def("unpack_cuda_from", &unpack_cuda_from, "copy a pinned host bucket to the device and scatter it (async)");
#endif
}
