// GPU side of the Libra snapshot buckets: one batched gather/scatter kernel over all tensors of a bucket (a block
// row per tensor, 16-byte vector copies where alignment allows), plus the unpack's asynchronous pinned-host-to-device
// copy, all on the caller's stream; the pack's device-to-host copies are the caller's, chunk by chunk. The byte
// layout is the same as the CPU path (pack.cpp) and the Python reference.

#include "pack_cuda.h"

namespace {

__global__ void gather_kernel(const libra_copy_op* ops, uint8_t* bucket, bool scatter) {
  const libra_copy_op op = ops[blockIdx.y];
  uint8_t* slot = bucket + op.offset;
  uint8_t* tensor = const_cast<uint8_t*>(op.src);
  const uint8_t* from = scatter ? slot : tensor;
  uint8_t* to = scatter ? tensor : slot;
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const bool aligned = ((reinterpret_cast<uintptr_t>(from) | reinterpret_cast<uintptr_t>(to)) & 15) == 0;
  int64_t done = 0;
  if (aligned) {
    const int64_t vecs = op.nbytes / 16;
    const uint4* f = reinterpret_cast<const uint4*>(from);
    uint4* t = reinterpret_cast<uint4*>(to);
    for (int64_t i = first; i < vecs; i += stride) t[i] = f[i];
    done = vecs * 16;
  }
  for (int64_t i = done + first; i < op.nbytes; i += stride) to[i] = from[i];
}

cudaError_t launch(const libra_copy_op* ops, int num_ops, uint8_t* device_bucket, bool scatter, cudaStream_t stream) {
  if (num_ops == 0) return cudaSuccess;
  libra_copy_op* device_ops = nullptr;
  cudaError_t err = cudaMallocAsync(reinterpret_cast<void**>(&device_ops), sizeof(libra_copy_op) * num_ops, stream);
  if (err != cudaSuccess) return err;
  err = cudaMemcpyAsync(device_ops, ops, sizeof(libra_copy_op) * num_ops, cudaMemcpyHostToDevice, stream);
  if (err != cudaSuccess) return err;
  dim3 grid(64, num_ops);
  gather_kernel<<<grid, 256, 0, stream>>>(device_ops, device_bucket, scatter);
  err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  return cudaFreeAsync(device_ops, stream);
}

}  // namespace

extern "C" cudaError_t libra_gather_async(const libra_copy_op* ops, int num_ops, uint8_t* device_bucket,
                                          int64_t bucket_bytes, cudaStream_t stream) {
  cudaError_t err = cudaMemsetAsync(device_bucket, 0, bucket_bytes, stream);  // padding bytes are zero, as on CPU
  if (err != cudaSuccess) return err;
  return launch(ops, num_ops, device_bucket, /*scatter=*/false, stream);
}

extern "C" cudaError_t libra_unpack_from_host_async(const libra_copy_op* ops, int num_ops, uint8_t* device_bucket,
                                                    const uint8_t* host, int64_t bucket_bytes, cudaStream_t stream) {
  cudaError_t err = cudaMemcpyAsync(device_bucket, host, bucket_bytes, cudaMemcpyHostToDevice, stream);
  if (err != cudaSuccess) return err;
  return launch(ops, num_ops, device_bucket, /*scatter=*/true, stream);
}
