// C interface of pack_cuda.cu: plain CUDA runtime types only, so the .cu compiles with nvcc without torch headers.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

struct libra_copy_op {
  const uint8_t* src;  // device pointer to a contiguous tensor
  int64_t offset;      // byte offset of its slot in the bucket
  int64_t nbytes;
};

// Zero `device_bucket`, then gather every op's bytes into it (the caller copies it to the host, in pieces if it
// likes). All work is enqueued on `stream`; nothing is synchronised.
extern "C" cudaError_t libra_gather_async(const libra_copy_op* ops, int num_ops, uint8_t* device_bucket,
                                          int64_t bucket_bytes, cudaStream_t stream);

// Copy the pinned `host` bucket to `device_bucket`, then scatter every op's slot back into its tensor
// (ops[i].src is then the destination). Enqueued on `stream`.
extern "C" cudaError_t libra_unpack_from_host_async(const libra_copy_op* ops, int num_ops, uint8_t* device_bucket,
                                                    const uint8_t* host, int64_t bucket_bytes, cudaStream_t stream);
