// api_types.h — fixed-layout parameter and result records of the API set (see docs/api_set.md).
// Shared by the client-side encoders and the parser/worker functions; trivially copyable on purpose.
#pragma once

#include <cstdint>
#include <type_traits>

namespace pos {

struct LaunchDims {
  uint32_t grid[3];
  uint32_t block[3];
  uint64_t shared_mem;
};

// A subset of cudaDeviceProp that POS reports; the client shim fills the real struct from it.
struct DeviceProps {
  char name[256];
  uint64_t total_global_mem;
  uint64_t shared_mem_per_block;
  int32_t regs_per_block;
  int32_t warp_size;
  int32_t max_threads_per_block;
  int32_t max_threads_dim[3];
  int32_t max_grid_size[3];
  int32_t major, minor;
  int32_t multi_processor_count;
  int32_t max_threads_per_multi_processor;
  int32_t l2_cache_size;
  int32_t memory_bus_width;
  uint64_t total_const_mem;
  int32_t unified_addressing;
  int32_t pci_bus_id;
  int32_t pci_device_id;
};

struct PointerAttributes {
  int32_t type;    // cudaMemoryType
  int32_t device;
  uint64_t device_pointer;
  uint64_t host_pointer;
};

struct FuncAttributes {
  uint64_t shared_size_bytes;
  uint64_t const_size_bytes;
  uint64_t local_size_bytes;
  int32_t max_threads_per_block;
  int32_t num_regs;
  int32_t ptx_version;
  int32_t binary_version;
  int32_t max_dynamic_shared_size_bytes;
  int32_t preferred_shmem_carveout;
};

struct MemInfo {
  uint64_t free;
  uint64_t total;
};

// cublasSgemm / cublasGemmEx / cublasSgemmStridedBatched arguments (alpha/beta by value:
// CUBLAS_POINTER_MODE_HOST, the default; device pointer mode is not supported yet).
struct GemmArgs {
  int32_t transa, transb;
  int32_t m, n, k;
  float alpha, beta;
  uint64_t a, b, c;
  int32_t lda, ldb, ldc;
  int32_t a_type, b_type, c_type;  // cudaDataType (GemmEx); CUDA_R_32F = 0 otherwise
  int32_t compute_type;            // cublasComputeType_t (GemmEx)
  int32_t algo;
  int64_t stride_a, stride_b, stride_c;  // strided batched
  int32_t batch;                          // 1 unless strided batched
  int32_t entry = 0;  // which cuBLAS entry point the app called (kGemmEntry*); set by the worker
};

inline constexpr int32_t kGemmEntrySgemm = 0;
inline constexpr int32_t kGemmEntryGemmEx = 1;
inline constexpr int32_t kGemmEntryStridedBatched = 2;

// cudaDataType / cublasComputeType_t values the parser checks.
inline constexpr int32_t kCudaR32F = 0;
inline constexpr int32_t kCublasCompute32F = 68;
inline constexpr int32_t kCublasCompute32FFastTF32 = 77;
inline constexpr int32_t kCublasDefaultMath = 0;
inline constexpr int32_t kCublasTF32TensorOpMath = 3;

static_assert(std::is_trivially_copyable_v<GemmArgs>);
static_assert(std::is_trivially_copyable_v<DeviceProps>);

}  // namespace pos
