// api_id.h — the stable numeric id of every API POS executes, and how each one returns.
// Ids are part of the wire and image formats: never renumber, only append (docs/api_set.md).
#pragma once

#include <cstdint>
#include <string_view>

namespace pos {

// How pos_process returns for an API:
//  kParse: the parser can produce the result (or the call has none): return right after parsing;
//          the worker executes it asynchronously, errors surface later (cudaGetLastError / next sync).
//  kSync:  the result needs the worker (device results, synchronization, queries): wait for it.
enum class ReturnMode : uint8_t { kParse, kSync };

// X(enum name, CUDA/cuBLAS name, id, return mode)
#define POS_API_LIST(X)                                                                              \
  X(GetDeviceCount, "cudaGetDeviceCount", 0x101, kSync)                                              \
  X(GetDevice, "cudaGetDevice", 0x102, kParse)                                                       \
  X(SetDevice, "cudaSetDevice", 0x103, kParse)                                                       \
  X(GetDeviceProperties, "cudaGetDeviceProperties", 0x104, kSync)                                    \
  X(DeviceGetAttribute, "cudaDeviceGetAttribute", 0x105, kSync)                                      \
  X(DeviceSynchronize, "cudaDeviceSynchronize", 0x106, kSync)                                        \
  X(MemGetInfo, "cudaMemGetInfo", 0x107, kSync)                                                      \
  X(DriverGetVersion, "cudaDriverGetVersion", 0x108, kSync)                                          \
  X(RuntimeGetVersion, "cudaRuntimeGetVersion", 0x109, kParse)                                       \
  X(GetLastError, "cudaGetLastError", 0x10A, kParse)                                                 \
  X(PeekAtLastError, "cudaPeekAtLastError", 0x10B, kParse)                                           \
  X(Malloc, "cudaMalloc", 0x201, kParse)                                                             \
  X(Free, "cudaFree", 0x202, kParse)                                                                 \
  X(Memcpy, "cudaMemcpy", 0x203, kSync)                                                              \
  X(MemcpyAsync, "cudaMemcpyAsync", 0x204, kParse)                                                   \
  X(Memset, "cudaMemset", 0x205, kParse)                                                             \
  X(MemsetAsync, "cudaMemsetAsync", 0x206, kParse)                                                   \
  X(PointerGetAttributes, "cudaPointerGetAttributes", 0x207, kParse)                                 \
  X(MemcpyToSymbol, "cudaMemcpyToSymbol", 0x208, kSync)                                              \
  X(MemcpyFromSymbol, "cudaMemcpyFromSymbol", 0x209, kSync)                                          \
  X(StreamCreate, "cudaStreamCreate", 0x301, kParse)                                                 \
  X(StreamCreateWithFlags, "cudaStreamCreateWithFlags", 0x302, kParse)                               \
  X(StreamCreateWithPriority, "cudaStreamCreateWithPriority", 0x303, kParse)                         \
  X(StreamDestroy, "cudaStreamDestroy", 0x304, kParse)                                               \
  X(StreamSynchronize, "cudaStreamSynchronize", 0x305, kSync)                                        \
  X(StreamQuery, "cudaStreamQuery", 0x306, kSync)                                                    \
  X(StreamWaitEvent, "cudaStreamWaitEvent", 0x307, kParse)                                           \
  X(EventCreate, "cudaEventCreate", 0x341, kParse)                                                   \
  X(EventCreateWithFlags, "cudaEventCreateWithFlags", 0x342, kParse)                                 \
  X(EventDestroy, "cudaEventDestroy", 0x343, kParse)                                                 \
  X(EventRecord, "cudaEventRecord", 0x344, kParse)                                                   \
  X(EventSynchronize, "cudaEventSynchronize", 0x345, kSync)                                          \
  X(EventQuery, "cudaEventQuery", 0x346, kSync)                                                      \
  X(EventElapsedTime, "cudaEventElapsedTime", 0x347, kSync)                                          \
  X(RegisterFatBinary, "__cudaRegisterFatBinary", 0x401, kParse)                                     \
  X(RegisterFunction, "__cudaRegisterFunction", 0x402, kSync)                                        \
  X(RegisterVar, "__cudaRegisterVar", 0x403, kSync)                                                  \
  X(UnregisterFatBinary, "__cudaUnregisterFatBinary", 0x404, kParse)                                 \
  X(LaunchKernel, "cudaLaunchKernel", 0x405, kParse)                                                 \
  X(FuncGetAttributes, "cudaFuncGetAttributes", 0x406, kSync)                                        \
  X(FuncSetAttribute, "cudaFuncSetAttribute", 0x407, kSync)                                          \
  X(OccupancyMaxActiveBlocks, "cudaOccupancyMaxActiveBlocksPerMultiprocessor", 0x408, kSync)         \
  X(OccupancyMaxActiveBlocksWithFlags, "cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags", 0x409, kSync) \
  X(CublasCreate, "cublasCreate", 0x501, kParse)                                                     \
  X(CublasDestroy, "cublasDestroy", 0x502, kParse)                                                   \
  X(CublasSetStream, "cublasSetStream", 0x503, kParse)                                               \
  X(CublasGetStream, "cublasGetStream", 0x504, kParse)                                               \
  X(CublasSetMathMode, "cublasSetMathMode", 0x505, kParse)                                           \
  X(CublasSgemm, "cublasSgemm", 0x506, kParse)                                                       \
  X(CublasGemmEx, "cublasGemmEx", 0x507, kParse)                                                     \
  X(CublasSgemmStridedBatched, "cublasSgemmStridedBatched", 0x508, kParse)

enum class ApiId : uint32_t {
#define POS_API_ENUM(e, n, id, m) k##e = id,
  POS_API_LIST(POS_API_ENUM)
#undef POS_API_ENUM
};

struct ApiInfo {
  ApiId id;
  std::string_view name;
  ReturnMode mode;
  bool is_cublas;  // errors are cublasStatus_t, not cudaError_t
};

// nullptr for an id POS does not know (a client's bad input, never an abort).
const ApiInfo* find_api(uint32_t id);
const ApiInfo& api_info(ApiId id);
std::string_view api_name(ApiId id);
// Every API, in id order (for docs, tests, dispatch tables).
const ApiInfo* all_apis(size_t* count);

}  // namespace pos
